#include "index/tier_scorer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"

namespace prefixd {
namespace {

// The slowest level each run takes an engine's own block from.
constexpr std::array<uint8_t, 4> kOwnLevels = {0, 1, 1, 2};

}  // namespace

void TierRuns::TakeLonger(const TierRuns& other) {
  npu = std::max(npu, other.npu);
  cpu_local = std::max(cpu_local, other.cpu_local);
  cpu_share = std::max(cpu_share, other.cpu_share);
  disk = std::max(disk, other.disk);
}

uint8_t MediumLevel(absl::string_view medium) {
  if (absl::EqualsIgnoreCase(medium, "GPU") ||
      absl::EqualsIgnoreCase(medium, "NPU")) {
    return 0;
  }
  if (absl::EqualsIgnoreCase(medium, "CPU") ||
      absl::EqualsIgnoreCase(medium, "CPU_PINNED")) {
    return 1;
  }
  return 2;
}

TierScorer::TierScorer(size_t workers, const TierSources& sources)
    : workers_(workers), sources_(sources), run_(workers * kRuns, 0) {
  for (auto& u : uncovered_) u.assign(1, 0);
}

uint8_t TierScorer::LevelOf(uint32_t holder) const {
  const uint8_t m = HolderMedium(holder);
  const std::vector<uint8_t>& levels = sources_.medium_level;
  return m < levels.size() ? levels[m] : 2;
}

void TierScorer::CatchUp(WorkerId w, int k, uint32_t b) {
  uint32_t& x = run_[w * kRuns + static_cast<size_t>(k)];
  if (x >= b || k < 2) return;
  const size_t i = static_cast<size_t>(k - 2);
  const uint32_t before = uncovered_[i][x];
  // Carried to b, or stopped for good at the first block from x on that no
  // store covered (the engine did not hold it either: that would have
  // moved x past it).
  x = before == uncovered_[i][b] ? b : gaps_[i][before];
}

bool TierScorer::Block(uint32_t b, absl::Span<const uint32_t> holders) {
  if (holders.size() == last_holders_.size() && !last_holders_.empty() &&
      std::memcmp(holders.data(), last_holders_.data(),
                  holders.size() * sizeof(uint32_t)) == 0) {
    ++repeats_;
    Cover(b, last_covered_);
    return true;
  }
  FlushRepeats();
  std::array<bool, 2> covered = {false, false};  // by a store: CPU, any
  for (uint32_t h : holders) {
    const WorkerId w = HolderWorker(h);
    if (w >= workers_) continue;
    const uint8_t level = LevelOf(h);
    if (IsShared(w)) {
      covered[0] |= level <= 1;
      covered[1] = true;
      continue;
    }
    if (b >= Cap(w)) continue;
    for (int k = 0; k < kRuns; ++k) {
      if (level > kOwnLevels[static_cast<size_t>(k)]) continue;
      CatchUp(w, k, b);
      const size_t i = w * kRuns + static_cast<size_t>(k);
      if (run_[i] == b) {
        run_[i] = b + 1;
        advanced_.push_back(static_cast<uint32_t>(i));
      }
    }
  }
  Cover(b, covered);
  last_holders_ = holders;
  last_b_ = b;
  last_covered_ = covered;
  return true;
}

void TierScorer::Cover(uint32_t b, const std::array<bool, 2>& covered) {
  for (size_t i = 0; i < 2; ++i) {
    if (!covered[i]) gaps_[i].push_back(b);
    uncovered_[i].push_back(static_cast<uint32_t>(gaps_[i].size()));
  }
  blocks_ = b + 1;
}

// The runs block last_b_ advanced (to last_b_ + 1, below their workers'
// caps) are those each repeat advances, as far as the worker's cap.
void TierScorer::FlushRepeats() {
  const uint32_t to = last_b_ + 1 + repeats_;
  for (uint32_t i : advanced_) run_[i] = std::min(to, Cap(i / kRuns));
  advanced_.clear();
  repeats_ = 0;
}

void TierScorer::Finish() {
  FlushRepeats();
  for (WorkerId w = 0; w < workers_; ++w) {
    if (IsShared(w)) continue;
    for (int k = 2; k < kRuns; ++k) CatchUp(w, k, blocks_);
  }
}

TierRuns TierScorer::Of(WorkerId w) const {
  if (w >= workers_ || IsShared(w)) return {};
  const uint32_t* r = &run_[w * kRuns];
  return {r[0], r[1], r[2], r[3]};
}

}  // namespace prefixd
