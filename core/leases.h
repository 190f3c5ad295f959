// LeaseTable: one tenant's leases, by ID, by expiry and by end node.
//
// It is bookkeeping only: the pins a lease puts on its path are the
// tenant's (Tenant::AddLease, Tenant::EndLease), and so is the lock. Its
// owner, Tenant, keeps it under the tenant mutex.
//
// Kept exact on every change: each lease has exactly one entry in the
// expiry order and one in the end-node index (CheckInvariants).
#ifndef PREFIXD_CORE_LEASES_H_
#define PREFIXD_CORE_LEASES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "core/radix_tree.h"
#include "core/types.h"

namespace prefixd {

struct LeaseRecord {
  Node* end = nullptr;  // the lease pins the path root..end
  absl::Duration ttl;
  absl::Time expiry;
};

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

  // Appends a description of the first broken invariant to *error.
  bool CheckInvariants(std::string* error) const;

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

}  // namespace prefixd

#endif  // PREFIXD_CORE_LEASES_H_
