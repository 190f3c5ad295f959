// The signals that stop or reload the daemon, waited for by one thread
// instead of interrupting whichever thread the kernel picks:
//
//   StopSignals signals;        // before any thread exists (gRPC starts its
//                               // own): every thread inherits the mask
//   while (signals.Wait() == SIGHUP) reload();
//   signals.ExitOnSecond();     // a second SIGTERM/SIGINT: _exit(1)
//   drain();
//
// Thread safety: construct before any other thread starts; Wait from one
// thread.
#ifndef PREFIXD_SERVER_STOP_SIGNALS_H_
#define PREFIXD_SERVER_STOP_SIGNALS_H_

#include <signal.h>

namespace prefixd {

class StopSignals {
 public:
  // Blocks SIGTERM, SIGINT and SIGHUP in the calling thread, and so in
  // every thread it starts from now on.
  StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Waits for one of them and returns it.
  int Wait();
  // From now on a second SIGTERM or SIGINT means the operator will not wait
  // for the drain: a thread of its own prints one line and _exit(1)s.
  void ExitOnSecond();

 private:
  sigset_t stop_;    // SIGTERM, SIGINT
  sigset_t waited_;  // and SIGHUP
};

// "SIGTERM", "SIGINT" or "SIGHUP".
const char* SignalName(int sig);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_STOP_SIGNALS_H_
