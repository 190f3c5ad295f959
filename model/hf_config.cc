#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "model/kv_geometry.h"

namespace prefixd {
namespace {

using ::google::protobuf::Struct;
using ::google::protobuf::Value;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", message));
}

// The field's value, or nullptr when it is absent or JSON null.
const Value* Field(const Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  if (it == s.fields().end() || it->second.kind_case() == Value::kNullValue) {
    return nullptr;
  }
  return &it->second;
}

const Struct* Object(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->has_struct_value() ? &v->struct_value() : nullptr;
}

// A number field; nullopt when absent. `where` prefixes error messages.
absl::StatusOr<std::optional<double>> Number(const Struct& s,
                                             const std::string& name,
                                             absl::string_view where) {
  const Value* v = Field(s, name);
  if (v == nullptr) return std::optional<double>();
  if (v->kind_case() != Value::kNumberValue) {
    return Invalid(absl::StrCat(where, name, " must be a number"));
  }
  return std::optional<double>(v->number_value());
}

// A positive integer field; nullopt when absent.
absl::StatusOr<std::optional<int>> PositiveInt(const Struct& s,
                                               const std::string& name,
                                               absl::string_view where) {
  absl::StatusOr<std::optional<double>> n = Number(s, name, where);
  if (!n.ok()) return n.status();
  if (!n->has_value()) return std::optional<int>();
  const double v = **n;
  if (!(v >= 1) || v > 2147483647.0 || std::floor(v) != v) {
    return Invalid(
        absl::StrCat(where, name, " must be a positive integer, got ", v));
  }
  return std::optional<int>(static_cast<int>(v));
}

absl::StatusOr<int> RequiredInt(const Struct& s, const std::string& name) {
  absl::StatusOr<std::optional<int>> v = PositiveInt(s, name, "");
  if (!v.ok()) return v.status();
  if (!v->has_value()) return Invalid(absl::StrCat(name, " is missing"));
  return **v;
}

std::optional<std::string> String(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  if (v == nullptr || v->kind_case() != Value::kStringValue) {
    return std::nullopt;
  }
  return v->string_value();
}

// A boolean field; nullopt when absent.
std::optional<bool> Bool(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  if (v == nullptr || v->kind_case() != Value::kBoolValue) return std::nullopt;
  return v->bool_value();
}

absl::StatusOr<int> RequiredFor(const Struct& s, const std::string& name,
                                absl::string_view why) {
  ASSIGN_OR_RETURN(std::optional<int> v, PositiveInt(s, name, ""));
  if (!v.has_value()) {
    return Invalid(absl::StrCat(name, " is missing; it is needed ", why));
  }
  return *v;
}

// Multi-head latent attention (DeepSeek-V2/V3): each layer caches the
// compressed latent (kv_lora_rank) and the rotated key part
// (qk_rope_head_dim), shared by every head, instead of K and V per KV head.
absl::Status ReadMla(const Struct& c, ModelSpecFromHf& out) {
  ASSIGN_OR_RETURN(std::optional<int> rank, PositiveInt(c, "kv_lora_rank", ""));
  if (!rank.has_value()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int rope_dim,
                   RequiredFor(c, "qk_rope_head_dim",
                               "with kv_lora_rank (multi-head latent "
                               "attention caches it beside the latent)"));
  ModelGeometry& g = out.geometry;
  out.notes.push_back(absl::StrCat(
      "multi-head latent attention: each layer caches kv_lora_rank ", *rank,
      " + qk_rope_head_dim ", rope_dim, " values per token; ",
      "num_key_value_heads does not size the cache"));
  g.kv_lora_rank = *rank;
  g.kv_heads = 1;
  g.head_dim = rope_dim;
  ASSIGN_OR_RETURN(std::optional<int> mtp,
                   PositiveInt(c, "num_nextn_predict_layers", ""));
  if (mtp.has_value()) {
    out.notes.push_back(absl::StrCat(
        "num_nextn_predict_layers ", *mtp,
        ": not counted; an engine that runs them for speculative decoding "
        "caches that many more layers"));
  }
  return absl::OkStatus();
}

// How many layers of each kind. `layers` is num_hidden_layers.
struct LayerKinds {
  int full = 0;
  int sliding = 0;
  int state = 0;
  std::string state_kind;  // "linear_attention" or "mamba"
};

absl::StatusOr<LayerKinds> FromLayerTypes(const Struct& c, int layers) {
  const Value* list = Field(c, "layer_types");
  LayerKinds kinds;
  if (!list->has_list_value() || list->list_value().values_size() != layers) {
    return Invalid(absl::StrCat(
        "layer_types must list one type per layer (num_hidden_layers ", layers,
        "), got ",
        list->has_list_value() ? list->list_value().values_size() : 0,
        " entries"));
  }
  for (int i = 0; i < layers; ++i) {
    const Value& v = list->list_value().values(i);
    const std::string type = v.has_string_value() ? v.string_value() : "";
    if (type == "full_attention") {
      ++kinds.full;
    } else if (type == "sliding_attention") {
      ++kinds.sliding;
    } else if (type == "linear_attention" || type == "mamba") {
      ++kinds.state;
      kinds.state_kind = type;
    } else {
      return Invalid(absl::StrCat(
          "layer_types[", i, "] \"", type,
          "\" is a layer prefixd cannot size; expected full_attention, "
          "sliding_attention, linear_attention or mamba"));
    }
  }
  return kinds;
}

// Hybrid layouts with a fixed period: Qwen3-Next (full_attention_interval:
// every interval-th layer is attention, the rest Gated DeltaNet) and Jamba
// (attn_layer_period/offset: layer i is attention when i % period ==
// offset, the rest Mamba).
absl::StatusOr<std::optional<LayerKinds>> FromPeriod(const Struct& c,
                                                     int layers) {
  ASSIGN_OR_RETURN(std::optional<int> interval,
                   PositiveInt(c, "full_attention_interval", ""));
  LayerKinds kinds;
  if (interval.has_value()) {
    kinds.full = layers / *interval;
    kinds.state_kind = "linear_attention";
  } else {
    ASSIGN_OR_RETURN(std::optional<int> period,
                     PositiveInt(c, "attn_layer_period", ""));
    if (!period.has_value()) return std::optional<LayerKinds>();
    ASSIGN_OR_RETURN(std::optional<double> offset,
                     Number(c, "attn_layer_offset", ""));
    const int first = static_cast<int>(offset.value_or(0));
    if (first < 0 || first >= *period) {
      return Invalid(absl::StrCat("attn_layer_offset ", first,
                                  " must be in [0, attn_layer_period ", *period,
                                  ")"));
    }
    kinds.full = layers > first ? (layers - first - 1) / *period + 1 : 0;
    kinds.state_kind = "mamba";
  }
  kinds.state = layers - kinds.full;
  return std::optional<LayerKinds>(kinds);
}

// Sliding-window layers of a config without layer_types, as Hugging Face's
// modeling code picks them.
absl::StatusOr<int> SlidingLayers(const Struct& c, int layers) {
  const std::string type = String(c, "model_type").value_or("");
  if (type == "gemma2") return (layers + 1) / 2;  // layers 0, 2, 4, ...
  ASSIGN_OR_RETURN(std::optional<int> pattern,
                   PositiveInt(c, "sliding_window_pattern", ""));
  // Gemma 3: every pattern-th layer is global. Published Gemma 3 configs
  // leave the field out and rely on Gemma3TextConfig's default, 6.
  if (!pattern.has_value() && type == "gemma3_text") pattern = 6;
  if (pattern.has_value()) return layers - layers / *pattern;
  ASSIGN_OR_RETURN(std::optional<int> max_window,
                   PositiveInt(c, "max_window_layers", ""));
  if (Bool(c, "use_sliding_window").value_or(false) && max_window.has_value()) {
    return std::max(layers - *max_window, 0);  // Qwen2: layers >= it slide
  }
  return layers;  // Mistral-7B-v0.1: every layer
}

// The recurrent state one layer keeps per sequence, in values.
absl::StatusOr<uint64_t> StateValues(const Struct& c, absl::string_view kind) {
  if (kind == "linear_attention") {
    // Gated DeltaNet: a causal conv over q, k and v (conv_kernel - 1 past
    // inputs) and a value_heads x key_dim x value_dim recurrent state.
    const char* why = "to size the linear-attention layers' state";
    ASSIGN_OR_RETURN(const int k_heads,
                     RequiredFor(c, "linear_num_key_heads", why));
    ASSIGN_OR_RETURN(const int v_heads,
                     RequiredFor(c, "linear_num_value_heads", why));
    ASSIGN_OR_RETURN(const int k_dim,
                     RequiredFor(c, "linear_key_head_dim", why));
    ASSIGN_OR_RETURN(const int v_dim,
                     RequiredFor(c, "linear_value_head_dim", why));
    ASSIGN_OR_RETURN(const int kernel,
                     RequiredFor(c, "linear_conv_kernel_dim", why));
    const uint64_t conv_dim = 2ULL * k_heads * k_dim + 1ULL * v_heads * v_dim;
    return conv_dim * static_cast<uint64_t>(kernel - 1) +
           1ULL * v_heads * k_dim * v_dim;
  }
  // Mamba (Jamba): a causal conv (d_conv - 1 past inputs) and a d_state
  // state per channel of the expanded width expand x hidden_size.
  const char* why = "to size the Mamba layers' state";
  ASSIGN_OR_RETURN(const int d_state, RequiredFor(c, "mamba_d_state", why));
  ASSIGN_OR_RETURN(const int d_conv, RequiredFor(c, "mamba_d_conv", why));
  ASSIGN_OR_RETURN(const int expand, RequiredFor(c, "mamba_expand", why));
  ASSIGN_OR_RETURN(const int hidden, RequiredFor(c, "hidden_size", why));
  const uint64_t width = 1ULL * expand * hidden;
  return width * static_cast<uint64_t>(d_conv - 1) + width * d_state;
}

// Fields of hybrid layouts this reader does not model: refused rather than
// sized as if every layer were attention.
constexpr const char* kUnsizableFields[] = {"hybrid_override_pattern",
                                            "attn_layer_indices",
                                            "layers_block_type", "mamba_d_ssm"};

absl::Status ReadLayerKinds(const Struct& c, ModelSpecFromHf& out) {
  for (const char* field : kUnsizableFields) {
    if (Field(c, field) != nullptr) {
      return Invalid(absl::StrCat(
          field,
          ": a hybrid layer layout prefixd cannot size from config.json; give "
          "the attention layers and the state by numbers instead"));
    }
  }
  ModelGeometry& g = out.geometry;
  const int layers = g.layers;
  LayerKinds kinds;
  if (Field(c, "layer_types") != nullptr) {
    ASSIGN_OR_RETURN(kinds, FromLayerTypes(c, layers));
  } else {
    ASSIGN_OR_RETURN(std::optional<LayerKinds> period, FromPeriod(c, layers));
    kinds = period.value_or(LayerKinds{layers, 0, 0, ""});
  }
  ASSIGN_OR_RETURN(std::optional<int> window,
                   PositiveInt(c, "sliding_window", ""));
  const bool window_on = window.has_value() &&
                         Bool(c, "use_sliding_window").value_or(true) != false;
  if (Field(c, "layer_types") == nullptr && window_on && kinds.state == 0) {
    ASSIGN_OR_RETURN(kinds.sliding, SlidingLayers(c, layers));
    kinds.full = layers - kinds.sliding;
  }
  if (kinds.sliding > 0) {
    if (!window_on) {
      return Invalid(
          absl::StrCat("sliding_window is missing or off, but layer_types has ",
                       kinds.sliding, " sliding_attention layers"));
    }
    g.sliding_window = *window;
    g.sliding_layers = kinds.sliding;
  }
  if (kinds.state > 0) {
    ASSIGN_OR_RETURN(const uint64_t values, StateValues(c, kinds.state_kind));
    // States are kept in the weights' dtype (vLLM's mamba_cache_dtype
    // "auto"), 16-bit unless the config says float32.
    const uint64_t bytes = out.torch_dtype == KvDtype::kFp32 ? 4 : 2;
    g.state_layers = kinds.state;
    g.state_bytes_per_layer = values * bytes;
    out.notes.push_back(
        absl::StrCat("hybrid: ", kinds.full + kinds.sliding, " of ", layers,
                     " layers hold KV; ", kinds.state, " ", kinds.state_kind,
                     " layers hold a fixed state of ", values, " values x ",
                     bytes, " B per sequence each"));
  }
  g.layers = kinds.full + kinds.sliding;
  if (g.layers == 0) {
    return Invalid(absl::StrCat("num_hidden_layers ", layers,
                                ": no layer holds KV, nothing to cache"));
  }
  return absl::OkStatus();
}

absl::Status ReadGeometry(const Struct& c, ModelSpecFromHf& out) {
  ModelGeometry& g = out.geometry;
  g.name = String(c, "model_type").value_or("");
  ASSIGN_OR_RETURN(g.layers, RequiredInt(c, "num_hidden_layers"));
  ASSIGN_OR_RETURN(const int heads, RequiredInt(c, "num_attention_heads"));
  g.attention_heads = heads;
  ASSIGN_OR_RETURN(std::optional<int> kv,
                   PositiveInt(c, "num_key_value_heads", ""));
  if (kv.has_value()) {
    g.kv_heads = *kv;
  } else {
    g.kv_heads = heads;
    out.notes.push_back(absl::StrCat(
        "num_key_value_heads absent: assumed multi-head attention (kv_heads = "
        "num_attention_heads = ",
        heads, ")"));
  }
  ASSIGN_OR_RETURN(std::optional<int> head_dim, PositiveInt(c, "head_dim", ""));
  if (head_dim.has_value()) {
    g.head_dim = *head_dim;
  } else {
    ASSIGN_OR_RETURN(const int hidden, RequiredInt(c, "hidden_size"));
    if (hidden % heads != 0) {
      return Invalid(absl::StrCat("hidden_size ", hidden,
                                  " is not divisible by num_attention_heads ",
                                  heads, " and head_dim is absent"));
    }
    g.head_dim = hidden / heads;
  }
  ASSIGN_OR_RETURN(std::optional<int> max_pos,
                   PositiveInt(c, "max_position_embeddings", ""));
  out.max_position_embeddings = max_pos.value_or(0);
  return absl::OkStatus();
}

void ReadDtype(const Struct& c, ModelSpecFromHf& out) {
  std::optional<std::string> dtype = String(c, "torch_dtype");
  if (!dtype.has_value()) dtype = String(c, "dtype");
  if (!dtype.has_value()) return;
  absl::StatusOr<KvDtype> parsed = ParseKvDtype(*dtype);
  if (parsed.ok()) {
    out.torch_dtype = *parsed;
  } else {
    out.notes.push_back(
        absl::StrCat("torch_dtype \"", *dtype, "\" not recognized; ignored"));
  }
}

// Copies a number field into *dst if present.
absl::Status OptionalDouble(const Struct& s, const std::string& name,
                            absl::string_view where, double* dst) {
  absl::StatusOr<std::optional<double>> v = Number(s, name, where);
  if (!v.ok()) return v.status();
  if (v->has_value()) *dst = **v;
  return absl::OkStatus();
}

absl::Status RequireDouble(const Struct& s, const std::string& name,
                           absl::string_view where, absl::string_view type,
                           double* dst) {
  absl::StatusOr<std::optional<double>> v = Number(s, name, where);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return Invalid(
        absl::StrCat(where, name, " is required for rope type ", type));
  }
  *dst = **v;
  return absl::OkStatus();
}

// original_max_position_embeddings of the scaling block, else of config
// `c` (Phi-3 keeps it at the top level); nullopt if neither has it.
absl::StatusOr<std::optional<int>> OriginalMaxPosition(
    const Struct& c, const Struct& block, absl::string_view where) {
  ASSIGN_OR_RETURN(
      std::optional<int> original,
      PositiveInt(block, "original_max_position_embeddings", where));
  if (original.has_value()) return original;
  return PositiveInt(c, "original_max_position_embeddings", "");
}

// The numbers rope.scaling reads from the scaling block. `has_original`:
// whether the config gave original_max_position_embeddings.
absl::Status ReadScalingFactors(const Struct& block, absl::string_view where,
                                bool has_original,
                                int64_t max_position_embeddings,
                                RopeConfig& rope) {
  const std::string type_name(RopeScalingName(rope.scaling));
  switch (rope.scaling) {
    case RopeScaling::kLinear:
    case RopeScaling::kDynamicNtk:
    case RopeScaling::kYarn:
      RETURN_IF_ERROR(
          RequireDouble(block, "factor", where, type_name, &rope.factor));
      if (rope.scaling != RopeScaling::kYarn) break;
      RETURN_IF_ERROR(
          OptionalDouble(block, "beta_fast", where, &rope.beta_fast));
      return OptionalDouble(block, "beta_slow", where, &rope.beta_slow);
    case RopeScaling::kLlama3:
      for (auto [name, dst] :
           {std::pair<const char*, double*>{"factor", &rope.factor},
            {"low_freq_factor", &rope.low_freq_factor},
            {"high_freq_factor", &rope.high_freq_factor}}) {
        RETURN_IF_ERROR(RequireDouble(block, name, where, type_name, dst));
      }
      if (!has_original) {
        return Invalid(absl::StrCat(
            where,
            "original_max_position_embeddings is required for rope "
            "type llama3"));
      }
      break;
    case RopeScaling::kLongRope:
      // The per-dimension factor lists are not modelled: LongRoPE is never
      // shifted. factor, when absent, is the context extension ratio.
      rope.factor = rope.original_max_position > 0
                        ? static_cast<double>(max_position_embeddings) /
                              rope.original_max_position
                        : 1.0;
      return OptionalDouble(block, "factor", where, &rope.factor);
    case RopeScaling::kNone:
      break;
  }
  return absl::OkStatus();
}

// Reads the scaling block: rope_scaling (or rope_parameters in newer
// configs) of config `c`.
absl::Status ReadScaling(const Struct& c, const Struct& block,
                         absl::string_view where, ModelSpecFromHf& out) {
  RopeConfig& rope = out.rope;
  std::optional<std::string> type = String(block, "rope_type");
  if (!type.has_value()) type = String(block, "type");
  absl::StatusOr<RopeScaling> scaling = ParseRopeScaling(type.value_or(""));
  if (!scaling.ok()) {
    return Invalid(absl::StrCat(where, "type \"", *type,
                                "\" is not supported; expected default, "
                                "linear, dynamic, llama3, yarn or longrope"));
  }
  rope.scaling = *scaling;
  if (rope.scaling == RopeScaling::kNone) return absl::OkStatus();

  ASSIGN_OR_RETURN(const std::optional<int> original,
                   OriginalMaxPosition(c, block, where));
  if (original.has_value()) {
    rope.original_max_position = *original;
  } else if (rope.scaling == RopeScaling::kYarn ||
             rope.scaling == RopeScaling::kLongRope) {
    rope.original_max_position = static_cast<int>(out.max_position_embeddings);
  }
  return ReadScalingFactors(block, where, original.has_value(),
                            out.max_position_embeddings, rope);
}

absl::Status ReadRope(const Struct& c, ModelSpecFromHf& out) {
  RopeConfig& rope = out.rope;
  const Struct* params = Object(c, "rope_parameters");
  const Struct& theta_source =
      params != nullptr && Field(*params, "rope_theta") != nullptr ? *params
                                                                   : c;
  absl::StatusOr<std::optional<double>> theta =
      Number(theta_source, "rope_theta", "");
  if (!theta.ok()) return theta.status();
  const bool gemma3 = String(c, "model_type").value_or("") == "gemma3_text";
  if (theta->has_value()) {
    rope.theta = **theta;
  } else if (gemma3) {
    rope.theta = 1000000.0;
    out.notes.push_back(
        "rope_theta absent: Gemma3TextConfig's default 1000000");
  } else {
    rope.theta = 10000.0;
    out.notes.push_back("rope_theta absent: assumed 10000");
  }
  // GPT-J, and MLA's rope part (DeepSeek's code and vLLM rotate it
  // interleaved unless the config says rope_interleave false).
  if (String(c, "model_type").value_or("") == "gptj" ||
      (out.geometry.kv_lora_rank > 0 &&
       Bool(c, "rope_interleave").value_or(true))) {
    rope.layout = RopeLayout::kGptj;
  }
  absl::StatusOr<std::optional<double>> local =
      Number(c, "rope_local_base_freq", "");
  if (!local.ok()) return local.status();
  if (!local->has_value() && gemma3) *local = 10000.0;  // its default
  if (local->has_value() && **local != rope.theta) {
    out.notes.push_back(absl::StrCat(
        "rope_local_base_freq ", **local,
        ": the sliding layers rotate with it, the RoPE settings describe the "
        "others (theta ",
        rope.theta, "); keep rope.shift DENY"));
  }
  if (const Struct* scaling = Object(c, "rope_scaling")) {
    RETURN_IF_ERROR(ReadScaling(c, *scaling, "rope_scaling.", out));
  } else if (params != nullptr) {
    RETURN_IF_ERROR(ReadScaling(c, *params, "rope_parameters.", out));
  }
  return absl::OkStatus();
}

absl::Status ReadRotaryDim(const Struct& c, ModelSpecFromHf& out) {
  const int head_dim = out.geometry.head_dim;
  absl::StatusOr<std::optional<int>> rotary_dim =
      PositiveInt(c, "rotary_dim", "");
  if (!rotary_dim.ok()) return rotary_dim.status();
  if (rotary_dim->has_value()) {
    out.rope.rotary_dim = **rotary_dim == head_dim ? 0 : **rotary_dim;
    return absl::OkStatus();
  }
  for (const char* name : {"partial_rotary_factor", "rotary_pct"}) {
    absl::StatusOr<std::optional<double>> factor = Number(c, name, "");
    if (!factor.ok()) return factor.status();
    if (!factor->has_value()) continue;
    if (!(**factor > 0) || **factor > 1) {
      return Invalid(absl::StrCat(name, " must be in (0, 1], got ", **factor));
    }
    const int dim = static_cast<int>(head_dim * **factor);
    out.rope.rotary_dim = dim == head_dim ? 0 : dim;
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpecFromHf> ParseHfConfig(absl::string_view json_text) {
  Struct root;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json_text.data(), json_text.size()), &root,
      options);
  if (!parsed.ok()) {
    return Invalid(absl::StrCat("not a JSON object: ", parsed.ToString()));
  }
  ModelSpecFromHf out;
  const Struct* config = &root;
  if (Field(root, "num_hidden_layers") == nullptr) {
    if (const Struct* text = Object(root, "text_config")) {
      config = text;
      out.notes.push_back("read the language model from text_config");
    }
  }
  RETURN_IF_ERROR(ReadGeometry(*config, out));
  RETURN_IF_ERROR(ReadMla(*config, out));
  ReadDtype(*config, out);
  if (!out.torch_dtype.has_value() && config != &root) ReadDtype(root, out);
  RETURN_IF_ERROR(ReadLayerKinds(*config, out));
  RETURN_IF_ERROR(ReadRope(*config, out));
  RETURN_IF_ERROR(ReadRotaryDim(*config, out));
  return out;
}

absl::StatusOr<ModelSpecFromHf> ReadHfConfig(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path));
  }
  std::ostringstream text;
  text << file.rdbuf();
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(text.str());
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace prefixd
