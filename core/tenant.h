// Tenant: everything one isolation domain owns — its trees (one per
// namespace), its LRU set of evictable leaves, its leases, its event ring and
// its counters — behind one mutex.
//
// Bookkeeping kept exact on every change:
//   cached_blocks  = blocks in all trees
//   pinned_blocks  = blocks in nodes with pins > 0
//   node.pins      = number of leases (and in-flight Insert guards) whose
//                    end node is in node's subtree
// The LRU set lru_ of (key, node) entries is kept lazily, so that a touch
// (every Match) costs no btree operation:
//   - every evictable node has exactly one entry, (node.lru_key, node), with
//     lru_key <= node.stamp; a node that is not evictable has one or none;
//   - node.lru_key is 0 exactly when the node has no entry, and no entry
//     ever names a freed node (a node's entry goes before the node does).
// A touch only writes stamps; a node that stops being evictable keeps its
// entry; a node that becomes evictable gets one at (stamp, node) if it has
// none. Before the head is read (OldestEvictableStamp, EvictOne) it is
// normalized: an entry of a node that is not evictable is dropped, and one
// whose key is not its node's stamp is re-inserted at (stamp, node), until
// the head is exact. It is then the minimum of {(stamp, node) : evictable},
// the same leaf an eagerly re-keyed set would give.
// PrefixCache (cache.h) orchestrates calls across tenants and the budget;
// nothing here locks anything.
#ifndef PREFIXD_CORE_TENANT_H_
#define PREFIXD_CORE_TENANT_H_

#include <atomic>
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
#include "core/block_index.h"
#include "core/cache_types.h"
#include "core/events.h"
#include "core/mutex.h"
#include "core/radix_tree.h"
#include "core/snapshot_format.h"

namespace prefixd {

struct LeaseRecord {
  Node* end = nullptr;  // the lease pins the path root..end
  absl::Duration ttl;
  absl::Time expiry;
};

// All methods REQUIRE mu held (by the caller; see PrefixCache's locking).
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

  mutable Mutex mu;

  const std::string& name() const { return name_; }
  uint32_t index() const { return index_; }
  uint64_t reserved_blocks() const { return reserved_blocks_; }
  uint64_t limit_blocks() const { return limit_blocks_; }
  uint64_t cached_blocks() const { return cached_blocks_; }
  uint64_t pinned_blocks() const { return pinned_blocks_; }
  uint64_t unpinned_blocks() const { return cached_blocks_ - pinned_blocks_; }
  size_t num_trees() const { return trees_.size(); }
  size_t num_leases() const { return leases_.size(); }

  Tree* FindTree(absl::string_view ns) const;
  Tree* GetOrCreateTree(absl::string_view ns);

  // Recency stamp of the least-recently-used evictable block; 0 if none.
  // Normalizes the head of the LRU set first (btree changes): REQUIRES mu
  // held exclusively, like every other mutating method.
  uint64_t OldestEvictableStamp();
  // Removes the tail block of the LRU evictable leaf and returns its ID.
  // REQUIRES: OldestEvictableStamp() != 0.
  BlockId EvictOne(EvictReason reason);

  // Splits `node` after its first `blocks` blocks (0 < blocks < size) and
  // returns the new head; `node` keeps the tail, its children and leases.
  Node* SplitAt(Node* node, size_t blocks);
  // Appends blocks below `parent` (into it when it is an unpinned leaf that
  // ends where the new blocks begin, else as a new child). Returns the node
  // that now holds the last new block.
  Node* Attach(Node* parent, absl::Span<const Token> tokens,
               absl::Span<const BlockId> ids, int64_t position, uint64_t stamp);
  // Sets `stamp` on every node from `end` up to the root (no LRU change).
  // REQUIRES: `stamp` is not older than any stamp on the path.
  void TouchPath(Node* end, uint64_t stamp);
  // `sync`: also bring the cache-wide pinned-over-reserved sum up to date;
  // false only for Insert's guard pin, which must not show there.
  void PinPath(Node* end, int delta, bool sync = true);
  // Pinned blocks above the reservation, as last added to the cache-wide
  // sum; AdmitPinned adds `blocks` before they are pinned, Sync the rest.
  int64_t pinned_over_reserved() const { return accounted_over_reserved_; }
  void AdmitPinned(int64_t blocks) { accounted_over_reserved_ += blocks; }
  void SyncPinnedOverReserved();
  // Removes `node` and everything below it; appends their IDs to *removed.
  // Leases ending in the removed subtree end first. Costs O(removed nodes,
  // blocks and leases x log), whatever else the tenant holds.
  void RemoveSubtree(Node* node, EvictReason reason,
                     std::vector<BlockId>* removed);
  // Drops every tree and lease; returns how many blocks went.
  void Clear(std::vector<BlockId>* removed);

  // Leases.
  LeaseId AddLease(Node* end, absl::Duration ttl, absl::Time now);
  bool EndLease(LeaseId id);  // false if unknown
  LeaseRecord* FindLease(LeaseId id);
  void RenewLease(LeaseId id, absl::Time now);
  size_t ExpireLeases(absl::Time now);

  // Blocks of this tenant that a call by a principal who may not act for it
  // evicted (the budget is shared): they wait here, so that no response
  // carries another tenant's IDs, and go out exactly once, appended to the
  // evicted (or removed) IDs of this tenant's next Insert, Evict or Reset.
  void Park(BlockId id) { parked_.push_back(id); }
  void TakeParked(std::vector<BlockId>* out);
  size_t num_parked() const { return parked_.size(); }

  // Events: removals are gathered during a call and logged at its end.
  // `tokens`: the stored blocks' (kept with CacheOptions::detailed_events);
  // `prefix_tokens`: the tokens before them on the path.
  void LogStored(const Tree& tree, std::optional<BlockId> parent,
                 absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
                 int64_t position, int64_t prefix_tokens);
  void FlushRemovals();
  const EventRing& events() const { return events_; }

  TenantUsage& counters() { return counters_; }
  TenantUsage Stats(uint64_t block_bytes) const;
  std::vector<std::string> Namespaces() const;
  std::vector<DumpNode> Dump(const Tree& tree) const;

  // Snapshot support (snapshot.cc): everything but the name, which the
  // caller writes and reads. Load REQUIRES an empty tenant; on error the
  // tenant is left half-built and must be discarded with its cache. Stamps
  // must lie in [1, max_stamp] (the snapshot's recency counter).
  void Save(SnapshotWriter* w, absl::Time now) const;
  absl::Status Load(SnapshotReader* r, absl::Time now, absl::Duration max_ttl,
                    uint64_t max_stamp);

  // Appends a description of the first broken invariant to *error.
  bool CheckInvariants(const BlockIndex& index, std::string* error) const;

 private:
  Node* AddChild(Node* parent, absl::Span<const Token> tokens,
                 absl::Span<const BlockId> ids, int64_t position);
  // Gives `n` an LRU entry if it is evictable and has none.
  void SyncLru(Node* n);
  // Erases n's LRU entry, if any. Every node must go through it before it
  // is freed.
  void LruErase(Node* n);
  // Makes lru_.begin() the exact LRU evictable leaf (or empties lru_).
  void NormalizeLruHead();
  void NoteRemoved(Tree* tree, BlockId id, EvictReason reason);
  void DropTreeIfEmpty(const std::string& ns);
  LeaseId NextLeaseId();

  const std::string name_;
  const uint32_t index_;
  const uint64_t reserved_blocks_;
  const uint64_t limit_blocks_;
  const int block_size_;
  const bool detailed_events_;
  BlockIndex* const block_index_;

  absl::flat_hash_map<std::string, std::unique_ptr<Tree>> trees_
      ABSL_GUARDED_BY(mu);
  // (key, node), oldest first; lazily kept (see the top of this file).
  absl::btree_set<std::pair<uint64_t, Node*>> lru_ ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<LeaseId, LeaseRecord> leases_ ABSL_GUARDED_BY(mu);
  absl::btree_set<std::pair<absl::Time, LeaseId>> lease_expiry_
      ABSL_GUARDED_BY(mu);
  // Every lease by its end node: RemoveSubtree ends the leases of the nodes
  // it removes without a scan of all leases (a split keeps the end node
  // object, see SplitAt, so entries never move).
  absl::btree_set<std::pair<const Node*, LeaseId>> leases_by_end_
      ABSL_GUARDED_BY(mu);
  uint64_t rng_state_ ABSL_GUARDED_BY(mu);

  uint64_t cached_blocks_ ABSL_GUARDED_BY(mu) = 0;
  uint64_t pinned_blocks_ ABSL_GUARDED_BY(mu) = 0;
  uint64_t nodes_ ABSL_GUARDED_BY(mu) = 0;
  TenantUsage counters_ ABSL_GUARDED_BY(mu);

  EventRing events_ ABSL_GUARDED_BY(mu);
  struct PendingRemoval {
    Tree* tree;
    std::string ns;
    EvictReason reason;
    std::vector<BlockId> ids;
  };
  std::vector<PendingRemoval> pending_removals_ ABSL_GUARDED_BY(mu);
  std::vector<std::string> maybe_empty_
      ABSL_GUARDED_BY(mu);  // namespaces whose tree may be empty
  std::vector<BlockId> parked_ ABSL_GUARDED_BY(mu);  // see Park()
  std::atomic<int64_t>* const pinned_over_reserved_;
  int64_t accounted_over_reserved_ ABSL_GUARDED_BY(mu) = 0;
};

// Locks a set of tenants for the length of a scope. Only holders of
// exclusive_mu_ lock more than one tenant, so any order is deadlock-free.
class TenantsLock {
 public:
  explicit TenantsLock(std::vector<Tenant*> tenants)
      ABSL_NO_THREAD_SAFETY_ANALYSIS : tenants_(std::move(tenants)) {
    for (Tenant* t : tenants_) t->mu.Lock();
  }
  ~TenantsLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto it = tenants_.rbegin(); it != tenants_.rend(); ++it)
      (*it)->mu.Unlock();
  }
  const std::vector<Tenant*>& tenants() const { return tenants_; }

 private:
  std::vector<Tenant*> tenants_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_TENANT_H_
