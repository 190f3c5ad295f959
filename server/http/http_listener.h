// An HTTP listener: a civetweb server that hands every request to one
// handler function. The daemon runs two kinds (server/http/):
//
//  - read-only (the default, HttpLimits::read_only): GET and HEAD only,
//    every other method refused with 405, so that nothing served can change
//    state. metrics_listen is one: /metrics and the pages
//    (server/http/metrics_listener.h).
//  - an API listener (read_only false): any method, and a request body of
//    at most HttpLimits::max_body_bytes (413 past it), for JSON in and out
//    on a listen address of its own.
//
// prometheus-cpp's Exposer serves /metrics only and owns its civetweb
// server privately, so the daemon runs civetweb itself and serializes the
// metrics with prometheus-cpp's TextSerializer.
//
//   auto listener = HttpListener::Start("127.0.0.1:9464", HttpLimits{},
//       [](const HttpRequest& r) -> std::optional<HttpResponse> {...});
//
// civetweb gives each connection a thread of its own from its first byte
// to its answer's last, so what a peer can hold is bounded by HttpLimits:
// a connection that sends nothing (or a byte now and then, or stops
// reading the answer) keeps its thread at most `io_timeout`, every
// connection carries one request (no keep-alive, so no idle time between
// requests) unless HttpLimits::keep_alive (an API listener whose callers
// are a few routers: then a connection idle between requests keeps its
// thread at most `io_timeout` too), and connections past `threads` wait in
// a bounded queue, then in the kernel's backlog.
//
// Thread safety: the handler runs on civetweb's worker threads, several at
// once; it must be thread-safe. Destroying the listener waits for running
// requests and serves no more.
#ifndef PREFIXD_SERVER_HTTP_HTTP_LISTENER_H_
#define PREFIXD_SERVER_HTTP_HTTP_LISTENER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/tls.h"

struct mg_context;
struct mg_connection;

namespace prefixd {

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
};

struct HttpRequest;

// What one listener holds at most (docs/operations.md, "Memory bounds").
struct HttpLimits {
  // Connections served at once, one thread each.
  int threads = 32;
  // Accepted connections waiting for a thread; past them new connections
  // wait in the kernel's listen backlog, and past that they are refused.
  int queue = 32;
  int backlog = 64;
  // The whole request header must arrive within this, and no write of the
  // answer may stall for longer; then the connection is closed.
  absl::Duration io_timeout = absl::Seconds(5);
  // GET and HEAD only (405 for the rest). An API listener sets it false.
  bool read_only = true;
  // HTTP/1.1 keep-alive: a connection may carry further requests, each
  // within `io_timeout` of the last answer. A refused body (413) still
  // closes it.
  bool keep_alive = false;
  // The largest request body read (413 past it); read-only listeners read
  // none.
  size_t max_body_bytes = 64 << 10;
  // The answer to a body past max_body_bytes (its argument), given the
  // request as far as it was read (its headers); null: 413 in plain text.
  // An API answers in its own format.
  std::function<HttpResponse(size_t max_body_bytes, const HttpRequest& request)>
      body_too_large;
};

struct HttpRequest {
  std::string method;              // "GET", "HEAD", "POST", ...
  std::string path;                // URL-decoded, without the query
  std::string query;               // as sent, after '?'; "" without one
  std::string body;                // empty on a read-only listener
  std::string authorization = "";  // the Authorization header; "" if none
  std::string content_type = "";   // the Content-Type header; "" if none
  // The client certificate the TLS handshake verified against the client
  // CA (HttpsListener with one); nullopt on plain HTTP and without.
  std::optional<PeerCertificate> client_cert = std::nullopt;
};

// Returns the response to `request`, or nullopt for 404.
using HttpHandler =
    std::function<std::optional<HttpResponse>(const HttpRequest& request)>;

// The parameters of a query string ("a=1&b=x%20y"), decoded as HTML forms
// send them ('+' is a space, %XX a byte), in order, repeats kept; a
// parameter without '=' has an empty value. INVALID_ARGUMENT naming the
// parameter for a '%' not followed by two hex digits.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseQuery(
    absl::string_view query);

// What an API listener serves through: civetweb for plain HTTP
// (HttpListener) or libmicrohttpd for HTTPS (server/http/https_listener.h).
// Both hand each request, read and bounded, to one HttpHandler, so the API
// is written once. Destroying it waits for running requests.
class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // The bound TCP port.
  virtual int port() const = 0;
};

class HttpListener final : public HttpTransport {
 public:
  // `listen` is civetweb's listening_ports syntax: "PORT" (every interface)
  // or "HOST:PORT" with a numeric host; port 0 picks a free one.
  // UNAVAILABLE with civetweb's reason when it cannot be served.
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(
      const std::string& listen, const HttpLimits& limits, HttpHandler handler);
  ~HttpListener() override;
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  int port() const override;

 private:
  HttpListener(const HttpLimits& limits, HttpHandler handler)
      : limits_(limits), handler_(std::move(handler)) {}
  static int Serve(mg_connection* conn, void* self);
  std::optional<HttpResponse> Refuse(mg_connection* conn,
                                     HttpRequest& req) const;

  const HttpLimits limits_;
  const HttpHandler handler_;
  mg_context* ctx_ = nullptr;
  std::string wake_host_;  // where the destructor knocks (see there)
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_HTTP_LISTENER_H_
