// KV events as stock vLLM and SGLang publish them (docs/index.md, "Wire"),
// decoded from one msgpack payload into plain structs.
//
// A payload is an EventBatch (ts, events, data_parallel_rank) that msgspec
// encodes either as an array (older vLLM, SGLang, whose third element is
// attn_dp_rank) or as a map with those keys (newer vLLM). Each event is
// tagged: an array whose first element is the type name, or a map with a
// "type" key; an array event's fields are in vLLM's declaration order:
//
//   BlockStored  block_hashes, parent_block_hash, token_ids, block_size,
//                lora_id, medium, lora_name, extra_keys, group_idx,
//                kv_cache_spec_kind, kv_cache_spec_sliding_window,
//                locality, ownership, session_id, event_version
//   BlockRemoved block_hashes, medium, group_idx, locality, ownership,
//                event_version
//
// and, by name only, BlockRemoved's remaining_copy_counts (newer vLLM,
// whose events are maps), BlockStored's cache_salt and component_types
// (the newest SGLang, whose events are maps in an array batch),
// additional_salt (RFC #1527's stores) and mm_keys (TensorRT-LLM: a block
// with multimodal keys ends the indexed chain, as does a token it gives
// as text). SGLang's array form puts its
// component_types, a list, in the lora_name slot (its BlockStored has no
// lora_name), and so does the decoder; its earlier component-typed events
// put one component's name in medium's slot (events.cc,
// OneComponentLayout).
//
// Trailing fields an encoder omitted are null; unknown fields and unknown
// event types are skipped and counted, never fatal. Anything else
// malformed is an error: the caller cannot know what a broken batch
// removed.
#ifndef PREFIXD_INDEX_EVENTS_H_
#define PREFIXD_INDEX_EVENTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/types.h"

namespace prefixd {

// An engine's own block hash: a msgpack integer (taken as its 64-bit two's
// complement) or bytes (folded to 64 bits by a hash). Only used to find a
// worker's block again, never as the index's key.
using EngineHash = uint64_t;

// What an engine mixes into a block's hash besides its tokens, the LoRA
// and the cache salt: a multimodal input, prompt embeddings, or a key the
// publisher could not type. The index keys a block by its tokens *and*
// these (index/keys.h), so a block is found only by a prompt that carries
// the same ones. vLLM sends them in `extra_keys`, raw (a tuple per block)
// or typed (a list of tagged maps per block); both give the same keys:
//
//   typed {"type":"mm","modality":..,"hash":H,"block_offset":k}  raw [H, k]
//   typed {"type":"prompt_embeds","hash":D}                      raw D (bytes)
//   typed {"type":"legacy","value":V}                            raw V
//
// A block of EAGLE's bigram pages (BlockStoredEvent::bigram) has one more,
// the token after the block (kNextToken): the pages' hash covers it.
struct ContentKey {
  enum class Kind : uint8_t {
    kMultiModal = 1,
    kPromptEmbeds = 2,
    kLegacy = 3,
    kNextToken = 4,  // last in a block's sorted keys
  };
  Kind kind = Kind::kLegacy;
  // mm, prompt_embeds: the hash's bytes (str or bin alike); legacy: the
  // value's msgpack encoding; next token: empty.
  std::string id;
  // mm: where the input starts, from the block's start; next token: the
  // token id.
  int64_t offset = 0;

  friend bool operator==(const ContentKey& a, const ContentKey& b) {
    return a.kind == b.kind && a.offset == b.offset && a.id == b.id;
  }
  friend bool operator<(const ContentKey& a, const ContentKey& b) {
    if (a.kind != b.kind) return a.kind < b.kind;
    if (a.offset != b.offset) return a.offset < b.offset;
    return a.id < b.id;
  }
  template <typename H>
  friend H AbslHashValue(H h, const ContentKey& k) {
    return H::combine(std::move(h), static_cast<uint8_t>(k.kind), k.id,
                      k.offset);
  }
};

// The content keys of consecutive blocks, flat: block i's are
// keys[begin[i], begin[i+1]), sorted (so their order on the wire does not
// matter). Empty `begin`: no block has any.
struct BlockContent {
  std::vector<ContentKey> keys;
  std::vector<uint32_t> begin;

  bool empty() const { return begin.empty(); }
  absl::Span<const ContentKey> Of(size_t block) const {
    if (block + 1 >= begin.size()) return {};
    return absl::MakeConstSpan(keys).subspan(begin[block],
                                             begin[block + 1] - begin[block]);
  }
  void Clear() {
    keys.clear();
    begin.clear();
  }
};

struct BlockStoredEvent {
  std::vector<EngineHash> block_hashes;
  std::optional<EngineHash> parent_block_hash;  // nullopt: starts at the root
  // block_hashes * block_size tokens (block_size > 0), or none: a store of
  // keys alone (RFC #1527's storage daemons send token_ids nil), whose
  // block_size is 0 if the publisher sent none, or a placeholder (below).
  std::vector<Token> token_ids;
  int64_t block_size = 0;
  // token_ids an empty array: vLLM's offloading placeholder, a copy in this
  // tier of blocks the worker stored before, named by their engine hashes
  // alone (its block_size 0, or the offloaded block's size).
  bool placeholder = false;
  // token_ids covers more whole blocks than block_hashes names: vLLM
  // leaves a group's null blocks (a sliding window's, a Mamba group's in
  // its align mode) out of the hashes but not out of the tokens, so the
  // wire does not say which block a hash is. Each hash names a block the
  // worker stored with its tokens in another group, as a placeholder's
  // does.
  bool sparse = false;
  // block_hashes is the one engine hash a Mooncake store object's key names
  // (index/object_key.h): a block some engine stored with its tokens, which
  // the shared pool now holds too. Found among every worker's blocks.
  bool from_object_key = false;
  // token_ids pairs [token, next token]: SGLang's radix cache under EAGLE
  // speculative decoding keys each position by the pair, and a page of
  // block_size pairs spans block_size + 1 tokens. token_ids holds each
  // pair's first token, and each block's content ends with a kNextToken
  // key (the token after the block).
  bool bigram = false;
  std::optional<int64_t> lora_id;
  std::string medium = "GPU";  // upper-cased; "GPU" when null
  std::optional<std::string> lora_name;
  // The cache salt: of a root event's first block, from extra_keys (raw:
  // the last string left once the LoRA name is set aside; typed: its
  // "cache_salt" key) or RFC #1527's additional_salt; of any event's first
  // block, from a raw "dynamo-cache-salt:" key, SGLang's metadata map or
  // its named cache_salt field (HolderTree keeps a child's only in its
  // parent's namespace). Empty if none.
  std::string cache_salt;
  // From extra_keys: each block's content keys (see ContentKey).
  BlockContent content;
  // Leading blocks whose extra keys the decoder understood. A block whose
  // keys it cannot read (an unknown typed key, a LoRA name other than the
  // event's, a salt anywhere but a root event's first block) ends the
  // indexed chain: nothing says what its hash covered.
  // == block_hashes.size() normally.
  size_t chain_blocks = 0;
  int64_t group_idx = 0;  // the KV-cache group; 0 when null
  // SGLang's component_types (--enable-kv-events-component-types): the
  // parts of a hybrid model's KV cache the worker now holds of these
  // blocks in this medium, replacing what it held of them, as group bits
  // (kComponentFull, kComponentSwa, kComponentMamba in group_rules.h).
  // 0: none given (nil, an empty list, or only names SGLang's indexer
  // does not know either), a store of the whole block in group_idx.
  uint32_t components = 0;
  // SGLang's earlier layout names one component per event
  // (component_type): the store adds it, and the worker keeps the others.
  bool one_component = false;
  // The group's kind as vLLM names it ("full_attention", "sliding_window",
  // "mamba", ...; empty when null) and its window in tokens (0 when null).
  std::string kv_cache_spec_kind;
  int64_t kv_cache_spec_sliding_window = 0;
  // Upper-cased; empty when null. LOCAL or REMOTE relative to the
  // publisher, and the secondary offloading tier that generated the event.
  std::string locality;
  std::string ownership;
  int64_t event_version = 0;  // 0 when null
  // RFC #1527's tenant_id (map form only): the tenant whose object this
  // is, as Mooncake's store master names it per object; empty when null.
  std::string tenant;
};

struct BlockRemovedEvent {
  // The blocks the worker no longer holds in this tier and group: the
  // event's hashes but those its remaining_copy_counts gives a copy left
  // (vLLM keeps one block's hash in several copies, and removes them one
  // at a time).
  std::vector<EngineHash> block_hashes;
  std::string medium = "GPU";
  int64_t group_idx = 0;
  // SGLang's earlier layout's component_type, as its group bit: only that
  // component is removed. 0: the group, or every component of a worker
  // whose stores name them (BlockStoredEvent::components).
  uint32_t components = 0;
  std::string locality;
  std::string ownership;
  int64_t event_version = 0;
  std::string tenant;  // as in BlockStoredEvent
};

struct AllBlocksClearedEvent {
  // RFC #1527's tenant_id: Mooncake's store master clears one tenant's
  // objects; empty (every event of vLLM, SGLang, TensorRT-LLM): all.
  std::string tenant;
};

using KvEvent =
    std::variant<BlockStoredEvent, BlockRemovedEvent, AllBlocksClearedEvent>;

// A batch's data_parallel_rank is below this (each rank is a worker).
inline constexpr int64_t kMaxDataParallelRanks = 1024;

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
