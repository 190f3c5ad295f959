// ShadowCache: a cache of block fingerprints only, which SHADOW's tenants
// run beside their real trees to learn which of two victim rules would hit
// more on the recent traffic (eviction.h, docs/architecture.md "Eviction
// policies").
#ifndef PREFIXD_CORE_SHADOW_CACHE_H_
#define PREFIXD_CORE_SHADOW_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/u64_map.h"

namespace prefixd {

// A block-level cache of at most `capacity` fingerprints, with no tree and
// no data: Access(fp) says whether fp was resident and makes it so,
// evicting by one of two rules:
//   - kLru: the least recently accessed fingerprint;
//   - kLirs: two lists, probation (accessed once since it came in) and
//     protected (accessed again, or came back from the ghosts); the least
//     recent of probation while probation holds more than `probation`
//     entries (or protected is empty), else of protected. An evicted
//     fingerprint becomes the newest ghost; the ghost list keeps at most
//     `ghosts`, dropping its oldest. A ghost accessed again leaves the
//     ghost list (before a full cache evicts) and comes in protected.
// These are the real tree's two rules under SHADOW, at block granularity.
// Resident fingerprints and ghosts are entries of one slab, each in one of
// three doubly linked lists, indexed by one U64Map from fingerprint to slab
// slot: an access is one map probe and a few link writes, plus one erase
// when an entry is forgotten; nothing allocates once the slab is full.
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
  // The lists; slots 0..2 of the slab are their heads.
  static constexpr uint32_t kProbation = 0;  // kLru's only list
  static constexpr uint32_t kProtected = 1;
  static constexpr uint32_t kGhost = 2;
  static constexpr uint32_t kLists = 3;
  struct Entry {
    uint64_t fp;
    uint32_t prev, next;  // in its list
    uint32_t list;
  };
  void Link(uint32_t slot, uint32_t list);  // as the list's most recent
  void Unlink(uint32_t slot);
  void Forget(uint32_t slot);  // unlinks, unindexes and frees
  void EvictOne();

  const Rule rule_;
  const uint64_t capacity_;
  const uint64_t probation_;
  const uint64_t ghosts_;       // kLirs: the ghost list's size; else 0
  std::vector<Entry> slab_;     // [0, kLists): the lists' heads
  std::vector<uint32_t> free_;  // slab slots to reuse
  U64Map index_;                // fp -> slab slot, resident or ghost
  uint64_t sizes_[kLists] = {0, 0, 0};
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_SHADOW_CACHE_H_
