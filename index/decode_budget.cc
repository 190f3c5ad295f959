#include "index/decode_budget.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace prefixd {

DecodeBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DecodeBudget::Reservation& DecodeBudget::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DecodeBudget::Reservation::Release() {
  if (budget_ == nullptr) return;
  std::exchange(budget_, nullptr)->Release(std::exchange(bytes_, 0));
}

DecodeBudget::DecodeBudget(int64_t budget_bytes) : budget_bytes_(budget_bytes) {
  assert(budget_bytes > 0);
}

bool DecodeBudget::Fits(int64_t bytes) const {
  return holders_ == 0 || reserved_ + bytes <= budget_bytes_;
}

DecodeBudget::Reservation DecodeBudget::Reserve(int64_t bytes,
                                                const std::atomic<bool>& stop) {
  MutexLock lock(&mu_);
  if (!queue_.empty() || !Fits(bytes)) {
    ++waits_;
    const uint64_t ticket = next_ticket_++;
    queue_.push_back(ticket);
    while (queue_.front() != ticket || !Fits(bytes)) {
      if (stop.load()) {
        queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
        changed_.SignalAll();  // the next one may be at the front now
        return Reservation();
      }
      // Woken by every change; the deadline only keeps the wait finite
      // (a spurious wake-up re-checks).
      changed_.WaitWithDeadline(&mu_, absl::Now() + absl::Seconds(1));
    }
    queue_.pop_front();
    changed_.SignalAll();  // the next one may fit beside this one
  }
  reserved_ += bytes;
  ++holders_;
  peak_ = std::max(peak_, reserved_);
  return Reservation(this, bytes);
}

void DecodeBudget::Release(int64_t bytes) {
  MutexLock lock(&mu_);
  reserved_ -= bytes;
  --holders_;
  changed_.SignalAll();
}

void DecodeBudget::WakeWaiters() {
  MutexLock lock(&mu_);
  changed_.SignalAll();
}

int64_t DecodeBudget::reserved_bytes() const {
  MutexLock lock(&mu_);
  return reserved_;
}

int64_t DecodeBudget::peak_reserved_bytes() const {
  MutexLock lock(&mu_);
  return peak_;
}

uint64_t DecodeBudget::waits() const {
  MutexLock lock(&mu_);
  return waits_;
}

size_t DecodeBudget::waiting() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

}  // namespace prefixd
