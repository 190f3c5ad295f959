// The other direction of index/events.h: KV events encoded in stock vLLM's wire
// format, published over ZeroMQ (docs/index.md, "The sidecar publishes
// too"), so that a prefixd index, llm-d or Dynamo can follow a cache that is
// not vLLM's. The sockets that send them are server/kv_event_sockets.h.
//
//   PUB     [topic, seq (8 bytes, big-endian), payload (msgpack)]; seq from 0
//           at every start of the publisher
//   ROUTER  a request [id, "", start (8 bytes)] is answered with
//           [id, "", seq, payload] for every buffered batch with seq >= start,
//           then [id, "", -1 (8 bytes, all 0xff), ""]
//
// The payload is an EventBatch in newer vLLM's map form:
//   {"ts": seconds, "events": [event...]}
//   {"type": "BlockStored", "block_hashes": [int...], "parent_block_hash":
//    int | nil, "token_ids": [int...], "block_size": int, "lora_id": int | nil,
//    "medium": str, "lora_name": str | nil, "extra_keys": [[key...] | nil...]
//    | nil}
//   {"type": "BlockRemoved", "block_hashes": [int...], "medium": str}
//   {"type": "AllBlocksCleared"}
// extra_keys follows vLLM's per-block layout: each block's keys are the LoRA
// name (when set), then, in the first block of a root store only, the cache
// salt; a block without keys is nil, and a store without any is nil.
#ifndef PREFIXD_INDEX_PUBLISHER_H_
#define PREFIXD_INDEX_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "index/events.h"

namespace prefixd {

// Encodes a batch as above. Of a BlockStoredEvent it writes block_hashes,
// parent_block_hash, token_ids, block_size, lora_id, medium, lora_name and,
// from lora_name and cache_salt, extra_keys (chain_blocks and group_idx are
// not written); of a BlockRemovedEvent block_hashes and medium. Block hashes
// are written as unsigned ints; data_parallel_rank only when set.
std::string EncodeEventBatch(const KvEventBatch& batch);

struct KvPublisherOptions {
  // The PUB socket: bound when it has a wildcard (`*`, `::`) or is ipc://
  // or inproc:// (vLLM's rule), else connected (to an index's `listen`).
  std::string endpoint;
  // The ROUTER socket, always bound; empty: no replay.
  std::string replay_endpoint;
  std::string topic;  // the first frame of every message
  // How many of the latest batches the replay socket can resend.
  size_t buffer_batches = 10000;
};

// Checks the endpoints' form and the buffer size; the message names the
// offending value.
absl::Status ValidateKvPublisherOptions(const KvPublisherOptions& options);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_PUBLISHER_H_
