#include "core/eviction.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace prefixd {

absl::string_view EvictionPolicyName(EvictionPolicy p) {
  switch (p) {
    case EvictionPolicy::kLru:
      return "LRU";
    case EvictionPolicy::kAdaptive:
      return "ADAPTIVE";
    case EvictionPolicy::kShadow:
      return "SHADOW";
  }
  return "unknown";
}

bool ParseEvictionPolicy(absl::string_view name, EvictionPolicy* p) {
  for (EvictionPolicy q : {EvictionPolicy::kLru, EvictionPolicy::kAdaptive,
                           EvictionPolicy::kShadow}) {
    if (absl::EqualsIgnoreCase(name, EvictionPolicyName(q))) {
      *p = q;
      return true;
    }
  }
  return false;
}

// --- EvictionState
// ------------------------------------------------------------

EvictionState::EvictionState(EvictionPolicy policy, uint64_t history_blocks,
                             uint64_t max_target)
    : policy_(policy),
      max_target_(max_target),
      target_(InitialTarget()),
      history_(keeps_fingerprints() ? history_blocks : 0) {
  if (shadow())
    shadows_ =
        std::make_unique<Shadows>(max_target / 4, history_.capacity() / 4);
}

// A quarter of the limit (at least 1), bounded so that slab slots fit in
// 32 bits; a probation of a twentieth.
EvictionState::Shadows::Shadows(uint64_t capacity, uint64_t ghosts)
    : lru(ShadowCache::Rule::kLru,
          std::clamp<uint64_t>(capacity, 1, uint64_t{1} << 31), 0, 0),
      lirs(ShadowCache::Rule::kLirs,
           std::clamp<uint64_t>(capacity, 1, uint64_t{1} << 31),
           Probation(capacity), ghosts),
      period(std::clamp<uint64_t>(capacity, 1, uint64_t{1} << 31) * 4) {}

void EvictionState::Observe(absl::Span<const uint64_t> fps) {
  if (shadows_ == nullptr) return;
  Shadows& s = *shadows_;
  for (uint64_t fp : fps) {  // overlaps the misses of the probes below
    if (!Sampled(fp)) continue;
    s.lru.Prefetch(fp);
    s.lirs.Prefetch(fp);
  }
  for (uint64_t fp : fps) {
    if (!Sampled(fp)) continue;
    s.hits[0] += s.lru.Access(fp);
    s.hits[1] += s.lirs.Access(fp);
    if (++s.accesses == s.period) {
      s.hits[0] /= 2;
      s.hits[1] /= 2;
      s.accesses = 0;
    }
  }
}

void EvictionState::Sync(Node* n) {
  if (EntryStampOf(*n) != 0 || !n->evictable()) return;
  // Stamps start at 1: 0 is "no entry".
  assert(n->stamp != 0 && n->stamp <= kMaxStamp);
  // Usually a fresh stamp of the default priority, which sorts last: the
  // hint saves the descent (a wrong hint costs only the descent).
  Entries& set = sets_[ClassOf(*n)];
  SetEntryStamp(n, n->stamp);
  set.insert(set.end(), {PriorityStampOf(*n), n});
}

void EvictionState::Erase(Node* n) {
  if (EntryStampOf(*n) == 0) return;
  sets_[ClassOf(*n)].erase({PriorityStampOf(*n), n});
  SetEntryStamp(n, 0);
}

void EvictionState::SetPriority(Node* n, int p) {
  if (PriorityOf(*n) == p) return;
  const bool entry = EntryStampOf(*n) != 0;
  if (entry) sets_[ClassOf(*n)].erase({PriorityStampOf(*n), n});
  n->class_priority_stamp = (n->class_priority_stamp & ~kPriorityBits) |
                            (static_cast<uint64_t>(p) << kPriorityShift);
  if (entry) sets_[ClassOf(*n)].insert({PriorityStampOf(*n), n});
}

bool EvictionState::HasEntry(const Node& n) const {
  return sets_[ClassOf(n)].contains(
      {PriorityStampOf(n), const_cast<Node*>(&n)});
}

void EvictionState::Normalize(int c) {
  Entries& set = sets_[c];
  while (!set.empty()) {
    auto head = set.begin();
    Node* n = head->second;
    assert(PriorityStampOf(*n) == head->first && ClassOf(*n) == c);
    if (n->evictable() && EntryStampOf(*n) == n->stamp) return;
    set.erase(head);
    SetEntryStamp(n, 0);
    Sync(n);  // back in at (stamp, n) if still evictable
  }
}

Node* EvictionState::Victim() {
  Normalize(kRecent);
  if (!keeps_fingerprints())
    return sets_[0].empty() ? nullptr : sets_[0].begin()->second;
  Normalize(kFrequent);
  int c = recent_blocks_ > target_ ? kRecent : kFrequent;
  if (lru_leads()) {  // the older head of the two; keys are unique
    c = kRecent;
    if (sets_[c].empty() ||
        (!sets_[kFrequent].empty() &&
         sets_[kFrequent].begin()->first < sets_[kRecent].begin()->first))
      c = kFrequent;
  }
  if (sets_[c].empty()) c = 1 - c;
  if (sets_[c].empty()) return nullptr;
  // The lowest priority first; the class choice only within one priority.
  const Entries& other = sets_[1 - c];
  if (!other.empty() && PriorityOf(*other.begin()->second) <
                            PriorityOf(*sets_[c].begin()->second))
    c = 1 - c;
  return sets_[c].begin()->second;
}

void EvictionState::AddBlocks(Node* n, int cls, size_t blocks) {
  assert(EntryStampOf(*n) == 0 || ClassOf(*n) == cls);
  n->class_priority_stamp =
      (cls == kFrequent ? kClassBit : 0) | PriorityStampOf(*n);
  if (cls == kRecent) recent_blocks_ += blocks;
}

void EvictionState::RemoveBlocks(const Node& n, size_t blocks) {
  if (ClassOf(n) == kRecent) recent_blocks_ -= blocks;
}

// The entry, if any, moves to the kFrequent set with its (maybe stale) key,
// which the lazy scheme allows.
void EvictionState::Promote(Node* n) {
  const bool entry = EntryStampOf(*n) != 0;
  if (entry) sets_[kRecent].erase({PriorityStampOf(*n), n});
  recent_blocks_ -= n->num_blocks();
  n->class_priority_stamp |= kClassBit;
  if (entry) sets_[kFrequent].insert({PriorityStampOf(*n), n});
}

int EvictionState::ClassForNew(uint64_t fp) {
  if (!keeps_fingerprints()) return kRecent;
  if (shadow()) return history_.Take(fp) >= 0 ? kFrequent : kRecent;
  // ARC's adaptation, with the lists' sizes before fp leaves its list.
  const uint64_t in_b1 = history_.size(0), in_b2 = history_.size(1);
  switch (history_.Take(fp)) {
    case 0:
      target_ =
          std::min(max_target_, target_ + std::max<uint64_t>(in_b2 / in_b1, 1));
      return kFrequent;
    case 1: {
      const uint64_t step = std::max<uint64_t>(in_b1 / in_b2, 1);
      target_ = target_ > step ? target_ - step : 0;
      return kFrequent;
    }
  }
  return kRecent;
}

size_t EvictionState::RunLength(const Node& victim, size_t limit) const {
  assert(limit > 0);
  if (!keeps_fingerprints() || lru_leads() || ClassOf(victim) == kFrequent)
    return limit;
  // A T1 victim with T2 empty, or of lower priority than T2's head, stays
  // the victim. Otherwise the priorities are equal (a lower T2 head would
  // have been chosen) and T1 was chosen for holding more than the target:
  // it is chosen again while it still does.
  const Entries& frequent = sets_[kFrequent];
  if (frequent.empty() ||
      PriorityOf(victim) < PriorityOf(*frequent.begin()->second))
    return limit;
  assert(recent_blocks_ > target_);
  return std::min<uint64_t>(limit, recent_blocks_ - target_);
}

void EvictionState::RememberTail(const Node& victim, size_t blocks) {
  if (!keeps_fingerprints()) return;
  const int list = ClassOf(victim) == kRecent || shadow() ? 0 : 1;
  const absl::Span<const uint64_t> fps = victim.fingerprints();
  assert(fps.size() == victim.num_blocks() && blocks <= fps.size());
  history_.PushReversed(list, fps.last(blocks));
}

void EvictionState::Clear() {
  sets_[0].clear();
  sets_[1].clear();
  recent_blocks_ = 0;
  target_ = InitialTarget();
  history_.Clear();
  if (shadow())
    shadows_ =
        std::make_unique<Shadows>(max_target_ / 4, history_.capacity() / 4);
}

// --- Invariants
// ---------------------------------------------------------------

// The lazy entry sets (tenant.h): an evictable node has an entry in its
// class's set; an entry's key is its node's and no newer than its stamp.
absl::Status EvictionState::CheckEntry(const Node& n) const {
  if (n.evictable() && EntryStampOf(n) == 0)
    return absl::InternalError("an evictable node has no LRU entry");
  if (EntryStampOf(n) == 0) return absl::OkStatus();
  if (EntryStampOf(n) > n.stamp) {
    return absl::InternalError(
        absl::StrFormat("LRU entry at %d is newer than its node's stamp %d",
                        EntryStampOf(n), n.stamp));
  }
  if (!HasEntry(n)) {
    return absl::InternalError(
        "a node's LRU entry is missing from its class's set");
  }
  return absl::OkStatus();
}

absl::Status EvictionState::CheckNode(const Node& n) const {
  if (ClassOf(n) != kRecent && !keeps_fingerprints()) {
    return absl::InternalError("a node has ADAPTIVE's second class under LRU");
  }
  return CheckEntry(n);
}

// Every entry names a live node of this tenant under that node's key
// (never a freed one).
absl::Status EvictionState::CheckEntriesAreLive(
    const absl::flat_hash_set<const Node*>& live) const {
  for (int cls = 0; cls < 2; ++cls) {
    for (const auto& [key, node] : sets_[cls]) {
      if (!live.contains(node)) {
        return absl::InternalError(
            "an LRU entry names a node that is not in the trees");
      }
      if (EntryStampOf(*node) == 0 || PriorityStampOf(*node) != key ||
          ClassOf(*node) != cls) {
        return absl::InternalError(absl::StrFormat(
            "entry at %d in set %d, its node says %d in class %d", key, cls,
            PriorityStampOf(*node), ClassOf(*node)));
      }
    }
  }
  return absl::OkStatus();
}

// As many entries as nodes that say they have one: no node has two.
absl::Status EvictionState::CheckEntryCount(
    const absl::flat_hash_set<const Node*>& live) const {
  size_t with_entry = 0;
  for (const Node* n : live) with_entry += EntryStampOf(*n) != 0;
  const size_t entries = sets_[0].size() + sets_[1].size();
  if (with_entry == entries) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "%d nodes have an LRU entry, the sets hold %d", with_entry, entries));
}

absl::Status EvictionState::CheckRecentBlocks(
    const absl::flat_hash_set<const Node*>& live) const {
  uint64_t recent = 0;
  for (const Node* n : live) {
    if (ClassOf(*n) == kRecent) recent += n->num_blocks();
  }
  if (recent == recent_blocks_) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "%d blocks seen once, the policy counts %d", recent, recent_blocks_));
}

absl::Status EvictionState::CheckTargetAndHistory() const {
  if (target_ > max_target_ || (shadow() && target_ != InitialTarget())) {
    return absl::InternalError(
        absl::StrFormat("the target %d is above the limit %d or not SHADOW's",
                        target_, max_target_));
  }
  if (shadows_ != nullptr) {
    RETURN_IF_ERROR(shadows_->lru.CheckInvariants());
    RETURN_IF_ERROR(shadows_->lirs.CheckInvariants());
  }
  return history_.CheckInvariants();
}

absl::Status EvictionState::CheckInvariants(
    const absl::flat_hash_set<const Node*>& live) const {
  RETURN_IF_ERROR(CheckEntriesAreLive(live));
  RETURN_IF_ERROR(CheckEntryCount(live));
  RETURN_IF_ERROR(CheckRecentBlocks(live));
  return CheckTargetAndHistory();
}

}  // namespace prefixd
