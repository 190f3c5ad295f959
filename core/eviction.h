// The eviction policy of one tenant (docs/architecture.md, "Eviction
// policies"): the order in which its evictable leaves go, and ADAPTIVE's
// history.
//
// Both policies keep, per class, a lazily kept set of (key, node) entries of
// evictable leaves, oldest stamp first (tenant.h explains the laziness: a
// touch writes only stamps; the head is normalized before it is read). LRU
// has one class. ADAPTIVE is ARC (Megiddo and Modha) adapted to a prefix
// tree whose leaves are evicted one tail block at a time:
//   - a node is kRecent (ARC's T1: seen once since it was cached) or
//     kFrequent (T2: matched again by a Match or a later Insert, or cached
//     while its fingerprint was in the history); a node's blocks share its
//     class, so the tenant splits runs of new blocks by class (Attach);
//   - the history is two bounded FIFOs of fingerprints of evicted blocks, B1
//     (evicted from T1) and B2 (from T2). A block cached again while its
//     fingerprint is in B1 moves the target p of T1 blocks up by
//     max(|B2| / |B1|, 1), in B2 down by max(|B1| / |B2|, 1); integers only,
//     so runs are bit-for-bit deterministic;
//   - the victim is the least recently used evictable leaf of T1 if T1 holds
//     more than p blocks, else of T2; the other class if that one has none;
//   - p starts at half the tenant's limit, not at ARC's 0: on the Mooncake
//     conversation trace at 60,000 blocks, ARC from 0 falls 0.6 points
//     below LRU (docs/performance.md), and from the middle 0.12.
// A fingerprint is a 64-bit chain hash over the block's whole path and its
// namespace: absl::HashOf(parent's chain hash, the block's tokens). ADAPTIVE
// keeps each cached block's, in one vector per node, so that neither an Insert
// nor an eviction hashes more than the blocks it adds or removes, and an
// eviction finds its block's next to the last one's.
#ifndef PREFIXD_CORE_EVICTION_H_
#define PREFIXD_CORE_EVICTION_H_

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/cache.h"
#include "core/radix_tree.h"
#include "core/types.h"

namespace prefixd {

enum NodeClass : int { kRecent = 0, kFrequent = 1 };

// Node has no room for another field (radix_tree.h caps it at 104 bytes), so
// Node::lru_key holds the class in its top bit, the retention priority
// (0..100, cache_types.h) in the 7 bits below it and the entry's stamp in the
// low 56 bits; stamps never come near 2^56 (snapshots refuse larger ones).
// A set's key is lru_key without the class bit, (priority, stamp): the sets
// order by priority first, so the head of a set is the least recently used
// evictable leaf of the lowest priority present.
inline constexpr uint64_t kClassBit = uint64_t{1} << 63;
inline constexpr int kPriorityShift = 56;
inline constexpr uint64_t kStampMask = (uint64_t{1} << kPriorityShift) - 1;
inline constexpr uint64_t kMaxStamp = kStampMask;
inline int ClassOf(const Node& n) { return static_cast<int>(n.lru_key >> 63); }
inline int PriorityOf(const Node& n) {
  return static_cast<int>((n.lru_key >> kPriorityShift) & 0x7f);
}
// The entry's stamp; 0: no entry.
inline uint64_t EntryKey(const Node& n) { return n.lru_key & kStampMask; }
// (priority, stamp) as one comparable key, as the sets and the cache's
// cross-tenant victim choice order them.
inline uint64_t VictimKey(int priority, uint64_t stamp) {
  return (static_cast<uint64_t>(priority) << kPriorityShift) | stamp;
}
inline uint64_t SetKey(const Node& n) { return n.lru_key & ~kClassBit; }

// Fingerprints.
uint64_t NamespaceHash(absl::string_view ns);
uint64_t ChainHash(uint64_t parent, absl::Span<const Token> block);

// A map from uint64 to uint64: open addressing, linear probing, Fibonacci
// hashing and backward-shift deletion, so that the history's steady churn
// (an insert and an erase per evicted block) leaves no tombstones to probe
// past or to clean up by rehashing. Load at most 1/2: most probes are
// misses (a new block's fingerprint is rarely in the history), and a miss
// or an erase scans the whole cluster, which at 3/4 cost a third of
// ADAPTIVE's replay time (docs/performance.md).
class U64Map {
 public:
  size_t size() const { return size_; }
  const uint64_t* Find(uint64_t key) const;
  // Inserts, or replaces and returns true with the old value in *old.
  bool Put(uint64_t key, uint64_t value, uint64_t* old);
  // Removes key if present (and, with `only_if`, its value is that one);
  // true, with its value in *value if not null, if it did.
  bool Erase(uint64_t key, uint64_t* value = nullptr,
             const uint64_t* only_if = nullptr);
  void Clear();

 private:
  struct Slot {
    uint64_t key, value;
  };
  static constexpr uint64_t kFree = ~uint64_t{0};  // a key, kept aside
  size_t Home(uint64_t key) const {
    return static_cast<size_t>((key * 0x9e3779b97f4a7c15ULL) >> shift_);
  }
  // The slot holding key, or the free slot where it would go.
  size_t Probe(uint64_t key) const;
  void Grow();

  std::vector<Slot> slots_;  // a power of two of them, or none
  int shift_ = 64;           // 64 - log2(slots_.size())
  size_t size_ = 0;
  bool has_free_key_ = false;  // the entry of key kFree
  uint64_t free_key_value_ = 0;
};

// ADAPTIVE's history: B1 and B2 (lists 0 and 1), each a FIFO set of at
// most `capacity` fingerprints, in one hash map so that a lookup costs one
// probe. Push adds the newest and drops the list's oldest beyond the
// capacity; Take removes one from the middle. O(1) amortized each.
class History {
 public:
  explicit History(uint64_t capacity) : capacity_(capacity) {}
  size_t size(int list) const { return size_[list]; }
  uint64_t capacity() const { return capacity_; }
  // The list that held fp, which forgets it; -1 if neither did.
  int Take(uint64_t fp);
  void Push(int list, uint64_t fp);
  void Clear();
  // Whether the FIFOs and the map agree and the capacity holds.
  bool CheckInvariants() const;

 private:
  void Compact(int list);

  const uint64_t capacity_;
  uint64_t next_ = 0;  // push number
  // fp -> its push number * 2 + its list.
  U64Map tags_;
  // (tag, fp), oldest first; an entry whose tag is not tags_'s for its fp
  // was taken (or pushed again) and is skipped.
  std::deque<std::pair<uint64_t, uint64_t>> order_[2];
  size_t size_[2] = {0, 0};
};

// REQUIRES the owning tenant's mutex for everything.
class EvictionState {
 public:
  // `max_target`: the most T1 may be aimed at (the tenant's limit in blocks);
  // `history_blocks`: the capacity of B1 and of B2.
  EvictionState(EvictionPolicy policy, uint64_t history_blocks,
                uint64_t max_target);

  bool adaptive() const { return policy_ == EvictionPolicy::kAdaptive; }
  EvictionPolicy policy() const { return policy_; }

  // The lazily kept entry sets (tenant.h). Sync gives an evictable node
  // without an entry one at (stamp, node) in its class's set; Erase drops a
  // node's entry, if any (every node goes through it before it is freed).
  void Sync(Node* n);
  void Erase(Node* n);
  // The leaf to evict next (nullptr if none), with the heads of both sets
  // normalized first.
  Node* Victim();

  // A node's blocks were cached (kRecent or kFrequent) or removed.
  void AddBlocks(Node* n, int cls, size_t blocks);
  void RemoveBlocks(const Node& n, size_t blocks);
  // A Match or a later Insert touched n: kRecent becomes kFrequent.
  void Touch(Node* n) {
    if (ClassOf(*n) == kRecent && adaptive()) Promote(n);
  }
  // The class of a block about to be cached with fingerprint fp: kFrequent
  // if the history remembers it (which adapts the target and forgets it).
  int ClassForNew(uint64_t fp);
  // How many of the tail blocks of `victim` (Victim()), at most `limit`, go
  // before the policy would choose another leaf: the victim stays the same
  // while its blocks go, except under ADAPTIVE when T1's blocks fall to the
  // target. Evicting them in one run is then block for block the same as
  // one at a time. At least 1.
  size_t RunLength(const Node& victim, size_t limit) const;
  // The last `blocks` blocks of `victim` are about to be evicted: their
  // fingerprints move to the history, the tail's first.
  void RememberTail(const Node& victim, size_t blocks);
  // SplitAt made `head` of tail's first blocks: same class and priority, no
  // entry yet.
  static void Split(Node* head, const Node& tail) {
    head->lru_key = tail.lru_key & ~kStampMask;
  }
  // Gives n retention priority p, moving its entry, if any, to (p, its
  // stamp): the lazy scheme's keys stay no newer than the stamp.
  void SetPriority(Node* n, int p);

  // Per-block fingerprints (ADAPTIVE only; no-ops under LRU).
  // The fingerprint the first block below `parent` chains from.
  uint64_t FingerprintAbove(const Node& parent) const;
  // Blocks appended to n (a new node or a leaf extended in place).
  void AddFingerprints(const Node* n, absl::Span<const uint64_t> fps) {
    if (adaptive()) {
      std::vector<uint64_t>& v = fps_[n];
      v.insert(v.end(), fps.begin(), fps.end());
    }
  }
  // Computes those of all n's blocks (a snapshot's nodes).
  void SetFingerprints(const Node& n);
  // SplitAt moved tail's first `blocks` blocks to `head`.
  void SplitFingerprints(const Node* head, const Node* tail, size_t blocks);
  void DropFingerprints(const Node* n) {
    if (adaptive()) fps_.erase(n);
  }
  // Whether n's blocks have their fingerprints (and, under LRU, none).
  bool CheckFingerprints(const Node& n) const;
  size_t num_fingerprint_nodes() const { return fps_.size(); }
  // Everything back to the empty tenant's state (Reset).
  void Clear();

  uint64_t recent_blocks() const { return recent_blocks_; }
  uint64_t target() const { return target_; }
  const History& history() const { return history_; }

  // Whether (key, n) is n's entry in its class's set.
  bool HasEntry(const Node& n) const;
  size_t num_entries() const { return sets_[0].size() + sets_[1].size(); }
  template <typename F>
  void ForEachEntry(F&& f) const {
    for (int c = 0; c < 2; ++c) {
      for (const auto& [key, node] : sets_[c]) f(c, key, node);
    }
  }

 private:
  using Entries = absl::btree_set<std::pair<uint64_t, Node*>>;
  static void SetEntryKey(Node* n, uint64_t key) {
    n->lru_key = (n->lru_key & ~kStampMask) | key;
  }
  // Makes sets_[c].begin() the exact LRU evictable leaf of class c.
  void Normalize(int c);
  void Promote(Node* n);

  const EvictionPolicy policy_;
  const uint64_t max_target_;
  Entries sets_[2];
  uint64_t recent_blocks_ = 0;  // blocks of kRecent nodes (all under LRU)
  uint64_t target_;             // ARC's p, in blocks
  History history_;
  // node -> its blocks' fingerprints, in order.
  absl::flat_hash_map<const Node*, std::vector<uint64_t>> fps_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_EVICTION_H_
