// A BlockStored's extra_keys (docs/index.md, "Namespaces and content
// keys"): per block, what the engine mixed into the block's hash besides
// its tokens. vLLM sends one entry per block, nil or a list, in either of
// two forms, and both must give the same namespace and the same keys:
//
//   raw (older vLLM), a tuple in vLLM's order:
//     [lora_name?, [mm_hash, offset]..., cache_salt?, embeds_digest?]
//   typed (event_version 1), tagged maps:
//     [{"type":"lora","name":N}, {"type":"mm","modality":M,"hash":H,
//      "block_offset":k}, {"type":"cache_salt","salt":S},
//      {"type":"prompt_embeds","hash":D}, {"type":"legacy","value":V}]
//
// The LoRA name is set aside (it names the namespace, with lora_name); the
// salt, allowed in a root event's first block only, is the raw tuple's last
// string there (an older engine's multimodal hash, a plain string, before
// it is a legacy key); everything else becomes the block's ContentKeys.
#ifndef PREFIXD_INDEX_EXTRA_KEYS_H_
#define PREFIXD_INDEX_EXTRA_KEYS_H_

#include "index/decode_budget.h"
#include "index/events.h"
#include "index/msgpack_view.h"

namespace prefixd {

// Fills ev->cache_salt, ev->content and ev->chain_blocks from `extra_keys`,
// a value of `reader`'s payload (absent or nil: none). ev's block_hashes,
// parent_block_hash, lora_id and lora_name must be decoded already; a
// typed LoRA key may set lora_name. Blocks past the first one whose keys
// cannot be understood are not chained (see BlockStoredEvent::chain_blocks).
// Takes what it allocates from *allowance and stops (returning true) once
// that is exceeded; the caller refuses the payload then.
// Returns false only when extra_keys is neither nil nor an array.
bool ReadExtraKeys(const msgpack_view::Reader& reader,
                   const msgpack_view::Value& extra_keys,
                   DecodeAllowance* allowance, BlockStoredEvent* ev);

// The content keys of typed keys given another way (a Route's
// BlockExtraKeys): the same ContentKey the decoder makes of the same key.
ContentKey MultiModalContentKey(absl::string_view hash, int64_t block_offset);
ContentKey PromptEmbedsContentKey(absl::string_view hash);
// {"type":"legacy","value": <a string>}.
ContentKey LegacyStringContentKey(absl::string_view value);

// EAGLE's bigram blocks (BlockStoredEvent::bigram), as the decoder makes
// them of an event and a Route of a prompt: for each of the first `blocks`
// blocks of `block_size` tokens of `tokens`, its content keys (those of
// `content`; none if it is null or has none for the block), then the token
// after it as a kNextToken key: the next block's first, or `after` past
// the end of `tokens`.
BlockContent WithNextTokens(const BlockContent* content,
                            absl::Span<const Token> tokens, size_t block_size,
                            size_t blocks, Token after);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_EXTRA_KEYS_H_
