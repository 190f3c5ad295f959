// The model as prefixd sees it: the shape of one token's KV cache, the dtype
// it is stored in, the block size, and the RoPE settings the keys were
// rotated with. Everything the budget and the RoPE bookkeeping depend on.
//
// The governing formula (docs/capacity.md):
//
//   bytes_per_token = 2 x layers x kv_heads x head_dim x dtype_bits / 8
//
// The 2 is K and V. kv_heads, not attention_heads: grouped-query attention
// makes them differ, and using attention_heads inflates the estimate by the
// GQA ratio (8x for Llama-3-70B). All sizes are exact integers. int4 is half
// a byte per element; because K and V are both counted the int4 product is
// always whole, but the bit count is checked rather than rounded so that no
// formula change can silently truncate.
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
  std::string name;  // preset name or a label; cosmetic, not fingerprinted
};

// How the engine stores K and V. Names: fp32 fp16 bf16 fp8 int8 int4.
enum class KvDtype { kFp32, kFp16, kBf16, kFp8, kInt8, kInt4 };

// Accepts the names above, case-insensitively, and the torch spellings
// float32, float16, half, bfloat16, float8 (and float8_e4m3fn/e5m2 etc).
absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name);
absl::string_view KvDtypeName(KvDtype dtype);
// 32, 16, 16, 8, 8, 4.
int KvDtypeBits(KvDtype dtype);

// OK if every dimension is positive and the byte count is a whole number
// that fits in 64 bits; otherwise INVALID_ARGUMENT naming the numbers.
absl::Status ValidateGeometry(const ModelGeometry& geometry, KvDtype dtype);

// 2 x layers x kv_heads x head_dim x bits / 8, exactly.
// Llama-3-8B fp16: 131072. Llama-3-70B fp16: 327680.
absl::StatusOr<uint64_t> BytesPerToken(const ModelGeometry& geometry,
                                       KvDtype dtype);

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
// a config.json.
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

// llama-3-8b, llama-3-70b, mistral-7b, gemma-2-9b (case-insensitive).
// NOT_FOUND listing the known names otherwise.
absl::StatusOr<ModelPreset> FindPreset(absl::string_view name);
std::vector<std::string> PresetNames();

}  // namespace prefixd

#endif  // PREFIXD_MODEL_KV_GEOMETRY_H_
