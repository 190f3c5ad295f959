// How the fleet index names a block, a namespace and a tier (docs/index.md,
// "What the index holds" and "Block keys").
//
// A block is keyed by a 64-bit *rolling* hash: the hash of the key of the
// block before it and of its own token ids (and content keys, when it has
// any), so a key names the whole prefix up to its block. The scheme is one
// of two published profiles, so that a router which computes the hashes
// itself (the Mooncake Conductor's /query_by_hash, RFC #1527 events that
// carry hashes but no tokens) names the same blocks:
//
//   Conductor (XXH64, seed 0; the default):
//     root  = XXH64(salt)                       the first block's parent
//     key_i = XXH64(le64(key_{i-1}) || le32(tokens of block i))
//   RFC (XXH3-64, seed S):
//     local_i = XXH3(le32(tokens of block i), S)
//     key_0   = local_0
//     key_i   = XXH3(le64(key_{i-1}) || le64(local_i), S)
//
// A block with content keys (a multimodal input, prompt embeddings) mixes
// an XXH64 of their canonical encoding after its tokens: no hash profile
// covers them, and such a block must differ from the same tokens without.
//
// The trees do not compare rolling keys: a walk from a namespace's root
// already knows the prefix above each block, so an edge compares each
// block's *fingerprint*, a hash of its own tokens and content keys
// (XXH3-64 with the profile's seed; for the RFC profile that is its local
// hash). The fingerprints of a prompt's blocks are independent of each
// other, so a Route computes them side by side where rolling keys would be
// computed one after another. Each block keeps its rolling key beside it
// (in its slot, index/holder_tree.h) for the lookups by key. The
// fingerprint is kept as two Tokens (low, high) in core's tree: the index's
// trees are core's trees with a block size of 2. Two different prefixes
// are confused only if their blocks' fingerprints are equal at the same
// place in the same tree (2^-64 per comparison); the cost of a collision is
// one request routed to a worker that computes its prefill itself.
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

// Tokens per block fingerprint in the index's trees.
inline constexpr int kKeyTokens = 2;

// The published rolling-hash profiles (values equal config.proto's
// IndexHashProfile).
enum class HashProfile : int {
  kConductorXxh64 = 0,
  kRfcXxh3 = 1,
};
absl::string_view HashProfileName(HashProfile profile);

// Thread safety: immutable.
class KeyScheme {
 public:
  KeyScheme() = default;
  KeyScheme(HashProfile profile, uint64_t seed)
      : profile_(profile), seed_(seed) {}
  HashProfile profile() const { return profile_; }

  // What the first block of a namespace with `salt` chains from.
  uint64_t Root(absl::string_view salt) const;
  // The key of a block after the block keyed `parent` (Root() for the
  // first block of a namespace, and then `first` is true).
  uint64_t Next(uint64_t parent, bool first, absl::Span<const Token> tokens,
                absl::Span<const ContentKey> content = {}) const;

  // keys[i] = the rolling key of block i of `tokens`, for `blocks` whole
  // blocks of `block_size` tokens after the block keyed `parent` (`first`:
  // block 0 is a namespace's first), with block i's content keys from
  // `content` (may be null).
  // REQUIRES: tokens.size() >= blocks * block_size; keys has `blocks` room.
  void Chain(uint64_t parent, bool first, absl::Span<const Token> tokens,
             size_t block_size, size_t blocks, const BlockContent* content,
             uint64_t* keys) const;
  // The same for blocks [from, blocks) alone, `parent` the key of block
  // from - 1 (`first`: from is 0 and block 0 is a namespace's first):
  // keys[i - from] = the rolling key of block i.
  void ChainFrom(uint64_t parent, bool first, absl::Span<const Token> tokens,
                 size_t block_size, size_t from, size_t blocks,
                 const BlockContent* content, uint64_t* keys) const;

  // A block's fingerprint: what the trees' edges compare.
  uint64_t Fingerprint(absl::Span<const Token> tokens,
                       absl::Span<const ContentKey> content = {}) const;
  // out[2i, 2i+1] = the fingerprint of block i, as the two Tokens a tree
  // stores, for `blocks` whole blocks as Chain reads them.
  void Fingerprints(absl::Span<const Token> tokens, size_t block_size,
                    size_t blocks, const BlockContent* content,
                    Token* out) const;

 private:
  HashProfile profile_ = HashProfile::kConductorXxh64;
  uint64_t seed_ = 0;
};

// A fingerprint (or a detached block's engine hash) as the two Tokens a
// tree stores, and back.
inline void StoreKey(uint64_t key, Token* out) {
  out[0] = static_cast<Token>(key);
  out[1] = static_cast<Token>(key >> 32);
}
inline uint64_t LoadKey(absl::Span<const Token> block) {
  return uint64_t{block[0]} | uint64_t{block[1]} << 32;
}

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
