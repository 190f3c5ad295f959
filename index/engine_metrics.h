// An engine's load as its own Prometheus endpoint reports it (docs/index.md,
// "Load from the engines' metrics"), for Pick. ReadEngineMetrics reads the
// text exposition format (version 0.0.4, and OpenMetrics text, whose
// differences are in lines it skips) and keeps the gauges of the engines
// the index follows:
//
//   requests running  vllm:num_requests_running  sglang:num_running_reqs
//   requests waiting  vllm:num_requests_waiting  sglang:num_queue_reqs
//   KV-cache usage    vllm:kv_cache_usage_perc   sglang:token_usage
//                     (vllm:gpu_cache_usage_perc, its older name, when
//                     the newer is absent)
//
// Only the lines of those names are parsed; every other line (comments,
// histograms, other engines' names) is skipped unread. A series counts
// when it carries every label pair of `match` (a vLLM serving several DP
// ranks labels each `engine="<rank>"`); the running and waiting requests
// of the series that count are summed, and the KV-cache usage is the
// highest of them, clamped to [0, 1].
//
// Why a reader of our own: Debian packages no C++ library that parses the
// format (prometheus-cpp, which serves the daemon's own /metrics, writes
// it only).
#ifndef PREFIXD_INDEX_ENGINE_METRICS_H_
#define PREFIXD_INDEX_ENGINE_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace prefixd {

struct EngineLoad {
  int64_t running = 0;
  int64_t waiting = 0;
  double kv_usage = 0;  // 0..1; 0 when the engine publishes no usage gauge
};

struct LabelPair {
  std::string name;
  std::string value;
};

// INVALID_ARGUMENT naming the line (1-based) for a line of a known gauge
// that does not parse or whose value is negative or not finite; NOT_FOUND
// when no series of a running or waiting gauge counts.
absl::StatusOr<EngineLoad> ReadEngineMetrics(absl::string_view text,
                                             absl::Span<const LabelPair> match);

// Whether `name` may be a label name: [a-zA-Z_][a-zA-Z0-9_]*.
bool IsLabelName(absl::string_view name);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_ENGINE_METRICS_H_
