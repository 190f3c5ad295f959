#include "server/http_listener.h"

#include <civetweb.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

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
  mg_write(conn, header.data(), header.size());
  if (!head) mg_write(conn, r.body.data(), r.body.size());
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

}  // namespace

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const std::string& listen, const HttpLimits& limits, HttpHandler handler) {
  std::unique_ptr<HttpListener> listener(new HttpListener(std::move(handler)));
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
                           "no",
                           nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  callbacks.log_message = Quiet;
  callbacks.http_error = Error;
  mg_init_data init = {&callbacks, listener.get(), options};
  char text[256] = "";
  unsigned code = 0;
  mg_error_data error = {&code, text, sizeof(text)};
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

HttpListener::~HttpListener() {
  if (ctx_ != nullptr) mg_stop(ctx_);  // joins the workers
}

int HttpListener::port() const {
  mg_server_port ports[1];
  if (mg_get_server_ports(ctx_, 1, ports) < 1) return 0;
  return ports[0].port;
}

int HttpListener::Serve(mg_connection* conn, void* self) {
  const mg_request_info* req = mg_get_request_info(conn);
  const absl::string_view method = req->request_method;
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    HttpResponse refused{405,
                         "text/plain; charset=utf-8",
                         absl::StrCat(method, " is not allowed: read-only\n"),
                         {{"Allow", "GET, HEAD"}}};
    Send(conn, refused, false);
    return refused.status;
  }
  const char* path = req->local_uri != nullptr ? req->local_uri : "/";
  std::optional<HttpResponse> response =
      static_cast<const HttpListener*>(self)->handler_(path);
  if (!response.has_value()) {
    response = HttpResponse{404,
                            "text/plain; charset=utf-8",
                            absl::StrCat("no page at ", path, "\n"),
                            {}};
  }
  Send(conn, *response, head);
  return response->status;
}

}  // namespace prefixd
