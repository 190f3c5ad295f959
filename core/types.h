// Vocabulary shared by every part of core/: tokens, block IDs, leases, and the
// small enums that appear in results and events.
#ifndef PREFIXD_CORE_TYPES_H_
#define PREFIXD_CORE_TYPES_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace prefixd {

using Token = uint32_t;    // a token id
using BlockId = uint64_t;  // chosen by the engine; names a slot of its KV pool
using LeaseId = uint64_t;  // random, never 0 (0 means "no lease")

// Why blocks left the cache. The names are the `reason` label of
// prefixd_evicted_blocks_total.
enum class EvictReason : int {
  kBudget = 0,       // the global budget was full
  kLimit = 1,        // the tenant was over its own limit
  kRequested = 2,    // an explicit Evict(n)
  kInvalidated = 3,  // Invalidate(block_ids)
  kReset = 4,        // Reset(tenant | all)
};
inline constexpr int kNumEvictReasons = 5;
absl::string_view EvictReasonName(EvictReason reason);

// What a Match does when a cached block was computed at another position
// than the one requested (see docs/rope.md).
enum class RopeShift : int {
  kDeny = 0,   // stop the match at the first block whose rope_delta != 0
  kAllow = 1,  // return per-segment deltas; the engine re-rotates the keys
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_TYPES_H_
