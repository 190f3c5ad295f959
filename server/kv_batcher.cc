#include "server/kv_batcher.h"

#include <algorithm>
#include <string>
#include <utility>
#include <variant>

namespace prefixd {
namespace {

// What index/publisher.cc writes, at most: a uint64 takes 9 bytes, a
// uint32 token 5, a string or array header 5; the fixed part counts every
// key with its header, the nils and the integers.
constexpr size_t kStoredFixed = 256;
constexpr size_t kRemovedFixed = 64;
constexpr size_t kClearedBytes = 32;
constexpr size_t kRoom = kMaxBatchBytes - kBatchOverheadBytes;

size_t LoraBytes(const BlockStoredEvent& e) {
  return e.lora_name.has_value() ? e.lora_name->size() + 5 : 0;
}

// A stored block: its hash, its entry in extra_keys (the LoRA name).
size_t StoredBlockBytes(const BlockStoredEvent& e) {
  return 9 + 1 + LoraBytes(e);
}

size_t StoredFixedBytes(const BlockStoredEvent& e) {
  return kStoredFixed + e.medium.size() + e.cache_salt.size() + LoraBytes(e);
}

}  // namespace

size_t EncodedBytesBound(const KvEvent& e) {
  if (const auto* s = std::get_if<BlockStoredEvent>(&e)) {
    return StoredFixedBytes(*s) +
           s->block_hashes.size() * StoredBlockBytes(*s) +
           s->token_ids.size() * 5;
  }
  if (const auto* r = std::get_if<BlockRemovedEvent>(&e)) {
    return kRemovedFixed + r->medium.size() + r->block_hashes.size() * 9;
  }
  return kClearedBytes;
}

void KvBatcher::Add(KvEvent e) {
  if (EncodedBytesBound(e) <= kRoom) {
    Queue(std::move(e));
  } else if (auto* s = std::get_if<BlockStoredEvent>(&e)) {
    AddStored(std::move(*s));
  } else if (auto* r = std::get_if<BlockRemovedEvent>(&e)) {
    AddRemoved(std::move(*r));
  }
}

// Pieces of as many whole blocks as fit a batch (at least one), each the
// child of the previous piece's last block.
void KvBatcher::AddStored(BlockStoredEvent e) {
  const size_t n = e.block_hashes.size();
  const size_t per_block_tokens =
      e.block_size > 0 ? static_cast<size_t>(e.block_size) : 0;
  if (n == 0 || e.token_ids.size() != n * per_block_tokens) {
    Queue(std::move(e));  // not a store events_publish makes: as it is
    return;
  }
  const size_t fixed = StoredFixedBytes(e);
  const size_t per_block = StoredBlockBytes(e) + 5 * per_block_tokens;
  const size_t k = fixed + per_block >= kRoom ? 1 : (kRoom - fixed) / per_block;
  for (size_t begin = 0; begin < n; begin += k) {
    const size_t end = std::min(n, begin + k);
    BlockStoredEvent piece;
    piece.block_hashes.assign(e.block_hashes.begin() + begin,
                              e.block_hashes.begin() + end);
    piece.parent_block_hash = begin == 0
                                  ? e.parent_block_hash
                                  : std::optional(e.block_hashes[begin - 1]);
    piece.token_ids.assign(e.token_ids.begin() + begin * per_block_tokens,
                           e.token_ids.begin() + end * per_block_tokens);
    piece.block_size = e.block_size;
    piece.lora_id = e.lora_id;
    piece.medium = e.medium;
    piece.lora_name = e.lora_name;
    if (begin == 0) piece.cache_salt = e.cache_salt;
    piece.chain_blocks = end - begin;
    piece.group_idx = e.group_idx;
    Queue(std::move(piece));
  }
}

void KvBatcher::AddRemoved(BlockRemovedEvent e) {
  const size_t fixed = kRemovedFixed + e.medium.size();
  const size_t k = fixed + 9 >= kRoom ? 1 : (kRoom - fixed) / 9;
  for (size_t begin = 0; begin < e.block_hashes.size(); begin += k) {
    const size_t end = std::min(e.block_hashes.size(), begin + k);
    BlockRemovedEvent piece;
    piece.block_hashes.assign(e.block_hashes.begin() + begin,
                              e.block_hashes.begin() + end);
    piece.medium = e.medium;
    piece.group_idx = e.group_idx;
    Queue(std::move(piece));
  }
}

void KvBatcher::Queue(KvEvent e) {
  const size_t bytes = EncodedBytesBound(e);
  if (!pending_.empty() && pending_bytes_ + bytes > kRoom) Flush();
  pending_.push_back(std::move(e));
  pending_bytes_ += bytes;
  if (pending_.size() >= kMaxBatchEvents) Flush();
}

void KvBatcher::Flush() {
  if (pending_.empty()) return;
  std::vector<KvEvent> events = std::move(pending_);
  Clear();
  sink_(std::move(events));
}

void KvBatcher::Clear() {
  pending_.clear();
  pending_bytes_ = 0;
}

}  // namespace prefixd
