#include "core/eviction_history.h"

#include "absl/strings/str_format.h"

namespace prefixd {

int History::Take(uint64_t fp) {
  uint64_t tag;
  if (!tags_.Erase(fp, &tag)) return -1;
  const int list = static_cast<int>(tag & 1);
  --size_[list];
  return list;
}

void History::Push(int list, uint64_t fp) {
  if (capacity_ == 0) return;
  std::vector<uint64_t>& ring = ring_[list];
  const uint64_t push = pushes_[list]++;
  if (ring.size() < capacity_) {
    ring.push_back(fp);
  } else {
    // The push capacity_ before this one leaves the list, unless it was
    // taken or pushed again since (then its tag is no longer this one).
    uint64_t& slot = ring[push % capacity_];
    // The map slot of what a later push forgets is fetched now: its
    // fingerprint is anywhere in the map, a cache miss.
    if (capacity_ > kForgetAhead)
      tags_.Prefetch(ring[(push + kForgetAhead) % capacity_]);
    const uint64_t expired = Tag(list, push - capacity_);
    if (tags_.Erase(slot, nullptr, &expired)) --size_[list];
    slot = fp;
  }
  uint64_t old;
  if (tags_.Put(fp, Tag(list, push), &old)) --size_[old & 1];  // collision
  ++size_[list];
}

void History::Clear() {
  tags_.Clear();
  for (int list = 0; list < 2; ++list) {
    ring_[list].clear();
    pushes_[list] = 0;
    size_[list] = 0;
  }
}

absl::Status History::CheckInvariants() const {
  if (size_[0] + size_[1] != tags_.size()) {
    return absl::InternalError(
        absl::StrFormat("history lists hold %d and %d, its map %d", size_[0],
                        size_[1], tags_.size()));
  }
  for (int list = 0; list < 2; ++list) {
    const std::vector<uint64_t>& ring = ring_[list];
    if (ring.size() > capacity_ ||
        ring.size() != std::min<uint64_t>(pushes_[list], capacity_)) {
      return absl::InternalError(
          absl::StrFormat("history ring %d holds %d of %d pushes, capacity %d",
                          list, ring.size(), pushes_[list], capacity_));
    }
    // A fingerprint is live where its tag names its ring slot.
    size_t live = 0;
    for (uint64_t p = pushes_[list] - ring.size(); p < pushes_[list]; ++p) {
      const uint64_t* tag = tags_.Find(ring[p % capacity_]);
      live += tag != nullptr && *tag == Tag(list, p);
    }
    if (live != size_[list]) {
      return absl::InternalError(
          absl::StrFormat("history list %d counts %d, its ring holds %d", list,
                          size_[list], live));
    }
  }
  return absl::OkStatus();
}

}  // namespace prefixd
