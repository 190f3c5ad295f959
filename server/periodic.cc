#include "server/periodic.h"

#include <utility>

namespace prefixd {

PeriodicThread::PeriodicThread(absl::Duration interval,
                               std::function<void()> fn)
    : interval_(interval), fn_(std::move(fn)), thread_([this] { Loop(); }) {}

void PeriodicThread::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

void PeriodicThread::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PeriodicThread::Loop() {
  auto wake_or_stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return woken_ || stopping_;
  };
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&wake_or_stop), interval_);
      if (stopping_) return;
      woken_ = false;
    }
    fn_();
  }
}

}  // namespace prefixd
