// ReadCounts: how often each worker was read, ok and failed, for /metrics
// (the engines' metrics and load sockets, server/engine_load_filer.h; the
// SGLang workers' /server_info, server/sglang_discovery.h). Workers are
// added and never removed, so a worker's counts go on when it comes back.
//
// Thread safety: mu_ guards the list; Add and Count are the reader's,
// counts may be called from any thread.
#ifndef PREFIXD_SERVER_READ_COUNTS_H_
#define PREFIXD_SERVER_READ_COUNTS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "base/mutex.h"

namespace prefixd {

class ReadCounts {
 public:
  struct Counts {
    absl::string_view worker;  // valid while the ReadCounts lives
    uint64_t ok = 0;
    uint64_t failed = 0;
  };

  // The index of `worker`, added at the end if it is new.
  size_t Add(absl::string_view worker);
  // One more read of worker i.
  void Count(size_t i, bool ok);
  // Per worker, in the order they were added.
  std::vector<Counts> counts() const;

 private:
  struct Entry {
    std::string worker;  // stays where it is: entries_ only grows
    uint64_t ok = 0;
    uint64_t failed = 0;
  };
  mutable Mutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_READ_COUNTS_H_
