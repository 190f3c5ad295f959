#include "index/keys.h"

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"

namespace prefixd {

void BlockKeys(absl::Span<const Token> tokens, size_t block_size, size_t blocks,
               const BlockContent* content, Token* keys) {
  const bool with_content = content != nullptr && !content->empty();
  for (size_t i = 0; i < blocks; ++i) {
    const absl::Span<const Token> block =
        tokens.subspan(i * block_size, block_size);
    absl::Span<const ContentKey> extra;
    if (with_content) extra = content->Of(i);
    const uint64_t f =
        extra.empty() ? absl::HashOf(block) : absl::HashOf(block, extra);
    keys[kKeyTokens * i] = static_cast<Token>(f);
    keys[kKeyTokens * i + 1] = static_cast<Token>(f >> 32);
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
