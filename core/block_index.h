// BlockIndex: the daemon-wide map from block ID to the tenant and node that
// cache it. It enforces that an ID is cached at most once across all tenants
// and lets Invalidate find a block's node.
//
// Engines name blocks by the slot numbers of their KV pool, so the IDs in use
// are dense. The index therefore stores them in pages of kPageSize
// consecutive IDs, one 8-byte word per ID (tenant in the top 16 bits, node
// pointer below), found through a map from page number. A dense pool costs
// about 9.4 bytes per cached block; a hash map of (ID, owner) pairs cost 42 at
// 10^7 cached tokens (docs/performance.md, target 4). The worst case, one ID
// per page, costs one page (272 bytes) per ID, and the budget bounds how many
// IDs are cached. Pages are sharded by page number so that tenants adopting
// blocks concurrently rarely meet on one mutex, and a run of IDs in one page
// takes its shard's lock once.
#ifndef PREFIXD_CORE_BLOCK_INDEX_H_
#define PREFIXD_CORE_BLOCK_INDEX_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "core/types.h"

namespace prefixd {

class Node;

struct BlockOwner {
  uint32_t tenant = 0;   // Tenant::index()
  Node* node = nullptr;  // nullptr while claimed by an Insert in progress
};

// Thread safety: every method is safe to call concurrently. A node pointer
// read from the index may only be dereferenced under the owning tenant's
// mutex.
class BlockIndex {
 public:
  // Tenant indices must be below this (the owner word keeps 16 bits).
  static constexpr uint32_t kMaxTenants = 0xffff;
  static constexpr int kPageBits = 5;
  static constexpr uint64_t kPageSize = uint64_t{1} << kPageBits;

  // Claims every id for `tenant` (with no node yet), or none: if an id is
  // already present (or appears twice in `ids`), sets *failed to its first
  // such position in `ids` and claims nothing.
  bool ClaimAll(absl::Span<const BlockId> ids, uint32_t tenant, size_t* failed);
  // Points claimed or owned ids at `node`, keeping their tenant.
  void SetNode(absl::Span<const BlockId> ids, Node* node);
  // Removes ids (absent ones are ignored).
  void Erase(absl::Span<const BlockId> ids);
  void Erase(BlockId id) { Erase(absl::MakeConstSpan(&id, 1)); }
  std::optional<BlockOwner> Find(BlockId id) const;
  bool Contains(BlockId id) const { return Find(id).has_value(); }
  size_t size() const;
  // Pages allocated (for tests and memory accounting).
  size_t pages() const;

 private:
  struct Page {
    std::array<uint64_t, kPageSize> words{};  // 0: absent
    uint32_t used = 0;
  };
  static constexpr size_t kShards = 16;
  struct Shard {
    mutable Mutex mu;
    absl::flat_hash_map<uint64_t, std::unique_ptr<Page>> pages
        ABSL_GUARDED_BY(mu);
    size_t size ABSL_GUARDED_BY(mu) = 0;
  };

  static uint64_t PageOf(BlockId id) { return id >> kPageBits; }
  static size_t Slot(BlockId id) { return id & (kPageSize - 1); }
  static uint64_t Pack(uint32_t tenant, const Node* node);
  static BlockOwner Unpack(uint64_t word);
  Shard& ShardFor(uint64_t page) { return shards_[Mix(page) % kShards]; }
  const Shard& ShardFor(uint64_t page) const {
    return shards_[Mix(page) % kShards];
  }
  static uint64_t Mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    return x ^ (x >> 33);
  }
  std::array<Shard, kShards> shards_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_BLOCK_INDEX_H_
