#include "index/external_kv.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/fleet_index.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

class ExternalKvTest : public ::testing::Test {
 protected:
  ExternalKvTest() : index_(IndexOptions{}), kv_(&index_, Options()) {}

  static ExternalKv::Options Options() {
    ExternalKv::Options o;
    o.max_hit_counts = 3;
    return o;
  }

  // One REPORT (or other op) batch.
  absl::StatusOr<ApplyOutcome> Send(absl::string_view worker, uint64_t seq,
                                    const std::vector<EngineHash>& hashes,
                                    HashUpdate::Op op = HashUpdate::Op::kReport,
                                    int tier = kTierHbm,
                                    absl::string_view address = "10.0.0.1:8000",
                                    const std::vector<uint32_t>& masks = {}) {
    ExternalBatch b;
    b.worker_id = worker;
    b.seq = seq;
    b.address = address;
    b.actions.push_back({op, tier, hashes, masks, {}});
    b.epoch = epoch_;
    b.enforce_sequence = enforce_;
    b.spec = spec_;
    return kv_.Apply(b);
  }

  // (worker, blocks) of MatchPrefix.
  std::vector<std::pair<std::string, uint32_t>> Prefix(
      const std::vector<EngineHash>& hashes) {
    std::vector<std::pair<std::string, uint32_t>> out;
    for (const PrefixMatch& m : kv_.MatchPrefix(hashes, {}).matches)
      out.emplace_back(std::string(m.worker), m.blocks);
    return out;
  }

  // "zmq-0", followed by a source and reported by the bridge, is retired
  // (its source removed), re-adopted by the bridge's next batch (holding 5
  // and 6), then followed by a source again (a new registration).
  void ReadoptThenFollowAgain() {
    const WorkerId z = index_.AddWorker("zmq-0", "tcp://engine:5557");
    ASSERT_TRUE(
        Send("zmq-0", 1, {}, HashUpdate::Op::kReport, kTierHbm, "z:1").ok());
    index_.RetireWorker(z);
    ASSERT_TRUE(
        Send("zmq-0", 2, {5, 6}, HashUpdate::Op::kReport, kTierHbm, "z:1")
            .ok());
    EXPECT_EQ(index_.AddWorker("zmq-0", "tcp://engine:5558"), z);
  }

  FleetIndex index_;
  ExternalKv kv_;
  std::string epoch_;
  bool enforce_ = false;
  std::optional<CacheSpec> spec_;
};

TEST_F(ExternalKvTest, PrefixPerWorkerMostFirst) {
  ASSERT_TRUE(Send("a", 1, {11, 12, 13}).ok());
  ASSERT_TRUE(
      Send("b", 1, {11}, HashUpdate::Op::kReport, kTierHbm, "b:1").ok());
  EXPECT_THAT(Prefix({11, 12, 13}), ElementsAre(Pair("a", 3), Pair("b", 1)));
  const PrefixAnswer r = kv_.MatchPrefix({11, 12, 13}, {});
  EXPECT_EQ(r.best_blocks, 3u);
  EXPECT_EQ(r.blocks_read, 3u);
  EXPECT_EQ(r.matches[1].address, "b:1");
  // A hole ends the prefix. Hashes are the engine's, position-free: a
  // prompt starting with a held hash matches from there.
  EXPECT_THAT(Prefix({11, 99, 13}), ElementsAre(Pair("a", 1), Pair("b", 1)));
  EXPECT_THAT(Prefix({12, 13}), ElementsAre(Pair("a", 2)));
  EXPECT_TRUE(Prefix({99, 11}).empty());
}

TEST_F(ExternalKvTest, WorkersWithoutAddressAreLeftOut) {
  ASSERT_TRUE(Send("a", 1, {1, 2}, HashUpdate::Op::kReport, kTierHbm, "").ok());
  EXPECT_TRUE(Prefix({1, 2}).empty());
  ASSERT_TRUE(Send("a", 2, {}, HashUpdate::Op::kReport, kTierHbm, "a:1").ok());
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("a", 2)));
}

TEST_F(ExternalKvTest, RevokeAndClearTier) {
  ASSERT_TRUE(Send("a", 1, {1, 2, 3}).ok());
  ASSERT_TRUE(Send("a", 2, {1, 2, 3}, HashUpdate::Op::kReport, kTierDram).ok());
  ASSERT_TRUE(Send("a", 3, {2}, HashUpdate::Op::kRevoke).ok());
  // Still held in DRAM.
  EXPECT_THAT(Prefix({1, 2, 3}), ElementsAre(Pair("a", 3)));
  ASSERT_TRUE(Send("a", 4, {}, HashUpdate::Op::kClearTier, kTierDram).ok());
  EXPECT_THAT(Prefix({1, 2, 3}), ElementsAre(Pair("a", 1)));
}

TEST_F(ExternalKvTest, EnforcedSequenceDuplicatesAndGaps) {
  enforce_ = true;
  ASSERT_TRUE(Send("a", 5, {1}).ok());  // the stream starts here
  absl::StatusOr<ApplyOutcome> dup = Send("a", 5, {2});
  ASSERT_TRUE(dup.ok());
  EXPECT_TRUE(dup->duplicate);
  EXPECT_EQ(dup->applied_seq, 5u);
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("a", 1)));  // 2 not applied
  ASSERT_TRUE(Send("a", 6, {2}).ok());
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("a", 2)));

  absl::StatusOr<ApplyOutcome> gap = Send("a", 9, {3});
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gap.status().message()),
              ::testing::HasSubstr("seq 9 after applied_seq 6: batches 7..8"));
  EXPECT_TRUE(Prefix({1, 2}).empty());  // cleared
  // Refused until a snapshot.
  EXPECT_EQ(Send("a", 10, {1}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ExternalSnapshot snap;
  snap.worker_id = "a";
  snap.address = "10.0.0.1:8000";
  snap.applied_seq = 20;
  const std::vector<EngineHash> held = {1, 2, 3};
  snap.tiers.push_back({HashUpdate::Op::kReport, kTierHbm, held, {}, {}});
  EXPECT_EQ(kv_.ReplaceSnapshot(snap), 20u);
  EXPECT_THAT(Prefix({1, 2, 3}), ElementsAre(Pair("a", 3)));
  EXPECT_TRUE(Send("a", 21, {4}).ok());
  EXPECT_TRUE(Send("a", 21, {5})->duplicate);
}

TEST_F(ExternalKvTest, SequenceIsOnlyRecordedWithoutEnforcement) {
  ASSERT_TRUE(Send("a", 5, {1}).ok());
  absl::StatusOr<ApplyOutcome> r = Send("a", 3, {2});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->duplicate);
  EXPECT_EQ(r->applied_seq, 3u);
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("a", 2)));
}

TEST_F(ExternalKvTest, NewEpochIsARestart) {
  epoch_ = "e1";
  ASSERT_TRUE(Send("a", 1, {1, 2}).ok());
  epoch_ = "e2";
  ASSERT_TRUE(Send("a", 1, {7}).ok());
  EXPECT_TRUE(Prefix({1, 2}).empty());
  EXPECT_THAT(Prefix({7}), ElementsAre(Pair("a", 1)));
  // With enforce_sequence, a restart needs a snapshot.
  enforce_ = true;
  epoch_ = "e3";
  EXPECT_EQ(Send("a", 2, {8}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Prefix({7}).empty());
}

TEST_F(ExternalKvTest, SnapshotReplacesEveryTier) {
  ASSERT_TRUE(Send("a", 1, {1, 2}).ok());
  ASSERT_TRUE(Send("a", 2, {5}, HashUpdate::Op::kReport, kTierSsd).ok());
  ExternalSnapshot snap;
  snap.worker_id = "a";
  snap.address = "a:2";
  snap.applied_seq = 7;
  const std::vector<EngineHash> dram = {3, 4};
  snap.tiers.push_back({HashUpdate::Op::kReport, kTierDram, dram, {}, {}});
  kv_.ReplaceSnapshot(snap);
  EXPECT_TRUE(Prefix({1}).empty());
  EXPECT_TRUE(Prefix({5}).empty());
  const PrefixAnswer r = kv_.MatchPrefix({3, 4}, {});
  ASSERT_EQ(r.matches.size(), 1u);
  EXPECT_EQ(r.matches[0].address, "a:2");
  EXPECT_EQ(r.matches[0].blocks, 2u);
}

// SWA over a window of 2 pages of 4 tokens (8 tokens); MAMBA on the
// boundary only; FULL everywhere.
TEST_F(ExternalKvTest, HybridSpecRules) {
  spec_ = CacheSpec{
      1, kComponentFull | kComponentSwa | kComponentMamba, 8, 0, 0, 0};
  constexpr uint32_t kF = kComponentFull, kFS = kComponentFull | kComponentSwa,
                     kAll = kAllComponents;
  ExternalBatch b;
  b.worker_id = "h";
  b.address = "h:1";
  b.spec = spec_;
  const std::vector<EngineHash> hashes = {1, 2, 3, 4, 5};
  const std::vector<uint32_t> masks = {kF, kF, kFS, kFS, kAll};
  const std::vector<uint32_t> sizes = {4, 4, 4, 4, 4};
  b.actions.push_back(
      {HashUpdate::Op::kReport, kTierHbm, hashes, masks, sizes});
  ASSERT_TRUE(kv_.Apply(b).ok());
  // Boundary 5: FULL 1..5, SWA 4..5 (2 pages), MAMBA on 5.
  EXPECT_THAT(Prefix({1, 2, 3, 4, 5}), ElementsAre(Pair("h", 5)));
  // Boundary 4 has no MAMBA, so a 4-page prompt reuses nothing.
  EXPECT_TRUE(Prefix({1, 2, 3, 4}).empty());
  // Dropping SWA from page 4 (a REPORT replaces the components) breaks the
  // window ending at 5.
  b.seq = 2;
  b.actions.clear();
  const std::vector<EngineHash> four = {4};
  const std::vector<uint32_t> full = {kF};
  b.actions.push_back({HashUpdate::Op::kReport, kTierHbm, four, full, {}});
  ASSERT_TRUE(kv_.Apply(b).ok());
  EXPECT_TRUE(Prefix({1, 2, 3, 4, 5}).empty());
  // Match reports the components held.
  const std::vector<NodeHoldings> m = kv_.Match({4, 5}, false, "");
  ASSERT_EQ(m.size(), 1u);
  ASSERT_EQ(m[0].tiers.size(), 1u);
  EXPECT_THAT(m[0].tiers[0].component_masks, ElementsAre(kF, kAll));
}

TEST_F(ExternalKvTest, ConfigureRemovesOnlyWorkersItCreated) {
  // A worker the index follows on its own (as ZeroMQ ingestion adds it).
  const WorkerId z = index_.AddWorker("zmq-0", "tcp://engine:5557");
  const std::vector<EngineHash> zh = {1, 2};
  index_.ApplyHashes(z, {HashUpdate{HashUpdate::Op::kReport, "GPU", 1, zh}});
  ASSERT_TRUE(Send("a", 1, {1}).ok());
  ASSERT_TRUE(Send("b", 1, {1}, HashUpdate::Op::kReport, kTierHbm, "b:1").ok());
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("a", 1), Pair("b", 1)));

  const std::vector<ExpectedWorker> expected = {{"a", "a:9", std::nullopt},
                                                {"zmq-0", "z:1", std::nullopt}};
  const ExpectedCounts c = kv_.ConfigureExpected(expected);
  EXPECT_EQ(c.total, 2u);
  EXPECT_EQ(c.ready, 2u);  // a applied a batch; zmq-0 is LIVE
  // b removed; zmq-0 now has an address and answers by its hashes.
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("zmq-0", 2), Pair("a", 1)));
  EXPECT_EQ(kv_.MatchPrefix({1}, {}).matches[0].address, "a:9");

  // Left out, zmq-0 stays; a goes.
  kv_.ConfigureExpected({});
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("zmq-0", 2)));
}

// InvalidateWorker: the worker holds nothing, is not ready, and its
// sequenced batches wait for a snapshot; a worker fed over ZeroMQ is
// cleared too (not LIVE until its next events); an unknown one is
// NOT_FOUND and changes nothing.
TEST_F(ExternalKvTest, InvalidateForgetsAWorkerUntilASnapshot) {
  const WorkerId z = index_.AddWorker("zmq-0", "tcp://engine:5557");
  const std::vector<EngineHash> zh = {1, 2};
  index_.ApplyHashes(z, {HashUpdate{HashUpdate::Op::kReport, "GPU", 1, zh}});
  enforce_ = true;
  epoch_ = "e1";
  ASSERT_TRUE(Send("a", 1, {1, 2}).ok());
  EXPECT_EQ(kv_.ConfigureExpected(
                   {{"a", "a:1", std::nullopt}, {"zmq-0", "z:1", std::nullopt}})
                .ready,
            2u);

  absl::StatusOr<ExpectedCounts> c = kv_.Invalidate("a");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->total, 2u);
  EXPECT_EQ(c->ready, 1u);
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("zmq-0", 2)));
  absl::StatusOr<ApplyOutcome> refused = Send("a", 2, {3});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(index_.Stats()
                .workers[0]
                .clears[static_cast<int>(ClearReason::kInvalidated)],
            1u);

  ExternalSnapshot snap;
  snap.worker_id = "a";
  snap.address = "a:1";
  snap.epoch = "e1";
  snap.applied_seq = 5;
  const std::vector<EngineHash> held = {1};
  snap.tiers.push_back({HashUpdate::Op::kReport, kTierHbm, held, {}, {}});
  kv_.ReplaceSnapshot(snap);
  ASSERT_TRUE(Send("a", 6, {}).ok());
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("zmq-0", 2), Pair("a", 1)));

  c = kv_.Invalidate("zmq-0");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ready, 1u);  // a is ready again; zmq-0 is not LIVE
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("a", 1)));

  const IndexStats before = index_.Stats();
  c = kv_.Invalidate("nobody");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), ::testing::HasSubstr("\"nobody\""));
  EXPECT_EQ(index_.Stats().entries, before.entries);
  EXPECT_FALSE(kv_.epoch().empty());
  EXPECT_NE(kv_.epoch(), ExternalKv(&index_, {}).epoch());
}

// A worker ZeroMQ ingestion follows and the bridge also reports: when its
// source goes (/unregister retires it), the bridge's next batch starts the
// worker again as the bridge's own, visible, holding what that batch says.
TEST_F(ExternalKvTest, AWorkerRetiredElsewhereStartsAFreshStream) {
  const WorkerId z = index_.AddWorker("zmq-0", "tcp://engine:5557");
  const std::vector<EngineHash> zh = {1, 2};
  index_.ApplyHashes(z, {HashUpdate{HashUpdate::Op::kReport, "GPU", 1, zh}});
  ASSERT_TRUE(
      Send("zmq-0", 1, {}, HashUpdate::Op::kReport, kTierHbm, "z:1").ok());
  EXPECT_THAT(Prefix({1, 2}), ElementsAre(Pair("zmq-0", 2)));

  index_.RetireWorker(z);  // its source removed
  EXPECT_TRUE(Prefix({1, 2}).empty());
  ASSERT_TRUE(
      Send("zmq-0", 2, {5, 6}, HashUpdate::Op::kReport, kTierHbm, "z:1").ok());
  EXPECT_THAT(Prefix({5, 6}), ElementsAre(Pair("zmq-0", 2)));
  EXPECT_TRUE(Prefix({1, 2}).empty());  // retiring cleared the old holds
  // Now the bridge's own: left out of the expected workers, it goes.
  kv_.ConfigureExpected({});
  EXPECT_TRUE(Prefix({5, 6}).empty());
}

// Re-adopted after a retirement, then followed by a source again (a new
// registration): the expected workers leaving it out no longer remove it.
TEST_F(ExternalKvTest, AWorkerASourceFollowsAgainIsNotRemoved) {
  ASSERT_NO_FATAL_FAILURE(ReadoptThenFollowAgain());
  kv_.ConfigureExpected({});
  EXPECT_THAT(Prefix({5, 6}), ElementsAre(Pair("zmq-0", 2)));
  EXPECT_EQ(kv_.ConfigureExpected({{"zmq-0", "z:1", std::nullopt}}).ready, 1u);
}

// The same worker's batches after the source follows it again treat it as
// the source's: a page size they carry does not set its group rules (its
// events do), without waiting for a ConfigureExpected.
TEST_F(ExternalKvTest, AWorkerASourceFollowsAgainKeepsItsGroupRules) {
  ASSERT_NO_FATAL_FAILURE(ReadoptThenFollowAgain());
  ExternalBatch b;
  b.worker_id = "zmq-0";
  b.seq = 3;
  b.address = "z:1";
  const std::vector<EngineHash> hashes = {7};
  const std::vector<uint32_t> masks = {kComponentFull};
  const std::vector<uint32_t> sizes = {8};
  b.actions.push_back(
      {HashUpdate::Op::kReport, kTierHbm, hashes, masks, sizes});
  ASSERT_TRUE(kv_.Apply(b).ok());
  const IndexStats stats = index_.Stats();
  ASSERT_EQ(stats.workers.size(), 1u);
  EXPECT_EQ(stats.workers[0].endpoint, "tcp://engine:5558");
  EXPECT_TRUE(stats.workers[0].groups.empty());
}

// The bridge sets only the address of a worker ZeroMQ ingestion follows:
// labels its registration changes later are not put back.
TEST_F(ExternalKvTest, AddressLeavesTheRegistrationsLabels) {
  const WorkerId z = index_.AddWorker("zmq-0", "tcp://engine:5557");
  WorkerLabels first;
  first.tenant = "t1";
  index_.SetLabels(z, first);
  const std::vector<EngineHash> zh = {1, 2};
  index_.ApplyHashes(z, {HashUpdate{HashUpdate::Op::kReport, "GPU", 1, zh}});
  ASSERT_TRUE(
      Send("zmq-0", 1, {}, HashUpdate::Op::kReport, kTierHbm, "z:1").ok());

  WorkerLabels second;  // re-registered: another tenant, no address
  second.tenant = "t2";
  index_.SetLabels(z, second);
  ASSERT_TRUE(
      Send("zmq-0", 2, {}, HashUpdate::Op::kReport, kTierHbm, "z:2").ok());
  WorkerFilter t2;
  t2.tenant = "t2";
  const PrefixAnswer r = kv_.MatchPrefix({1, 2}, t2);
  ASSERT_EQ(r.matches.size(), 1u);
  EXPECT_EQ(r.matches[0].address, "z:2");
  // The registration's labels lose their address again: the next batch
  // gives it back, even one naming the same address as before.
  index_.SetLabels(z, second);
  EXPECT_TRUE(kv_.MatchPrefix({1, 2}, t2).matches.empty());
  ASSERT_TRUE(
      Send("zmq-0", 3, {}, HashUpdate::Op::kReport, kTierHbm, "z:2").ok());
  EXPECT_EQ(kv_.MatchPrefix({1, 2}, t2).matches.size(), 1u);
}

TEST_F(ExternalKvTest, MatchByTierAndBoundedHitCounts) {
  ASSERT_TRUE(Send("a", 1, {1, 2}).ok());
  ASSERT_TRUE(Send("a", 2, {2}, HashUpdate::Op::kReport, kTierSsd).ok());
  ASSERT_TRUE(
      Send("b", 1, {3, 4, 5}, HashUpdate::Op::kReport, kTierHbm, "").ok());
  const std::vector<NodeHoldings> m = kv_.Match({2, 1, 2, 9}, true, "");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].worker, "a");
  ASSERT_EQ(m[0].tiers.size(), 2u);
  EXPECT_EQ(m[0].tiers[0].tier, kTierHbm);
  EXPECT_THAT(m[0].tiers[0].hashes, ElementsAre(2, 1));
  EXPECT_EQ(m[0].tiers[1].tier, kTierSsd);
  EXPECT_THAT(m[0].tiers[1].hashes, ElementsAre(2));
  kv_.Match({2}, true, "");
  kv_.Match({1}, false, "");  // not counted

  auto counts = [&](std::vector<EngineHash> hashes) {
    std::vector<std::pair<EngineHash, uint64_t>> out;
    for (const HitCount& h : kv_.HitCounts(hashes))
      out.emplace_back(h.hash, h.hits);
    return out;
  };
  EXPECT_THAT(counts({1, 2, 9, 2}), ElementsAre(Pair(1, 1), Pair(2, 2)));
  // The table holds 3 hashes: a fourth is not counted, the others are.
  kv_.Match({3, 4, 5}, true, "");
  kv_.Match({1}, true, "");
  EXPECT_THAT(counts({1, 3, 4, 5}), ElementsAre(Pair(1, 2), Pair(3, 1)));
}

TEST(RulesForSpecTest, WindowInPages) {
  const auto rules = RulesForSpec(CacheSpec{1, kComponentSwa, 10, 0, 0, 0}, 4);
  EXPECT_EQ(rules[0].kind, GroupKind::kFull);
  EXPECT_EQ(rules[1].kind, GroupKind::kSlidingWindow);
  EXPECT_EQ(rules[1].window_blocks, 3u);
  EXPECT_EQ(rules[2].kind, GroupKind::kNone);
}

}  // namespace
}  // namespace prefixd
