// WatchEvents: server-streaming calls fed from core's per-tenant event rings.
//
// Each stream keeps its own read position. A shared PeriodicThread polls
// the streams that have no write in flight; mutating RPCs wake it early
// (Notify) so watchers see changes within one write, not one poll interval.
// A write completing continues the stream directly, so a backlog drains
// without waiting for the poll. Nothing here blocks a gRPC reaction: ring
// reads take one tenant mutex for a copy, like any unary call.
//
// A stream lives as long as its client reads, so it is authorized again
// whenever the principals change (SIGHUP): EndRevoked ends every stream
// whose access check now fails, with the check's status.
//
// Memory is bounded per tenant (WatchLimits): a stream has one reply in
// flight, of at most max_reply_bytes; a tenant holds at most
// max_streams_per_tenant streams; and a reply the client has not taken
// within stall_timeout (a client that never reads, so HTTP/2 flow control
// holds the reply in the daemon) cancels its stream, which frees it.
#ifndef PREFIXD_SERVER_WATCH_H_
#define PREFIXD_SERVER_WATCH_H_

#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "core/cache.h"
#include "prefixd/v1/prefix_cache.pb.h"
#include "server/periodic.h"

namespace prefixd {

class EventStream;

// Whether a stream may go on: OK, or the status it ends with.
using StreamAccessCheck = std::function<absl::Status()>;

struct WatchLimits {
  size_t max_streams_per_tenant = 8;
  uint64_t max_reply_bytes = 1 << 20;
  absl::Duration stall_timeout = absl::Seconds(30);
};

// Thread safety: every method may be called from any thread.
class EventWatchers {
 public:
  // Events per response message.
  static constexpr size_t kMaxBatch = 256;

  EventWatchers(const PrefixCache* cache, uint64_t epoch,
                absl::Duration poll_interval, WatchLimits limits = {});
  // REQUIRES: Shutdown() was called and every stream has ended (the gRPC
  // server has been shut down).
  ~EventWatchers();

  // A stream of `tenant`'s events from `from_sequence` (0: the oldest kept,
  // without a missed_events flag for what was dropped before).
  // RESOURCE_EXHAUSTED when the tenant has max_streams_per_tenant open.
  // `still_allowed` (may be empty: always) is asked by EndRevoked.
  grpc::ServerWriteReactor<v1::WatchEventsResponse>* Start(
      grpc::CallbackServerContext* ctx, std::string tenant,
      uint64_t from_sequence, StreamAccessCheck still_allowed = {});

  // After the principals changed: ends every stream whose access check
  // fails with that status, logging one line each. Returns how many.
  size_t EndRevoked();

  // New events may exist: poll now rather than at the next interval.
  void Notify() { poller_.Wake(); }

  // Ends every stream with UNAVAILABLE and refuses new ones the same way, so
  // that watchers (which never end by themselves) do not hold up a drain.
  void Shutdown();

 private:
  friend class EventStream;

  // Whether a stream may go on: OK, or the status it ends with.
  using StreamAccessCheck = std::function<absl::Status()>;
  // UNAVAILABLE once shut down, RESOURCE_EXHAUSTED past the tenant's limit.
  grpc::Status Register(EventStream* s);
  void Unregister(EventStream* s);
  // Every open stream, each with a Ref() the caller drops; none once shut
  // down.
  std::vector<EventStream*> RefAll();
  void PollAll();

  const PrefixCache* const cache_;
  const uint64_t epoch_;
  const WatchLimits limits_;
  Mutex mu_;
  absl::flat_hash_map<std::string, size_t> per_tenant_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<EventStream*> streams_ ABSL_GUARDED_BY(mu_);
  PeriodicThread poller_;  // last: it calls PollAll until stopped
};

// Converts one core event to its wire form.
void EventToProto(const Event& e, v1::Event* out);

}  // namespace prefixd

#endif  // PREFIXD_SERVER_WATCH_H_
