// Time source for lease expiry. Production code uses Clock::Real(); tests
// inject a ManualClock so that no test ever sleeps.
#ifndef PREFIXD_BASE_CLOCK_H_
#define PREFIXD_BASE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex.h"

namespace prefixd {

// Thread safety: implementations must be safe to call from many threads.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide wall clock. Never deleted.
  static Clock* Real();
};

// A clock that only moves when told to.
class ManualClock : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch() + absl::Hours(1))
      : now_(start) {}

  absl::Time Now() const override {
    MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace prefixd

#endif  // PREFIXD_BASE_CLOCK_H_
