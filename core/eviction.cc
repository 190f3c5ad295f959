#include "core/eviction.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/match.h"

namespace prefixd {
namespace {

uint64_t Mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ULL;
  return x ^ (x >> 32);
}

uint64_t Mum(uint64_t a, uint64_t b) {
  const unsigned __int128 r = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

}  // namespace

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

uint64_t NamespaceHash(absl::string_view ns) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, then mixed
  for (char c : ns) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return Mix(h ^ ns.size());
}

// wyhash's folded 64x64->128 multiply: 16 bytes of a block per step.
uint64_t ChainHash(uint64_t parent, absl::Span<const Token> block) {
  constexpr uint64_t k0 = 0xa0761d6478bd642fULL, k1 = 0xe7037ed1a0b428dbULL;
  uint64_t h = parent ^ k0;
  size_t i = 0;
  for (; i + 4 <= block.size(); i += 4) {
    const uint64_t a = block[i] | (uint64_t{block[i + 1]} << 32);
    const uint64_t b = block[i + 2] | (uint64_t{block[i + 3]} << 32);
    h = Mum(a ^ k1, b ^ h);
  }
  for (; i < block.size(); ++i) h = Mum(block[i] ^ k1, h ^ k0);
  return Mum(h ^ k1, block.size() ^ k0);
}

// --- History
// ------------------------------------------------------------------

int History::Take(uint64_t fp) {
  auto it = tags_.find(fp);
  if (it == tags_.end()) return -1;
  const int list = static_cast<int>(it->second & 1);
  tags_.erase(it);
  --size_[list];
  return list;
}

void History::Push(int list, uint64_t fp) {
  Take(fp);  // only a hash collision finds it there
  const uint64_t tag = next_++ * 2 + static_cast<uint64_t>(list);
  tags_[fp] = tag;
  order_[list].push_back({tag, fp});
  ++size_[list];
  while (size_[list] > capacity_) {
    const auto [t, f] = order_[list].front();
    order_[list].pop_front();
    auto it = tags_.find(f);
    if (it != tags_.end() && it->second == t) {
      tags_.erase(it);
      --size_[list];
    }
  }
  // Taken entries stay in order_ until they reach its front; rebuilding it
  // when they outnumber the live ones keeps it within O(capacity).
  if (order_[list].size() > 2 * size_[list] + 64) Compact(list);
}

void History::Compact(int list) {
  std::deque<std::pair<uint64_t, uint64_t>> live;
  for (const auto& [t, f] : order_[list]) {
    auto it = tags_.find(f);
    if (it != tags_.end() && it->second == t) live.push_back({t, f});
  }
  order_[list].swap(live);
}

void History::Clear() {
  tags_.clear();
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
      auto it = tags_.find(f);
      live += it != tags_.end() && it->second == t;
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
      history_(adaptive() ? history_blocks : 0) {}

void EvictionState::Sync(Node* n) {
  if (EntryKey(*n) != 0 || !n->evictable()) return;
  // Stamps start at 1: 0 is "no entry".
  assert(n->stamp != 0 && n->stamp < kClassBit);
  // Usually a fresh stamp, which sorts last: the hint saves the descent.
  Entries& set = sets_[ClassOf(*n)];
  set.insert(set.end(), {n->stamp, n});
  SetEntryKey(n, n->stamp);
}

void EvictionState::Erase(Node* n) {
  const uint64_t key = EntryKey(*n);
  if (key == 0) return;
  sets_[ClassOf(*n)].erase({key, n});
  SetEntryKey(n, 0);
}

bool EvictionState::HasEntry(const Node& n) const {
  return sets_[ClassOf(n)].contains({EntryKey(n), const_cast<Node*>(&n)});
}

void EvictionState::Normalize(int c) {
  Entries& set = sets_[c];
  while (!set.empty()) {
    auto head = set.begin();
    Node* n = head->second;
    assert(EntryKey(*n) == head->first && ClassOf(*n) == c);
    if (n->evictable() && head->first == n->stamp) return;
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
  return sets_[c].empty() ? nullptr : sets_[c].begin()->second;
}

void EvictionState::AddBlocks(Node* n, int cls, size_t blocks) {
  assert(EntryKey(*n) == 0 || ClassOf(*n) == cls);
  n->lru_key = (cls == kFrequent ? kClassBit : 0) | EntryKey(*n);
  if (cls == kRecent) recent_blocks_ += blocks;
}

void EvictionState::RemoveBlocks(const Node& n, size_t blocks) {
  if (ClassOf(n) == kRecent) recent_blocks_ -= blocks;
}

// The entry, if any, moves to the kFrequent set with its (maybe stale) key,
// which the lazy scheme allows.
void EvictionState::Promote(Node* n) {
  const uint64_t key = EntryKey(*n);
  if (key != 0) sets_[kRecent].erase({key, n});
  recent_blocks_ -= n->num_blocks();
  n->lru_key = kClassBit | key;
  if (key != 0) sets_[kFrequent].insert({key, n});
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

void EvictionState::RememberTail(const Node& victim) {
  if (!adaptive()) return;
  auto it = fps_.find(victim.block_ids().back());
  assert(it != fps_.end());
  history_.Push(ClassOf(victim) == kRecent ? 0 : 1, it->second);
  fps_.erase(it);
}

uint64_t EvictionState::FingerprintAbove(const Node& parent) const {
  if (parent.is_root()) return NamespaceHash(parent.tree->ns);
  auto it = fps_.find(parent.block_ids().back());
  assert(it != fps_.end());
  return it->second;
}

void EvictionState::SetFingerprints(const Node& n) {
  if (!adaptive()) return;
  uint64_t fp = FingerprintAbove(*n.parent);
  for (size_t i = 0; i < n.num_blocks(); ++i)
    fps_[n.block_ids()[i]] = fp = ChainHash(fp, n.block(i));
}

bool EvictionState::CheckFingerprints(const Node& n) const {
  if (!adaptive()) return fps_.empty();
  if (!n.parent->is_root() && !fps_.contains(n.parent->block_ids().back()))
    return false;
  uint64_t fp = FingerprintAbove(*n.parent);
  for (size_t i = 0; i < n.num_blocks(); ++i) {
    fp = ChainHash(fp, n.block(i));
    auto it = fps_.find(n.block_ids()[i]);
    if (it == fps_.end() || it->second != fp) return false;
  }
  return true;
}

void EvictionState::Clear() {
  sets_[0].clear();
  sets_[1].clear();
  recent_blocks_ = target_ = 0;
  history_.Clear();
  fps_.clear();
}

}  // namespace prefixd
