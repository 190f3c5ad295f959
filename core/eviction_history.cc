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
  const uint64_t tag = next_++ * 2 + static_cast<uint64_t>(list);
  uint64_t old;
  if (tags_.Put(fp, tag, &old)) --size_[old & 1];  // only a hash collision
  order_[list].push_back({tag, fp});
  ++size_[list];
  while (size_[list] > capacity_) {
    const auto [t, f] = order_[list].front();
    order_[list].pop_front();
    if (tags_.Erase(f, nullptr, &t)) --size_[list];
  }
  // Taken entries stay in order_ until they reach its front; rebuilding it
  // when they outnumber the live ones keeps it within O(capacity).
  if (order_[list].size() > 2 * size_[list] + 64) Compact(list);
}

void History::Compact(int list) {
  std::deque<std::pair<uint64_t, uint64_t>> live;
  for (const auto& [t, f] : order_[list]) {
    const uint64_t* tag = tags_.Find(f);
    if (tag != nullptr && *tag == t) live.push_back({t, f});
  }
  order_[list].swap(live);
}

void History::Clear() {
  tags_.Clear();
  order_[0].clear();
  order_[1].clear();
  size_[0] = size_[1] = 0;
}

absl::Status History::CheckInvariants() const {
  if (size_[0] > capacity_ || size_[1] > capacity_ ||
      size_[0] + size_[1] != tags_.size()) {
    return absl::InternalError(
        absl::StrFormat("history lists hold %d and %d of %d, its map %d",
                        size_[0], size_[1], capacity_, tags_.size()));
  }
  for (int list = 0; list < 2; ++list) {
    size_t live = 0;
    for (const auto& [t, f] : order_[list]) {
      const uint64_t* tag = tags_.Find(f);
      live += tag != nullptr && *tag == t;
    }
    if (live != size_[list]) {
      return absl::InternalError(
          absl::StrFormat("history list %d counts %d, its FIFO holds %d", list,
                          size_[list], live));
    }
  }
  return absl::OkStatus();
}

}  // namespace prefixd
