// An asynchronous gRPC driver: keeps a number of calls in flight on
// CompletionQueues (one per thread) for a warm-up and a measured window,
// closed loop (every completion issues the next call) or open loop (calls
// issued at Poisson arrival times of a given rate, each timed from its
// scheduled time, so a slow server cannot hide its queueing).
#ifndef PREFIXD_BENCH_LOAD_DRIVER_H_
#define PREFIXD_BENCH_LOAD_DRIVER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace prefixd::bench {

// One call slot: issues a call when asked and judges it when it ends. Its
// address is the CompletionQueue tag. Used by one driver thread only.
class Slot {
 public:
  virtual ~Slot() = default;
  // Starts the next call on `cq`, tagged with `this`.
  virtual void Issue(grpc::CompletionQueue* cq) = 0;
  // The call ended. Returns how many lookups it did, or -1 on an error
  // (described in *error).
  virtual int Done(std::string* error) = 0;
  // For a call that reports them (the bare baseline): when its handler
  // started and ended, in NowNs()'s clock. False otherwise.
  virtual bool HandlerTimes(int64_t* start_ns, int64_t* end_ns) const {
    (void)start_ns;
    (void)end_ns;
    return false;
  }

  int64_t start_ns = 0;   // set by the driver: where the latency counts from
  int64_t issued_ns = 0;  // set by the driver: when Issue was called
};

// Where a slow call's time went: a call over 1 ms whose handler reported
// its start and end (HandlerTimes).
// Its parts, in nanoseconds, in this order:
//   0 scheduled time to Issue: the driver was late
//   1 Issue to the handler's start: client, wire, server
//   2 the handler
//   3 the handler's end to the driver seeing the reply
struct SlowCall {
  static constexpr int kParts = 4;
  int64_t part_ns[kParts];
};

using SlotFactory = std::function<std::unique_ptr<Slot>(int thread, int index)>;

struct DriveOptions {
  int concurrency = 16;  // closed loop: calls in flight; open: at most this
  int threads = 1;       // driver threads, one CompletionQueue each
  absl::Duration warmup = absl::Seconds(1);
  absl::Duration duration = absl::Seconds(5);
  double rate = 0;  // calls/s in total for an open loop; 0: closed loop
  uint64_t seed = 1;
};

struct DriveResult {
  double seconds = 0;
  uint64_t calls = 0, lookups = 0, errors = 0, late = 0;
  uint64_t all_calls = 0;  // completed, warm-up and drain included
  std::string first_error;
  std::vector<int64_t> latency_ns;  // of the calls completed in the window
  std::vector<SlowCall> slow;       // of those, the ones over 1 ms that
                                    // reported HandlerTimes
};

// Runs the slots for warmup + duration and returns what completed in the
// measured window.
DriveResult Drive(const DriveOptions& options, const SlotFactory& make_slot);

}  // namespace prefixd::bench

#endif  // PREFIXD_BENCH_LOAD_DRIVER_H_
