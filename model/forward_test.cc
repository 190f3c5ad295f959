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
