// WideChildSets: the nodes of the fleet index's trees whose children a
// store could make rehash in one go.
//
// A node's children are core's ChildSet (core/radix_tree.h), one absl set
// per node. absl rehashes a set whole, O(size), inside the insert that
// finds its entries and tombstones past 7/8 of its capacity. A root with
// 200,000 children (distinct first blocks, or detached engine hashes) would
// do so inside one slice of a store, with Routes waiting. So the nodes with
// kFrom children or more are listed here with the erasures from their set
// since it was made (an upper bound on its tombstones), and before each
// slice HolderTree::GrowthFor copies the sets that the slice's inserts
// could make rehash (HolderTree::Growth).
//
// The list's owner reports every change to a listed set's size
// (Added, Erased) and every node it frees (Forget): a node stays listed
// while it has kFrom / 2 children or more. A node listed as it passes kFrom
// has an unknown count of tombstones (its set grew in place) and is due at
// once; copying a set of kFrom entries aside costs a few microseconds.
//
// Thread safety: none; the owner's (HolderTree's).
#ifndef PREFIXD_INDEX_WIDE_CHILD_SETS_H_
#define PREFIXD_INDEX_WIDE_CHILD_SETS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/radix_tree.h"

namespace prefixd {

class WideChildSets {
 public:
  static constexpr size_t kFrom = 4096;

  // After a child was added to `parent`, whose set had `capacity_before`.
  // Returns true if the set rehashed with kFrom entries or more (the
  // insert was not foreseen by Due).
  bool Added(Node* parent, size_t capacity_before);
  // After a child was taken out of `parent`'s set.
  void Erased(Node* parent);
  // `node` is about to be freed.
  void Forget(Node* node) { erased_.erase(node); }

  // A listed set that `inserts` more children could make rehash, and the
  // capacity its copy needs: twice its entries plus the inserts.
  struct Due {
    Node* node;
    size_t reserve;
  };
  std::vector<Due> DueFor(size_t inserts) const;
  // `node`'s set was replaced by a copy: no tombstones.
  void Rebuilt(Node* node) { erased_[node] = 0; }

  bool empty() const { return erased_.empty(); }
  size_t size() const { return erased_.size(); }
  bool contains(const Node* node) const { return erased_.contains(node); }

 private:
  static constexpr uint64_t kUnknown = UINT64_MAX;
  // Listed node -> erasures from its set since it was made.
  absl::flat_hash_map<Node*, uint64_t> erased_;
};

// Whether `inserts` more entries may make an absl table of `size` entries
// and `capacity` slots rehash: it grows, or cleans out its tombstones (at
// most `erased`), once its entries and tombstones would pass 7/8 of its
// capacity. Tables below WideChildSets::kFrom entries are left to rehash
// in place.
bool MayRehash(size_t size, size_t capacity, uint64_t erased, size_t inserts);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_WIDE_CHILD_SETS_H_
