// HttpFetches: one GET of each of a fixed list of URLs, all at once over
// libcurl, round after round on handles made once, so that a connection a
// server keeps alive serves the next round's request too. The daemon's
// HTTP reads of the engines use it: their metrics (server/engine_scraper.h)
// and SGLang's /server_info (server/sglang_discovery.h).
//
//   HttpFetches f({{"http://10.0.0.3:30000/server_info"}}, {});
//   f.Run(stopping);
//   absl::StatusOr<std::string> body = f.Take(0);
//
// Thread safety: none; one thread uses it (the reader's own).
#ifndef PREFIXD_SERVER_HTTP_FETCHES_H_
#define PREFIXD_SERVER_HTTP_FETCHES_H_

#include <curl/curl.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prefixd {

struct HttpFetchOptions {
  absl::Duration timeout = absl::Seconds(1);  // per request
  size_t max_body_bytes = size_t{4} << 20;
  std::string accept;  // the Accept header; "" leaves libcurl's
};

// One URL to read, and what its request carries beyond it.
struct HttpTarget {
  std::string url;
  // One more header line ("Authorization: Bearer KEY"); "" for none.
  std::string header;
  // The address to connect to instead of the one the URL's host resolves
  // to, as libcurl's CURLOPT_CONNECT_TO takes it ("::10.1.2.3:30000", IPv6
  // in brackets); TLS and the Host header keep the URL's name. "" for none.
  std::string connect_to;
};

class HttpFetches {
 public:
  // libcurl's global set-up, once per process (later calls return the
  // first one's outcome). INTERNAL when it fails.
  static absl::Status InitLibcurl();

  HttpFetches(const std::vector<HttpTarget>& targets, HttpFetchOptions options);
  ~HttpFetches();
  HttpFetches(const HttpFetches&) = delete;
  HttpFetches& operator=(const HttpFetches&) = delete;

  // One request for each URL i with due[i] (every URL when `due` is
  // empty), all at once, until each has finished (or timed out) or
  // `stopping` is set.
  void Run(const std::atomic<bool>& stopping,
           const std::vector<bool>& due = {});

  // URL i's body from the last Run, which frees it, or why there is none:
  // UNAVAILABLE naming libcurl's error, the timeout or an HTTP status
  // other than 200; RESOURCE_EXHAUSTED for a body over max_body_bytes.
  absl::StatusOr<std::string> Take(size_t i);

  struct Transfer;  // one URL's handle and response (http_fetches.cc)

 private:
  CURLM* const multi_;
  std::vector<Transfer> transfers_;  // never resized: libcurl holds &t
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_HTTP_FETCHES_H_
