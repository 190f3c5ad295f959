// The engine hash in a Mooncake store object's key. Mooncake's store
// master publishes its KV events by object key (its map events'
// `object_key`, with `seq_hashes` empty), and each engine's connector
// writes the block's own hash into the key:
//
//   vLLM (its Mooncake store connector), '@'-separated, the hash a
//   segment of at least 16 hex digits (optionally 0x), last but for a
//   trailing rank or layer number:
//     [prefix@]model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@<sha256 hex>
//   the low 64 bits, big-endian: the number vLLM's own BlockStored
//   events carry for that block (their int hashes);
//
//   SGLang (HiCache's Mooncake backend), '_'-separated, the hash a run of
//   exactly 64 hex digits starting the key or following '_':
//     [tag_][model_]<sha256 hex>_<tp>_k
//   the first 64 bits, big-endian: SGLang's own events' signed int64 hash
//   of the page, as the same 64 bits.
//
// Thread safety: a pure function.
#ifndef PREFIXD_INDEX_OBJECT_KEY_H_
#define PREFIXD_INDEX_OBJECT_KEY_H_

#include <optional>

#include "absl/strings/string_view.h"
#include "index/events.h"

namespace prefixd {

// The engine hash `key` names, or nullopt when it has neither form.
std::optional<EngineHash> EngineHashOfObjectKey(absl::string_view key);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_OBJECT_KEY_H_
