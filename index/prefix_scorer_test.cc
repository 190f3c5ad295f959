#include "index/prefix_scorer.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

using Holders = std::vector<uint32_t>;

// What a plain fleet's scores are by definition: per worker (and per
// worker and medium) the number of leading blocks it holds, until the
// first block that advances nobody.
std::vector<uint32_t> Expected(const std::vector<Holders>& blocks,
                               size_t workers, size_t mediums) {
  std::vector<uint32_t> run(workers * (1 + mediums), 0);
  for (uint32_t b = 0; b < blocks.size(); ++b) {
    bool advanced = false;
    for (uint32_t h : blocks[b]) {
      const WorkerId w = HolderWorker(h);
      if (w >= workers) continue;
      for (size_t i : {size_t{w}, workers + w * mediums + HolderMedium(h)}) {
        if (run[i] == b) {
          run[i] = b + 1;
          advanced = true;
        }
      }
    }
    if (!advanced) break;
  }
  return run;
}

std::vector<uint32_t> Scored(const std::vector<Holders>& blocks, size_t workers,
                             size_t mediums) {
  const HybridRules plain;
  RouteScores out;
  PrefixScorer scorer(workers, mediums, plain, &out);
  for (uint32_t b = 0; b < blocks.size(); ++b) {
    if (!scorer.Block(b, blocks[b])) break;
  }
  scorer.Finish();
  return std::vector<uint32_t>(out.run.begin(), out.run.end());
}

// A run of blocks with the same holders is passed over at once: the runs
// it advances are those the block before it advanced, and a worker whose
// run had ended before the repeat (w1, missing from block 1) stays ended.
TEST(PrefixScorerTest, RepeatedHoldersAdvanceOnlyTheRunsStillGoing) {
  const Holders all = {PackHolder(0, 0, 0), PackHolder(1, 0, 0),
                       PackHolder(1, 0, 1), PackHolder(2, 0, 0)};
  const Holders no_w1 = {PackHolder(0, 0, 0), PackHolder(2, 0, 0)};
  const std::vector<Holders> blocks = {all, no_w1, all, all, all, no_w1, no_w1};
  const std::vector<uint32_t> run = Scored(blocks, 3, 2);
  EXPECT_EQ(run, Expected(blocks, 3, 2));
  EXPECT_EQ(run[0], 7u);
  EXPECT_EQ(run[1], 1u);
  EXPECT_EQ(run[2], 7u);
  EXPECT_EQ(run[3 + 1 * 2 + 1], 1u);  // w1's run in medium 1
}

// Random fleets of a few workers, mediums and groups, with long runs of
// equal holder lists: the scores equal the definition's.
TEST(PrefixScorerTest, MatchesTheDefinitionOnRandomPrompts) {
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    const size_t workers = 1 + rng() % 6;
    const size_t mediums = 1 + rng() % 3;
    std::vector<Holders> blocks(rng() % 40);
    Holders last;
    for (Holders& holders : blocks) {
      if (!last.empty() && rng() % 3 != 0) {
        holders = last;  // a run of equal holders
      } else {
        for (WorkerId w = 0; w < workers + 1; ++w) {  // one unknown worker
          for (uint8_t m = 0; m < mediums; ++m) {
            for (int g = 0; g < 2; ++g) {
              if (rng() % 4 != 0) holders.push_back(PackHolder(w, g, m));
            }
          }
        }
        std::sort(holders.begin(), holders.end());
      }
      last = holders;
    }
    ASSERT_EQ(Scored(blocks, workers, mediums),
              Expected(blocks, workers, mediums))
        << "round " << round;
  }
}

}  // namespace
}  // namespace prefixd
