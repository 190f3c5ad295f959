#include "index/fleet_index.h"

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/extra_keys.h"
#include "index/keys.h"

namespace prefixd {

// What tests read and set of a FleetIndex that its users do not.
class FleetIndexTestPeer {
 public:
  static FleetIndex::HoldStats HoldStatsOf(const FleetIndex& index) {
    return index.hold_stats();
  }
  static void SetBetweenSlices(FleetIndex& index, std::function<void()> hook) {
    index.SetBetweenSlicesForTest(std::move(hook));
  }
};

namespace {

using ::testing::HasSubstr;

constexpr int kBs = 4;

// Block `b` of a test prompt: kBs tokens that name it.
std::vector<Token> BlockTokens(Token b) {
  return {b * 10 + 1, b * 10 + 2, b * 10 + 3, b * 10 + 4};
}

// An engine's chained hash: the hash of every block up to this one.
EngineHash ChainHash(const std::vector<Token>& path_blocks) {
  return absl::Hash<std::vector<Token>>()(path_blocks) | 1;
}

// BlockStored for blocks `blocks` after `parent_path` (the blocks before).
BlockStoredEvent Stored(const std::vector<Token>& parent_path,
                        const std::vector<Token>& blocks,
                        std::string medium = "GPU") {
  BlockStoredEvent ev;
  std::vector<Token> path = parent_path;
  if (!parent_path.empty()) ev.parent_block_hash = ChainHash(parent_path);
  for (Token b : blocks) {
    path.push_back(b);
    ev.block_hashes.push_back(ChainHash(path));
    for (Token t : BlockTokens(b)) ev.token_ids.push_back(t);
  }
  ev.block_size = kBs;
  ev.medium = std::move(medium);
  ev.chain_blocks = blocks.size();
  return ev;
}

BlockRemovedEvent Removed(const std::vector<std::vector<Token>>& paths,
                          std::string medium = "GPU") {
  BlockRemovedEvent ev;
  for (const auto& p : paths) ev.block_hashes.push_back(ChainHash(p));
  ev.medium = std::move(medium);
  return ev;
}

std::vector<Token> Prompt(const std::vector<Token>& blocks) {
  std::vector<Token> out;
  for (Token b : blocks)
    for (Token t : BlockTokens(b)) out.push_back(t);
  return out;
}

class FleetIndexTest : public ::testing::Test {
 protected:
  FleetIndexTest() : index_(IndexOptions{kBs, 1000000}) {
    w0_ = index_.AddWorker("w0", "tcp://a:1");
    w1_ = index_.AddWorker("w1", "tcp://b:1");
  }

  void Apply(WorkerId w, std::vector<KvEvent> events) {
    KvEventBatch batch;
    batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    batch.events = std::move(events);
    index_.Apply(w, batch, ++seq_[w], absl::Now());
    const absl::Status invariants = index_.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << invariants;
  }

  // matched_blocks per worker name, every worker listed.
  std::map<std::string, uint64_t> Route(const std::vector<Token>& blocks,
                                        absl::string_view salt = "",
                                        absl::string_view lora = "") {
    return RouteTokens(Prompt(blocks), salt, lora);
  }
  std::map<std::string, uint64_t> RouteTokens(const std::vector<Token>& tokens,
                                              absl::string_view salt = "",
                                              absl::string_view lora = "") {
    RouteQuery q;
    q.tokens = tokens;
    q.cache_salt = salt;
    q.lora_name = lora;
    q.filter.all_workers = true;
    std::map<std::string, uint64_t> out;
    for (const WorkerMatch& m : index_.Route(q).workers)
      out[std::string(m.worker)] = m.matched_blocks;
    return out;
  }

  FleetIndex index_;
  WorkerId w0_, w1_;
  std::map<WorkerId, int64_t> seq_;
};

// Route lists the most matched blocks first, then by name, whatever order
// the workers were added in (a name added between others shifts their
// places) and whether they are retired and back.
TEST_F(FleetIndexTest, AnswersTieByName) {
  std::vector<WorkerId> ids = {w0_, w1_};
  for (const char* name : {"b", "w10", "a", "w05", "c"})
    ids.push_back(index_.AddWorker(name, "tcp://c:1"));
  for (WorkerId id : ids) Apply(id, {Stored({}, {1, 2})});
  Apply(ids[4], {Stored({1, 2}, {3})});  // "a" holds one more
  index_.RetireWorker(ids[2]);           // "b" leaves and comes back
  Apply(index_.AddWorker("b", "tcp://c:1"), {Stored({}, {1})});
  const WorkerId late = index_.AddWorker("a0", "tcp://c:1");
  std::vector<Token> tokens = Prompt({1, 2, 3});
  RouteQuery q;
  q.tokens = tokens;
  q.filter.all_workers = true;
  std::vector<std::string> order;
  std::vector<uint64_t> blocks;
  for (const WorkerMatch& m : index_.Route(q).workers) {
    order.emplace_back(m.worker);
    blocks.push_back(m.matched_blocks);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"a", "c", "w0", "w05", "w1", "w10",
                                             "b", "a0"}));
  EXPECT_EQ(blocks, (std::vector<uint64_t>{3, 2, 2, 2, 2, 2, 1, 0}));
  EXPECT_NE(late, ids[2]);
}

// A hash report joins the block a worker stored with tokens, so Route by
// tokens sees the reporter, and it still does for a second reporter after
// the storer and the first reporter let it go (the report finds the block
// in whichever worker still holds it).
TEST_F(FleetIndexTest, HashReportsJoinATokenedBlockWhoeverStillHoldsIt) {
  const WorkerId a = index_.AddWorker("a", "kv_indexer");
  const WorkerId b = index_.AddWorker("b", "kv_indexer");
  const WorkerId c = index_.AddWorker("c", "kv_indexer");
  Apply(w0_, {Stored({}, {1, 2})});
  const std::vector<EngineHash> hashes = {ChainHash({1}), ChainHash({1, 2})};
  auto report = [&](WorkerId w, HashUpdate::Op op) {
    HashUpdate u;
    u.op = op;
    u.medium = "GPU";
    u.hashes = hashes;
    index_.ApplyHashes(w, {u});
    const absl::Status invariants = index_.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << invariants;
  };
  report(a, HashUpdate::Op::kReport);
  Apply(w0_, {Removed({{1, 2}, {1}})});
  report(b, HashUpdate::Op::kReport);
  report(a, HashUpdate::Op::kRevoke);
  report(c, HashUpdate::Op::kReport);
  EXPECT_EQ(Route({1, 2}),
            (std::map<std::string, uint64_t>{
                {"a", 0}, {"b", 2}, {"c", 2}, {"w0", 0}, {"w1", 0}}));
}

// EndpointOf: AddWorker's last endpoint while the worker is followed;
// nothing for a name never added or a retired worker.
TEST_F(FleetIndexTest, EndpointOfIsTheLastAddWhileFollowed) {
  EXPECT_EQ(index_.EndpointOf("nobody"), std::nullopt);
  const WorkerId w = index_.AddWorker("e", "tcp://first:1");
  EXPECT_EQ(index_.EndpointOf("e"), "tcp://first:1");
  index_.AddWorker("e", "tcp://second:2");
  EXPECT_EQ(index_.EndpointOf("e"), "tcp://second:2");
  index_.RetireWorker(w);
  EXPECT_EQ(index_.EndpointOf("e"), std::nullopt);
  EXPECT_EQ(index_.AddWorker("e", "kv_indexer"), w);
  EXPECT_EQ(index_.EndpointOf("e"), "kv_indexer");
  EXPECT_EQ(index_.EndpointOf("E"), std::nullopt);  // names are exact
}

// lag_ms: now less the engine's timestamp of the last batch applied,
// whole milliseconds, never negative; 0 before any batch.
TEST_F(FleetIndexTest, LagIsNowLessTheLastBatchsTimestamp) {
  const double now_s = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  KvEventBatch batch;
  batch.ts = now_s - 2.5;
  batch.events.push_back(Stored({}, {1}));
  index_.Apply(w0_, batch, 1, absl::Now());
  KvEventBatch ahead;  // a clock ahead of ours
  ahead.ts = now_s + 60;
  ahead.events.push_back(Stored({}, {1}));
  index_.Apply(w1_, ahead, 1, absl::Now());
  const WorkerId idle = index_.AddWorker("idle", "tcp://c:1");
  EXPECT_NE(idle, w0_);
  std::vector<Token> tokens = Prompt({1});
  RouteQuery q;
  q.tokens = tokens;
  q.filter.all_workers = true;
  std::map<std::string, int64_t> lag;
  for (const WorkerMatch& m : index_.Route(q).workers)
    lag[std::string(m.worker)] = m.lag_ms;
  EXPECT_GE(lag["w0"], 2500);
  EXPECT_LT(lag["w0"], 2500 + 60000);  // however slow the machine
  EXPECT_EQ(lag["w1"], 0);
  EXPECT_EQ(lag["idle"], 0);
  for (const WorkerStatus& s : index_.Stats().workers) {
    if (s.worker == "w0") {
      EXPECT_GE(s.lag_ms, lag["w0"]);
    }
  }
}

// An engine that names every block of a new chain by one hash (a broken
// publisher, or folded hashes that collide): the hash names the chain's last
// block, the blocks before it lose the worker, and the index stays whole.
// Before every new block was held ahead of its hash, moving the hash off
// the first block pruned the blocks after it that were not held yet, and
// the index counted entries no block had.
TEST_F(FleetIndexTest, AChainThatRepeatsAHashHoldsItsLastBlock) {
  BlockStoredEvent ev = Stored({}, {1, 2, 3, 4});
  ev.block_hashes.assign(4, 77);
  Apply(w0_, {ev});
  EXPECT_EQ(index_.Stats().entries, 1u);
  EXPECT_EQ(index_.Stats().blocks, 4u);
  EXPECT_EQ(Route({1, 2, 3, 4})["w0"], 0u);  // its first blocks are nobody's
  BlockRemovedEvent gone;
  gone.block_hashes = {77};
  Apply(w0_, {gone});
  EXPECT_EQ(index_.Stats().entries, 0u);
  EXPECT_EQ(index_.Stats().blocks, 0u);
}

// A store longer than a slice goes in slices, each chained to the last
// block of the one before by that block's hash. When that hash repeats an
// earlier block's, it names the later block (the last one mapped), so the
// next slice still hangs below it.
TEST_F(FleetIndexTest, ASliceBoundaryOnARepeatedHashKeepsTheChain) {
  const size_t n = FleetIndex::kSliceBlocks + 8;
  BlockStoredEvent ev;
  for (size_t b = 0; b < n; ++b) {
    ev.block_hashes.push_back(1000 + b);
    for (Token t : BlockTokens(static_cast<Token>(b + 1)))
      ev.token_ids.push_back(t);
  }
  ev.block_hashes[FleetIndex::kSliceBlocks - 1] = 1007;  // block 7's too
  ev.block_size = kBs;
  ev.chain_blocks = n;
  Apply(w0_, {ev});
  EXPECT_GE(FleetIndexTestPeer::HoldStatsOf(index_).yields, 1u);  // sliced
  // Every block but block 7, which lost the worker to its hash's repeat.
  EXPECT_EQ(index_.Stats().entries, n - 1);
  EXPECT_EQ(index_.Stats().blocks, n);
  EXPECT_EQ(
      index_.Stats().dropped[static_cast<int>(DropReason::kUnknownParent)], 0u);
}

// A report whose hashes another worker stored with tokens moves the
// reporter's hold of them off its detached blocks; when that empties the
// detached blocks' tree, the tree goes, and a later hash of the same report
// that nobody holds must start a new one. Before, the report kept using
// the freed tree (a heap-use-after-free under ASan; found by
// fleet_index_fuzzer).
TEST_F(FleetIndexTest, AReportThatEmptiesTheDetachedTreeStartsANewOne) {
  const std::vector<Token> path = {1, 2};
  const EngineHash x = ChainHash({1}), y = ChainHash({1, 2}), z = 99;
  HashUpdate u;
  u.hashes = absl::MakeConstSpan(&y, 1);
  index_.ApplyHashes(w0_, {u});    // w0: y, detached
  Apply(w1_, {Stored({}, path)});  // w1: x and y, with tokens
  const std::vector<EngineHash> report = {x, y, z};
  u.hashes = report;
  index_.ApplyHashes(w0_, {u});
  const absl::Status invariants = index_.CheckInvariants();
  ASSERT_TRUE(invariants.ok()) << invariants;
  EXPECT_EQ(Route(path)["w0"], 2u);  // x and y where w1 holds them
  const std::vector<HashHolding> held = index_.HashHoldings({z});
  ASSERT_EQ(held.size(), 1u);  // z, detached
  EXPECT_EQ(held[0].worker, "w0");
}

// A store whose parent the worker reported by its hash alone (a detached
// block: no tokens say what it holds) cannot be placed: its blocks are
// dropped as of an unknown parent, and the detached block stays one that
// its hash finds. Before, the chain was hung below the detached block.
TEST_F(FleetIndexTest, AStoreBelowAReportedHashIsOfAnUnknownParent) {
  const EngineHash reported = 4242;
  HashUpdate u;
  u.hashes = absl::MakeConstSpan(&reported, 1);
  index_.ApplyHashes(w0_, {u});
  BlockStoredEvent ev = Stored({}, {1, 2});
  ev.parent_block_hash = reported;
  Apply(w0_, {ev});
  const IndexStats st = index_.Stats();
  EXPECT_EQ(st.dropped[static_cast<int>(DropReason::kUnknownParent)], 2u);
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(Route({1, 2})["w0"], 0u);
}

TEST_F(FleetIndexTest, StoredChainMatchesItsWorkerOnly) {
  Apply(w0_, {Stored({}, {1, 2, 3})});
  EXPECT_EQ(Route({1, 2, 3, 4}),
            (std::map<std::string, uint64_t>{{"w0", 3}, {"w1", 0}}));
  RouteQuery q;
  std::vector<Token> tokens = Prompt({1, 2});
  q.tokens = tokens;
  RouteResult r = index_.Route(q);
  EXPECT_EQ(r.best_worker, "w0");
  EXPECT_EQ(r.prompt_blocks, 2u);
  ASSERT_EQ(r.workers.size(), 1u);  // w1 holds none of it
  EXPECT_EQ(r.workers[0].state, WorkerState::kLive);
  q.filter.all_workers = true;
  r = index_.Route(q);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[1].state, WorkerState::kConnecting);
  EXPECT_EQ(index_.Stats().entries, 3u);
}

// An answer lists the workers with a matched block, sorted; all_workers
// lists the others too (matched_blocks 0), and a `workers` filter lists
// every named worker that exists, matched or not.
TEST_F(FleetIndexTest, RouteListsMatchedWorkersUnlessAsked) {
  const WorkerId w2 = index_.AddWorker("w2", "tcp://w2");
  Apply(w2, {Stored({}, {1, 2})});
  Apply(w0_, {Stored({}, {1})});
  std::vector<Token> tokens = Prompt({1, 2});
  RouteQuery q;
  q.tokens = tokens;
  auto names = [&] {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const WorkerMatch& m : index_.Route(q).workers)
      out.emplace_back(std::string(m.worker), m.matched_blocks);
    return out;
  };
  using Listed = std::vector<std::pair<std::string, uint64_t>>;
  EXPECT_EQ(names(), (Listed{{"w2", 2}, {"w0", 1}}));
  q.filter.all_workers = true;
  EXPECT_EQ(names(), (Listed{{"w2", 2}, {"w0", 1}, {"w1", 0}}));
  q.filter.all_workers = false;
  q.filter.workers = {"w1", "w0", "nobody"};
  EXPECT_EQ(names(), (Listed{{"w0", 1}, {"w1", 0}}));
  // No holder at all: an empty list, no best worker.
  std::vector<Token> other = Prompt({9});
  q.tokens = other;
  q.filter.workers.clear();
  const RouteResult none = index_.Route(q);
  EXPECT_TRUE(none.workers.empty());
  EXPECT_EQ(none.best_worker, "");
  EXPECT_EQ(none.prompt_blocks, 1u);
}

TEST_F(FleetIndexTest, OnlyWholeBlocksOfThePromptCount) {
  Apply(w0_, {Stored({}, {1, 2})});
  std::vector<Token> tokens = Prompt({1, 2});
  tokens.pop_back();  // the second block is no longer whole
  RouteQuery q;
  q.tokens = tokens;
  EXPECT_EQ(index_.Route(q).workers[0].matched_blocks, 1u);
}

TEST_F(FleetIndexTest, SharedPrefixListsEveryHolder) {
  Apply(w0_, {Stored({}, {1, 2, 3})});
  Apply(w1_, {Stored({}, {1, 2, 5})});
  EXPECT_EQ(Route({1, 2, 3}),
            (std::map<std::string, uint64_t>{{"w0", 3}, {"w1", 2}}));
  EXPECT_EQ(Route({1, 2, 5, 6}),
            (std::map<std::string, uint64_t>{{"w0", 2}, {"w1", 3}}));
  // Blocks 1 and 2 have two holders each: 6 entries over 4 blocks.
  EXPECT_EQ(index_.Stats().entries, 6u);
  EXPECT_EQ(index_.Stats().blocks, 4u);
}

TEST_F(FleetIndexTest, StoredEventExtendsItsParent) {
  Apply(w0_, {Stored({}, {1, 2})});
  Apply(w0_, {Stored({1, 2}, {3, 4})});
  EXPECT_EQ(Route({1, 2, 3, 4})["w0"], 4u);
  // A parent inside a node: the edge splits.
  Apply(w1_, {Stored({}, {1})});
  Apply(w1_, {Stored({1}, {7})});
  EXPECT_EQ(Route({1, 7})["w1"], 2u);
  EXPECT_EQ(Route({1, 2, 3, 4})["w0"], 4u);
}

TEST_F(FleetIndexTest, UnknownParentDropsTheEventsBlocks) {
  Apply(w0_, {Stored({}, {1})});
  // w1 never stored block 1: its child cannot be placed.
  Apply(w1_, {Stored({1}, {2, 3})});
  EXPECT_EQ(Route({1, 2, 3})["w1"], 0u);
  IndexStats s = index_.Stats();
  EXPECT_EQ(s.dropped[static_cast<int>(DropReason::kUnknownParent)], 2u);
  EXPECT_EQ(s.workers[1].dropped_blocks, 2u);
}

TEST_F(FleetIndexTest, RemovalDropsTheHolderAndPrunesEmptyLeaves) {
  Apply(w0_, {Stored({}, {1, 2, 3})});
  Apply(w1_, {Stored({}, {1, 2})});
  Apply(w0_, {Removed({{1, 2, 3}})});
  EXPECT_EQ(Route({1, 2, 3})["w0"], 2u);
  EXPECT_EQ(index_.Stats().blocks, 2u);
  // w0 drops block 2 (the middle of its path): block 1 still counts.
  Apply(w0_, {Removed({{1, 2}})});
  EXPECT_EQ(Route({1, 2})["w0"], 1u);
  EXPECT_EQ(Route({1, 2})["w1"], 2u);
  Apply(w1_, {Removed({{1, 2}, {1}})});
  Apply(w0_, {Removed({{1}})});
  EXPECT_EQ(index_.Stats().entries, 0u);
  EXPECT_EQ(index_.Stats().blocks, 0u);
  EXPECT_EQ(index_.Stats().nodes, 0u);
}

TEST_F(FleetIndexTest, BlockWithoutHoldersStaysWhileAChildIsHeld) {
  Apply(w0_, {Stored({}, {1, 2, 3})});
  Apply(w0_, {Removed({{1}})});
  // The worker holds 2 and 3 but not 1: its run from the start is 0.
  EXPECT_EQ(Route({1, 2, 3})["w0"], 0u);
  EXPECT_EQ(index_.Stats().blocks, 3u);
  Apply(w0_, {Removed({{1, 2, 3}, {1, 2}})});
  EXPECT_EQ(index_.Stats().blocks, 0u);
}

TEST_F(FleetIndexTest, MediumsAreHoldersOfTheirOwn) {
  Apply(w0_, {Stored({}, {1, 2, 3}, "GPU")});
  Apply(w0_, {Stored({}, {1, 2}, "CPU")});
  RouteQuery q;
  std::vector<Token> tokens = Prompt({1, 2, 3});
  q.tokens = tokens;
  RouteResult r = index_.Route(q);
  ASSERT_EQ(r.workers[0].worker, "w0");
  EXPECT_EQ(r.workers[0].matched_blocks, 3u);
  ASSERT_EQ(r.workers[0].mediums.size(), 2u);
  EXPECT_EQ(r.workers[0].mediums[0].medium, "GPU");
  EXPECT_EQ(r.workers[0].mediums[0].blocks, 3u);
  EXPECT_EQ(r.workers[0].mediums[1].medium, "CPU");
  EXPECT_EQ(r.workers[0].mediums[1].blocks, 2u);
  // Losing the GPU copy of block 1: the CPU copy keeps the run going (any
  // medium counts), while the GPU run now ends before block 1.
  Apply(w0_, {Removed({{1}}, "GPU")});
  r = index_.Route(q);
  EXPECT_EQ(r.workers[0].matched_blocks, 3u);
  ASSERT_EQ(r.workers[0].mediums.size(), 1u);
  EXPECT_EQ(r.workers[0].mediums[0].medium, "CPU");
  EXPECT_EQ(r.workers[0].mediums[0].blocks, 2u);
  // Storing a block again in the same medium changes nothing.
  const uint64_t before = index_.Stats().entries;
  Apply(w0_, {Stored({}, {1, 2}, "CPU")});
  EXPECT_EQ(index_.Stats().entries, before);
}

// vLLM's offloading connector announces a block it copied to the CPU as a
// placeholder: the block's engine hash, no tokens, no parent. The index
// gives the CPU tier the block the worker's GPU store named by that hash.
// EAGLE's bigram blocks (SGLang under speculative decoding) cover their
// tokens and the one after them: a prompt matches one only with that token
// too, and a plain worker holding the same tokens is matched as before.
TEST_F(FleetIndexTest, EaglesBigramBlocksMatchWithTheTokenAfterThem) {
  BlockStoredEvent eagle = Stored({}, {1, 2, 3});
  eagle.bigram = true;
  eagle.content = WithNextTokens(nullptr, eagle.token_ids, kBs, 3,
                                 /*after=*/BlockTokens(4)[0]);
  Apply(w0_, {eagle});
  Apply(w1_, {Stored({}, {1, 2, 3})});
  using Matches = std::map<std::string, uint64_t>;
  EXPECT_EQ(RouteTokens(Prompt({1, 2, 3, 4})), (Matches{{"w0", 3}, {"w1", 3}}));
  // Nothing after block 3, or another token: its bigram block is not
  // the engine's.
  EXPECT_EQ(RouteTokens(Prompt({1, 2, 3})), (Matches{{"w0", 2}, {"w1", 3}}));
  std::vector<Token> other = Prompt({1, 2, 3});
  other.push_back(99);
  EXPECT_EQ(RouteTokens(other), (Matches{{"w0", 2}, {"w1", 3}}));
  EXPECT_EQ(RouteTokens(Prompt({1, 2, 5})), (Matches{{"w0", 1}, {"w1", 2}}));
  // Removed by the engine's hash, as any block.
  Apply(w0_, {Removed({{1, 2, 3}})});
  EXPECT_EQ(RouteTokens(Prompt({1, 2, 3, 4})), (Matches{{"w0", 2}, {"w1", 3}}));
  EXPECT_EQ(index_.Stats().blocks, 5u);
}

// SGLang names a salted request's salt in every store, the root's and its
// children's: a child is kept only in its parent's namespace.
TEST_F(FleetIndexTest, AChildStoreNamingASaltIsKeptInItsParentsNamespace) {
  BlockStoredEvent root = Stored({}, {1});
  root.cache_salt = "a";
  BlockStoredEvent child = Stored({1}, {2});
  child.cache_salt = "a";
  BlockStoredEvent stray = Stored({1}, {3});
  stray.cache_salt = "b";
  Apply(w0_, {root, child, stray});
  EXPECT_EQ(Route({1, 2}, "a")["w0"], 2u);
  EXPECT_EQ(Route({1, 3}, "a")["w0"], 1u);
  EXPECT_EQ(Route({1, 3}, "b")["w0"], 0u);
  EXPECT_EQ(Route({1, 2})["w0"], 0u);
  EXPECT_EQ(index_.Stats().dropped[static_cast<int>(DropReason::kExtraKeys)],
            1u);
}

TEST_F(FleetIndexTest, APlaceholderStoreIsTheHashsBlockInAnotherTier) {
  Apply(w0_, {Stored({}, {1, 2, 3})});
  const auto placeholder = [](std::vector<std::vector<Token>> paths) {
    BlockStoredEvent ev;
    for (const auto& p : paths) ev.block_hashes.push_back(ChainHash(p));
    ev.placeholder = true;
    ev.medium = "CPU";
    ev.chain_blocks = ev.block_hashes.size();
    return ev;
  };
  // Block 2 alone: the CPU run from the prompt's start is still 0.
  Apply(w0_, {placeholder({{1, 2}})});
  RouteQuery q;
  std::vector<Token> tokens = Prompt({1, 2, 3});
  q.tokens = tokens;
  RouteResult r = index_.Route(q);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].matched_blocks, 3u);
  ASSERT_EQ(r.workers[0].mediums.size(), 1u);  // GPU only
  // Block 1 too, and a hash the worker never stored (dropped).
  Apply(w0_, {placeholder({{1}, {7}})});
  EXPECT_EQ(index_.Stats().dropped[static_cast<int>(DropReason::kUnknownHash)],
            1u);
  // The GPU copies go: the CPU ones keep the first two blocks.
  Apply(w0_, {Removed({{1}, {1, 2}, {1, 2, 3}}, "GPU")});
  r = index_.Route(q);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].matched_blocks, 2u);
  ASSERT_EQ(r.workers[0].mediums.size(), 1u);
  EXPECT_EQ(r.workers[0].mediums[0].medium, "CPU");
  EXPECT_EQ(r.workers[0].mediums[0].blocks, 2u);
  ASSERT_TRUE(index_.CheckInvariants().ok());
  // The CPU's own removals reach them by the same hashes.
  Apply(w0_, {Removed({{1}, {1, 2}}, "CPU")});
  EXPECT_TRUE(index_.Route(q).workers.empty());
  EXPECT_EQ(index_.Stats().entries, 0u);
  // A placeholder is not a block of another size (a GPU store of 16 tokens
  // per block beside the offloaded 256): nothing to reject.
  Apply(w0_, {Stored({}, {1})});
  BlockStoredEvent sized = placeholder({{1}});
  sized.block_size = 256;
  Apply(w0_, {sized});
  r = index_.Route(q);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].state, WorkerState::kLive);
  EXPECT_EQ(r.workers[0].mediums.size(), 2u);
}

TEST_F(FleetIndexTest, NamespacesNeverMeet) {
  BlockStoredEvent salted = Stored({}, {1, 2});
  salted.cache_salt = "A";
  Apply(w0_, {salted});
  BlockStoredEvent lora = Stored({}, {1, 2});
  lora.lora_name = "adapter";
  Apply(w1_, {lora});
  EXPECT_EQ(Route({1, 2}, "A")["w0"], 2u);
  EXPECT_EQ(Route({1, 2}, "B")["w0"], 0u);
  EXPECT_EQ(Route({1, 2})["w0"], 0u);
  EXPECT_EQ(Route({1, 2})["w1"], 0u);
  EXPECT_EQ(Route({1, 2}, "", "adapter")["w1"], 2u);
  EXPECT_EQ(Route({1, 2}, "A", "adapter")["w1"], 0u);
  // A child event inherits the namespace of its parent.
  Apply(w0_, {Stored({1, 2}, {3})});
  EXPECT_EQ(Route({1, 2, 3}, "A")["w0"], 3u);
  EXPECT_EQ(Route({1, 2, 3})["w0"], 0u);
}

TEST_F(FleetIndexTest, LoraIdNamesTheNamespaceWithoutAName) {
  BlockStoredEvent ev = Stored({}, {1});
  ev.lora_id = 7;
  Apply(w0_, {ev});
  RouteQuery q;
  std::vector<Token> tokens = Prompt({1});
  q.tokens = tokens;
  q.lora_id = 7;
  EXPECT_EQ(index_.Route(q).best_worker, "w0");
  q.lora_id = 8;
  EXPECT_EQ(index_.Route(q).best_worker, "");
}

TEST_F(FleetIndexTest, AllBlocksClearedEmptiesTheWorker) {
  Apply(w0_, {Stored({}, {1, 2})});
  Apply(w1_, {Stored({}, {1, 2})});
  Apply(w0_, {AllBlocksClearedEvent{}});
  EXPECT_EQ(Route({1, 2}),
            (std::map<std::string, uint64_t>{{"w0", 0}, {"w1", 2}}));
  EXPECT_EQ(index_.Stats()
                .workers[0]
                .clears[static_cast<int>(ClearReason::kAllBlocksCleared)],
            1u);
  // Its old hashes name nothing any more: a child of them is dropped.
  Apply(w0_, {Stored({1, 2}, {3})});
  EXPECT_EQ(Route({1, 2, 3})["w0"], 0u);
}

TEST_F(FleetIndexTest, WrongBlockSizePutsTheWorkerInError) {
  Apply(w0_, {Stored({}, {1})});
  BlockStoredEvent bad = Stored({}, {2});
  bad.block_size = 16;
  Apply(w0_, {bad});
  IndexStats s = index_.Stats();
  EXPECT_EQ(s.workers[0].state, WorkerState::kError);
  EXPECT_THAT(s.workers[0].state_detail, HasSubstr("block_size 16"));
  EXPECT_THAT(s.workers[0].state_detail, HasSubstr("is 4"));
  EXPECT_EQ(Route({1})["w0"], 0u);  // cleared
  // The right size again: LIVE, rebuilt from new events.
  Apply(w0_, {Stored({}, {1})});
  EXPECT_EQ(index_.Stats().workers[0].state, WorkerState::kLive);
  EXPECT_EQ(Route({1})["w0"], 1u);
}

TEST_F(FleetIndexTest, ExtraKeysEndTheChain) {
  BlockStoredEvent ev = Stored({}, {1, 2, 3});
  ev.chain_blocks = 1;  // block 2 carried a multimodal key
  Apply(w0_, {ev});
  EXPECT_EQ(Route({1, 2, 3})["w0"], 1u);
  EXPECT_EQ(index_.Stats().dropped[static_cast<int>(DropReason::kExtraKeys)],
            2u);
}

// Older vLLM: several groups, none with a kind. Group 0 is routed, the
// others skipped, even when one of them comes first in the batch.
TEST_F(FleetIndexTest, OtherKvCacheGroupsAreSkipped) {
  BlockStoredEvent ev = Stored({}, {1});
  ev.group_idx = 1;
  BlockStoredEvent other = Stored({}, {2});
  other.group_idx = 1;
  Apply(w0_, {other, Stored({}, {1})});
  EXPECT_EQ(Route({2})["w0"], 0u);
  Apply(w0_, {ev});
  BlockRemovedEvent rm = Removed({{1}});
  rm.group_idx = 1;
  Apply(w0_, {rm});  // a group-1 removal must not touch group 0's block
  EXPECT_EQ(Route({1})["w0"], 1u);
  EXPECT_EQ(index_.Stats().dropped[static_cast<int>(DropReason::kGroup)], 2u);
}

// TensorRT-LLM publishes one layer group, its largest attention window's,
// and names it: whatever its index, the engine is routed by it. A store
// into group 0 later makes group 0 the routed one, as for older vLLM.
// Mooncake's store master names each object's tenant, and a registration
// follows its stream for one tenant: events about another tenant's objects
// change nothing of the worker's (stores dropped as other_tenant), and
// events naming no tenant, or the worker's, apply as before.
TEST_F(FleetIndexTest, EventsOfAnotherTenantAreSkipped) {
  WorkerLabels labels;
  labels.tenant = "acme";
  index_.SetLabels(w0_, labels);
  BlockStoredEvent other = Stored({}, {1, 2});
  other.tenant = "globex";
  Apply(w0_, {other});
  EXPECT_EQ(Route({1, 2})["w0"], 0u);
  EXPECT_EQ(index_.Stats().dropped[static_cast<int>(DropReason::kOtherTenant)],
            2u);
  BlockStoredEvent own = Stored({}, {1, 2});
  own.tenant = "acme";
  Apply(w0_, {own, Stored({1, 2}, {3})});  // the second names no tenant
  EXPECT_EQ(Route({1, 2, 3})["w0"], 3u);
  BlockRemovedEvent removed = Removed({{1, 2, 3}});
  removed.tenant = "globex";
  AllBlocksClearedEvent cleared;
  cleared.tenant = "globex";
  Apply(w0_, {removed, cleared});
  EXPECT_EQ(Route({1, 2, 3})["w0"], 3u);
  cleared.tenant = "acme";
  Apply(w0_, {cleared});
  EXPECT_EQ(Route({1, 2, 3})["w0"], 0u);
  // A worker without a tenant label is the default tenant's.
  BlockStoredEvent dflt = Stored({}, {4});
  dflt.tenant = "default";
  Apply(w1_, {dflt});
  EXPECT_EQ(Route({4})["w1"], 1u);
}

TEST_F(FleetIndexTest, AnEngineNamingOneGroupIsRoutedByIt) {
  BlockStoredEvent ev = Stored({}, {1, 2, 3});
  ev.group_idx = 2;
  Apply(w0_, {ev});
  EXPECT_EQ(Route({1, 2, 3})["w0"], 3u);
  BlockRemovedEvent rm = Removed({{1, 2, 3}});
  rm.group_idx = 2;
  Apply(w0_, {rm});
  EXPECT_EQ(Route({1, 2, 3})["w0"], 2u);
  EXPECT_EQ(index_.Stats().dropped[static_cast<int>(DropReason::kGroup)], 0u);
  // A group 0 store, and the group it named is skipped from then on.
  Apply(w0_, {Stored({}, {7})});
  BlockStoredEvent late = Stored({}, {8});
  late.group_idx = 2;
  Apply(w0_, {late});
  EXPECT_EQ(Route({7})["w0"], 1u);
  EXPECT_EQ(Route({8})["w0"], 0u);
  EXPECT_EQ(index_.Stats().dropped[static_cast<int>(DropReason::kGroup)], 1u);
  // A store of another block size in the routed group is caught as group
  // 0's would be.
  BlockStoredEvent bad = Stored({}, {9});
  bad.group_idx = 2;
  bad.block_size = 16;
  Apply(w1_, {bad});
  EXPECT_EQ(index_.Stats().workers[1].state, WorkerState::kError);
}

TEST_F(FleetIndexTest, WorkerFilterAndOrder) {
  Apply(w0_, {Stored({}, {1})});
  Apply(w1_, {Stored({}, {1, 2})});
  RouteQuery q;
  std::vector<Token> tokens = Prompt({1, 2});
  q.tokens = tokens;
  RouteResult r = index_.Route(q);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[0].worker, "w1");
  EXPECT_EQ(r.best_worker, "w1");
  q.filter.workers = {"w0"};
  r = index_.Route(q);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.best_worker, "w0");
}

TEST_F(FleetIndexTest, RetiredWorkerLeavesRouteAndComesBack) {
  Apply(w1_, {Stored({}, {1})});
  index_.RetireWorker(w1_);
  EXPECT_EQ(Route({1}).count("w1"), 0u);
  EXPECT_EQ(index_.Stats().entries, 0u);
  EXPECT_EQ(index_.AddWorker("w1", "tcp://b:1"), w1_);
  EXPECT_EQ(Route({1})["w1"], 0u);
}

TEST_F(FleetIndexTest, ContentKeysArePartOfTheBlock) {
  BlockStoredEvent ev = Stored({}, {1, 2, 3});
  ContentKey image;
  image.kind = ContentKey::Kind::kMultiModal;
  image.id = "img-7";
  image.offset = 2;
  // Block 1 carries the image: [] [img] [].
  ev.content.keys = {image};
  ev.content.begin = {0, 0, 1, 1};
  Apply(w0_, {ev});
  std::vector<Token> tokens = Prompt({1, 2, 3});
  RouteQuery q;
  q.tokens = tokens;
  // Without the image the prompt matches only up to it.
  EXPECT_EQ(index_.Route(q).workers[0].matched_blocks, 1u);
  BlockContent content;
  content.keys = {image};
  content.begin = {0, 0, 1, 1};
  q.content = &content;
  EXPECT_EQ(index_.Route(q).workers[0].matched_blocks, 3u);
  // Another image, or the same one at another offset, is another block.
  content.keys[0].offset = 3;
  EXPECT_EQ(index_.Route(q).workers[0].matched_blocks, 1u);
  content.keys[0].offset = 2;
  content.keys[0].id = "img-8";
  EXPECT_EQ(index_.Route(q).workers[0].matched_blocks, 1u);
}

TEST(FleetIndexBounds, EngineHashesStayNearMaxEntriesWhileTrimming) {
  // One worker stores 20,000 distinct blocks into an index of 1,000
  // entries: max_entries drops most of them, and the worker's engine-hash
  // map must not keep a hash for every one it ever stored.
  FleetIndex index(IndexOptions{kBs, 1000});
  const WorkerId w = index.AddWorker("w", "tcp://a:1");
  for (Token b = 1; b <= 20000; ++b) {
    KvEventBatch batch;
    batch.ts = 1.7e9;
    batch.events.push_back(Stored({}, {b}));
    index.Apply(w, batch, b, absl::Now());
  }
  const IndexStats stats = index.Stats();
  EXPECT_LE(stats.entries, 1000u);
  EXPECT_LE(stats.engine_hashes, 2 * 1000u + 4096u);
  EXPECT_GE(stats.engine_hashes, stats.entries);
  ASSERT_TRUE(index.CheckInvariants().ok());
  // The hashes it still holds still remove their blocks.
  KvEventBatch removal;
  removal.ts = 1.7e9;
  removal.events.push_back(Removed({{20000}}));
  index.Apply(w, removal, 20001, absl::Now());
  EXPECT_EQ(index.Stats().entries, stats.entries - 1);
}

// max_entries trims the least recent leaves; a node they leave childless
// may end in a block that lost its holders while it had children, which
// goes too, so that no leaf ends in a block nobody holds. Here [1 2] keeps
// block 2 only as the path to 3 and 4: trimming them leaves [1]. Before,
// [1 2] was left a leaf ending in block 2 (CheckInvariants failed), found
// by fleet_index_fuzzer.
TEST(FleetIndexBounds, TrimmingLeavesNoLeafEndingInAnUnheldBlock) {
  FleetIndex index(IndexOptions{kBs, 6});
  const WorkerId a = index.AddWorker("a", ""), b = index.AddWorker("b", ""),
                 c = index.AddWorker("c", "");
  int64_t seq = 0;
  const auto apply = [&](WorkerId w, KvEvent e) {
    KvEventBatch batch;
    batch.events.push_back(std::move(e));
    index.Apply(w, batch, seq++, absl::Now());
    const absl::Status invariants = index.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << invariants;
  };
  apply(a, Stored({}, {1, 2, 3}));
  apply(b, Stored({}, {1, 2, 4}));
  apply(a, Removed({{1, 2}}));
  apply(b, Removed({{1, 2}}));         // [1 2] holds 2 for nobody
  apply(c, Stored({}, {5, 6, 7, 8}));  // 8 entries: 3 and 4 go
  EXPECT_EQ(index.Stats().entries, 6u);
  EXPECT_EQ(index.Stats().blocks, 5u);  // 1, and 5 to 8
}

TEST_F(FleetIndexTest, BestWorkerIsALiveWorker) {
  Apply(w0_, {Stored({}, {1, 2, 3})});
  Apply(w1_, {Stored({}, {1, 2})});
  index_.SetState(w0_, WorkerState::kReplaying, "replaying from batch 4");
  std::vector<Token> tokens = Prompt({1, 2, 3});
  RouteQuery q;
  q.tokens = tokens;
  RouteResult r = index_.Route(q);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[0].worker, "w0");  // still sorted by what it holds
  EXPECT_EQ(r.best_worker, "w1");        // but not LIVE
  // LIVE again with its next batch, and the detail is gone.
  Apply(w0_, {Stored({1, 2, 3}, {4})});
  EXPECT_EQ(index_.Route(q).best_worker, "w0");
  EXPECT_EQ(index_.Stats().workers[0].state_detail, "");
}

TEST_F(FleetIndexTest, AClearStartsTheStreamOver) {
  Apply(w0_, {Stored({}, {1})});
  EXPECT_EQ(index_.Stats().workers[0].last_seq, 1);
  index_.ClearWorker(w0_, ClearReason::kReconnect, "reconnected");
  const WorkerStatus s = index_.Stats().workers[0];
  EXPECT_EQ(s.last_seq, -1);
  EXPECT_EQ(s.state, WorkerState::kConnecting);
  EXPECT_EQ(s.state_detail, "reconnected");
}

// A hybrid model: group 0 full attention, group 1 a sliding window of 9
// tokens (cdiv(9 - 1, 4) = 2 blocks before a boundary), group 2 a state.
class HybridIndexTest : public FleetIndexTest {
 protected:
  BlockStoredEvent InGroup(const std::vector<Token>& parent,
                           const std::vector<Token>& blocks, int group,
                           const char* kind, int64_t window = 0) {
    BlockStoredEvent ev = Stored(parent, blocks);
    ev.group_idx = group;
    ev.kv_cache_spec_kind = kind;
    ev.kv_cache_spec_sliding_window = window;
    return ev;
  }
  // SGLang's component-typed store (BlockStoredEvent::components).
  BlockStoredEvent WithComponents(const std::vector<Token>& parent,
                                  const std::vector<Token>& blocks,
                                  uint32_t components,
                                  bool one_component = false) {
    BlockStoredEvent ev = Stored(parent, blocks);
    ev.components = components;
    ev.one_component = one_component;
    return ev;
  }
  // w0's rules as a cache spec of full attention and a window of `blocks`
  // gives them.
  void SetWindow(uint32_t blocks) {
    std::array<GroupRule, kMaxGroups> rules{};
    rules[0].kind = GroupKind::kFull;
    rules[1] = {GroupKind::kSlidingWindow, blocks};
    index_.SetGroupRules(w0_, rules);
  }
  BlockRemovedEvent RemovedIn(const std::vector<std::vector<Token>>& paths,
                              int group) {
    BlockRemovedEvent ev = Removed(paths);
    ev.group_idx = group;
    return ev;
  }
  // matched / full-attention blocks of `w` for the prompt.
  std::pair<uint64_t, uint64_t> Match(const std::vector<Token>& blocks,
                                      absl::string_view w) {
    std::vector<Token> tokens = Prompt(blocks);
    RouteQuery q;
    q.tokens = tokens;
    q.filter.all_workers = true;
    for (const WorkerMatch& m : index_.Route(q).workers) {
      if (m.worker == w) return {m.matched_blocks, m.full_attention_blocks};
    }
    return {999, 999};
  }
};

TEST_F(HybridIndexTest, ASlidingWindowNeedsItsBlocksBeforeTheBoundary) {
  const std::vector<Token> chain = {1, 2, 3, 4, 5, 6, 7};
  Apply(w0_, {InGroup({}, chain, 0, "full_attention")});
  // The window group still holds only its last blocks.
  Apply(w0_, {InGroup({1, 2, 3, 4}, {5, 6, 7}, 1, "sliding_window", 9)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{7}, uint64_t{7}));
  // Blocks 5 and 6 make boundary 6 usable too: a prompt ending there.
  EXPECT_EQ(Match({1, 2, 3, 4, 5, 6}, "w0"),
            std::make_pair(uint64_t{6}, uint64_t{6}));
  // Boundary 5 needs blocks 4 and 5 (3 and 4 here, 0-based): 4 is gone.
  EXPECT_EQ(Match({1, 2, 3, 4, 5}, "w0"),
            std::make_pair(uint64_t{0}, uint64_t{5}));
  // The window loses block 6: boundary 7 needs 6 and 7 in the window.
  Apply(w0_, {RemovedIn({{1, 2, 3, 4, 5, 6}}, 1)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{7}));
  // w1 holds the whole chain in both groups: it is the one to route to.
  Apply(w1_, {InGroup({}, chain, 0, "full_attention"),
              InGroup({}, chain, 1, "sliding_window", 9)});
  std::vector<Token> tokens = Prompt(chain);
  RouteQuery q;
  q.tokens = tokens;
  const RouteResult r = index_.Route(q);
  EXPECT_EQ(r.best_worker, "w1");
  EXPECT_EQ(r.workers[0].matched_blocks, 7u);
}

TEST_F(HybridIndexTest, AStateGroupNeedsTheBoundaryBlockOnly) {
  const std::vector<Token> chain = {1, 2, 3, 4, 5, 6, 7, 8};
  Apply(w0_, {InGroup({}, chain, 0, "full_attention"),
              InGroup({1, 2, 3, 4, 5}, {6}, 2, "mamba")});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{6}, uint64_t{8}));
  EXPECT_EQ(Match({1, 2, 3, 4, 5, 6}, "w0"),
            std::make_pair(uint64_t{6}, uint64_t{6}));
}

TEST_F(HybridIndexTest, AGroupOfAKindWithoutARuleMakesNothingUsable) {
  const std::vector<Token> chain = {1, 2, 3};
  Apply(w0_, {InGroup({}, chain, 0, "full_attention"),
              InGroup({}, chain, 1, "cross_attention")});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{3}));
}

// vLLM names the groups of an MLA model (DeepSeek, Kimi) by kinds of their
// own, whose rules are full attention's and the sliding window's. A chunked
// local attention group needs every block: its chunk's length is not on the
// wire.
TEST_F(HybridIndexTest, MlaAndChunkedKindsHaveTheirAttentionsRules) {
  const std::vector<Token> chain = {1, 2, 3, 4, 5, 6, 7};
  Apply(w0_, {InGroup({}, chain, 0, "mla_attention")});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{7}, uint64_t{7}));
  Apply(w0_, {InGroup({1, 2, 3, 4}, {5, 6, 7}, 1, "sliding_window_mla", 9)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{7}, uint64_t{7}));
  EXPECT_EQ(Match({1, 2, 3, 4, 5}, "w0"),
            std::make_pair(uint64_t{0}, uint64_t{5}));
  Apply(w1_, {InGroup({}, chain, 0, "full_attention"),
              InGroup({1, 2, 3}, {4, 5, 6, 7}, 1, "chunked_local_attention")});
  // Its rule is full attention's, and so is its run.
  EXPECT_EQ(Match(chain, "w1"), std::make_pair(uint64_t{0}, uint64_t{0}));
  Apply(w1_, {InGroup({}, {1, 2, 3}, 1, "chunked_local_attention")});
  EXPECT_EQ(Match(chain, "w1"), std::make_pair(uint64_t{7}, uint64_t{7}));
}

// vLLM leaves a group's null blocks out of a store's hashes but not out of
// its tokens: a Mamba group in align mode stores the state of a prompt's
// last block alone. The hash names a block full attention stores, and a
// hybrid model's Mamba groups come first, so in the same step vLLM sends
// that store after it.
TEST_F(HybridIndexTest, ASparseStoreIsPlacedByTheHashesItNames) {
  const std::vector<Token> chain = {1, 2, 3, 4, 5, 6};
  BlockStoredEvent state = InGroup({}, chain, 0, "mamba");
  state.block_hashes = {ChainHash(chain)};
  state.chain_blocks = 1;
  state.sparse = true;
  Apply(w0_, {state, InGroup({}, chain, 1, "full_attention")});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{6}, uint64_t{6}));
  EXPECT_EQ(Match({1, 2, 3, 4, 5}, "w0"),
            std::make_pair(uint64_t{0}, uint64_t{5}));
  Apply(w0_, {RemovedIn({chain}, 0)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{6}));
  // A removal between them: the sparse store is applied before it, and a
  // hash no group of the worker stored is dropped; the worker goes on.
  BlockStoredEvent stray = InGroup({}, {7, 8}, 0, "mamba");
  stray.block_hashes = {ChainHash({7, 8})};
  stray.chain_blocks = 1;
  stray.sparse = true;
  state.block_hashes = {ChainHash({1, 2, 3})};
  Apply(w0_, {stray, state, RemovedIn({{1, 2, 3}}, 0),
              InGroup({}, {7, 8}, 1, "full_attention")});
  EXPECT_EQ(Match({1, 2, 3}, "w0"), std::make_pair(uint64_t{0}, uint64_t{3}));
  EXPECT_EQ(Match({7, 8}, "w0"), std::make_pair(uint64_t{0}, uint64_t{2}));
  const WorkerStatus st = index_.Stats().workers[0];
  EXPECT_EQ(st.state, WorkerState::kLive);
  EXPECT_EQ(st.dropped_blocks, 1u);
}

TEST_F(HybridIndexTest, GroupZeroCanBeTheWindow) {
  const std::vector<Token> chain = {1, 2, 3, 4, 5};
  Apply(w0_, {InGroup({}, chain, 0, "sliding_window", 9)});
  Apply(w0_, {Removed({{1}, {1, 2}})});  // group 0 evicts its oldest blocks
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{5}, uint64_t{0}));
}

// SGLang's component-typed stores (--enable-kv-events-component-types):
// each names the components the worker now holds of its blocks, replacing
// what it held; a removal takes every component.
TEST_F(HybridIndexTest, SglangsComponentsReplaceWhatABlockHeld) {
  const std::vector<Token> chain = {1, 2, 3, 4, 5};
  constexpr uint32_t kFull = kComponentFull;
  constexpr uint32_t kFullSwa = kComponentFull | kComponentSwa;
  Apply(w0_, {WithComponents({}, chain, kFullSwa)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{5}, uint64_t{5}));
  // The window's oldest blocks are evicted: restated with full attention
  // alone. Without the window's length, the window needs every block.
  Apply(w0_, {WithComponents({}, {1}, kFull), WithComponents({1}, {2}, kFull)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{5}));
  const WorkerStatus st = index_.Stats().workers[0];
  ASSERT_EQ(st.groups.size(), 1u);
  EXPECT_EQ(st.groups[0].group, 1);
  // A cache spec's window of 9 tokens (2 blocks): blocks 3 and 4 do.
  SetWindow(2);
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{5}, uint64_t{5}));
  // The window lost block 2 as well: boundary 5 needs blocks 3 and 4 only,
  // boundary 4 needs 2 and 3.
  Apply(w0_, {WithComponents({1, 2}, {3}, kFull)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{5}, uint64_t{5}));
  EXPECT_EQ(Match({1, 2, 3, 4}, "w0"),
            std::make_pair(uint64_t{0}, uint64_t{4}));
  // A removal takes the last block out of both components: stored again
  // with full attention alone, the window misses it.
  Apply(w0_, {Removed({{1, 2, 3, 4, 5}})});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{4}));
  Apply(w0_, {WithComponents({1, 2, 3, 4}, {5}, kFull)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{5}));
  EXPECT_TRUE(index_.CheckInvariants().ok()) << index_.CheckInvariants();
  // A store without full attention places nothing by its tokens: their
  // count is not the index's to check (a Mamba checkpoint's window).
  BlockStoredEvent state = WithComponents({1, 2, 3, 4}, {5}, kComponentMamba);
  state.block_size = kBs / 2;
  state.token_ids.resize(kBs / 2);
  Apply(w0_, {state});
  EXPECT_EQ(index_.Stats().workers[0].state, WorkerState::kLive);
  // Block 4 lost full attention; the state is only on block 4.
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{4}));
}

// The window's length from the worker's registration (a source's
// swa_window_tokens): 2 blocks' worth of tokens.
TEST_F(HybridIndexTest, ARegisteredWindowLengthAppliesToSglangsSwa) {
  WorkerLabels labels;
  labels.swa_window_tokens = 2 * kBs - 1;  // rounded up to 2 blocks
  index_.SetLabels(w0_, labels);
  const std::vector<Token> chain = {1, 2, 3, 4, 5};
  Apply(w0_, {WithComponents({}, chain, kComponentFull | kComponentSwa),
              WithComponents({}, {1, 2, 3}, kComponentFull)});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{5}, uint64_t{5}));
  EXPECT_EQ(Match({1, 2, 3, 4}, "w0"),
            std::make_pair(uint64_t{0}, uint64_t{4}));
  const WorkerStatus st = index_.Stats().workers[0];
  ASSERT_EQ(st.groups.size(), 1u);
  EXPECT_EQ(st.groups[0].rule.window_blocks, 2u);
}

// SGLang's earlier layout: an event per component, a store adding it, a
// removal taking it alone.
TEST_F(HybridIndexTest, SglangsOneComponentEventsAddAndRemoveOne) {
  const std::vector<Token> chain = {1, 2, 3, 4, 5};
  Apply(w0_, {WithComponents({}, chain, kComponentFull, true),
              WithComponents({1, 2}, {3, 4, 5}, kComponentSwa, true)});
  // The window's length unknown: it needs every block.
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{0}, uint64_t{5}));
  SetWindow(2);
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{5}, uint64_t{5}));
  // The window's block 4 removed: full attention keeps it, and the
  // longest usable prefix ends at block 3.
  BlockRemovedEvent rm = Removed({{1, 2, 3, 4, 5}});
  rm.components = kComponentSwa;
  Apply(w0_, {rm});
  EXPECT_EQ(Match(chain, "w0"), std::make_pair(uint64_t{4}, uint64_t{5}));
  EXPECT_TRUE(index_.CheckInvariants().ok()) << index_.CheckInvariants();
}

// Every rule against a brute-force model: a worker holds random sets of a
// 10-block chain in a full, a window (3 blocks) and a state group; Route's
// usable prefix is the largest n every group allows.
TEST(HybridIndexRandom, UsablePrefixAgreesWithABruteForceModel) {
  std::mt19937 rng(2026);
  const std::vector<Token> chain = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const size_t len = chain.size();
  for (int round = 0; round < 300; ++round) {
    FleetIndex index(IndexOptions{kBs, 1000000});
    const WorkerId w = index.AddWorker("w", "");
    std::vector<std::vector<bool>> held(3, std::vector<bool>(len));
    for (auto& g : held)
      for (size_t b = 0; b < len; ++b) g[b] = rng() % 4 != 0;
    const char* kinds[3] = {"full_attention", "sliding_window", "mamba"};
    KvEventBatch batch;
    for (int g = 0; g < 3; ++g) {
      for (size_t b = 0; b < len; ++b) {
        // Group 0 stores everything first, so every parent is known; its
        // holes are removed after.
        if (g > 0 && !held[g][b]) continue;
        std::vector<Token> parent(chain.begin(), chain.begin() + b);
        BlockStoredEvent ev = Stored(parent, {chain[b]});
        ev.group_idx = g;
        ev.kv_cache_spec_kind = kinds[g];
        ev.kv_cache_spec_sliding_window = g == 1 ? 3 * kBs + 1 : 0;
        batch.events.push_back(ev);
      }
    }
    std::vector<std::vector<Token>> holes;
    for (size_t b = 0; b < len; ++b) {
      if (!held[0][b])
        holes.push_back(
            std::vector<Token>(chain.begin(), chain.begin() + b + 1));
    }
    batch.events.push_back(Removed(holes));
    index.Apply(w, batch, 0, absl::Now());
    ASSERT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();

    size_t want = 0, full = 0;
    while (full < len && held[0][full]) ++full;
    for (size_t n = 1; n <= len; ++n) {
      bool ok = n <= full && held[2][n - 1];
      for (size_t b = n - std::min<size_t>(3, n); b < n; ++b)
        ok = ok && held[1][b];
      if (ok) want = n;
    }
    std::vector<Token> tokens = Prompt(chain);
    RouteQuery q;
    q.tokens = tokens;
    q.filter.all_workers = true;
    const RouteResult r = index.Route(q);
    ASSERT_EQ(r.workers.size(), 1u);
    ASSERT_EQ(r.workers[0].matched_blocks, want) << "round " << round;
    ASSERT_EQ(r.workers[0].full_attention_blocks, full) << "round " << round;
  }
}

TEST(FleetIndexLimits, MaxEntriesDropsTheLeastRecentLeaves) {
  FleetIndex index(IndexOptions{kBs, 10});
  const WorkerId w = index.AddWorker("w", "");
  int64_t seq = 0;
  auto apply = [&](KvEvent e) {
    KvEventBatch b;
    b.events.push_back(std::move(e));
    index.Apply(w, b, seq++, absl::Now());
  };
  apply(Stored({}, {1, 2, 3, 4}));
  apply(Stored({}, {5, 6, 7, 8}));
  // Route touches chain 1: chain 2 is now the least recent.
  std::vector<Token> first = Prompt({1, 2, 3, 4});
  RouteQuery q;
  q.tokens = first;
  q.filter.all_workers = true;
  EXPECT_EQ(index.Route(q).workers[0].matched_blocks, 4u);
  apply(Stored({}, {9, 10, 11}));  // 11 entries > 10
  EXPECT_LE(index.Stats().entries, 10u);
  EXPECT_EQ(index.Route(q).workers[0].matched_blocks, 4u);
  std::vector<Token> second = Prompt({5, 6, 7, 8});
  q.tokens = second;
  EXPECT_LT(index.Route(q).workers[0].matched_blocks, 4u);
  EXPECT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
  EXPECT_GT(index.Stats().dropped[static_cast<int>(DropReason::kMaxEntries)],
            0u);
  // A later removal of an evicted block's hash is harmless.
  apply(Removed({{5, 6, 7, 8}, {5, 6, 7}}));
  EXPECT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
}

// `n` prompts of 1 to `most` blocks over a small alphabet (blocks 1 to 3),
// so that paths collide a lot.
std::vector<std::vector<Token>> RandomPrompts(std::mt19937& rng, int n,
                                              int most) {
  std::vector<std::vector<Token>> prompts;
  for (int i = 0; i < n; ++i) {
    std::vector<Token> p;
    const int len = 1 + static_cast<int>(rng() % most);
    for (int k = 0; k < len; ++k) p.push_back(1 + rng() % 3);
    prompts.push_back(p);
  }
  return prompts;
}

// Random stores, removals and clears on 3 workers x 2 mediums, against a
// model that keeps, per worker and medium, the set of block paths it holds.
// After every batch the invariants hold and Route agrees with the model
// for every prompt of a fixed set.
TEST(FleetIndexRandom, AgreesWithAModelOfHeldPaths) {
  std::mt19937 rng(12345);
  FleetIndex index(IndexOptions{kBs, 1000000});
  constexpr int kWorkers = 3;
  const std::vector<std::string> mediums = {"GPU", "CPU"};
  std::vector<WorkerId> ids;
  for (int w = 0; w < kWorkers; ++w)
    ids.push_back(index.AddWorker("w" + std::to_string(w), ""));
  // model[w][m]: paths held.
  std::vector<std::vector<std::set<std::vector<Token>>>> model(
      kWorkers, std::vector<std::set<std::vector<Token>>>(2));
  const std::vector<std::vector<Token>> prompts = RandomPrompts(rng, 40, 6);
  auto held_any = [&](int w, const std::vector<Token>& path) {
    return model[w][0].count(path) > 0 || model[w][1].count(path) > 0;
  };
  std::vector<int64_t> seq(kWorkers, 0);
  for (int step = 0; step < 3000; ++step) {
    const int w = static_cast<int>(rng() % kWorkers);
    const int m = static_cast<int>(rng() % 2);
    KvEventBatch batch;
    const int op = static_cast<int>(rng() % 100);
    const std::vector<Token>& p = prompts[rng() % prompts.size()];
    if (op < 55) {
      // Store a run of p after a prefix the worker holds (or the root), as
      // an engine would: its parent is a block it holds.
      size_t start = 0;
      std::vector<size_t> options = {0};
      for (size_t k = 1; k < p.size(); ++k) {
        if (held_any(w, std::vector<Token>(p.begin(), p.begin() + k)))
          options.push_back(k);
      }
      start = options[rng() % options.size()];
      const size_t end = start + 1 + rng() % (p.size() - start);
      std::vector<Token> parent(p.begin(), p.begin() + start);
      std::vector<Token> blocks(p.begin() + start, p.begin() + end);
      batch.events.push_back(Stored(parent, blocks, mediums[m]));
      for (size_t k = start; k < end; ++k)
        model[w][m].insert(std::vector<Token>(p.begin(), p.begin() + k + 1));
    } else if (op < 95) {
      // Remove some held paths of the worker in medium m.
      std::vector<std::vector<Token>> gone;
      for (size_t k = 1; k <= p.size(); ++k) {
        std::vector<Token> path(p.begin(), p.begin() + k);
        if (model[w][m].count(path) > 0 && rng() % 2 == 0) {
          gone.push_back(path);
          model[w][m].erase(path);
        }
      }
      batch.events.push_back(Removed(gone, mediums[m]));
    } else {
      batch.events.push_back(AllBlocksClearedEvent{});
      model[w][0].clear();
      model[w][1].clear();
    }
    index.Apply(ids[w], batch, seq[w]++, absl::Now());
    const absl::Status invariants = index.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
    for (const auto& prompt : prompts) {
      std::vector<Token> tokens = Prompt(prompt);
      RouteQuery q;
      q.tokens = tokens;
      const RouteResult matched = index.Route(q);
      q.filter.all_workers = true;
      RouteResult r = index.Route(q);
      ASSERT_EQ(r.workers.size(), static_cast<size_t>(kWorkers));
      // By default, the same answer without the workers that matched none.
      size_t listed = 0;
      while (listed < r.workers.size() && r.workers[listed].matched_blocks > 0)
        ++listed;
      ASSERT_EQ(matched.workers.size(), listed) << "step " << step;
      for (size_t i = 0; i < listed; ++i)
        ASSERT_EQ(matched.workers[i].worker, r.workers[i].worker);
      for (const WorkerMatch& got : r.workers) {
        const int wi = got.worker[1] - '0';
        size_t want = 0;
        while (want < prompt.size() &&
               held_any(wi, std::vector<Token>(prompt.begin(),
                                               prompt.begin() + want + 1))) {
          ++want;
        }
        ASSERT_EQ(got.matched_blocks, want)
            << "step " << step << " worker " << got.worker;
      }
    }
  }
  // Nothing leaks: clearing everyone empties the index.
  for (int w = 0; w < kWorkers; ++w)
    index.ClearWorker(ids[w], ClearReason::kRestart, "");
  EXPECT_EQ(index.Stats().entries, 0u);
  EXPECT_EQ(index.Stats().blocks, 0u);
}

// Random stores and removals by 2 workers with tokens beside hash reports
// and revocations of the same paths' hashes by 3 workers without, in
// either order: after every step the invariants hold (among them, every
// holder of a block with tokens is listed as tokened, which the reports'
// search relies on), and clearing everyone empties the index.
TEST(FleetIndexRandom, ReportsBesideStoresKeepTheInvariants) {
  std::mt19937 rng(2027);
  FleetIndex index(IndexOptions{kBs, 1000000});
  std::vector<WorkerId> ids;
  for (const char* name : {"z0", "z1", "r0", "r1", "r2"})
    ids.push_back(index.AddWorker(name, ""));
  const std::vector<std::vector<Token>> prompts = RandomPrompts(rng, 30, 5);
  std::vector<int64_t> seq(ids.size(), 0);
  for (int step = 0; step < 3000; ++step) {
    const size_t w = rng() % ids.size();
    const std::vector<Token>& p = prompts[rng() % prompts.size()];
    const bool add = rng() % 100 < 60;
    if (w < 2) {  // an engine with tokens: the whole prompt from the root
      KvEventBatch batch;
      if (add) {
        batch.events.push_back(Stored({}, p));
      } else {
        std::vector<std::vector<Token>> paths;
        for (size_t k = p.size(); k > 0; --k)
          paths.emplace_back(p.begin(), p.begin() + k);
        batch.events.push_back(Removed(paths));
      }
      index.Apply(ids[w], batch, seq[w]++, absl::Now());
    } else {  // a bridge: the prompt's hashes, reported or revoked
      std::vector<EngineHash> hashes;
      for (size_t k = 1; k <= p.size(); ++k)
        hashes.push_back(
            ChainHash(std::vector<Token>(p.begin(), p.begin() + k)));
      HashUpdate u;
      u.op = add ? HashUpdate::Op::kReport : HashUpdate::Op::kRevoke;
      u.medium = "GPU";
      u.hashes = hashes;
      index.ApplyHashes(ids[w], {u});
    }
    const absl::Status invariants = index.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  for (WorkerId id : ids) index.ClearWorker(id, ClearReason::kRestart, "");
  EXPECT_EQ(index.Stats().entries, 0u);
  EXPECT_EQ(index.Stats().blocks, 0u);
}

// Route by rolling keys looks up the block that starts each edge of the
// match and then compares the edge's slots' keys (HolderTree::WalkKeys):
// whatever the tree's shape (edges split by later stores, blocks removed
// mid-chain, three workers), it must answer as Route by tokens does.
TEST(FleetIndexKeysTest, RouteByKeysAgreesWithRouteByTokens) {
  IndexOptions o{kBs, 1000000};
  o.key_lookup = true;
  FleetIndex index(o);
  const WorkerId workers[] = {index.AddWorker("a", "tcp://a:1"),
                              index.AddWorker("b", "tcp://b:1"),
                              index.AddWorker("c", "tcp://c:1")};
  const KeyScheme scheme(o.hash_profile, o.hash_seed);
  std::mt19937 rng(7);
  // 1 to `most` blocks from a small alphabet, so that paths share prefixes.
  const auto path = [&](int most) {
    std::vector<Token> p(1 + rng() % static_cast<unsigned>(most));
    for (Token& b : p) b = 1 + rng() % 3;
    return p;
  };
  const auto matched = [&](const RouteQuery& q) {
    std::map<std::string, uint64_t> out;
    for (const WorkerMatch& m : index.Route(q).workers)
      out[std::string(m.worker)] = m.matched_blocks;
    return out;
  };
  std::map<WorkerId, int64_t> seq;
  int compared = 0, deep = 0;
  for (int round = 0; round < 400; ++round) {
    const WorkerId w = workers[rng() % 3];
    KvEventBatch batch;
    batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    const std::vector<Token> p = path(10);
    if (rng() % 4 == 0) {
      batch.events.push_back(Removed({p}));  // its last block
    } else {
      batch.events.push_back(Stored({}, p));
    }
    index.Apply(w, batch, ++seq[w], absl::Now());
    ASSERT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
    const std::vector<Token> tokens = Prompt(path(12));
    std::vector<uint64_t> keys(tokens.size() / kBs);
    scheme.Chain(scheme.Root(""), true, tokens, kBs, keys.size(), nullptr,
                 keys.data());
    RouteQuery by_tokens;
    by_tokens.tokens = tokens;
    by_tokens.filter.all_workers = true;
    RouteQuery by_keys;
    by_keys.keys = keys;
    by_keys.filter.all_workers = true;
    const std::map<std::string, uint64_t> want = matched(by_tokens);
    ASSERT_EQ(matched(by_keys), want) << "round " << round;
    ++compared;
    for (const auto& [name, blocks] : want) deep += blocks >= 3;
  }
  EXPECT_EQ(compared, 400);
  EXPECT_GT(deep, 100);  // the prompts do match across edges
}

// A rolling key hangs on the salt, not on the LoRA adapter, so the same
// tokens under two adapters have the same keys in two trees: the lookup by
// key must find each namespace's own.
TEST(FleetIndexKeysTest, EqualKeysInTwoNamespacesFindEachTheirOwn) {
  IndexOptions o{kBs, 1000000};
  o.key_lookup = true;
  FleetIndex index(o);
  const WorkerId a = index.AddWorker("a", "tcp://a:1");
  const WorkerId b = index.AddWorker("b", "tcp://b:1");
  const auto store = [&](WorkerId w, const char* lora,
                         const std::vector<Token>& blocks) {
    KvEventBatch batch;
    BlockStoredEvent ev = Stored({}, blocks);
    ev.lora_name = lora;
    batch.events.push_back(ev);
    index.Apply(w, batch, static_cast<int64_t>(w) + 1, absl::Now());
  };
  store(a, "x", {1, 2, 3});
  store(b, "y", {1, 2});
  ASSERT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
  const KeyScheme scheme(o.hash_profile, o.hash_seed);
  const std::vector<Token> tokens = Prompt({1, 2, 3});
  std::vector<uint64_t> keys(3);
  scheme.Chain(scheme.Root(""), true, tokens, kBs, keys.size(), nullptr,
               keys.data());
  const auto matched = [&](const char* lora) {
    RouteQuery q;
    q.keys = keys;
    q.lora_name = lora;
    q.filter.all_workers = true;
    std::map<std::string, uint64_t> out;
    for (const WorkerMatch& m : index.Route(q).workers)
      out[std::string(m.worker)] = m.matched_blocks;
    return out;
  };
  EXPECT_EQ(matched("x"),
            (std::map<std::string, uint64_t>{{"a", 3}, {"b", 0}}));
  EXPECT_EQ(matched("y"),
            (std::map<std::string, uint64_t>{{"a", 0}, {"b", 2}}));
  EXPECT_EQ(matched(""), (std::map<std::string, uint64_t>{{"a", 0}, {"b", 0}}));
}

// A chain of 200 slices' worth of identical blocks stored, removed in
// reverse, trimmed by max_entries and cleared: no hold of the lock does
// more than kSliceBlocks blocks' worth, and between slices a Route runs,
// sees the chain's worker between before and after, the other worker
// untouched, and the tree passes its invariants; the counts end exact.
class FleetIndexSlicesTest : public ::testing::Test {
 protected:
  static constexpr size_t kChain = 200 * FleetIndex::kSliceBlocks;
  // A max_entries bound the chain passes, and what a trim leaves of it
  // (99 % of the bound).
  static constexpr size_t kBound = kChain / 4;
  static constexpr size_t kTrimmed = kBound - kBound / 100;
  // SweepingAStaleMapLetsRoutesIn needs a map HolderTree sweeps: 4,096
  // hashes or more, over twice the blocks held after the trim.
  static_assert(kChain >= 4096 && kChain > 2 * kBound,
                "a chain too short for the sweep");
  // The releases of the lock between the full slices of a pass over the
  // chain.
  static constexpr int kReleases =
      static_cast<int>(kChain / FleetIndex::kSliceBlocks) - 1;

  explicit FleetIndexSlicesTest(uint64_t max_entries = 10000000)
      : index_(IndexOptions{kBs, max_entries}) {
    w_ = index_.AddWorker("w", "");
    other_ = index_.AddWorker("other", "");
    KvEventBatch small;
    small.events.push_back(Stored({}, {1, 2}));
    index_.Apply(other_, small, 0, absl::Now());
    chain_.block_size = kBs;
    chain_.chain_blocks = kChain;
    for (size_t b = 0; b < kChain; ++b) {
      chain_.block_hashes.push_back(1000 + b);
      for (int t = 0; t < kBs; ++t) chain_.token_ids.push_back(7);
    }
    FleetIndexTestPeer::SetBetweenSlices(index_, [this] { BetweenSlices(); });
  }

  // matched_blocks of the chain's worker for the first 64 blocks, and of
  // the other worker for its own 2.
  std::pair<uint64_t, uint64_t> Matched() {
    const std::vector<Token> chain(64 * kBs, 7);
    const std::vector<Token> own = Prompt({1, 2});
    RouteQuery q;
    q.filter.all_workers = true;
    q.tokens = chain;
    uint64_t mine = 0;
    for (const WorkerMatch& m : index_.Route(q).workers)
      if (m.worker == "w") mine = m.matched_blocks;
    q.tokens = own;
    uint64_t theirs = 0;
    for (const WorkerMatch& m : index_.Route(q).workers)
      if (m.worker == "other") theirs = m.matched_blocks;
    return {mine, theirs};
  }

  void BetweenSlices() {
    ++slices_;
    const absl::Status invariants = index_.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "slice " << slices_ << ": " << invariants;
    const auto [mine, theirs] = Matched();
    EXPECT_LE(mine, 64u);
    EXPECT_EQ(theirs, 2u) << "slice " << slices_;
    if (also_between_) also_between_();
  }

  // Engine hashes the worker reports (SGLang's KV indexer API), or a tier
  // it clears.
  void ApplyHashes(HashUpdate::Op op, absl::Span<const EngineHash> hashes,
                   std::string medium = "GPU") {
    HashUpdate u;
    u.op = op;
    u.medium = std::move(medium);
    u.hashes = hashes;
    index_.ApplyHashes(w_, {u});
    ASSERT_TRUE(index_.CheckInvariants().ok()) << index_.CheckInvariants();
    EXPECT_LE(FleetIndexTestPeer::HoldStatsOf(index_).max_blocks,
              FleetIndex::kSliceBlocks);
  }

  void Apply(KvEvent e) {
    KvEventBatch batch;
    batch.events.push_back(std::move(e));
    index_.Apply(w_, batch, seq_++, absl::Now());
    ASSERT_TRUE(index_.CheckInvariants().ok()) << index_.CheckInvariants();
    EXPECT_LE(FleetIndexTestPeer::HoldStatsOf(index_).max_blocks,
              FleetIndex::kSliceBlocks);
  }

  uint64_t HeldByW(absl::string_view medium = "GPU") {
    for (const WorkerStatus& s : index_.Stats().workers) {
      if (s.worker != "w") continue;
      for (const auto& m : s.mediums)
        if (m.medium == medium) return m.blocks;
    }
    return 0;
  }

  // The chain's engine hashes.
  std::vector<EngineHash> ChainHashes() const {
    return {chain_.block_hashes.begin(), chain_.block_hashes.end()};
  }

  FleetIndex index_;
  WorkerId w_, other_;
  BlockStoredEvent chain_;
  int64_t seq_ = 0;
  int slices_ = 0;
  std::function<void()> also_between_;  // more checks between slices
};

// A reader between a long batch's slices sees the worker's sequence of
// the batch before: it must not take the index for caught up through a
// batch that is half applied.
TEST_F(FleetIndexSlicesTest, ABatchsSequenceIsRecordedOnceItIsApplied) {
  auto seq_of_w = [&] {
    for (const WorkerStatus& s : index_.Stats().workers)
      if (s.worker == "w") return s.last_seq;
    return int64_t{-2};
  };
  std::vector<int64_t> seen;
  also_between_ = [&] { seen.push_back(seq_of_w()); };
  Apply(chain_);
  ASSERT_GE(slices_, kReleases);
  EXPECT_EQ(seq_of_w(), 0);
  for (int64_t s : seen) EXPECT_EQ(s, -1);
  seen.clear();
  BlockRemovedEvent all;
  all.block_hashes = chain_.block_hashes;
  Apply(all);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seq_of_w(), 1);
  for (int64_t s : seen) EXPECT_EQ(s, 0);
}

TEST_F(FleetIndexSlicesTest, ATiersClearLetsRoutesIn) {
  Apply(chain_);
  const std::vector<EngineHash> hashes = ChainHashes();
  ApplyHashes(HashUpdate::Op::kReport, hashes, "CPU");
  ASSERT_EQ(HeldByW("CPU"), kChain);
  slices_ = 0;
  ApplyHashes(HashUpdate::Op::kClearTier, {}, "GPU");
  EXPECT_GE(slices_, kReleases);
  // As one pass over the worker's map leaves it: the blocks held in CPU
  // only, every hash still naming one.
  EXPECT_EQ(HeldByW("GPU"), 0u);
  EXPECT_EQ(HeldByW("CPU"), kChain);
  const IndexStats stats = index_.Stats();
  EXPECT_EQ(stats.entries, kChain + 2);
  EXPECT_EQ(stats.blocks, kChain + 2);
  EXPECT_EQ(stats.engine_hashes, kChain + 2);
  EXPECT_EQ(Matched(), std::make_pair(uint64_t{64}, uint64_t{2}));
}

TEST_F(FleetIndexSlicesTest, BuildingTheKeyLookupLetsRoutesIn) {
  Apply(chain_);
  // The chain's rolling keys: a Route by them finds the chain's blocks
  // once the lookup is built, and part of them while it is.
  std::vector<uint64_t> keys(64);
  const IndexOptions o;
  KeyScheme(o.hash_profile, o.hash_seed)
      .Chain(KeyScheme(o.hash_profile, o.hash_seed).Root(""), true,
             chain_.token_ids, kBs, keys.size(), nullptr, keys.data());
  auto by_keys = [&] {
    RouteQuery q;
    q.keys = keys;
    q.filter.all_workers = true;
    for (const WorkerMatch& m : index_.Route(q).workers)
      if (m.worker == "w") return m.matched_blocks;
    return uint64_t{0};
  };
  ASSERT_EQ(by_keys(), 0u);
  also_between_ = [&] { EXPECT_LE(by_keys(), 64u); };
  slices_ = 0;
  WorkerLabels labels;
  labels.hashes_are_keys = true;
  index_.SetLabels(w_, labels);
  EXPECT_GE(slices_, kReleases);
  EXPECT_LE(FleetIndexTestPeer::HoldStatsOf(index_).max_blocks,
            FleetIndex::kSliceBlocks);
  ASSERT_TRUE(index_.CheckInvariants().ok()) << index_.CheckInvariants();
  EXPECT_EQ(by_keys(), 64u);
}

TEST_F(FleetIndexSlicesTest, StoreRemoveAndClearOfALongChainLetRoutesIn) {
  Apply(chain_);
  EXPECT_GE(slices_, kReleases);
  EXPECT_EQ(HeldByW(), kChain);
  EXPECT_EQ(index_.Stats().entries, kChain + 2);
  EXPECT_EQ(Matched(), std::make_pair(uint64_t{64}, uint64_t{2}));

  // Removed from the leaf up, in one event.
  BlockRemovedEvent reverse;
  for (size_t b = kChain; b-- > 0;) reverse.block_hashes.push_back(1000 + b);
  slices_ = 0;
  Apply(reverse);
  EXPECT_GE(slices_, kReleases);
  EXPECT_EQ(HeldByW(), 0u);
  EXPECT_EQ(index_.Stats().entries, 2u);

  Apply(chain_);
  slices_ = 0;
  Apply(AllBlocksClearedEvent{});
  EXPECT_GE(slices_, kReleases);
  EXPECT_EQ(HeldByW(), 0u);
  EXPECT_EQ(index_.Stats().entries, 2u);
  EXPECT_EQ(Matched(), std::make_pair(uint64_t{0}, uint64_t{2}));
  EXPECT_EQ(index_.Stats().blocks, 2u);
  EXPECT_GT(FleetIndexTestPeer::HoldStatsOf(index_).yields, 0u);
}

TEST(FleetIndexGrowthTest, StoresGrowTheirHashTablesAsideNotInsideTheirHold) {
  for (const bool key_lookup : {false, true}) {
    IndexOptions o{kBs, 10000000};
    o.key_lookup = key_lookup;
    FleetIndex index(o);
    const WorkerId w = index.AddWorker("w", "");
    int64_t seq = 0;
    // Stores of 100 root blocks each: the worker's engine-hash map, the
    // root's child set (and the key lookup) pass capacities of 8 K, 16 K
    // and 32 K entries.
    const auto store = [&](Token first, Token count) {
      for (Token b = first; b < first + count;) {
        KvEventBatch batch;
        for (int k = 0; k < 100; ++k, ++b)
          batch.events.push_back(Stored({}, {b}));
        index.Apply(w, batch, seq++, absl::Now());
      }
    };
    store(1, 40000);
    EXPECT_GT(FleetIndexTestPeer::HoldStatsOf(index).grown_aside, 0u)
        << key_lookup;
    // Every block removed (the tables keep their tombstones), then as many
    // new ones stored: cleaned aside too.
    KvEventBatch removal;
    BlockRemovedEvent all;
    for (Token b = 1; b <= 40000; ++b)
      all.block_hashes.push_back(ChainHash({b}));
    removal.events.push_back(all);
    index.Apply(w, removal, seq++, absl::Now());
    store(100001, 40000);
    // A root block's edge split by a longer prompt: the head takes its
    // place in the root's set.
    KvEventBatch split;
    split.events.push_back(Stored({}, {100001, 5}));
    index.Apply(w, split, seq++, absl::Now());
    EXPECT_EQ(FleetIndexTestPeer::HoldStatsOf(index).grown_in_place, 0u)
        << key_lookup;
    ASSERT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
    EXPECT_EQ(index.Stats().entries, 40001u);
    RouteQuery q;
    const std::vector<Token> prompt = Prompt({100007});
    q.tokens = prompt;
    const RouteResult r = index.Route(q);
    ASSERT_EQ(r.workers.size(), 1u);
    EXPECT_EQ(r.workers[0].matched_blocks, 1u);
  }
}

// The lookup by key of a chain of half a million blocks grows a set at a
// time: no growth copies more than one of its sets, a sixty-fourth of the
// lookup (when it was one set, the last growth copied 458,752 entries).
TEST(FleetIndexGrowthTest, TheKeyLookupGrowsASetAtATime) {
  IndexOptions o{kBs, 10000000};
  o.key_lookup = true;
  FleetIndex index(o);
  const WorkerId w = index.AddWorker("w", "");
  constexpr Token kBlocks = 512000, kPerEvent = 8000;
  std::vector<Token> tokens;  // block b's are kBs times b
  int64_t seq = 0;
  for (Token first = 0; first < kBlocks; first += kPerEvent) {
    BlockStoredEvent ev;
    if (first > 0) ev.parent_block_hash = first;  // block first - 1's
    for (Token b = first; b < first + kPerEvent; ++b) {
      ev.block_hashes.push_back(b + 1);
      for (int t = 0; t < kBs; ++t) ev.token_ids.push_back(b);
    }
    ev.block_size = kBs;
    ev.medium = "GPU";
    ev.chain_blocks = kPerEvent;
    tokens.insert(tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
    KvEventBatch batch;
    batch.events.push_back(std::move(ev));
    index.Apply(w, batch, seq++, absl::Now());
  }
  const FleetIndex::HoldStats stats = FleetIndexTestPeer::HoldStatsOf(index);
  EXPECT_EQ(stats.grown_in_place, 0u);
  EXPECT_GE(stats.largest_key_copy, HolderTree::kGrowAsideFrom);
  EXPECT_LE(stats.largest_key_copy, kBlocks / 32);
  ASSERT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
  EXPECT_EQ(index.Stats().blocks, kBlocks);
  // Every block is found by its key: the whole chain matches.
  const KeyScheme scheme(o.hash_profile, o.hash_seed);
  std::vector<uint64_t> keys(kBlocks);
  scheme.Chain(scheme.Root(""), true, tokens, kBs, keys.size(), nullptr,
               keys.data());
  RouteQuery q;
  q.keys = keys;
  const RouteResult r = index.Route(q);
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].matched_blocks, kBlocks);
}

// Engine hashes reported without tokens that no worker stored are detached
// blocks, every one a child of one root: that set is grown aside too.
TEST(FleetIndexGrowthTest, DetachedHashesGrowTheirRootsSetAside) {
  FleetIndex index(IndexOptions{kBs, 10000000});
  const WorkerId w = index.AddWorker("w", "");
  const auto report = [&](HashUpdate::Op op, EngineHash first,
                          EngineHash count) {
    std::vector<EngineHash> hashes;
    for (EngineHash h = first; h < first + count; ++h) hashes.push_back(h);
    for (size_t a = 0; a < hashes.size(); a += 100) {
      HashUpdate u;
      u.op = op;
      u.hashes = absl::MakeConstSpan(hashes).subspan(a, 100);
      index.ApplyHashes(w, {u});
    }
  };
  report(HashUpdate::Op::kReport, 1, 40000);
  EXPECT_GT(FleetIndexTestPeer::HoldStatsOf(index).grown_aside, 0u);
  report(HashUpdate::Op::kRevoke, 1, 40000);
  report(HashUpdate::Op::kReport, 100001, 40000);
  EXPECT_EQ(FleetIndexTestPeer::HoldStatsOf(index).grown_in_place, 0u);
  ASSERT_TRUE(index.CheckInvariants().ok()) << index.CheckInvariants();
  EXPECT_EQ(index.Stats().entries, 40000u);
  const EngineHash probe[] = {100007};
  const RouteResult r = index.RouteEngineHashes(probe, WorkerFilter());
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].matched_blocks, 1u);
}

class FleetIndexTrimSlicesTest : public FleetIndexSlicesTest {
 protected:
  FleetIndexTrimSlicesTest() : FleetIndexSlicesTest(kBound) {}
};

TEST_F(FleetIndexTrimSlicesTest, MaxEntriesTrimsALongChainInSlices) {
  Apply(chain_);
  // Trimmed to 99% of the bound, the least recent leaf first: the chain's
  // tail (the Routes between slices keep the other worker's blocks
  // recent).
  EXPECT_EQ(index_.Stats().entries, kTrimmed);
  EXPECT_EQ(HeldByW() + 2, index_.Stats().entries);
  const uint64_t dropped =
      index_.Stats().dropped[static_cast<int>(DropReason::kMaxEntries)];
  EXPECT_EQ(dropped, kChain + 2 - index_.Stats().entries);
  EXPECT_GE(slices_, kReleases);
}

TEST_F(FleetIndexTrimSlicesTest, SweepingAStaleMapLetsRoutesIn) {
  // max_entries leaves kTrimmed - 2 of the worker's kChain blocks: its map
  // names kChain, and its next new hash has the map swept.
  Apply(chain_);
  ASSERT_EQ(index_.Stats().engine_hashes, kChain + 2);
  slices_ = 0;
  Apply(Stored({}, {5}));
  EXPECT_GE(slices_, kReleases);
  // As one sweep leaves it: a hash per block held, nothing else.
  const IndexStats stats = index_.Stats();
  EXPECT_EQ(stats.entries, kTrimmed + 1);
  EXPECT_EQ(stats.engine_hashes, stats.entries);
  EXPECT_EQ(HeldByW() + 2, stats.entries);
}

// Reported hashes nobody stored with tokens are blocks of their own, each
// a leaf: kChain of them fill the index to its bound, and one more starts a
// trim whose scan visits them all.
class FleetIndexTrimScanTest : public FleetIndexSlicesTest {
 protected:
  FleetIndexTrimScanTest() : FleetIndexSlicesTest(kChain + 2) {}
};

TEST_F(FleetIndexTrimScanTest, TheScanForLeavesLetsRoutesIn) {
  std::vector<EngineHash> hashes = ChainHashes();
  ApplyHashes(HashUpdate::Op::kReport, hashes);
  ASSERT_EQ(index_.Stats().entries, kChain + 2);
  slices_ = 0;
  const EngineHash one_more = 7;
  ApplyHashes(HashUpdate::Op::kReport, {&one_more, 1});
  EXPECT_GE(slices_, kReleases);
  // Trimmed to 99% of the bound, the least recent leaves first: the
  // reported blocks (the Routes between slices keep the other worker's
  // recent), and not the newest one.
  const uint64_t target = (kChain + 2) - (kChain + 2) / 100;
  const IndexStats stats = index_.Stats();
  EXPECT_EQ(stats.entries, target);
  EXPECT_EQ(stats.dropped[static_cast<int>(DropReason::kMaxEntries)],
            kChain + 3 - target);
  EXPECT_EQ(HeldByW() + 2, target);
  EXPECT_EQ(index_.HashHoldings({&one_more, 1}).size(), 1u);
  EXPECT_EQ(Matched().second, 2u);
}

}  // namespace
}  // namespace prefixd
