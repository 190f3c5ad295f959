#include "server/http/status_history.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace prefixd {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// What a counter rose by (0 if it fell: a tenant's counters went with it).
double Rise(uint64_t before, uint64_t after) {
  return after >= before ? static_cast<double>(after - before) : 0;
}

// A line over the intervals between samples: `value` of each interval's
// start and end samples, and named raw series.
template <typename Fn>
PlotLine IntervalLine(std::string name,
                      const std::vector<StatusSample>& samples, Fn value) {
  PlotLine line{std::move(name), {}, {}, {}};
  for (size_t i = 1; i < samples.size(); ++i) {
    line.times.push_back(samples[i].time);
    line.values.push_back(value(samples[i - 1], samples[i], &line.data));
  }
  return line;
}

// Appends `v` to the raw series `name` of `data` (created on first use).
void Raw(std::vector<std::pair<std::string, std::vector<double>>>* data,
         const std::string& name, double v) {
  for (auto& [n, series] : *data) {
    if (n == name) {
      series.push_back(v);
      return;
    }
  }
  data->push_back({name, {v}});
}

// `count` per minute between samples `a` and `b` (NaN if no time passed).
double PerMinute(double count, const StatusSample& a, const StatusSample& b) {
  const double minutes = absl::ToDoubleSeconds(b.time - a.time) / 60;
  return minutes > 0 ? count / minutes : kNaN;
}

Plot HitRatePlot(const std::vector<StatusSample>& samples) {
  Plot p{"plot-hit-rate",
         "Hit rate (prompt tokens matched / looked up)",
         "%",
         {},
         {},
         100,
         {}};
  p.lines.push_back(IntervalLine(
      "hit rate", samples,
      [](const StatusSample& a, const StatusSample& b, auto* data) {
        const double hit = Rise(a.hit_tokens, b.hit_tokens);
        const double looked_up = Rise(a.looked_up_tokens, b.looked_up_tokens);
        Raw(data, "hit-tokens", hit);
        Raw(data, "looked-up-tokens", looked_up);
        return looked_up == 0 ? kNaN : 100 * hit / looked_up;
      }));
  return p;
}

Plot CachedPlot(const std::vector<StatusSample>& samples) {
  Plot p{"plot-cached", "Cached blocks and the budget", "", {}, {}, 0, {}};
  PlotLine cached{"cached blocks", {}, {}, {}};
  PlotLine budget{"budget", {}, {}, {}};
  for (const StatusSample& s : samples) {
    cached.times.push_back(s.time);
    cached.values.push_back(static_cast<double>(s.cached_blocks));
    budget.times.push_back(s.time);
    budget.values.push_back(static_cast<double>(s.budget_blocks));
  }
  p.lines = {std::move(cached), std::move(budget)};
  return p;
}

Plot EvictionPlot(const std::vector<StatusSample>& samples) {
  Plot p{"plot-evictions",
         "Evicted blocks per minute, by reason",
         "",
         {},
         {},
         0,
         {}};
  for (size_t r = 0; r < static_cast<size_t>(kNumEvictReasons); ++r) {
    p.lines.push_back(IntervalLine(
        std::string(EvictReasonName(static_cast<EvictReason>(r))), samples,
        [r](const StatusSample& a, const StatusSample& b, auto* data) {
          const double blocks = Rise(a.evicted[r], b.evicted[r]);
          Raw(data, "blocks", blocks);
          return PerMinute(blocks, a, b);
        }));
  }
  return p;
}

Plot RoutePlot(const std::vector<StatusSample>& samples) {
  Plot p{"plot-routes", "Route requests per second", "/s", {}, {}, 0, {}};
  p.lines.push_back(IntervalLine(
      "Route", samples,
      [](const StatusSample& a, const StatusSample& b, auto* data) {
        const double requests = Rise(a.route_requests, b.route_requests);
        Raw(data, "requests", requests);
        return PerMinute(requests, a, b) / 60;
      }));
  return p;
}

Plot LagPlot(const std::vector<StatusSample>& samples) {
  Plot p{
      "plot-lag", "Event lag (engine stamp to applied), mean", " ms", {}, {}, 0,
      {}};
  p.lines.push_back(IntervalLine(
      "event lag", samples,
      [](const StatusSample& a, const StatusSample& b, auto* data) {
        const double batches = Rise(a.lag_batches, b.lag_batches);
        const double seconds = std::max(0.0, b.lag_seconds - a.lag_seconds);
        Raw(data, "batches", batches);
        Raw(data, "lag-seconds", seconds);
        return batches == 0 ? kNaN : 1000 * seconds / batches;
      }));
  return p;
}

}  // namespace

StatusSample TakeSample(absl::Time now, const CacheStats& cache,
                        const IndexStats* index) {
  StatusSample s;
  s.time = now;
  s.cached_blocks = cache.resident_blocks;
  s.budget_blocks = cache.budget_blocks;
  for (const TenantUsage& t : cache.tenants) {
    s.hit_tokens += t.match_hit_tokens;
    s.looked_up_tokens += t.match_tokens;
    for (size_t r = 0; r < s.evicted.size(); ++r)
      s.evicted[r] += t.evicted_blocks[r];
  }
  if (index != nullptr) {
    s.index = true;
    s.route_requests = index->route_requests;
    for (uint64_t n : index->lag_counts) s.lag_batches += n;
    s.lag_seconds = index->lag_sum;
  }
  return s;
}

void StatusHistory::Add(const StatusSample& sample) {
  MutexLock lock(&mu_);
  samples_.push_back(sample);
  // Keep the newest sample at least span_ old as the baseline.
  while (samples_.size() > 1 && samples_[1].time <= sample.time - span_) {
    samples_.pop_front();
  }
}

std::vector<StatusSample> StatusHistory::Samples() const {
  MutexLock lock(&mu_);
  return std::vector<StatusSample>(samples_.begin(), samples_.end());
}

std::vector<Plot> HistoryPlots(const std::vector<StatusSample>& samples,
                               absl::Time end, absl::Duration span) {
  std::vector<Plot> plots = {HitRatePlot(samples), CachedPlot(samples),
                             EvictionPlot(samples)};
  if (!samples.empty() && samples.back().index) {
    plots.push_back(RoutePlot(samples));
    plots.push_back(LagPlot(samples));
  }
  for (Plot& p : plots) {
    p.end = end;
    p.span = span;
  }
  return plots;
}

}  // namespace prefixd
