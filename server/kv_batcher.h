// Packs the KV events events_publish converts into batches whose msgpack
// payload (index/publisher.h's EncodeEventBatch) is at most kMaxBatchBytes,
// so that a count of batches bounds bytes: each ZeroMQ queue holds at most
// its high-water mark of batches (server/kv_event_sockets.h).
//
// A store or removal too big for one batch is split into consecutive
// events of the same kind: a chain of stored blocks becomes several
// stores, each after the previous one's last block (its parent), with the
// LoRA name on every one and the cache salt on the first, as a publisher
// that stored the chain in steps would have sent them; a removal becomes
// several removals. An index applies the pieces to the same state.
//
//   KvBatcher batcher([&](std::vector<KvEvent> events) { Publish(...); });
//   batcher.Add(event); ...; batcher.Flush();
//
// Thread safety: none; one thread uses a batcher.
#ifndef PREFIXD_SERVER_KV_BATCHER_H_
#define PREFIXD_SERVER_KV_BATCHER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "index/events.h"

namespace prefixd {

// The most bytes of one batch's payload, unless a single block with its
// tokens and names is larger (it then travels alone).
inline constexpr size_t kMaxBatchBytes = 64 << 10;
// Events per batch at most, as vLLM batches them.
inline constexpr size_t kMaxBatchEvents = 256;

// An upper bound on what `e` adds to an encoded batch.
size_t EncodedBytesBound(const KvEvent& e);
// An upper bound on an encoded batch's bytes besides its events.
inline constexpr size_t kBatchOverheadBytes = 64;

class KvBatcher {
 public:
  using Sink = std::function<void(std::vector<KvEvent> events)>;
  explicit KvBatcher(Sink sink) : sink_(std::move(sink)) {}

  // Queues `e` (in pieces when it is too big for one batch); hands full
  // batches to the sink.
  void Add(KvEvent e);
  // Hands what is queued to the sink, if anything.
  void Flush();
  // Drops what is queued.
  void Clear();

 private:
  void Queue(KvEvent e);
  void AddStored(BlockStoredEvent e);
  void AddRemoved(BlockRemovedEvent e);

  const Sink sink_;
  std::vector<KvEvent> pending_;
  size_t pending_bytes_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_SERVER_KV_BATCHER_H_
