#include "server/http/http_listener.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace prefixd {
namespace {

// The address a connection to the listener can reach it at: the listen
// string's numeric host ("HOST:PORT", "[V6]:PORT"), loopback for a
// wildcard or a bare port.
std::string WakeHost(const std::string& listen) {
  std::string host;
  if (!listen.empty() && listen[0] == '[') {
    host = listen.substr(1, listen.find(']') - 1);
  } else if (const size_t colon = listen.rfind(':');
             colon != std::string::npos) {
    host = listen.substr(0, colon);
  }
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

// Opens and drops a connection to host:port without waiting for it: enough
// for the listening socket to turn readable.
void Knock(const std::string& host, int port) {
  sockaddr_storage addr;
  std::memset(&addr, 0, sizeof(addr));
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  socklen_t len = 0;
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    return;
  }
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  (void)connect(fd, reinterpret_cast<const sockaddr*>(&addr), len);
  close(fd);
}

// civetweb prints errors (a client that hung up, say) to stderr unless told
// otherwise; the daemon's stderr is its log and those are not its business.
int Quiet(const mg_connection*, const char*) { return 1; }

void Send(mg_connection* conn, const HttpResponse& r, bool head) {
  std::string header = absl::StrCat(
      "HTTP/1.1 ", r.status, " ", mg_get_response_code_text(conn, r.status),
      "\r\nContent-Type: ", r.content_type,
      "\r\nContent-Length: ", r.body.size(),
      "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n");
  for (const auto& [name, value] : r.headers) {
    absl::StrAppend(&header, name, ": ", value, "\r\n");
  }
  header += "\r\n";
  // One write: a header and a body sent apart would wait on the peer's
  // delayed ACK (Nagle) on a kept-alive connection.
  if (!head) header += r.body;
  mg_write(conn, header.data(), header.size());
}

// civetweb's own error answers (400, 413, 431, 505, ...) begin with
// "HTTP/" and the protocol text of the request line as sent, CR LF
// included: "GET / HTTP/1.1 X\r\nSet-Cookie: a=b\r\n\r\n" got a Set-Cookie
// header back. Every error is answered here instead, with a status line
// and headers of the listener's own.
int Error(mg_connection* conn, int status, const char* /*message*/) {
  const char* text = mg_get_response_code_text(conn, status);
  Send(conn,
       HttpResponse{status,
                    "text/plain; charset=utf-8",
                    absl::StrCat(status, " ", text, "\n"),
                    {{"Connection", "close"}}},
       /*head=*/false);
  return 0;  // answered
}

int Nibble(char hex) {
  return absl::ascii_isdigit(hex) ? hex - '0'
                                  : absl::ascii_tolower(hex) - 'a' + 10;
}

// '+' as a space and %XX as a byte; an error for a bad escape.
absl::StatusOr<std::string> FormDecode(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] != '%') {
      out += text[i];
    } else if (i + 2 < text.size() && absl::ascii_isxdigit(text[i + 1]) &&
               absl::ascii_isxdigit(text[i + 2])) {
      out += static_cast<char>(Nibble(text[i + 1]) * 16 + Nibble(text[i + 2]));
      i += 2;
    } else {
      return absl::InvalidArgumentError("bad escape");
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const std::string& listen, const HttpLimits& limits, HttpHandler handler) {
  std::unique_ptr<HttpListener> listener(
      new HttpListener(limits, std::move(handler)));
  const std::string threads = absl::StrCat(limits.threads);
  const std::string queue = absl::StrCat(limits.queue);
  const std::string backlog = absl::StrCat(limits.backlog);
  const std::string timeout_ms =
      absl::StrCat(absl::ToInt64Milliseconds(limits.io_timeout));
  // civetweb's request_timeout_ms bounds reading the whole request header
  // and every stalled write; without keep-alive a connection ends with its
  // answer.
  const char* options[] = {"listening_ports",
                           listen.c_str(),
                           "num_threads",
                           threads.c_str(),
                           "connection_queue",
                           queue.c_str(),
                           "listen_backlog",
                           backlog.c_str(),
                           "request_timeout_ms",
                           timeout_ms.c_str(),
                           "enable_keep_alive",
                           limits.keep_alive ? "yes" : "no",
                           "keep_alive_timeout_ms",
                           timeout_ms.c_str(),
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = Quiet;
  callbacks.http_error = Error;
  mg_init_data init = {&callbacks, listener.get(), options};
  char text[256] = "";
  unsigned code = 0;
  mg_error_data error = {&code, text, sizeof(text)};
  listener->wake_host_ = WakeHost(listen);
  listener->ctx_ = mg_start2(&init, &error);
  if (listener->ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on \"", listen, "\": ", text));
  }
  // "/" is a prefix of every path: one handler sees all requests.
  mg_set_request_handler(listener->ctx_, "/", &HttpListener::Serve,
                         listener.get());
  return listener;
}

// mg_stop joins the workers, but civetweb's master thread notices it only
// when its poll of the listening socket returns, which without a client
// takes up to its 2 s quantum: so the stop runs aside while connections to
// the port wake the poll, and the daemon stops in milliseconds.
HttpListener::~HttpListener() {
  if (ctx_ == nullptr) return;
  const int port = this->port();
  std::atomic<bool> stopped{false};
  std::thread stop([&] {
    mg_stop(ctx_);
    stopped.store(true);
  });
  while (!stopped.load() && port > 0) {
    Knock(wake_host_, port);
    absl::SleepFor(absl::Milliseconds(5));
  }
  stop.join();
}

int HttpListener::port() const {
  mg_server_port ports[1];
  if (mg_get_server_ports(ctx_, 1, ports) < 1) return 0;
  return ports[0].port;
}

int HttpListener::Serve(mg_connection* conn, void* self) {
  const auto* listener = static_cast<const HttpListener*>(self);
  const mg_request_info* info = mg_get_request_info(conn);
  HttpRequest req;
  req.method = info->request_method;
  req.path = info->local_uri != nullptr ? info->local_uri : "/";
  if (info->query_string != nullptr) req.query = info->query_string;
  if (const char* a = mg_get_header(conn, "Authorization"); a != nullptr)
    req.authorization = a;
  if (const char* t = mg_get_header(conn, "Content-Type"); t != nullptr)
    req.content_type = t;
  const bool head = req.method == "HEAD";
  std::optional<HttpResponse> refused = listener->Refuse(conn, req);
  if (refused.has_value()) {
    mg_disable_connection_keep_alive(conn);  // its body may be half read
    Send(conn, *refused, head);
    return refused->status;
  }
  std::optional<HttpResponse> response = listener->handler_(req);
  if (!response.has_value()) {
    response = HttpResponse{404,
                            "text/plain; charset=utf-8",
                            absl::StrCat("no page at ", req.path, "\n"),
                            {}};
  }
  Send(conn, *response, head);
  return response->status;
}

// 405 for a method a read-only listener does not take; 413 for a body past
// the limit, which is read into `req` otherwise.
std::optional<HttpResponse> HttpListener::Refuse(mg_connection* conn,
                                                 HttpRequest& req) const {
  if (limits_.read_only) {
    if (req.method == "GET" || req.method == "HEAD") return std::nullopt;
    return HttpResponse{
        405,
        "text/plain; charset=utf-8",
        absl::StrCat(req.method, " is not allowed: read-only\n"),
        {{"Allow", "GET, HEAD"}}};
  }
  char buf[4096];
  for (int n; (n = mg_read(conn, buf, sizeof(buf))) > 0;) {
    if (req.body.size() + static_cast<size_t>(n) > limits_.max_body_bytes) {
      if (limits_.body_too_large) {
        HttpResponse r = limits_.body_too_large(limits_.max_body_bytes, req);
        r.headers.emplace_back("Connection", "close");
        return r;
      }
      return HttpResponse{
          413,
          "text/plain; charset=utf-8",
          absl::StrCat("the body is over ", limits_.max_body_bytes, " bytes\n"),
          {{"Connection", "close"}}};
    }
    req.body.append(buf, static_cast<size_t>(n));
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseQuery(
    absl::string_view query) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view part : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(part, absl::MaxSplits('=', 1));
    absl::StatusOr<std::string> name = FormDecode(kv.first);
    absl::StatusOr<std::string> value = FormDecode(kv.second);
    if (!name.ok() || !value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter \"", kv.first,
                       "\": a '%' must be followed by two hex digits"));
    }
    out.emplace_back(*std::move(name), *std::move(value));
  }
  return out;
}

}  // namespace prefixd
