#include "server/replay_buffer.h"

#include <algorithm>
#include <utility>

namespace prefixd {

void ReplayBuffer::Add(int64_t seq,
                       std::shared_ptr<const std::string> payload) {
  MutexLock lock(&mu_);
  bytes_ += payload->size();
  entries_.push_back({seq, std::move(payload)});
  while (entries_.size() > 1 &&
         (entries_.size() > max_batches_ || bytes_ > max_bytes_)) {
    bytes_ -= entries_.front().payload->size();
    entries_.pop_front();
  }
}

std::vector<ReplayBuffer::Entry> ReplayBuffer::From(int64_t start) const {
  MutexLock lock(&mu_);
  auto it =
      std::lower_bound(entries_.begin(), entries_.end(), start,
                       [](const Entry& e, int64_t s) { return e.seq < s; });
  return std::vector<Entry>(it, entries_.end());
}

size_t ReplayBuffer::batches() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

uint64_t ReplayBuffer::bytes() const {
  MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace prefixd
