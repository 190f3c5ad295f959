// MetricsListener: the daemon's read-only HTTP listener on metrics_listen
// (docs/metrics.md), and the routes it serves:
//
//   /metrics              Prometheus text (server/http/metrics.h)
//   /                     the status page (server/http/status_page.h)
//   /plan ...             the KV calculator (server/http/plan_page.h)
//
// GET and HEAD only (server/http/http_listener.h): nothing served here can
// change state. A handler here holds no logic: it calls the page or the
// exporter that computes the answer.
//
// The HTTP side of the daemon lives in server/http/ and reads the daemon
// through HttpSources (server/http/sources.h) only. A further HTTP API
// (JSON in and out, e.g. an indexer API over the fleet index) is a class
// of its own beside this one, `server/http/<api>_listener.{h,cc}`, on an
// HttpListener of its own with HttpLimits::read_only false and a listen
// address of its own, routing each path to a handler that calls the
// KvIndex; the Daemon starts and stops it as it does this one.
//
//   auto http = MetricsListener::Start(config.metrics_listen, &metrics,
//                                      sources);
//   ... (*http)->port() ...
//   http->reset();  // no request runs after this; before the cache goes
//
// Thread safety: requests run on the listener's threads, several at once;
// what they read is thread-safe. Destruction waits for running requests.
#ifndef PREFIXD_SERVER_HTTP_METRICS_LISTENER_H_
#define PREFIXD_SERVER_HTTP_METRICS_LISTENER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/http/http_listener.h"
#include "server/http/metrics.h"
#include "server/http/plan_page.h"
#include "server/http/sources.h"
#include "server/http/status_page.h"

namespace prefixd {

class MetricsListener {
 public:
  struct Options {
    HttpLimits limits;
    // The status page's hit rate window, plots and sampling.
    StatusPage::Options status;
  };

  // Serves `sources` on `listen` ("host:port"; port 0 picks a free one).
  // INVALID_ARGUMENT for an address that is not host:port; UNAVAILABLE
  // naming the address (and the flag to change) if it cannot be bound.
  // REQUIRES: `metrics` and everything `sources` points to outlive the
  // listener.
  static absl::StatusOr<std::unique_ptr<MetricsListener>> Start(
      const std::string& listen, const Metrics* metrics, HttpSources sources,
      const Options& options);
  static absl::StatusOr<std::unique_ptr<MetricsListener>> Start(
      const std::string& listen, const Metrics* metrics, HttpSources sources) {
    return Start(listen, metrics, std::move(sources), Options());
  }
  MetricsListener(const MetricsListener&) = delete;
  MetricsListener& operator=(const MetricsListener&) = delete;

  // The bound TCP port.
  int port() const { return listener_->port(); }

 private:
  MetricsListener(const Metrics* metrics, HttpSources sources,
                  const Options& options);
  std::optional<HttpResponse> Handle(const HttpRequest& request);

  const Metrics* const metrics_;
  const HttpSources sources_;
  StatusPage status_;
  const PlanPage plan_;
  std::unique_ptr<HttpListener> listener_;  // last: stops first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_METRICS_LISTENER_H_
