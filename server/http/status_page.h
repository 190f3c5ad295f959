// The status page at / on the metrics listener (docs/metrics.md, "Status
// page"): epoch, model and geometry, budget, per tenant cached blocks, hit
// rate over the last minutes, evictions by reason, leases; with the fleet
// index its workers and routing counters; plots of the last hour
// (server/http/status_history.h) as inline SVG. It reloads itself every
// few seconds. Every tenant, worker and medium name is HTML-escaped; the
// page loads nothing (server/http/html.h).
//
// Thread safety: StatusHtml may be called from several threads at once.
#ifndef PREFIXD_SERVER_HTTP_STATUS_PAGE_H_
#define PREFIXD_SERVER_HTTP_STATUS_PAGE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "core/cache.h"
#include "model/kv_geometry.h"
#include "server/http/sources.h"
#include "server/http/status_history.h"
#include "server/periodic.h"

namespace prefixd {

// Hit rate over a sliding window: the tokens matched and looked up per
// tenant between the newest sample at least `window` old (or the oldest one
// while the daemon is younger) and now.
class HitRateWindow {
 public:
  struct Rate {
    uint64_t hit_tokens = 0;
    uint64_t looked_up_tokens = 0;
  };
  struct Result {
    absl::Duration span;  // what the rates cover
    std::map<std::string, Rate> tenants;
  };

  explicit HitRateWindow(absl::Duration window) : window_(window) {}

  // Records the counters of `stats` taken at `now`.
  void Record(absl::Time now, const CacheStats& stats);
  // Records, then returns the rates over the window ending at `now`.
  Result Over(absl::Time now, const CacheStats& stats);

 private:
  struct Sample {
    absl::Time time;
    std::map<std::string, Rate> tenants;  // cumulative counters
  };
  void RecordLocked(absl::Time now, const CacheStats& stats)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration window_;
  Mutex mu_;
  std::deque<Sample> samples_ ABSL_GUARDED_BY(mu_);  // oldest first
};

class StatusPage {
 public:
  struct Options {
    // The hit rate column covers the last `window`; the plots the last
    // `history`; both from samples taken every `sample_interval`.
    absl::Duration window = absl::Minutes(5);
    absl::Duration history = absl::Hours(1);
    absl::Duration sample_interval = absl::Seconds(10);
  };

  // Shows `sources` (its cache and, if set, its index). REQUIRES: what
  // `sources` points to outlives this object.
  StatusPage(const HttpSources& sources, const Options& options);
  explicit StatusPage(const HttpSources& sources)
      : StatusPage(sources, Options()) {}
  StatusPage(const StatusPage&) = delete;
  StatusPage& operator=(const StatusPage&) = delete;

  // The page as it is at `now`.
  std::string StatusHtml(absl::Time now);

 private:
  // The counters of now, for the plots.
  StatusSample Sample(absl::Time now) const;

  const PrefixCache* const cache_;
  const KvIndex* const index_;  // null without the fleet index
  const DaemonFacts info_;
  const absl::Duration window_;
  HitRateWindow hit_rates_;
  StatusHistory history_;
  std::unique_ptr<PeriodicThread> sampler_;  // last: stops first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_STATUS_PAGE_H_
