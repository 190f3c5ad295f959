#include "core/block_accounting.h"

#include <cassert>

#include "absl/strings/str_format.h"

namespace prefixd {

void BlockAccounting::PinPath(Node* end, int delta, bool sync) {
  for (Node* n = end; !n->is_root(); n = n->parent) {
    const int32_t before = n->pins;
    n->pins += delta;
    assert(n->pins >= 0);
    if (before == 0 && n->pins > 0) pinned_ += n->num_blocks();
    if (before > 0 && n->pins == 0) pinned_ -= n->num_blocks();
    policy_->Sync(n);
  }
  if (sync) SyncPinnedOverReserved();
}

void BlockAccounting::SyncPinnedOverReserved() {
  const int64_t now =
      pinned_ > reserved_ ? static_cast<int64_t>(pinned_ - reserved_) : 0;
  pinned_over_reserved_->fetch_add(now - accounted_over_reserved_);
  accounted_over_reserved_ = now;
}

void BlockAccounting::Clear() {
  cached_ = pinned_ = nodes_ = 0;
  SyncPinnedOverReserved();
}

absl::Status BlockAccounting::CheckCounts(uint64_t cached, uint64_t pinned,
                                          uint64_t nodes) const {
  if (cached != cached_) {
    return absl::InternalError(
        absl::StrFormat("cached_blocks %d, trees hold %d", cached_, cached));
  }
  if (pinned != pinned_) {
    return absl::InternalError(
        absl::StrFormat("pinned_blocks %d, nodes say %d", pinned_, pinned));
  }
  if (nodes != nodes_) return absl::InternalError("node count is off");
  if (cached_ > limit_) {
    return absl::InternalError(absl::StrFormat(
        "holds %d blocks over its limit of %d", cached_, limit_));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
