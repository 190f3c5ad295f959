// The forward KV calculator: the KV bytes a batch of sequences needs, the
// inverse of the planner (model/planner.h), which says how many sequences
// fit. `prefixctl plan --batch N --context LEN` prints it and the daemon's
// /plan page (server/status_page.h) computes the same numbers in the
// browser from the same formula:
//
//   kv_bytes = batch x context x 2 x layers x kv_heads x head_dim
//              x dtype_bits / 8
//
// beside the weights, for the model's own KV heads and for multi-head and
// multi-query attention (only kv_heads changed), in fp16, fp8 and int4, and
// per known GPU how many of them the weights, overhead and cache need.
// Llama-3-70B, fp16, batch 32 x 8,192: 640 GiB (MHA-64), 80 GiB (GQA-8),
// 10 GiB (MQA-1).
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
  uint64_t kv_bytes = 0;  // tokens x bytes_per_token
};

// The model with only kv_heads changed: MHA (kv_heads = attention_heads),
// the model itself, MQA (1 KV head).
struct ForwardVariant {
  std::string label;  // "MHA-64", "GQA-8", "MQA-1"
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
  // floor(kv x 100 / memory_bytes): the cache alone against one GPU.
  uint64_t kv_percent_of_gpu = 0;
  bool kv_exceeds_gpu = false;  // kv > memory_bytes
};

struct Forward {
  uint64_t tokens = 0;           // batch x context_len
  uint64_t bytes_per_token = 0;  // the model in kv_dtype
  uint64_t kv_bytes = 0;         // tokens x bytes_per_token
  uint64_t weight_bytes = 0;
  uint64_t overhead_bytes = 0;
  uint64_t total_bytes = 0;  // weights + overhead + kv
  // ceil(weight_bytes / bytes_per_token): the cached tokens (summed over the
  // batch) whose KV reaches the weights' bytes; for batch 1, the context at
  // which the sequence's KV equals the weights. Each decode step reads both
  // once, so past it the KV reads dominate. 0 when weight_bytes is 0.
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
