#include "core/retention_hints.h"

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "core/class_priority_stamp.h"

namespace prefixd {

Hint RetentionHints::Of(const Node& n) const {
  Hint h;
  h.priority = PriorityOf(n);
  if (!lapses_.empty()) {
    auto it = lapses_.find(&n);
    if (it != lapses_.end()) h.lapse = it->second;
  }
  return h;
}

void RetentionHints::SetLapse(Node* n, absl::Time lapse) {
  if (!lapses_.empty()) {
    auto it = lapses_.find(n);
    if (it != lapses_.end()) {
      lapse_order_.erase({it->second, n});
      lapses_.erase(it);
    }
  }
  if (lapse == absl::InfiniteFuture()) return;
  lapses_[n] = lapse;
  lapse_order_.insert({lapse, n});
}

void RetentionHints::Clear() {
  lapses_.clear();
  lapse_order_.clear();
  blocks_[0] = blocks_[1] = blocks_[2] = 0;
}

absl::Status RetentionHints::CheckPriorities(
    const absl::flat_hash_set<const Node*>& live) const {
  for (const Node* n : live) {
    if (PriorityOf(*n) > kMaxRetentionPriority) {
      return absl::InternalError(
          absl::StrFormat("a node has priority %d", PriorityOf(*n)));
    }
  }
  return absl::OkStatus();
}

absl::Status RetentionHints::CheckBlockCounts(
    const absl::flat_hash_set<const Node*>& live) const {
  uint64_t counted[3] = {0, 0, 0};
  for (const Node* n : live)
    counted[RetentionClass(PriorityOf(*n))] += n->num_blocks();
  for (int c = 0; c < 3; ++c) {
    if (counted[c] != blocks_[c]) {
      return absl::InternalError(absl::StrFormat(
          "%d blocks in retention class %d, the tenant counts %d", counted[c],
          c, blocks_[c]));
    }
  }
  return absl::OkStatus();
}

absl::Status RetentionHints::CheckLapses(
    const absl::flat_hash_set<const Node*>& live) const {
  if (lapses_.size() != lapse_order_.size())
    return absl::InternalError("lapse map and lapse order differ in size");
  for (const auto& [time, node] : lapse_order_) {
    auto it = lapses_.find(node);
    if (!live.contains(node) || it == lapses_.end() || it->second != time ||
        PriorityOf(*node) == kDefaultRetentionPriority) {
      return absl::InternalError(
          "a lapse names a dead node, disagrees, or has priority 50");
    }
  }
  return absl::OkStatus();
}

absl::Status RetentionHints::CheckInvariants(
    const absl::flat_hash_set<const Node*>& live) const {
  RETURN_IF_ERROR(CheckPriorities(live));
  RETURN_IF_ERROR(CheckBlockCounts(live));
  return CheckLapses(live);
}

}  // namespace prefixd
