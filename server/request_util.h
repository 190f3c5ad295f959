// Pieces every service shares to read requests and build batch replies:
// the tokens of a request (`tokens` or `tokens_le32`), the limits of a
// batch, an item's status.
#ifndef PREFIXD_SERVER_REQUEST_UTIL_H_
#define PREFIXD_SERVER_REQUEST_UTIL_H_

#include <google/protobuf/repeated_ptr_field.h>

#include <bit>
#include <cstdint>
#include <forward_list>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/cache.h"
#include "core/types.h"
#include "prefixd/v1/prefix_cache.pb.h"
#include "prefixd/v1/prefix_index.pb.h"

namespace prefixd {

// How many tokens a request carries, in whichever field it uses.
template <typename Req>
size_t TokenCount(const Req& req) {
  return static_cast<size_t>(req.tokens_size()) +
         req.tokens_le32().size() / sizeof(Token);
}

inline size_t TokenCount(const v1::PickRequest& req) {
  return TokenCount(req.prompt());
}

// Names batch item `item` in an error message; -1 is a request of its own.
inline std::string ItemPrefix(int item) {
  return item < 0 ? "" : absl::StrCat("requests[", item, "]: ");
}

// Decoded copies of tokens_le32 that could not be read in place. Empty (and
// allocation-free) in the usual case; its elements never move.
using TokenCopies = std::forward_list<std::vector<Token>>;

// The request's tokens: `tokens`, or `tokens_le32` read in place (on a
// little-endian host, when its bytes are 4-aligned, as protobuf's heap and
// arena strings are) or else decoded into a new element of *copies. `item`
// is the request's index in a batch, for errors; -1 outside one.
template <typename Req>
absl::StatusOr<absl::Span<const Token>> RequestTokens(const Req& req, int item,
                                                      TokenCopies* copies) {
  const std::string& le32 = req.tokens_le32();
  if (le32.empty()) {
    return absl::MakeConstSpan(req.tokens().data(), req.tokens_size());
  }
  if (le32.size() % sizeof(Token) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        ItemPrefix(item), "tokens_le32 is ", le32.size(),
        " bytes, not a multiple of 4 (one little-endian uint32 per token)"));
  }
  const size_t n = le32.size() / sizeof(Token);
  if (req.tokens_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(ItemPrefix(item), "both tokens (", req.tokens_size(),
                     " tokens) and tokens_le32 (", n,
                     " tokens) are set; send the tokens in one of them"));
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(le32.data());
  if constexpr (std::endian::native == std::endian::little) {
    if (reinterpret_cast<uintptr_t>(bytes) % alignof(Token) == 0) {
      return absl::MakeConstSpan(reinterpret_cast<const Token*>(bytes), n);
    }
  }
  std::vector<Token>& copy = copies->emplace_front(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* b = bytes + i * sizeof(Token);
    copy[i] =
        Token{b[0]} | Token{b[1]} << 8 | Token{b[2]} << 16 | Token{b[3]} << 24;
  }
  return absl::MakeConstSpan(copy);
}

// A batch holds its tenant's lock for all of its items, so it is bounded
// like one request: at most max_block_ids_per_request items, together at
// most max_tokens_per_request tokens and max_block_ids_per_request block
// IDs. Past any of them the whole batch is INVALID_ARGUMENT.
template <typename Req>
absl::Status CheckBatch(absl::string_view method,
                        const google::protobuf::RepeatedPtrField<Req>& reqs,
                        const CacheLimits& limits) {
  const size_t n = static_cast<size_t>(reqs.size());
  if (n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(method, " has no requests; send at least one"));
  }
  if (n > limits.max_block_ids_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        method, " of ", n, " requests exceeds max_block_ids_per_request ",
        limits.max_block_ids_per_request, ", the limit on requests per batch"));
  }
  size_t tokens = 0, ids = 0;
  for (const Req& r : reqs) {
    tokens += TokenCount(r);
    if constexpr (std::is_same_v<Req, v1::InsertRequest>) {
      ids += static_cast<size_t>(r.block_ids_size());
    }
  }
  if (tokens > limits.max_tokens_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        method, " of ", n, " requests carries ", tokens,
        " tokens in all, past max_tokens_per_request ",
        limits.max_tokens_per_request, ", which bounds a whole batch"));
  }
  if (ids > limits.max_block_ids_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        method, " of ", n, " requests carries ", ids,
        " block_ids in all, past max_block_ids_per_request ",
        limits.max_block_ids_per_request, ", which bounds a whole batch"));
  }
  return absl::OkStatus();
}

template <typename Item>
void SetItemStatus(const absl::Status& s, Item* item) {
  item->set_code(static_cast<int32_t>(s.code()));
  item->set_message(std::string(s.message()));
}

}  // namespace prefixd

#endif  // PREFIXD_SERVER_REQUEST_UTIL_H_
