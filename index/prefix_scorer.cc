#include "index/prefix_scorer.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace prefixd {

void RouteScores::TakeLonger(const RouteScores& other) {
  if (!full.empty() || !other.full.empty()) {
    std::vector<uint32_t> longer(num_workers);
    for (WorkerId w = 0; w < num_workers; ++w)
      longer[w] = std::max(FullAttention(w), other.FullAttention(w));
    full = std::move(longer);
  }
  for (size_t i = 0; i < run.size() && i < other.run.size(); ++i)
    run[i] = std::max(run[i], other.run[i]);
}

PrefixScorer::PrefixScorer(size_t workers, size_t mediums,
                           const HybridRules& hybrid, RouteScores* out)
    : hybrid_(hybrid), out_(out) {
  out->num_workers = workers;
  out->num_mediums = std::max<size_t>(mediums, 1);
  out->run.assign(workers * (1 + out->num_mediums), 0);
  out->full.clear();
  if (!hybrid.empty()) {
    tallies_.assign(hybrid.workers.size() * kMaxGroups, GroupTally());
    usable_.assign(hybrid.workers.size(), 0);
    seen_at_.assign(hybrid.workers.size(), UINT32_MAX);
  }
}

bool PrefixScorer::Changed(uint32_t b, absl::Span<const uint32_t> holders) {
  if (hybrid_.empty()) return PlainBlock(b, holders);
  bool advanced = false;
  for (uint32_t h : holders) {
    const WorkerId w = HolderWorker(h);
    if (w >= out_->num_workers) continue;
    const int32_t hw = hybrid_.Of(w);
    if (hw < 0) {
      advanced |= Advance(w, HolderMedium(h), b);
    } else {
      HybridHolder(hw, h, b);
    }
  }
  for (int32_t hw : touched_) Boundary(hw, b + 1);
  touched_.clear();
  // A window or state group may make a later boundary usable although
  // nobody's run went on.
  return advanced || !hybrid_.empty();
}

// Block when no worker is hybrid (the usual fleet): each holder only
// extends its worker's runs. A run reads b after block b - 1 only if b - 1
// advanced it, so block b with b - 1's holders advances exactly the runs
// that b - 1 did: counted in repeats_ (by Block) until the holders change.
bool PrefixScorer::PlainBlock(uint32_t b, absl::Span<const uint32_t> holders) {
  FlushRepeats();
  last_holders_ = holders;
  full_b_ = b;
  bool advanced = false;
  for (uint32_t h : holders) {
    const WorkerId w = HolderWorker(h);
    if (w < out_->num_workers) advanced |= Advance(w, HolderMedium(h), b);
  }
  last_advanced_ = advanced;
  return advanced;
}

// The runs block full_b_ advanced are those of its holders that read
// full_b_ + 1; each is set (not added to: a worker may be listed once per
// group) to where the repeats took it.
void PrefixScorer::FlushRepeats() {
  if (repeats_ == 0) return;
  const uint32_t from = full_b_ + 1;
  const uint32_t to = from + repeats_;
  uint32_t* run = out_->run.data();
  for (uint32_t h : last_holders_) {
    const WorkerId w = HolderWorker(h);
    if (w >= out_->num_workers) continue;
    if (run[w] == from) run[w] = to;
    if (HolderMedium(h) < out_->num_mediums) {
      uint32_t& m =
          run[out_->num_workers + w * out_->num_mediums + HolderMedium(h)];
      if (m == from) m = to;
    }
  }
  repeats_ = 0;
}

void PrefixScorer::Finish() {
  if (hybrid_.empty()) {
    FlushRepeats();
    return;
  }
  out_->full.assign(out_->run.begin(),
                    out_->run.begin() + static_cast<long>(out_->num_workers));
  for (WorkerId w = 0; w < out_->num_workers; ++w) {
    const int32_t hw = hybrid_.Of(w);
    if (hw < 0) continue;
    out_->run[w] = usable_[static_cast<size_t>(hw)];
    out_->full[w] = FullRun(hw);
  }
}

bool PrefixScorer::Advance(WorkerId w, uint8_t medium, uint32_t b) {
  bool advanced = false;
  uint32_t* run = out_->run.data();
  if (run[w] == b) {
    run[w] = b + 1;
    advanced = true;
  }
  if (medium < out_->num_mediums) {
    uint32_t& m = run[out_->num_workers + w * out_->num_mediums + medium];
    if (m == b) {
      m = b + 1;
      advanced = true;
    }
  }
  return advanced;
}

void PrefixScorer::HybridHolder(int32_t hw, uint32_t holder, uint32_t b) {
  const int g = HolderGroup(holder);
  GroupTally& t = tallies_[static_cast<size_t>(hw) * kMaxGroups + g];
  if (t.run == b) t.run = b + 1;
  if (t.last != b) {
    if (t.last == UINT32_MAX || t.last + 1 != b) t.streak_start = b;
    t.last = b;
  }
  const HybridRules::Worker& rules = hybrid_.workers[static_cast<size_t>(hw)];
  if (rules.groups[g].kind == GroupKind::kFull &&
      HolderMedium(holder) < out_->num_mediums) {
    // Per medium: the full-attention groups' runs.
    uint32_t& m =
        out_->run[out_->num_workers + HolderWorker(holder) * out_->num_mediums +
                  HolderMedium(holder)];
    if (m == b) m = b + 1;
  }
  if (seen_at_[static_cast<size_t>(hw)] != b) {
    seen_at_[static_cast<size_t>(hw)] = b;
    touched_.push_back(hw);
  }
}

void PrefixScorer::Boundary(int32_t hw, uint32_t n) {
  const HybridRules::Worker& rules = hybrid_.workers[static_cast<size_t>(hw)];
  const GroupTally* t = &tallies_[static_cast<size_t>(hw) * kMaxGroups];
  for (int g = 0; g < rules.num_groups; ++g) {
    if (!GroupAllowsBoundary(rules.groups[g], t[g], n)) return;
  }
  usable_[static_cast<size_t>(hw)] = n;
}

uint32_t PrefixScorer::FullRun(int32_t hw) const {
  const HybridRules::Worker& rules = hybrid_.workers[static_cast<size_t>(hw)];
  uint32_t full = UINT32_MAX;
  for (int g = 0; g < rules.num_groups; ++g) {
    if (rules.groups[g].kind != GroupKind::kFull) continue;
    full =
        std::min(full, tallies_[static_cast<size_t>(hw) * kMaxGroups + g].run);
  }
  return full == UINT32_MAX ? 0 : full;
}

}  // namespace prefixd
