#include "model/kv_geometry.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

ModelGeometry Geometry(int layers, int kv_heads, int head_dim) {
  ModelGeometry g;
  g.layers = layers;
  g.kv_heads = kv_heads;
  g.head_dim = head_dim;
  return g;
}

ModelSpec PresetSpec(const std::string& name) {
  absl::StatusOr<ModelPreset> preset = FindPreset(name);
  EXPECT_TRUE(preset.ok()) << preset.status();
  ModelSpec spec;
  spec.geometry = preset->geometry;
  spec.rope = preset->rope;
  return spec;
}

TEST(KvGeometryTest, Llama3BytesPerTokenMatchTheDesign) {
  EXPECT_EQ(*BytesPerToken(Geometry(32, 8, 128), KvDtype::kFp16), 131072u);
  EXPECT_EQ(*BytesPerToken(Geometry(80, 8, 128), KvDtype::kFp16), 327680u);
  EXPECT_EQ(*BytesPerToken(PresetSpec("llama-3-8b")), 131072u);
  EXPECT_EQ(*BytesPerToken(PresetSpec("llama-3-70b")), 327680u);
}

TEST(KvGeometryTest, DtypeSizes) {
  const ModelGeometry g = Geometry(32, 8, 128);
  EXPECT_EQ(*BytesPerToken(g, KvDtype::kFp32), 262144u);
  EXPECT_EQ(*BytesPerToken(g, KvDtype::kBf16), 131072u);
  EXPECT_EQ(*BytesPerToken(g, KvDtype::kFp8), 65536u);
  EXPECT_EQ(*BytesPerToken(g, KvDtype::kInt8), 65536u);
  EXPECT_EQ(*BytesPerToken(g, KvDtype::kInt4), 32768u);
}

TEST(KvGeometryTest, Int4HalvesInt8) {
  for (const ModelGeometry& g :
       {Geometry(1, 1, 1), Geometry(3, 1, 5), Geometry(42, 8, 256),
        Geometry(80, 8, 128), Geometry(7, 3, 9)}) {
    const uint64_t int8 = *BytesPerToken(g, KvDtype::kInt8);
    const uint64_t int4 = *BytesPerToken(g, KvDtype::kInt4);
    EXPECT_EQ(int4 * 2, int8)
        << g.layers << "x" << g.kv_heads << "x" << g.head_dim;
  }
  // K and V together make even the smallest int4 geometry a whole byte.
  EXPECT_EQ(*BytesPerToken(Geometry(1, 1, 1), KvDtype::kInt4), 1u);
}

TEST(KvGeometryTest, RefusesNonPositiveAndOverflowingGeometry) {
  absl::StatusOr<uint64_t> zero =
      BytesPerToken(Geometry(0, 8, 128), KvDtype::kFp16);
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("layers 0"));
  EXPECT_FALSE(BytesPerToken(Geometry(32, -1, 128), KvDtype::kFp16).ok());
  absl::StatusOr<uint64_t> huge = BytesPerToken(
      Geometry(2000000000, 2000000000, 2000000000), KvDtype::kFp32);
  EXPECT_THAT(huge.status().message(), HasSubstr("overflows"));
}

TEST(KvGeometryTest, BlockBytesAndBudgetBlocksFloor) {
  EXPECT_EQ(*BlockBytes(131072, 16), 2097152u);
  EXPECT_EQ(*BlockBytes(PresetSpec("llama-3-70b")), 5242880u);
  EXPECT_FALSE(BlockBytes(131072, 0).ok());
  EXPECT_FALSE(BlockBytes(UINT64_MAX / 2, 16).ok());
  // 4 GiB of Llama-3-8B fp16 in 16-token blocks: exactly 2048 blocks.
  EXPECT_EQ(BudgetBlocks(4ULL << 30, 2097152), 2048u);
  EXPECT_EQ(BudgetBlocks((4ULL << 30) - 1, 2097152), 2047u);
  EXPECT_EQ(BudgetBlocks(160000000000ULL, 5242880), 30517u);
  EXPECT_EQ(BudgetBlocks(0, 5242880), 0u);
}

TEST(KvGeometryTest, ParsesDtypeNames) {
  EXPECT_EQ(*ParseKvDtype("fp16"), KvDtype::kFp16);
  EXPECT_EQ(*ParseKvDtype("BF16"), KvDtype::kBf16);
  EXPECT_EQ(*ParseKvDtype("bfloat16"), KvDtype::kBf16);
  EXPECT_EQ(*ParseKvDtype("float32"), KvDtype::kFp32);
  EXPECT_EQ(*ParseKvDtype("float8_e4m3fn"), KvDtype::kFp8);
  EXPECT_EQ(*ParseKvDtype("int4"), KvDtype::kInt4);
  absl::StatusOr<KvDtype> bad = ParseKvDtype("fp12");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"fp12\""));
  for (KvDtype d : {KvDtype::kFp32, KvDtype::kFp16, KvDtype::kBf16,
                    KvDtype::kFp8, KvDtype::kInt8, KvDtype::kInt4}) {
    EXPECT_EQ(*ParseKvDtype(KvDtypeName(d)), d);
  }
  EXPECT_EQ(KvDtypeName(KvDtype::kBf16), "bf16");
}

TEST(KvGeometryTest, PresetsFollowPublishedConfigs) {
  const ModelSpec l8 = PresetSpec("llama-3-8b");
  EXPECT_EQ(l8.geometry.layers, 32);
  EXPECT_EQ(l8.geometry.kv_heads, 8);
  EXPECT_EQ(l8.geometry.head_dim, 128);
  EXPECT_EQ(l8.geometry.attention_heads, 32);
  EXPECT_EQ(l8.rope.theta, 500000.0);
  EXPECT_EQ(l8.rope.scaling, RopeScaling::kLlama3);
  EXPECT_EQ(l8.rope.factor, 8.0);
  EXPECT_EQ(l8.rope.low_freq_factor, 1.0);
  EXPECT_EQ(l8.rope.high_freq_factor, 4.0);
  EXPECT_EQ(l8.rope.original_max_position, 8192);

  const ModelSpec l70 = PresetSpec("Llama-3-70B");
  EXPECT_EQ(l70.geometry.layers, 80);
  EXPECT_EQ(l70.geometry.attention_heads, 64);
  EXPECT_EQ(l70.rope.scaling, RopeScaling::kLlama3);

  const ModelSpec mistral = PresetSpec("mistral-7b");
  EXPECT_EQ(mistral.geometry.layers, 32);
  EXPECT_EQ(mistral.geometry.kv_heads, 8);
  EXPECT_EQ(mistral.geometry.head_dim, 128);
  EXPECT_EQ(mistral.rope.theta, 1e6);
  EXPECT_EQ(mistral.rope.scaling, RopeScaling::kNone);
  EXPECT_EQ(*BytesPerToken(mistral), 131072u);

  const ModelSpec gemma = PresetSpec("gemma-2-9b");
  EXPECT_EQ(gemma.geometry.layers, 42);
  EXPECT_EQ(gemma.geometry.kv_heads, 8);
  EXPECT_EQ(gemma.geometry.head_dim, 256);
  EXPECT_EQ(gemma.geometry.attention_heads, 16);
  EXPECT_EQ(gemma.rope.theta, 10000.0);
  EXPECT_EQ(*BytesPerToken(gemma), 2u * 42 * 8 * 256 * 2);  // 344064

  for (const std::string& name : PresetNames()) {
    EXPECT_TRUE(ValidateModelSpec(PresetSpec(name)).ok()) << name;
  }
  absl::StatusOr<ModelPreset> unknown = FindPreset("llama-2-7b");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("gemma-2-9b"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("deepseek-v3"));
}

TEST(KvGeometryTest, LatentAttentionCachesOneLatentPerLayer) {
  const ModelSpec deepseek = PresetSpec("deepseek-v3");
  EXPECT_EQ(deepseek.geometry.kv_lora_rank, 512);
  EXPECT_EQ(deepseek.geometry.head_dim, 64);  // qk_rope_head_dim
  EXPECT_EQ(deepseek.rope.layout, RopeLayout::kGptj);
  // (512 + 64) x 61 x 2 B, no factor 2 for K and V.
  EXPECT_EQ(*BytesPerToken(deepseek.geometry, KvDtype::kBf16), 70272u);
  EXPECT_EQ(*LayerBytesPerToken(deepseek.geometry, KvDtype::kFp8), 576u);
  // nvfp4: 576 x 4 bits + 36 fp8 scales = 324 B a layer.
  EXPECT_EQ(*BytesPerToken(deepseek.geometry, KvDtype::kNvfp4), 61u * 324);
  ModelGeometry bad = deepseek.geometry;
  bad.kv_heads = 128;
  EXPECT_THAT(ValidateGeometry(bad, KvDtype::kBf16).message(),
              HasSubstr("kv_lora_rank 512"));
  EXPECT_THAT(FingerprintText(deepseek),
              HasSubstr("head_dim=64;kv_lora_rank=512;kv_dtype=fp16;"));
}

TEST(KvGeometryTest, Nvfp4AddsOneScalePer16Values) {
  EXPECT_EQ(*ParseKvDtype("NVFP4"), KvDtype::kNvfp4);
  EXPECT_EQ(*ParseKvDtype("fp4"), KvDtype::kNvfp4);
  EXPECT_EQ(KvDtypeSizeText(KvDtype::kNvfp4), "0.5 B + 1 B per 16 values");
  // 2 x 80 x 8 x (128 x 0.5 + 8) B: 9/32 of fp16.
  EXPECT_EQ(*BytesPerToken(Geometry(80, 8, 128), KvDtype::kNvfp4), 92160u);
  absl::Status odd = ValidateGeometry(Geometry(2, 2, 24), KvDtype::kNvfp4);
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.message(), HasSubstr("head_dim 24 is not a multiple of 16"));
}

TEST(KvGeometryTest, SlidingLayersHoldAtMostTheWindow) {
  const ModelGeometry gemma = PresetSpec("gemma-2-9b").geometry;
  EXPECT_EQ(gemma.sliding_window, 4096);
  EXPECT_EQ(gemma.sliding_layers, 21);
  // A cached block is charged every layer; a sequence stops growing in the
  // sliding half at 4,096 tokens.
  EXPECT_EQ(*BytesPerToken(gemma, KvDtype::kFp16), 344064u);
  EXPECT_EQ(*SequenceKvBytes(gemma, KvDtype::kFp16, 1000, 0), 1000ULL * 344064);
  EXPECT_EQ(*SequenceKvBytes(gemma, KvDtype::kFp16, 32768, 0),
            (32768ULL + 4096) * 172032);
  // Paged: 2,048 blocks in the full layers, 257 (the window spans at most
  // ceil(4096 / 16) + 1) in the sliding ones.
  EXPECT_EQ(*SequenceKvBytes(gemma, KvDtype::kFp16, 32768, 16),
            (32768ULL + 257 * 16) * 172032);
  const ModelGeometry gemma3 = PresetSpec("gemma-3-27b").geometry;
  EXPECT_EQ(*BytesPerToken(gemma3, KvDtype::kBf16), 507904u);
  EXPECT_EQ(*SequenceKvBytes(gemma3, KvDtype::kBf16, 131072, 0),
            131072ULL * 81920 + 1024ULL * 425984);
  ModelGeometry bad = gemma;
  bad.sliding_layers = 43;
  EXPECT_THAT(ValidateGeometry(bad, KvDtype::kFp16).message(),
              HasSubstr("sliding_layers 43"));
}

TEST(KvGeometryTest, HybridStateLayersAddAFixedStatePerSequence) {
  const ModelSpec qwen = PresetSpec("qwen3-next-80b-a3b");
  EXPECT_EQ(*BytesPerToken(qwen.geometry, KvDtype::kBf16), 24576u);
  EXPECT_EQ(*SequenceKvBytes(qwen.geometry, KvDtype::kBf16, 0, 16),
            39518208u);  // 36 x 1,097,728
  EXPECT_EQ(*SequenceKvBytes(qwen.geometry, KvDtype::kBf16, 8192, 16),
            8192ULL * 24576 + 39518208);
  EXPECT_THAT(FingerprintText(qwen),
              HasSubstr("kv_dtype=fp16;state_layers=36;"
                        "state_bytes_per_layer=1097728;block_size=16"));
  const ModelGeometry jamba = PresetSpec("jamba-v0.1").geometry;
  EXPECT_EQ(*BytesPerToken(jamba, KvDtype::kBf16), 16384u);
  EXPECT_EQ(*SequenceKvBytes(jamba, KvDtype::kBf16, 0, 0), 8716288u);
  ModelGeometry bad = jamba;
  bad.state_bytes_per_layer = 0;
  EXPECT_THAT(ValidateGeometry(bad, KvDtype::kBf16).message(),
              HasSubstr("state_layers 28"));
  bad.state_bytes_per_layer = uint64_t{1} << 60;  // x 28 overflows
  EXPECT_THAT(ValidateGeometry(bad, KvDtype::kBf16).message(),
              HasSubstr("below 2^64"));
}

TEST(KvGeometryTest, ShiftAllowIsRefusedForNonComposableScalings) {
  for (RopeScaling scaling :
       {RopeScaling::kDynamicNtk, RopeScaling::kLongRope}) {
    ModelSpec spec = PresetSpec("mistral-7b");
    spec.rope.scaling = scaling;
    spec.rope.factor = 4.0;
    spec.rope.original_max_position = 4096;
    spec.shift_allow = false;
    EXPECT_TRUE(ValidateRope(spec).ok());
    spec.shift_allow = true;
    absl::Status status = ValidateRope(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("shift ALLOW"));
    EXPECT_THAT(status.message(), HasSubstr(RopeScalingName(scaling)));
  }
  for (RopeScaling scaling : {RopeScaling::kNone, RopeScaling::kLinear,
                              RopeScaling::kLlama3, RopeScaling::kYarn}) {
    ModelSpec spec = PresetSpec("llama-3-8b");
    spec.rope.scaling = scaling;
    spec.shift_allow = true;
    EXPECT_TRUE(ValidateRope(spec).ok()) << RopeScalingName(scaling);
  }
}

TEST(KvGeometryTest, ValidateRopeChecksParameters) {
  ModelSpec spec = PresetSpec("llama-3-8b");
  spec.rope.rotary_dim = 7;
  EXPECT_THAT(ValidateRope(spec).message(), HasSubstr("rotary_dim"));
  spec.rope.rotary_dim = 256;
  EXPECT_FALSE(ValidateRope(spec).ok());
  spec.rope.rotary_dim = 64;
  EXPECT_TRUE(ValidateRope(spec).ok());
  spec.rope.theta = 0;
  EXPECT_THAT(ValidateRope(spec).message(), HasSubstr("theta"));
  spec = PresetSpec("llama-3-8b");
  spec.rope.original_max_position = 0;
  EXPECT_THAT(ValidateRope(spec).message(), HasSubstr("llama3"));
  spec.rope.scaling = RopeScaling::kYarn;
  spec.rope.original_max_position = 4096;
  spec.rope.beta_fast = 0.5;
  EXPECT_THAT(ValidateRope(spec).message(), HasSubstr("beta"));
}

TEST(KvGeometryTest, ParsesRopeNames) {
  EXPECT_EQ(*ParseRopeScaling("default"), RopeScaling::kNone);
  EXPECT_EQ(*ParseRopeScaling("dynamic"), RopeScaling::kDynamicNtk);
  EXPECT_EQ(*ParseRopeScaling("su"), RopeScaling::kLongRope);
  EXPECT_EQ(*ParseRopeScaling("YaRN"), RopeScaling::kYarn);
  EXPECT_FALSE(ParseRopeScaling("mrope").ok());
  EXPECT_EQ(*ParseRopeLayout("gptj"), RopeLayout::kGptj);
  EXPECT_EQ(*ParseRopeLayout("NEOX"), RopeLayout::kNeox);
  EXPECT_FALSE(ParseRopeLayout("interleaved").ok());
}

TEST(KvGeometryTest, FingerprintTextIsCanonical) {
  ModelSpec spec = PresetSpec("llama-3-70b");
  EXPECT_EQ(FingerprintText(spec),
            "prefixd-model-v1;layers=80;kv_heads=8;head_dim=128;"
            "kv_dtype=fp16;block_size=16;rope.theta=500000;"
            "rope.scaling=llama3;rope.factor=8;rope.low_freq_factor=1;"
            "rope.high_freq_factor=4;rope.original_max_position=8192;"
            "rope.rotary_dim=128;rope.layout=neox;rope.shift=deny");
  ModelSpec mistral = PresetSpec("mistral-7b");
  EXPECT_EQ(FingerprintText(mistral),
            "prefixd-model-v1;layers=32;kv_heads=8;head_dim=128;"
            "kv_dtype=fp16;block_size=16;rope.theta=1000000;"
            "rope.scaling=none;rope.rotary_dim=128;rope.layout=neox;"
            "rope.shift=deny");
}

TEST(KvGeometryTest, FingerprintIsStableAndSensitive) {
  const ModelSpec base = PresetSpec("llama-3-8b");
  const std::string fp = Fingerprint(base);
  ASSERT_EQ(fp.size(), 16u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos);
  // Pinned: engines compute the same value from the documented text, so a
  // change here breaks every deployed handshake.
  EXPECT_EQ(fp, Fingerprint(base));
  EXPECT_EQ(fp, "e07cff251466ccfb") << FingerprintText(base);

  // Cosmetic fields and unused scaling parameters do not count.
  ModelSpec same = base;
  same.geometry.name = "my-llama";
  same.geometry.attention_heads = 0;
  same.rope.beta_fast = 99;
  same.rope.rotary_dim = 128;  // the same as 0 for head_dim 128
  EXPECT_EQ(Fingerprint(same), fp);

  ModelSpec other = base;
  other.kv_dtype = KvDtype::kFp8;
  EXPECT_NE(Fingerprint(other), fp);
  other = base;
  other.block_size = 32;
  EXPECT_NE(Fingerprint(other), fp);
  other = base;
  other.rope.layout = RopeLayout::kGptj;
  EXPECT_NE(Fingerprint(other), fp);
  other = base;
  other.shift_allow = true;
  EXPECT_NE(Fingerprint(other), fp);
  other = base;
  other.rope.theta = 500001;
  EXPECT_NE(Fingerprint(other), fp);
}

TEST(KvGeometryTest, DescribeDifferenceNamesTheFields) {
  const ModelSpec a = PresetSpec("llama-3-8b");
  ModelSpec b = a;
  EXPECT_EQ(DescribeDifference(FingerprintText(a), FingerprintText(b)), "");
  b.kv_dtype = KvDtype::kFp8;
  b.block_size = 32;
  EXPECT_EQ(DescribeDifference(FingerprintText(a), FingerprintText(b)),
            "kv_dtype: fp16 vs fp8; block_size: 16 vs 32");
  b = a;
  b.rope.scaling = RopeScaling::kNone;
  const std::string diff =
      DescribeDifference(FingerprintText(a), FingerprintText(b));
  EXPECT_THAT(diff, HasSubstr("rope.scaling: llama3 vs none"));
  EXPECT_THAT(diff, HasSubstr("rope.factor: 8 vs <absent>"));
}

}  // namespace
}  // namespace prefixd
