// PrefixScorer: how much of a prompt each worker can reuse, from the
// holders of the prompt's blocks in order (docs/index.md, "What the index
// holds, and what Route answers"). Fed block by block by whatever found the
// blocks (a walk of the tree by token keys, or engine hashes resolved one by
// one), it costs one visit per (block, holder), whatever the number of
// workers, except along a run of blocks with the same holders (the tree
// keeps each block's holders sorted): when no worker is hybrid, a block
// whose holders equal the block's before it advances the same runs as that
// block did, so such blocks are only counted, and the runs moved on by
// their number when the holders change or at Finish.
//
// A plain worker's run advances at block b only if it was b, so it ends as
// the worker's longest run from the start (likewise per medium). A worker
// serving a hybrid model (HybridRules) keeps a GroupTally per KV-cache
// group, and after every block its groups are asked whether they allow a
// boundary there (index/group_rules.h).
//
// Thread safety: one per Score; reads the rules it is given.
#ifndef PREFIXD_INDEX_PREFIX_SCORER_H_
#define PREFIXD_INDEX_PREFIX_SCORER_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "index/group_rules.h"
#include "index/holders.h"

namespace prefixd {

// Per worker, the longest leading runs a score found.
struct RouteScores {
  uint64_t prompt_blocks = 0;
  size_t num_workers = 0;
  size_t num_mediums = 0;
  // run[w]: the prefix usable on w (for a plain worker, the leading blocks
  // it holds in any medium); run[W + w*M + m]: the leading blocks it holds
  // in medium m (a hybrid worker's full-attention groups only).
  absl::InlinedVector<uint32_t, 64> run;
  // A hybrid worker's full-attention run (the shortest of its full groups'
  // runs; 0 without one); empty when no worker is hybrid.
  std::vector<uint32_t> full;

  uint32_t Usable(WorkerId w) const { return run[w]; }
  uint32_t FullAttention(WorkerId w) const {
    return full.empty() ? run[w] : full[w];
  }
  uint32_t InMedium(WorkerId w, size_t m) const {
    return run[num_workers + w * num_mediums + m];
  }
  // Folds in another walk's scores over the same workers and mediums: each
  // run is the longer of the two (prompt_blocks stays this walk's).
  void TakeLonger(const RouteScores& other);
};

class PrefixScorer {
 public:
  // Scores worker ids below `workers` over `mediums` medium ids into *out.
  PrefixScorer(size_t workers, size_t mediums, const HybridRules& hybrid,
               RouteScores* out);

  // Block b's holders (b = 0, 1, ... in order). False once no worker can
  // gain from a later block. Inline for the usual block: the one before's
  // holders again, which is only counted.
  bool Block(uint32_t b, absl::Span<const uint32_t> holders) {
    if (last_advanced_ && holders.size() == last_holders_.size() &&
        std::memcmp(holders.data(), last_holders_.data(),
                    holders.size() * sizeof(uint32_t)) == 0) {
      ++repeats_;
      return true;
    }
    return Changed(b, holders);
  }
  // After the last block.
  void Finish();

 private:
  // Block when its holders are not the last plain block's.
  bool Changed(uint32_t b, absl::Span<const uint32_t> holders);
  bool PlainBlock(uint32_t b, absl::Span<const uint32_t> holders);
  // Moves the runs that the last plain block advanced on by the blocks
  // repeated since.
  void FlushRepeats();
  bool Advance(WorkerId w, uint8_t medium, uint32_t b);
  void HybridHolder(int32_t hw, uint32_t holder, uint32_t b);
  void Boundary(int32_t hw, uint32_t n);
  uint32_t FullRun(int32_t hw) const;

  const HybridRules& hybrid_;
  RouteScores* const out_;
  std::vector<GroupTally> tallies_;  // [hybrid worker][group]
  std::vector<uint32_t> usable_;     // by hybrid worker
  std::vector<uint32_t> seen_at_;    // the last block that touched it
  absl::InlinedVector<int32_t, 8> touched_;
  // Plain blocks: the last one passed over the holders (block full_b_),
  // whether it advanced a run (never set when a worker is hybrid), and how
  // many blocks since had its holders.
  absl::Span<const uint32_t> last_holders_;
  uint32_t full_b_ = 0;
  bool last_advanced_ = false;
  uint32_t repeats_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_PREFIX_SCORER_H_
