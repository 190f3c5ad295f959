#include "index/sequence.h"

#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

using V = SeqTracker::Verdict;

TEST(SeqTracker, FirstBatchAndInOrderBatchesApply) {
  SeqTracker t;
  EXPECT_EQ(t.Classify(17), V::kApply);  // joined a running engine
  t.Applied(17);
  EXPECT_EQ(t.Classify(18), V::kApply);
  t.Applied(18);
  EXPECT_EQ(t.last(), 18);
}

TEST(SeqTracker, AJumpIsAGap) {
  SeqTracker t;
  t.Applied(4);
  EXPECT_EQ(t.Classify(7), V::kGap);
}

TEST(SeqTracker, ALowerNumberIsARestart) {
  SeqTracker t;
  t.Applied(0);
  t.Applied(1);
  EXPECT_EQ(t.Classify(0), V::kRestart);
  EXPECT_EQ(t.Classify(1), V::kRestart);  // repeated: not after a replay
  t.Reset();
  EXPECT_EQ(t.Classify(0), V::kApply);
}

TEST(SeqTracker, TheLastNumberDoesNotWrap) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  SeqTracker t;
  t.Applied(kMax - 1);
  EXPECT_EQ(t.Classify(kMax), V::kApply);
  t.Applied(kMax);
  // Nothing follows INT64_MAX: a lower number is the engine starting over,
  // never a gap to replay from INT64_MIN.
  EXPECT_EQ(t.Classify(0), V::kRestart);
  EXPECT_EQ(t.Classify(kMax), V::kRestart);
}

TEST(SeqTracker, BatchesAReplayBroughtAreDuplicatesOnPub) {
  SeqTracker t;
  t.Applied(41);
  t.BeginReplay();
  for (int64_t s = 42; s <= 47; ++s) t.ReplayApplied(s);
  EXPECT_EQ(t.Classify(43), V::kDuplicate);
  EXPECT_EQ(t.Classify(47), V::kDuplicate);
  EXPECT_EQ(t.Classify(41), V::kRestart);
  EXPECT_EQ(t.Classify(48), V::kApply);
  t.Applied(48);
  // Once PUB is past the replayed range, a lower number is a restart again.
  EXPECT_EQ(t.Classify(45), V::kRestart);
}

}  // namespace
}  // namespace prefixd
