// The model as prefixd sees it: the shape of one token's KV cache, the dtype
// it is stored in, the block size, and the RoPE settings the keys were
// rotated with. Everything the budget and the RoPE bookkeeping depend on.
//
// The governing formula (docs/capacity.md):
//
//   bytes_per_token = layers x bytes one token adds to one KV layer
//   one layer, multi-head/GQA:  2 x kv_heads x head_dim values (K and V)
//   one layer, MLA:             kv_lora_rank + qk_rope_head_dim values (one
//                               compressed latent per token, no factor 2)
//
// kv_heads, not attention_heads: grouped-query attention makes them differ,
// and using attention_heads inflates the estimate by the GQA ratio (8x for
// Llama-3-70B). `layers` counts only the layers that hold KV: a hybrid
// model's state-space or linear-attention layers hold a fixed-size state per
// sequence instead (state_layers). Sliding-window layers are among `layers`
// but hold at most `sliding_window` tokens per sequence, so a sequence's
// bytes depend on its length (SequenceKvBytes). All sizes are exact
// integers: bits are counted and checked to make whole bytes rather than
// rounded, so that no formula change can silently truncate.
//
// Thread safety: everything here is a value type or a pure function.
#ifndef PREFIXD_MODEL_KV_GEOMETRY_H_
#define PREFIXD_MODEL_KV_GEOMETRY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prefixd {

// The dimensions that size the KV cache.
struct ModelGeometry {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  // Query heads. Does not size the cache; the planner uses it for the
  // multi-head-attention comparison and a config.json without
  // num_key_value_heads falls back to it. 0 = unknown.
  int attention_heads = 0;
  // Multi-head latent attention (DeepSeek-V2/V3): > 0 makes every layer
  // cache one latent of kv_lora_rank values plus the rotated key part of
  // head_dim (= qk_rope_head_dim) values, shared by all heads; kv_heads
  // must then be 1.
  int kv_lora_rank = 0;
  // sliding_layers of the `layers` attend to at most sliding_window tokens
  // (Gemma 2/3, Mistral-7B-v0.1): both 0, or both > 0.
  int sliding_window = 0;
  int sliding_layers = 0;
  // Hybrid models (Qwen3-Next, Jamba): layers with a fixed-size recurrent
  // state per sequence and no KV, besides `layers`. Both 0, or both > 0.
  int state_layers = 0;
  uint64_t state_bytes_per_layer = 0;  // per sequence
  std::string name;  // preset name or a label; cosmetic, not fingerprinted
};

// How the engine stores K and V. Names: fp32 fp16 bf16 fp8 int8 int4
// nvfp4 (4-bit values plus one fp8 scale per 16 values).
enum class KvDtype { kFp32, kFp16, kBf16, kFp8, kInt8, kInt4, kNvfp4 };

// Accepts the names above, case-insensitively, and the torch spellings
// float32, float16, half, bfloat16, float8 (and float8_e4m3fn/e5m2 etc),
// and fp4 for nvfp4.
absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name);
absl::string_view KvDtypeName(KvDtype dtype);
// Bits of one value, scales left out: 32, 16, 16, 8, 8, 4, 4.
int KvDtypeBits(KvDtype dtype);
// Values that share one 8-bit scale: 16 for nvfp4, 0 (no scales) otherwise.
int KvDtypeScaleGroup(KvDtype dtype);
// "2 B", "1 B", "0.5 B", "0.5 B + 1 B per 16 values": for explanations.
std::string KvDtypeSizeText(KvDtype dtype);

// OK if every dimension is positive, the optional parts are consistent
// (see ModelGeometry) and the byte count is a whole number that fits in 64
// bits; otherwise INVALID_ARGUMENT naming the field and the numbers.
absl::Status ValidateGeometry(const ModelGeometry& geometry, KvDtype dtype);

// Bytes one token adds to one KV layer, scales included.
// Llama-3 fp16: 2 x 8 x 128 x 2 = 4096. DeepSeek-V3 bf16: (512 + 64) x 2.
absl::StatusOr<uint64_t> LayerBytesPerToken(const ModelGeometry& geometry,
                                            KvDtype dtype);

// layers x LayerBytesPerToken, sliding-window layers included: what one
// token of a cached block holds. Llama-3-8B fp16: 131072. Llama-3-70B
// fp16: 327680. DeepSeek-V3 bf16: 70272.
absl::StatusOr<uint64_t> BytesPerToken(const ModelGeometry& geometry,
                                       KvDtype dtype);

// One sequence of `context` tokens: full-attention layers hold every
// token, sliding-window layers at most the window, state layers their
// fixed state. With block_size > 0 tokens are counted in whole blocks, as a
// paged allocator reserves them: ceil(context / block_size) blocks in the
// full layers and, in the sliding layers, the blocks the window can span,
// min(that, ceil(window / block_size) + 1). block_size 0 counts exact
// tokens. REQUIRES: ValidateGeometry OK, context >= 0.
absl::StatusOr<uint64_t> SequenceKvBytes(const ModelGeometry& geometry,
                                         KvDtype dtype, int64_t context,
                                         int block_size);

// block_size x bytes_per_token. INVALID_ARGUMENT if block_size <= 0 or the
// product overflows.
absl::StatusOr<uint64_t> BlockBytes(uint64_t bytes_per_token, int block_size);

// floor(budget_bytes / block_bytes): a partial block is unusable.
// REQUIRES: block_bytes > 0.
uint64_t BudgetBlocks(uint64_t budget_bytes, uint64_t block_bytes);

// ---------------------------------------------------------------------------
// RoPE

// The frequency scalings found in Hugging Face configs (rope_scaling.type or
// rope_type). Static NTK is not a separate kind: it is a different theta.
enum class RopeScaling {
  kNone,        // "default"
  kLinear,      // position interpolation: every frequency / factor
  kDynamicNtk,  // "dynamic": theta depends on the current sequence length
  kLlama3,      // Llama 3.1: per-wavelength blend of 1 and 1/factor
  kYarn,        // NTK-by-parts with ramp between beta_fast and beta_slow
  kLongRope,    // "longrope"/"su": per-dimension factors, switched by length
};
absl::StatusOr<RopeScaling> ParseRopeScaling(absl::string_view name);
absl::string_view RopeScalingName(RopeScaling scaling);

// Which dimensions form a rotation pair, for a rotated width d.
enum class RopeLayout {
  kNeox,  // (i, i + d/2): Hugging Face's rotate_half, vLLM is_neox_style
  kGptj,  // (2i, 2i + 1): interleaved, GPT-J and Meta's original Llama code
};
absl::StatusOr<RopeLayout> ParseRopeLayout(absl::string_view name);
absl::string_view RopeLayoutName(RopeLayout layout);

// How keys were rotated. Only the fields the scaling uses matter (see
// FingerprintText); the others keep their defaults.
struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;            // linear, dynamic, llama3, yarn, longrope
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int original_max_position = 0;  // llama3, yarn, longrope
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  int rotary_dim = 0;             // dimensions rotated; 0 = head_dim
  RopeLayout layout = RopeLayout::kNeox;
};

// The rotated width: rotary_dim, or head_dim when rotary_dim is 0.
int EffectiveRotaryDim(const RopeConfig& rope, int head_dim);

// True for the scalings whose rotations compose exactly,
// R(a)R(b) = R(a+b): none, linear, llama3, yarn. Dynamic NTK and LongRoPE
// pick their frequencies from the sequence length, so a cached key cannot be
// moved to another position by a rotation.
bool RopeIsShiftable(RopeScaling scaling);

// ---------------------------------------------------------------------------
// The whole model as the daemon is configured with it.

struct ModelSpec {
  ModelGeometry geometry;
  KvDtype kv_dtype = KvDtype::kFp16;
  int block_size = 16;
  RopeConfig rope;
  // rope.shift ALLOW: matches return non-zero rope_delta segments and the
  // engine re-rotates. false = DENY (the default).
  bool shift_allow = false;
};

absl::StatusOr<uint64_t> BytesPerToken(const ModelSpec& spec);
absl::StatusOr<uint64_t> BlockBytes(const ModelSpec& spec);

// Checks the RoPE settings against the geometry: theta > 0, the factors the
// scaling needs, rotary_dim even and <= head_dim. Refuses shift_allow with
// dynamic-NTK or LongRoPE (INVALID_ARGUMENT): those are not composable
// rotations, so a re-rotated key would be silently wrong.
absl::Status ValidateRope(const ModelSpec& spec);

// ValidateGeometry + block_size > 0 + ValidateRope.
absl::Status ValidateModelSpec(const ModelSpec& spec);

// ---------------------------------------------------------------------------
// Fingerprint: what an engine and the daemon must agree on before block IDs
// mean the same thing to both.
//
// FingerprintText is a canonical text, one "key=value" per field joined by
// ';', in this order:
//
//   prefixd-model-v1;layers=80;kv_heads=8;head_dim=128;kv_dtype=fp16;
//   block_size=16;rope.theta=500000;rope.scaling=llama3;rope.factor=8;
//   rope.low_freq_factor=1;rope.high_freq_factor=4;
//   rope.original_max_position=8192;rope.rotary_dim=128;rope.layout=neox;
//   rope.shift=deny
//
// Doubles are printed with printf "%.17g" (round-trips; Python's
// '%.17g' % x prints the same). rope.rotary_dim is the effective width (0 is
// resolved to head_dim). Scaling parameters appear only for the scalings that
// use them (linear/dynamic: factor; llama3: factor, low_freq_factor,
// high_freq_factor, original_max_position; yarn: factor,
// original_max_position, beta_fast, beta_slow; longrope: factor,
// original_max_position), so an unused field cannot cause a mismatch.
// The name and attention_heads are left out: they do not change what a block
// holds, and the same model may be configured by preset, by numbers or from
// a config.json. MLA and state layers add fields (kv_lora_rank=512 after
// head_dim; state_layers=36;state_bytes_per_layer=1097728 after kv_dtype)
// only when set, so other models' texts are unchanged. The sliding window is
// left out: it changes how many blocks an engine keeps, not what a block
// holds.
std::string FingerprintText(const ModelSpec& spec);

// FNV-1a 64 of FingerprintText, as 16 lowercase hex digits.
std::string Fingerprint(const ModelSpec& spec);

// Names the fields whose values differ between two FingerprintTexts, e.g.
// "kv_dtype: fp16 vs fp8; block_size: 16 vs 32". Fields present in only one
// text are reported as "<absent>". Empty if the texts are equal.
std::string DescribeDifference(absl::string_view a_text,
                               absl::string_view b_text);

// ---------------------------------------------------------------------------
// Presets, from the models' published Hugging Face config.json files (the
// repository each comes from is in kv_geometry.cc and in `source`).

struct ModelPreset {
  ModelGeometry geometry;
  RopeConfig rope;
  std::string source;  // Hugging Face repository of the config.json used
};

// llama-3-8b, llama-3-70b, mistral-7b, gemma-2-9b, gemma-3-27b,
// deepseek-v3, qwen3-next-80b-a3b, jamba-v0.1 (case-insensitive).
// NOT_FOUND listing the known names otherwise.
absl::StatusOr<ModelPreset> FindPreset(absl::string_view name);
std::vector<std::string> PresetNames();

}  // namespace prefixd

#endif  // PREFIXD_MODEL_KV_GEOMETRY_H_
