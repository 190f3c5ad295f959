// The latest published KV event batches, which events_publish's replay
// socket sends again to a subscriber that missed some
// (server/kv_event_sockets.h): at most `max_batches` batches and
// `max_bytes` of payload; the oldest go first, the newest always stays.
// Payloads are shared, never copied: a replay, and every ZeroMQ queue a
// batch sits in, holds a reference to the one string.
//
// Thread safety: every method may be called from any thread; one mutex
// guards the entries.
#ifndef PREFIXD_SERVER_REPLAY_BUFFER_H_
#define PREFIXD_SERVER_REPLAY_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "base/mutex.h"

namespace prefixd {

class ReplayBuffer {
 public:
  struct Entry {
    int64_t seq = 0;
    std::shared_ptr<const std::string> payload;
  };

  ReplayBuffer(size_t max_batches, uint64_t max_bytes)
      : max_batches_(max_batches), max_bytes_(max_bytes) {}

  // Keeps batch `seq`, dropping the oldest past either bound. REQUIRES:
  // `seq` is larger than every earlier one.
  void Add(int64_t seq, std::shared_ptr<const std::string> payload);
  // The kept batches numbered `start` and later, oldest first.
  std::vector<Entry> From(int64_t start) const;

  size_t batches() const;
  uint64_t bytes() const;

 private:
  const size_t max_batches_;
  const uint64_t max_bytes_;
  mutable Mutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_REPLAY_BUFFER_H_
