// ShadowCache: a cache of block fingerprints only, which SHADOW's tenants
// run beside their real trees to learn which of two victim rules would hit
// more on the recent traffic (eviction.h, docs/architecture.md "Eviction
// policies").
#ifndef PREFIXD_CORE_SHADOW_CACHE_H_
#define PREFIXD_CORE_SHADOW_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/eviction_history.h"
#include "core/u64_map.h"

namespace prefixd {

// A block-level cache of at most `capacity` fingerprints, with no tree and
// no data: Access(fp) says whether fp was resident and makes it so,
// evicting by one of two rules:
//   - kLru: the least recently accessed fingerprint;
//   - kLirs: two lists, probation (accessed once since it came in) and
//     protected (accessed again, or came in while the ghost history
//     remembered it); the least recent of probation while probation holds
//     more than `probation` entries, else of protected. An evicted
//     fingerprint goes to the ghost history (the last `ghosts` evicted).
// These are the real tree's two rules under SHADOW, at block granularity.
// Each list is a doubly linked list through a slab of entries, indexed by
// a U64Map from fingerprint to slab slot: an access is one map probe and a
// few link writes, and nothing allocates once the slab is full.
//
// Thread safety: none; its EvictionState's tenant mutex guards it.
class ShadowCache {
 public:
  enum class Rule { kLru, kLirs };
  ShadowCache(Rule rule, uint64_t capacity, uint64_t probation,
              uint64_t ghosts);

  // True if fp was resident (a hit); fp is then the most recent of its list
  // (protected under kLirs).
  bool Access(uint64_t fp);
  void Prefetch(uint64_t fp) const { index_.Prefetch(fp); }
  uint64_t size() const { return sizes_[0] + sizes_[1]; }
  void Clear();
  // The lists, the map, the sizes and the capacity agree.
  absl::Status CheckInvariants() const;

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};
  struct Entry {
    uint64_t fp;
    uint32_t prev, next;  // in its list; slots 0 and 1 are the lists' heads
    uint32_t list;        // 0: LRU's only list or probation; 1: protected
  };
  void Link(uint32_t slot, uint32_t list);  // as the list's most recent
  void Unlink(uint32_t slot);
  void EvictOne();

  const Rule rule_;
  const uint64_t capacity_;
  const uint64_t probation_;
  std::vector<Entry> slab_;     // [0], [1]: sentinels of lists 0 and 1
  std::vector<uint32_t> free_;  // slab slots to reuse
  U64Map index_;                // fp -> slab slot
  History ghosts_;              // kLirs: list 0 only
  uint64_t sizes_[2] = {0, 0};
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_SHADOW_CACHE_H_
