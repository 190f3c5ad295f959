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
#include "base/status_macros.h"
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

// The known GPU named by `name`: its full name ("H200-141GB"), or the part
// before the dash ("H200") when only one known GPU has it. nullptr when
// nothing matches; INVALID_ARGUMENT when a bare name fits several.
absl::StatusOr<const GpuModel*> FindGpu(absl::string_view name,
                                        absl::string_view text) {
  std::vector<const GpuModel*> family;
  for (const GpuModel& gpu : KnownGpus()) {
    if (absl::EqualsIgnoreCase(gpu.name, name)) return &gpu;
    const absl::string_view base =
        absl::string_view(gpu.name).substr(0, gpu.name.find('-'));
    if (absl::EqualsIgnoreCase(base, name)) family.push_back(&gpu);
  }
  if (family.size() > 1) {
    std::vector<std::string> names;
    for (const GpuModel* gpu : family) names.push_back(gpu->name);
    return Invalid(absl::StrCat("GPU \"", text, "\" is ambiguous: say ",
                                absl::StrJoin(names, " or ")));
  }
  return family.empty() ? nullptr : family[0];
}

// Sizes per context length for one geometry: exact bytes, and sequences
// that fit when each is given whole blocks.
absl::StatusOr<std::vector<ContextRow>> ContextRows(
    const PlanInput& input, const ModelGeometry& geometry, uint64_t kv_budget) {
  std::vector<ContextRow> rows;
  for (int64_t len : input.context_lengths) {
    ContextRow row;
    row.context_len = len;
    ASSIGN_OR_RETURN(row.kv_bytes_per_sequence,
                     SequenceKvBytes(geometry, input.kv_dtype, len, 0));
    ASSIGN_OR_RETURN(
        const uint64_t paged,
        SequenceKvBytes(geometry, input.kv_dtype, len, input.block_size));
    row.concurrent_sequences = kv_budget / paged;
    rows.push_back(row);
  }
  return rows;
}

absl::StatusOr<HeadVariant> MakeVariant(const PlanInput& input, int kv_heads,
                                        std::string label, uint64_t kv_budget) {
  ModelGeometry geometry = input.geometry;
  geometry.kv_heads = kv_heads;
  ASSIGN_OR_RETURN(uint64_t bpt, BytesPerToken(geometry, input.kv_dtype));
  HeadVariant v;
  v.label = std::move(label);
  v.kv_heads = kv_heads;
  v.is_model = kv_heads == input.geometry.kv_heads;
  v.bytes_per_token = bpt;
  v.tokens_that_fit = kv_budget / bpt;
  v.crossover_tokens = CeilDiv(input.weight_bytes, bpt);
  ASSIGN_OR_RETURN(v.contexts, ContextRows(input, geometry, kv_budget));
  return v;
}

std::string HeadLabel(int kv_heads, int attention_heads) {
  if (kv_heads == 1) return "MQA-1";
  if (kv_heads == attention_heads) return absl::StrCat("MHA-", kv_heads);
  return absl::StrCat("GQA-", kv_heads);
}

absl::StatusOr<std::vector<HeadVariant>> HeadVariants(const PlanInput& input,
                                                      uint64_t kv_budget) {
  // MLA caches one latent per layer whatever the head count: there is no
  // KV-head variable to vary.
  if (input.geometry.kv_lora_rank > 0) return std::vector<HeadVariant>();
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
  const ModelGeometry& g = input.geometry;
  const KvDtype dtype = input.kv_dtype;
  const uint64_t block = static_cast<uint64_t>(input.block_size);
  const uint64_t actual = static_cast<uint64_t>(input.actual_len);
  WasteReport w;
  w.actual_len = input.actual_len;
  w.max_seq_len = max_len;
  w.block_size = input.block_size;
  w.contiguous_reserved_tokens = static_cast<uint64_t>(max_len);
  w.contiguous_wasted_tokens = w.contiguous_reserved_tokens - actual;
  // Bytes, not tokens x bytes per token: sliding-window layers stop growing
  // at the window.
  ASSIGN_OR_RETURN(const uint64_t used,
                   SequenceKvBytes(g, dtype, input.actual_len, 0));
  ASSIGN_OR_RETURN(const uint64_t reserved,
                   SequenceKvBytes(g, dtype, max_len, 0));
  w.contiguous_wasted_bytes = reserved - used;
  w.contiguous_sequences = plan.kv_budget_bytes / reserved;
  const uint64_t blocks = CeilDiv(actual, block);
  w.paged_reserved_tokens = blocks * block;
  w.paged_wasted_tokens = w.paged_reserved_tokens - actual;
  ASSIGN_OR_RETURN(
      const uint64_t paged,
      SequenceKvBytes(g, dtype, input.actual_len, input.block_size));
  w.paged_wasted_bytes = paged - used;
  w.paged_sequences = plan.kv_budget_bytes / paged;
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

// The per-token bytes of full and sliding layers, and the per-sequence state.
absl::Status SplitBytes(const ModelGeometry& g, KvDtype dtype, Plan* plan) {
  ASSIGN_OR_RETURN(const uint64_t layer, LayerBytesPerToken(g, dtype));
  plan->full_bytes_per_token =
      layer * static_cast<uint64_t>(g.layers - g.sliding_layers);
  plan->window_bytes_per_token =
      layer * static_cast<uint64_t>(g.sliding_layers);
  plan->state_bytes_per_sequence =
      static_cast<uint64_t>(g.state_layers) * g.state_bytes_per_layer;
  return absl::OkStatus();
}

}  // namespace

const std::vector<GpuModel>& KnownGpus() {
  // Memory as on the vendor's label, in 10^9 bytes.
  // B200 and GB200 as NVIDIA's HGX B200 and GB200 NVL72 data sheets give
  // them (180 GB and 186 GB of HBM3e per GPU); MI300X as AMD's (192 GB).
  static const std::vector<GpuModel>* gpus = new std::vector<GpuModel>{
      {"H100-80GB", 80 * kGB},    {"H100-94GB", 94 * kGB},
      {"H200-141GB", 141 * kGB},  {"B200-180GB", 180 * kGB},
      {"GB200-186GB", 186 * kGB}, {"MI300X-192GB", 192 * kGB},
      {"A100-40GB", 40 * kGB},    {"A100-80GB", 80 * kGB},
      {"L40S-48GB", 48 * kGB},    {"A10-24GB", 24 * kGB},
      {"L4-24GB", 24 * kGB},
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
  ASSIGN_OR_RETURN(const GpuModel* gpu, FindGpu(rest, text));
  if (gpu != nullptr) {
    pool.model = gpu->name;
    pool.bytes_per_gpu = gpu->memory_bytes;
  } else {
    if (!ParseBytes(rest).ok()) {
      return Invalid(absl::StrCat(
          "unknown GPU \"", text, "\": expected [N x]GPU with GPU one of ",
          KnownGpuNames(), ", or a size such as 80GB or 80GiB"));
    }
    ASSIGN_OR_RETURN(pool.bytes_per_gpu, ParseSizeWithUnit("GPU memory", rest));
  }
  if (__builtin_mul_overflow(pool.bytes_per_gpu,
                             static_cast<uint64_t>(pool.count),
                             &pool.total_bytes)) {
    return Invalid(absl::StrCat("GPU memory \"", text, "\" overflows 64 bits"));
  }
  return pool;
}

uint64_t TensorParallelDegree(const ModelGeometry& g, uint64_t gpus) {
  const uint64_t heads = static_cast<uint64_t>(g.attention_heads);
  const uint64_t kv = static_cast<uint64_t>(std::max(g.kv_heads, 1));
  if (heads == 0) {
    uint64_t d = 1;
    while (d < gpus && d < (uint64_t{1} << 62)) d *= 2;
    return d;
  }
  for (uint64_t d = std::max<uint64_t>(gpus, 1); d <= heads; ++d) {
    if (heads % d == 0 && (kv % d == 0 || d % kv == 0)) return d;
  }
  return 0;
}

absl::StatusOr<uint64_t> WeightBytes(uint64_t params, KvDtype weight_dtype) {
  // Bits per `group` values: the values and, for nvfp4, one 8-bit scale.
  const uint64_t group =
      static_cast<uint64_t>(std::max(KvDtypeScaleGroup(weight_dtype), 1));
  const uint64_t value_bits = static_cast<uint64_t>(KvDtypeBits(weight_dtype));
  const uint64_t scale_bits = group > 1 ? 8 : 0;
  const uint64_t rest = params % group;
  // params x bits can overflow 64 bits where the bytes do not.
  const unsigned __int128 bits =
      static_cast<unsigned __int128>(params / group) *
          (group * value_bits + scale_bits) +
      (rest > 0 ? rest * value_bits + scale_bits : 0);
  const unsigned __int128 bytes = bits / 8 + (bits % 8 != 0);
  if (bytes > UINT64_MAX) {
    return Invalid(absl::StrCat(params, " parameters of ",
                                KvDtypeName(weight_dtype),
                                " overflow 64-bit bytes"));
  }
  return static_cast<uint64_t>(bytes);
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
  RETURN_IF_ERROR(SplitBytes(input.geometry, input.kv_dtype, &plan));
  ASSIGN_OR_RETURN(plan.contexts,
                   ContextRows(input, input.geometry, plan.kv_budget_bytes));
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
