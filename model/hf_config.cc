#include "model/hf_config.h"

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
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "model/kv_geometry.h"
#include "model/status_macros.h"

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
  const std::string type_name(RopeScalingName(rope.scaling));

  absl::StatusOr<std::optional<int>> original =
      PositiveInt(block, "original_max_position_embeddings", where);
  if (!original.ok()) return original.status();
  if (!original->has_value()) {
    // Phi-3 keeps it at the top level.
    original = PositiveInt(c, "original_max_position_embeddings", "");
    if (!original.ok()) return original.status();
  }
  if (original->has_value()) {
    rope.original_max_position = **original;
  } else if (rope.scaling == RopeScaling::kYarn ||
             rope.scaling == RopeScaling::kLongRope) {
    rope.original_max_position = static_cast<int>(out.max_position_embeddings);
  }

  switch (rope.scaling) {
    case RopeScaling::kLinear:
    case RopeScaling::kDynamicNtk:
    case RopeScaling::kYarn:
      if (absl::Status s =
              RequireDouble(block, "factor", where, type_name, &rope.factor);
          !s.ok()) {
        return s;
      }
      if (rope.scaling != RopeScaling::kYarn) break;
      if (absl::Status s =
              OptionalDouble(block, "beta_fast", where, &rope.beta_fast);
          !s.ok()) {
        return s;
      }
      return OptionalDouble(block, "beta_slow", where, &rope.beta_slow);
    case RopeScaling::kLlama3:
      for (auto [name, dst] :
           {std::pair<const char*, double*>{"factor", &rope.factor},
            {"low_freq_factor", &rope.low_freq_factor},
            {"high_freq_factor", &rope.high_freq_factor}}) {
        if (absl::Status s = RequireDouble(block, name, where, type_name, dst);
            !s.ok()) {
          return s;
        }
      }
      if (!original->has_value()) {
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
                        ? static_cast<double>(out.max_position_embeddings) /
                              rope.original_max_position
                        : 1.0;
      return OptionalDouble(block, "factor", where, &rope.factor);
    case RopeScaling::kNone:
      break;
  }
  return absl::OkStatus();
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
  if (theta->has_value()) {
    rope.theta = **theta;
  } else {
    rope.theta = 10000.0;
    out.notes.push_back("rope_theta absent: assumed 10000");
  }
  if (String(c, "model_type").value_or("") == "gptj") {
    rope.layout = RopeLayout::kGptj;
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
  ReadDtype(*config, out);
  if (!out.torch_dtype.has_value() && config != &root) ReadDtype(root, out);
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
