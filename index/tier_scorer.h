// TierScorer: per engine, the four cumulative runs in which Mooncake's
// C++ Conductor answers a query by instance (docs/index.md, "As a Mooncake
// Conductor"), from the holders of the prompt's blocks in order.
//
// Each run is the longest prefix of the prompt whose every block some
// source holds in that tier or a faster one:
//   npu        the engine itself, on the device (medium GPU or NPU);
//   cpu_local  the engine itself, on the device or in its own host memory
//              (CPU, CPU_PINNED);
//   cpu_share  that, or any store (a Mooncake publisher: `shared`) in its
//              CPU pool;
//   disk       any medium of the engine's or of any store's.
// So the runs nest (npu <= cpu_local <= cpu_share <= disk), and a store's
// blocks carry an engine's run on where its own blocks stop, and the
// engine's own carry it on past the store's gaps.
//
// Cost: one visit per (block, holder), whatever the number of workers,
// except along a run of blocks with the same holders (only counted: the
// runs the first of them advanced move on by their number at the next
// change), and one per worker at Finish. An engine's run that no holder of
// its touched is carried on lazily: per tier, the blocks no store covered
// and how many of them come before each block, so "every block from x to b
// was a store's", or else the first that was not, is two lookups.
//
// Thread safety: one per walk.
#ifndef PREFIXD_INDEX_TIER_SCORER_H_
#define PREFIXD_INDEX_TIER_SCORER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "index/holders.h"

namespace prefixd {

// A run per tier, in blocks.
struct TierRuns {
  uint32_t npu = 0;
  uint32_t cpu_local = 0;
  uint32_t cpu_share = 0;
  uint32_t disk = 0;

  // Each run the longer of this one's and `other`'s.
  void TakeLonger(const TierRuns& other);
};

// The level of a medium: 0 the device (GPU, NPU); 1 host memory (CPU,
// CPU_PINNED); 2 anything else (DISK, or a medium Mooncake does not name).
// Any case.
uint8_t MediumLevel(absl::string_view medium);

// What a TierScorer reads of the index, shared by the walks of a query.
struct TierSources {
  // MediumLevel of each medium id (ids past its end count as level 2).
  std::vector<uint8_t> medium_level;
  // shared[w]: worker w is a store whose blocks extend every engine's runs
  // (a worker past its end is an engine).
  std::vector<bool> shared;
  // cap[w]: w's own blocks at or after it do not count (a hybrid model's
  // engine: as far as it can reuse; a worker past its end has no cap).
  std::vector<uint32_t> cap;
};

class TierScorer {
 public:
  // Scores worker ids below `workers`; `sources` must outlive it.
  TierScorer(size_t workers, const TierSources& sources);

  // Block b's holders (b = 0, 1, ... in order), which must stay valid
  // until the next Block. Always true: a store's block may carry any
  // engine's run on.
  bool Block(uint32_t b, absl::Span<const uint32_t> holders);
  // After the last block.
  void Finish();

  // An engine's runs (a store's are zero).
  TierRuns Of(WorkerId w) const;

 private:
  static constexpr int kRuns = 4;  // npu, cpu_local, cpu_share, disk

  uint8_t LevelOf(uint32_t holder) const;
  bool IsShared(WorkerId w) const {
    return w < sources_.shared.size() && sources_.shared[w];
  }
  uint32_t Cap(WorkerId w) const {
    return w < sources_.cap.size() ? sources_.cap[w] : UINT32_MAX;
  }
  // Run k of worker w carried on to block b over the stores' blocks.
  void CatchUp(WorkerId w, int k, uint32_t b);
  // Block b counted as `covered` by the stores (CPU, any medium).
  void Cover(uint32_t b, const std::array<bool, 2>& covered);
  // Moves the runs that block last_b_ advanced on by the blocks repeated
  // since.
  void FlushRepeats();

  const size_t workers_;
  const TierSources& sources_;
  // run_[w * kRuns + k]: blocks 0 .. run - 1 are covered.
  std::vector<uint32_t> run_;
  // For runs 2 and 3 (cpu_share, disk; no store covers the others):
  // gaps_[k - 2], the blocks no store covered in the run's tiers, in order;
  // uncovered_[k - 2][b], how many of them are before block b.
  std::array<std::vector<uint32_t>, 2> gaps_;
  std::array<std::vector<uint32_t>, 2> uncovered_;
  uint32_t blocks_ = 0;
  // A block whose holders equal the last one's advances the same runs: the
  // last block's holders, number, store cover and the runs it advanced
  // (indices into run_); the blocks with its holders since.
  absl::Span<const uint32_t> last_holders_;
  uint32_t last_b_ = 0;
  std::array<bool, 2> last_covered_ = {false, false};
  std::vector<uint32_t> advanced_;
  uint32_t repeats_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_TIER_SCORER_H_
