// What an SGLang worker's /server_info says of its KV event sockets
// (docs/index.md, "Following SGLang workers by URL"). SGLang's HTTP server
// answers GET /server_info with a JSON object whose `kv_events` member
// describes the publisher its --kv-events-config started, the block its
// own router (sgl-model-gateway) reads to subscribe to a worker:
//
//   "kv_events": {"publisher": "zmq", "endpoint_host": "*",
//                 "endpoint_port_base": 5557, "topic": "", "block_size": 16,
//                 "dp_size": 2, "load_endpoint_port_base": 5559,
//                 "load_topic": "load"}
//
// DP rank r publishes its events on endpoint_port_base + r and, when the
// load keys are present (--load-publish-endpoint), its load on
// load_endpoint_port_base + r. endpoint_host may be a wildcard ("*",
// "0.0.0.0", "::"): the worker bound every interface, and a subscriber
// dials the host of the worker's own URL instead. block_size is the width
// of the blocks its events store: under decode context parallelism
// (--dcp-size N) page_size x N, which SGLang releases before that width
// was advertised gave only as the top-level page_size and dcp_size. The member
// is absent or null when the worker publishes no events. Other members of
// /server_info are skipped, but for page_size and dcp_size (a block_size equal
// to page_size with dcp_size N > 1 is widened to page_size x N).
//
// Thread safety: pure functions of their arguments.
#ifndef PREFIXD_INDEX_SGLANG_SERVER_INFO_H_
#define PREFIXD_INDEX_SGLANG_SERVER_INFO_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prefixd {

struct SglangEventSockets {
  std::string host;  // as dialled: the worker URL's host for a wildcard
  int port_base = 0;
  std::string topic;
  int block_size = 0;
  int dp_size = 1;
  int load_port_base = 0;  // 0: the worker publishes no load

  // tcp://host:port_base + r for each rank r (load: load_port_base + r;
  // none without load sockets).
  std::vector<std::string> EventEndpoints() const;
  std::vector<std::string> LoadEndpoints() const;
  bool operator==(const SglangEventSockets&) const = default;
};

// The sockets `body` (a /server_info answer) describes, dialled on
// `worker_host` (the worker URL's host, IPv6 in brackets) where the
// worker bound a wildcard. nullopt when its `kv_events` is absent or null.
// INVALID_ARGUMENT starting "server_info: " and naming the member for a
// body that is not a JSON object or a `kv_events` that is malformed: a
// publisher other than "zmq", a port outside 1..65535 (or a range of
// dp_size ports past it), a block_size or dp_size below 1, a load_topic
// other than "load".
absl::StatusOr<std::optional<SglangEventSockets>> ParseSglangServerInfo(
    absl::string_view body, absl::string_view worker_host);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_SGLANG_SERVER_INFO_H_
