// The Mooncake request traces (tests/data/mooncake) as the benchmarks read
// them: every request's hash ids, one id per 512-token block. Ids are
// prefix-chained (the same id means the same whole prefix), so a request's
// ids are a path in one prefix tree over the whole file.
#ifndef PREFIXD_BENCH_TRACE_H_
#define PREFIXD_BENCH_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"

// Which traces a benchmark replays (shared by trace_replay and belady):
// --trace_dir, and --traces (names of <trace_dir>/<name>_trace.jsonl, or
// paths ending in .jsonl).
ABSL_DECLARE_FLAG(std::string, trace_dir);
ABSL_DECLARE_FLAG(std::vector<std::string>, traces);

namespace prefixd {
namespace bench {

struct Request {
  size_t first = 0;  // index into Trace::ids
  size_t blocks = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;  // 0 when the line has none
  uint64_t timestamp_ms = 0;   // arrival; 0 when the line has none
};

struct Trace {
  std::string name;
  std::vector<uint64_t> ids;  // every request's hash ids, back to back
  std::vector<Request> requests;
  uint64_t max_id = 0;
  uint64_t input_tokens = 0;
};

// Reads <dir>/<name>_trace.jsonl, or `name_or_path` itself when it ends in
// .jsonl. Only "hash_ids", "input_length" and, when present, "output_length"
// and "timestamp" (milliseconds; a fraction is dropped) are read; an error
// names the file and line.
absl::StatusOr<Trace> LoadTrace(const std::string& name_or_path,
                                const std::string& dir);

// Capacities in blocks as the benchmarks' --capacities flags spell them: a
// positive number, or "infinite" (also "inf") for kInfinite.
inline constexpr uint64_t kInfinite = uint64_t{1} << 62;
absl::StatusOr<uint64_t> ParseCapacity(const std::string& s);

// Makes --help list the flags of every bench/ file (absl's default lists
// only those of the file named like the program, which would leave out the
// trace flags above). Call before absl::ParseCommandLine.
void ListBenchFlagsInHelp();
std::string CapacityName(uint64_t capacity);

}  // namespace bench
}  // namespace prefixd

#endif  // PREFIXD_BENCH_TRACE_H_
