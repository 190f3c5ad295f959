// EngineLoadFiler: where the daemon's readers of the engines' loads (the
// metrics scraper, server/engine_scraper.h, and SGLang's load sockets'
// feed, server/engine_load_feed.h) take each reading: a good one is filed
// in EngineLoads for Pick and counted; a failed one is counted and logged
// when it starts a run of failures or gives a new reason, and the first
// good one after such a run is logged too. Each source is a worker and
// the address it is read from.
//
// Thread safety: File and ok are called by the reader's one thread;
// counts may be called from any thread (relaxed atomics).
#ifndef PREFIXD_SERVER_ENGINE_LOAD_FILER_H_
#define PREFIXD_SERVER_ENGINE_LOAD_FILER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "index/engine_loads.h"
#include "index/engine_metrics.h"

namespace prefixd {

class EngineLoadFiler {
 public:
  struct Source {
    std::string worker;
    std::string address;  // a URL or a ZeroMQ endpoint, for the logs
  };
  // `what` names the readings in the logs ("engine metrics", "load").
  EngineLoadFiler(EngineLoads* loads, std::string what,
                  std::vector<Source> sources);
  EngineLoadFiler(const EngineLoadFiler&) = delete;
  EngineLoadFiler& operator=(const EngineLoadFiler&) = delete;

  // Source i's reading (or why there is none), taken at `at`.
  void File(size_t i, const absl::StatusOr<EngineLoad>& reading, absl::Time at);
  // Whether source i's last reading was good.
  bool ok(size_t i) const { return last_error_[i].empty(); }

  // Per source, in order: its readings so far.
  struct Counts {
    absl::string_view worker;
    uint64_t ok = 0;
    uint64_t failed = 0;
  };
  std::vector<Counts> counts() const;

 private:
  EngineLoads* const loads_;
  const std::string what_;
  const std::vector<Source> sources_;
  // Per source, its last reading's error ("" when it was good).
  std::vector<std::string> last_error_;
  std::unique_ptr<std::atomic<uint64_t>[]> ok_;
  std::unique_ptr<std::atomic<uint64_t>[]> failed_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ENGINE_LOAD_FILER_H_
