// History: the memory of recently evicted blocks, by fingerprint, of the
// eviction policies that have one (eviction.h, docs/architecture.md
// "Eviction policies").
#ifndef PREFIXD_CORE_EVICTION_HISTORY_H_
#define PREFIXD_CORE_EVICTION_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/u64_map.h"

namespace prefixd {

// Two lists (ADAPTIVE's B1 and B2; SHADOW uses list 0 only), each holding
// the fingerprints among the last `capacity` pushed to it that have not
// been taken since: a ring of its last `capacity` pushes, and one hash map
// over both lists from a fingerprint to the list and ring slot of its
// newest push. Push overwrites the ring slot of the push `capacity` before
// it, which forgets that fingerprint unless it was taken (or pushed again)
// since; Take forgets one and marks its ring slot taken, so that the
// overwrite probes nothing. Each is one or two map operations and no
// allocation once a ring is full (a ring grows to `capacity` as pushes
// come, not at once).
//
// Thread safety: none; its EvictionState's tenant mutex guards it.
class History {
 public:
  explicit History(uint64_t capacity) : capacity_(capacity) {}
  size_t size(int list) const { return size_[list]; }
  uint64_t capacity() const { return capacity_; }
  // The list that held fp, which forgets it; -1 if neither did.
  int Take(uint64_t fp) {
    uint64_t tag;
    if (!tags_.Erase(fp, &tag)) return -1;
    const int list = static_cast<int>(tag & 1);
    ring_[list][tag >> 1] = kTaken;
    --size_[list];
    return list;
  }
  void Push(int list, uint64_t fp) { PushReversed(list, {&fp, 1}); }
  // Pushes each of fps, the last first (a victim's tail: its last block
  // first), with their map slots fetched first.
  void PushReversed(int list, absl::Span<const uint64_t> fps);
  // Fetches the map slots a Take or Push of fp will read first, so that
  // a caller with several at hand overlaps their cache misses.
  void Prefetch(uint64_t fp) const { tags_.Prefetch(fp); }
  void Clear();
  // The rings and the map agree and the capacity holds.
  absl::Status CheckInvariants() const;

 private:
  // How many pushes ahead Push prefetches the entry it will forget.
  static constexpr uint64_t kForgetAhead = 8;
  // A taken ring slot holds the key the map keeps aside: forgetting it
  // probes nothing, and a fingerprint that is that key is still found by
  // its tag.
  static constexpr uint64_t kTaken = U64Map::kAsideKey;
  // fp's entry in tags_: its list and ring slot.
  static uint64_t Tag(int list, uint64_t slot) {
    return slot * 2 + static_cast<uint64_t>(list);
  }
  // The ring slot `ahead` after `slot`.
  uint64_t Next(uint64_t slot, uint64_t ahead) const {
    return slot + ahead < capacity_ ? slot + ahead : slot + ahead - capacity_;
  }

  const uint64_t capacity_;
  // fp -> Tag(list, ring slot) of its newest push.
  U64Map tags_;
  // Per list: its last pushes (fewer until capacity_ of them), the slot
  // the next push writes, and how many fingerprints it holds.
  std::vector<uint64_t> ring_[2];
  uint64_t next_[2] = {0, 0};
  size_t size_[2] = {0, 0};
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_EVICTION_HISTORY_H_
