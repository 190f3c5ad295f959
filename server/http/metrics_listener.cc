#include "server/http/metrics_listener.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/http/html.h"
#include "server/listen_address.h"

namespace prefixd {
namespace {

// "host:port" as civetweb's listening_ports wants it: a bare port for every
// interface, a numeric host (civetweb does not resolve names).
absl::StatusOr<std::string> CivetListenPort(const ListenAddress& a,
                                            const std::string& listen) {
  if (a.kind != ListenAddress::Kind::kTcp) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen \"", listen, "\" must be host:port"));
  }
  if (a.host.empty()) return absl::StrCat(a.port);
  const std::string host = a.host == "localhost" ? "127.0.0.1" : a.host;
  return absl::StrCat(host, ":", a.port);
}

}  // namespace

MetricsListener::MetricsListener(const Metrics* metrics, HttpSources sources,
                                 const Options& options)
    : metrics_(metrics),
      sources_(std::move(sources)),
      status_(sources_, options.status),
      plan_(sources_.facts) {}

absl::StatusOr<std::unique_ptr<MetricsListener>> MetricsListener::Start(
    const std::string& listen, const Metrics* metrics, HttpSources sources,
    const Options& options) {
  ASSIGN_OR_RETURN(ListenAddress address, ParseListenAddress(listen));
  ASSIGN_OR_RETURN(std::string port, CivetListenPort(address, listen));
  RETURN_IF_ERROR(ProbeTcpListen(
      address, "--metrics_listen or metrics_listen in the config"));
  std::unique_ptr<MetricsListener> self(
      new MetricsListener(metrics, std::move(sources), options));
  absl::StatusOr<std::unique_ptr<HttpListener>> listener = HttpListener::Start(
      port, options.limits,
      [s = self.get()](const HttpRequest& r) { return s->Handle(r); });
  if (!listener.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on \"", listen,
                     "\": ", listener.status().message()));
  }
  self->listener_ = *std::move(listener);
  return self;
}

std::optional<HttpResponse> MetricsListener::Handle(
    const HttpRequest& request) {
  if (request.path == "/metrics") {
    return HttpResponse{200,
                        "text/plain; version=0.0.4; charset=utf-8",
                        metrics_->ScrapeText(&sources_),
                        {}};
  }
  if (request.path == "/") return HtmlResponse(status_.StatusHtml(absl::Now()));
  return plan_.Handle(request);
}

}  // namespace prefixd
