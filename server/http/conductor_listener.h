// ConductorListener: the Mooncake Conductor indexer API on its own HTTP
// listener, index.http_listen (docs/index.md, "As a Mooncake Conductor"):
//
//   POST /register  /unregister  /query  /query_by_hash
//   GET /services
//
// JSON in and out, over plain HTTP (civetweb, HttpListener) or, when the
// daemon has TLS (auth.tls_cert_path), over HTTPS with the gRPC listeners'
// certificate (libmicrohttpd, HttpsListener); both call Handle. A request is
// authorized with the daemon's principals from its `Authorization: Bearer
// <token>` header or, with auth MTLS, its verified client certificate
// (server/auth.h), then
// handed to ConductorApi (index/conductor_api.h), which holds every rule;
// this class only routes, and times each request for the metrics
// (prefixd_index_http_*). Other paths are 404, other methods 405, a body
// past the limit 400, each answered {"error": ...}.
//
// Thread safety: requests run on the listener's threads, several at once;
// the API, the authorizer and the observer are thread-safe. Destruction
// waits for running requests.
#ifndef PREFIXD_SERVER_HTTP_CONDUCTOR_LISTENER_H_
#define PREFIXD_SERVER_HTTP_CONDUCTOR_LISTENER_H_

#include <array>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "index/conductor_api.h"
#include "server/auth.h"
#include "server/http/http_listener.h"

namespace prefixd {

// The endpoint label of prefixd_index_http_* ("other": any other path).
inline constexpr std::array<absl::string_view, 6> kConductorEndpoints = {
    "register", "unregister", "query", "query_by_hash", "services", "other"};

// Sees every request the listener answers.
class ConductorObserver {
 public:
  virtual ~ConductorObserver() = default;
  virtual void OnConductorRequest(absl::string_view endpoint, int status,
                                  absl::Duration elapsed) = 0;
};

class ConductorListener {
 public:
  // Serves `api` on `listen` ("host:port"; port 0 picks a free one), with
  // TLS when auth->tls() is set. UNAVAILABLE naming the address if it cannot
  // be bound. REQUIRES: `api`, `auth` and `observer` (may be null) outlive
  // the listener.
  static absl::StatusOr<std::unique_ptr<ConductorListener>> Start(
      const std::string& listen, HttpLimits limits, const ConductorApi* api,
      const Authorizer* auth, ConductorObserver* observer);
  ConductorListener(const ConductorListener&) = delete;
  ConductorListener& operator=(const ConductorListener&) = delete;

  int port() const { return listener_->port(); }
  bool tls() const { return tls_; }

 private:
  ConductorListener(const ConductorApi* api, const Authorizer* auth,
                    ConductorObserver* observer)
      : api_(api), auth_(auth), observer_(observer) {}
  HttpResponse Handle(const HttpRequest& request) const;
  ConductorAnswer Dispatch(absl::string_view endpoint,
                           const HttpRequest& request) const;

  const ConductorApi* const api_;
  const Authorizer* const auth_;
  ConductorObserver* const observer_;
  bool tls_ = false;
  std::unique_ptr<HttpTransport> listener_;  // last: stops first
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_CONDUCTOR_LISTENER_H_
