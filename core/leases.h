// A tenant's leases: LeaseTable, the bookkeeping (by ID, by expiry and by
// end node), and Leases, which adds the pins a lease holds on its path.
//
// Kept exact on every change: each lease has exactly one entry in the
// expiry order and one in the end-node index, and every node carries one
// pin per lease whose end node is in its subtree (CheckInvariants).
#ifndef PREFIXD_CORE_LEASES_H_
#define PREFIXD_CORE_LEASES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/block_accounting.h"
#include "core/radix_tree.h"
#include "core/types.h"

namespace prefixd {

struct LeaseRecord {
  Node* end = nullptr;  // the lease pins the path root..end
  absl::Duration ttl;
  absl::Time expiry;
};

// Thread safety: none; the owning tenant's mutex guards it.
class LeaseTable {
 public:
  using Map = absl::flat_hash_map<LeaseId, LeaseRecord>;

  // `rng_seed`: the state of the ID generator (SplitMix64); tenants get
  // seeds that never make two of them draw the same IDs (cache.cc).
  explicit LeaseTable(uint64_t rng_seed) : rng_state_(rng_seed) {}

  size_t size() const { return leases_.size(); }
  bool contains(LeaseId id) const { return leases_.contains(id); }
  // Every lease, in no particular order.
  const Map& all() const { return leases_; }

  // Records a lease on root..end expiring at now + ttl under a fresh
  // random ID (never 0, never one in use) and returns the ID.
  LeaseId Add(Node* end, absl::Duration ttl, absl::Time now);
  // Records a lease under a given ID (snapshot load). REQUIRES: id != 0
  // and not in use.
  void Restore(LeaseId id, Node* end, absl::Duration ttl, absl::Time expiry);
  // nullptr if unknown.
  const LeaseRecord* Find(LeaseId id) const {
    auto it = leases_.find(id);
    return it == leases_.end() ? nullptr : &it->second;
  }
  // Forgets a lease and returns its end node; nullptr if unknown.
  Node* Remove(LeaseId id);
  // Moves a lease's expiry to now + its TTL. REQUIRES: the lease exists.
  void Renew(LeaseId id, absl::Time now);
  // The lease that expires first if its expiry is <= now, else 0. Inline:
  // every Match and Insert asks, and almost always gets 0.
  LeaseId FirstExpired(absl::Time now) const {
    if (by_expiry_.empty() || by_expiry_.begin()->first > now) return 0;
    return by_expiry_.begin()->second;
  }
  // Appends the IDs of the leases that end at `n`.
  void EndingAt(const Node* n, std::vector<LeaseId>* out) const;
  void Clear();

  // Every lease is in the expiry order and the end-node index, and they
  // hold nothing else.
  absl::Status CheckInvariants() const;

 private:
  LeaseId NextId();

  uint64_t rng_state_;
  Map leases_;
  absl::btree_set<std::pair<absl::Time, LeaseId>> by_expiry_;
  // Every lease by its end node: removing a subtree ends the leases of the
  // nodes it removes without a scan of all leases (a split keeps the end
  // node object, see Tenant::SplitAt, so entries never move).
  absl::btree_set<std::pair<const Node*, LeaseId>> by_end_;
};

// A tenant's leases and the pins they hold. Adding a lease pins its path
// root..end (BlockAccounting::PinPath), so that nothing on it is evicted;
// ending one, by release, expiry or the removal of its path, unpins it.
//
// Thread safety: none; the owning tenant's mutex guards it.
class Leases {
 public:
  // `rng_seed`: as for LeaseTable. `blocks`: where the pins are put.
  Leases(uint64_t rng_seed, BlockAccounting* blocks)
      : table_(rng_seed), blocks_(blocks) {}

  const LeaseTable& table() const { return table_; }
  size_t size() const { return table_.size(); }
  // nullptr if unknown.
  const LeaseRecord* Find(LeaseId id) const { return table_.Find(id); }

  // A lease on root..end expiring at now + ttl, under a fresh ID.
  LeaseId Add(Node* end, absl::Duration ttl, absl::Time now);
  // False if the lease is unknown.
  bool End(LeaseId id);
  // Moves a lease's expiry to now + its TTL. REQUIRES: the lease exists.
  void Renew(LeaseId id, absl::Time now) { table_.Renew(id, now); }
  // Ends every lease whose expiry is <= now; returns how many.
  size_t ExpireUpTo(absl::Time now);
  // Ends the leases that end at one of `nodes` (a subtree about to go).
  void EndAt(absl::Span<Node* const> nodes);
  // A lease of a restored snapshot, pinned like a new one. REQUIRES: id !=
  // 0 and not in use.
  void Restore(LeaseId id, Node* end, absl::Duration ttl, absl::Time expiry);
  // Forgets every lease; their pins go with the trees (Reset).
  void Clear() { table_.Clear(); }

  // The table is consistent, and every node of `live` (all of the
  // tenant's) carries one pin per lease whose end node is in its subtree.
  absl::Status CheckInvariants(
      const absl::flat_hash_set<const Node*>& live) const;

 private:
  LeaseTable table_;
  BlockAccounting* const blocks_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_LEASES_H_
