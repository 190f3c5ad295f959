// SGLang's load messages (docs/index.md, "Load pushed by SGLang"): with
// --load-publish-endpoint, each scheduler publishes its load on a ZeroMQ
// PUB socket of its own (port base + DP rank, the base advertised in
// /server_info) as frames [b"load", seq as 8-byte big-endian, payload],
// the payload msgpack of
//
//   ["LoadStat", num_running_reqs, num_waiting_reqs, num_tokens,
//    max_total_num_tokens, attn_dp_rank]
//
// (msgspec's array form: every field written, attn_dp_rank nil or an
// int; num_tokens are the KV tokens in use, max_total_num_tokens the KV
// capacity, 0 when unknown). A changed reading goes out at once, an
// unchanged one at least every second. DecodeLoadStat reads one payload
// into the EngineLoad that Pick charges (index/engine_metrics.h): running
// and waiting as they are, KV usage num_tokens / max_total_num_tokens
// clamped to [0, 1] (0 when the capacity is unknown).
#ifndef PREFIXD_INDEX_LOAD_STAT_H_
#define PREFIXD_INDEX_LOAD_STAT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "index/engine_metrics.h"

namespace prefixd {

// The topic frame of SGLang's load messages.
inline constexpr absl::string_view kLoadTopic = "load";

// INVALID_ARGUMENT naming the element for a payload that is not such an
// array (elements past attn_dp_rank are skipped).
absl::StatusOr<EngineLoad> DecodeLoadStat(absl::string_view payload);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_LOAD_STAT_H_
