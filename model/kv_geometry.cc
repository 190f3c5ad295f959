#include "model/kv_geometry.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace prefixd {
namespace {

using uint128 = unsigned __int128;

// (name, dtype) for every accepted spelling; the first spelling of each
// dtype is its canonical name.
struct DtypeName {
  absl::string_view name;
  KvDtype dtype;
};
constexpr DtypeName kDtypeNames[] = {
    {"fp32", KvDtype::kFp32},         {"fp16", KvDtype::kFp16},
    {"bf16", KvDtype::kBf16},         {"fp8", KvDtype::kFp8},
    {"int8", KvDtype::kInt8},         {"int4", KvDtype::kInt4},
    {"nvfp4", KvDtype::kNvfp4},       {"fp4", KvDtype::kNvfp4},
    {"float32", KvDtype::kFp32},      {"float", KvDtype::kFp32},
    {"float16", KvDtype::kFp16},      {"half", KvDtype::kFp16},
    {"bfloat16", KvDtype::kBf16},     {"float8", KvDtype::kFp8},
    {"fp8_e4m3", KvDtype::kFp8},      {"fp8_e5m2", KvDtype::kFp8},
    {"float8_e4m3fn", KvDtype::kFp8}, {"float8_e5m2", KvDtype::kFp8},
};

struct ScalingName {
  absl::string_view name;
  RopeScaling scaling;
};
constexpr ScalingName kScalingNames[] = {
    {"none", RopeScaling::kNone},
    {"linear", RopeScaling::kLinear},
    {"dynamic", RopeScaling::kDynamicNtk},
    {"llama3", RopeScaling::kLlama3},
    {"yarn", RopeScaling::kYarn},
    {"longrope", RopeScaling::kLongRope},
    {"default", RopeScaling::kNone},
    {"dynamic_ntk", RopeScaling::kDynamicNtk},
    {"su", RopeScaling::kLongRope},
};

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

std::string Num(double value) { return absl::StrFormat("%.17g", value); }

uint64_t Fnv1a64(absl::string_view text) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

// Splits "k=v;k=v" into ordered pairs; a part without '=' is its own key.
std::vector<std::pair<std::string, std::string>> SplitFields(
    absl::string_view text) {
  std::vector<std::pair<std::string, std::string>> fields;
  for (absl::string_view part : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    fields.push_back(std::move(kv));
  }
  return fields;
}

const std::string* FindField(
    const std::vector<std::pair<std::string, std::string>>& fields,
    const std::string& key) {
  for (const auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

absl::Status ValidateScalingFactors(const RopeConfig& rope) {
  const std::string what(RopeScalingName(rope.scaling));
  switch (rope.scaling) {
    case RopeScaling::kNone:
      return absl::OkStatus();
    case RopeScaling::kLinear:
    case RopeScaling::kDynamicNtk:
    case RopeScaling::kLongRope:
      if (!(rope.factor > 0)) {
        return Invalid(absl::StrCat("rope scaling ", what,
                                    " needs factor > 0, got ", rope.factor));
      }
      return absl::OkStatus();
    case RopeScaling::kLlama3:
      if (!(rope.factor > 0) || !(rope.low_freq_factor > 0) ||
          !(rope.high_freq_factor > rope.low_freq_factor) ||
          rope.original_max_position <= 0) {
        return Invalid(absl::StrCat(
            "rope scaling llama3 needs factor > 0, 0 < low_freq_factor < "
            "high_freq_factor and original_max_position > 0; got factor ",
            rope.factor, ", low_freq_factor ", rope.low_freq_factor,
            ", high_freq_factor ", rope.high_freq_factor,
            ", original_max_position ", rope.original_max_position));
      }
      return absl::OkStatus();
    case RopeScaling::kYarn:
      if (!(rope.factor > 0) || rope.original_max_position <= 0 ||
          !(rope.beta_slow > 0) || !(rope.beta_fast > rope.beta_slow)) {
        return Invalid(absl::StrCat(
            "rope scaling yarn needs factor > 0, original_max_position > 0 "
            "and 0 < beta_slow < beta_fast; got factor ",
            rope.factor, ", original_max_position ", rope.original_max_position,
            ", beta_fast ", rope.beta_fast, ", beta_slow ", rope.beta_slow));
      }
      return absl::OkStatus();
  }
  return Invalid("unknown rope scaling");
}

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

absl::Status ValidateDimensions(const ModelGeometry& g) {
  if (g.layers <= 0 || g.kv_heads <= 0 || g.head_dim <= 0 ||
      g.attention_heads < 0) {
    return Invalid(absl::StrCat(
        "model geometry needs layers, kv_heads and head_dim > 0; got layers ",
        g.layers, ", kv_heads ", g.kv_heads, ", head_dim ", g.head_dim,
        ", attention_heads ", g.attention_heads));
  }
  if (g.kv_lora_rank < 0 || (g.kv_lora_rank > 0 && g.kv_heads != 1)) {
    return Invalid(absl::StrCat(
        "kv_lora_rank ", g.kv_lora_rank,
        ": MLA caches one latent per layer, shared by all heads, so it needs "
        "kv_lora_rank > 0 with kv_heads 1 (got kv_heads ",
        g.kv_heads, ")"));
  }
  return absl::OkStatus();
}

// Sliding-window and state layers: both fields zero or both positive, and
// no more sliding layers than layers.
absl::Status ValidateLayerKinds(const ModelGeometry& g) {
  if (g.sliding_window < 0 || g.sliding_layers < 0 ||
      g.sliding_layers > g.layers ||
      (g.sliding_window > 0) != (g.sliding_layers > 0)) {
    return Invalid(absl::StrCat("sliding_window ", g.sliding_window,
                                " with sliding_layers ", g.sliding_layers,
                                ": give both (0 < sliding_layers <= layers ",
                                g.layers, ") or neither"));
  }
  uint64_t state = 0;
  if (g.state_layers < 0 ||
      (g.state_layers > 0) != (g.state_bytes_per_layer > 0) ||
      __builtin_mul_overflow(static_cast<uint64_t>(std::max(g.state_layers, 0)),
                             g.state_bytes_per_layer, &state)) {
    return Invalid(
        absl::StrCat("state_layers ", g.state_layers,
                     " with state_bytes_per_layer ", g.state_bytes_per_layer,
                     ": give both (> 0, their product below 2^64) or neither"));
  }
  return absl::OkStatus();
}

// Bits of one vector of `values` values, with the dtype's scales.
absl::Status VectorBits(uint64_t values, KvDtype dtype, absl::string_view what,
                        uint64_t* bits) {
  const uint64_t group = static_cast<uint64_t>(KvDtypeScaleGroup(dtype));
  if (group > 0 && values % group != 0) {
    return Invalid(absl::StrCat(what, " ", values, " is not a multiple of ",
                                group, ": ", KvDtypeName(dtype),
                                " stores one scale per ", group, " values"));
  }
  *bits = values * static_cast<uint64_t>(KvDtypeBits(dtype)) +
          (group > 0 ? values / group * 8 : 0);
  return absl::OkStatus();
}

// Bits one token adds to one KV layer. REQUIRES: ValidateDimensions OK.
absl::Status LayerBits(const ModelGeometry& g, KvDtype dtype, uint64_t* bits) {
  if (g.kv_lora_rank > 0) {
    return VectorBits(static_cast<uint64_t>(g.kv_lora_rank) +
                          static_cast<uint64_t>(g.head_dim),
                      dtype, "kv_lora_rank + qk_rope_head_dim", bits);
  }
  uint64_t vector = 0;
  RETURN_IF_ERROR(VectorBits(static_cast<uint64_t>(g.head_dim), dtype,
                             "head_dim", &vector));
  // Each factor is < 2^31 and a vector's bits < 2^38, so this fits.
  *bits = 2 * static_cast<uint64_t>(g.kv_heads) * vector;
  return absl::OkStatus();
}

struct Window {
  int tokens = 0;
  int layers = 0;
};

ModelGeometry Geometry(int layers, int kv_heads, int head_dim,
                       int attention_heads, const char* name, Window window) {
  ModelGeometry g;
  g.layers = layers;
  g.kv_heads = kv_heads;
  g.head_dim = head_dim;
  g.attention_heads = attention_heads;
  g.sliding_window = window.tokens;
  g.sliding_layers = window.layers;
  g.name = name;
  return g;
}

// meta-llama/Llama-3.1-8B config.json: num_hidden_layers 32,
// num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim
// 4096/32 = 128), rope_theta 500000.0, rope_scaling {rope_type llama3,
// factor 8.0, low_freq_factor 1.0, high_freq_factor 4.0,
// original_max_position_embeddings 8192}. Llama-3-8B (3.0) has the same
// geometry and theta but rope_scaling null: use --hf_config for it.
// meta-llama/Llama-3.1-70B config.json: num_hidden_layers 80,
// num_attention_heads 64, num_key_value_heads 8, hidden_size 8192
// (head_dim 128), RoPE as for the 8B.
std::vector<ModelPreset> LlamaPresets() {
  RopeConfig rope;
  rope.theta = 500000.0;
  rope.scaling = RopeScaling::kLlama3;
  rope.factor = 8.0;
  rope.low_freq_factor = 1.0;
  rope.high_freq_factor = 4.0;
  rope.original_max_position = 8192;
  return {{Geometry(32, 8, 128, 32, "llama-3-8b", {}), rope,
           "meta-llama/Llama-3.1-8B"},
          {Geometry(80, 8, 128, 64, "llama-3-70b", {}), rope,
           "meta-llama/Llama-3.1-70B"}};
}

// mistralai/Mistral-7B-v0.3 config.json (v0.2 is the same here):
// num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8,
// hidden_size 4096 (head_dim 128), rope_theta 1000000.0, sliding_window
// null. v0.1 differs: rope_theta 10000.0 and a 4096-token sliding window.
ModelPreset MistralPreset() {
  RopeConfig rope;
  rope.theta = 1000000.0;
  return {Geometry(32, 8, 128, 32, "mistral-7b", {}), rope,
          "mistralai/Mistral-7B-v0.3"};
}

// google/gemma-2-9b config.json: num_hidden_layers 42,
// num_attention_heads 16, num_key_value_heads 8, head_dim 256 (not
// hidden_size 3584 / 16), rope_theta 10000.0, sliding_window 4096 on every
// other layer (layers 0, 2, ..., 40: 21 of 42).
ModelPreset Gemma2Preset() {
  RopeConfig rope;
  rope.theta = 10000.0;
  return {Geometry(42, 8, 256, 16, "gemma-2-9b", {4096, 21}), rope,
          "google/gemma-2-9b"};
}

// google/gemma-3-27b-it config.json, text_config: num_hidden_layers 62,
// num_attention_heads 32, num_key_value_heads 16, head_dim 128,
// sliding_window 1024, sliding_window_pattern 6 (layers 5, 11, ..., 59
// are global: 10 of 62, so 52 slide), rope_theta 1000000 with
// rope_scaling linear factor 8 for the global layers. The sliding layers
// rotate with rope_local_base_freq 10000, which the RoPE settings here do
// not describe: shift ALLOW would re-rotate them wrongly.
ModelPreset Gemma3Preset() {
  RopeConfig rope;
  rope.theta = 1000000.0;
  rope.scaling = RopeScaling::kLinear;
  rope.factor = 8.0;
  return {Geometry(62, 16, 128, 32, "gemma-3-27b", {1024, 52}), rope,
          "google/gemma-3-27b-it"};
}

// deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61,
// num_attention_heads 128, kv_lora_rank 512, qk_rope_head_dim 64 (MLA: the
// num_key_value_heads 128 there does not size the cache), rope_theta
// 10000, rope_scaling yarn factor 40, original_max_position_embeddings
// 4096, beta_fast 32, beta_slow 1. The rope part is rotated interleaved
// (gptj), as DeepSeek's reference code and vLLM do.
ModelPreset DeepSeekV3Preset() {
  RopeConfig rope;
  rope.theta = 10000.0;
  rope.scaling = RopeScaling::kYarn;
  rope.factor = 40.0;
  rope.original_max_position = 4096;
  rope.beta_fast = 32.0;
  rope.beta_slow = 1.0;
  rope.layout = RopeLayout::kGptj;
  ModelGeometry g = Geometry(61, 1, 64, 128, "deepseek-v3", {});
  g.kv_lora_rank = 512;
  return {g, rope, "deepseek-ai/DeepSeek-V3"};
}

// Qwen/Qwen3-Next-80B-A3B-Instruct config.json: num_hidden_layers 48,
// full_attention_interval 4 (12 attention layers, 36 Gated DeltaNet
// layers), num_attention_heads 16, num_key_value_heads 2, head_dim 256,
// partial_rotary_factor 0.25, rope_theta 10000000; linear_num_key_heads
// 16, linear_num_value_heads 32, linear_key_head_dim 128,
// linear_value_head_dim 128, linear_conv_kernel_dim 4, torch_dtype
// bfloat16. State per layer: conv (4 - 1) x (128 x 16 x 2 + 128 x 32) +
// recurrent 32 x 128 x 128 = 548,864 values x 2 B = 1,097,728 B.
ModelPreset Qwen3NextPreset() {
  RopeConfig rope;
  rope.theta = 10000000.0;
  rope.rotary_dim = 64;
  ModelGeometry g = Geometry(12, 2, 256, 16, "qwen3-next-80b-a3b", {});
  g.state_layers = 36;
  g.state_bytes_per_layer = 1097728;
  return {g, rope, "Qwen/Qwen3-Next-80B-A3B-Instruct"};
}

// ai21labs/Jamba-v0.1 config.json: num_hidden_layers 32, attn_layer_period
// 8, attn_layer_offset 4 (4 attention layers, 28 Mamba layers),
// num_attention_heads 32, num_key_value_heads 8, hidden_size 4096
// (head_dim 128); mamba_expand 2, mamba_d_conv 4, mamba_d_state 16,
// torch_dtype bfloat16. State per layer: intermediate 2 x 4096 = 8192;
// conv 8192 x (4 - 1) + ssm 8192 x 16 = 155,648 values x 2 B = 311,296 B.
// Jamba has no positional encoding; the RoPE settings are the defaults.
ModelPreset JambaPreset() {
  ModelGeometry g = Geometry(4, 8, 128, 32, "jamba-v0.1", {});
  g.state_layers = 28;
  g.state_bytes_per_layer = 311296;
  return {g, RopeConfig(), "ai21labs/Jamba-v0.1"};
}

// Every preset, in the order the help and the errors list them.
std::vector<ModelPreset> Presets() {
  std::vector<ModelPreset> presets = LlamaPresets();
  for (ModelPreset p : {MistralPreset(), Gemma2Preset(), Gemma3Preset(),
                        DeepSeekV3Preset(), Qwen3NextPreset(), JambaPreset()})
    presets.push_back(std::move(p));
  return presets;
}

}  // namespace

absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const DtypeName& entry : kDtypeNames) {
    if (entry.name == lower) return entry.dtype;
  }
  return Invalid(absl::StrCat("unknown KV dtype \"", name,
                              "\"; expected fp32, fp16, bf16, fp8, int8, "
                              "int4 or nvfp4"));
}

absl::string_view KvDtypeName(KvDtype dtype) {
  for (const DtypeName& entry : kDtypeNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  return "unknown";
}

int KvDtypeBits(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kFp32:
      return 32;
    case KvDtype::kFp16:
    case KvDtype::kBf16:
      return 16;
    case KvDtype::kFp8:
    case KvDtype::kInt8:
      return 8;
    case KvDtype::kInt4:
    case KvDtype::kNvfp4:
      return 4;
  }
  return 0;
}

int KvDtypeScaleGroup(KvDtype dtype) {
  return dtype == KvDtype::kNvfp4 ? 16 : 0;
}

std::string KvDtypeSizeText(KvDtype dtype) {
  const int bits = KvDtypeBits(dtype);
  std::string text = bits % 8 == 0 ? absl::StrCat(bits / 8, " B")
                                   : absl::StrFormat("%g B", bits / 8.0);
  if (KvDtypeScaleGroup(dtype) > 0) {
    absl::StrAppend(&text, " + 1 B per ", KvDtypeScaleGroup(dtype), " values");
  }
  return text;
}

absl::Status ValidateGeometry(const ModelGeometry& g, KvDtype dtype) {
  RETURN_IF_ERROR(ValidateDimensions(g));
  RETURN_IF_ERROR(ValidateLayerKinds(g));
  uint64_t layer_bits = 0;
  RETURN_IF_ERROR(LayerBits(g, dtype, &layer_bits));
  uint64_t bits = 0;
  if (__builtin_mul_overflow(layer_bits, static_cast<uint64_t>(g.layers),
                             &bits)) {
    return Invalid(absl::StrCat("model geometry ", g.layers, " layers x ",
                                layer_bits,
                                " bits per layer overflows 64-bit bytes per "
                                "token"));
  }
  // One layer's bits always make whole bytes for the dtypes we have; the
  // check guards the formula rather than any real model.
  if (layer_bits % 8 != 0) {
    return Invalid(absl::StrCat(
        "one layer of ", g.kv_heads, " kv_heads x ", g.head_dim, " head_dim x ",
        KvDtypeBits(dtype), " bits is ", layer_bits,
        " bits, not a whole number of bytes per token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> LayerBytesPerToken(const ModelGeometry& g,
                                            KvDtype dtype) {
  RETURN_IF_ERROR(ValidateGeometry(g, dtype));
  uint64_t bits = 0;
  RETURN_IF_ERROR(LayerBits(g, dtype, &bits));
  return bits / 8;
}

absl::StatusOr<uint64_t> BytesPerToken(const ModelGeometry& g, KvDtype dtype) {
  ASSIGN_OR_RETURN(const uint64_t layer, LayerBytesPerToken(g, dtype));
  return layer * static_cast<uint64_t>(g.layers);
}

absl::StatusOr<uint64_t> SequenceKvBytes(const ModelGeometry& g, KvDtype dtype,
                                         int64_t context, int block_size) {
  ASSIGN_OR_RETURN(const uint64_t layer, LayerBytesPerToken(g, dtype));
  const uint64_t ctx = static_cast<uint64_t>(std::max<int64_t>(context, 0));
  uint64_t full_tokens = ctx;
  uint64_t window_tokens =
      std::min(ctx, static_cast<uint64_t>(g.sliding_window));
  if (block_size > 0) {
    const uint64_t bs = static_cast<uint64_t>(block_size);
    const uint64_t blocks = CeilDiv(ctx, bs);
    const uint64_t window_blocks = std::min(
        blocks, CeilDiv(static_cast<uint64_t>(g.sliding_window), bs) + 1);
    full_tokens = blocks * bs;
    window_tokens = window_blocks * bs;
  }
  const uint64_t full_layers =
      static_cast<uint64_t>(g.layers - g.sliding_layers);
  const uint128 bytes =
      static_cast<uint128>(full_tokens) * full_layers * layer +
      static_cast<uint128>(window_tokens) *
          static_cast<uint64_t>(g.sliding_layers) * layer +
      static_cast<uint128>(g.state_layers) * g.state_bytes_per_layer;
  if (bytes > std::numeric_limits<uint64_t>::max()) {
    return Invalid(absl::StrCat("a sequence of ", context,
                                " tokens overflows 64-bit bytes"));
  }
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<uint64_t> BlockBytes(uint64_t bytes_per_token, int block_size) {
  if (block_size <= 0) {
    return Invalid(absl::StrCat("block_size must be > 0, got ", block_size));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(bytes_per_token, static_cast<uint64_t>(block_size),
                             &bytes)) {
    return Invalid(absl::StrCat("block_size ", block_size, " x ",
                                bytes_per_token,
                                " bytes per token overflows 64 bits"));
  }
  return bytes;
}

uint64_t BudgetBlocks(uint64_t budget_bytes, uint64_t block_bytes) {
  return budget_bytes / block_bytes;
}

absl::StatusOr<RopeScaling> ParseRopeScaling(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower.empty()) return RopeScaling::kNone;
  for (const ScalingName& entry : kScalingNames) {
    if (entry.name == lower) return entry.scaling;
  }
  return Invalid(absl::StrCat("unknown rope scaling \"", name,
                              "\"; expected none, linear, dynamic, llama3, "
                              "yarn or longrope"));
}

absl::string_view RopeScalingName(RopeScaling scaling) {
  for (const ScalingName& entry : kScalingNames) {
    if (entry.scaling == scaling) return entry.name;
  }
  return "unknown";
}

absl::StatusOr<RopeLayout> ParseRopeLayout(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "neox") return RopeLayout::kNeox;
  if (lower == "gptj") return RopeLayout::kGptj;
  return Invalid(absl::StrCat("unknown rope layout \"", name,
                              "\"; expected neox or gptj"));
}

absl::string_view RopeLayoutName(RopeLayout layout) {
  return layout == RopeLayout::kGptj ? "gptj" : "neox";
}

int EffectiveRotaryDim(const RopeConfig& rope, int head_dim) {
  return rope.rotary_dim == 0 ? head_dim : rope.rotary_dim;
}

bool RopeIsShiftable(RopeScaling scaling) {
  return scaling != RopeScaling::kDynamicNtk &&
         scaling != RopeScaling::kLongRope;
}

absl::StatusOr<uint64_t> BytesPerToken(const ModelSpec& spec) {
  return BytesPerToken(spec.geometry, spec.kv_dtype);
}

absl::StatusOr<uint64_t> BlockBytes(const ModelSpec& spec) {
  absl::StatusOr<uint64_t> per_token = BytesPerToken(spec);
  if (!per_token.ok()) return per_token.status();
  return BlockBytes(*per_token, spec.block_size);
}

absl::Status ValidateRope(const ModelSpec& spec) {
  const RopeConfig& rope = spec.rope;
  if (!(rope.theta > 0)) {
    return Invalid(absl::StrCat("rope theta must be > 0, got ", rope.theta));
  }
  absl::Status factors = ValidateScalingFactors(rope);
  if (!factors.ok()) return factors;
  const int head_dim = spec.geometry.head_dim;
  const int rotary_dim = EffectiveRotaryDim(rope, head_dim);
  if (rope.rotary_dim < 0 || rotary_dim % 2 != 0 ||
      (head_dim > 0 && rotary_dim > head_dim)) {
    return Invalid(
        absl::StrCat("rope rotary_dim must be even and between 0 "
                     "and head_dim ",
                     head_dim, "; got ", rope.rotary_dim));
  }
  if (spec.shift_allow && !RopeIsShiftable(rope.scaling)) {
    return Invalid(absl::StrCat(
        "rope shift ALLOW is not possible with ", RopeScalingName(rope.scaling),
        " scaling: its frequencies depend on the sequence length, so keys "
        "cached at one position cannot be re-rotated to another "
        "(R(a)R(b) != R(a+b)). Set rope.shift to DENY, or use a composable "
        "scaling (none, linear, llama3, yarn)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateModelSpec(const ModelSpec& spec) {
  absl::Status status = ValidateGeometry(spec.geometry, spec.kv_dtype);
  if (!status.ok()) return status;
  if (spec.block_size <= 0) {
    return Invalid(
        absl::StrCat("block_size must be > 0, got ", spec.block_size));
  }
  return ValidateRope(spec);
}

std::string FingerprintText(const ModelSpec& spec) {
  const ModelGeometry& g = spec.geometry;
  const RopeConfig& rope = spec.rope;
  std::vector<std::string> f = {
      "prefixd-model-v1",
      absl::StrCat("layers=", g.layers),
      absl::StrCat("kv_heads=", g.kv_heads),
      absl::StrCat("head_dim=", g.head_dim),
  };
  if (g.kv_lora_rank > 0) {
    f.push_back(absl::StrCat("kv_lora_rank=", g.kv_lora_rank));
  }
  f.push_back(absl::StrCat("kv_dtype=", KvDtypeName(spec.kv_dtype)));
  if (g.state_layers > 0) {
    f.push_back(absl::StrCat("state_layers=", g.state_layers));
    f.push_back(
        absl::StrCat("state_bytes_per_layer=", g.state_bytes_per_layer));
  }
  f.push_back(absl::StrCat("block_size=", spec.block_size));
  f.push_back(absl::StrCat("rope.theta=", Num(rope.theta)));
  f.push_back(absl::StrCat("rope.scaling=", RopeScalingName(rope.scaling)));
  if (rope.scaling != RopeScaling::kNone) {
    f.push_back(absl::StrCat("rope.factor=", Num(rope.factor)));
  }
  if (rope.scaling == RopeScaling::kLlama3) {
    f.push_back(
        absl::StrCat("rope.low_freq_factor=", Num(rope.low_freq_factor)));
    f.push_back(
        absl::StrCat("rope.high_freq_factor=", Num(rope.high_freq_factor)));
  }
  if (rope.scaling == RopeScaling::kLlama3 ||
      rope.scaling == RopeScaling::kYarn ||
      rope.scaling == RopeScaling::kLongRope) {
    f.push_back(absl::StrCat("rope.original_max_position=",
                             rope.original_max_position));
  }
  if (rope.scaling == RopeScaling::kYarn) {
    f.push_back(absl::StrCat("rope.beta_fast=", Num(rope.beta_fast)));
    f.push_back(absl::StrCat("rope.beta_slow=", Num(rope.beta_slow)));
  }
  f.push_back(
      absl::StrCat("rope.rotary_dim=", EffectiveRotaryDim(rope, g.head_dim)));
  f.push_back(absl::StrCat("rope.layout=", RopeLayoutName(rope.layout)));
  f.push_back(absl::StrCat("rope.shift=", spec.shift_allow ? "allow" : "deny"));
  return absl::StrJoin(f, ";");
}

std::string Fingerprint(const ModelSpec& spec) {
  return absl::StrFormat("%016x", Fnv1a64(FingerprintText(spec)));
}

std::string DescribeDifference(absl::string_view a_text,
                               absl::string_view b_text) {
  const auto a = SplitFields(a_text);
  const auto b = SplitFields(b_text);
  std::vector<std::string> diffs;
  for (const auto& [key, a_value] : a) {
    const std::string* b_value = FindField(b, key);
    if (b_value == nullptr) {
      diffs.push_back(absl::StrCat(key, ": ", a_value, " vs <absent>"));
    } else if (*b_value != a_value) {
      diffs.push_back(absl::StrCat(key, ": ", a_value, " vs ", *b_value));
    }
  }
  for (const auto& [key, b_value] : b) {
    if (FindField(a, key) == nullptr) {
      diffs.push_back(absl::StrCat(key, ": <absent> vs ", b_value));
    }
  }
  return absl::StrJoin(diffs, "; ");
}

absl::StatusOr<ModelPreset> FindPreset(absl::string_view name) {
  for (ModelPreset& preset : Presets()) {
    if (absl::EqualsIgnoreCase(preset.geometry.name, name)) {
      return std::move(preset);
    }
  }
  return absl::NotFoundError(
      absl::StrCat("unknown model preset \"", name,
                   "\"; known presets: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const ModelPreset& preset : Presets()) {
    names.push_back(preset.geometry.name);
  }
  return names;
}

}  // namespace prefixd
