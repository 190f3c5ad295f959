#include "model/forward.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace prefixd {
namespace {

using uint128 = unsigned __int128;

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }
uint128 CeilDiv128(uint128 a, uint128 b) { return a / b + (a % b != 0); }

// The planner's labels: MQA-1, MHA-n when every query head has its own KV
// head, GQA-n otherwise; MLA, whose one latent per layer is not a KV head.
std::string HeadLabel(const ModelGeometry& g, int kv_heads) {
  const int attention_heads = g.attention_heads;
  if (g.kv_lora_rank > 0) return "MLA";
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

// Exact tokens (block_size 0): the calculator sizes what the batch holds,
// not a paged allocator's rounding.
absl::StatusOr<ForwardCell> MakeCell(const ForwardInput& input,
                                     const ModelGeometry& geometry,
                                     KvDtype dtype, absl::string_view label) {
  ForwardCell cell;
  cell.dtype = dtype;
  ASSIGN_OR_RETURN(cell.bytes_per_token, BytesPerToken(geometry, dtype));
  ASSIGN_OR_RETURN(cell.sequence_bytes,
                   SequenceKvBytes(geometry, dtype, input.context_len, 0));
  ASSIGN_OR_RETURN(
      cell.kv_bytes,
      Multiply(static_cast<uint64_t>(input.batch), cell.sequence_bytes,
               absl::StrCat(label, " ", KvDtypeName(dtype), " KV bytes")));
  return cell;
}

absl::StatusOr<ForwardVariant> MakeVariant(const ForwardInput& input,
                                           int kv_heads) {
  ForwardVariant v;
  v.kv_heads = kv_heads;
  v.is_model = kv_heads == input.geometry.kv_heads;
  v.label = HeadLabel(input.geometry, kv_heads);
  ModelGeometry geometry = input.geometry;
  geometry.kv_heads = kv_heads;
  for (KvDtype dtype : ForwardDtypes(input.kv_dtype)) {
    ASSIGN_OR_RETURN(ForwardCell cell,
                     MakeCell(input, geometry, dtype, v.label));
    v.cells.push_back(cell);
  }
  return v;
}

// The model's own KV heads, MQA and MHA, most first; an MLA model alone.
std::vector<int> VariantHeads(const ModelGeometry& g) {
  if (g.kv_lora_rank > 0) return {g.kv_heads};
  std::vector<int> heads = {g.kv_heads, 1};
  if (g.attention_heads > 0) heads.push_back(g.attention_heads);
  std::sort(heads.begin(), heads.end(), std::greater<int>());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  return heads;
}

// The smallest context c >= 1 with batch x SequenceKvBytes(c) >= weights,
// 0 if none. Per sequence that is the target ceil(weights / batch), and
// SequenceKvBytes(c) = c x (full + sliding) + state while c <= window, then
// grows by `full` per token. 128 bits: the window times a layer's bytes can
// pass 64.
uint64_t CrossoverContext(const ModelGeometry& g, uint64_t layer_bytes,
                          uint64_t batch, uint64_t weights) {
  if (weights == 0) return 0;
  const uint128 full =
      static_cast<uint128>(layer_bytes) * (g.layers - g.sliding_layers);
  const uint128 all = static_cast<uint128>(layer_bytes) * g.layers;
  const uint128 state =
      static_cast<uint128>(g.state_layers) * g.state_bytes_per_layer;
  const uint128 target = CeilDiv(weights, batch);
  if (state >= target) return 1;
  const uint128 rest = target - state;
  const uint128 window_bytes = all * static_cast<uint64_t>(g.sliding_window);
  if (rest <= window_bytes) return static_cast<uint64_t>(CeilDiv128(rest, all));
  if (full == 0) return 0;  // every layer slides: the KV stops growing
  return static_cast<uint64_t>(g.sliding_window +
                               CeilDiv128(rest - window_bytes, full));
}

// Sets f->crossover_context and f->crossover_tokens (see forward.h).
absl::Status SetCrossover(const ForwardInput& input, Forward* f) {
  const ModelGeometry& g = input.geometry;
  ASSIGN_OR_RETURN(const uint64_t layer_bytes,
                   LayerBytesPerToken(g, input.kv_dtype));
  const uint64_t batch = static_cast<uint64_t>(input.batch);
  f->crossover_context =
      CrossoverContext(g, layer_bytes, batch, f->weight_bytes);
  if (g.sliding_layers == 0 && g.state_layers == 0) {
    f->crossover_tokens = CeilDiv(f->weight_bytes, f->bytes_per_token);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(f->crossover_tokens, Multiply(batch, f->crossover_context,
                                                 "batch x crossover context"));
  return absl::OkStatus();
}

std::vector<GpuNeed> GpuNeeds(const ModelGeometry& g, const Forward& f) {
  std::vector<GpuNeed> needs;
  for (const GpuModel& gpu : KnownGpus()) {
    GpuNeed need;
    need.gpu = gpu.name;
    need.memory_bytes = gpu.memory_bytes;
    need.gpus_needed = CeilDiv(f.total_bytes, gpu.memory_bytes);
    need.tensor_parallel = TensorParallelDegree(g, need.gpus_needed);
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
  ASSIGN_OR_RETURN(const ForwardCell model,
                   MakeCell(input, input.geometry, input.kv_dtype, "model"));
  f.bytes_per_token = model.bytes_per_token;
  f.sequence_bytes = model.sequence_bytes;
  f.kv_bytes = model.kv_bytes;
  f.weight_bytes = input.weight_bytes;
  f.overhead_bytes = input.overhead_bytes;
  if (__builtin_add_overflow(f.weight_bytes, f.overhead_bytes,
                             &f.total_bytes) ||
      __builtin_add_overflow(f.total_bytes, f.kv_bytes, &f.total_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights ", f.weight_bytes, " + overhead ", f.overhead_bytes, " + KV ",
        f.kv_bytes, " bytes overflow 64 bits"));
  }
  RETURN_IF_ERROR(SetCrossover(input, &f));
  for (int h : VariantHeads(input.geometry)) {
    ASSIGN_OR_RETURN(ForwardVariant v, MakeVariant(input, h));
    f.variants.push_back(std::move(v));
  }
  f.gpus = GpuNeeds(input.geometry, f);
  return f;
}

}  // namespace prefixd
