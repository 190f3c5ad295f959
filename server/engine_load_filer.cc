#include "server/engine_load_filer.h"

#include <cstdio>
#include <utility>

namespace prefixd {

EngineLoadFiler::EngineLoadFiler(EngineLoads* loads, std::string what,
                                 std::vector<Source> sources)
    : loads_(loads),
      what_(std::move(what)),
      sources_(std::move(sources)),
      last_error_(sources_.size()),
      ok_(new std::atomic<uint64_t>[sources_.size()]()),
      failed_(new std::atomic<uint64_t>[sources_.size()]()) {}

void EngineLoadFiler::File(size_t i, const absl::StatusOr<EngineLoad>& reading,
                           absl::Time at) {
  const Source& s = sources_[i];
  if (reading.ok()) {
    ok_[i].fetch_add(1, std::memory_order_relaxed);
    loads_->Set(s.worker, *reading, at);
    if (!last_error_[i].empty()) {
      std::fprintf(stderr, "prefixd: %s of %s (%s) read again\n", what_.c_str(),
                   s.worker.c_str(), s.address.c_str());
    }
    last_error_[i].clear();
    return;
  }
  failed_[i].fetch_add(1, std::memory_order_relaxed);
  std::string error(reading.status().message());
  if (error != last_error_[i]) {  // a run's first failure, or a new reason
    std::fprintf(stderr,
                 "prefixd: %s of %s (%s) not read: %s; its load is the "
                 "index's window once the last reading is %s old\n",
                 what_.c_str(), s.worker.c_str(), s.address.c_str(),
                 error.c_str(),
                 absl::FormatDuration(loads_->max_age()).c_str());
  }
  last_error_[i] = std::move(error);
}

std::vector<EngineLoadFiler::Counts> EngineLoadFiler::counts() const {
  std::vector<Counts> out;
  for (size_t i = 0; i < sources_.size(); ++i) {
    out.push_back({sources_[i].worker, ok_[i].load(std::memory_order_relaxed),
                   failed_[i].load(std::memory_order_relaxed)});
  }
  return out;
}

}  // namespace prefixd
