// A thread that runs one function every `interval`, or sooner when woken,
// until stopped. The server's background work (lease expiry, feeding
// WatchEvents streams) runs on these so that no gRPC reaction ever waits.
#ifndef PREFIXD_SERVER_PERIODIC_H_
#define PREFIXD_SERVER_PERIODIC_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "base/mutex.h"

namespace prefixd {

// Thread safety: Wake and Stop may be called from any thread.
class PeriodicThread {
 public:
  // Starts the thread. `fn` runs without any lock of this class held.
  PeriodicThread(absl::Duration interval, std::function<void()> fn);
  ~PeriodicThread() { Stop(); }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Runs `fn` as soon as the current run (if any) ends.
  void Wake();
  // Waits for the current run to end and joins. Idempotent.
  // REQUIRES: not called from `fn`.
  void Stop();

 private:
  void Loop();

  const absl::Duration interval_;
  const std::function<void()> fn_;
  Mutex mu_;
  CondVar woken_or_stopping_;  // signalled when either flag is set
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_PERIODIC_H_
