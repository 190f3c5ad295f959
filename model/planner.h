// The capacity planner behind `prefixctl plan`: how much KV cache fits next
// to the weights, and what that means in tokens and concurrent sequences.
//
// Pure functions returning structs; formatting is the caller's business
// (client/plan.cc). Every number is an exact integer derived from
//
//   bytes_per_token = layers x bytes one token adds to a layer (kv_geometry.h)
//   kv_budget       = gpu_bytes - weight_bytes - overhead_bytes
//   per sequence    = SequenceKvBytes: sliding-window layers stop at the
//                     window, state layers add a fixed state
//
// with floors where only whole tokens, blocks or sequences count.
//
// GPU sizes: "GB" in a GPU name is 10^9 bytes, the way vendors label cards
// (an "H100-80GB" counts as 80,000,000,000 bytes). The cards carry somewhat
// more (an H100-80GB has 80 GiB of HBM, of which the driver reports a little
// less as usable), so the planner errs on the safe side; pass --gpus in
// bytes (e.g. "4x80GiB") to plan with the real figure.
//
// Thread safety: pure functions.
#ifndef PREFIXD_MODEL_PLANNER_H_
#define PREFIXD_MODEL_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/kv_geometry.h"

namespace prefixd {

struct GpuModel {
  std::string name;       // "H100-80GB"
  uint64_t memory_bytes;  // 80e9
};

// H100-80GB, H100-94GB, H200-141GB, B200-180GB, GB200-186GB, MI300X-192GB,
// A100-40GB, A100-80GB, L40S-48GB, A10-24GB, L4-24GB.
const std::vector<GpuModel>& KnownGpus();

struct GpuPool {
  int count = 1;
  std::string model;  // canonical GPU name, or empty when given in bytes
  uint64_t bytes_per_gpu = 0;
  uint64_t total_bytes = 0;
};

// "4xH100-80GB", "8xA100-40GB", "H100-80GB" (one GPU), "8xB200" (a name
// without its memory when only one known GPU has it), "4x80GiB" or a plain
// size "320GB" (ParseSizeWithUnit: a bare number is refused). Names are
// case-insensitive; the separator is 'x', 'X' or '*'. INVALID_ARGUMENT
// naming the text and the known GPUs, or the candidates of an ambiguous
// name ("H100").
absl::StatusOr<GpuPool> ParseGpus(absl::string_view text);

// params x weight dtype bits / 8, rounded up to whole bytes (int4 weights
// pack two to a byte; nvfp4 adds one byte of scale per 16 values).
// INVALID_ARGUMENT on overflow.
absl::StatusOr<uint64_t> WeightBytes(uint64_t params, KvDtype weight_dtype);

// The smallest tensor-parallel degree of at least `gpus` GPUs that the
// model's heads allow: one that divides the attention heads (vLLM and
// SGLang shard the query heads evenly and refuse other degrees) and either
// divides the KV heads or is a multiple of them (KV heads are then
// replicated). Powers of two when the attention heads are unknown (0).
// 0 when no degree up to the attention heads is large enough.
uint64_t TensorParallelDegree(const ModelGeometry& geometry, uint64_t gpus);

struct PlanInput {
  ModelGeometry geometry;
  KvDtype kv_dtype = KvDtype::kFp16;
  uint64_t gpu_bytes = 0;
  uint64_t weight_bytes = 0;
  uint64_t overhead_bytes = 0;
  std::vector<int64_t> context_lengths = {8192, 32768, 131072};
  int block_size = 16;
  // Waste comparison: a sequence of actual_len tokens in a contiguous
  // allocator that reserves max_seq_len, versus paged blocks. 0 for
  // max_seq_len means the largest context length. actual_len 0 skips it.
  int64_t actual_len = 1000;
  int64_t max_seq_len = 0;
};

// One context length: its KV per sequence and how many sequences fit.
struct ContextRow {
  int64_t context_len = 0;
  // SequenceKvBytes(context_len, exact tokens); context_len x
  // bytes_per_token for a model without sliding or state layers.
  uint64_t kv_bytes_per_sequence = 0;
  // floor(kv_budget / SequenceKvBytes(context_len, whole blocks)): paged
  // allocation needs whole blocks per sequence. Without sliding or state
  // layers this is floor(budget_blocks / ceil(context_len / block_size)).
  uint64_t concurrent_sequences = 0;
};

// The same model with only the KV-head count changed.
struct HeadVariant {
  std::string label;  // "MHA-64", "GQA-8", "MQA-1"
  int kv_heads = 0;
  bool is_model = false;  // the configured model's own kv_heads
  uint64_t bytes_per_token = 0;
  uint64_t tokens_that_fit = 0;
  uint64_t crossover_tokens = 0;
  std::vector<ContextRow> contexts;
};

// One sequence of actual_len tokens.
struct WasteReport {
  int64_t actual_len = 0;
  int64_t max_seq_len = 0;
  int block_size = 0;
  uint64_t contiguous_reserved_tokens = 0;  // max_seq_len
  uint64_t contiguous_wasted_tokens = 0;    // max_seq_len - actual_len
  // Bytes from SequenceKvBytes: max_seq_len's minus actual_len's.
  uint64_t contiguous_wasted_bytes = 0;
  uint64_t contiguous_sequences = 0;   // floor(kv_budget / max_seq_len's bytes)
  uint64_t paged_reserved_tokens = 0;  // ceil(actual/block_size) x block_size
  uint64_t paged_wasted_tokens = 0;    // < block_size
  uint64_t paged_wasted_bytes = 0;
  // floor(kv_budget / the paged bytes of actual_len); without sliding or
  // state layers, floor(budget_blocks / blocks per sequence).
  uint64_t paged_sequences = 0;
};

struct Plan {
  // Every KV layer, sliding ones included: what one token of a cached block
  // holds, and the figure the daemon's budget uses.
  uint64_t bytes_per_token = 0;
  uint64_t full_bytes_per_token = 0;      // layers that keep every token
  uint64_t window_bytes_per_token = 0;    // sliding layers, up to the window
  uint64_t state_bytes_per_sequence = 0;  // hybrid models' state layers
  uint64_t block_bytes = 0;               // block_size x bytes_per_token
  uint64_t gpu_bytes = 0;
  uint64_t weight_bytes = 0;
  uint64_t overhead_bytes = 0;
  uint64_t kv_budget_bytes = 0;  // gpu - weights - overhead
  uint64_t tokens_that_fit = 0;  // floor(kv_budget / bytes_per_token)
  uint64_t budget_blocks = 0;    // floor(kv_budget / block_bytes)
  std::vector<ContextRow> contexts;
  // Decode-step crossover: the smallest number of cached tokens in flight
  // (summed over the batch) whose KV bytes reach the weight bytes,
  // ceil(weight_bytes / bytes_per_token). Each decode step reads all weights
  // once and the KV of every cached token once; past this many tokens the
  // KV reads dominate memory traffic. 0 when weight_bytes is 0.
  uint64_t crossover_tokens = 0;
  // MHA (kv_heads = attention_heads, if known), GQA-8, the model's own
  // kv_heads, and MQA (1), largest first, without duplicates. Empty for MLA,
  // whose cache does not depend on the head count.
  std::vector<HeadVariant> head_variants;
  std::optional<WasteReport> waste;
};

// INVALID_ARGUMENT when the geometry is invalid, block_size <= 0, weights
// plus overhead exceed the GPU memory (naming all three numbers), a context
// length is <= 0, or actual_len > max_seq_len.
absl::StatusOr<Plan> MakePlan(const PlanInput& input);

}  // namespace prefixd

#endif  // PREFIXD_MODEL_PLANNER_H_
