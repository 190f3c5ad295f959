// The offline optimum of a trace replay: Belady's rule (evict the block whose
// next use is farthest in the future) under the constraints prefixd works
// with, so that every online policy's hit rate can be put against the best
// any policy could reach at the same capacity (docs/performance.md,
// "Eviction").
//
// The replay is bench/trace_replay's and bench/lru_sim.py's, one block per
// trace hash id. Per request: the longest cached prefix of its ids is a hit;
// a request with more blocks than the capacity inserts nothing (prefixd
// refuses it); otherwise the rest is inserted and, while more blocks are
// cached than the capacity, an evictable block goes: a cached block with no
// cached child that is not on the current request's path (prefixd evicts
// whole leaf blocks, and an Insert's own path is pinned while it runs).
// Belady picks, among those, the one next used farthest in the future.
//
// Ties cannot change the outcome: a block's next use is never later than its
// descendants', so two leaves next used by the same request would be on one
// path, which two leaves cannot be; only blocks never used again tie, and
// they all go before any block that is used again.
#ifndef PREFIXD_BENCH_BELADY_H_
#define PREFIXD_BENCH_BELADY_H_

#include <cstdint>

#include "bench/trace.h"

namespace prefixd {
namespace bench {

struct ReplayCounts {
  uint64_t blocks = 0;      // blocks of all requests
  uint64_t hit_blocks = 0;  // blocks in the cached prefixes found
  uint64_t evicted_blocks = 0;
  uint64_t refused_inserts = 0;
};

ReplayCounts ReplayBelady(const Trace& trace, uint64_t capacity);

}  // namespace bench
}  // namespace prefixd

#endif  // PREFIXD_BENCH_BELADY_H_
