// The workload of bench/index_replay (docs/performance.md, "Fleet index at
// Dynamo's definition"): a Mooncake trace served by a fleet of simulated
// inference workers, as NVIDIA Dynamo's mooncake_bench builds it, turned
// into a schedule of Route queries and KV-event batches.
//
// The trace. Each hash id stands for trace_block_size (512) tokens, all
// equal to the id. The length factor L (4) stretches every request: id h
// becomes the ids h*L .. h*L+L-1 and input_length is multiplied by L. The
// duplication factor D (20) repeats the whole trace D times, copy c adding
// c * (largest stretched id + 1) to every id, so the copies share nothing.
// A prompt is its input_length (at most ids * trace_block_size, times L)
// tokens; the engines and the index cut it into blocks of block_size (128)
// tokens, of which only the full ones are named.
//
//   hash id 7, L = 4:  ids 28 29 30 31, each 512 tokens = 4 blocks of 128
//   block key = (copy id) * 4 + (block within the id); token = copy id
//
// The fleet. Every (request, copy) is a session of its own and goes to one
// of `workers` workers, drawn by a seeded generator. Each worker is an
// engine with a paged pool of gpu_blocks blocks and prefix caching, as
// tests/index/engine_pool.py models vLLM's: a request's longest cached
// prefix is a hit; the rest (plus a partial tail block) is allocated from
// the free queue's head, evicting the least recently freed cached blocks;
// requests are admitted first come, first served, and one that does not
// fit waits (head of line) until running requests free blocks. Admission
// publishes one batch: BlockRemoved for the evicted blocks, then
// BlockStored for the newly computed full blocks. A request holds its
// blocks for output_length * decode_ms_per_token after admission; freed
// blocks join the free queue's tail, a request's last block first.
//
// The schedule. Each worker's timeline (its requests at their arrival, its
// batches at their admission) is shifted to start at 0 and stretched to
// the replay window, then all are merged, ordered by (deadline, queries
// before batches, worker, position in the worker's timeline).
#ifndef PREFIXD_BENCH_FLEET_WORKLOAD_H_
#define PREFIXD_BENCH_FLEET_WORKLOAD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/trace.h"
#include "index/events.h"

namespace prefixd {
namespace bench {

struct FleetWorkloadOptions {
  int trace_block_size = 512;  // tokens per trace hash id
  int block_size = 128;        // the engines' and the index's block
  int length_factor = 4;
  int duplication = 20;
  int workers = 128;
  uint32_t gpu_blocks = 16384;  // per worker
  double decode_ms_per_token = 2;
  uint64_t seed = 42;
  size_t max_requests = 0;  // the trace's first N lines; 0: all
  // One BlockRemoved per evicted block (as vLLM's block pool emits them)
  // instead of one per admission listing all it evicted.
  bool removed_per_block = false;
};

// A Route: trace request `request` of copy `copy`, which `worker` serves.
struct QuerySpec {
  uint32_t request = 0;
  uint32_t copy = 0;
  uint32_t worker = 0;
  uint32_t blocks = 0;  // full blocks of the prompt
};

// A payload: worker `worker`'s batch number `seq` (0, 1, ...): BlockRemoved
// of removed[removed_begin, +removed_count), then BlockStored of query
// `query`'s blocks [stored_from, stored_to) (none when equal).
struct BatchSpec {
  uint32_t worker = 0;
  uint32_t seq = 0;
  uint32_t query = 0;
  uint32_t stored_from = 0;
  uint32_t stored_to = 0;
  uint32_t removed_count = 0;
  uint64_t removed_begin = 0;
  uint32_t stored_blocks() const { return stored_to - stored_from; }
};

// An entry of the schedule: queries[index] or batches[index].
struct ScheduledOp {
  uint64_t deadline_ns = 0;  // from the start of the replay
  uint32_t index = 0;
  bool is_query = false;
};

struct WorkloadTotals {
  uint64_t requests = 0;
  uint64_t batches = 0;
  uint64_t stored_events = 0;
  uint64_t removed_events = 0;
  uint64_t request_blocks = 0;
  uint64_t stored_blocks = 0;
  uint64_t removed_blocks = 0;
  // Dynamo's denominators: logical = requests + events; block = request
  // hashes + the hashes of Stored and Removed events.
  uint64_t logical_ops() const {
    return requests + stored_events + removed_events;
  }
  uint64_t block_ops() const {
    return request_blocks + stored_blocks + removed_blocks;
  }
};

// What the simulated engines did (not part of the schedule).
struct EngineCounts {
  uint64_t admitted = 0;
  uint64_t refused = 0;  // needed more blocks than the pool has
  uint64_t waited = 0;   // admitted later than they arrived
  uint64_t hit_blocks = 0;
};

class FleetWorkload {
 public:
  // `progress`, when set, is called now and then with a line to print.
  // `trace` must outlive the workload.
  static absl::StatusOr<FleetWorkload> Build(
      const Trace& trace, const FleetWorkloadOptions& options,
      const std::function<void(const std::string&)>& progress = nullptr);

  const FleetWorkloadOptions& options() const { return options_; }
  const std::vector<QuerySpec>& queries() const { return queries_; }
  const std::vector<BatchSpec>& batches() const { return batches_; }
  const std::vector<uint32_t>& removed() const { return removed_; }
  const WorkloadTotals& totals() const { return totals_; }
  const EngineCounts& engine_counts() const { return counts_; }
  // Every block key worker w's pool caches once everything has run,
  // ascending.
  const std::vector<uint32_t>& final_cached(int w) const {
    return final_cached_[w];
  }
  // Batches per worker (the last seq is this minus one).
  uint32_t worker_batches(int w) const { return worker_batches_[w]; }

  // The merged schedule for a replay window of `window_ns`.
  std::vector<ScheduledOp> Schedule(uint64_t window_ns) const;

  // Block identities. The key of block `block` of query `q`'s prompt.
  uint32_t Key(const QuerySpec& q, uint32_t block) const;
  // Every token of a block is this value (its copy's stretched id).
  Token TokenOf(uint32_t key) const { return key / blocks_per_id_; }
  // The engines' hash of a block (the same at every worker).
  static EngineHash HashOf(uint32_t key);

  // The prompt of query q, its full blocks only, into *tokens.
  void PromptTokens(const QuerySpec& q, std::vector<Token>* tokens) const;
  // Batch b as decoded events, ts as given; for checks (slow: every token).
  KvEventBatch Events(const BatchSpec& b, double ts) const;
  // Batch b as vLLM's msgpack map encoding, byte for byte what
  // EncodeEventBatch(Events(b, ts)) writes, into *out. Fast: a block's 128
  // equal tokens are encoded once and copied.
  void EncodePayload(const BatchSpec& b, double ts, std::string* out) const;
  // Events in batch b.
  uint32_t EventsIn(const BatchSpec& b) const;

 private:
  struct TimelineEntry {
    double time_ms;
    uint32_t index;  // into queries_ or batches_
    bool is_query;
  };
  struct WorkerResult;
  class WorkerSim;

  FleetWorkload() = default;
  // Sessions to workers, copy by copy, as Dynamo partitions them; each
  // worker's query ids in arrival order.
  void AssignSessions(size_t requests,
                      std::vector<std::vector<uint32_t>>* arrivals);
  std::vector<WorkerResult> SimulateAll(
      const std::vector<std::vector<uint32_t>>& arrivals,
      const std::function<void(const std::string&)>& progress) const;
  void Merge(std::vector<WorkerResult> results);
  void PackStored(const BatchSpec& b, std::string* out) const;

  FleetWorkloadOptions options_;
  const Trace* trace_ = nullptr;
  uint32_t blocks_per_id_ = 4;            // trace_block_size / block_size
  uint64_t copy_stride_ = 0;              // stretched ids per copy
  std::vector<uint32_t> request_blocks_;  // per trace request
  std::vector<QuerySpec> queries_;
  std::vector<BatchSpec> batches_;
  std::vector<uint32_t> removed_;
  std::vector<std::vector<TimelineEntry>> timelines_;  // per worker
  std::vector<std::vector<uint32_t>> final_cached_;
  std::vector<uint32_t> worker_batches_;
  WorkloadTotals totals_;
  EngineCounts counts_;
};

}  // namespace bench
}  // namespace prefixd

#endif  // PREFIXD_BENCH_FLEET_WORKLOAD_H_
