// prefixd::Mutex is absl::Mutex, except in ThreadSanitizer builds.
//
// Debian's libabsl is not built with -fsanitize=thread, so TSan cannot see
// the happens-before edges absl::Mutex creates and reports every access it
// guards as a race. Builds configured with PREFIXD_SANITIZE=thread define
// PREFIXD_STD_MUTEX and get a standard-library mutex, which TSan intercepts.
// core/ locks only through these names.
#ifndef PREFIXD_CORE_MUTEX_H_
#define PREFIXD_CORE_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#ifdef PREFIXD_STD_MUTEX
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
  std::shared_mutex mu_;
};
#else
using Mutex = absl::Mutex;
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

}  // namespace prefixd

#endif  // PREFIXD_CORE_MUTEX_H_
