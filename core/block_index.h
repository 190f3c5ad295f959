// BlockIndex: the daemon-wide map from block ID to the tenant and node that
// cache it. It enforces that an ID is cached at most once across all tenants
// and lets Invalidate find a block's node. Sharded so that tenants adopting
// blocks concurrently rarely meet on one mutex.
#ifndef PREFIXD_CORE_BLOCK_INDEX_H_
#define PREFIXD_CORE_BLOCK_INDEX_H_

#include <array>
#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "core/mutex.h"
#include "core/types.h"

namespace prefixd {

struct Node;

struct BlockOwner {
  uint32_t tenant = 0;   // Tenant::index()
  Node* node = nullptr;  // nullptr while claimed by an Insert in progress
};

// Thread safety: every method is safe to call concurrently. A node pointer
// read from the index may only be dereferenced under the owning tenant's
// mutex.
class BlockIndex {
 public:
  // Claims every id for `tenant` (with no node yet), or none: if an id is
  // already present, returns it in *taken and claims nothing.
  bool ClaimAll(absl::Span<const BlockId> ids, uint32_t tenant, BlockId* taken);
  // Points claimed or owned ids at `node`.
  void SetNode(absl::Span<const BlockId> ids, Node* node);
  void Erase(absl::Span<const BlockId> ids);
  void Erase(BlockId id) { Erase(absl::MakeConstSpan(&id, 1)); }
  std::optional<BlockOwner> Find(BlockId id) const;
  bool Contains(BlockId id) const { return Find(id).has_value(); }
  size_t size() const;

 private:
  static constexpr size_t kShards = 16;
  struct Shard {
    mutable Mutex mu;
    absl::flat_hash_map<BlockId, BlockOwner> map ABSL_GUARDED_BY(mu);
  };
  Shard& ShardFor(BlockId id) { return shards_[Mix(id) % kShards]; }
  const Shard& ShardFor(BlockId id) const { return shards_[Mix(id) % kShards]; }
  static uint64_t Mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    return x ^ (x >> 33);
  }
  std::array<Shard, kShards> shards_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_BLOCK_INDEX_H_
