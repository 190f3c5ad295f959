// libFuzzer: raw bytes as one HTTP request to the daemon's HTTP listener
// over a real TCP connection, so that everything the daemon does with a
// request on metrics_listen sees them: civetweb's parser, then the
// dispatch of server/http/http_listener.cc (methods) and
// server/http/metrics_listener.h (/metrics and the pages), over a cache with a
// tenant and traffic. One listener serves the whole process.
//
// The input is sent as it is, then the write side is shut, so an
// incomplete request ends at once rather than at the header timeout.
// Checked for every input:
//   - the answer is empty (civetweb dropped the connection) or one HTTP/1.1
//     response with a status the listener can give: 200, 404 or 405 from
//     the daemon's dispatch, 400 from /plan.json (bad flags), a 4xx, 501 or
//     505 from civetweb's parser;
//     never another 5xx;
//   - every header line is "Name: value": no bytes of the request are
//     echoed into the status line or the headers;
//   - 405 answers name the allowed methods; answers to HEAD carry no body;
//   - the cache is unchanged: the listener is read-only.
//
//   build-fuzz/tests/fuzz/http_fuzzer tests/fuzz/corpus/http_fuzzer
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/cache.h"
#include "model/kv_geometry.h"
#include "server/http/metrics.h"
#include "server/http/metrics_listener.h"

namespace prefixd {
namespace {

[[noreturn]] void Fail(const std::string& what, absl::string_view request,
                       absl::string_view answer) {
  std::fprintf(stderr, "http_fuzzer: %s\nrequest (%zu bytes)\nanswer: %.*s\n",
               what.c_str(), request.size(),
               static_cast<int>(std::min<size_t>(answer.size(), 2000)),
               answer.data());
  std::abort();
}

struct Fixture {
  std::unique_ptr<PrefixCache> cache;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<MetricsListener> http;
  std::string state;  // Stats of the cache after the set-up traffic

  Fixture() {
    CacheOptions o;
    o.block_size = 4;
    o.block_bytes = 100;
    o.budget_bytes = 1000;
    o.seed = 1;
    cache = std::move(PrefixCache::Create(o)).value();
    std::vector<Token> tokens(8);
    std::iota(tokens.begin(), tokens.end(), 1);
    const std::vector<BlockId> ids = {11, 12};
    InsertRequest ins;
    ins.tokens = tokens;
    ins.block_ids = ids;
    if (!cache->Insert("acme", ins).ok()) std::abort();
    DaemonFacts info;
    info.version = "fuzz";
    info.epoch = 1;
    info.model.geometry = FindPreset("llama-3-8b").value().geometry;
    info.model_description = "llama-3-8b fp16";
    info.fingerprint = "0123456789abcdef";
    info.bytes_per_token = 131072;
    metrics = std::make_unique<Metrics>("fuzz");
    absl::StatusOr<std::unique_ptr<MetricsListener>> listener =
        MetricsListener::Start("127.0.0.1:0", metrics.get(),
                               {cache.get(), nullptr, nullptr, info});
    if (!listener.ok()) {
      std::fprintf(stderr, "http_fuzzer: %s\n",
                   std::string(listener.status().message()).c_str());
      std::abort();
    }
    http = *std::move(listener);
    state = State();
  }

  // What a read-only listener must leave as it is.
  std::string State() const {
    std::string out;
    for (const TenantUsage& t : cache->Stats(TenantScope::All()).tenants) {
      out += t.tenant + " " + std::to_string(t.cached_blocks) + " " +
             std::to_string(t.match_requests) + " " +
             std::to_string(t.insert_requests) + "\n";
    }
    return out;
  }
};

Fixture& TheFixture() {
  static Fixture* f = new Fixture;
  return *f;
}

// Sends `request`, shuts the write side, returns all the server sent;
// nullopt if the connection failed, or the server neither answered nor
// closed within 10 s.
std::optional<std::string> Exchange(int port, absl::string_view request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{10, 0};  // a hang is a finding: the listener's own timeout is 5 s
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  // The server closes first, so each exchange leaves a TIME_WAIT for 60 s:
  // from one source address, a fuzzer's thousands of exchanges a second
  // would run out of ports. Any 127.x.y.z is this host.
  static uint32_t exchanges = 0;
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl(0x7f000000u | (1 + exchanges++ % 0xfffe));
  bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return std::nullopt;
  }
  // The server may answer and close before it read everything: a failed
  // send is no finding.
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == ECONNRESET) break;
      close(fd);
      return std::nullopt;
    }
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

void CheckAnswer(absl::string_view request, absl::string_view answer) {
  if (answer.empty()) return;
  // The listener writes every status line itself (server/http/http_listener.cc
  // answers civetweb's errors too): "HTTP/1.1 NNN ".
  int status = 0;
  const size_t line_end = answer.find("\r\n");
  if (!absl::StartsWith(answer, "HTTP/1.1 ") ||
      line_end == absl::string_view::npos || answer.size() < 13 ||
      answer[12] != ' ' || !absl::SimpleAtoi(answer.substr(9, 3), &status)) {
    Fail("not an HTTP/1.1 status line of the listener's", request, answer);
  }
  // 200, 404 and 405 are the dispatch's, 400 /plan.json's; civetweb refuses
  // malformed requests with a 4xx (400, 408, 411, 413, 431, ...), 501 or 505.
  const bool ours =
      status == 200 || status == 400 || status == 404 || status == 405;
  const bool parser =
      (status >= 400 && status < 500) || status == 501 || status == 505;
  if (!ours && !parser) {
    Fail("status " + std::to_string(status) + " is none the listener gives",
         request, answer);
  }
  const size_t end = answer.find("\r\n\r\n");
  if (end == absl::string_view::npos)
    Fail("no end of headers", request, answer);
  const absl::string_view headers = answer.substr(0, end);
  // Every header line is "Name: value": nothing from the request made a
  // line of its own.
  for (absl::string_view line :
       absl::StrSplit(headers.substr(line_end + 2), "\r\n")) {
    const size_t colon = line.find(": ");
    if (colon == absl::string_view::npos || colon == 0 ||
        line.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstu"
                               "vwxyz0123456789-") != colon) {
      Fail("a header line that is not \"Name: value\"", request, answer);
    }
  }
  if (status == 405 && !absl::StrContains(headers, "\r\nAllow: GET, HEAD")) {
    Fail("a 405 without Allow: GET, HEAD", request, answer);
  }
  if (absl::StartsWith(request, "HEAD ") && status == 200 &&
      end + 4 != answer.size()) {
    Fail("an answer to HEAD with a body", request, answer);
  }
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  prefixd::Fixture& f = prefixd::TheFixture();
  const absl::string_view request(reinterpret_cast<const char*>(data), size);
  // At thousands of connections a second the kernel may refuse one (out of
  // ports) or drop one from a full accept queue (ListenDrops): an exchange
  // that failed is tried once more, and only a second failure is a
  // finding.
  std::optional<std::string> answer =
      prefixd::Exchange(f.http->port(), request);
  if (!answer.has_value()) answer = prefixd::Exchange(f.http->port(), request);
  if (!answer.has_value()) {
    prefixd::Fail("no connection, or no end of the answer within 10 s, twice",
                  request, "");
  }
  prefixd::CheckAnswer(request, *answer);
  if (f.State() != f.state) {
    prefixd::Fail("the cache changed:\n" + f.State(), request, *answer);
  }
  return 0;
}
