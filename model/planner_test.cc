#include "model/planner.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/kv_geometry.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kGB = 1000000000;

// The reference case of docs/capacity.md: Llama-3-70B fp16 on
// 4 x H100-80GB with 140 GB of weights and 20 GB of overhead.
PlanInput Llama70bOn4H100() {
  PlanInput input;
  input.geometry = FindPreset("llama-3-70b")->geometry;
  input.kv_dtype = KvDtype::kFp16;
  input.gpu_bytes = ParseGpus("4xH100-80GB")->total_bytes;
  input.weight_bytes = 140 * kGB;
  input.overhead_bytes = 20 * kGB;
  return input;
}

// A tensor-parallel degree splits the attention heads evenly, and the KV
// heads evenly or into replicas.
TEST(PlannerTest, TensorParallelDegree) {
  const ModelGeometry llama70b = FindPreset("llama-3-70b")->geometry;  // 64/8
  EXPECT_EQ(TensorParallelDegree(llama70b, 1), 1u);
  EXPECT_EQ(TensorParallelDegree(llama70b, 3), 4u);
  EXPECT_EQ(TensorParallelDegree(llama70b, 5), 8u);
  EXPECT_EQ(TensorParallelDegree(llama70b, 10), 16u);  // KV heads replicated
  EXPECT_EQ(TensorParallelDegree(llama70b, 65), 0u);   // more than the heads
  ModelGeometry g = llama70b;
  g.attention_heads = 12;
  g.kv_heads = 4;
  EXPECT_EQ(TensorParallelDegree(g, 3), 4u);  // 3 divides 12 but not 4
  EXPECT_EQ(TensorParallelDegree(g, 5), 12u);
  g.attention_heads = 0;  // unknown: powers of two
  EXPECT_EQ(TensorParallelDegree(g, 3), 4u);
  EXPECT_EQ(TensorParallelDegree(g, 9), 16u);
  const ModelGeometry mla = FindPreset("deepseek-v3")->geometry;  // 128 heads
  EXPECT_EQ(TensorParallelDegree(mla, 3), 4u);
}

TEST(PlannerTest, Llama70bHeadlineNumbers) {
  absl::StatusOr<Plan> plan = MakePlan(Llama70bOn4H100());
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 2 x 80 x 8 x 128 x 2
  EXPECT_EQ(plan->bytes_per_token, 327680u);
  EXPECT_EQ(plan->block_bytes, 16u * 327680);  // 5,242,880
  EXPECT_EQ(plan->gpu_bytes, 320 * kGB);
  EXPECT_EQ(plan->kv_budget_bytes, 160 * kGB);  // 320 - 140 - 20
  // 160e9 / 327680 = 488281.25
  EXPECT_EQ(plan->tokens_that_fit, 488281u);
  // 160e9 / 5242880 = 30517.58
  EXPECT_EQ(plan->budget_blocks, 30517u);
  // 140e9 / 327680 = 427246.09, rounded up
  EXPECT_EQ(plan->crossover_tokens, 427247u);
}

TEST(PlannerTest, Llama70bContextTable) {
  absl::StatusOr<Plan> plan = MakePlan(Llama70bOn4H100());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->contexts.size(), 3u);
  // context x 327680; sequences = floor(160e9 / that).
  EXPECT_EQ(plan->contexts[0].context_len, 8192);
  EXPECT_EQ(plan->contexts[0].kv_bytes_per_sequence, 2684354560u);  // 2.5 GiB
  EXPECT_EQ(plan->contexts[0].concurrent_sequences, 59u);           // 59.6
  EXPECT_EQ(plan->contexts[1].context_len, 32768);
  EXPECT_EQ(plan->contexts[1].kv_bytes_per_sequence, 10737418240u);  // 10 GiB
  EXPECT_EQ(plan->contexts[1].concurrent_sequences, 14u);            // 14.9
  EXPECT_EQ(plan->contexts[2].context_len, 131072);
  EXPECT_EQ(plan->contexts[2].kv_bytes_per_sequence, 42949672960u);  // 40 GiB
  EXPECT_EQ(plan->contexts[2].concurrent_sequences, 3u);             // 3.7
  for (const ContextRow& row : plan->contexts) {
    EXPECT_EQ(row.concurrent_sequences,
              plan->kv_budget_bytes / row.kv_bytes_per_sequence);
  }
}

TEST(PlannerTest, Llama70bHeadVariants) {
  absl::StatusOr<Plan> plan = MakePlan(Llama70bOn4H100());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->head_variants.size(), 3u);

  const HeadVariant& mha = plan->head_variants[0];
  EXPECT_EQ(mha.label, "MHA-64");
  EXPECT_EQ(mha.kv_heads, 64);
  EXPECT_FALSE(mha.is_model);
  EXPECT_EQ(mha.bytes_per_token, 2621440u);             // 2 x 80 x 64 x 128 x 2
  EXPECT_EQ(mha.tokens_that_fit, 61035u);               // 61035.16
  EXPECT_EQ(mha.crossover_tokens, 53406u);              // 53405.76 up
  EXPECT_EQ(mha.contexts[0].concurrent_sequences, 7u);  // 7.45
  EXPECT_EQ(mha.contexts[1].concurrent_sequences, 1u);  // 1.86
  EXPECT_EQ(mha.contexts[2].concurrent_sequences, 0u);  // 0.47

  const HeadVariant& gqa = plan->head_variants[1];
  EXPECT_EQ(gqa.label, "GQA-8");
  EXPECT_TRUE(gqa.is_model);
  EXPECT_EQ(gqa.bytes_per_token, 327680u);
  EXPECT_EQ(gqa.tokens_that_fit, 488281u);
  EXPECT_EQ(gqa.contexts[0].concurrent_sequences, 59u);

  const HeadVariant& mqa = plan->head_variants[2];
  EXPECT_EQ(mqa.label, "MQA-1");
  EXPECT_EQ(mqa.bytes_per_token, 40960u);     // 2 x 80 x 1 x 128 x 2
  EXPECT_EQ(mqa.tokens_that_fit, 3906250u);   // exact
  EXPECT_EQ(mqa.crossover_tokens, 3417969u);  // 3417968.75 up
  EXPECT_EQ(mqa.contexts[0].concurrent_sequences, 476u);  // 476.8
  EXPECT_EQ(mqa.contexts[1].concurrent_sequences, 119u);  // 119.2
  EXPECT_EQ(mqa.contexts[2].concurrent_sequences, 29u);   // 29.8
}

TEST(PlannerTest, Llama70bPagedVersusContiguousWaste) {
  PlanInput input = Llama70bOn4H100();
  input.actual_len = 1000;  // max_seq_len defaults to the largest context
  absl::StatusOr<Plan> plan = MakePlan(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->waste.has_value());
  const WasteReport& w = *plan->waste;
  EXPECT_EQ(w.max_seq_len, 131072);
  EXPECT_EQ(w.contiguous_reserved_tokens, 131072u);
  EXPECT_EQ(w.contiguous_wasted_tokens, 130072u);
  EXPECT_EQ(w.contiguous_wasted_bytes,
            uint64_t{130072} * 327680);  // 42,621,992,960
  EXPECT_EQ(w.contiguous_sequences, 3u);
  EXPECT_EQ(w.paged_reserved_tokens, 1008u);  // 63 blocks of 16
  EXPECT_EQ(w.paged_wasted_tokens, 8u);
  EXPECT_EQ(w.paged_wasted_bytes, 2621440u);
  EXPECT_EQ(w.paged_sequences, 484u);  // 30517 / 63 = 484.4

  input.max_seq_len = 8192;
  input.actual_len = 8192;
  plan = MakePlan(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->waste->contiguous_wasted_tokens, 0u);
  EXPECT_EQ(plan->waste->paged_wasted_tokens, 0u);

  input.actual_len = 0;
  plan = MakePlan(input);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->waste.has_value());

  input.actual_len = 9000;
  EXPECT_THAT(MakePlan(input).status().message(),
              HasSubstr("actual_len 9000, max_seq_len 8192"));
}

TEST(PlannerTest, ContextNotAMultipleOfTheBlockNeedsAWholeBlock) {
  PlanInput input = Llama70bOn4H100();
  input.context_lengths = {17};
  input.actual_len = 0;
  absl::StatusOr<Plan> plan = MakePlan(input);
  ASSERT_TRUE(plan.ok());
  // Two blocks per sequence: 30517 / 2.
  EXPECT_EQ(plan->contexts[0].concurrent_sequences, 15258u);
  EXPECT_EQ(plan->contexts[0].kv_bytes_per_sequence, 17u * 327680);
}

TEST(PlannerTest, RefusesImpossibleInputs) {
  PlanInput input = Llama70bOn4H100();
  input.weight_bytes = 310 * kGB;
  absl::Status status = MakePlan(input).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("310000000000"));
  EXPECT_THAT(status.message(), HasSubstr("320000000000"));

  input = Llama70bOn4H100();
  input.block_size = 0;
  EXPECT_FALSE(MakePlan(input).ok());
  input = Llama70bOn4H100();
  input.context_lengths = {8192, -1};
  EXPECT_FALSE(MakePlan(input).ok());
  input = Llama70bOn4H100();
  input.geometry.kv_heads = 0;
  EXPECT_FALSE(MakePlan(input).ok());
  input = Llama70bOn4H100();
  input.context_lengths = {int64_t{1} << 62};
  EXPECT_THAT(MakePlan(input).status().message(), HasSubstr("overflows"));
}

TEST(PlannerTest, VariantsForAModelWithoutGqaOrKnownHeads) {
  PlanInput input = Llama70bOn4H100();
  input.geometry.kv_heads = 64;  // as if multi-head attention
  absl::StatusOr<Plan> plan = MakePlan(input);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->head_variants.size(), 3u);
  EXPECT_EQ(plan->head_variants[0].label, "MHA-64");
  EXPECT_TRUE(plan->head_variants[0].is_model);

  input.geometry.kv_heads = 4;
  input.geometry.attention_heads = 0;  // unknown: no MHA row
  plan = MakePlan(input);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->head_variants.size(), 3u);
  EXPECT_EQ(plan->head_variants[0].label, "GQA-8");
  EXPECT_EQ(plan->head_variants[1].label, "GQA-4");
  EXPECT_TRUE(plan->head_variants[1].is_model);
  EXPECT_EQ(plan->head_variants[2].label, "MQA-1");
}

TEST(PlannerTest, ParsesGpus) {
  absl::StatusOr<GpuPool> pool = ParseGpus("4xH100-80GB");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->count, 4);
  EXPECT_EQ(pool->model, "H100-80GB");
  EXPECT_EQ(pool->bytes_per_gpu, 80 * kGB);
  EXPECT_EQ(pool->total_bytes, 320 * kGB);

  EXPECT_EQ(ParseGpus("8xA100-40GB")->total_bytes, 320 * kGB);
  EXPECT_EQ(ParseGpus("H100-80GB")->total_bytes, 80 * kGB);
  EXPECT_EQ(ParseGpus("H100-80GB")->count, 1);
  EXPECT_EQ(ParseGpus("2 x h200-141gb")->total_bytes, 282 * kGB);
  EXPECT_EQ(ParseGpus("8*L4-24GB")->total_bytes, 192 * kGB);
  EXPECT_EQ(ParseGpus("4x80GiB")->total_bytes, 4 * (80ULL << 30));
  EXPECT_EQ(ParseGpus("320GB")->total_bytes, 320 * kGB);
  EXPECT_EQ(ParseGpus("320GB")->model, "");
  EXPECT_EQ(ParseGpus("L40S-48GB")->total_bytes, 48 * kGB);
  EXPECT_EQ(ParseGpus("A10-24GB")->total_bytes, 24 * kGB);
  EXPECT_EQ(ParseGpus("A100-80GB")->total_bytes, 80 * kGB);
  EXPECT_EQ(ParseGpus("H100-94GB")->total_bytes, 94 * kGB);
  EXPECT_EQ(ParseGpus("8xB200-180GB")->total_bytes, 1440 * kGB);
  EXPECT_EQ(ParseGpus("8xB200")->model, "B200-180GB");
  EXPECT_EQ(ParseGpus("gb200")->total_bytes, 186 * kGB);
  EXPECT_EQ(ParseGpus("8xMI300X")->total_bytes, 1536 * kGB);
  EXPECT_EQ(ParseGpus("H200")->model, "H200-141GB");
  EXPECT_EQ(ParseGpus("L40S")->total_bytes, 48 * kGB);
  EXPECT_EQ(KnownGpus().size(), 11u);
  EXPECT_THAT(ParseGpus("A100").status().message(),
              HasSubstr("ambiguous: say A100-40GB or A100-80GB"));
  EXPECT_THAT(ParseGpus("2x96").status().message(),
              HasSubstr("GPU memory 96: a size needs a unit"));

  absl::StatusOr<GpuPool> bad = ParseGpus("4xB200-192GB");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"4xB200-192GB\""));
  EXPECT_THAT(bad.status().message(), HasSubstr("H100-80GB"));
  EXPECT_FALSE(ParseGpus("0xH100-80GB").ok());
}

TEST(PlannerTest, WeightBytesFromParameters) {
  EXPECT_EQ(*WeightBytes(70000000000, KvDtype::kFp16), 140 * kGB);
  EXPECT_EQ(*WeightBytes(70000000000, KvDtype::kBf16), 140 * kGB);
  EXPECT_EQ(*WeightBytes(70000000000, KvDtype::kFp8), 70 * kGB);
  EXPECT_EQ(*WeightBytes(70000000000, KvDtype::kInt4), 35 * kGB);
  EXPECT_EQ(*WeightBytes(70000000000, KvDtype::kFp32), 280 * kGB);
  EXPECT_EQ(*WeightBytes(3, KvDtype::kInt4), 2u);  // 1.5 bytes, packed up
  // 4 bits a value and one byte of scale per 16 values: 4.5 bits.
  EXPECT_EQ(*WeightBytes(70000000000, KvDtype::kNvfp4), 39375000000u);
  // 16 values and their scale, 9 B; the 17th and its own scale, 1.5 B.
  EXPECT_EQ(*WeightBytes(17, KvDtype::kNvfp4), 11u);
  EXPECT_EQ(*WeightBytes(UINT64_MAX, KvDtype::kInt8), UINT64_MAX);
  EXPECT_FALSE(WeightBytes(UINT64_MAX, KvDtype::kFp16).ok());
}

TEST(PlannerTest, SlidingAndStateLayersSizeSequencesNotTokens) {
  PlanInput input;
  input.geometry = FindPreset("gemma-2-9b")->geometry;
  input.gpu_bytes = 80 * kGB;
  input.weight_bytes = 18500000000;
  input.context_lengths = {4096, 32768};
  absl::StatusOr<Plan> plan = MakePlan(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->full_bytes_per_token, 172032u);
  EXPECT_EQ(plan->window_bytes_per_token, 172032u);
  EXPECT_EQ(plan->contexts[0].concurrent_sequences, 43u);
  EXPECT_EQ(plan->contexts[1].kv_bytes_per_sequence, 6341787648u);
  EXPECT_EQ(plan->contexts[1].concurrent_sequences, 9u);
  // 1,000 tokens of 131,072 reserved: the sliding half reserves only 4,096.
  ASSERT_TRUE(plan->waste.has_value());
  EXPECT_EQ(plan->waste->contiguous_wasted_bytes,
            (32768ULL - 1000) * 172032 + (4096ULL - 1000) * 172032);

  input.geometry = FindPreset("jamba-v0.1")->geometry;
  plan = MakePlan(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->state_bytes_per_sequence, 8716288u);
  EXPECT_EQ(plan->contexts[0].kv_bytes_per_sequence, 4096ULL * 16384 + 8716288);
}

TEST(PlannerTest, LatentAttentionHasNoHeadVariants) {
  PlanInput input;
  input.geometry = FindPreset("deepseek-v3")->geometry;
  input.kv_dtype = KvDtype::kBf16;
  input.gpu_bytes = 1128 * kGB;
  input.weight_bytes = 671 * kGB;
  input.overhead_bytes = 57 * kGB;
  absl::StatusOr<Plan> plan = MakePlan(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_per_token, 70272u);
  EXPECT_EQ(plan->tokens_that_fit, 5692167u);  // 400e9 / 70,272
  EXPECT_EQ(plan->contexts[2].concurrent_sequences, 43u);
  EXPECT_TRUE(plan->head_variants.empty());
}

}  // namespace
}  // namespace prefixd
