#include "core/eviction.h"

#include <algorithm>
#include <cassert>

#include "absl/hash/hash.h"
#include "absl/strings/match.h"

namespace prefixd {

absl::string_view EvictionPolicyName(EvictionPolicy p) {
  switch (p) {
    case EvictionPolicy::kLru:
      return "LRU";
    case EvictionPolicy::kAdaptive:
      return "ADAPTIVE";
  }
  return "unknown";
}

bool ParseEvictionPolicy(absl::string_view name, EvictionPolicy* p) {
  for (EvictionPolicy q : {EvictionPolicy::kLru, EvictionPolicy::kAdaptive}) {
    if (absl::EqualsIgnoreCase(name, EvictionPolicyName(q))) {
      *p = q;
      return true;
    }
  }
  return false;
}

// --- Fingerprints
// -------------------------------------------------------------

// absl::HashOf, as the fleet index keys its blocks: fingerprints live only
// in this process's memory (a snapshot's are recomputed on load), so its
// per-process seed does no harm.
uint64_t NamespaceHash(absl::string_view ns) { return absl::HashOf(ns); }

uint64_t ChainHash(uint64_t parent, absl::Span<const Token> block) {
  return absl::HashOf(parent, block);
}

// --- U64Map
// -------------------------------------------------------------------

size_t U64Map::Probe(uint64_t key) const {
  const size_t mask = slots_.size() - 1;
  size_t i = Home(key);
  while (slots_[i].key != kFree && slots_[i].key != key) i = (i + 1) & mask;
  return i;
}

const uint64_t* U64Map::Find(uint64_t key) const {
  if (key == kFree) return has_free_key_ ? &free_key_value_ : nullptr;
  if (slots_.empty()) return nullptr;
  const Slot& s = slots_[Probe(key)];
  return s.key == key ? &s.value : nullptr;
}

bool U64Map::Put(uint64_t key, uint64_t value, uint64_t* old) {
  if (key == kFree) {
    const bool had = has_free_key_;
    *old = free_key_value_;
    has_free_key_ = true;
    free_key_value_ = value;
    return had;
  }
  if ((size_ + 1) * 2 > slots_.size()) Grow();
  Slot& s = slots_[Probe(key)];
  if (s.key == key) {
    *old = s.value;
    s.value = value;
    return true;
  }
  s = Slot{key, value};
  ++size_;
  return false;
}

bool U64Map::Erase(uint64_t key, uint64_t* value, const uint64_t* only_if) {
  if (key == kFree) {
    if (!has_free_key_ || (only_if && *only_if != free_key_value_))
      return false;
    if (value != nullptr) *value = free_key_value_;
    has_free_key_ = false;
    return true;
  }
  if (slots_.empty()) return false;
  size_t hole = Probe(key);
  if (slots_[hole].key != key || (only_if && *only_if != slots_[hole].value))
    return false;
  if (value != nullptr) *value = slots_[hole].value;
  // Backward shift: an entry after the hole moves into it unless its home
  // lies cyclically in (hole, its slot].
  const size_t mask = slots_.size() - 1;
  for (size_t j = (hole + 1) & mask; slots_[j].key != kFree;
       j = (j + 1) & mask) {
    if (((j - Home(slots_[j].key)) & mask) >= ((j - hole) & mask)) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].key = kFree;
  --size_;
  return true;
}

void U64Map::Grow() {
  std::vector<Slot> old = std::move(slots_);
  const size_t n = old.empty() ? 16 : old.size() * 2;
  slots_.assign(n, Slot{kFree, 0});
  shift_ = 64 - __builtin_ctzll(n);
  for (const Slot& s : old) {
    if (s.key != kFree) slots_[Probe(s.key)] = s;
  }
}

void U64Map::Clear() {
  slots_.clear();
  shift_ = 64;
  size_ = 0;
  has_free_key_ = false;
}

// --- History
// ------------------------------------------------------------------

int History::Take(uint64_t fp) {
  uint64_t tag;
  if (!tags_.Erase(fp, &tag)) return -1;
  const int list = static_cast<int>(tag & 1);
  --size_[list];
  return list;
}

void History::Push(int list, uint64_t fp) {
  const uint64_t tag = next_++ * 2 + static_cast<uint64_t>(list);
  uint64_t old;
  if (tags_.Put(fp, tag, &old)) --size_[old & 1];  // only a hash collision
  order_[list].push_back({tag, fp});
  ++size_[list];
  while (size_[list] > capacity_) {
    const auto [t, f] = order_[list].front();
    order_[list].pop_front();
    if (tags_.Erase(f, nullptr, &t)) --size_[list];
  }
  // Taken entries stay in order_ until they reach its front; rebuilding it
  // when they outnumber the live ones keeps it within O(capacity).
  if (order_[list].size() > 2 * size_[list] + 64) Compact(list);
}

void History::Compact(int list) {
  std::deque<std::pair<uint64_t, uint64_t>> live;
  for (const auto& [t, f] : order_[list]) {
    const uint64_t* tag = tags_.Find(f);
    if (tag != nullptr && *tag == t) live.push_back({t, f});
  }
  order_[list].swap(live);
}

void History::Clear() {
  tags_.Clear();
  order_[0].clear();
  order_[1].clear();
  size_[0] = size_[1] = 0;
}

bool History::CheckInvariants() const {
  if (size_[0] > capacity_ || size_[1] > capacity_ ||
      size_[0] + size_[1] != tags_.size())
    return false;
  for (int list = 0; list < 2; ++list) {
    size_t live = 0;
    for (const auto& [t, f] : order_[list]) {
      const uint64_t* tag = tags_.Find(f);
      live += tag != nullptr && *tag == t;
    }
    if (live != size_[list]) return false;
  }
  return true;
}

// --- EvictionState
// ------------------------------------------------------------

EvictionState::EvictionState(EvictionPolicy policy, uint64_t history_blocks,
                             uint64_t max_target)
    : policy_(policy),
      max_target_(max_target),
      target_(max_target / 2),
      history_(adaptive() ? history_blocks : 0) {}

void EvictionState::Sync(Node* n) {
  if (EntryKey(*n) != 0 || !n->evictable()) return;
  // Stamps start at 1: 0 is "no entry".
  assert(n->stamp != 0 && n->stamp <= kMaxStamp);
  // Usually a fresh stamp of the default priority, which sorts last: the
  // hint saves the descent (a wrong hint costs only the descent).
  Entries& set = sets_[ClassOf(*n)];
  SetEntryKey(n, n->stamp);
  set.insert(set.end(), {SetKey(*n), n});
}

void EvictionState::Erase(Node* n) {
  if (EntryKey(*n) == 0) return;
  sets_[ClassOf(*n)].erase({SetKey(*n), n});
  SetEntryKey(n, 0);
}

void EvictionState::SetPriority(Node* n, int p) {
  if (PriorityOf(*n) == p) return;
  const bool entry = EntryKey(*n) != 0;
  if (entry) sets_[ClassOf(*n)].erase({SetKey(*n), n});
  n->lru_key = (n->lru_key & ~(uint64_t{0x7f} << kPriorityShift)) |
               (static_cast<uint64_t>(p) << kPriorityShift);
  if (entry) sets_[ClassOf(*n)].insert({SetKey(*n), n});
}

bool EvictionState::HasEntry(const Node& n) const {
  return sets_[ClassOf(n)].contains({SetKey(n), const_cast<Node*>(&n)});
}

void EvictionState::Normalize(int c) {
  Entries& set = sets_[c];
  while (!set.empty()) {
    auto head = set.begin();
    Node* n = head->second;
    assert(SetKey(*n) == head->first && ClassOf(*n) == c);
    if (n->evictable() && EntryKey(*n) == n->stamp) return;
    set.erase(head);
    SetEntryKey(n, 0);
    Sync(n);  // back in at (stamp, n) if still evictable
  }
}

Node* EvictionState::Victim() {
  Normalize(kRecent);
  if (!adaptive()) return sets_[0].empty() ? nullptr : sets_[0].begin()->second;
  Normalize(kFrequent);
  int c = recent_blocks_ > target_ ? kRecent : kFrequent;
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
  assert(EntryKey(*n) == 0 || ClassOf(*n) == cls);
  n->lru_key = (cls == kFrequent ? kClassBit : 0) | SetKey(*n);
  if (cls == kRecent) recent_blocks_ += blocks;
}

void EvictionState::RemoveBlocks(const Node& n, size_t blocks) {
  if (ClassOf(n) == kRecent) recent_blocks_ -= blocks;
}

// The entry, if any, moves to the kFrequent set with its (maybe stale) key,
// which the lazy scheme allows.
void EvictionState::Promote(Node* n) {
  const bool entry = EntryKey(*n) != 0;
  if (entry) sets_[kRecent].erase({SetKey(*n), n});
  recent_blocks_ -= n->num_blocks();
  n->lru_key |= kClassBit;
  if (entry) sets_[kFrequent].insert({SetKey(*n), n});
}

int EvictionState::ClassForNew(uint64_t fp) {
  if (!adaptive()) return kRecent;
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
  if (!adaptive() || ClassOf(victim) == kFrequent) return limit;
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
  if (!adaptive()) return;
  auto it = fps_.find(&victim);
  assert(it != fps_.end() && it->second.size() == victim.num_blocks() &&
         blocks <= victim.num_blocks());
  std::vector<uint64_t>& fps = it->second;
  const int list = ClassOf(victim) == kRecent ? 0 : 1;
  for (size_t i = 0; i < blocks; ++i) {
    history_.Push(list, fps.back());
    fps.pop_back();
  }
  if (fps.empty()) fps_.erase(it);  // the node goes with its blocks
}

uint64_t EvictionState::FingerprintAbove(const Node& parent) const {
  if (parent.is_root()) return NamespaceHash(parent.tree->ns);
  auto it = fps_.find(&parent);
  assert(it != fps_.end() && !it->second.empty());
  return it->second.back();
}

void EvictionState::SetFingerprints(const Node& n) {
  if (!adaptive()) return;
  uint64_t fp = FingerprintAbove(*n.parent);
  std::vector<uint64_t>& v = fps_[&n];
  v.clear();
  for (size_t i = 0; i < n.num_blocks(); ++i)
    v.push_back(fp = ChainHash(fp, n.block(i)));
}

void EvictionState::SplitFingerprints(const Node* head, const Node* tail,
                                      size_t blocks) {
  if (!adaptive()) return;
  // The head's are copied out before fps_[head] inserts: a rehash moves
  // the tail's vector, and a reference to it would dangle.
  std::vector<uint64_t>& t = fps_[tail];
  assert(t.size() > blocks);
  std::vector<uint64_t> first(t.begin(), t.begin() + blocks);
  t.erase(t.begin(), t.begin() + blocks);
  fps_[head] = std::move(first);
}

bool EvictionState::CheckFingerprints(const Node& n) const {
  if (!adaptive()) return fps_.empty();
  if (!n.parent->is_root()) {
    auto p = fps_.find(n.parent);
    if (p == fps_.end() || p->second.size() != n.parent->num_blocks())
      return false;
  }
  auto it = fps_.find(&n);
  if (it == fps_.end() || it->second.size() != n.num_blocks()) return false;
  uint64_t fp = FingerprintAbove(*n.parent);
  for (size_t i = 0; i < n.num_blocks(); ++i) {
    fp = ChainHash(fp, n.block(i));
    if (it->second[i] != fp) return false;
  }
  return true;
}

void EvictionState::Clear() {
  sets_[0].clear();
  sets_[1].clear();
  recent_blocks_ = 0;
  target_ = max_target_ / 2;
  history_.Clear();
  fps_.clear();
}

}  // namespace prefixd
