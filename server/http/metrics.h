// Prometheus metrics (docs/metrics.md) in prometheus-cpp's text format, as
// /metrics serves them (server/http/metrics_listener.h), from four sources:
//
//  - The cache: every prefixd_* counter and gauge is built at scrape time
//    from PrefixCache::Stats(TenantScope::All()), so the numbers can never
//    disagree with what core counted, and nothing is counted twice. The
//    tenant label is bounded by the configured tenant limit (core enforces
//    it).
//  - The fleet index and the events publisher, likewise from their Stats.
//  - The Conductor API: prefixd_index_http_requests_total{endpoint,code}
//    and prefixd_index_http_request_seconds{endpoint}, fed by its listener
//    (server/http/conductor_listener.h); its children are created, all at
//    once, when the daemon turns the API on.
//  - RPCs: prefixd_rpc_errors_total{method,code} and the histogram
//    prefixd_rpc_duration_seconds{method}, fed by the service through the
//    RpcObserver hook. Every child (each method x each code) is created in
//    the constructor, so recording never calls Family::Add.
//  - The process: process_* metrics read from /proc at scrape time.
//
//   Metrics metrics(PREFIXD_VERSION);
//   deps.observer = &metrics;                      // before Server::Start
//   ... server = Server::Start(config, deps) ...
//   metrics.ScrapeText(&sources);                  // what /metrics serves
//
// Thread safety: every method may be called concurrently from any thread.
#ifndef PREFIXD_SERVER_HTTP_METRICS_H_
#define PREFIXD_SERVER_HTTP_METRICS_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/cache.h"
#include "index/kv_index.h"
#include "index/picker.h"
#include "index/pool_resolver.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/engine_load_feed.h"
#include "server/engine_scraper.h"
#include "server/events_publish.h"
#include "server/http/conductor_listener.h"
#include "server/http/sources.h"
#include "server/service.h"

namespace prefixd {

// The RPC methods of prefixd.v1.PrefixCache, prefixd.v1.PrefixIndex and
// kv_indexer.v1.KVIndexer, as the services name them.
inline constexpr std::array<absl::string_view, 26> kRpcMethods = {
    "GetInfo",
    "Handshake",
    "Match",
    "Insert",
    "Release",
    "KeepAlive",
    "Evict",
    "Invalidate",
    "Reset",
    "Stats",
    "WatchEvents",
    "Dump",
    "MatchBatch",
    "InsertBatch",
    "Route",
    "RouteBatch",
    "ListWorkers",
    "Pick",
    "PickBatch",
    "ConfigureExpectedWorkers",
    "InvalidateWorker",
    "ReplaceExternalKvSnapshot",
    "ApplyExternalKvBatch",
    "MatchExternalKv",
    "MatchExternalKvPrefix",
    "GetExternalKvHitCounts"};

// Upper bounds (seconds) of prefixd_rpc_duration_seconds: 25us .. 1s.
std::vector<double> RpcDurationBuckets();

// The prefixd_* families of `stats` (all tenants) plus prefixd_build_info.
std::vector<prometheus::MetricFamily> CacheMetricFamilies(
    const CacheStats& stats, absl::string_view version);

// The prefixd_index_* families of the fleet index (docs/index.md).
// Pick's decisions and what it keeps (index/picker.h).
std::vector<prometheus::MetricFamily> PickMetricFamilies(
    const Picker::Counts& counts);
std::vector<prometheus::MetricFamily> IndexMetricFamilies(
    const IndexStats& stats);
// Readings of the engines' loads, per worker and result (ok, failed):
// the metrics scraper's (server/engine_scraper.h) and the load sockets'
// (server/engine_load_feed.h), in a counter family `name`; also the SGLang
// workers' /server_info reads (server/sglang_discovery.h).
std::vector<prometheus::MetricFamily> EngineLoadReadingFamilies(
    absl::string_view name, absl::string_view help,
    const std::vector<EngineLoadFiler::Counts>& counts);
// prefixd_index_pool_lookups_total and prefixd_index_pool_addresses: the
// pools' lookups of their host names (index/pool_resolver.h), by source.
std::vector<prometheus::MetricFamily> PoolLookupFamilies(
    const std::vector<PoolLookups>& pools);

// The prefixd_events_* families of events_publish (docs/index.md, "The
// sidecar publishes too").
std::vector<prometheus::MetricFamily> EventsPublishMetricFamilies(
    const EventsPublishStats& stats);

// process_* families read from `proc_dir` (normally "/proc"): resident and
// virtual memory, CPU seconds, open and max file descriptors, start time.
// Whatever cannot be read is left out.
std::vector<prometheus::MetricFamily> ProcessMetricFamilies(
    const std::string& proc_dir = "/proc");

// The statuses the Conductor API answers (the code label of
// prefixd_index_http_requests_total); any other is counted as 500.
inline constexpr std::array<int, 9> kConductorStatuses = {
    200, 400, 401, 403, 404, 405, 409, 413, 500};

class Metrics final : public RpcObserver, public ConductorObserver {
 public:
  explicit Metrics(std::string version);
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Records one finished RPC: its latency, and an error unless code is OK.
  // `method` must be one of kRpcMethods (others are dropped; a bug).
  void ObserveRpc(absl::string_view method, absl::StatusCode code,
                  absl::Duration elapsed);
  void OnRpcDone(absl::string_view method, absl::StatusCode code,
                 absl::Duration elapsed) override {
    ObserveRpc(method, code, elapsed);
  }

  // Creates the Conductor API's families (index.http_listen), every child
  // at 0. Call once, before its listener serves.
  void EnableConductorMetrics();
  // Records one request of the Conductor API; nothing before
  // EnableConductorMetrics.
  void OnConductorRequest(absl::string_view endpoint, int status,
                          absl::Duration elapsed) override;

  // Everything /metrics returns, in the text format: the RPC families,
  // and with `sources` those of its cache, index and publisher and the
  // process's.
  std::string ScrapeText(const HttpSources* sources = nullptr) const;

 private:
  // Canonical codes 1..16 (OK excluded): the code label of errors.
  static constexpr int kNumErrorCodes = 16;
  struct MethodChildren {
    prometheus::Histogram* duration = nullptr;
    std::array<prometheus::Counter*, kNumErrorCodes> errors{};
  };

  std::shared_ptr<prometheus::Registry> registry_;
  std::array<MethodChildren, kRpcMethods.size()> rpc_;
  struct EndpointChildren {
    prometheus::Histogram* seconds = nullptr;
    std::array<prometheus::Counter*, kConductorStatuses.size()> requests{};
  };
  std::array<EndpointChildren, kConductorEndpoints.size()> conductor_;
  const std::string version_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_METRICS_H_
