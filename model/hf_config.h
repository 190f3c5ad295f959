// Reads the model geometry and RoPE settings from a Hugging Face
// config.json, for `prefixctl plan --hf_config` and the daemon's
// `model { hf_config_path: ... }`.
//
// Fields read (all others are ignored):
//   num_hidden_layers                      -> geometry.layers
//   num_attention_heads                    -> geometry.attention_heads
//   num_key_value_heads                    -> geometry.kv_heads; when absent
//       (older multi-head models) num_attention_heads is used and a note
//       says that multi-head attention was assumed
//   head_dim, else hidden_size / num_attention_heads -> geometry.head_dim
//   torch_dtype (or dtype)                 -> torch_dtype
//   rope_theta (default 10000, with a note) -> rope.theta
//   rope_scaling {type | rope_type, factor, low_freq_factor,
//       high_freq_factor, original_max_position_embeddings, beta_fast,
//       beta_slow}                         -> rope
//   partial_rotary_factor (or rotary_pct)  -> rope.rotary_dim =
//       int(head_dim * factor), as Hugging Face truncates it
//   rotary_dim (GPT-J)                     -> rope.rotary_dim
//   model_type "gptj"                      -> rope.layout gptj
// Newer configs that group RoPE under "rope_parameters" are read the same
// way, and multimodal configs whose language model sits under
// "text_config" are read from there (with a note).
//
// Layout: Hugging Face checkpoints rotate with rotate_half (neox) except
// GPT-J; an engine that loads Meta's original weights rotates interleaved
// pairs (gptj) and must configure that explicitly.
//
// For YaRN without original_max_position_embeddings, max_position_embeddings
// is used, as Hugging Face does.
//
// Thread safety: pure functions.
#ifndef PREFIXD_MODEL_HF_CONFIG_H_
#define PREFIXD_MODEL_HF_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/kv_geometry.h"

namespace prefixd {

struct ModelSpecFromHf {
  ModelGeometry geometry;  // name = model_type, or "" if absent
  RopeConfig rope;
  // The weights' dtype (torch_dtype), if present and one we know. Engines
  // usually store KV in it unless KV quantization is configured.
  std::optional<KvDtype> torch_dtype;
  int64_t max_position_embeddings = 0;  // 0 if absent
  // Assumptions made while reading, for the user to see, e.g.
  // "num_key_value_heads absent: assumed multi-head attention (kv_heads =
  // num_attention_heads = 32)".
  std::vector<std::string> notes;
};

// INVALID_ARGUMENT when the text is not a JSON object, a required field is
// missing or not a positive integer, hidden_size is not divisible by
// num_attention_heads, or rope_scaling names a type we do not know (the
// message names the field and value).
absl::StatusOr<ModelSpecFromHf> ParseHfConfig(absl::string_view json_text);

// Reads the file and parses it. NOT_FOUND if it cannot be read; parse
// errors are prefixed with the path.
absl::StatusOr<ModelSpecFromHf> ReadHfConfig(const std::string& path);

}  // namespace prefixd

#endif  // PREFIXD_MODEL_HF_CONFIG_H_
