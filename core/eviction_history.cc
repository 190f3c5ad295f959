#include "core/eviction_history.h"

#include "absl/strings/str_format.h"

namespace prefixd {

void History::PushReversed(int list, absl::Span<const uint64_t> fps) {
  if (capacity_ == 0) return;
  for (uint64_t fp : fps) tags_.Prefetch(fp);
  std::vector<uint64_t>& ring = ring_[list];
  for (size_t i = fps.size(); i-- > 0;) {
    const uint64_t slot = next_[list];
    next_[list] = Next(slot, 1);
    if (ring.size() < capacity_) {
      ring.push_back(fps[i]);
    } else {
      // The push capacity_ before this one leaves the list, unless it was
      // taken or pushed again since (then its tag is no longer this one).
      // The map slot of what a later push forgets is fetched now: its
      // fingerprint is anywhere in the map, a cache miss.
      if (capacity_ > kForgetAhead)
        tags_.Prefetch(ring[Next(slot, kForgetAhead)]);
      const uint64_t expired = Tag(list, slot);
      if (tags_.Erase(ring[slot], nullptr, &expired)) --size_[list];
      ring[slot] = fps[i];
    }
    uint64_t old;
    // A fingerprint pushed again while remembered leaves its old list.
    if (tags_.Put(fps[i], Tag(list, slot), &old)) --size_[old & 1];
    ++size_[list];
  }
}

void History::Clear() {
  tags_.Clear();
  for (int list = 0; list < 2; ++list) {
    ring_[list].clear();
    next_[list] = 0;
    size_[list] = 0;
  }
}

absl::Status History::CheckInvariants() const {
  // The map's size leaves out the key it keeps aside.
  const size_t entries = tags_.size() + (tags_.Find(kTaken) != nullptr);
  if (size_[0] + size_[1] != entries) {
    return absl::InternalError(
        absl::StrFormat("history lists hold %d and %d, its map %d", size_[0],
                        size_[1], entries));
  }
  for (int list = 0; list < 2; ++list) {
    const std::vector<uint64_t>& ring = ring_[list];
    // A ring still filling is written at its end, a full one anywhere.
    const uint64_t next = next_[list];
    const bool next_ok = ring.size() < capacity_
                             ? next == ring.size()
                             : next < capacity_ || next == 0;
    if (ring.size() > capacity_ || !next_ok) {
      return absl::InternalError(
          absl::StrFormat("history ring %d holds %d, capacity %d, next %d",
                          list, ring.size(), capacity_, next_[list]));
    }
    // A fingerprint is live where its tag names its ring slot.
    size_t live = 0;
    for (uint64_t slot = 0; slot < ring.size(); ++slot) {
      const uint64_t* tag = tags_.Find(ring[slot]);
      live += tag != nullptr && *tag == Tag(list, slot);
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
