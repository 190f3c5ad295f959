// events_publish: the sidecar's own cache changes as vLLM-format KV events
// over ZeroMQ (docs/index.md, "The sidecar publishes too"), so that a
// prefixd index, llm-d or Dynamo routes over engines that use prefixd.
//
// A PeriodicThread polls core's per-tenant event rings (what WatchEvents
// reads), merges them in core's cache-wide event order, converts them, packs
// them into batches of bounded bytes (server/kv_batcher.h) and publishes
// each, encoded as index/publisher.h says, on the sockets of
// server/kv_event_sockets.h (which bound what slow peers can hold):
//
//   core event                     KV event
//   BlockStored (tenant, ns)       BlockStored: block IDs as hashes, parent,
//                                  tokens; lora_name = ns (nil when empty);
//                                  the tenant is the cache salt (none for
//                                  "default"), in the root block's extra_keys
//   BlockRemoved                   BlockRemoved of the same IDs
//   Cleared (Reset of a tenant)    BlockRemoved of every ID it removed
//   (events lost: ring overflow)   AllBlocksCleared, then the whole cache
//                                  again as BlockStored from the roots
//
// With RoPE shift DENY a store at another position than its place in the
// prefix (an Insert with a position_offset) is not published: Match would
// not return it for a prompt, so Route must not either. Its descendants,
// published, are dropped by the index as stored under an unknown parent.
//
// The first round after Start publishes the whole cache the same way (a
// snapshot restored at start-up holds blocks no event announced).
#ifndef PREFIXD_SERVER_EVENTS_PUBLISH_H_
#define PREFIXD_SERVER_EVENTS_PUBLISH_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/mutex.h"
#include "core/cache.h"
#include "index/events.h"
#include "index/publisher.h"
#include "server/kv_batcher.h"
#include "server/kv_event_sockets.h"
#include "server/periodic.h"

namespace prefixd {

// The cache salt of a tenant's blocks: its name, none for "default".
std::string CacheSaltOfTenant(absl::string_view tenant);

// Appends the KV events for one core event of `tenant` (none for a store
// that must not be published, see above). REQUIRES: the cache was created
// with CacheOptions::detailed_events (stores carry their tokens).
void AppendKvEvents(const Event& e, absl::string_view tenant, int block_size,
                    RopeShift rope_shift, std::vector<KvEvent>* out);

// Why the whole cache was published again (prefixd_events_resyncs_total).
enum class ResyncReason : int { kStart = 0, kOverflow = 1 };
inline constexpr int kNumResyncReasons = 2;
inline constexpr std::array<absl::string_view, kNumResyncReasons>
    kResyncReasonNames = {"start", "overflow"};

struct EventsPublishStats {
  KvEventSockets::Counters wire;
  // KV events published, by type: BlockStored, BlockRemoved,
  // AllBlocksCleared (index/fleet_index.h's kEventTypeNames order).
  std::array<uint64_t, 3> events = {};
  std::array<uint64_t, kNumResyncReasons> resyncs = {};
  // Every cache event whose order (PrefixCache::last_event_order) is at
  // most this has been published: the watermark of the last whole poll.
  uint64_t published_order = 0;
};

// Thread safety: every method may be called from any thread.
class EventsPublisher {
 public:
  // Opens the sockets (errors as KvEventSockets::Start) and starts polling
  // `cache` every `interval`. REQUIRES: `cache` outlives this and was
  // created with detailed_events.
  static absl::StatusOr<std::unique_ptr<EventsPublisher>> Start(
      const PrefixCache* cache, KvPublisherOptions options,
      PublishLimits limits, absl::Duration interval);
  ~EventsPublisher();
  EventsPublisher(const EventsPublisher&) = delete;
  EventsPublisher& operator=(const EventsPublisher&) = delete;

  // Publishes what is new now rather than at the next interval.
  void Wake() { poller_->Wake(); }
  // Stops polling and closes the sockets. Idempotent.
  void Stop();

  const std::string& endpoint() const { return sockets_->endpoint(); }
  const std::string& replay_endpoint() const {
    return sockets_->replay_endpoint();
  }
  const KvPublisherOptions& options() const { return options_; }
  EventsPublishStats stats() const;

 private:
  EventsPublisher(const PrefixCache* cache, KvPublisherOptions options,
                  std::unique_ptr<KvEventSockets> sockets);
  void Poll();
  void Resync(ResyncReason reason);
  // Publishes one batch the batcher packed.
  void PublishBatch(std::vector<KvEvent> events);

  const PrefixCache* const cache_;
  const KvPublisherOptions options_;
  const int block_size_;
  const RopeShift rope_shift_;
  std::unique_ptr<KvEventSockets> sockets_;

  // Touched by the polling thread only.
  bool resync_pending_ = true;
  absl::flat_hash_map<std::string, uint64_t> next_;  // per tenant
  KvBatcher batcher_;

  mutable Mutex mu_;
  EventsPublishStats stats_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<PeriodicThread> poller_;  // last: it calls Poll
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_EVENTS_PUBLISH_H_
