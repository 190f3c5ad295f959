// The forward KV calculator: the KV bytes a batch of sequences needs, the
// inverse of the planner (model/planner.h), which says how many sequences
// fit. `prefixctl plan --batch N --context LEN` prints it, and the daemon's
// /plan page (server/http/plan_page.h) shows the same report
// (model/plan_report.h):
//
//   kv_bytes = batch x SequenceKvBytes(geometry, dtype, context, 0)
//
// exact tokens, no blocks: full-attention layers hold every token,
// sliding-window layers at most the window, state layers their fixed state
// (model/kv_geometry.h). Without those it is batch x context x
// bytes_per_token. Shown beside the weights, for the model's own KV heads
// and for multi-head and multi-query attention (only kv_heads changed), in
// fp16, fp8 and int4, and per known GPU how many of them the weights,
// overhead and cache need. Llama-3-70B, fp16, batch 32 x 8,192: 640 GiB
// (MHA-64), 80 GiB (GQA-8), 10 GiB (MQA-1). An MLA model (kv_lora_rank > 0)
// caches one latent per layer whatever its head count, so it has only its
// own row, labelled "MLA".
//
// Thread safety: pure functions.
#ifndef PREFIXD_MODEL_FORWARD_H_
#define PREFIXD_MODEL_FORWARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/kv_geometry.h"
#include "model/planner.h"

namespace prefixd {

struct ForwardInput {
  ModelGeometry geometry;
  KvDtype kv_dtype = KvDtype::kFp16;
  int64_t batch = 1;
  int64_t context_len = 0;
  uint64_t weight_bytes = 0;    // 0 when not given: GPU counts are KV only
  uint64_t overhead_bytes = 0;  // kept back beside weights and KV
};

// KV of the batch in one dtype.
struct ForwardCell {
  KvDtype dtype = KvDtype::kFp16;
  uint64_t bytes_per_token = 0;
  uint64_t sequence_bytes = 0;  // SequenceKvBytes of one sequence
  uint64_t kv_bytes = 0;        // batch x sequence_bytes
};

// The model with only kv_heads changed: MHA (kv_heads = attention_heads),
// the model itself, MQA (1 KV head). MLA models: the model alone.
struct ForwardVariant {
  std::string label;  // "MHA-64", "GQA-8", "MQA-1", "MLA"
  int kv_heads = 0;
  bool is_model = false;
  std::vector<ForwardCell> cells;  // one per ForwardDtypes(kv_dtype)
};

// One GPU model holding the weights, overhead and the model's KV.
struct GpuNeed {
  std::string gpu;  // "H100-80GB"
  uint64_t memory_bytes = 0;
  // ceil((weights + overhead + kv) / memory_bytes).
  uint64_t gpus_needed = 0;
  // TensorParallelDegree(geometry, gpus_needed): the GPUs one tensor-
  // parallel replica takes (3 needed: 4 for a model with 64 heads); 0 when
  // none up to the attention heads is enough.
  uint64_t tensor_parallel = 0;
  // floor(kv x 100 / memory_bytes): the cache alone against one GPU.
  uint64_t kv_percent_of_gpu = 0;
  bool kv_exceeds_gpu = false;  // kv > memory_bytes
};

struct Forward {
  uint64_t tokens = 0;           // batch x context_len
  uint64_t bytes_per_token = 0;  // the model in kv_dtype, every KV layer
  uint64_t sequence_bytes = 0;   // one sequence of context_len tokens
  uint64_t kv_bytes = 0;         // batch x sequence_bytes
  uint64_t weight_bytes = 0;
  uint64_t overhead_bytes = 0;
  uint64_t total_bytes = 0;  // weights + overhead + kv
  // Each decode step reads every weight once and, per sequence, the KV its
  // layers hold: every token of a full layer, at most the window of a
  // sliding layer, the state of a state layer. crossover_context is the
  // smallest context at which this batch's KV, batch x SequenceKvBytes,
  // reaches weight_bytes: past it the KV reads dominate. 0 when weight_bytes
  // is 0, or never: when every KV layer slides, the KV stops growing at the
  // window and may stay below the weights at this batch.
  uint64_t crossover_context = 0;
  // Cached tokens in flight at the crossover, summed over the batch. When
  // every KV layer keeps every token and there is no state, each token
  // costs bytes_per_token wherever it sits, so this is
  // ceil(weight_bytes / bytes_per_token) for any batch. Otherwise a token's
  // cost depends on its sequence's length, and it is batch x
  // crossover_context.
  uint64_t crossover_tokens = 0;
  std::vector<ForwardVariant> variants;  // most KV heads first
  std::vector<GpuNeed> gpus;             // KnownGpus(), in that order
};

// fp16, fp8, int4, and `selected` after them when it is none of those.
std::vector<KvDtype> ForwardDtypes(KvDtype selected);

// INVALID_ARGUMENT naming the value when the geometry is invalid, batch or
// context_len is <= 0, or a byte count overflows 64 bits.
absl::StatusOr<Forward> MakeForward(const ForwardInput& input);

}  // namespace prefixd

#endif  // PREFIXD_MODEL_FORWARD_H_
