// Exactness checks of bench/index_replay: the fleet index's answers against
// the simulated workers' caches (bench/fleet_workload.h).
//
// The reference is rebuilt from the batches' specs (which blocks each one
// stores and removes), never from the payload bytes, so it shares nothing
// with the encode -> DecodeEventBatch -> FleetIndex::Apply path it checks.
#ifndef PREFIXD_BENCH_FLEET_CHECKS_H_
#define PREFIXD_BENCH_FLEET_CHECKS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "bench/fleet_workload.h"
#include "index/fleet_index.h"

namespace prefixd {
namespace bench {

// Which blocks each worker caches, as the batches applied so far say.
//
// Thread safety: none; one thread at a time.
class ReferenceCaches {
 public:
  explicit ReferenceCaches(const FleetWorkload& workload);

  // After batch b's events.
  void Apply(const BatchSpec& b);
  // Worker w's caches as the engine's final state.
  void SetFinal();
  // Leading blocks of query q's prompt that worker w caches.
  uint32_t Matched(const QuerySpec& q, int w) const;
  // Whether worker w caches exactly `keys` (ascending).
  bool Equals(int w, const std::vector<uint32_t>& keys) const;
  size_t cached(int w) const { return sets_[w].size(); }

 private:
  const FleetWorkload& workload_;
  std::vector<absl::flat_hash_set<uint32_t>> sets_;
};

// Compares one Route answer with the reference: every worker listed once,
// with the reference's matched blocks. Appends a description of the first
// difference to *error and returns false if there is one.
bool CheckRoute(const FleetWorkload& workload, const ReferenceCaches& ref,
                const QuerySpec& q, const RouteResult& result,
                const absl::flat_hash_map<std::string, int>& worker_of,
                std::string* error);

// The index's own account of each worker against the workload: the last
// seq applied, the events of each kind, the blocks held, no drops, LIVE;
// and the index's invariants. Appends one line per difference (at most
// `limit`) to *failures.
void CheckIndexState(const FleetWorkload& workload, const FleetIndex& index,
                     std::vector<std::string>* failures, size_t limit = 16);

struct SequentialCheckResult {
  uint64_t batches = 0;
  uint64_t payloads_compared = 0;  // EncodePayload == EncodeEventBatch
  uint64_t queries_checked = 0;
  uint64_t route_mismatches = 0;
  std::vector<std::string> failures;  // the first few
  double seconds = 0;
};

// The quiesced replay: one thread applies every batch in schedule order
// (EncodePayload, DecodeEventBatch, FleetIndex::Apply) to a fresh index and
// routes queries at their places in between; every `every`-th query's
// answer is compared with the reference at that point, and every
// `every`-th payload with EncodeEventBatch's bytes. At the end the
// reference must equal the engines' final caches, and the index pass
// CheckIndexState.
SequentialCheckResult RunSequentialCheck(
    const FleetWorkload& workload, const std::vector<ScheduledOp>& schedule,
    uint64_t every, const std::function<void(const std::string&)>& progress);

// A fresh index for the workload (block size, every worker added as
// "w<i>"; with key_lookup, Route by rolling keys on), and the map from
// those names to worker numbers.
std::unique_ptr<FleetIndex> NewFleetIndex(
    const FleetWorkload& workload, std::vector<WorkerId>* ids,
    absl::flat_hash_map<std::string, int>* worker_of, bool key_lookup = false);

}  // namespace bench
}  // namespace prefixd

#endif  // PREFIXD_BENCH_FLEET_CHECKS_H_
