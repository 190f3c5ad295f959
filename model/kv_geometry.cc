#include "model/kv_geometry.h"

#include <cstdint>
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

namespace prefixd {
namespace {

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

std::vector<ModelPreset> Presets() {
  RopeConfig llama3_rope;
  llama3_rope.theta = 500000.0;
  llama3_rope.scaling = RopeScaling::kLlama3;
  llama3_rope.factor = 8.0;
  llama3_rope.low_freq_factor = 1.0;
  llama3_rope.high_freq_factor = 4.0;
  llama3_rope.original_max_position = 8192;

  std::vector<ModelPreset> presets;
  // meta-llama/Llama-3.1-8B config.json: num_hidden_layers 32,
  // num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 (head_dim
  // 4096/32 = 128), rope_theta 500000.0, rope_scaling {rope_type llama3,
  // factor 8.0, low_freq_factor 1.0, high_freq_factor 4.0,
  // original_max_position_embeddings 8192}. Llama-3-8B (3.0) has the same
  // geometry and theta but rope_scaling null: use --hf_config for it.
  presets.push_back(
      {{32, 8, 128, 32, "llama-3-8b"}, llama3_rope, "meta-llama/Llama-3.1-8B"});
  // meta-llama/Llama-3.1-70B config.json: num_hidden_layers 80,
  // num_attention_heads 64, num_key_value_heads 8, hidden_size 8192
  // (head_dim 128), RoPE as for the 8B.
  presets.push_back({{80, 8, 128, 64, "llama-3-70b"},
                     llama3_rope,
                     "meta-llama/Llama-3.1-70B"});
  // mistralai/Mistral-7B-v0.3 config.json (v0.2 is the same here):
  // num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8,
  // hidden_size 4096 (head_dim 128), rope_theta 1000000.0, sliding_window
  // null. v0.1 differs: rope_theta 10000.0 and a 4096-token sliding window.
  RopeConfig mistral_rope;
  mistral_rope.theta = 1000000.0;
  presets.push_back({{32, 8, 128, 32, "mistral-7b"},
                     mistral_rope,
                     "mistralai/Mistral-7B-v0.3"});
  // google/gemma-2-9b config.json: num_hidden_layers 42,
  // num_attention_heads 16, num_key_value_heads 8, head_dim 256 (not
  // hidden_size 3584 / 16), rope_theta 10000.0. Every other layer uses a
  // 4096-token sliding window; the formula counts all 42 layers, which is what
  // an engine without a sliding-window-aware allocator reserves.
  RopeConfig gemma_rope;
  gemma_rope.theta = 10000.0;
  presets.push_back(
      {{42, 8, 256, 16, "gemma-2-9b"}, gemma_rope, "google/gemma-2-9b"});
  return presets;
}

}  // namespace

absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const DtypeName& entry : kDtypeNames) {
    if (entry.name == lower) return entry.dtype;
  }
  return Invalid(absl::StrCat("unknown KV dtype \"", name,
                              "\"; expected fp32, fp16, bf16, fp8, int8 or "
                              "int4"));
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
      return 4;
  }
  return 0;
}

absl::Status ValidateGeometry(const ModelGeometry& g, KvDtype dtype) {
  if (g.layers <= 0 || g.kv_heads <= 0 || g.head_dim <= 0 ||
      g.attention_heads < 0) {
    return Invalid(absl::StrCat(
        "model geometry needs layers, kv_heads and head_dim > 0; got layers ",
        g.layers, ", kv_heads ", g.kv_heads, ", head_dim ", g.head_dim,
        ", attention_heads ", g.attention_heads));
  }
  // Each factor is < 2^31, so the product of three fits in 2^93: check in
  // two 64-bit steps.
  uint64_t elements = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(g.layers),
                             static_cast<uint64_t>(g.kv_heads), &elements) ||
      __builtin_mul_overflow(elements, static_cast<uint64_t>(g.head_dim),
                             &elements) ||
      __builtin_mul_overflow(
          elements, 2 * static_cast<uint64_t>(KvDtypeBits(dtype)), &elements)) {
    return Invalid(absl::StrCat("model geometry ", g.layers, " x ", g.kv_heads,
                                " x ", g.head_dim,
                                " overflows 64-bit bytes per token"));
  }
  if (elements % 8 != 0) {
    return Invalid(absl::StrCat(
        "2 x ", g.layers, " layers x ", g.kv_heads, " kv_heads x ", g.head_dim,
        " head_dim x ", KvDtypeBits(dtype), " bits is ", elements,
        " bits, not a whole number of bytes per token"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BytesPerToken(const ModelGeometry& g, KvDtype dtype) {
  absl::Status status = ValidateGeometry(g, dtype);
  if (!status.ok()) return status;
  return 2 * static_cast<uint64_t>(g.layers) *
         static_cast<uint64_t>(g.kv_heads) * static_cast<uint64_t>(g.head_dim) *
         static_cast<uint64_t>(KvDtypeBits(dtype)) / 8;
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
      absl::StrCat("kv_dtype=", KvDtypeName(spec.kv_dtype)),
      absl::StrCat("block_size=", spec.block_size),
      absl::StrCat("rope.theta=", Num(rope.theta)),
      absl::StrCat("rope.scaling=", RopeScalingName(rope.scaling)),
  };
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
