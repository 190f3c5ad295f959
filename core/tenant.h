// Tenant: everything one isolation domain owns — its trees (one per
// namespace), its eviction order of evictable leaves (eviction.h), its
// leases, its event ring and its counters — behind one mutex.
//
// Bookkeeping kept exact on every change:
//   cached_blocks  = blocks in all trees
//   pinned_blocks  = blocks in nodes with pins > 0
//   node.pins      = number of leases (and in-flight Insert guards) whose
//                    end node is in node's subtree
// The eviction policy's sets of (key, node) entries, one per node class
// (eviction.h; LRU has one class), are kept lazily, so that a touch (every
// Match) costs no btree operation:
//   - every evictable node has exactly one entry, (EntryKey(node), node), in
//     its class's set, with EntryKey(node) <= node.stamp; a node that is not
//     evictable has one or none;
//   - EntryKey(node) is 0 exactly when the node has no entry, and no entry
//     ever names a freed node (a node's entry goes before the node does).
// A touch only writes stamps (and, under ADAPTIVE, moves a node seen once
// to the other class, once); a node that stops being evictable keeps its
// entry; a node that becomes evictable gets one at (stamp, node) if it has
// none. Before a head is read (NextVictimStamp, EvictRun) it is
// normalized: an entry of a node that is not evictable is dropped, and one
// whose key is not its node's stamp is re-inserted at (stamp, node), until
// the head is exact. It is then the minimum of {(stamp, node) : evictable,
// of that class}, the same leaf an eagerly re-keyed set would give.
// PrefixCache (cache.h) orchestrates calls across tenants and the budget and
// takes the locks; nothing here locks anything. Each method states the lock
// it needs (ABSL_*_LOCKS_REQUIRED), and clang builds check them
// (-Wthread-safety, core/CMakeLists.txt).
#ifndef PREFIXD_CORE_TENANT_H_
#define PREFIXD_CORE_TENANT_H_

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "core/block_index.h"
#include "core/cache_types.h"
#include "core/event_ring.h"
#include "core/eviction.h"
#include "core/leases.h"
#include "core/radix_tree.h"
#include "core/snapshot_format.h"

namespace prefixd {

// A node's retention hint (docs/api.md, "Retention"): its blocks' priority
// and when it lapses back to the default. Every block of a node shares one.
struct Hint {
  int priority = kDefaultRetentionPriority;
  absl::Time lapse = absl::InfiniteFuture();  // never
  bool operator==(const Hint& o) const {
    return priority == o.priority && lapse == o.lapse;
  }
  bool operator!=(const Hint& o) const { return !(*this == o); }
};
// TenantUsage's by-retention class of a priority: below, at, above 50.
inline int RetentionClass(int priority) {
  return priority < kDefaultRetentionPriority    ? 0
         : priority == kDefaultRetentionPriority ? 1
                                                 : 2;
}

class Tenant {
 public:
  // `event_order`: the cache-wide counter of Event::order (EventRing).
  // `pinned_over_reserved`: the cache-wide sum of every tenant's
  // pinned_over_reserved() (SyncPinnedOverReserved).
  Tenant(std::string name, uint32_t tenant_index, uint64_t reserved_blocks,
         uint64_t limit_blocks, const CacheOptions& options,
         BlockIndex* block_index, std::atomic<uint64_t>* event_order,
         std::atomic<int64_t>* pinned_over_reserved, uint64_t rng_seed);
  ~Tenant();

  const std::string& name() const { return name_; }
  uint32_t index() const { return index_; }
  uint64_t reserved_blocks() const { return reserved_blocks_; }
  uint64_t limit_blocks() const { return limit_blocks_; }
  uint64_t cached_blocks() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return cached_blocks_;
  }
  uint64_t pinned_blocks() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return pinned_blocks_;
  }
  uint64_t unpinned_blocks() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return cached_blocks_ - pinned_blocks_;
  }
  size_t num_trees() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return trees_.size();
  }

  Tree* FindTree(absl::string_view ns) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Tree* GetOrCreateTree(absl::string_view ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // VictimKey(priority, stamp) of the leaf the policy evicts next; 0 if
  // none. The cache evicts across tenants by the smallest: the lowest
  // priority first, then the oldest. Normalizes the heads of the policy's
  // sets first (btree changes), hence the exclusive lock.
  uint64_t NextVictimStamp() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes tail blocks of the policy's next victim, at most `limit` (> 0),
  // as long as it stays the next victim (EvictionState::RunLength), and
  // appends their IDs to *out, each block's as repeated single evictions
  // would: the tail's first. Returns how many; at least 1. One run costs one
  // policy lookup and one block-index call, however many blocks it takes.
  // REQUIRES: NextVictimStamp() != 0.
  size_t EvictRun(EvictReason reason, uint64_t limit, std::vector<BlockId>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Splits `node` after its first `blocks` blocks (0 < blocks < size) and
  // returns the new head; `node` keeps the tail, its children and leases.
  Node* SplitAt(Node* node, size_t blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends blocks below `parent` (into it when it is an unpinned leaf of
  // the same class and hint that ends where the new blocks begin, else as a
  // new child; under ADAPTIVE one node per run of blocks of one class), all
  // with `hint`. Returns the node that now holds the last new block.
  Node* Attach(Node* parent, absl::Span<const Token> tokens,
               absl::Span<const BlockId> ids, int64_t position, uint64_t stamp,
               const Hint& hint = Hint()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Retention hints. A node's priority lives in Node::lru_key (eviction.h),
  // its lapse time, when it has one, in lapses_: empty without hints.
  Hint HintOf(const Node& n) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void SetHint(Node* n, const Hint& hint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every hint whose lapse time is <= now becomes the default. ExpireLeases
  // calls it, so that every call sees lapsed hints gone before it looks.
  void LapseHints(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `stamp` on every node from `end` up to the root (no btree change
  // but ADAPTIVE's first touch of a node seen once).
  // REQUIRES: `stamp` is not older than any stamp on the path.
  void TouchPath(Node* end, uint64_t stamp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `sync`: also bring the cache-wide pinned-over-reserved sum up to date;
  // false only for Insert's guard pin, which must not show there.
  void PinPath(Node* end, int delta, bool sync = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pinned blocks above the reservation, as last added to the cache-wide
  // sum; AdmitPinned adds `blocks` before they are pinned, Sync the rest.
  int64_t pinned_over_reserved() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return accounted_over_reserved_;
  }
  void AdmitPinned(int64_t blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    accounted_over_reserved_ += blocks;
  }
  void SyncPinnedOverReserved() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `node` and everything below it; appends their IDs to *removed.
  // Leases ending in the removed subtree end first. Costs O(removed nodes,
  // blocks and leases x log), whatever else the tenant holds.
  void RemoveSubtree(Node* node, EvictReason reason,
                     std::vector<BlockId>* removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every tree and lease; appends the IDs of the blocks it drops to
  // *removed.
  void Clear(std::vector<BlockId>* removed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Leases (the table is leases(); these also pin and unpin their paths).
  const LeaseTable& leases() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return leases_;
  }
  LeaseId AddLease(Node* end, absl::Duration ttl, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // False if the lease is unknown.
  bool EndLease(LeaseId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RenewLease(LeaseId id, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    leases_.Renew(id, now);
  }
  // Ends every lease whose expiry is <= now; returns how many.
  size_t ExpireLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Blocks of this tenant that a call by a principal who may not act for it
  // evicted (the budget is shared): they wait here, so that no response
  // carries another tenant's IDs, and go out exactly once, appended to the
  // evicted (or removed) IDs of this tenant's next Insert, Evict or Reset.
  void Park(BlockId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    parked_.push_back(id);
  }
  void TakeParked(std::vector<BlockId>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Events: removals are gathered during a call and logged at its end.
  // `tokens`: the stored blocks' (kept with CacheOptions::detailed_events);
  // `prefix_tokens`: the tokens before them on the path.
  void LogStored(const Tree& tree, std::optional<BlockId> parent,
                 absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
                 int64_t position, int64_t prefix_tokens)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushRemovals() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const EventRing& events() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return events_;
  }

  TenantUsage& counters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return counters_;
  }
  TenantUsage Stats(uint64_t block_bytes) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<std::string> Namespaces() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<DumpNode> Dump(const Tree& tree) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Snapshot support (snapshot.cc): everything but the name, which the
  // caller writes and reads. Load REQUIRES an empty tenant; on error the
  // tenant is left half-built and must be discarded with its cache. Stamps
  // must lie in [1, max_stamp] (the snapshot's recency counter).
  // `retention_counters`: the record holds the evictions by retention class
  // (PFXDSNP3; a PFXDSNP2 record does not, and they start at 0).
  void Save(SnapshotWriter* w, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status Load(SnapshotReader* r, absl::Time now, absl::Duration max_ttl,
                    uint64_t max_stamp, bool retention_counters)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Sets *error to a description of the first broken invariant.
  bool CheckInvariants(const BlockIndex& index, std::string* error) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

 private:
  friend Mutex& TenantMutex(const Tenant* t);

  Node* AddChild(Node* parent, absl::Span<const Token> tokens,
                 absl::Span<const BlockId> ids, int64_t position)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One run of blocks of class `cls` (Attach).
  Node* AttachRun(Node* parent, absl::Span<const Token> tokens,
                  absl::Span<const BlockId> ids, int64_t position,
                  uint64_t stamp, int cls, absl::Span<const uint64_t> fps,
                  const Hint& hint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets or drops n's lapse time (InfiniteFuture: none).
  void SetLapse(Node* n, absl::Time lapse) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `n` an entry if it is evictable and has none.
  void SyncLru(Node* n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { policy_.Sync(n); }
  // Erases n's entry, if any. Every node must go through it (or Clear)
  // before it is freed.
  void LruErase(Node* n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    policy_.Erase(n);
  }
  void NoteRemoved(Tree* tree, BlockId id, EvictReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropTreeIfEmpty(const std::string& ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;

  const std::string name_;
  const uint32_t index_;
  const uint64_t reserved_blocks_;
  const uint64_t limit_blocks_;
  const int block_size_;
  const bool detailed_events_;
  BlockIndex* const block_index_;

  absl::flat_hash_map<std::string, std::unique_ptr<Tree>> trees_
      ABSL_GUARDED_BY(mu_);
  // The eviction order, lazily kept (see the top of this file).
  EvictionState policy_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);

  uint64_t cached_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pinned_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t nodes_ ABSL_GUARDED_BY(mu_) = 0;
  TenantUsage counters_ ABSL_GUARDED_BY(mu_);
  // Cached blocks by RetentionClass of their priority.
  uint64_t blocks_by_retention_[3] ABSL_GUARDED_BY(mu_) = {0, 0, 0};
  // Lapse times of the nodes whose hint has one (never of priority 50), and
  // the same in lapse order.
  absl::flat_hash_map<const Node*, absl::Time> lapses_ ABSL_GUARDED_BY(mu_);
  absl::btree_set<std::pair<absl::Time, Node*>> lapse_order_
      ABSL_GUARDED_BY(mu_);

  EventRing events_ ABSL_GUARDED_BY(mu_);
  struct PendingRemoval {
    Tree* tree;
    std::string ns;
    EvictReason reason;
    std::vector<BlockId> ids;
  };
  std::vector<PendingRemoval> pending_removals_ ABSL_GUARDED_BY(mu_);
  // Namespaces whose tree may be empty.
  std::vector<std::string> maybe_empty_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockId> parked_ ABSL_GUARDED_BY(mu_);  // see Park()
  std::atomic<int64_t>* const pinned_over_reserved_;
  int64_t accounted_over_reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

// The lock of t, which PrefixCache takes (with MutexLock or TenantsLock) and
// names in its annotations (cache.h declares it, for a Tenant it cannot
// see). The annotation tells the analysis that this is t->mu_, the lock of
// the ABSL_*_LOCKS_REQUIRED(mu_) annotations above.
inline Mutex& TenantMutex(const Tenant* t) ABSL_LOCK_RETURNED(t->mu_) {
  return t->mu_;
}

// Locks a set of tenants for the length of a scope. Only holders of
// exclusive_mu_ lock more than one tenant, so any order is deadlock-free.
//
// The analysis tracks a fixed set of named locks; it cannot express "the
// mutex of every tenant in a vector whose length is known at run time".
// So the constructor and destructor, which lock and unlock that set, are
// exempt from it, and AssertHeld tells it, one tenant at a time where the
// set is used, that the tenant's mutex is held.
class TenantsLock {
 public:
  explicit TenantsLock(std::vector<Tenant*> tenants)
      ABSL_NO_THREAD_SAFETY_ANALYSIS : tenants_(std::move(tenants)) {
    for (Tenant* t : tenants_) TenantMutex(t).Lock();
  }
  ~TenantsLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = tenants_.rbegin(); it != tenants_.rend(); ++it)
      TenantMutex(*it).Unlock();
  }
  TenantsLock(const TenantsLock&) = delete;
  TenantsLock& operator=(const TenantsLock&) = delete;

  const std::vector<Tenant*>& tenants() const { return tenants_; }
  // REQUIRES: t is one of tenants() (checked in debug builds).
  void AssertHeld(const Tenant* t) const
      ABSL_ASSERT_EXCLUSIVE_LOCK(TenantMutex(t)) {
    assert(std::find(tenants_.begin(), tenants_.end(), t) != tenants_.end());
    (void)t;
  }

 private:
  std::vector<Tenant*> tenants_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_TENANT_H_
