// The Redis peer (docs/performance.md): prefix lookups the way
// llm-d's KV-cache indexer does them, against a real redis-server.
//
// Every block of a prompt is a key: a hash chained over the parent's key and
// the block's tokens (so a key names a whole prefix, as vLLM's block hashes
// do), "<model>@<16 hex digits>". A lookup sends the keys of a request's
// blocks in one round trip and counts the leading keys present:
//   kLlmd      llm-d's RedisIndex.Lookup: one pipeline of HKEYS per key
//              (the keys are hashes of pod entries, written with HSET);
//   kMget      one MGET of the keys' string twins ("s:" + key);
//   and either of them pipelined `depth` lookups per round trip.
// RedisDriver keeps `connections` round trips in flight from one epoll
// loop per thread (hiredis for the protocol) and checks every lookup's
// answer against the expected prefix length.
#ifndef PREFIXD_BENCH_REDIS_PEER_H_
#define PREFIXD_BENCH_REDIS_PEER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/load/common.h"

namespace prefixd::bench {

// Reads the "hash_ids" arrays of a Mooncake trace (one request per line).
absl::StatusOr<std::vector<std::vector<uint64_t>>> ReadHashIds(
    const std::string& path);

// The chained keys of one request's blocks: key[i] covers blocks 0..i.
// `cache` maps hash id -> key (every id has one parent in these traces).
std::vector<std::string> ChainedKeys(const std::vector<uint64_t>& hash_ids,
                                     int block_size,
                                     std::vector<std::string>* cache);

enum class RedisLookup { kLlmd, kMget };

// A redis-server child on a free port, without persistence.
class RedisServer {
 public:
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(
      const std::string& binary);
  int port() const { return port_; }
  pid_t pid() const { return process_->pid(); }
  // Pipelined writes of the index: for each key, HSET key pod ts and
  // SET s:key pod.
  absl::Status Populate(const std::vector<std::string>& keys);
  // Used memory as INFO memory reports it.
  absl::StatusOr<uint64_t> UsedMemory();
  ~RedisServer();

 private:
  RedisServer(std::unique_ptr<Subprocess> process, int port)
      : process_(std::move(process)), port_(port) {}
  std::unique_ptr<Subprocess> process_;
  int port_;
};

struct RedisDriveOptions {
  RedisLookup lookup = RedisLookup::kMget;
  int connections = 16;  // round trips in flight
  int depth = 1;         // lookups per round trip
  int threads = 1;
  absl::Duration warmup = absl::Seconds(1);
  absl::Duration duration = absl::Seconds(5);
  uint64_t seed = 1;
};

// lookups[i]: the keys of request i; expected[i]: how many lead-in keys
// are present. Calls are round trips; each lookup's latency runs from its
// round trip's send to its reply.
PhaseResult DriveRedis(int port,
                       const std::vector<std::vector<std::string>>& lookups,
                       const std::vector<int>& expected,
                       const RedisDriveOptions& options);

}  // namespace prefixd::bench

#endif  // PREFIXD_BENCH_REDIS_PEER_H_
