#include "index/instrumented_index.h"

#include <algorithm>

namespace prefixd {

void InstrumentedIndex::Apply(WorkerId worker, const KvEventBatch& batch,
                              int64_t seq, absl::Time now) {
  const double lag = std::max(
      0.0, absl::ToDoubleSeconds(now - absl::FromUnixNanos(static_cast<int64_t>(
                                           batch.ts * 1e9))));
  const size_t bucket =
      std::lower_bound(kLagBuckets.begin(), kLagBuckets.end(), lag) -
      kLagBuckets.begin();
  {
    MutexLock lock(&lag_mu_);
    ++lag_counts_[bucket];
    lag_sum_ += lag;
  }
  index_->Apply(worker, batch, seq, now);
}

RouteResult InstrumentedIndex::Route(const RouteQuery& query) const {
  RouteResult result = index_->Route(query);
  const uint64_t best =
      result.best_worker.empty() ? 0 : result.workers[0].matched_blocks;
  route_requests_.fetch_add(1, std::memory_order_relaxed);
  route_prompt_blocks_.fetch_add(result.prompt_blocks,
                                 std::memory_order_relaxed);
  route_matched_blocks_.fetch_add(best, std::memory_order_relaxed);
  return result;
}

IndexStats InstrumentedIndex::Stats() const {
  IndexStats stats = index_->Stats();
  {
    MutexLock lock(&lag_mu_);
    stats.lag_counts = lag_counts_;
    stats.lag_sum = lag_sum_;
  }
  stats.route_requests = route_requests_.load(std::memory_order_relaxed);
  stats.route_prompt_blocks =
      route_prompt_blocks_.load(std::memory_order_relaxed);
  stats.route_matched_blocks =
      route_matched_blocks_.load(std::memory_order_relaxed);
  return stats;
}

}  // namespace prefixd
