// The HTTP listener against peers that hold connections open: idle ones,
// one that sends a byte now and then, more of them than it has threads.
// Real sockets on loopback; every wait is a socket timeout (a deadline),
// never a sleep.
#include "server/http/http_listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A TCP connection to 127.0.0.1:port whose reads and writes give up after
// `timeout`.
class Peer {
 public:
  Peer(int port, std::chrono::milliseconds timeout)
      : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    timeval tv{};
    tv.tv_sec = timeout.count() / 1000;
    tv.tv_usec = (timeout.count() % 1000) * 1000;
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ =
        connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Peer() { close(fd_); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    return send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Everything until the server closes; nullopt if the timeout came first.
  std::optional<std::string> ReadToClose() {
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return out;
      if (n < 0) return std::nullopt;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  // Waits up to the timeout for the server to answer or close.
  bool ServerReacted() {
    char c;
    return recv(fd_, &c, 1, MSG_PEEK) >= 0;
  }
  // True while the server has neither closed nor answered the connection.
  bool StillOpen() {
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

 private:
  const int fd_;
  bool connected_ = false;
};

std::unique_ptr<HttpListener> Start(const HttpLimits& limits) {
  auto listener = HttpListener::Start(
      "127.0.0.1:0", limits,
      [](const HttpRequest& r) -> std::optional<HttpResponse> {
        return HttpResponse{200,
                            "text/plain",
                            absl::StrCat(r.method, " page ", r.path, " query ",
                                         r.query, " body ", r.body.size()),
                            {}};
      });
  EXPECT_TRUE(listener.ok()) << listener.status();
  return listener.ok() ? *std::move(listener) : nullptr;
}

std::optional<std::string> Get(int port, const std::string& path,
                               std::chrono::milliseconds timeout) {
  Peer peer(port, timeout);
  if (!peer.connected() ||
      !peer.Send(absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n\r\n"))) {
    return std::nullopt;
  }
  return peer.ReadToClose();
}

// Connections that send nothing hold a thread each, but there are threads
// for more of them than a few: a scrape is answered at once, while they
// are still open (with two threads, two idle peers stopped every page for
// civetweb's 30 s).
TEST(HttpListenerTest, IdleConnectionsDoNotStopOtherRequests) {
  auto listener = Start(HttpLimits{});
  ASSERT_NE(listener, nullptr);
  std::vector<std::unique_ptr<Peer>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(
        std::make_unique<Peer>(listener->port(), std::chrono::seconds(1)));
    ASSERT_TRUE(idle.back()->connected());
  }
  const std::optional<std::string> page =
      Get(listener->port(), "/metrics", std::chrono::seconds(3));
  ASSERT_TRUE(page.has_value()) << "no answer within 3 s";
  EXPECT_THAT(*page, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(*page, HasSubstr("page /metrics"));
  for (const auto& peer : idle) EXPECT_TRUE(peer->StillOpen());
}

// A peer that sends nothing, or a byte at a time, must finish its request
// header within io_timeout: then its connection is closed and its thread
// is free.
TEST(HttpListenerTest, APeerHasIoTimeoutToSendItsRequest) {
  HttpLimits limits;
  limits.io_timeout = absl::Seconds(1);
  auto listener = Start(limits);
  ASSERT_NE(listener, nullptr);

  Peer silent(listener->port(), std::chrono::seconds(4));
  ASSERT_TRUE(silent.connected());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(silent.ReadToClose(), "") << "still open after 4 s";
  EXPECT_GE(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(500));

  // One byte of a long header, then another whenever the server has said
  // nothing for 100 ms: the timeout counts from the first byte, not from
  // the last one.
  Peer slow(listener->port(), std::chrono::milliseconds(100));
  ASSERT_TRUE(slow.connected());
  const auto slow_start = std::chrono::steady_clock::now();
  const auto give_up = slow_start + std::chrono::seconds(6);
  bool reacted = false;
  ASSERT_TRUE(slow.Send("GET / HTTP/1.1\r\n"));
  while (!reacted && std::chrono::steady_clock::now() < give_up) {
    reacted = !slow.Send("x") || slow.ServerReacted();
  }
  ASSERT_TRUE(reacted) << "a byte every 100 ms kept it open for 6 s";
  EXPECT_LT(std::chrono::steady_clock::now() - slow_start,
            std::chrono::seconds(4));
}

// A malformed request gets an error whose status line and headers are the
// listener's own: civetweb's echoed the request line's protocol text, CR
// LF included, so a request could add headers to its answer.
TEST(HttpListenerTest, ErrorsNeverEchoTheRequest) {
  auto listener = Start(HttpLimits{});
  ASSERT_NE(listener, nullptr);
  Peer peer(listener->port(), std::chrono::seconds(5));
  ASSERT_TRUE(peer.Send("GET / HTTP/1.1 X\r\nSet-Cookie: injected=1\r\n\r\n"));
  const std::optional<std::string> answer = peer.ReadToClose();
  ASSERT_TRUE(answer.has_value());
  EXPECT_THAT(*answer, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(*answer, Not(HasSubstr("injected")));
  EXPECT_THAT(*answer, HasSubstr("\r\nConnection: close\r\n"));
}

// The handler sees the method, the decoded path and the query as sent.
TEST(HttpListenerTest, TheHandlerSeesPathAndQuery) {
  auto listener = Start(HttpLimits{});
  ASSERT_NE(listener, nullptr);
  const std::optional<std::string> page =
      Get(listener->port(), "/a%20b?x=1&y=%2F", std::chrono::seconds(3));
  ASSERT_TRUE(page.has_value());
  EXPECT_THAT(*page, HasSubstr("GET page /a b query x=1&y=%2F body 0"));
}

// An API listener (not read-only) takes any method and reads the body, up
// to max_body_bytes; past it, 413 and the handler never runs.
TEST(HttpListenerTest, AnApiListenerReadsBodiesUpToItsLimit) {
  HttpLimits limits;
  limits.read_only = false;
  limits.max_body_bytes = 10;
  auto listener = Start(limits);
  ASSERT_NE(listener, nullptr);
  auto post = [&](const std::string& body) {
    Peer peer(listener->port(), std::chrono::seconds(3));
    EXPECT_TRUE(
        peer.Send(absl::StrCat("POST /api HTTP/1.1\r\nHost: x\r\n"
                               "Content-Length: ",
                               body.size(), "\r\n\r\n", body)));
    return peer.ReadToClose().value_or("");
  };
  EXPECT_THAT(post("0123456789"), HasSubstr("POST page /api query  body 10"));
  const std::string over = post("0123456789x");
  EXPECT_THAT(over, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(over, HasSubstr("over 10 bytes"));
  EXPECT_THAT(over, Not(HasSubstr("page")));
}

// With keep_alive, one connection carries request after request (two
// answers arrive on it, each whole in one read's worth of waiting); a body
// past the limit still ends the connection after its 413.
TEST(HttpListenerTest, AKeptAliveConnectionCarriesSeveralRequests) {
  HttpLimits limits;
  limits.read_only = false;
  limits.keep_alive = true;
  limits.max_body_bytes = 10;
  auto listener = Start(limits);
  ASSERT_NE(listener, nullptr);
  const auto request = [](const std::string& body) {
    return absl::StrCat("POST /api HTTP/1.1\r\nHost: x\r\nContent-Length: ",
                        body.size(), "\r\n\r\n", body);
  };
  Peer peer(listener->port(), std::chrono::seconds(3));
  ASSERT_TRUE(
      peer.Send(request("one") + request("two") + request("0123456789x")));
  const std::string all = peer.ReadToClose().value_or("");
  EXPECT_THAT(all, HasSubstr("POST page /api query  body 3"));
  const size_t first = all.find("HTTP/1.1 200");
  ASSERT_NE(first, std::string::npos);
  const size_t second = all.find("HTTP/1.1 200", first + 1);
  ASSERT_NE(second, std::string::npos);
  EXPECT_NE(all.find("HTTP/1.1 413", second), std::string::npos) << all;
}

// A read-only listener refuses every other method with 405.
TEST(HttpListenerTest, AReadOnlyListenerTakesGetAndHeadOnly) {
  auto listener = Start(HttpLimits{});
  ASSERT_NE(listener, nullptr);
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH"}) {
    Peer peer(listener->port(), std::chrono::seconds(3));
    ASSERT_TRUE(peer.Send(absl::StrCat(
        method, " / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")));
    const std::string answer = peer.ReadToClose().value_or("");
    EXPECT_THAT(answer, StartsWith("HTTP/1.1 405")) << method;
    EXPECT_THAT(answer, HasSubstr("Allow: GET, HEAD")) << method;
    EXPECT_THAT(answer, Not(HasSubstr("page"))) << method;
  }
}

TEST(ParseQueryTest, DecodesFormEncoding) {
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> q =
      ParseQuery(
          "model=llama-3-70b&weights=140+GB&gpus=4x%48100&flag&=v&a=1&a=2");
  ASSERT_TRUE(q.ok()) << q.status();
  const std::vector<std::pair<std::string, std::string>> want = {
      {"model", "llama-3-70b"},
      {"weights", "140 GB"},
      {"gpus", "4xH100"},
      {"flag", ""},
      {"", "v"},
      {"a", "1"},
      {"a", "2"}};
  EXPECT_EQ(*q, want);
  EXPECT_TRUE(ParseQuery("").ok());
  EXPECT_TRUE(ParseQuery("").value().empty());
}

TEST(ParseQueryTest, ABadEscapeNamesTheParameter) {
  for (const char* bad : {"x=%4", "x=%zz", "x%=1", "x=%"}) {
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> q =
        ParseQuery(bad);
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(std::string(ParseQuery("ok=1&weights=%4g").status().message()),
              HasSubstr("\"weights\""));
}

}  // namespace
}  // namespace prefixd
