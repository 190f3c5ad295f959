// libFuzzer: an SGLang worker's /server_info (index/sglang_server_info.h)
// is read from whatever answers at a configured worker URL, so no body may
// crash the reader or yield sockets the index cannot dial. Checked for
// every input:
//   - an error is INVALID_ARGUMENT starting "server_info: ";
//   - sockets have a block size >= 1 and one event endpoint per DP rank,
//     each a port in 1..65535, and no load endpoint or one per rank;
//   - a wildcard host is replaced by the worker's.
//
//   build-fuzz/tests/fuzz/sglang_server_info_fuzzer
//   tests/fuzz/corpus/sglang_server_info_fuzzer
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "index/sglang_server_info.h"

namespace prefixd {
namespace {

void Check(bool ok, const char* what, absl::string_view detail = "") {
  if (ok) return;
  std::fprintf(stderr, "sglang_server_info_fuzzer: %s %.*s\n", what,
               static_cast<int>(detail.size()), detail.data());
  __builtin_trap();
}

constexpr absl::string_view kWorkerHost = "10.0.0.3";

// Every endpoint is tcp://<host>:<port in 1..65535>.
void CheckEndpoints(const std::vector<std::string>& endpoints,
                    const std::string& host) {
  for (const std::string& e : endpoints) {
    const std::string prefix = "tcp://" + host + ":";
    Check(absl::StartsWith(e, prefix), "an endpoint on another host", e);
    int port = 0;
    Check(absl::SimpleAtoi(absl::string_view(e).substr(prefix.size()), &port),
          "an endpoint without a port", e);
    Check(port >= 1 && port <= 65535, "a port outside 1..65535", e);
  }
}

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using prefixd::Check;
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  const auto r = prefixd::ParseSglangServerInfo(body, prefixd::kWorkerHost);
  if (!r.ok()) {
    Check(r.status().code() == absl::StatusCode::kInvalidArgument &&
              absl::StartsWith(r.status().message(), "server_info: "),
          "unexpected error", r.status().message());
    return 0;
  }
  if (!r->has_value()) return 0;
  const prefixd::SglangEventSockets& s = **r;
  Check(s.block_size >= 1, "a block size below 1");
  Check(s.dp_size >= 1, "a DP size below 1");
  Check(!s.host.empty() && s.host != "*", "a wildcard host", s.host);
  const std::vector<std::string> events = s.EventEndpoints();
  const std::vector<std::string> loads = s.LoadEndpoints();
  Check(events.size() == static_cast<size_t>(s.dp_size),
        "not one event endpoint per rank");
  Check(loads.empty() || loads.size() == events.size(),
        "not one load endpoint per rank");
  prefixd::CheckEndpoints(events, s.host);
  prefixd::CheckEndpoints(loads, s.host);
  return 0;
}
