#include "index/keys.h"

// Inlined (xxhash.h is the whole implementation): a Route hashes each
// prompt block it walks, and the call into the shared library was a
// quarter of its time.
// GCC 12 misreads the streaming update's pointer arithmetic as out of
// bounds once it is inlined.
#define XXH_INLINE_ALL
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <xxhash.h>
#pragma GCC diagnostic pop

#include <array>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace prefixd {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the hash profiles hash little-endian words as they lie in "
              "memory");

// The canonical encoding of a block's content keys, hashed: per key its
// kind, the length and bytes of its id, and its offset.
uint64_t ContentDigest(absl::Span<const ContentKey> content) {
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  for (const ContentKey& k : content) {
    const uint8_t kind = static_cast<uint8_t>(k.kind);
    const uint64_t size = k.id.size();
    XXH64_update(state, &kind, sizeof(kind));
    XXH64_update(state, &size, sizeof(size));
    XXH64_update(state, k.id.data(), k.id.size());
    XXH64_update(state, &k.offset, sizeof(k.offset));
  }
  const uint64_t digest = XXH64_digest(state);
  XXH64_freeState(state);
  return digest;
}

// What one block's hash covers after its parent: le32 tokens, then the
// content digest if it has content keys. Laid out in one buffer for small
// blocks (the usual 16 tokens), streamed otherwise.
class BlockBytes {
 public:
  static constexpr size_t kInline = 1024;

  BlockBytes(absl::Span<const Token> tokens,
             absl::Span<const ContentKey> content)
      : tokens_(tokens), has_digest_(!content.empty()) {
    if (has_digest_) digest_ = ContentDigest(content);
  }

  // XXH64(le64(prefix) || tokens || digest), seed 0.
  uint64_t Xxh64After(uint64_t prefix) const {
    const size_t token_bytes = tokens_.size() * sizeof(Token);
    const size_t n = 8 + token_bytes + (has_digest_ ? 8 : 0);
    if (n <= kInline) {
      std::array<unsigned char, kInline> buf;
      std::memcpy(buf.data(), &prefix, 8);
      std::memcpy(buf.data() + 8, tokens_.data(), token_bytes);
      if (has_digest_) std::memcpy(buf.data() + 8 + token_bytes, &digest_, 8);
      return XXH64(buf.data(), n, 0);
    }
    XXH64_state_t* state = XXH64_createState();
    XXH64_reset(state, 0);
    XXH64_update(state, &prefix, 8);
    XXH64_update(state, tokens_.data(), token_bytes);
    if (has_digest_) XXH64_update(state, &digest_, 8);
    const uint64_t h = XXH64_digest(state);
    XXH64_freeState(state);
    return h;
  }

  // XXH3(tokens || digest, seed).
  uint64_t Xxh3(uint64_t seed) const {
    const size_t token_bytes = tokens_.size() * sizeof(Token);
    if (!has_digest_)
      return XXH3_64bits_withSeed(tokens_.data(), token_bytes, seed);
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset_withSeed(state, seed);
    XXH3_64bits_update(state, tokens_.data(), token_bytes);
    XXH3_64bits_update(state, &digest_, 8);
    const uint64_t h = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return h;
  }

 private:
  absl::Span<const Token> tokens_;
  bool has_digest_;
  uint64_t digest_ = 0;
};

}  // namespace

absl::string_view HashProfileName(HashProfile profile) {
  switch (profile) {
    case HashProfile::kConductorXxh64:
      return "CONDUCTOR_XXH64";
    case HashProfile::kRfcXxh3:
      return "RFC_XXH3";
  }
  return "UNKNOWN";
}

uint64_t KeyScheme::Root(absl::string_view salt) const {
  if (profile_ == HashProfile::kRfcXxh3) return 0;  // key_0 = local_0
  return XXH64(salt.data(), salt.size(), 0);
}

uint64_t KeyScheme::Next(uint64_t parent, bool first,
                         absl::Span<const Token> tokens,
                         absl::Span<const ContentKey> content) const {
  const BlockBytes block(tokens, content);
  if (profile_ == HashProfile::kConductorXxh64) return block.Xxh64After(parent);
  const uint64_t local = block.Xxh3(seed_);
  if (first) return local;
  const std::array<uint64_t, 2> pair = {parent, local};
  return XXH3_64bits_withSeed(pair.data(), sizeof(pair), seed_);
}

void KeyScheme::Chain(uint64_t parent, bool first,
                      absl::Span<const Token> tokens, size_t block_size,
                      size_t blocks, const BlockContent* content,
                      uint64_t* keys) const {
  ChainFrom(parent, first, tokens, block_size, 0, blocks, content, keys);
}

void KeyScheme::ChainFrom(uint64_t parent, bool first,
                          absl::Span<const Token> tokens, size_t block_size,
                          size_t from, size_t blocks,
                          const BlockContent* content, uint64_t* keys) const {
  const bool with_content = content != nullptr && !content->empty();
  for (size_t i = from; i < blocks; ++i) {
    absl::Span<const ContentKey> extra;
    if (with_content) extra = content->Of(i);
    parent = Next(parent, first && i == 0,
                  tokens.subspan(i * block_size, block_size), extra);
    keys[i - from] = parent;
  }
}

uint64_t KeyScheme::Fingerprint(absl::Span<const Token> tokens,
                                absl::Span<const ContentKey> content) const {
  return BlockBytes(tokens, content).Xxh3(seed_);
}

void KeyScheme::Fingerprints(absl::Span<const Token> tokens, size_t block_size,
                             size_t blocks, const BlockContent* content,
                             Token* out) const {
  const bool with_content = content != nullptr && !content->empty();
  for (size_t i = 0; i < blocks; ++i) {
    absl::Span<const ContentKey> extra;
    if (with_content) extra = content->Of(i);
    StoreKey(Fingerprint(tokens.subspan(i * block_size, block_size), extra),
             out + kKeyTokens * i);
  }
}

//   lora "a", salt "s"  -> "n1:as"
//   lora id 7, salt ""  -> "i7:"
//   neither, salt "s"   -> "-s"
// The LoRA part carries its length, and the salt is the rest: a name that
// contains any separator cannot reach another pair's key.
std::string NamespaceKey(absl::string_view lora_name, int64_t lora_id,
                         absl::string_view cache_salt) {
  if (!lora_name.empty()) {
    return absl::StrCat("n", lora_name.size(), ":", lora_name, cache_salt);
  }
  if (lora_id != 0) return absl::StrCat("i", lora_id, ":", cache_salt);
  return absl::StrCat("-", cache_salt);
}

std::string TierName(absl::string_view medium, absl::string_view locality,
                     absl::string_view ownership) {
  std::string name(medium);
  if (locality == "REMOTE") absl::StrAppend(&name, "/REMOTE");
  if (!ownership.empty()) absl::StrAppend(&name, "/", ownership);
  return name;
}

}  // namespace prefixd
