#include "server/periodic.h"

#include <utility>

#include "absl/time/clock.h"

namespace prefixd {

PeriodicThread::PeriodicThread(absl::Duration interval,
                               std::function<void()> fn)
    : interval_(interval), fn_(std::move(fn)), thread_([this] { Loop(); }) {}

void PeriodicThread::Wake() {
  MutexLock lock(&mu_);
  woken_ = true;
  woken_or_stopping_.Signal();
}

void PeriodicThread::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    woken_or_stopping_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void PeriodicThread::Loop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      const absl::Time deadline = absl::Now() + interval_;
      while (!woken_ && !stopping_) {
        if (woken_or_stopping_.WaitWithDeadline(&mu_, deadline)) break;
      }
      if (stopping_) return;
      woken_ = false;
    }
    fn_();
  }
}

}  // namespace prefixd
