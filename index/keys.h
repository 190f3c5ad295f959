// How the fleet index names a block and a namespace (docs/index.md, "What
// the index holds").
//
// A block is keyed by a 64-bit fingerprint of its token ids, kept as two
// Tokens, so that the index's trees are core's trees (core/radix_tree.h)
// with a block size of 2: a node stores 8 bytes per block where the tokens
// of a 16-token block take 64. Two different blocks are confused only if
// their fingerprints are equal and they hang at the same place in the same
// tree (2^-64 per comparison); the cost of a collision is one request routed
// to a worker that computes its prefill itself.
//
// A namespace is what an engine mixes into a block's hash besides tokens:
// the LoRA adapter (by name, or by id for engines that send only the id)
// and the cache salt. Its key encodes each part with its length, so no two
// (lora, salt) pairs share a key whatever bytes they contain.
#ifndef PREFIXD_INDEX_KEYS_H_
#define PREFIXD_INDEX_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/types.h"
#include "index/events.h"

namespace prefixd {

// Tokens per block key in the index's trees.
inline constexpr int kKeyTokens = 2;

// keys[2i, 2i+1] = the fingerprint of block i of `tokens`, for `blocks`
// whole blocks of `block_size` tokens, and of block i's content keys when
// `content` (may be null) has any: a block with content keys never shares
// a key with the same tokens without them, or with other ones.
// REQUIRES: tokens.size() >= blocks * block_size; keys has 2 * blocks room.
void BlockKeys(absl::Span<const Token> tokens, size_t block_size, size_t blocks,
               const BlockContent* content, Token* keys);

inline bool SameKey(absl::Span<const Token> a, absl::Span<const Token> b) {
  return a[0] == b[0] && a[1] == b[1];
}

// The namespace of a LoRA (name, else id; 0 and "" mean none) and a salt.
std::string NamespaceKey(absl::string_view lora_name, int64_t lora_id,
                         absl::string_view cache_salt);

// The tier a holder is in, as Route and ListWorkers name it: the medium,
// then "/REMOTE" for blocks the publisher holds remotely, then "/" and the
// offloading tier that generated the event, if any ("CPU",
// "CPU/REMOTE", "CPU/lmcache").
std::string TierName(absl::string_view medium, absl::string_view locality,
                     absl::string_view ownership);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_KEYS_H_
