// What the status page plots (docs/metrics.md, "Status page"): samples of
// the cache's and the fleet index's counters, taken every few seconds and
// kept for the last hour in memory, and the series drawn from them.
//
//   StatusHistory history(absl::Hours(1));
//   history.Add(TakeSample(absl::Now(), cache.Stats(all), &index_stats));
//   std::vector<StatusSample> s = history.Samples();  // oldest first
//
// A series of a counter plots what it rose by between two samples (the
// hit rate of that interval, the evictions in it); a level (cached blocks,
// the budget) plots its value at each sample.
#ifndef PREFIXD_SERVER_HTTP_STATUS_HISTORY_H_
#define PREFIXD_SERVER_HTTP_STATUS_HISTORY_H_

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "core/cache.h"
#include "core/types.h"
#include "index/kv_index.h"
#include "server/http/svg_plot.h"

namespace prefixd {

// The counters and levels of one moment, summed over tenants.
struct StatusSample {
  absl::Time time;
  uint64_t hit_tokens = 0;        // prompt tokens matched
  uint64_t looked_up_tokens = 0;  // prompt tokens looked up
  uint64_t cached_blocks = 0;
  uint64_t budget_blocks = 0;
  std::array<uint64_t, kNumEvictReasons> evicted = {};  // by EvictReason
  // With the fleet index (else zero).
  bool index = false;
  uint64_t route_requests = 0;
  uint64_t lag_batches = 0;  // batches in the event lag histogram
  double lag_seconds = 0;    // their summed lag
};

// `index` may be null (no fleet index).
StatusSample TakeSample(absl::Time now, const CacheStats& cache,
                        const IndexStats* index);

// The samples of the last `span`, oldest first, and one before them (the
// baseline of the oldest interval).
//
// Thread safety: Add and Samples may be called from several threads at
// once; mu_ guards the samples.
class StatusHistory {
 public:
  explicit StatusHistory(absl::Duration span) : span_(span) {}
  StatusHistory(const StatusHistory&) = delete;
  StatusHistory& operator=(const StatusHistory&) = delete;

  // Appends `sample` (its time not before the newest's) and forgets the
  // samples older than the span's baseline.
  void Add(const StatusSample& sample);
  std::vector<StatusSample> Samples() const;
  absl::Duration span() const { return span_; }

 private:
  const absl::Duration span_;
  mutable Mutex mu_;
  std::deque<StatusSample> samples_ ABSL_GUARDED_BY(mu_);  // oldest first
};

// The plots of `samples` (oldest first) over the `span` ending at `end`:
// hit rate, cached blocks against the budget, evictions by reason and,
// when the newest sample has the fleet index, Route rate and event lag.
// Rates are per interval between two samples: the data-* attributes carry
// each interval's raw counts (hit-tokens and looked-up-tokens, blocks,
// requests, batches and lag-seconds).
std::vector<Plot> HistoryPlots(const std::vector<StatusSample>& samples,
                               absl::Time end, absl::Duration span);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_STATUS_HISTORY_H_
