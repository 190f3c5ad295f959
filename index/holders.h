// A holder of a block in the fleet index: (worker, KV-cache group, tier)
// packed in 32 bits, 20 of worker, 4 of group, 8 of tier (medium). Shared
// by the tree that keeps them (index/holder_tree.h) and the scorer that
// reads them (index/prefix_scorer.h).
#ifndef PREFIXD_INDEX_HOLDERS_H_
#define PREFIXD_INDEX_HOLDERS_H_

#include <cstdint>

#include "index/group_rules.h"

namespace prefixd {

using WorkerId = uint32_t;

inline constexpr uint32_t kMaxHolderWorkers = 1u << 20;
static_assert(kMaxGroups == 16, "holders pack the group in 4 bits");

inline uint32_t PackHolder(WorkerId w, int64_t group, uint8_t medium) {
  return (w << 12) | (static_cast<uint32_t>(group) << 8) | medium;
}
inline WorkerId HolderWorker(uint32_t h) { return h >> 12; }
inline int HolderGroup(uint32_t h) { return static_cast<int>((h >> 8) & 0xf); }
inline uint8_t HolderMedium(uint32_t h) {
  return static_cast<uint8_t>(h & 0xff);
}
inline bool SameWorkerAndMedium(uint32_t a, uint32_t b) {
  return HolderWorker(a) == HolderWorker(b) &&
         HolderMedium(a) == HolderMedium(b);
}

}  // namespace prefixd

#endif  // PREFIXD_INDEX_HOLDERS_H_
