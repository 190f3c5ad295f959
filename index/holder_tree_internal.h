// The parts of HolderTree that its implementation files share
// (holder_tree.cc, holder_tree_check.cc, holder_tree_jobs.cc,
// holder_tree_score.cc): a slot's layout and the lookup by key. Not for
// anything else to include.
#ifndef PREFIXD_INDEX_HOLDER_TREE_INTERNAL_H_
#define PREFIXD_INDEX_HOLDER_TREE_INTERNAL_H_

#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "index/holder_tree.h"

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

// The live slots, found by (tree, key): a set of slot ids whose hash and
// equality read the key from the slot, so an entry costs 4 bytes. The hash
// is of the tree and the key: the same tokens under many LoRA adapters have
// the same rolling keys (a key depends on the salt, not on the adapter), and
// hashed alone they would pile up behind one hash. Equality compares the
// key, which it reads from the slot it hashed, before the node's tree.
class HolderTree::KeyLookup {
 public:
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

  explicit KeyLookup(const HolderTree* owner)
      : slots_(0, Hash{owner}, Eq{owner}) {}
  void Reserve(size_t slots) { slots_.reserve(slots); }
  // True if the set rehashed to make room.
  bool Insert(uint32_t slot) {
    const size_t capacity = slots_.capacity();
    slots_.insert(slot);
    return slots_.capacity() != capacity;
  }
  void Erase(uint32_t slot) { erased_ += slots_.erase(slot); }
  // Adds every slot of `from` (a lookup of the same tree).
  void InsertAll(const KeyLookup& from) {
    slots_.insert(from.slots_.begin(), from.slots_.end());
  }
  // Adds every slot in a tree, read in slot order: what a complete lookup
  // holds, without visiting its entries in their scattered order (the
  // slots are read in sequence, and only their nodes at random).
  void InsertLive() {
    const HolderTree* owner = slots_.hash_function().owner;
    for (size_t id = 0; id < owner->slots_.size(); ++id) {
      if (owner->slots_[id].node != nullptr)
        slots_.insert(static_cast<uint32_t>(id));
    }
  }
  // The slot of `key` in `tree`, or -1.
  int64_t Find(const Tree* tree, uint64_t key) const {
    auto it = slots_.find(Probe{tree, key});
    return it == slots_.end() ? -1 : static_cast<int64_t>(*it);
  }
  size_t size() const { return slots_.size(); }
  size_t capacity() const { return slots_.capacity(); }
  // Erasures since the set was made: at most its tombstones.
  uint64_t erased() const { return erased_; }

 private:
  absl::flat_hash_set<uint32_t, Hash, Eq> slots_;
  uint64_t erased_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_HOLDER_TREE_INTERNAL_H_
