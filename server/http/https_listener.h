// HttpsListener: an API listener (HttpLimits::read_only false) over HTTPS,
// on libmicrohttpd with GnuTLS. Debian's civetweb cannot serve TLS here (it
// loads OpenSSL 3 through the 1.1 API and its worker crashes on the first
// handshake), so the Conductor API's HTTPS goes through this transport and
// its plain HTTP through HttpListener; both hand each request to the same
// HttpHandler.
//
//   auto listener = HttpsListener::Start(address, limits, tls,
//       [](const HttpRequest& r) -> std::optional<HttpResponse> {...});
//
// TLS 1.2 and 1.3. The certificate, key and client CA are RotatingTls's
// material, the gRPC listeners' own (auth.tls_*), read for each new
// connection: after a SIGHUP new connections are shown the new certificate,
// open ones keep theirs. With a client CA (auth MTLS) the handshake requires a
// client certificate that verifies against it, and each request carries the
// certificate's subject as gRPC prints it (HttpRequest::client_cert); a
// handshake without one fails before any request is read.
//
// Bounds (HttpLimits, docs/operations.md "Memory bounds"): `threads` threads
// serve at most `threads + queue` connections, by epoll; further ones wait in
// the kernel's listen backlog (`backlog`). A connection silent for
// `io_timeout` (in its handshake, within a request, between kept-alive
// requests, or not reading its answer) is closed, rounded up to whole
// seconds. A request line and headers must fit in libmicrohttpd's 32 KiB of
// memory per connection (431 past it). A body over max_body_bytes is read
// to its end and discarded, then answered by body_too_large (so that a
// client still sending sees the answer; the connection, read in full, stays
// usable); one over twice that is cut off by closing the connection.
//
// Thread safety: the handler runs on the listener's threads, several at
// once; it must be thread-safe. Destroying the listener waits for running
// requests and serves no more.
#ifndef PREFIXD_SERVER_HTTP_HTTPS_LISTENER_H_
#define PREFIXD_SERVER_HTTP_HTTPS_LISTENER_H_

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "server/http/http_listener.h"
#include "server/listen_address.h"
#include "server/tls.h"

struct MHD_Connection;
struct MHD_Daemon;

namespace prefixd {

// One certificate set in GnuTLS's form (https_listener.cc).
struct TlsIdentity;

class HttpsListener final : public HttpTransport {
 public:
  // Serves `address` (TCP; port 0 picks a free one) with `tls`'s material.
  // INVALID_ARGUMENT when GnuTLS cannot use the material, UNAVAILABLE
  // naming the address when it cannot be bound. REQUIRES: `tls` outlives
  // the listener; !limits.read_only.
  static absl::StatusOr<std::unique_ptr<HttpsListener>> Start(
      const ListenAddress& address, const HttpLimits& limits,
      const RotatingTls* tls, HttpHandler handler);
  ~HttpsListener() override;
  HttpsListener(const HttpsListener&) = delete;
  HttpsListener& operator=(const HttpsListener&) = delete;

  int port() const override;

 private:
  HttpsListener(const HttpLimits& limits, const RotatingTls* tls,
                HttpHandler handler);
  // The identity for a new connection: rebuilt when the material changed
  // (a SIGHUP); the one in force if the new material does not load.
  std::shared_ptr<const TlsIdentity> Current();

  // body_too_large's answer, or 413 in plain text.
  HttpResponse TooLarge(const HttpRequest& request) const;
  // Queues the answer (404 for nullopt); false if libmicrohttpd refused it
  // (it then closes the connection).
  bool Answer(MHD_Connection* connection,
              const std::optional<HttpResponse>& response) const;

  // libmicrohttpd's callbacks (https_listener.cc), on the listener.
  friend struct HttpsCallbacks;

  const HttpLimits limits_;
  const RotatingTls* const tls_;
  const HttpHandler handler_;
  Mutex mu_;
  std::shared_ptr<const TlsIdentity> current_ ABSL_GUARDED_BY(mu_);
  // The material that last failed to load: not tried again, logged once.
  std::shared_ptr<const TlsMaterial> refused_ ABSL_GUARDED_BY(mu_);
  MHD_Daemon* daemon_ = nullptr;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_HTTPS_LISTENER_H_
