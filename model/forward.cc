#include "model/forward.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/status_macros.h"

namespace prefixd {
namespace {

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// The planner's labels: MQA-1, MHA-n when every query head has its own KV
// head, GQA-n otherwise.
std::string HeadLabel(int kv_heads, int attention_heads) {
  if (kv_heads == 1) return "MQA-1";
  if (kv_heads == attention_heads) return absl::StrCat("MHA-", kv_heads);
  return absl::StrCat("GQA-", kv_heads);
}

absl::StatusOr<uint64_t> Multiply(uint64_t a, uint64_t b,
                                  absl::string_view what) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", a, " x ", b, " overflows 64 bits"));
  }
  return product;
}

absl::StatusOr<ForwardVariant> MakeVariant(const ForwardInput& input,
                                           uint64_t tokens, int kv_heads) {
  ForwardVariant v;
  v.kv_heads = kv_heads;
  v.is_model = kv_heads == input.geometry.kv_heads;
  v.label = HeadLabel(kv_heads, input.geometry.attention_heads);
  ModelGeometry geometry = input.geometry;
  geometry.kv_heads = kv_heads;
  for (KvDtype dtype : ForwardDtypes(input.kv_dtype)) {
    ForwardCell cell;
    cell.dtype = dtype;
    ASSIGN_OR_RETURN(cell.bytes_per_token, BytesPerToken(geometry, dtype));
    ASSIGN_OR_RETURN(
        cell.kv_bytes,
        Multiply(tokens, cell.bytes_per_token,
                 absl::StrCat(v.label, " ", KvDtypeName(dtype), " KV bytes")));
    v.cells.push_back(cell);
  }
  return v;
}

std::vector<GpuNeed> GpuNeeds(const Forward& f) {
  std::vector<GpuNeed> needs;
  for (const GpuModel& gpu : KnownGpus()) {
    GpuNeed need;
    need.gpu = gpu.name;
    need.memory_bytes = gpu.memory_bytes;
    need.gpus_needed = CeilDiv(f.total_bytes, gpu.memory_bytes);
    // The percentage is only shown: a cache above 2^64 / 100 bytes reads
    // as the largest number rather than wrapping around.
    need.kv_percent_of_gpu = f.kv_bytes > UINT64_MAX / 100
                                 ? UINT64_MAX
                                 : f.kv_bytes * 100 / gpu.memory_bytes;
    need.kv_exceeds_gpu = f.kv_bytes > gpu.memory_bytes;
    needs.push_back(need);
  }
  return needs;
}

}  // namespace

std::vector<KvDtype> ForwardDtypes(KvDtype selected) {
  std::vector<KvDtype> dtypes = {KvDtype::kFp16, KvDtype::kFp8, KvDtype::kInt4};
  if (std::find(dtypes.begin(), dtypes.end(), selected) == dtypes.end()) {
    dtypes.push_back(selected);
  }
  return dtypes;
}

absl::StatusOr<Forward> MakeForward(const ForwardInput& input) {
  RETURN_IF_ERROR(ValidateGeometry(input.geometry, input.kv_dtype));
  if (input.batch <= 0 || input.context_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch and context must be positive, got batch ",
                     input.batch, " and context ", input.context_len));
  }
  Forward f;
  ASSIGN_OR_RETURN(f.tokens, Multiply(static_cast<uint64_t>(input.batch),
                                      static_cast<uint64_t>(input.context_len),
                                      "batch x context"));
  ASSIGN_OR_RETURN(f.bytes_per_token,
                   BytesPerToken(input.geometry, input.kv_dtype));
  ASSIGN_OR_RETURN(f.kv_bytes,
                   Multiply(f.tokens, f.bytes_per_token, "KV bytes"));
  f.weight_bytes = input.weight_bytes;
  f.overhead_bytes = input.overhead_bytes;
  if (__builtin_add_overflow(f.weight_bytes, f.overhead_bytes,
                             &f.total_bytes) ||
      __builtin_add_overflow(f.total_bytes, f.kv_bytes, &f.total_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights ", f.weight_bytes, " + overhead ", f.overhead_bytes, " + KV ",
        f.kv_bytes, " bytes overflow 64 bits"));
  }
  f.crossover_tokens = CeilDiv(f.weight_bytes, f.bytes_per_token);

  const int attention = input.geometry.attention_heads;
  std::vector<int> heads = {input.geometry.kv_heads, 1};
  if (attention > 0) heads.push_back(attention);
  std::sort(heads.begin(), heads.end(), std::greater<int>());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  for (int h : heads) {
    ASSIGN_OR_RETURN(ForwardVariant v, MakeVariant(input, f.tokens, h));
    f.variants.push_back(std::move(v));
  }
  f.gpus = GpuNeeds(f);
  return f;
}

}  // namespace prefixd
