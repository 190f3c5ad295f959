// The eviction policy of one tenant (docs/architecture.md, "Eviction
// policies"): the order in which its evictable leaves go, and the history
// and shadows of ADAPTIVE and SHADOW.
//
// Every policy keeps, per class, a lazily kept set of (key, node) entries of
// evictable leaves, oldest stamp first (tenant.h explains the laziness: a
// touch writes only stamps; the head is normalized before it is read). LRU
// has one class. ADAPTIVE is ARC (Megiddo and Modha) adapted to a prefix
// tree whose leaves are evicted one tail block at a time:
//   - a node is kRecent (ARC's T1: seen once since it was cached) or
//     kFrequent (T2: matched again by a Match or a later Insert, or cached
//     while its fingerprint was in the history); a node's blocks share its
//     class, so the tenant splits runs of new blocks by class (Attach);
//   - the history is two bounded lists of fingerprints of evicted blocks, B1
//     (evicted from T1) and B2 (from T2). A block cached again while its
//     fingerprint is in B1 moves the target p of T1 blocks up by
//     max(|B2| / |B1|, 1), in B2 down by max(|B1| / |B2|, 1); integers only,
//     so runs are bit-for-bit deterministic;
//   - the victim is the least recently used evictable leaf of T1 if T1 holds
//     more than p blocks, else of T2; the other class if that one has none;
//   - p starts at half the tenant's limit, not at ARC's 0: on the Mooncake
//     conversation trace at 60,000 blocks, ARC from 0 falls 0.6 points
//     below LRU (docs/performance.md), and from the middle 0.12.
// SHADOW has ADAPTIVE's classes and history (one list) with a fixed
// target: T1 (probation) is held to a fortieth of the limit, and a block
// cached while the history remembers it goes to T2 (protected), as LIRS
// does. That rule gains where the cache is small against the reuse
// distances and loses where plain recency already keeps what comes back,
// so two shadow caches (shadow_cache.h) of fingerprints only replay the
// tenant's Inserts under each rule at block granularity, sampled: the
// blocks whose fingerprint's top two bits are 0 (a quarter), at a quarter
// of the limit. Each counts its hits, both counts halving every four shadow
// capacities of sampled accesses; while the LRU shadow's count is the
// higher, the victim is the least recently used leaf of either class (LRU),
// else chosen as above.
// A block is remembered by its fingerprint (fingerprints.h); the history is
// eviction_history.h, the packing of a node's class, priority and entry
// stamp class_priority_stamp.h.
//
// Thread safety: none; the owning tenant's mutex guards it (tenant.h).
#ifndef PREFIXD_CORE_EVICTION_H_
#define PREFIXD_CORE_EVICTION_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "core/cache_types.h"
#include "core/class_priority_stamp.h"
#include "core/eviction_history.h"
#include "core/radix_tree.h"
#include "core/shadow_cache.h"

namespace prefixd {

class EvictionState {
 public:
  // `max_target`: the most T1 may be aimed at (the tenant's limit in blocks);
  // `history_blocks`: the capacity of B1 and of B2.
  EvictionState(EvictionPolicy policy, uint64_t history_blocks,
                uint64_t max_target);

  bool shadow() const { return policy_ == EvictionPolicy::kShadow; }
  // Whether nodes have two classes and the tenant's trees keep fingerprints
  // (Tree::fingerprints): every policy but LRU.
  bool keeps_fingerprints() const { return policy_ != EvictionPolicy::kLru; }
  // SHADOW: an Insert covered the blocks of fps (every block of its path,
  // root first, over one or more calls); the shadows see the sampled ones.
  // Else nothing.
  void Observe(absl::Span<const uint64_t> fps);

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
    if (ClassOf(*n) == kRecent && keeps_fingerprints()) Promote(n);
  }
  // The class of a block about to be cached with fingerprint fp: kFrequent
  // if the history remembers it (which forgets it, and under ADAPTIVE
  // adapts the target).
  int ClassForNew(uint64_t fp);
  // ClassForNew is about to be asked about each of fps.
  void PrefetchClasses(absl::Span<const uint64_t> fps) const {
    for (uint64_t fp : fps) history_.Prefetch(fp);
  }
  // How many of the tail blocks of `victim` (Victim()), at most `limit`, go
  // before the policy would choose another leaf: the victim stays the same
  // while its blocks go, except under ADAPTIVE and SHADOW (when the LRU
  // shadow does not lead) when T1's blocks fall to the target. Evicting them in
  // one run is then block for block the same as one at a time. At least 1.
  size_t RunLength(const Node& victim, size_t limit) const;
  // The last `blocks` blocks of `victim` are about to be evicted: their
  // fingerprints move to the history, the tail's first.
  void RememberTail(const Node& victim, size_t blocks);
  // SplitAt made `head` of tail's first blocks: same class and priority, no
  // entry yet.
  static void Split(Node* head, const Node& tail) {
    head->class_priority_stamp = tail.class_priority_stamp & ~kStampMask;
  }
  // Gives n retention priority p, moving its entry, if any, to (p, its
  // stamp): the lazy scheme's keys stay no newer than the stamp.
  void SetPriority(Node* n, int p);
  // Everything back to the empty tenant's state (Reset).
  void Clear();

  // A cached node's entry and class agree with the sets.
  absl::Status CheckNode(const Node& n) const;
  // The sets hold exactly the entries of `live` (every node of the tenant)
  // and the counts, the target and the history are right.
  absl::Status CheckInvariants(
      const absl::flat_hash_set<const Node*>& live) const;

 private:
  using Entries = absl::btree_set<std::pair<uint64_t, Node*>>;
  bool adaptive() const { return policy_ == EvictionPolicy::kAdaptive; }
  // SHADOW: whether the LRU shadow leads (the victim is then LRU's).
  bool lru_leads() const {
    return shadows_ != nullptr && shadows_->lru_leads();
  }
  // SHADOW samples the blocks whose fingerprint's top two bits are 0.
  static bool Sampled(uint64_t fp) { return (fp >> 62) == 0; }
  // SHADOW's two shadow caches and their decayed hit counts.
  struct Shadows {
    Shadows(uint64_t capacity, uint64_t ghosts);
    bool lru_leads() const { return hits[0] > hits[1]; }
    ShadowCache lru, lirs;
    const uint64_t period;      // sampled accesses between halvings (4 x)
    uint64_t hits[2] = {0, 0};  // LRU's, LIRS's
    uint64_t accesses = 0;      // since the last halving
  };
  // SHADOW's target: a fortieth of the limit.
  static uint64_t Probation(uint64_t limit) { return limit / 40; }
  uint64_t InitialTarget() const {
    return shadow() ? Probation(max_target_) : max_target_ / 2;
  }
  static void SetEntryStamp(Node* n, uint64_t stamp) {
    n->class_priority_stamp = (n->class_priority_stamp & ~kStampMask) | stamp;
  }
  // Makes sets_[c].begin() the exact LRU evictable leaf of class c.
  void Normalize(int c);
  void Promote(Node* n);
  // Whether (key, n) is n's entry in its class's set.
  bool HasEntry(const Node& n) const;
  absl::Status CheckEntry(const Node& n) const;
  absl::Status CheckEntriesAreLive(
      const absl::flat_hash_set<const Node*>& live) const;
  absl::Status CheckEntryCount(
      const absl::flat_hash_set<const Node*>& live) const;
  absl::Status CheckRecentBlocks(
      const absl::flat_hash_set<const Node*>& live) const;
  absl::Status CheckTargetAndHistory() const;

  const EvictionPolicy policy_;
  const uint64_t max_target_;
  Entries sets_[2];
  uint64_t recent_blocks_ = 0;  // blocks of kRecent nodes (all under LRU)
  uint64_t target_;  // ARC's p, in blocks; SHADOW's fixed probation size
  History history_;
  std::unique_ptr<Shadows> shadows_;  // SHADOW only
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_EVICTION_H_
