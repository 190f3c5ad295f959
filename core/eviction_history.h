// History: the memory of recently evicted blocks, by fingerprint, of the
// eviction policies that have one (eviction.h, docs/architecture.md
// "Eviction policies").
#ifndef PREFIXD_CORE_EVICTION_HISTORY_H_
#define PREFIXD_CORE_EVICTION_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/u64_map.h"

namespace prefixd {

// Two lists (ADAPTIVE's B1 and B2; SHADOW uses list 0 only), each holding
// the fingerprints among the last `capacity` pushed to it that have not
// been taken since: a ring of its last `capacity` pushes, and one hash map
// over both lists from a fingerprint to where it was last pushed. Push
// writes the ring slot of the push `capacity` before it, which forgets that
// fingerprint unless it was taken (or pushed again) since; Take forgets
// one. Each is one or two map operations and no allocation once a ring is
// full (a ring grows to `capacity` as pushes come, not at once).
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
  // Fetches the map slots a Take or Push of fp will read first, so that
  // a caller with several at hand overlaps their cache misses.
  void Prefetch(uint64_t fp) const { tags_.Prefetch(fp); }
  void Clear();
  // The rings and the map agree and the capacity holds.
  absl::Status CheckInvariants() const;

 private:
  // How many pushes ahead Push prefetches the entry it will forget.
  static constexpr uint64_t kForgetAhead = 8;
  // fp's entry in tags_: its list and push number.
  static uint64_t Tag(int list, uint64_t push) {
    return push * 2 + static_cast<uint64_t>(list);
  }

  const uint64_t capacity_;
  // fp -> Tag(list, push number within the list) of its newest push.
  U64Map tags_;
  // Per list: push p's fingerprint at ring_[list][p % capacity_], for the
  // last capacity_ pushes p < pushes_[list].
  std::vector<uint64_t> ring_[2];
  uint64_t pushes_[2] = {0, 0};
  size_t size_[2] = {0, 0};
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_EVICTION_HISTORY_H_
