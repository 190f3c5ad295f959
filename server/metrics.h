// Prometheus metrics (docs/metrics.md): an HTTP
// /metrics endpoint (server/http_listener.h, in prometheus-cpp's text
// format) serving three sources, and the web pages of server/status_page.h
// on the same listener.
//
//  - The cache: every prefixd_* counter and gauge is built at scrape time
//    from PrefixCache::Stats(TenantScope::All()), so the numbers can never
//    disagree with what core counted, and nothing is counted twice. The
//    tenant label is bounded by the configured tenant limit (core enforces
//    it).
//  - RPCs: prefixd_rpc_errors_total{method,code} and the histogram
//    prefixd_rpc_duration_seconds{method}, fed by the service through the
//    RpcObserver hook. Every child (each method x each code) is created in
//    the constructor, so recording never calls Family::Add.
//  - The process: process_* metrics read from /proc at scrape time.
//
//   Metrics metrics(PREFIXD_VERSION);
//   deps.observer = &metrics;                      // before Server::Start
//   ... server = Server::Start(config, deps) ...
//   metrics.Serve(server->cache(), config.metrics_listen);
//   ...
//   metrics.StopServing();                         // before the cache goes
//
// Thread safety: ObserveRpc/OnRpcDone may be called concurrently from any
// thread; Serve and StopServing from one thread at a time.
#ifndef PREFIXD_SERVER_METRICS_H_
#define PREFIXD_SERVER_METRICS_H_

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/cache.h"
#include "index/kv_index.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "server/events_publish.h"
#include "server/service.h"

namespace prefixd {

class HttpListener;
class StatusPage;

// The RPC methods of prefixd.v1.PrefixCache and prefixd.v1.PrefixIndex, as
// the services name them.
inline constexpr std::array<absl::string_view, 17> kRpcMethods = {
    "GetInfo",     "Handshake",  "Match",      "Insert",      "Release",
    "KeepAlive",   "Evict",      "Invalidate", "Reset",       "Stats",
    "WatchEvents", "Dump",       "MatchBatch", "InsertBatch", "Route",
    "RouteBatch",  "ListWorkers"};

// Upper bounds (seconds) of prefixd_rpc_duration_seconds: 25us .. 1s.
std::vector<double> RpcDurationBuckets();

// The prefixd_* families of `stats` (all tenants) plus prefixd_build_info.
std::vector<prometheus::MetricFamily> CacheMetricFamilies(
    const CacheStats& stats, absl::string_view version);

// The prefixd_index_* families of the fleet index (docs/index.md).
std::vector<prometheus::MetricFamily> IndexMetricFamilies(
    const IndexStats& stats);

// The prefixd_events_* families of events_publish (docs/index.md, "The
// sidecar publishes too").
std::vector<prometheus::MetricFamily> EventsPublishMetricFamilies(
    const EventsPublishStats& stats);

// process_* families read from `proc_dir` (normally "/proc"): resident and
// virtual memory, CPU seconds, open and max file descriptors, start time.
// Whatever cannot be read is left out.
std::vector<prometheus::MetricFamily> ProcessMetricFamilies(
    const std::string& proc_dir = "/proc");

class Metrics final : public RpcObserver {
 public:
  explicit Metrics(std::string version);
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves /metrics on `listen` ("host:port"; port 0 picks a free one),
  // reading `cache` at every scrape. REQUIRES: `cache` outlives serving
  // (call StopServing before destroying it); not already serving.
  // UNAVAILABLE naming the address if it cannot be bound.
  // With `index` (the fleet index, may be null) its families too, and
  // likewise with `events_publisher`; both must outlive serving too. With
  // `pages`, every other path is theirs (/, /plan); it too must outlive
  // serving.
  absl::Status Serve(const PrefixCache* cache, const std::string& listen,
                     const KvIndex* index = nullptr,
                     const EventsPublisher* events_publisher = nullptr,
                     StatusPage* pages = nullptr);

  // Stops the endpoint; when it returns no scrape is running or will run.
  // Idempotent.
  void StopServing();

  // The TCP port being served; 0 when not serving.
  int port() const;

  // Records one finished RPC: its latency, and an error unless code is OK.
  // `method` must be one of kRpcMethods (others are dropped; a bug).
  void ObserveRpc(absl::string_view method, absl::StatusCode code,
                  absl::Duration elapsed);
  void OnRpcDone(absl::string_view method, absl::StatusCode code,
                 absl::Duration elapsed) override {
    ObserveRpc(method, code, elapsed);
  }

  // Everything /metrics would return, in the text format (for tests and
  // debugging); the cache part is empty unless serving.
  std::string ScrapeText() const;

 private:
  // Canonical codes 1..16 (OK excluded): the code label of errors.
  static constexpr int kNumErrorCodes = 16;
  struct MethodChildren {
    prometheus::Histogram* duration = nullptr;
    std::array<prometheus::Counter*, kNumErrorCodes> errors{};
  };

  std::shared_ptr<prometheus::Registry> registry_;
  std::array<MethodChildren, kRpcMethods.size()> rpc_;
  std::shared_ptr<prometheus::Collectable> collector_;  // set while serving
  std::unique_ptr<HttpListener> listener_;
  const std::string version_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_METRICS_H_
