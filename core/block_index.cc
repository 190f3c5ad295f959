#include "core/block_index.h"

namespace prefixd {

bool BlockIndex::ClaimAll(absl::Span<const BlockId> ids, uint32_t tenant,
                          BlockId* taken) {
  for (size_t i = 0; i < ids.size(); ++i) {
    bool inserted;
    {
      Shard& s = ShardFor(ids[i]);
      MutexLock lock(&s.mu);
      inserted = s.map.try_emplace(ids[i], BlockOwner{tenant, nullptr}).second;
    }
    if (!inserted) {
      *taken = ids[i];
      Erase(ids.subspan(0, i));
      return false;
    }
  }
  return true;
}

void BlockIndex::SetNode(absl::Span<const BlockId> ids, Node* node) {
  for (BlockId id : ids) {
    Shard& s = ShardFor(id);
    MutexLock lock(&s.mu);
    s.map[id].node = node;
  }
}

void BlockIndex::Erase(absl::Span<const BlockId> ids) {
  for (BlockId id : ids) {
    Shard& s = ShardFor(id);
    MutexLock lock(&s.mu);
    s.map.erase(id);
  }
}

std::optional<BlockOwner> BlockIndex::Find(BlockId id) const {
  const Shard& s = ShardFor(id);
  MutexLock lock(&s.mu);
  auto it = s.map.find(id);
  if (it == s.map.end()) return std::nullopt;
  return it->second;
}

size_t BlockIndex::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    MutexLock lock(&s.mu);
    n += s.map.size();
  }
  return n;
}

}  // namespace prefixd
