// The ZeroMQ side of events_publish (docs/index.md, "The sidecar publishes
// too"), in stock vLLM's wire format (payloads: index/publisher.h):
//
//   PUB     [topic, seq (8 bytes, big-endian), payload]; seq from 0 at
//           every start
//   ROUTER  a request [id, "", start (8 bytes)] is answered with
//           [id, "", seq, payload] for every buffered batch with seq >=
//           start, then [id, "", -1 (8 bytes, all 0xff), ""]
//
// What it holds, whatever its peers do (docs/operations.md, "Memory
// bounds"):
//   - the replay buffer (server/replay_buffer.h): PublishOptions'
//     buffer_batches and PublishLimits::buffer_bytes;
//   - each peer's send queue (a subscriber of PUB, a requester of ROUTER):
//     at most queue_bytes of payload, as a high-water mark of
//     queue_bytes / kMaxBatchBytes batches (server/kv_batcher.h bounds a
//     batch). Past it a subscriber misses batches (it sees the gap and
//     replays them); a replay waits up to 2 s for room, then gives the
//     request up;
//   - every queue holds references to the one string of a payload (zero-
//     copy messages), so slow peers cost queues of references, not copies;
//   - a TCP peer whose receive window stays closed for stall_timeout (it
//     stopped reading) is disconnected by the kernel (ZMQ_TCP_MAXRT, that
//     is TCP_USER_TIMEOUT), which frees its queue. ipc:// peers are local
//     and are not timed out.
//
// Thread safety: Publish may be called from any thread (calls are
// serialized); the replay socket is served by a thread of its own.
#ifndef PREFIXD_SERVER_KV_EVENT_SOCKETS_H_
#define PREFIXD_SERVER_KV_EVENT_SOCKETS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "index/publisher.h"

namespace prefixd {

struct PublishLimits {
  uint64_t buffer_bytes = 64 << 20;  // of the replay buffer
  uint64_t queue_bytes = 4 << 20;    // of each peer's send queue
  absl::Duration stall_timeout = absl::Seconds(30);
};

// INVALID_ARGUMENT naming the field and the bounds: buffer_bytes and
// queue_bytes at least one batch (kMaxBatchBytes), stall_timeout 1 s to
// 1 hour.
absl::Status ValidatePublishLimits(const PublishLimits& limits);

class KvEventSockets {
 public:
  // Binds (or connects, vLLM's rule: see KvPublisherOptions) the PUB
  // socket and binds the ROUTER socket before returning. INVALID_ARGUMENT
  // for a malformed endpoint or limit, UNAVAILABLE for an endpoint that
  // cannot be bound, naming it.
  static absl::StatusOr<std::unique_ptr<KvEventSockets>> Start(
      KvPublisherOptions options, PublishLimits limits);
  ~KvEventSockets();
  KvEventSockets(const KvEventSockets&) = delete;
  KvEventSockets& operator=(const KvEventSockets&) = delete;

  // Sends `payload` with the next sequence number and keeps it for replay;
  // returns the sequence number.
  int64_t Publish(std::string payload);
  // Stops the replay thread and closes the sockets. Idempotent.
  void Stop();

  // As bound, a wildcard port resolved (or as connected).
  const std::string& endpoint() const { return endpoint_; }
  // As bound; empty without replay.
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  // Each peer's queue, in batches.
  int high_water_mark() const;

  struct Counters {
    uint64_t batches = 0;  // published
    uint64_t bytes = 0;    // of published payloads
    uint64_t replay_requests = 0;
    uint64_t replayed_batches = 0;
    uint64_t buffered_batches = 0;  // in the replay buffer now
    uint64_t buffered_bytes = 0;
  };
  Counters counters() const;

 private:
  class Impl;
  explicit KvEventSockets(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
  std::string replay_endpoint_;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_KV_EVENT_SOCKETS_H_
