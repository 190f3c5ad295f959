#include "model/planner.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "model/status_macros.h"
#include "model/units.h"

namespace prefixd {
namespace {

constexpr uint64_t kGB = 1000ULL * 1000 * 1000;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

std::string KnownGpuNames() {
  std::vector<std::string> names;
  for (const GpuModel& gpu : KnownGpus()) names.push_back(gpu.name);
  return absl::StrJoin(names, ", ");
}

// Sizes per context length for one bytes-per-token figure.
std::vector<ContextRow> ContextRows(const std::vector<int64_t>& lengths,
                                    uint64_t bytes_per_token,
                                    uint64_t budget_blocks, int block_size) {
  std::vector<ContextRow> rows;
  for (int64_t len : lengths) {
    ContextRow row;
    row.context_len = len;
    row.kv_bytes_per_sequence = static_cast<uint64_t>(len) * bytes_per_token;
    row.concurrent_sequences =
        budget_blocks /
        CeilDiv(static_cast<uint64_t>(len), static_cast<uint64_t>(block_size));
    rows.push_back(row);
  }
  return rows;
}

absl::StatusOr<HeadVariant> MakeVariant(const PlanInput& input, int kv_heads,
                                        std::string label, uint64_t kv_budget) {
  ModelGeometry geometry = input.geometry;
  geometry.kv_heads = kv_heads;
  ASSIGN_OR_RETURN(uint64_t bpt, BytesPerToken(geometry, input.kv_dtype));
  ASSIGN_OR_RETURN(uint64_t block_bytes, BlockBytes(bpt, input.block_size));
  HeadVariant v;
  v.label = std::move(label);
  v.kv_heads = kv_heads;
  v.is_model = kv_heads == input.geometry.kv_heads;
  v.bytes_per_token = bpt;
  v.tokens_that_fit = kv_budget / bpt;
  v.crossover_tokens = CeilDiv(input.weight_bytes, bpt);
  v.contexts =
      ContextRows(input.context_lengths, bpt,
                  BudgetBlocks(kv_budget, block_bytes), input.block_size);
  return v;
}

std::string HeadLabel(int kv_heads, int attention_heads) {
  if (kv_heads == 1) return "MQA-1";
  if (kv_heads == attention_heads) return absl::StrCat("MHA-", kv_heads);
  return absl::StrCat("GQA-", kv_heads);
}

absl::StatusOr<std::vector<HeadVariant>> HeadVariants(const PlanInput& input,
                                                      uint64_t kv_budget) {
  const int attention = input.geometry.attention_heads;
  std::vector<int> heads = {input.geometry.kv_heads, 1};
  if (attention > 0) heads.push_back(attention);
  if (attention == 0 || attention > 8) heads.push_back(8);
  std::sort(heads.begin(), heads.end(), std::greater<int>());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  std::vector<HeadVariant> variants;
  for (int h : heads) {
    ASSIGN_OR_RETURN(HeadVariant v,
                     MakeVariant(input, h, HeadLabel(h, attention), kv_budget));
    variants.push_back(std::move(v));
  }
  return variants;
}

absl::StatusOr<WasteReport> Waste(const PlanInput& input, const Plan& plan) {
  int64_t max_len = input.max_seq_len;
  if (max_len == 0 && !input.context_lengths.empty()) {
    max_len = *std::max_element(input.context_lengths.begin(),
                                input.context_lengths.end());
  }
  if (input.actual_len < 0 || max_len <= 0 || input.actual_len > max_len) {
    return Invalid(absl::StrCat(
        "the waste comparison needs 0 < actual_len <= max_seq_len; got "
        "actual_len ",
        input.actual_len, ", max_seq_len ", max_len));
  }
  const uint64_t bpt = plan.bytes_per_token;
  const uint64_t block = static_cast<uint64_t>(input.block_size);
  const uint64_t actual = static_cast<uint64_t>(input.actual_len);
  WasteReport w;
  w.actual_len = input.actual_len;
  w.max_seq_len = max_len;
  w.block_size = input.block_size;
  w.contiguous_reserved_tokens = static_cast<uint64_t>(max_len);
  w.contiguous_wasted_tokens = w.contiguous_reserved_tokens - actual;
  w.contiguous_wasted_bytes = w.contiguous_wasted_tokens * bpt;
  w.contiguous_sequences =
      plan.kv_budget_bytes / (w.contiguous_reserved_tokens * bpt);
  const uint64_t blocks = CeilDiv(actual, block);
  w.paged_reserved_tokens = blocks * block;
  w.paged_wasted_tokens = w.paged_reserved_tokens - actual;
  w.paged_wasted_bytes = w.paged_wasted_tokens * bpt;
  w.paged_sequences = plan.budget_blocks / blocks;
  return w;
}

absl::Status ValidateInput(const PlanInput& input) {
  if (input.block_size <= 0) {
    return Invalid(
        absl::StrCat("block_size must be > 0, got ", input.block_size));
  }
  for (int64_t len : input.context_lengths) {
    if (len <= 0) {
      return Invalid(absl::StrCat("context lengths must be > 0, got ", len));
    }
  }
  uint64_t used = 0;
  if (__builtin_add_overflow(input.weight_bytes, input.overhead_bytes, &used) ||
      used > input.gpu_bytes) {
    return Invalid(absl::StrCat(
        "no memory left for KV: weights ", input.weight_bytes, " B + overhead ",
        input.overhead_bytes, " B exceed GPU memory ", input.gpu_bytes, " B"));
  }
  return absl::OkStatus();
}

// Every per-sequence product below must fit 64 bits, for the largest
// variant (MHA) too.
absl::Status CheckLengths(const PlanInput& input, uint64_t bytes_per_token) {
  const int max_heads =
      std::max(input.geometry.kv_heads, input.geometry.attention_heads);
  const uint64_t bpt_max = bytes_per_token /
                           static_cast<uint64_t>(input.geometry.kv_heads) *
                           static_cast<uint64_t>(max_heads);
  std::vector<int64_t> lengths = input.context_lengths;
  lengths.push_back(input.max_seq_len);
  for (int64_t len : lengths) {
    uint64_t bytes = 0;
    if (len < 0 ||
        __builtin_mul_overflow(static_cast<uint64_t>(len), bpt_max, &bytes)) {
      return Invalid(absl::StrCat("sequence length ", len, " x ", bpt_max,
                                  " bytes per token overflows 64 bits"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<GpuModel>& KnownGpus() {
  // Memory as on the vendor's label, in 10^9 bytes.
  static const std::vector<GpuModel>* gpus = new std::vector<GpuModel>{
      {"H100-80GB", 80 * kGB},   {"H100-94GB", 94 * kGB},
      {"H200-141GB", 141 * kGB}, {"A100-40GB", 40 * kGB},
      {"A100-80GB", 80 * kGB},   {"L40S-48GB", 48 * kGB},
      {"A10-24GB", 24 * kGB},    {"L4-24GB", 24 * kGB},
  };
  return *gpus;
}

absl::StatusOr<GpuPool> ParseGpus(absl::string_view text) {
  absl::string_view rest = absl::StripAsciiWhitespace(text);
  GpuPool pool;
  const size_t sep = rest.find_first_of("xX*");
  if (sep != absl::string_view::npos) {
    const absl::string_view count =
        absl::StripAsciiWhitespace(rest.substr(0, sep));
    if (!count.empty() && absl::ascii_isdigit(count[0])) {
      if (!absl::SimpleAtoi(count, &pool.count) || pool.count <= 0) {
        return Invalid(absl::StrCat("invalid GPU count in \"", text,
                                    "\": expected N x GPU with N > 0"));
      }
      rest = absl::StripAsciiWhitespace(rest.substr(sep + 1));
    }
  }
  for (const GpuModel& gpu : KnownGpus()) {
    if (absl::EqualsIgnoreCase(gpu.name, rest)) {
      pool.model = gpu.name;
      pool.bytes_per_gpu = gpu.memory_bytes;
    }
  }
  if (pool.model.empty()) {
    absl::StatusOr<uint64_t> bytes = ParseBytes(rest);
    if (!bytes.ok()) {
      return Invalid(absl::StrCat(
          "unknown GPU \"", text, "\": expected [N x]GPU with GPU one of ",
          KnownGpuNames(), ", or a size such as 80GB or 80GiB"));
    }
    pool.bytes_per_gpu = *bytes;
  }
  if (__builtin_mul_overflow(pool.bytes_per_gpu,
                             static_cast<uint64_t>(pool.count),
                             &pool.total_bytes)) {
    return Invalid(absl::StrCat("GPU memory \"", text, "\" overflows 64 bits"));
  }
  return pool;
}

absl::StatusOr<uint64_t> WeightBytes(uint64_t params, KvDtype weight_dtype) {
  const uint64_t bits = static_cast<uint64_t>(KvDtypeBits(weight_dtype));
  // params x bits can overflow where params x bits / 8 does not.
  const uint64_t whole = params / 8 * bits;
  const uint64_t part = CeilDiv(params % 8 * bits, 8);
  uint64_t bytes = 0;
  if (params / 8 > UINT64_MAX / bits ||
      __builtin_add_overflow(whole, part, &bytes)) {
    return Invalid(absl::StrCat(params, " parameters of ",
                                KvDtypeName(weight_dtype),
                                " overflow 64-bit bytes"));
  }
  return bytes;
}

absl::StatusOr<Plan> MakePlan(const PlanInput& input) {
  RETURN_IF_ERROR(ValidateInput(input));
  Plan plan;
  ASSIGN_OR_RETURN(plan.bytes_per_token,
                   BytesPerToken(input.geometry, input.kv_dtype));
  ASSIGN_OR_RETURN(plan.block_bytes,
                   BlockBytes(plan.bytes_per_token, input.block_size));
  RETURN_IF_ERROR(CheckLengths(input, plan.bytes_per_token));
  plan.gpu_bytes = input.gpu_bytes;
  plan.weight_bytes = input.weight_bytes;
  plan.overhead_bytes = input.overhead_bytes;
  plan.kv_budget_bytes =
      input.gpu_bytes - input.weight_bytes - input.overhead_bytes;
  plan.tokens_that_fit = plan.kv_budget_bytes / plan.bytes_per_token;
  plan.budget_blocks = BudgetBlocks(plan.kv_budget_bytes, plan.block_bytes);
  plan.contexts = ContextRows(input.context_lengths, plan.bytes_per_token,
                              plan.budget_blocks, input.block_size);
  plan.crossover_tokens = CeilDiv(input.weight_bytes, plan.bytes_per_token);
  ASSIGN_OR_RETURN(plan.head_variants,
                   HeadVariants(input, plan.kv_budget_bytes));
  if (input.actual_len != 0) {
    ASSIGN_OR_RETURN(WasteReport waste, Waste(input, plan));
    plan.waste = waste;
  }
  return plan;
}

}  // namespace prefixd
