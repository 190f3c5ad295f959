#include "server/read_counts.h"

namespace prefixd {

size_t ReadCounts::Add(absl::string_view worker) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].worker == worker) return i;
  }
  entries_.push_back({std::string(worker), 0, 0});
  return entries_.size() - 1;
}

void ReadCounts::Count(size_t i, bool ok) {
  MutexLock lock(&mu_);
  ++(ok ? entries_[i].ok : entries_[i].failed);
}

std::vector<ReadCounts::Counts> ReadCounts::counts() const {
  MutexLock lock(&mu_);
  std::vector<Counts> out;
  for (const Entry& e : entries_) out.push_back({e.worker, e.ok, e.failed});
  return out;
}

}  // namespace prefixd
