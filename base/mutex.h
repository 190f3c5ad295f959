// prefixd::Mutex is absl::Mutex, except in ThreadSanitizer builds.
//
// Debian's libabsl is not built with -fsanitize=thread, so TSan cannot see
// the happens-before edges absl::Mutex creates and reports every access it
// guards as a race. Builds configured with PREFIXD_SANITIZE=thread define
// PREFIXD_STD_MUTEX and get standard-library primitives, which TSan
// intercepts. prefixd locks only through these names (Mutex, MutexLock,
// ReaderMutexLock, CondVar); abseil's own waiting (Mutex::Await,
// absl::Condition) has no standard-library twin and is not used.
#ifndef PREFIXD_BASE_MUTEX_H_
#define PREFIXD_BASE_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#ifdef PREFIXD_STD_MUTEX
#include <condition_variable>
#include <shared_mutex>
#endif

namespace prefixd {

#ifdef PREFIXD_STD_MUTEX
class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  friend class CondVar;
  std::shared_mutex mu_;
};

// absl::CondVar's interface, on std::condition_variable_any.
class CondVar {
 public:
  // REQUIRES: `mu` held exclusively. Releases it while waiting for a
  // Signal(), the deadline or a spurious wake-up, and holds it again on
  // return. Returns true if the deadline passed.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline) {
    return cv_.wait_until(mu->mu_, absl::ToChronoTime(deadline)) ==
           std::cv_status::timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};
#else
using Mutex = absl::Mutex;
using CondVar = absl::CondVar;
#endif

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Turns abseil's deadlock detector off for the whole process. Debian builds
// abseil without NDEBUG, which leaves it on: a process-wide lock taken on
// every Lock() that costs a third of the cache's throughput
// (docs/performance.md). The daemon and the benchmarks call this first; the
// tests keep the detector on. A no-op under PREFIXD_STD_MUTEX.
inline void DisableMutexDeadlockDetection() {
#ifndef PREFIXD_STD_MUTEX
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace prefixd

#endif  // PREFIXD_BASE_MUTEX_H_
