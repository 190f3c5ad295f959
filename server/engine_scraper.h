// EngineScraper: reads each configured engine's own Prometheus endpoint
// (index.pick.engine_metrics; docs/index.md, "Load from the engines'
// metrics") every interval, all engines at once (server/http_fetches.h:
// kept-alive connections are reused), and files
// each reading (index/engine_metrics.h) in EngineLoads for Pick. A failed
// scrape (connection, HTTP status, timeout, a body that does not parse or
// holds no load gauge) leaves the last reading to age out; the first
// failure of a run of failures, each change of its reason, and the
// recovery after it are logged, and so is a reading of a worker the index
// does not list (Pick charges it only once the index has that worker).
//
// Thread safety: the scraping runs on the scraper's own thread; Stop may
// be called from any thread.
#ifndef PREFIXD_SERVER_ENGINE_SCRAPER_H_
#define PREFIXD_SERVER_ENGINE_SCRAPER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "index/engine_loads.h"
#include "index/engine_metrics.h"
#include "server/engine_load_filer.h"
#include "server/http_fetches.h"
#include "server/periodic.h"

namespace prefixd {

struct EngineMetricsTarget {
  std::string worker;  // the index's worker name
  std::string url;     // http:// or https://
  // Only the series carrying all of these count (a DP rank's `engine`).
  std::vector<LabelPair> labels;
};

struct EngineScrapeOptions {
  std::vector<EngineMetricsTarget> targets;  // empty: no scraper
  absl::Duration interval = absl::Seconds(1);
  absl::Duration max_age = absl::Seconds(3);  // EngineLoads' freshness
  absl::Duration timeout = absl::Seconds(1);  // per scrape
  size_t max_body_bytes = size_t{4} << 20;
};

class EngineScraper {
 public:
  // The index's worker names, sorted (called once a round, on the
  // scraping thread).
  using WorkerNames = std::function<std::vector<std::string>()>;

  // Starts scraping `options.targets` into `loads`, which must outlive the
  // scraper; `workers` (may be empty) tells which targets' workers the
  // index lists.
  static absl::StatusOr<std::unique_ptr<EngineScraper>> Start(
      EngineScrapeOptions options, EngineLoads* loads,
      WorkerNames workers = {});
  ~EngineScraper();
  EngineScraper(const EngineScraper&) = delete;
  EngineScraper& operator=(const EngineScraper&) = delete;

  // Ends the round in progress (its transfers are abandoned) and joins.
  void Stop();

  // Per target, in the config's order: its scrapes so far.
  std::vector<EngineLoadFiler::Counts> counts() const {
    return filer_.counts();
  }

 private:
  EngineScraper(EngineScrapeOptions options, EngineLoads* loads,
                WorkerNames workers);
  // One scrape of every target, at once.
  void Round();
  // Target i's reading from the round's response, or why there is none.
  absl::StatusOr<EngineLoad> Reading(size_t i);
  // Logs target i's reading when its worker is not among `names` (sorted),
  // once per run of such readings.
  void CheckListed(size_t i, const std::vector<std::string>& names);

  const EngineScrapeOptions options_;
  const WorkerNames workers_;
  // Files each target's reading (the scraping thread's).
  EngineLoadFiler filer_;
  // Per target, whether its last reading was of a worker the index did
  // not list; touched only by the scraping thread.
  std::vector<bool> unlisted_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<HttpFetches> fetches_;    // used by the scraping thread
  std::unique_ptr<PeriodicThread> thread_;  // last: stopped first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ENGINE_SCRAPER_H_
