#include "model/forward.h"

#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kGB = 1000ULL * 1000 * 1000;

ForwardInput Preset(const char* name, int64_t batch, int64_t context) {
  ForwardInput in;
  in.geometry = FindPreset(name).value().geometry;
  in.batch = batch;
  in.context_len = context;
  return in;
}

// The headline comparison: Llama-3-70B, 8k context, batch 32.
TEST(ForwardTest, Llama70bBatch32At8k) {
  absl::StatusOr<Forward> f = MakeForward(Preset("llama-3-70b", 32, 8192));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tokens, 262144u);
  EXPECT_EQ(f->bytes_per_token, 327680u);
  EXPECT_EQ(f->kv_bytes, 80 * kGiB);
  ASSERT_EQ(f->variants.size(), 3u);
  EXPECT_EQ(f->variants[0].label, "MHA-64");
  EXPECT_EQ(f->variants[1].label, "GQA-8");
  EXPECT_TRUE(f->variants[1].is_model);
  EXPECT_EQ(f->variants[2].label, "MQA-1");
  // Cells: fp16, fp8, int4 for each variant.
  const uint64_t expected[3][3] = {{640 * kGiB, 320 * kGiB, 160 * kGiB},
                                   {80 * kGiB, 40 * kGiB, 20 * kGiB},
                                   {10 * kGiB, 5 * kGiB, 5 * kGiB / 2}};
  for (int v = 0; v < 3; ++v) {
    ASSERT_EQ(f->variants[v].cells.size(), 3u);
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(f->variants[v].cells[d].kv_bytes, expected[v][d])
          << f->variants[v].label << " " << d;
    }
  }
  EXPECT_EQ(f->variants[1].cells[2].dtype, KvDtype::kInt4);
  EXPECT_EQ(f->variants[1].cells[2].bytes_per_token, 81920u);
}

// 15 GB of weights over 128 KiB per token: ceil(15e9 / 131072) = 114,441.
TEST(ForwardTest, Llama8bCrossover) {
  ForwardInput in = Preset("llama-3-8b", 1, 114441);
  in.weight_bytes = 15 * kGB;
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->crossover_tokens, 114441u);
  EXPECT_GE(f->kv_bytes, in.weight_bytes);
  in.context_len = 114440;
  EXPECT_LT(MakeForward(in)->kv_bytes, in.weight_bytes);
}

TEST(ForwardTest, GpuNeeds) {
  ForwardInput in = Preset("llama-3-70b", 32, 8192);
  in.weight_bytes = 140 * kGB;
  in.overhead_bytes = 20 * kGB;
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->total_bytes, 160 * kGB + 80 * kGiB);
  ASSERT_FALSE(f->gpus.empty());
  const GpuNeed& h100 = f->gpus[0];
  EXPECT_EQ(h100.gpu, "H100-80GB");
  // 245,899,345,920 B over 80 GB cards: 4 (3.07 rounded up).
  EXPECT_EQ(h100.gpus_needed, 4u);
  // 80 GiB is 107% of an 80 GB card: the cache alone does not fit.
  EXPECT_EQ(h100.kv_percent_of_gpu, 107u);
  EXPECT_TRUE(h100.kv_exceeds_gpu);
  for (const GpuNeed& g : f->gpus) {
    if (g.gpu == "H200-141GB") {
      EXPECT_FALSE(g.kv_exceeds_gpu);
      EXPECT_EQ(g.gpus_needed, 2u);
    }
  }
}

TEST(ForwardTest, OtherDtypeAddsARowAndMhaModelHasTwoVariants) {
  ForwardInput in;
  in.geometry = {.layers = 2,
                 .kv_heads = 4,
                 .head_dim = 8,
                 .attention_heads = 4,
                 .name = "tiny"};
  in.kv_dtype = KvDtype::kFp32;
  in.batch = 3;
  in.context_len = 5;
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->variants.size(), 2u);
  EXPECT_EQ(f->variants[0].label, "MHA-4");
  EXPECT_TRUE(f->variants[0].is_model);
  ASSERT_EQ(f->variants[0].cells.size(), 4u);
  EXPECT_EQ(f->variants[0].cells[3].dtype, KvDtype::kFp32);
  // 15 tokens x 2 x 2 x 4 x 8 x 4 B.
  EXPECT_EQ(f->variants[0].cells[3].kv_bytes, 15u * 512);
  EXPECT_EQ(f->kv_bytes, 15u * 512);
  EXPECT_EQ(f->crossover_tokens, 0u);  // no weights given
}

// DeepSeek-V3: 61 layers x (512 kv_lora_rank + 64 qk_rope_head_dim) values,
// 2 B each in fp16 = 70,272 B per token; nvfp4 stores 576 x 0.5 B + 576 / 16
// scales of 1 B = 324 B per layer, 19,764 B per token. The latent is shared
// by all 128 heads, so there is no MHA or MQA variant: one row, "MLA".
TEST(ForwardTest, MlaHasOnlyItsOwnRow) {
  ForwardInput in = Preset("deepseek-v3", 2, 1000);
  in.kv_dtype = KvDtype::kNvfp4;
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->variants.size(), 1u);
  const ForwardVariant& v = f->variants[0];
  EXPECT_EQ(v.label, "MLA");
  EXPECT_TRUE(v.is_model);
  ASSERT_EQ(v.cells.size(), 4u);  // fp16, fp8, int4, nvfp4
  EXPECT_EQ(v.cells[0].bytes_per_token, 70272u);
  EXPECT_EQ(v.cells[0].kv_bytes, 2u * 1000 * 70272);  // 140,544,000
  EXPECT_EQ(v.cells[3].dtype, KvDtype::kNvfp4);
  EXPECT_EQ(v.cells[3].bytes_per_token, 19764u);
  EXPECT_EQ(v.cells[3].kv_bytes, 2u * 1000 * 19764);  // 39,528,000
  EXPECT_EQ(f->bytes_per_token, 19764u);
  EXPECT_EQ(f->sequence_bytes, 19764000u);
  EXPECT_EQ(f->kv_bytes, 39528000u);
}

// Gemma-2-9B: 42 layers of 2 x 8 x 256 x 2 B = 8,192 B per token each; 21
// slide over 4,096 tokens. At 8,192 tokens: 21 x 8,192 x 8,192 +
// 21 x 4,096 x 8,192 = 2,113,929,216 B per sequence (1.96875 GiB), not the
// 8,192 x 344,064 = 2,818,572,288 B of every layer keeping every token.
TEST(ForwardTest, SlidingLayersHoldAtMostTheWindow) {
  ForwardInput in = Preset("gemma-2-9b", 4, 8192);
  in.weight_bytes = 10 * kGB;
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->bytes_per_token, 344064u);
  EXPECT_EQ(f->sequence_bytes, 2113929216u);
  EXPECT_EQ(f->kv_bytes, uint64_t{4} * 2113929216);  // 7.875 GiB
  ASSERT_EQ(f->variants.size(), 3u);                 // MHA-16, GQA-8 *, MQA-1
  // Shorter than the window, every layer holds every token.
  in.context_len = 1000;
  EXPECT_EQ(MakeForward(in)->kv_bytes, 4u * 1000 * 344064);
  // Crossover at batch 4: 2.5e9 B per sequence. The window's 4,096 tokens
  // hold 4,096 x 344,064 = 1,409,286,144 B; the rest at 21 x 8,192 =
  // 172,032 B per token: 4,096 + ceil(1,090,713,856 / 172,032) = 10,437.
  EXPECT_EQ(f->crossover_context, 10437u);
  EXPECT_EQ(f->crossover_tokens, 4u * 10437);
}

TEST(ForwardTest, MhaVariantOfASlidingModel) {
  ForwardInput in = Preset("gemma-2-9b", 1, 8192);
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->variants.size(), 3u);
  EXPECT_EQ(f->variants[0].label, "MHA-16");
  // Twice the model's 8 KV heads: twice its 2,113,929,216 B.
  EXPECT_EQ(f->variants[0].cells[0].kv_bytes, uint64_t{2} * 2113929216);
  EXPECT_EQ(f->variants[2].cells[0].kv_bytes, 2113929216u / 8);
}

// Jamba-v0.1: 4 attention layers of 4,096 B per token (16,384 B) and 28
// Mamba layers of 311,296 B each per sequence (8,716,288 B), whatever the
// context.
TEST(ForwardTest, StateLayersHoldTheirStatePerSequence) {
  ForwardInput in = Preset("jamba-v0.1", 2, 1000);
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->bytes_per_token, 16384u);
  EXPECT_EQ(f->sequence_bytes, 16384000u + 8716288);
  EXPECT_EQ(f->kv_bytes, 2u * 25100288);
  // Weights below the batch's state alone: the first token crosses.
  in.weight_bytes = 2 * 8716288;
  EXPECT_EQ(MakeForward(in)->crossover_context, 1u);
  // 1 GB over batch 2: (5e8 - 8,716,288) / 16,384 = 29,985.6 -> 29,986.
  in.weight_bytes = kGB;
  EXPECT_EQ(MakeForward(in)->crossover_context, 29986u);
  EXPECT_EQ(MakeForward(in)->crossover_tokens, 2u * 29986);
}

// Every layer slides: the KV stops growing at the window, so weights
// above batch x the window's KV are never reached.
TEST(ForwardTest, CrossoverNeverReachedWhenEveryLayerSlides) {
  ForwardInput in;
  in.geometry = {.layers = 2,
                 .kv_heads = 1,
                 .head_dim = 8,
                 .sliding_window = 16,
                 .sliding_layers = 2,
                 .name = "all-sliding"};
  in.batch = 3;
  in.context_len = 100;
  in.weight_bytes = 3 * 16 * 64;  // the window's 16 tokens x 64 B
  absl::StatusOr<Forward> f = MakeForward(in);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->kv_bytes, 3u * 16 * 64);
  EXPECT_EQ(f->crossover_context, 16u);
  in.weight_bytes += 1;
  EXPECT_EQ(MakeForward(in)->crossover_context, 0u);
  EXPECT_EQ(MakeForward(in)->crossover_tokens, 0u);
}

TEST(ForwardTest, BadInputNamesTheValue) {
  ForwardInput in = Preset("llama-3-8b", 0, 8192);
  absl::Status s = MakeForward(in).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("batch 0"));
  in.batch = 1;
  in.context_len = -5;
  EXPECT_THAT(MakeForward(in).status().message(), HasSubstr("context -5"));
  in = Preset("llama-3-70b", int64_t{1} << 30, int64_t{1} << 30);
  s = MakeForward(in).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("overflows 64 bits"));
  in.geometry.layers = 0;
  EXPECT_EQ(MakeForward(in).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace prefixd
