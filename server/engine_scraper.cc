#include "server/engine_scraper.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace prefixd {
namespace {

// The filer's sources: each target's worker and URL.
std::vector<EngineLoadFiler::Source> Sources(const EngineScrapeOptions& o) {
  std::vector<EngineLoadFiler::Source> out;
  for (const EngineMetricsTarget& t : o.targets)
    out.push_back({t.worker, t.url});
  return out;
}

std::vector<HttpTarget> Targets(const EngineScrapeOptions& o) {
  std::vector<HttpTarget> out;
  for (const EngineMetricsTarget& t : o.targets) {
    HttpTarget target;
    target.url = t.url;
    out.push_back(std::move(target));
  }
  return out;
}

HttpFetchOptions FetchOptions(const EngineScrapeOptions& o) {
  HttpFetchOptions f;
  f.timeout = o.timeout;
  f.max_body_bytes = o.max_body_bytes;
  f.accept = "text/plain;version=0.0.4";
  return f;
}

}  // namespace

EngineScraper::EngineScraper(EngineScrapeOptions options, EngineLoads* loads,
                             WorkerNames workers)
    : options_(std::move(options)),
      workers_(std::move(workers)),
      filer_(loads, "engine metrics", Sources(options_)),
      unlisted_(options_.targets.size()),
      fetches_(std::make_unique<HttpFetches>(Targets(options_),
                                             FetchOptions(options_))) {}

EngineScraper::~EngineScraper() { Stop(); }

absl::StatusOr<std::unique_ptr<EngineScraper>> EngineScraper::Start(
    EngineScrapeOptions options, EngineLoads* loads, WorkerNames workers) {
  RETURN_IF_ERROR(HttpFetches::InitLibcurl());
  std::unique_ptr<EngineScraper> s(
      new EngineScraper(std::move(options), loads, std::move(workers)));
  s->thread_ = std::make_unique<PeriodicThread>(s->options_.interval,
                                                [p = s.get()] { p->Round(); });
  s->thread_->Wake();  // the first round now, not an interval on
  return s;
}

void EngineScraper::Stop() {
  stopping_.store(true, std::memory_order_relaxed);
  if (thread_ != nullptr) thread_->Stop();
}

void EngineScraper::Round() {
  fetches_->Run(stopping_);
  if (stopping_.load(std::memory_order_relaxed)) return;
  const absl::Time at = absl::Now();
  const std::vector<std::string> names =
      workers_ ? workers_() : std::vector<std::string>();
  for (size_t i = 0; i < options_.targets.size(); ++i) {
    filer_.File(i, Reading(i), at);
    if (workers_ && filer_.ok(i)) CheckListed(i, names);
  }
}

absl::StatusOr<EngineLoad> EngineScraper::Reading(size_t i) {
  ASSIGN_OR_RETURN(const std::string body, fetches_->Take(i));
  return ReadEngineMetrics(body, options_.targets[i].labels);
}

void EngineScraper::CheckListed(size_t i,
                                const std::vector<std::string>& names) {
  const EngineMetricsTarget& t = options_.targets[i];
  const bool unlisted =
      !std::binary_search(names.begin(), names.end(), t.worker);
  if (unlisted && !unlisted_[i]) {
    std::fprintf(stderr,
                 "prefixd: engine metrics of %s (%s) read, but the index has "
                 "no worker %s (ListWorkers names them): Pick charges its "
                 "readings once a source or registration adds it\n",
                 t.worker.c_str(), t.url.c_str(), t.worker.c_str());
  }
  unlisted_[i] = unlisted;
}

}  // namespace prefixd
