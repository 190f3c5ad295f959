// BlockAccounting: one tenant's blocks against its quota. How many it
// caches, in how many nodes, how many of them pins hold, its reservation
// and limit, and its share of the cache-wide sum of pinned blocks above
// reservations (PrefixCache::AdmitPins).
//
// Kept exact on every change:
//   cached = blocks in all the tenant's trees
//   pinned = blocks in nodes with pins > 0
//   nodes  = nodes in all the tenant's trees (roots aside)
//   node.pins = leases (and in-flight Insert guards) whose end node is in
//               node's subtree
// The tenant changes the first three as its trees change (hence the
// friend); a pin, which only ever changes counts and evictability, is put
// on a path here (PinPath), by the tenant's leases or by an Insert's guard.
//
// Thread safety: none; the owning tenant's mutex guards it. The cache-wide
// sum is an atomic the cache owns.
#ifndef PREFIXD_CORE_BLOCK_ACCOUNTING_H_
#define PREFIXD_CORE_BLOCK_ACCOUNTING_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "core/eviction.h"
#include "core/radix_tree.h"

namespace prefixd {

class BlockAccounting {
 public:
  // `policy`: the tenant's eviction order, which a pin change re-syncs.
  // `pinned_over_reserved`: the cache-wide sum of every tenant's
  // pinned_over_reserved().
  BlockAccounting(uint64_t reserved_blocks, uint64_t limit_blocks,
                  std::atomic<int64_t>* pinned_over_reserved,
                  EvictionState* policy)
      : reserved_(reserved_blocks),
        limit_(limit_blocks),
        pinned_over_reserved_(pinned_over_reserved),
        policy_(policy) {}

  uint64_t reserved() const { return reserved_; }
  uint64_t limit() const { return limit_; }
  uint64_t cached() const { return cached_; }
  uint64_t pinned() const { return pinned_; }
  uint64_t unpinned() const { return cached_ - pinned_; }
  uint64_t nodes() const { return nodes_; }

  // Adds `delta` pins to every node from `end` up to the root. `sync`: also
  // bring the cache-wide pinned-over-reserved sum up to date; false only
  // for Insert's guard pin, which must not show there.
  void PinPath(Node* end, int delta, bool sync = true);
  // Pinned blocks above the reservation, as last added to the cache-wide
  // sum; AdmitPinned adds `blocks` before they are pinned, PinPath the rest.
  int64_t pinned_over_reserved() const { return accounted_over_reserved_; }
  void AdmitPinned(int64_t blocks) { accounted_over_reserved_ += blocks; }

  // The counts agree with what the trees hold (counted by the caller) and
  // the tenant stays within its limit.
  absl::Status CheckCounts(uint64_t cached, uint64_t pinned,
                           uint64_t nodes) const;

 private:
  friend class Tenant;

  void AddBlocks(uint64_t blocks) { cached_ += blocks; }
  void RemoveBlocks(uint64_t blocks) { cached_ -= blocks; }
  void AddNode() { ++nodes_; }
  void RemoveNode() { --nodes_; }
  void SyncPinnedOverReserved();
  // The trees are gone (Reset): every count back to 0.
  void Clear();

  const uint64_t reserved_;
  const uint64_t limit_;
  std::atomic<int64_t>* const pinned_over_reserved_;
  EvictionState* const policy_;
  uint64_t cached_ = 0;
  uint64_t pinned_ = 0;
  uint64_t nodes_ = 0;
  int64_t accounted_over_reserved_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_BLOCK_ACCOUNTING_H_
