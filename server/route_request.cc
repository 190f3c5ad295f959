#include "server/route_request.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "index/extra_keys.h"

namespace prefixd {

absl::Status RouteRequestReader::Read(const v1::RouteRequest& req, int item,
                                      const CacheLimits& limits,
                                      int block_size) {
  ASSIGN_OR_RETURN(query_.tokens, RequestTokens(req, item, &copies_));
  if (query_.tokens.size() > limits.max_tokens_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat(ItemPrefix(item), "Route of ", query_.tokens.size(),
                     " tokens exceeds max_tokens_per_request ",
                     limits.max_tokens_per_request));
  }
  lora_name_ = req.lora_name();
  cache_salt_ = req.cache_salt();
  const size_t blocks = query_.tokens.size() / static_cast<size_t>(block_size);
  RETURN_IF_ERROR(ReadExtraKeys(req, item, limits, blocks));
  query_.lora_name = lora_name_;
  query_.lora_id = req.lora_id();
  query_.cache_salt = cache_salt_;
  query_.content = content_.empty() ? nullptr : &content_;
  query_.filter.workers.assign(req.workers().begin(), req.workers().end());
  query_.filter.all_workers = req.all_workers();
  return absl::OkStatus();
}

// Per block, its keys sorted as the decoder sorts an event's (index/events.h,
// BlockContent), so that a prompt and a stored block with the same keys get
// the same key whatever order they came in.
absl::Status RouteRequestReader::ReadExtraKeys(const v1::RouteRequest& req,
                                               int item,
                                               const CacheLimits& limits,
                                               size_t blocks) {
  if (req.block_extra_keys().empty()) return absl::OkStatus();
  const std::string prefix = ItemPrefix(item);
  size_t total = 0;
  std::vector<std::vector<ContentKey>> per_block(blocks);
  std::vector<bool> seen(blocks);
  for (int i = 0; i < req.block_extra_keys_size(); ++i) {
    const v1::BlockExtraKeys& b = req.block_extra_keys(i);
    const std::string where = absl::StrCat(prefix, "block_extra_keys[", i, "]");
    if (b.block() >= blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".block ", b.block(), " is past the prompt's ",
                       blocks, " whole blocks"));
    }
    if (seen[b.block()]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".block ", b.block(),
                       " is listed twice; give each block once"));
    }
    seen[b.block()] = true;
    total += static_cast<size_t>(b.keys_size());
    if (total > limits.max_block_ids_per_request) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "block_extra_keys carries more than ",
                       limits.max_block_ids_per_request,
                       " keys (max_block_ids_per_request)"));
    }
    for (int k = 0; k < b.keys_size(); ++k) {
      RETURN_IF_ERROR(ReadKey(b.keys(k), b.block(),
                              absl::StrCat(where, ".keys[", k, "]"),
                              &per_block[b.block()]));
    }
  }
  content_.begin.push_back(0);
  for (std::vector<ContentKey>& keys : per_block) {
    std::sort(keys.begin(), keys.end());
    for (ContentKey& k : keys) content_.keys.push_back(std::move(k));
    content_.begin.push_back(static_cast<uint32_t>(content_.keys.size()));
  }
  if (content_.keys.empty()) content_.Clear();
  return absl::OkStatus();
}

absl::Status RouteRequestReader::ReadKey(const v1::ExtraKey& key,
                                         uint32_t block,
                                         absl::string_view where,
                                         std::vector<ContentKey>* content) {
  switch (key.key_case()) {
    case v1::ExtraKey::kLora:
      return Agree("lora_name", &lora_name_, key.lora(), where);
    case v1::ExtraKey::kCacheSalt:
      if (block != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, " is a cache_salt in block ", block,
                         "; engines salt the first block only"));
      }
      return Agree("cache_salt", &cache_salt_, key.cache_salt(), where);
    case v1::ExtraKey::kPromptEmbeds:
      content->push_back(PromptEmbedsContentKey(key.prompt_embeds()));
      return absl::OkStatus();
    case v1::ExtraKey::kMm:
      content->push_back(
          MultiModalContentKey(key.mm().hash(), key.mm().block_offset()));
      return absl::OkStatus();
    case v1::ExtraKey::kLegacy:
      content->push_back(LegacyStringContentKey(key.legacy()));
      return absl::OkStatus();
    case v1::ExtraKey::KEY_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where,
                   " sets no key (one of lora, cache_salt, prompt_embeds, mm, "
                   "legacy)"));
}

// A LoRA or salt key fills the request's field, or must equal it.
absl::Status RouteRequestReader::Agree(absl::string_view field,
                                       std::string* value,
                                       absl::string_view from_key,
                                       absl::string_view where) {
  if (value->empty()) {
    *value = std::string(from_key);
    return absl::OkStatus();
  }
  if (*value == from_key) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, " names ", field, " \"", from_key,
                   "\" but the request's ", field, " is \"", *value, "\""));
}

}  // namespace prefixd
