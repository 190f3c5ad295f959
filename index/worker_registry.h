// WorkerRegistry: the fleet index's workers (one engine event stream each,
// docs/index.md "Workers"): their names, stream states and counters.
//
// Workers are numbered densely from 0 in the order they are first added
// and never freed: a worker that leaves is retired (hidden from answers)
// and comes back under its number if added again, so a WorkerId and a view
// of a worker's name stay valid for the registry's life.
//
// Thread safety: none; FleetIndex serializes access.
#ifndef PREFIXD_INDEX_WORKER_REGISTRY_H_
#define PREFIXD_INDEX_WORKER_REGISTRY_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "index/group_rules.h"
#include "index/kv_index.h"

namespace prefixd {

struct WorkerRecord {
  WorkerId id = 0;
  std::string name;
  // Its place among every worker's name in order (retired ones included):
  // answers listing workers by name sort by it, not by comparing names.
  uint32_t name_rank = 0;
  std::string endpoint;
  WorkerLabels labels;
  bool retired = false;
  WorkerState state = WorkerState::kConnecting;
  std::string detail;      // why the state is what it is ("" when LIVE)
  std::string last_error;  // why it was last cleared or put in ERROR
  std::array<uint64_t, kNumEventTypes> events_by_type = {};
  uint64_t gaps = 0;
  uint64_t replays_ok = 0;
  uint64_t replays_failed = 0;
  uint64_t dropped_blocks = 0;
  uint64_t unknown_fields = 0;
  std::array<uint64_t, kNumClearReasons> clears = {};
  int64_t last_seq = -1;
  int64_t last_event_unix_ms = 0;
  double last_ts = 0;  // the engine's timestamp of the last batch applied
  int64_t event_version = 0;  // the highest its events declared
  // Its KV-cache groups' rules as its stores declared them (hybrid models,
  // index/group_rules.h); all kNone for a plain engine.
  std::array<GroupRule, kMaxGroups> groups = {};
  // The group its stores that declare no kind are routed by, counted as
  // group 0 (index/routed_group.h). -1: none yet.
  int routed_group = -1;
  // Its stores name SGLang's components (BlockStoredEvent::components): a
  // removal takes the blocks out of every component.
  bool component_typed = false;

  // now - the last applied batch's engine timestamp (0 before any).
  // `now_unix_ns` is absl::ToUnixNanos(now): a Route answer computes it once
  // for all the workers it lists.
  int64_t LagMs(int64_t now_unix_ns) const;
};

class WorkerRegistry {
 public:
  // The worker named `name`, created if new; a retired one comes back
  // CONNECTING with no batch applied. `endpoint` replaces the recorded one.
  WorkerRecord& Add(absl::string_view name, absl::string_view endpoint);
  WorkerRecord& Get(WorkerId id) { return *workers_[id]; }
  const WorkerRecord& Get(WorkerId id) const { return *workers_[id]; }
  // The worker whose name is `rank`-th in order (WorkerRecord::name_rank).
  const WorkerRecord& ByRank(uint32_t rank) const { return *by_name_[rank]; }
  // The worker named `name`, retired or not; null if never added.
  const WorkerRecord* Find(absl::string_view name) const;
  // Ids run from 0 to size() - 1, retired ones included.
  size_t size() const { return workers_.size(); }

  // Blocks of `worker` not indexed, by reason; kept in the totals too.
  void CountDrops(WorkerId worker, const DropCounts& drops);
  // Blocks max_entries dropped (each holder's loss is counted by the caller
  // in its worker's dropped_blocks).
  void CountTrimmed(uint64_t blocks) {
    dropped_[static_cast<int>(DropReason::kMaxEntries)] += blocks;
  }
  // Totals over every worker that ever was, by reason.
  const DropCounts& dropped() const { return dropped_; }

 private:
  std::vector<std::unique_ptr<WorkerRecord>> workers_;
  absl::flat_hash_map<std::string, WorkerId> ids_;
  std::vector<const WorkerRecord*> by_name_;  // the records, in name order
  DropCounts dropped_ = {};
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_WORKER_REGISTRY_H_
