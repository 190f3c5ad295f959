#include "server/stop_signals.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

namespace prefixd {

StopSignals::StopSignals() {
  sigemptyset(&stop_);
  sigaddset(&stop_, SIGTERM);
  sigaddset(&stop_, SIGINT);
  waited_ = stop_;
  sigaddset(&waited_, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &waited_, nullptr);
}

int StopSignals::Wait() {
  int sig = 0;
  sigwait(&waited_, &sig);
  return sig;
}

void StopSignals::ExitOnSecond() {
  std::thread([stop = stop_] {
    int again = 0;
    sigwait(&stop, &again);
    std::fputs("prefixd: second signal, exiting without draining\n", stderr);
    _exit(1);
  }).detach();
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal";
  }
}

}  // namespace prefixd
