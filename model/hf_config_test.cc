#include "model/hf_config.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kv_geometry.h"

namespace prefixd {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// meta-llama/Llama-3.1-8B's config.json, as published.
constexpr char kLlama31_8b[] = R"json({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})json";

TEST(HfConfigTest, Llama31MatchesThePreset) {
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(kLlama31_8b);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModelPreset preset = *FindPreset("llama-3-8b");
  EXPECT_EQ(spec->geometry.layers, 32);
  EXPECT_EQ(spec->geometry.kv_heads, 8);
  EXPECT_EQ(spec->geometry.head_dim, 128);
  EXPECT_EQ(spec->geometry.attention_heads, 32);
  EXPECT_EQ(spec->geometry.name, "llama");
  EXPECT_EQ(spec->torch_dtype, KvDtype::kBf16);
  EXPECT_EQ(spec->max_position_embeddings, 131072);
  EXPECT_THAT(spec->notes, IsEmpty());
  ModelSpec from_hf;
  from_hf.geometry = spec->geometry;
  from_hf.rope = spec->rope;
  ModelSpec from_preset;
  from_preset.geometry = preset.geometry;
  from_preset.rope = preset.rope;
  EXPECT_EQ(FingerprintText(from_hf), FingerprintText(from_preset));
  EXPECT_EQ(*BytesPerToken(from_hf.geometry, KvDtype::kFp16), 131072u);
}

TEST(HfConfigTest, WithoutNumKeyValueHeadsAssumesMultiHeadAttention) {
  // An older Llama-1-style config: no num_key_value_heads, no head_dim,
  // no rope_theta.
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(R"json({
    "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
    "num_hidden_layers": 32, "max_position_embeddings": 2048,
    "torch_dtype": "float16"
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->geometry.kv_heads, 32);
  EXPECT_EQ(spec->geometry.head_dim, 128);
  EXPECT_EQ(spec->torch_dtype, KvDtype::kFp16);
  EXPECT_EQ(spec->rope.theta, 10000.0);
  EXPECT_EQ(spec->rope.scaling, RopeScaling::kNone);
  EXPECT_THAT(spec->notes,
              ElementsAre(HasSubstr("assumed multi-head attention (kv_heads = "
                                    "num_attention_heads = 32)"),
                          HasSubstr("rope_theta absent")));
  // Multi-head attention costs 4x the GQA-8 figure.
  EXPECT_EQ(*BytesPerToken(spec->geometry, KvDtype::kFp16), 524288u);
}

TEST(HfConfigTest, Gemma2UsesHeadDimNotHiddenOverHeads) {
  // google/gemma-2-9b: hidden_size 3584 / 16 heads would be 224.
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(R"json({
    "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584,
    "num_attention_heads": 16, "num_hidden_layers": 42,
    "num_key_value_heads": 8, "rope_theta": 10000.0,
    "sliding_window": 4096, "torch_dtype": "float32",
    "max_position_embeddings": 8192, "query_pre_attn_scalar": 256
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->geometry.head_dim, 256);
  EXPECT_EQ(spec->torch_dtype, KvDtype::kFp32);
  const ModelPreset preset = *FindPreset("gemma-2-9b");
  EXPECT_EQ(spec->geometry.layers, preset.geometry.layers);
  EXPECT_EQ(spec->geometry.kv_heads, preset.geometry.kv_heads);
  EXPECT_EQ(spec->rope.theta, preset.rope.theta);
}

TEST(HfConfigTest, YarnWithDefaults) {
  // Qwen2.5's documented YaRN addition; beta_fast/beta_slow default to 32/1.
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(R"json({
    "model_type": "qwen2", "hidden_size": 5120, "num_attention_heads": 40,
    "num_hidden_layers": 64, "num_key_value_heads": 8,
    "rope_theta": 1000000.0, "max_position_embeddings": 32768,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768,
                     "type": "yarn"}
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->geometry.head_dim, 128);
  EXPECT_EQ(spec->rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(spec->rope.factor, 4.0);
  EXPECT_EQ(spec->rope.original_max_position, 32768);
  EXPECT_EQ(spec->rope.beta_fast, 32.0);
  EXPECT_EQ(spec->rope.beta_slow, 1.0);

  // Without original_max_position_embeddings, max_position_embeddings.
  spec = ParseHfConfig(R"json({
    "hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 2,
    "max_position_embeddings": 4096,
    "rope_scaling": {"factor": 2, "rope_type": "yarn", "beta_fast": 16}
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rope.original_max_position, 4096);
  EXPECT_EQ(spec->rope.beta_fast, 16.0);
}

TEST(HfConfigTest, LinearDynamicAndLongRope) {
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(R"json({
    "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "rope_scaling": {"type": "linear", "factor": 2}
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rope.scaling, RopeScaling::kLinear);
  EXPECT_EQ(spec->rope.factor, 2.0);

  spec = ParseHfConfig(R"json({
    "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
    "rope_scaling": {"type": "dynamic", "factor": 4}
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rope.scaling, RopeScaling::kDynamicNtk);
  ModelSpec model;
  model.geometry = spec->geometry;
  model.rope = spec->rope;
  model.shift_allow = true;
  EXPECT_THAT(ValidateRope(model).message(), HasSubstr("dynamic"));

  // Phi-3-style LongRoPE: per-dimension factor lists, original at top level.
  spec = ParseHfConfig(R"json({
    "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0, 1.1],
                     "short_factor": [1.0, 1.0]}
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rope.scaling, RopeScaling::kLongRope);
  EXPECT_EQ(spec->rope.original_max_position, 4096);
  EXPECT_EQ(spec->rope.factor, 32.0);
}

TEST(HfConfigTest, PartialRotaryAndGptj) {
  // phi-2: head_dim 2560 / 32 = 80, partial_rotary_factor 0.4 -> 32.
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(R"json({
    "model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
    "num_hidden_layers": 32, "partial_rotary_factor": 0.4
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->geometry.head_dim, 80);
  EXPECT_EQ(spec->rope.rotary_dim, 32);

  // GPT-J: interleaved pairs, rotary_dim 64 of head_dim 256.
  spec = ParseHfConfig(R"json({
    "model_type": "gptj", "n_embd": 4096, "hidden_size": 4096,
    "num_attention_heads": 16, "num_hidden_layers": 28, "rotary_dim": 64
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rope.layout, RopeLayout::kGptj);
  EXPECT_EQ(spec->rope.rotary_dim, 64);
}

TEST(HfConfigTest, TextConfigAndRopeParameters) {
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(R"json({
    "model_type": "llava", "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 4096, "num_attention_heads": 32,
                    "num_hidden_layers": 32, "num_key_value_heads": 8,
                    "rope_parameters": {"rope_theta": 500000.0,
                                        "rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192}}
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->geometry.layers, 32);
  EXPECT_EQ(spec->torch_dtype, KvDtype::kBf16);
  EXPECT_EQ(spec->rope.theta, 500000.0);
  EXPECT_EQ(spec->rope.scaling, RopeScaling::kLlama3);
  EXPECT_EQ(spec->rope.original_max_position, 8192);
  EXPECT_THAT(spec->notes, ElementsAre(HasSubstr("text_config")));
}

TEST(HfConfigTest, NullFieldsCountAsAbsent) {
  absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(R"json({
    "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "head_dim": null, "rope_scaling": null,
    "rope_theta": 1000000.0
  })json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->geometry.head_dim, 128);
  EXPECT_EQ(spec->rope.scaling, RopeScaling::kNone);
}

TEST(HfConfigTest, RefusesBrokenConfigs) {
  struct Case {
    const char* json;
    const char* message;
  };
  for (const Case& c : {
           Case{"not json", "not a JSON object"},
           Case{"[1, 2]", "not a JSON object"},
           Case{R"({"num_attention_heads": 32, "hidden_size": 4096})",
                "num_hidden_layers is missing"},
           Case{R"({"num_hidden_layers": 32.5, "num_attention_heads": 32,
                    "hidden_size": 4096})",
                "num_hidden_layers must be a positive integer, got 32.5"},
           Case{R"({"num_hidden_layers": "32", "num_attention_heads": 32,
                    "hidden_size": 4096})",
                "num_hidden_layers must be a number"},
           Case{R"({"num_hidden_layers": 32, "num_attention_heads": 3,
                    "hidden_size": 4096})",
                "hidden_size 4096 is not divisible by num_attention_heads 3"},
           Case{R"({"num_hidden_layers": 32, "num_attention_heads": 32})",
                "hidden_size is missing"},
           Case{R"({"num_hidden_layers": 32, "num_attention_heads": 32,
                    "hidden_size": 4096,
                    "rope_scaling": {"type": "mrope", "factor": 2}})",
                "rope_scaling.type \"mrope\" is not supported"},
           Case{R"({"num_hidden_layers": 32, "num_attention_heads": 32,
                    "hidden_size": 4096,
                    "rope_scaling": {"rope_type": "llama3", "factor": 8}})",
                "rope_scaling.low_freq_factor is required for rope type "
                "llama3"},
           Case{R"({"num_hidden_layers": 32, "num_attention_heads": 32,
                    "hidden_size": 4096,
                    "rope_scaling": {"type": "linear"}})",
                "rope_scaling.factor is required"},
       }) {
    absl::StatusOr<ModelSpecFromHf> spec = ParseHfConfig(c.json);
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message)) << c.json;
  }
}

// A published config.json from tests/data/hf_configs.
ModelSpecFromHf Published(const std::string& name) {
  absl::StatusOr<ModelSpecFromHf> spec = ReadHfConfig(
      std::string(PREFIXD_SOURCE_DIR) + "/tests/data/hf_configs/" + name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.value_or(ModelSpecFromHf());
}

// The config.json and the preset it documents give the same fingerprint.
void ExpectMatchesPreset(const ModelSpecFromHf& hf, const std::string& name) {
  const ModelPreset preset = *FindPreset(name);
  ModelSpec from_hf, from_preset;
  from_hf.geometry = hf.geometry;
  from_hf.rope = hf.rope;
  from_preset.geometry = preset.geometry;
  from_preset.rope = preset.rope;
  EXPECT_EQ(FingerprintText(from_hf), FingerprintText(from_preset)) << name;
  EXPECT_EQ(hf.geometry.sliding_window, preset.geometry.sliding_window);
  EXPECT_EQ(hf.geometry.sliding_layers, preset.geometry.sliding_layers);
}

TEST(HfConfigTest, DeepSeekV3IsLatentAttention) {
  const ModelSpecFromHf spec = Published("deepseek-v3.json");
  EXPECT_EQ(spec.geometry.layers, 61);
  EXPECT_EQ(spec.geometry.kv_lora_rank, 512);
  EXPECT_EQ(spec.geometry.head_dim, 64);
  EXPECT_EQ(spec.geometry.kv_heads, 1);
  EXPECT_EQ(spec.geometry.attention_heads, 128);
  EXPECT_EQ(*BytesPerToken(spec.geometry, KvDtype::kBf16), 70272u);
  EXPECT_EQ(spec.rope.scaling, RopeScaling::kYarn);
  EXPECT_EQ(spec.rope.factor, 40.0);
  EXPECT_EQ(spec.rope.layout, RopeLayout::kGptj);
  EXPECT_THAT(spec.notes, Contains(HasSubstr("num_nextn_predict_layers 1")));
  ExpectMatchesPreset(spec, "deepseek-v3");
}

TEST(HfConfigTest, SlidingWindowLayers) {
  const ModelSpecFromHf gemma2 = Published("gemma-2-9b.json");
  EXPECT_EQ(gemma2.geometry.layers, 42);
  EXPECT_EQ(gemma2.geometry.sliding_layers, 21);  // layers 0, 2, ..., 40
  EXPECT_EQ(gemma2.geometry.sliding_window, 4096);
  ExpectMatchesPreset(gemma2, "gemma-2-9b");

  // text_config; sliding_window_pattern and rope_theta are Gemma3TextConfig's
  // defaults (6 and 1000000), not in the file.
  const ModelSpecFromHf gemma3 = Published("gemma-3-27b-it.json");
  EXPECT_EQ(gemma3.geometry.layers, 62);
  EXPECT_EQ(gemma3.geometry.sliding_layers, 52);
  EXPECT_EQ(gemma3.geometry.sliding_window, 1024);
  EXPECT_EQ(gemma3.rope.theta, 1000000.0);
  EXPECT_EQ(gemma3.rope.scaling, RopeScaling::kLinear);
  EXPECT_THAT(gemma3.notes, Contains(HasSubstr("rope_local_base_freq 10000")));
  ExpectMatchesPreset(gemma3, "gemma-3-27b");

  const ModelSpecFromHf mistral = Published("mistral-7b-v0.1.json");
  EXPECT_EQ(mistral.geometry.sliding_layers, 32);
  EXPECT_EQ(mistral.geometry.sliding_window, 4096);

  // Qwen2-style: a window that use_sliding_window turns off.
  absl::StatusOr<ModelSpecFromHf> off = ParseHfConfig(R"json({
    "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "hidden_size": 3584, "sliding_window": 131072,
    "use_sliding_window": false, "max_window_layers": 28})json");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->geometry.sliding_layers, 0);
}

TEST(HfConfigTest, HybridModelsHoldKvOnlyInAttentionLayers) {
  const ModelSpecFromHf qwen = Published("qwen3-next-80b-a3b-instruct.json");
  EXPECT_EQ(qwen.geometry.layers, 12);
  EXPECT_EQ(qwen.geometry.state_layers, 36);
  EXPECT_EQ(qwen.geometry.state_bytes_per_layer, 1097728u);
  EXPECT_EQ(qwen.rope.rotary_dim, 64);
  EXPECT_EQ(*BytesPerToken(qwen.geometry, KvDtype::kBf16), 24576u);
  ExpectMatchesPreset(qwen, "qwen3-next-80b-a3b");

  const ModelSpecFromHf jamba = Published("jamba-v0.1.json");
  EXPECT_EQ(jamba.geometry.layers, 4);  // 4, 12, 20, 28
  EXPECT_EQ(jamba.geometry.state_layers, 28);
  EXPECT_EQ(jamba.geometry.state_bytes_per_layer, 311296u);
  ExpectMatchesPreset(jamba, "jamba-v0.1");

  absl::StatusOr<ModelSpecFromHf> typed = ParseHfConfig(R"json({
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 64, "sliding_window": 512,
    "layer_types": ["sliding_attention", "linear_attention",
                    "linear_attention", "full_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4})json");
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->geometry.layers, 2);
  EXPECT_EQ(typed->geometry.sliding_layers, 1);
  EXPECT_EQ(typed->geometry.state_layers, 2);
  // conv (2 x 2 x 16 + 4 x 32) x 3 + 4 x 16 x 32 = 576 + 2048 values x 2 B.
  EXPECT_EQ(typed->geometry.state_bytes_per_layer, 5248u);
}

TEST(HfConfigTest, ReadsFiles) {
  const std::string path =
      ::testing::TempDir() + "/prefixd_hf_config_test.json";
  {
    std::ofstream file(path);
    file << kLlama31_8b;
  }
  absl::StatusOr<ModelSpecFromHf> spec = ReadHfConfig(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->geometry.layers, 32);
  std::remove(path.c_str());
  absl::StatusOr<ModelSpecFromHf> missing = ReadHfConfig(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(path));
}

}  // namespace
}  // namespace prefixd
