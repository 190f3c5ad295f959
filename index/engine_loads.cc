#include "index/engine_loads.h"

namespace prefixd {

void EngineLoads::Set(absl::string_view worker, const EngineLoad& load,
                      absl::Time at) {
  MutexLock lock(&mu_);
  auto [it, inserted] = readings_.try_emplace(worker, Reading{load, at});
  if (!inserted && it->second.at <= at) it->second = Reading{load, at};
}

std::optional<EngineLoad> EngineLoads::Fresh(absl::string_view worker,
                                             absl::Time now) const {
  ReaderMutexLock lock(&mu_);
  return FreshLocked(worker, now);
}

std::vector<std::optional<EngineLoad>> EngineLoads::FreshOf(
    absl::Span<const WorkerMatch> workers, absl::Time now) const {
  std::vector<std::optional<EngineLoad>> out;
  out.reserve(workers.size());
  ReaderMutexLock lock(&mu_);
  for (const WorkerMatch& m : workers)
    out.push_back(FreshLocked(m.worker, now));
  return out;
}

std::optional<EngineLoad> EngineLoads::FreshLocked(absl::string_view worker,
                                                   absl::Time now) const {
  auto it = readings_.find(worker);
  if (it == readings_.end() || now - it->second.at > max_age_) {
    return std::nullopt;
  }
  return it->second.load;
}

}  // namespace prefixd
