#include "index/picker.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/fleet_index.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;

TEST(PredictedHoldsTest, RunsAreLeadingAndPerWorker) {
  PredictedHolds holds(100);
  const std::vector<uint64_t> keys = {11, 12, 13, 14};
  holds.Add(/*worker=*/1, absl::MakeConstSpan(keys).subspan(0, 3), 1000);
  EXPECT_EQ(holds.Run(1, keys, 0, 500), 3u);
  EXPECT_EQ(holds.Run(1, keys, 1, 500), 2u);
  EXPECT_EQ(holds.Run(2, keys, 0, 500), 0u);   // another worker holds none
  EXPECT_EQ(holds.Run(1, keys, 0, 1000), 0u);  // lapsed at its expiry
  holds.Confirm(1, absl::MakeConstSpan(keys).subspan(0, 1));
  EXPECT_EQ(holds.Run(1, keys, 0, 500), 0u);
  EXPECT_EQ(holds.Run(1, keys, 1, 500), 2u);
}

TEST(PredictedHoldsTest, ExtendedEntriesOutliveTheirFirstExpiry) {
  PredictedHolds holds(100);
  const std::vector<uint64_t> keys = {7};
  holds.Add(1, keys, 100);
  holds.Add(1, keys, 300);
  holds.Expire(150);  // pops the first queue entry, not the extended one
  EXPECT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds.Run(1, keys, 0, 200), 1u);
  holds.Expire(300);
  EXPECT_EQ(holds.size(), 0u);
}

TEST(PredictedHoldsTest, BoundedByMaxEntriesOldestFirst) {
  PredictedHolds holds(64);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 1000; ++k) keys.push_back(k * 7919 + 1);
  for (size_t i = 0; i < keys.size(); ++i) {
    holds.Add(1, absl::MakeConstSpan(keys).subspan(i, 1), 1'000'000);
    ASSERT_LE(holds.size(), 64u);
  }
  EXPECT_EQ(holds.Run(1, keys, 1000 - 64, 0), 64u);  // the newest are kept
  EXPECT_EQ(holds.Run(1, keys, 0, 0), 0u);
}

TEST(PickWindowTest, CountsPicksUntilTheyLapse) {
  PickWindow window(/*window_ms=*/1000, /*max_picks=*/1000);
  window.Add("a", 0, 100);
  window.Add("a", 500, 50);
  window.Add("b", 600, 10);
  window.Expire(900);
  EXPECT_EQ(window.Of("a").picks, 2);
  EXPECT_EQ(window.Of("a").prefill_tokens, 150);
  window.Expire(1000);  // the pick at 0 is a window old
  EXPECT_EQ(window.Of("a").picks, 1);
  EXPECT_EQ(window.Of("a").prefill_tokens, 50);
  window.Expire(2000);
  EXPECT_EQ(window.Of("a").picks, 0);
  EXPECT_EQ(window.workers(), 0u);  // workers with no pick are forgotten
  EXPECT_EQ(window.picks(), 0u);
}

TEST(PickWindowTest, BoundedByMaxPicks) {
  PickWindow window(1'000'000, 8);
  for (int i = 0; i < 100; ++i) window.Add(i % 2 ? "a" : "b", i, 1);
  EXPECT_EQ(window.picks(), 8u);
  EXPECT_EQ(window.Of("a").picks + window.Of("b").picks, 8);
}

class PickerTest : public ::testing::Test {
 protected:
  PickerTest() : index_(Options()), picker_(&index_, PickerOptions()) {
    a_ = index_.AddWorker("a", "tcp://a");
    b_ = index_.AddWorker("b", "tcp://b");
  }
  static IndexOptions Options() {
    IndexOptions o;
    o.block_size = 4;
    return o;
  }
  FleetIndex index_;
  Picker picker_;
  WorkerId a_ = 0, b_ = 0;
};

TEST_F(PickerTest, PredictedBlocksFollowThePromptKeys) {
  std::vector<Token> tokens(16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(i);
  PickQuery q;
  q.prompt.tokens = tokens;
  absl::StatusOr<PickResult> first =
      picker_.Pick(q, absl::FromUnixSeconds(100));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->decision_id, 1u);
  const std::string chosen(first->worker);
  // The same prompt in another namespace shares nothing predicted.
  q.dry_run = true;
  q.prompt.cache_salt = "other";
  absl::StatusOr<PickResult> salted =
      picker_.Pick(q, absl::FromUnixSeconds(101));
  ASSERT_TRUE(salted.ok());
  for (const PickCandidate& c : salted->ranked)
    EXPECT_EQ(c.predicted_blocks, 0u);
  q.prompt.cache_salt = "";
  absl::StatusOr<PickResult> again =
      picker_.Pick(q, absl::FromUnixSeconds(101));
  ASSERT_TRUE(again.ok());
  for (const PickCandidate& c : again->ranked) {
    EXPECT_EQ(c.predicted_blocks, c.worker == chosen ? 4u : 0u) << c.worker;
  }
  EXPECT_EQ(picker_.counts().predicted, 4u);
}

TEST_F(PickerTest, RejectedQueriesChangeNothing) {
  std::vector<Token> tokens(8, 1);
  const WorkerLoadInput bad[] = {{"a", -1, 0, 0}};
  PickQuery q;
  q.prompt.tokens = tokens;
  q.loads = bad;
  absl::StatusOr<PickResult> r = picker_.Pick(q, absl::FromUnixSeconds(100));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("requests_in_flight is -1"));
  q.loads = {};
  q.candidates = {"a", "zz"};
  r = picker_.Pick(q, absl::FromUnixSeconds(100));
  EXPECT_THAT(r.status().message(), HasSubstr("candidates[1] \"zz\""));
  EXPECT_EQ(picker_.counts().picks, 0u);
  EXPECT_EQ(picker_.counts().predicted, 0u);
  EXPECT_EQ(picker_.counts().window_picks, 0u);
}

}  // namespace
}  // namespace prefixd
