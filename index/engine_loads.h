// EngineLoads: the latest load each engine reported, through its own
// metrics endpoint (index/engine_metrics.h) or SGLang's load socket
// (index/load_stat.h), for Pick (docs/index.md, "Load from the engines'
// metrics", "Load pushed by SGLang"). The daemon's scraper
// (server/engine_scraper.h) and load feed (server/engine_load_feed.h) file
// each reading with its time; Pick reads a worker's reading while it is at
// most max_age old, and the index's window of picks otherwise.
//
// Memory: one entry per configured engine (index.pick.engine_metrics,
// engine_load_sockets).
//
// Thread safety: every method may be called from any thread; mu_ guards
// the table.
#ifndef PREFIXD_INDEX_ENGINE_LOADS_H_
#define PREFIXD_INDEX_ENGINE_LOADS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "index/engine_metrics.h"
#include "index/kv_index.h"

namespace prefixd {

class EngineLoads {
 public:
  explicit EngineLoads(absl::Duration max_age) : max_age_(max_age) {}
  EngineLoads(const EngineLoads&) = delete;
  EngineLoads& operator=(const EngineLoads&) = delete;

  // `worker`'s reading taken at `at`; an older reading than the one kept
  // is ignored.
  void Set(absl::string_view worker, const EngineLoad& load, absl::Time at);
  // `worker`'s latest reading if it was taken within max_age before `now`.
  std::optional<EngineLoad> Fresh(absl::string_view worker,
                                  absl::Time now) const;
  // Fresh for each of `workers` (a Route answer's), in its order, under
  // one hold of the lock.
  std::vector<std::optional<EngineLoad>> FreshOf(
      absl::Span<const WorkerMatch> workers, absl::Time now) const;
  absl::Duration max_age() const { return max_age_; }

 private:
  struct Reading {
    EngineLoad load;
    absl::Time at;
  };
  std::optional<EngineLoad> FreshLocked(absl::string_view worker,
                                        absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  const absl::Duration max_age_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Reading> readings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_ENGINE_LOADS_H_
