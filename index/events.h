// KV events as stock vLLM and SGLang publish them (docs/index.md, "Wire"),
// decoded from one msgpack payload into plain structs.
//
// A payload is an EventBatch (ts, events, data_parallel_rank) that msgspec
// encodes either as an array (older vLLM, SGLang) or as a map with those
// keys (newer vLLM). Each event is tagged: an array whose first element is
// the type name, or a map with a "type" key. Trailing fields an encoder
// omitted are null; unknown fields and unknown event types are skipped and
// counted, never fatal. Anything else malformed is an error: the caller
// cannot know what a broken batch removed.
#ifndef PREFIXD_INDEX_EVENTS_H_
#define PREFIXD_INDEX_EVENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/types.h"

namespace prefixd {

// An engine's own block hash: a msgpack integer (taken as its 64-bit two's
// complement) or bytes (folded to 64 bits by a hash). Only used to find a
// worker's block again, never as the index's key.
using EngineHash = uint64_t;

struct BlockStoredEvent {
  std::vector<EngineHash> block_hashes;
  std::optional<EngineHash> parent_block_hash;  // nullopt: starts at the root
  std::vector<Token> token_ids;
  int64_t block_size = 0;
  std::optional<int64_t> lora_id;
  std::string medium = "GPU";  // upper-cased; "GPU" when null
  std::optional<std::string> lora_name;
  // From extra_keys: the one string left in the first block's keys once the
  // LoRA name is set aside (root events only; empty if none).
  std::string cache_salt;
  // Leading blocks whose extra keys carry nothing but the LoRA name (and, in
  // the first block of a root event, the salt). Blocks from here on carry
  // multimodal or other keys: their tokens alone do not name their content,
  // so the indexed chain ends before them. == block_hashes.size() normally.
  size_t chain_blocks = 0;
  int64_t group_idx = 0;  // 0 when null
};

struct BlockRemovedEvent {
  std::vector<EngineHash> block_hashes;
  std::string medium = "GPU";
  int64_t group_idx = 0;
};

struct AllBlocksClearedEvent {};

using KvEvent =
    std::variant<BlockStoredEvent, BlockRemovedEvent, AllBlocksClearedEvent>;

struct KvEventBatch {
  double ts = 0;  // the engine's wall clock, seconds since the epoch
  std::optional<int64_t> data_parallel_rank;
  std::vector<KvEvent> events;
  uint64_t unknown_events = 0;  // events of unknown types, skipped
  uint64_t unknown_fields = 0;  // map keys / array elements past the known ones
};

// Decodes one payload. On error, *out is unspecified and the message names
// what was wrong and where (event index, field).
absl::Status DecodeEventBatch(absl::string_view payload, KvEventBatch* out);

// Folds a bytes engine hash to 64 bits (stable within a process).
EngineHash FoldHashBytes(absl::string_view bytes);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_EVENTS_H_
