// RetentionHints: the part of a tenant's retention hints (docs/api.md,
// "Retention") that does not fit in its nodes, and how many blocks each
// retention class holds.
//
// A node's hint is its priority and the time it lapses back to the default;
// every block of a node shares one. The priority lives in the node
// (class_priority_stamp.h), where the eviction sets order by it, and
// EvictionState::SetPriority changes it. The lapse time, when there is one,
// lives here, with the nodes in lapse order. Nodes of the default priority
// have none, so a tenant that never sees a hint keeps nothing here and every
// lookup is a test of an empty map.
//
// Thread safety: none; the owning tenant's mutex guards it.
#ifndef PREFIXD_CORE_RETENTION_HINTS_H_
#define PREFIXD_CORE_RETENTION_HINTS_H_

#include <cstdint>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/cache_types.h"
#include "core/radix_tree.h"

namespace prefixd {

// A node's retention hint: its blocks' priority and when it lapses back to
// the default.
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

class RetentionHints {
 public:
  // n's hint: its priority and its lapse time.
  Hint Of(const Node& n) const;
  // Sets or drops n's lapse time (InfiniteFuture: none).
  void SetLapse(Node* n, absl::Time lapse);
  // n leaves its tree: its lapse time, if any, goes.
  void Forget(Node* n) {
    if (!lapses_.empty()) SetLapse(n, absl::InfiniteFuture());
  }
  // SplitAt made `head` of tail's first blocks: it lapses with the tail.
  void Split(Node* head, const Node& tail) {
    if (!lapses_.empty()) SetLapse(head, Of(tail).lapse);
  }
  // The node whose hint lapses first, if that is at or before `now`.
  Node* FirstLapsed(absl::Time now) const {
    if (lapse_order_.empty() || lapse_order_.begin()->first > now)
      return nullptr;
    return lapse_order_.begin()->second;
  }

  // Cached blocks by RetentionClass of their priority.
  uint64_t blocks(int retention_class) const {
    return blocks_[retention_class];
  }
  void AddBlocks(int priority, uint64_t blocks) {
    blocks_[RetentionClass(priority)] += blocks;
  }
  void RemoveBlocks(int priority, uint64_t blocks) {
    blocks_[RetentionClass(priority)] -= blocks;
  }
  // Every tree is gone (Reset).
  void Clear();

  // `live` is every node of the tenant: their priorities are in range,
  // the by-class counts are theirs, and the lapse times name live hinted
  // nodes, in order.
  absl::Status CheckInvariants(
      const absl::flat_hash_set<const Node*>& live) const;

 private:
  absl::Status CheckPriorities(
      const absl::flat_hash_set<const Node*>& live) const;
  absl::Status CheckBlockCounts(
      const absl::flat_hash_set<const Node*>& live) const;
  absl::Status CheckLapses(const absl::flat_hash_set<const Node*>& live) const;

  uint64_t blocks_[3] = {0, 0, 0};
  // Lapse times of the nodes whose hint has one (never of priority 50), and
  // the same in lapse order.
  absl::flat_hash_map<const Node*, absl::Time> lapses_;
  absl::btree_set<std::pair<absl::Time, Node*>> lapse_order_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_RETENTION_HINTS_H_
