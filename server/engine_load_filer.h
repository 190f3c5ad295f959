// EngineLoadFiler: where the daemon's readers of the engines' loads (the
// metrics scraper, server/engine_scraper.h, and SGLang's load sockets'
// feed, server/engine_load_feed.h) take each reading: a good one is filed
// in EngineLoads for Pick and counted; a failed one is counted and logged
// when it starts a run of failures or gives a new reason, and the first
// good one after such a run is logged too. Each source is a worker and
// the address it is read from; sources are added, never removed, so a
// worker's counts go on when a source of the same worker comes back.
//
// Thread safety: Add, File and ok are called by the reader's one thread;
// counts may be called from any thread (mu_ guards the list, reads_ its
// own counts).
#ifndef PREFIXD_SERVER_ENGINE_LOAD_FILER_H_
#define PREFIXD_SERVER_ENGINE_LOAD_FILER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "index/engine_loads.h"
#include "index/engine_metrics.h"
#include "server/read_counts.h"

namespace prefixd {

class EngineLoadFiler {
 public:
  struct Source {
    std::string worker;
    std::string address;  // a URL or a ZeroMQ endpoint, for the logs
  };
  // `what` names the readings in the logs ("engine metrics", "load").
  EngineLoadFiler(EngineLoads* loads, std::string what,
                  const std::vector<Source>& sources = {});
  EngineLoadFiler(const EngineLoadFiler&) = delete;
  EngineLoadFiler& operator=(const EngineLoadFiler&) = delete;

  // The index of `source`'s worker, added at the end if it is new (its
  // address is then source's).
  size_t Add(const Source& source);
  // Source i's reading (or why there is none), taken at `at`.
  void File(size_t i, const absl::StatusOr<EngineLoad>& reading, absl::Time at);
  // Whether source i's last reading was good.
  bool ok(size_t i) const;

  // Per source, in order: its readings so far.
  using Counts = ReadCounts::Counts;
  std::vector<Counts> counts() const { return reads_.counts(); }

 private:
  struct Entry {
    explicit Entry(const Source& s) : source(s) {}
    Source source;           // its worker never changes
    std::string last_error;  // "" when its last reading was good
  };
  // The reader's thread's (it alone adds): entry i, stable in the deque.
  Entry& At(size_t i);

  EngineLoads* const loads_;
  const std::string what_;
  mutable Mutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);  // as in reads_
  ReadCounts reads_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_ENGINE_LOAD_FILER_H_
