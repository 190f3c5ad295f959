// Tenant: one isolation domain. It owns its trees (one per namespace) and
// the parts that must change with them, and keeps them in step:
//
//   NamespaceTrees   the radix trees            namespace_trees.h
//   EvictionState    the order its leaves go in  eviction.h
//   BlockAccounting  counts, quota and pins      block_accounting.h
//   Leases           its leases and their pins   leases.h
//   RetentionHints   lapse times, class counts   retention_hints.h
//   EventOutbox      events and parked IDs       event_outbox.h
//
// Each part keeps its own invariants (and checks them); what spans parts is
// kept here: a block is counted where it is cached, indexed at its node,
// in its node's eviction entry and class, and logged; a node's entry goes
// before the node does.
//
// The eviction policy's sets of (key, node) entries, one per node class
// (eviction.h; LRU has one class), are kept lazily, so that a touch (every
// Match) costs no btree operation:
//   - every evictable node has exactly one entry, (EntryStampOf(node),
//     node), in its class's set, with EntryStampOf(node) <= node.stamp; a
//     node that is not evictable has one or none;
//   - EntryStampOf(node) is 0 exactly when the node has no entry, and no
//     entry ever names a freed node (a node's entry goes before the node
//     does).
// A touch only writes stamps (and, under ADAPTIVE, moves a node seen once
// to the other class, once); a node that stops being evictable keeps its
// entry; a node that becomes evictable gets one at (stamp, node) if it has
// none. Before a head is read (NextVictimPriorityStamp, EvictRun) it is
// normalized: an entry of a node that is not evictable is dropped, and one
// whose key is not its node's stamp is re-inserted at (stamp, node), until
// the head is exact. It is then the minimum of {(stamp, node) : evictable,
// of that class}, the same leaf an eagerly re-keyed set would give.
//
// Thread safety: mu_ guards everything but the constants; the parts have no
// lock of their own. PrefixCache (cache.h) orchestrates calls across
// tenants and the budget and takes the locks; nothing here locks anything.
// Each method states the lock it needs (ABSL_*_LOCKS_REQUIRED), and clang
// builds check them (-Wthread-safety, core/CMakeLists.txt).
#ifndef PREFIXD_CORE_TENANT_H_
#define PREFIXD_CORE_TENANT_H_

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "core/block_accounting.h"
#include "core/block_index.h"
#include "core/cache_types.h"
#include "core/event_outbox.h"
#include "core/eviction.h"
#include "core/leases.h"
#include "core/namespace_trees.h"
#include "core/radix_tree.h"
#include "core/retention_hints.h"

namespace prefixd {

class Tenant {
 public:
  // `event_order`: the cache-wide counter of Event::order (EventRing).
  // `pinned_over_reserved`: the cache-wide sum of every tenant's
  // BlockAccounting::pinned_over_reserved().
  Tenant(std::string name, uint32_t tenant_index, uint64_t reserved_blocks,
         uint64_t limit_blocks, const CacheOptions& options,
         BlockIndex* block_index, std::atomic<uint64_t>* event_order,
         std::atomic<int64_t>* pinned_over_reserved, uint64_t rng_seed);
  ~Tenant();

  const std::string& name() const { return name_; }
  uint32_t index() const { return index_; }

  // The parts whose own methods keep every invariant, for the cache to use
  // directly: counts and pins, leases, the outbox, the request counters.
  // The trees only to read: a tree changes through the methods below.
  BlockAccounting& blocks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return blocks_;
  }
  const BlockAccounting& blocks() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return blocks_;
  }
  Leases& leases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return leases_; }
  EventOutbox& outbox() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outbox_; }
  TenantUsage& counters() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return counters_;
  }
  const NamespaceTrees& trees() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return trees_;
  }

  // Tree changes. Each keeps the trees, the block index, the accounting,
  // the eviction order, the hints and the events in step.
  Tree* GetOrCreateTree(absl::string_view ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Splits `node` after its first `blocks` blocks (0 < blocks < size) and
  // returns the new head; `node` keeps the tail, its children and leases.
  Node* SplitAt(Node* node, size_t blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends blocks below `parent` (into it when it is an unpinned leaf of
  // the same class and hint that ends where the new blocks begin, else as a
  // new child; under ADAPTIVE one node per run of blocks of one class), all
  // with `hint`; SHADOW's shadow caches see the new blocks. Returns the node
  // that now holds the last new block.
  Node* Attach(Node* parent, absl::Span<const Token> tokens,
               absl::Span<const BlockId> ids, int64_t position, uint64_t stamp,
               const Hint& hint = Hint()) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives every block of n `hint`.
  void SetHint(Node* n, const Hint& hint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `stamp` on every node from `end` up to the root (no btree change
  // but the first touch of a node seen once under ADAPTIVE and SHADOW).
  // `insert`: the path is an Insert's cached part, whose blocks SHADOW's
  // shadow caches see (root first; Attach gives them the new blocks).
  // REQUIRES: `stamp` is not older than any stamp on the path.
  void TouchPath(Node* end, uint64_t stamp, bool insert)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `node` and everything below it; appends their IDs to *removed.
  // Leases ending in the removed subtree end first. Costs O(removed nodes,
  // blocks and leases x log), whatever else the tenant holds.
  void RemoveSubtree(Node* node, EvictReason reason,
                     std::vector<BlockId>* removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every tree and lease; appends the IDs of the blocks it drops to
  // *removed.
  void Clear(std::vector<BlockId>* removed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of a call that removed blocks: logs the removals
  // (EventOutbox::FlushRemovals) and drops the trees left empty.
  void FlushRemovals() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // PriorityStamp(priority, stamp) of the leaf the policy evicts next; 0
  // if none. The cache evicts across tenants by the smallest: the lowest
  // priority first, then the oldest. Normalizes the heads of the policy's
  // sets first (btree changes), hence the exclusive lock.
  uint64_t NextVictimPriorityStamp() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes tail blocks of the policy's next victim, at most `limit` (> 0),
  // as long as it stays the next victim (EvictionState::RunLength), and
  // appends their IDs to *out, each block's as repeated single evictions
  // would: the tail's first. Returns how many; at least 1. One run costs one
  // policy lookup and one block-index call, however many blocks it takes.
  // REQUIRES: NextVictimPriorityStamp() != 0.
  size_t EvictRun(EvictReason reason, uint64_t limit, std::vector<BlockId>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Every hint whose lapse time is <= now becomes the default, then every
  // lease whose expiry is <= now ends; returns how many leases ended. Every
  // call runs it first, so that it sees lapsed hints and leases gone.
  size_t ExpireLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The counters and counts, with the hints lapsed at `now` first so that
  // the by-retention counts are current.
  TenantUsage Stats(uint64_t block_bytes, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INTERNAL naming the tenant and the first broken invariant.
  absl::Status CheckInvariants(const BlockIndex& index) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

 private:
  friend Mutex& TenantMutex(const Tenant* t);
  friend class TenantRecord;  // snapshot.cc: saves and restores all of it

  struct Totals {
    uint64_t cached = 0, pinned = 0, nodes = 0;
  };

  Node* AddChild(Node* parent, absl::Span<const Token> tokens,
                 absl::Span<const BlockId> ids, int64_t position,
                 absl::Span<const uint64_t> fps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One run of blocks of class `cls` (Attach).
  Node* AttachRun(Node* parent, absl::Span<const Token> tokens,
                  absl::Span<const BlockId> ids, int64_t position,
                  uint64_t stamp, int cls, absl::Span<const uint64_t> fps,
                  const Hint& hint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A node of a snapshot, below `parent`: its IDs claimed in the block index
  // already, of class kRecent and the default priority.
  Node* AddRestoredNode(Node* parent, absl::Span<const Token> tokens,
                        absl::Span<const BlockId> ids, int64_t position,
                        uint64_t stamp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One node of a subtree RemoveSubtree removes: its blocks leave every
  // part and are appended to *removed; the node goes with the subtree.
  void ForgetNode(Node* n, EvictReason reason, std::vector<BlockId>* removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteRemoved(const Tree& tree, absl::Span<const BlockId> ids,
                   EvictReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LapseHints(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // CheckInvariants, without the tenant's name.
  absl::Status CheckParts(const BlockIndex& index) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Every node of `tree`; adds them to *live and their counts to *totals.
  absl::Status CheckTree(const Tree& tree, const BlockIndex& index,
                         absl::flat_hash_set<const Node*>* live,
                         Totals* totals) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;

  const std::string name_;
  const uint32_t index_;
  const int block_size_;
  BlockIndex* const block_index_;  // shared by every tenant; locks itself

  // mu_ protects the following state. The order matters: trees_ asks
  // policy_ whether to keep fingerprints, blocks_ re-syncs policy_, and
  // leases_ pins through blocks_.
  EvictionState policy_ ABSL_GUARDED_BY(mu_);
  NamespaceTrees trees_ ABSL_GUARDED_BY(mu_);
  BlockAccounting blocks_ ABSL_GUARDED_BY(mu_);
  Leases leases_ ABSL_GUARDED_BY(mu_);
  RetentionHints hints_ ABSL_GUARDED_BY(mu_);
  EventOutbox outbox_ ABSL_GUARDED_BY(mu_);
  TenantUsage counters_ ABSL_GUARDED_BY(mu_);
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
//
// Thread safety: one scope's; not shared between threads.
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
