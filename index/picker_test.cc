#include "index/picker.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
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
  PickWindow window(/*load_window_ms=*/1000, /*churn_window_ms=*/1000,
                    /*max_picks=*/1000);
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

// The churn tally outlives the load window's, and a worker is forgotten
// only when neither window holds a pick of it.
TEST(PickWindowTest, ChurnCountsPicksOfItsOwnWindow) {
  PickWindow window(/*load_window_ms=*/1000, /*churn_window_ms=*/5000, 1000);
  window.Add("a", 0, 100);
  window.Add("b", 3000, 10);
  window.Add("a", 4500, 50);
  window.Expire(4600);
  EXPECT_EQ(window.Of("a").picks, 1);
  EXPECT_EQ(window.Of("a").prefill_tokens, 50);
  EXPECT_EQ(window.Of("a").churn_tokens, 150);
  EXPECT_EQ(window.Of("b").picks, 0);
  EXPECT_EQ(window.Of("b").churn_tokens, 10);
  EXPECT_EQ(window.picks(), 1u);
  EXPECT_EQ(window.kept(), 3u);
  window.Expire(5000);  // the pick at 0 leaves the churn window
  EXPECT_EQ(window.Of("a").churn_tokens, 50);
  EXPECT_EQ(window.kept(), 2u);
  window.Expire(9500);
  EXPECT_EQ(window.workers(), 0u);
  EXPECT_EQ(window.kept(), 0u);
  EXPECT_EQ(window.Of("a").churn_tokens, 0);
}

// A churn window shorter than the load window works the other way round.
TEST(PickWindowTest, EitherWindowMayBeTheLonger) {
  PickWindow window(/*load_window_ms=*/5000, /*churn_window_ms=*/1000, 1000);
  window.Add("a", 0, 100);
  window.Expire(2000);
  EXPECT_EQ(window.Of("a").picks, 1);
  EXPECT_EQ(window.Of("a").prefill_tokens, 100);
  EXPECT_EQ(window.Of("a").churn_tokens, 0);
  window.Expire(5000);
  EXPECT_EQ(window.workers(), 0u);
}

TEST(PickWindowTest, BoundedByMaxPicks) {
  PickWindow window(1'000'000, 2'000'000, 8);
  for (int i = 0; i < 100; ++i) window.Add(i % 2 ? "a" : "b", i, 1);
  EXPECT_EQ(window.picks(), 8u);
  EXPECT_EQ(window.kept(), 8u);
  EXPECT_EQ(window.Of("a").picks + window.Of("b").picks, 8);
  EXPECT_EQ(window.Of("a").churn_tokens + window.Of("b").churn_tokens, 8);
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
  // The first `blocks` blocks of `tokens` as one chain, hashed from
  // first_hash on.
  static BlockStoredEvent Stored(const std::vector<Token>& tokens,
                                 size_t blocks, EngineHash first_hash) {
    BlockStoredEvent ev;
    for (size_t b = 0; b < blocks; ++b)
      ev.block_hashes.push_back(first_hash + b);
    ev.token_ids.assign(tokens.begin(),
                        tokens.begin() + static_cast<long>(blocks * 4));
    ev.block_size = 4;
    ev.chain_blocks = blocks;
    return ev;
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

// Every block of a picked prompt is predicted on the chosen worker, those
// its events report too (it may evict them before it runs the prompt),
// unless its events report the whole prompt.
TEST_F(PickerTest, PredictsEveryBlockUnlessTheEventsReportThemAll) {
  const auto tokens = [](Token first, size_t blocks) {
    std::vector<Token> out(blocks * 4);
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = first + static_cast<Token>(i);
    return out;
  };
  // "a" holds the first 2 blocks of `part` and all 2 of `whole`.
  const std::vector<Token> part = tokens(0, 4), whole = tokens(100, 2);
  KvEventBatch batch;
  batch.events = {Stored(part, 2, 11), Stored(whole, 2, 21)};
  index_.Apply(a_, batch, 1, absl::FromUnixSeconds(99));
  PickQuery q;
  q.prompt.tokens = part;
  absl::StatusOr<PickResult> r = picker_.Pick(q, absl::FromUnixSeconds(100));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->worker, "a");
  EXPECT_EQ(picker_.counts().predicted, 4u);  // the 2 it holds too
  q.prompt.tokens = whole;
  r = picker_.Pick(q, absl::FromUnixSeconds(100));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->worker, "a");
  EXPECT_EQ(picker_.counts().predicted, 4u);  // nothing for `whole`

  // "a" evicts part's 2 blocks: all 4 are still predicted there.
  KvEventBatch evicted;
  BlockRemovedEvent removed;
  removed.block_hashes = {11, 12};
  evicted.events = {removed};
  index_.Apply(a_, evicted, 2, absl::FromUnixSeconds(101));
  q.prompt.tokens = part;
  q.dry_run = true;
  r = picker_.Pick(q, absl::FromUnixSeconds(101));
  ASSERT_TRUE(r.ok()) << r.status();
  for (const PickCandidate& c : r->ranked) {
    EXPECT_EQ(c.matched_blocks, 0u) << c.worker;
    EXPECT_EQ(c.predicted_blocks, c.worker == "a" ? 4u : 0u) << c.worker;
  }
}

// A worker whose state is not LIVE is credited none of the blocks its
// events report, so the blocks Pick sent it count from the prompt's first,
// and a prompt it holds whole is still predicted when it is picked.
TEST_F(PickerTest, AWorkerNotLiveIsCreditedItsPredictionsFromTheStart) {
  std::vector<Token> tokens(16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(i);
  KvEventBatch batch;
  batch.events = {Stored(tokens, 2, 11)};
  index_.Apply(a_, batch, 1, absl::FromUnixSeconds(99));
  // "a", holding 2 of the 4 blocks, is picked, then falls behind.
  PickQuery q;
  q.prompt.tokens = tokens;
  q.candidates = {"a"};
  absl::StatusOr<PickResult> r = picker_.Pick(q, absl::FromUnixSeconds(100));
  ASSERT_TRUE(r.ok()) << r.status();
  index_.SetState(a_, WorkerState::kReplaying, "a gap");
  q.dry_run = true;
  r = picker_.Pick(q, absl::FromUnixSeconds(101));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->ranked.size(), 1u);
  EXPECT_EQ(r->ranked[0].matched_blocks, 2u);
  EXPECT_EQ(r->ranked[0].predicted_blocks, 4u);
  EXPECT_EQ(r->ranked[0].credited_blocks, 4.0);

  // A prompt the replaying worker's events report whole: picked, it is
  // predicted all the same.
  const std::vector<Token> whole(tokens.begin(), tokens.begin() + 8);
  q.prompt.tokens = whole;
  q.dry_run = false;
  r = picker_.Pick(q, absl::FromUnixSeconds(102));
  ASSERT_TRUE(r.ok()) << r.status();
  q.dry_run = true;
  r = picker_.Pick(q, absl::FromUnixSeconds(103));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ranked[0].matched_blocks, 2u);
  EXPECT_EQ(r->ranked[0].predicted_blocks, 2u);
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

// A store holds blocks but serves no request: never picked, even holding
// the whole prompt, and refused as a candidate, recording nothing.
TEST_F(PickerTest, AStoreIsNeverPicked) {
  const WorkerId store = index_.AddWorker("store", "tcp://store");
  WorkerLabels labels;
  labels.hashes_are_keys = true;
  index_.SetLabels(store, labels);
  std::vector<Token> tokens;
  for (Token t = 1; t <= 16; ++t) tokens.push_back(t);
  KvEventBatch batch;
  batch.events.push_back(Stored(tokens, 4, 900));
  index_.Apply(store, batch, 0, absl::Now());
  for (WorkerId w : {a_, b_, store}) index_.SetState(w, WorkerState::kLive, "");
  PickQuery q;
  q.prompt.tokens = tokens;
  q.dry_run = true;
  absl::StatusOr<PickResult> r = picker_.Pick(q, absl::FromUnixSeconds(100));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->worker, "store");
  EXPECT_EQ(r->ranked.size(), 2u);
  q.candidates = {"a", "store"};
  q.dry_run = false;
  r = picker_.Pick(q, absl::FromUnixSeconds(100));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("candidates[1] \"store\" is a KV store"));
  EXPECT_EQ(picker_.counts().picks, 0u);
  EXPECT_EQ(picker_.counts().window_picks, 0u);
}

TEST_F(PickerTest, ReplayTimeIsRefusedWithoutTheReplayClock) {
  std::vector<Token> tokens(8, 1);
  PickQuery q;
  q.prompt.tokens = tokens;
  q.replay_time_ms = 5000;
  absl::StatusOr<PickResult> r = picker_.Pick(q, absl::FromUnixSeconds(100));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("replay_time_ms is 5000"));
  EXPECT_EQ(picker_.counts().picks, 0u);
}

// Under replay_clock the queries' times age the predicted blocks and the
// window, whatever the caller's clock says, and never run backwards.
TEST_F(PickerTest, TheReplayClockAgesPredictionsAndTheWindow) {
  PickerOptions o;
  o.replay_clock = true;
  o.predicted_ttl = absl::Seconds(5);
  o.load_window = absl::Seconds(2);
  Picker picker(&index_, o);
  std::vector<Token> tokens(16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<Token>(i);
  PickQuery q;
  q.prompt.tokens = tokens;
  q.candidates = {"a"};
  q.replay_time_ms = 0;
  const absl::Time wall = absl::FromUnixSeconds(1'000'000);
  absl::StatusOr<PickResult> r = picker.Pick(q, wall);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("replay_time_ms is 0"));

  q.replay_time_ms = 10'000;
  ASSERT_TRUE(picker.Pick(q, wall).ok());
  const auto at = [&](int64_t ms, absl::Time caller) {
    PickQuery look = q;
    look.dry_run = true;
    look.replay_time_ms = ms;
    absl::StatusOr<PickResult> x = picker.Pick(look, caller);
    EXPECT_TRUE(x.ok()) << x.status();
    return x->ranked.front();
  };
  // 1.9 s of replay time later, a day later on the caller's clock.
  PickCandidate c = at(11'900, wall + absl::Hours(24));
  EXPECT_EQ(c.predicted_blocks, 4u);
  EXPECT_EQ(c.requests_in_flight, 1);  // still in the 2 s window
  c = at(12'000, wall);
  EXPECT_EQ(c.requests_in_flight, 0);  // the window lapsed at 2 s
  EXPECT_EQ(c.predicted_blocks, 4u);
  c = at(15'000, wall);
  EXPECT_EQ(c.predicted_blocks, 0u);  // the TTL lapsed at 5 s

  // A recorded time earlier than the latest counts as the latest: a pick
  // at 20 s, then one "at 1 s", is charged at 20 s.
  q.replay_time_ms = 20'000;
  ASSERT_TRUE(picker.Pick(q, wall).ok());
  q.replay_time_ms = 1'000;
  ASSERT_TRUE(picker.Pick(q, wall).ok());
  c = at(21'999, wall);
  EXPECT_EQ(c.requests_in_flight, 2);
  c = at(22'000, wall);
  EXPECT_EQ(c.requests_in_flight, 0);
}

// With the affinity off (the default), a tie on an idle fleet goes to the
// rendezvous winner of the prompt's first block: cold prompts spread by
// their first block, and siblings sharing it go to the same worker.
TEST_F(PickerTest, IdleTiesSpreadByTheFirstBlock) {
  std::map<std::string, int> chosen;
  for (Token first = 0; first < 32; ++first) {
    std::vector<Token> tokens(8, 7);
    for (size_t i = 0; i < 4; ++i)
      tokens[i] = first * 100 + static_cast<Token>(i);
    PickQuery q;
    q.prompt.tokens = tokens;
    q.dry_run = true;
    absl::StatusOr<PickResult> r = picker_.Pick(q, absl::FromUnixSeconds(100));
    ASSERT_TRUE(r.ok()) << r.status();
    for (const PickCandidate& c : r->ranked) EXPECT_EQ(c.affinity_term, 0);
    ASSERT_EQ(r->ranked[0].cost, r->ranked[1].cost);
    // A sibling (same first block, another tail) and another candidate
    // order give the same worker.
    tokens[5] = 99;
    q.prompt.tokens = tokens;
    q.candidates = {"b", "a"};
    absl::StatusOr<PickResult> sibling =
        picker_.Pick(q, absl::FromUnixSeconds(100));
    ASSERT_TRUE(sibling.ok());
    EXPECT_EQ(sibling->worker, r->worker) << "first block " << first;
    ++chosen[std::string(r->worker)];
  }
  EXPECT_GT(chosen["a"], 0);
  EXPECT_GT(chosen["b"], 0);  // not every tie to the first name
}

// Cold prompts go to the worker Pick has filled least within churn_window,
// even when the router's loads are equal: each recorded pick charges its
// worker churn_weight x its prefill tokens until the window lapses.
TEST_F(PickerTest, ColdPromptsGoWherePickFilledLeast) {
  // The most cold picks one worker was ahead of the other by.
  const auto cold_picks = [&](Picker& picker, int64_t first_s) {
    int ahead = 0, most = 0;
    const WorkerLoadInput idle[] = {{"a", 0, 0, 0}, {"b", 0, 0, 0}};
    for (Token first = 0; first < 16; ++first) {
      std::vector<Token> tokens(16, first * 100);
      PickQuery q;
      q.prompt.tokens = tokens;
      q.loads = idle;
      absl::StatusOr<PickResult> r =
          picker.Pick(q, absl::FromUnixSeconds(first_s + first));
      EXPECT_TRUE(r.ok()) << r.status();
      ahead += r->worker == "a" ? 1 : -1;
      most = std::max(most, std::abs(ahead));
    }
    return most;
  };
  // Each pick leaves its worker 16 tokens of churn: the next cold one goes
  // to the other.
  EXPECT_EQ(cold_picks(picker_, 100), 1);
  std::vector<Token> tokens(16, 5);
  PickQuery q;
  q.prompt.tokens = tokens;
  q.dry_run = true;
  absl::StatusOr<PickResult> r = picker_.Pick(q, absl::FromUnixSeconds(120));
  ASSERT_TRUE(r.ok());
  for (const PickCandidate& c : r->ranked) {
    EXPECT_EQ(c.churn_tokens, 8 * 16) << c.worker;
    EXPECT_DOUBLE_EQ(c.churn_term, 0.003 * 8 * 16) << c.worker;
  }
  r = picker_.Pick(q, absl::FromUnixSeconds(100 + 15 + 60));
  ASSERT_TRUE(r.ok());
  for (const PickCandidate& c : r->ranked) EXPECT_EQ(c.churn_tokens, 0);

  // Without the term the ties follow the first block, unevenly.
  PickerOptions off;
  off.churn_weight = 0;
  Picker plain(&index_, off);
  EXPECT_GT(cold_picks(plain, 100), 1);
}

}  // namespace
}  // namespace prefixd
