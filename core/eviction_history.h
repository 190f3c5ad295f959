// History: ADAPTIVE's memory of recently evicted blocks, by fingerprint
// (eviction.h, docs/architecture.md "Eviction policies").
#ifndef PREFIXD_CORE_EVICTION_HISTORY_H_
#define PREFIXD_CORE_EVICTION_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <utility>

#include "absl/status/status.h"
#include "core/u64_map.h"

namespace prefixd {

// ADAPTIVE's history: B1 and B2 (lists 0 and 1), each a FIFO set of at
// most `capacity` fingerprints, in one hash map so that a lookup costs one
// probe. Push adds the newest and drops the list's oldest beyond the
// capacity; Take removes one from the middle. O(1) amortized each.
//
// Thread safety: none; its EvictionState's tenant mutex guards it.
class History {
 public:
  explicit History(uint64_t capacity) : capacity_(capacity) {}
  size_t size(int list) const { return size_[list]; }
  uint64_t capacity() const { return capacity_; }
  // The list that held fp, which forgets it; -1 if neither did.
  int Take(uint64_t fp);
  void Push(int list, uint64_t fp);
  void Clear();
  // The FIFOs and the map agree and the capacity holds.
  absl::Status CheckInvariants() const;

 private:
  void Compact(int list);

  const uint64_t capacity_;
  uint64_t next_ = 0;  // push number
  // fp -> its push number * 2 + its list.
  U64Map tags_;
  // (tag, fp), oldest first; an entry whose tag is not tags_'s for its fp
  // was taken (or pushed again) and is skipped.
  std::deque<std::pair<uint64_t, uint64_t>> order_[2];
  size_t size_[2] = {0, 0};
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_EVICTION_HISTORY_H_
