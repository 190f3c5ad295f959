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
//   kv_lora_rank, qk_rope_head_dim (MLA)   -> geometry.kv_lora_rank, head_dim
//       = qk_rope_head_dim, kv_heads 1, rope.layout gptj (unless
//       rope_interleave is false)
//   sliding_window (unless use_sliding_window is false) and which layers
//       use it: layer_types, Gemma 2's every other layer,
//       sliding_window_pattern (Gemma 3; default 6 for gemma3_text),
//       max_window_layers (Qwen2), else every layer (Mistral-7B-v0.1)
//                                          -> geometry.sliding_*
//   layer_types, full_attention_interval (Qwen3-Next), attn_layer_period/
//       attn_layer_offset (Jamba)          -> layers = the attention layers,
//       state_layers = the others, sized from linear_* (Gated DeltaNet) or
//       mamba_* fields in the weights' dtype
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
// num_attention_heads, rope_scaling names a type we do not know, a field
// needed to size MLA or a state layer is missing, or the layer layout is one
// we cannot size (a layer_types entry we do not know, hybrid_override_pattern,
// attn_layer_indices, layers_block_type, mamba_d_ssm); the message names the
// field and value.
absl::StatusOr<ModelSpecFromHf> ParseHfConfig(absl::string_view json_text);

// Reads the file and parses it. NOT_FOUND if it cannot be read; parse
// errors are prefixed with the path.
absl::StatusOr<ModelSpecFromHf> ReadHfConfig(const std::string& path);

}  // namespace prefixd

#endif  // PREFIXD_MODEL_HF_CONFIG_H_
