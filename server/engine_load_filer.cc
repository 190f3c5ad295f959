#include "server/engine_load_filer.h"

#include <cstdio>
#include <utility>

namespace prefixd {

EngineLoadFiler::EngineLoadFiler(EngineLoads* loads, std::string what,
                                 const std::vector<Source>& sources)
    : loads_(loads), what_(std::move(what)) {
  for (const Source& s : sources) Add(s);
}

size_t EngineLoadFiler::Add(const Source& source) {
  const size_t i = reads_.Add(source.worker);
  MutexLock lock(&mu_);
  if (i < entries_.size()) {
    entries_[i].source.address = source.address;
  } else {
    entries_.emplace_back(source);
  }
  return i;
}

// Only the reader's thread adds, and a deque's elements stay where they
// are as it grows, so the reader may use an entry without the lock.
EngineLoadFiler::Entry& EngineLoadFiler::At(size_t i) {
  MutexLock lock(&mu_);
  return entries_[i];
}

bool EngineLoadFiler::ok(size_t i) const {
  MutexLock lock(&mu_);
  return entries_[i].last_error.empty();
}

void EngineLoadFiler::File(size_t i, const absl::StatusOr<EngineLoad>& reading,
                           absl::Time at) {
  Entry& e = At(i);
  const Source& s = e.source;
  reads_.Count(i, reading.ok());
  if (reading.ok()) {
    loads_->Set(s.worker, *reading, at);
    if (!e.last_error.empty()) {
      std::fprintf(stderr, "prefixd: %s of %s (%s) read again\n", what_.c_str(),
                   s.worker.c_str(), s.address.c_str());
    }
    e.last_error.clear();
    return;
  }
  std::string error(reading.status().message());
  if (error != e.last_error) {  // a run's first failure, or a new reason
    std::fprintf(stderr,
                 "prefixd: %s of %s (%s) not read: %s; its load is the "
                 "index's window once the last reading is %s old\n",
                 what_.c_str(), s.worker.c_str(), s.address.c_str(),
                 error.c_str(),
                 absl::FormatDuration(loads_->max_age()).c_str());
  }
  e.last_error = std::move(error);
}

}  // namespace prefixd
