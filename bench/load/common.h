// Small pieces the gRPC load generator (load.cc) and the Redis peer
// (bench/redis_peer*) share: a clock, a cheap RNG, latency percentiles, the
// result table, child processes and free ports.
#ifndef PREFIXD_BENCH_LOAD_COMMON_H_
#define PREFIXD_BENCH_LOAD_COMMON_H_

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace prefixd::bench {

// Monotonic nanoseconds.
int64_t NowNs();

// xorshift64*: cheap enough to pick a prompt per call without showing up.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed != 0 ? seed : 0x9e3779b97f4a7c15ULL) {}
  uint64_t Next() {
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return s_ * 2685821657736338717ULL;
  }
  uint64_t Below(uint64_t n) { return Next() % n; }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t s_;
};

// Prompt `index` of the fleet-index benchmarks (the route mixes of load.cc,
// prefixd_bench_server's --bench_index_*, index_bench): `tokens` token ids
// that depend only on (index, position), so that the server indexes the
// same prompts the generator asks about without being told them.
inline std::vector<uint32_t> IndexPrompt(int index, int tokens) {
  Rng rng(0x5eed0000ULL + static_cast<uint64_t>(index));
  std::vector<uint32_t> out(static_cast<size_t>(tokens));
  for (uint32_t& t : out) t = static_cast<uint32_t>(rng.Below(128256));
  return out;
}

struct LatencySummary {
  uint64_t count = 0;
  double mean_us = 0, p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0,
         max_us = 0;
};
// Sorts `ns` (latencies in nanoseconds) and reads the percentiles.
LatencySummary Summarize(std::vector<int64_t>* ns);

// One measured phase: a workload against one target for a fixed time.
struct PhaseResult {
  std::string target;
  std::string phase;        // "bare", "match", "batch", "redis-mget", ...
  int concurrency = 0;      // calls (or connections) in flight
  double offered_rate = 0;  // open loop: calls/s asked for; 0: closed loop
  double seconds = 0;       // measured window
  uint64_t calls = 0;       // RPCs or round trips completed in the window
  uint64_t lookups = 0;     // prefix lookups they did
  uint64_t errors = 0;
  uint64_t late = 0;  // open loop: calls that found no free slot
  std::string first_error;
  LatencySummary latency;
  std::string slow_calls;  // where the slow calls' time went, if known
  // CPU per call of the server process and of this client process (all
  // threads), warm-up included; 0 when not measured. Robust on a busy
  // machine, unlike the rates.
  uint64_t all_calls = 0;  // calls completed, warm-up included
  double server_cpu_us = 0;
  double client_cpu_us = 0;

  double calls_per_s() const { return seconds > 0 ? calls / seconds : 0; }
  double lookups_per_s() const { return seconds > 0 ? lookups / seconds : 0; }
};

void PrintHeader(FILE* out);
void PrintRow(FILE* out, const PhaseResult& r);
std::string ToJson(const PhaseResult& r);

double Median(std::vector<double> v);

// "a:3,b:1" -> {{"a", 3}, {"b", 1}}; a bare name weighs 1.
absl::StatusOr<std::vector<std::pair<std::string, double>>> ParseWeights(
    absl::string_view spec);

// A child process (stdout piped to us). Stop() or the destructor sends
// SIGTERM, then SIGKILL after `grace`, and reaps it.
class Subprocess {
 public:
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv);
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // The first stdout line that starts with `prefix`; DEADLINE_EXCEEDED or
  // UNAVAILABLE (the child exited) otherwise.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix,
                                          absl::Duration timeout);
  // Returns the exit status as waitpid reports it (or -1).
  int Stop(absl::Duration grace = absl::Seconds(10));
  pid_t pid() const { return pid_; }

 private:
  Subprocess(pid_t pid, int out) : pid_(pid), out_(out) {}
  pid_t pid_;
  int out_;
  std::string buffer_;
  bool stopped_ = false;
};

// CPU seconds (user + system) process `pid` has used; -1 if unreadable.
double ProcessCpuSeconds(pid_t pid);
// The same for this process (every thread).
double SelfCpuSeconds();

// Fills r->server_cpu_us and r->client_cpu_us from CPU seconds sampled
// before (0) and after (1) a phase of r->all_calls calls.
void SetCpuPerCall(double server0, double server1, double self0, double self1,
                   PhaseResult* r);

// A TCP port on 127.0.0.1 that was free a moment ago.
absl::StatusOr<int> FreeTcpPort();

}  // namespace prefixd::bench

#endif  // PREFIXD_BENCH_LOAD_COMMON_H_
