#include "index/worker_registry.h"

#include <algorithm>

namespace prefixd {

int64_t WorkerRecord::LagMs(int64_t now_unix_ns) const {
  if (last_seq < 0) return 0;
  // Truncated toward zero, as absl::ToInt64Milliseconds of the difference.
  return std::max<int64_t>(
      0, (now_unix_ns - static_cast<int64_t>(last_ts * 1e9)) / 1000000);
}

const WorkerRecord* WorkerRegistry::Find(absl::string_view name) const {
  auto it = ids_.find(name);
  return it != ids_.end() ? workers_[it->second].get() : nullptr;
}

WorkerRecord& WorkerRegistry::Add(absl::string_view name,
                                  absl::string_view endpoint) {
  auto it = ids_.find(name);
  if (it != ids_.end()) {
    WorkerRecord& w = *workers_[it->second];
    if (w.retired) {
      w.retired = false;
      w.state = WorkerState::kConnecting;
      w.last_seq = -1;
    }
    w.endpoint = std::string(endpoint);
    return w;
  }
  auto w = std::make_unique<WorkerRecord>();
  w->id = static_cast<WorkerId>(workers_.size());
  w->name = std::string(name);
  w->endpoint = std::string(endpoint);
  ids_[w->name] = w->id;
  // A name between others moves theirs up by one: O(workers) integers,
  // and O(log workers) name comparisons.
  const auto at = std::lower_bound(
      by_name_.begin(), by_name_.end(), w->name,
      [](const WorkerRecord* r, const std::string& n) { return r->name < n; });
  w->name_rank = static_cast<uint32_t>(at - by_name_.begin());
  by_name_.insert(at, w.get());
  for (const auto& other : workers_) {
    if (other->name_rank >= w->name_rank) ++other->name_rank;
  }
  workers_.push_back(std::move(w));
  return *workers_.back();
}

void WorkerRegistry::CountDrops(WorkerId worker, const DropCounts& drops) {
  WorkerRecord& w = Get(worker);
  for (int r = 0; r < kNumDropReasons; ++r) {
    w.dropped_blocks += drops[r];
    dropped_[r] += drops[r];
  }
}

}  // namespace prefixd
