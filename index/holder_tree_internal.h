// The parts of HolderTree that its implementation files share
// (holder_tree.cc, holder_tree_check.cc, holder_tree_jobs.cc,
// holder_tree_score.cc): a slot's layout and the lookup by key. Not for
// anything else to include.
#ifndef PREFIXD_INDEX_HOLDER_TREE_INTERNAL_H_
#define PREFIXD_INDEX_HOLDER_TREE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "index/holder_tree.h"
#include "index/wide_child_sets.h"

namespace prefixd {

// One indexed block: where it sits (its node and its place in the node's
// edge), its rolling key (index/keys.h; a detached block's: its engine
// hash) and who holds it. A free slot has no node; its generation advances
// whenever it is freed.
struct HolderTree::Slot {
  Node* node = nullptr;
  uint64_t key = 0;
  uint32_t gen = 0;
  uint16_t pos = 0;                          // < kMaxEdgeBlocks
  absl::InlinedVector<uint32_t, 2> holders;  // PackHolder values, sorted
};
static_assert(HolderTree::kMaxEdgeBlocks <= UINT16_MAX + 1,
              "a slot's place in its edge is 16 bits");

// The live slots, found by (tree, key): sets of slot ids whose hash and
// equality read the key from the slot, so an entry costs 4 bytes. The hash
// is of the tree and the key: the same tokens under many LoRA adapters have
// the same rolling keys (a key depends on the salt, not on the adapter), and
// hashed alone they would pile up behind one hash. Equality compares the
// key, which it reads from the slot it hashed, before the node's tree.
//
// The slots are spread over kShards sets by their key, so that a set due to
// grow (or to be cleaned of tombstones) is copied aside alone (GrowthFor):
// a copy of the whole lookup of an index of a few million blocks stalled
// its event thread for a few hundred milliseconds; a set's copy is a
// sixty-fourth of it. Keys are hashes already, but a multiplicative mix
// picks the set, for detached blocks whose keys are an engine's hashes.
class HolderTree::KeyLookup {
 public:
  static constexpr size_t kShards = 64;
  struct Probe {
    const Tree* tree;
    uint64_t key;
  };
  struct Hash {
    using is_transparent = void;
    const HolderTree* owner;
    size_t operator()(uint32_t slot) const {
      const Slot& s = owner->slots_[slot];
      return absl::HashOf(s.node->tree, s.key);
    }
    size_t operator()(const Probe& p) const {
      return absl::HashOf(p.tree, p.key);
    }
  };
  struct Eq {
    using is_transparent = void;
    const HolderTree* owner;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(uint32_t slot, const Probe& p) const {
      const Slot& s = owner->slots_[slot];
      return s.key == p.key && s.node->tree == p.tree;
    }
    bool operator()(const Probe& p, uint32_t slot) const {
      return (*this)(slot, p);
    }
  };
  using Set = absl::flat_hash_set<uint32_t, Hash, Eq>;
  // A set due to grow before a store of `inserts`, and the entries its
  // copy makes room for.
  struct Due {
    size_t shard;
    size_t reserve;
  };

  explicit KeyLookup(const HolderTree* owner) : owner_(owner) {
    shards_.reserve(kShards);
    for (size_t i = 0; i < kShards; ++i)
      shards_.push_back({Set(0, Hash{owner}, Eq{owner}), 0});
  }
  static size_t ShardOf(uint64_t key) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 58);
  }
  static_assert(kShards == size_t{1} << (64 - 58), "ShardOf's shift");

  // Room for `slots` in all, spread as the keys spread (with a margin for
  // the sets that get more than their share).
  void Reserve(size_t slots) {
    if (slots == 0) return;
    const size_t each = slots / kShards + slots / (8 * kShards) + 64;
    for (Shard& shard : shards_) shard.slots.reserve(each);
  }
  // True if its set rehashed inside the insert with kGrowAsideFrom entries
  // or more (what GrowthFor is there to prevent).
  bool Insert(uint32_t slot) {
    Set& set = ShardOfSlot(slot).slots;
    const size_t capacity = set.capacity();
    set.insert(slot);
    return set.capacity() != capacity && set.size() > kGrowAsideFrom;
  }
  void Erase(uint32_t slot) {
    Shard& shard = ShardOfSlot(slot);
    shard.erased += shard.slots.erase(slot);
  }
  // The slot of `key` in `tree`, or -1.
  int64_t Find(const Tree* tree, uint64_t key) const {
    const Set& set = shards_[ShardOf(key)].slots;
    auto it = set.find(Probe{tree, key});
    return it == set.end() ? -1 : static_cast<int64_t>(*it);
  }
  size_t size() const {
    size_t n = 0;
    for (const Shard& shard : shards_) n += shard.slots.size();
    return n;
  }

  // The sets that a store of up to `inserts` slots could make rehash
  // (MayRehash, with the erasures since each set was made as the bound on
  // its tombstones), each to be copied into room for twice its entries and
  // the store's.
  std::vector<Due> DueFor(size_t inserts) const {
    std::vector<Due> due;
    for (size_t i = 0; i < kShards; ++i) {
      const Shard& shard = shards_[i];
      if (MayRehash(shard.slots.size(), shard.slots.capacity(), shard.erased,
                    inserts)) {
        due.push_back({i, 2 * shard.slots.size() + inserts});
      }
    }
    return due;
  }
  // A copy of set `due.shard`, with room for `due.reserve` entries. Reads
  // the tree only.
  Set CopyOf(const Due& due) const {
    const Set& from = shards_[due.shard].slots;
    Set copy(0, from.hash_function(), from.key_eq());
    copy.reserve(due.reserve);
    copy.insert(from.begin(), from.end());
    return copy;
  }
  // Puts `*set` (a CopyOf) in the place of the set it copied, and leaves
  // that one in `*set`.
  void Replace(size_t shard, Set* set) {
    shards_[shard].slots.swap(*set);
    shards_[shard].erased = 0;
  }

 private:
  struct Shard {
    Set slots;
    // Erasures since the set was made: at most its tombstones.
    uint64_t erased;
  };
  Shard& ShardOfSlot(uint32_t slot) {
    return shards_[ShardOf(owner_->slots_[slot].key)];
  }

  const HolderTree* const owner_;  // whose slots these are
  std::vector<Shard> shards_;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_HOLDER_TREE_INTERNAL_H_
