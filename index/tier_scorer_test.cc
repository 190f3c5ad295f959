#include "index/tier_scorer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "index/fleet_index.h"

namespace prefixd {
namespace {

// Medium ids as a tree might number them.
constexpr uint8_t kGpu = 0;
constexpr uint8_t kCpu = 1;
constexpr uint8_t kDisk = 2;
constexpr uint8_t kPinned = 3;

std::vector<uint8_t> Tiers() {
  return {MediumLevel("GPU"), MediumLevel("cpu"), MediumLevel("DISK"),
          MediumLevel("CPU_PINNED")};
}

// One source's blocks, a character each: 'N' device, 'L' host memory, 'P'
// pinned host memory, 'D' disk, '-' none.
uint8_t MediumOf(char c) {
  switch (c) {
    case 'N':
      return kGpu;
    case 'L':
      return kCpu;
    case 'P':
      return kPinned;
    default:
      return kDisk;
  }
}

struct Source {
  WorkerId worker;
  std::string blocks;
};

// Walks the blocks' holders (the longest pattern's length) through a
// TierScorer over workers 0..2, worker 2 being the store: each one's runs.
std::vector<TierRuns> Walk(const std::vector<Source>& sources,
                           std::vector<uint32_t> cap = {}) {
  const TierSources index{Tiers(), {false, false, true}, std::move(cap)};
  TierScorer scorer(3, index);
  size_t blocks = 0;
  for (const Source& s : sources) blocks = std::max(blocks, s.blocks.size());
  // The scorer compares a block's holders with the last block's: each
  // block's stay where they are, as the tree's do.
  std::vector<std::vector<uint32_t>> held(blocks);
  for (uint32_t b = 0; b < blocks; ++b) {
    for (const Source& s : sources) {
      if (b < s.blocks.size() && s.blocks[b] != '-')
        held[b].push_back(PackHolder(s.worker, 0, MediumOf(s.blocks[b])));
    }
    EXPECT_TRUE(scorer.Block(b, held[b]));
  }
  scorer.Finish();
  return {scorer.Of(0), scorer.Of(1), scorer.Of(2)};
}

void ExpectRuns(const TierRuns& got, uint32_t npu, uint32_t cpu_local,
                uint32_t cpu_share, uint32_t disk) {
  EXPECT_EQ(got.npu, npu);
  EXPECT_EQ(got.cpu_local, cpu_local);
  EXPECT_EQ(got.cpu_share, cpu_share);
  EXPECT_EQ(got.disk, disk);
}

TEST(TierScorerTest, MediumTiers) {
  EXPECT_EQ(MediumLevel("gpu"), 0);
  EXPECT_EQ(MediumLevel("NPU"), 0);
  EXPECT_EQ(MediumLevel("Cpu"), 1);
  EXPECT_EQ(MediumLevel("cpu_pinned"), 1);
  EXPECT_EQ(MediumLevel("DISK"), 2);
  EXPECT_EQ(MediumLevel("LOCAL_FILE"), 2);
}

TEST(TierScorerTest, EngineAloneRunsNest) {
  ExpectRuns(Walk({{0, "NNNN"}})[0], 4, 4, 4, 4);
  // Host memory before the device still counts from the first block.
  ExpectRuns(Walk({{0, "LNP-"}})[0], 0, 3, 3, 3);
  ExpectRuns(Walk({{0, "NND-N"}})[0], 2, 2, 2, 3);
  ExpectRuns(Walk({{0, "D"}})[0], 0, 0, 0, 1);
  ExpectRuns(Walk({})[0], 0, 0, 0, 0);
}

TEST(TierScorerTest, StoreCarriesAnEngineOnWhereItsOwnBlocksStop) {
  // The store holds only what comes after the engine's run.
  ExpectRuns(Walk({{0, "NN--"}, {2, "--LL"}})[0], 2, 2, 4, 4);
  // ... and its disk only the disk run.
  ExpectRuns(Walk({{0, "NN--"}, {2, "--DD"}})[0], 2, 2, 2, 4);
  // The engine's own blocks carry it on past the store's gaps.
  ExpectRuns(Walk({{0, "N-N-N"}, {2, "-L-L-"}})[0], 1, 1, 5, 5);
  ExpectRuns(Walk({{0, "N-N-"}, {2, "-D-D"}})[0], 1, 1, 1, 4);
  // A block nobody holds ends every run.
  ExpectRuns(Walk({{0, "N--N"}, {2, "-L-L"}})[0], 1, 1, 2, 2);
  // An engine that holds nothing gets the store's run.
  ExpectRuns(Walk({{2, "LLD"}})[1], 0, 0, 2, 3);
  // The store's own runs are not answered.
  ExpectRuns(Walk({{2, "LLD"}})[2], 0, 0, 0, 0);
}

TEST(TierScorerTest, EnginesDoNotExtendEachOther) {
  const std::vector<TierRuns> s = Walk({{0, "NNN"}, {1, "-NN"}});
  ExpectRuns(s[0], 3, 3, 3, 3);
  ExpectRuns(s[1], 0, 0, 0, 0);
}

TEST(TierScorerTest, BlockListedTwiceCountsOnce) {
  const TierSources sources{Tiers(), {}, {}};
  TierScorer scorer(1, sources);
  const std::vector<uint32_t> twice = {
      PackHolder(0, 0, kGpu), PackHolder(0, 1, kGpu), PackHolder(0, 0, kCpu)};
  scorer.Block(0, twice);
  scorer.Block(1, twice);
  scorer.Finish();
  ExpectRuns(scorer.Of(0), 2, 2, 2, 2);
}

TEST(TierScorerTest, CapEndsAnEnginesOwnBlocksNotTheStores) {
  ExpectRuns(Walk({{0, "NNNN"}}, {2})[0], 2, 2, 2, 2);
  ExpectRuns(Walk({{0, "NNNN"}, {2, "--LL"}}, {2})[0], 2, 2, 4, 4);
}

TEST(TierScorerTest, MediumPastTheTableIsDisk) {
  const TierSources sources{{MediumLevel("GPU")}, {}, {}};
  TierScorer scorer(1, sources);
  scorer.Block(0, std::vector<uint32_t>{PackHolder(0, 0, 7)});
  scorer.Finish();
  ExpectRuns(scorer.Of(0), 0, 0, 0, 1);
}

// The definition, block by block: run k ends at the first block that
// neither the engine holds at its levels nor a store at the store's.
uint32_t NaiveRun(const std::string& engine, const std::string& store,
                  int own_level, int store_level, uint32_t cap) {
  const auto level = [](char c) {
    return c == '-' ? 9
                    : static_cast<int>(MediumLevel(c == 'N'   ? "GPU"
                                                   : c == 'D' ? "DISK"
                                                              : "CPU"));
  };
  uint32_t b = 0;
  while (b < engine.size() && ((b < cap && level(engine[b]) <= own_level) ||
                               level(store[b]) <= store_level)) {
    ++b;
  }
  return b;
}

// Random patterns: the lazy runs agree with the definition.
TEST(TierScorerTest, AgreesWithTheDefinition) {
  std::mt19937 rng(7);
  const char kinds[] = "NLD-";
  for (int round = 0; round < 2000; ++round) {
    const size_t n = 1 + rng() % 12;
    std::string engine, store;
    for (size_t b = 0; b < n; ++b) {
      engine += kinds[rng() % 4];
      store += kinds[1 + rng() % 3];  // a store holds no device blocks
    }
    // Runs of equal holders (the scorer's shortcut) come often with so few
    // kinds; a hybrid engine's cap one round in three.
    const uint32_t cap = round % 3 == 0 ? rng() % 14 : UINT32_MAX;
    const TierRuns got = Walk({{0, engine}, {2, store}}, {cap})[0];
    SCOPED_TRACE(engine + " / " + store + " cap " + std::to_string(cap));
    ExpectRuns(got, NaiveRun(engine, store, 0, -1, cap),
               NaiveRun(engine, store, 1, -1, cap),
               NaiveRun(engine, store, 1, 1, cap),
               NaiveRun(engine, store, 2, 2, cap));
  }
}

// Through the index: engines and a store each hold random blocks of one
// prompt in random mediums (stored whole, then removed block by block), and
// a Route asked for tier runs answers each engine's runs as the definition
// gives them from what each source holds.
TEST(TierRunsTest, RouteAgreesWithTheDefinition) {
  constexpr int kBs = 4;
  constexpr size_t kBlocks = 8;
  std::vector<Token> prompt;
  for (size_t t = 0; t < kBlocks * kBs; ++t) prompt.push_back(Token(t + 1));
  std::vector<EngineHash> hashes;
  for (size_t b = 0; b < kBlocks; ++b) hashes.push_back(EngineHash(500 + b));
  const char* const kMediums[] = {"GPU", "CPU", "DISK"};
  std::mt19937 rng(11);
  for (int round = 0; round < 40; ++round) {
    FleetIndex index(IndexOptions{kBs, 1000000});
    // held[source][medium][b]; sources 0..2 engines, 3 the store.
    bool held[4][3][kBlocks] = {};
    for (int src = 0; src < 4; ++src) {
      const WorkerId w = index.AddWorker("w" + std::to_string(src), "");
      WorkerLabels labels;
      labels.instance_id = "i" + std::to_string(src);
      labels.hashes_are_keys = src == 3;
      index.SetLabels(w, labels);
      KvEventBatch batch;
      for (int m = src == 3 ? 1 : 0; m < 3; ++m) {
        BlockStoredEvent ev;
        ev.block_hashes = hashes;
        ev.token_ids = prompt;
        ev.block_size = kBs;
        ev.medium = kMediums[m];
        ev.chain_blocks = kBlocks;
        batch.events.push_back(ev);
        BlockRemovedEvent gone;
        gone.medium = kMediums[m];
        for (size_t b = 0; b < kBlocks; ++b) {
          held[src][m][b] = rng() % 3 == 0;
          if (!held[src][m][b]) gone.block_hashes.push_back(hashes[b]);
        }
        batch.events.push_back(gone);
      }
      index.Apply(w, batch, 0, absl::Now());
    }
    const auto holds = [&](int src, int slowest, size_t b) {
      for (int m = 0; m <= slowest; ++m)
        if (held[src][m][b]) return true;
      return false;
    };
    // Run: own blocks at levels up to `own`, the store's up to `store`.
    const auto naive = [&](int src, int own, int store) {
      uint32_t b = 0;
      while (b < kBlocks && (holds(src, own, b) || holds(3, store, b))) ++b;
      return b;
    };
    RouteQuery q;
    q.tokens = prompt;
    q.filter.all_workers = true;
    q.tier_runs = true;
    const RouteResult r = index.Route(q);
    ASSERT_EQ(r.workers.size(), 4u);
    for (const WorkerMatch& m : r.workers) {
      const int src = m.worker[1] - '0';
      SCOPED_TRACE(std::string(m.worker) + " round " + std::to_string(round));
      if (src == 3) {
        ExpectRuns(m.tiers, 0, 0, 0, 0);
        continue;
      }
      ExpectRuns(m.tiers, naive(src, 0, -1), naive(src, 1, -1),
                 naive(src, 1, 1), naive(src, 2, 2));
    }
  }
}

TEST(TierRunsTest, TakeLongerPerTier) {
  TierRuns a{1, 2, 5, 5};
  a.TakeLonger({3, 3, 3, 6});
  ExpectRuns(a, 3, 3, 5, 6);
}

}  // namespace
}  // namespace prefixd
