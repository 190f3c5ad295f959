// NamespaceTrees: one tenant's radix trees, one per namespace. A tree
// exists while it holds a block: the tenant marks a tree whose root lost a
// child, and drops the marked trees that are empty at the end of the call
// (not at once: the call's pending events still name them).
//
// Thread safety: none; the owning tenant's mutex guards it.
#ifndef PREFIXD_CORE_NAMESPACE_TREES_H_
#define PREFIXD_CORE_NAMESPACE_TREES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/radix_tree.h"

namespace prefixd {

class NamespaceTrees {
 public:
  using Map = absl::flat_hash_map<std::string, std::unique_ptr<Tree>>;

  // `fingerprints`: whether the trees' nodes keep their blocks'
  // fingerprints (Tree::fingerprints; the tenant's eviction policy says).
  NamespaceTrees(int block_size, bool fingerprints)
      : block_size_(block_size), fingerprints_(fingerprints) {}

  size_t size() const { return trees_.size(); }
  // nullptr if ns has no tree.
  Tree* Find(absl::string_view ns) const {
    auto it = trees_.find(ns);
    return it == trees_.end() ? nullptr : it->second.get();
  }
  // Every namespace that has a tree, sorted.
  std::vector<std::string> Namespaces() const;
  // Every tree by namespace, in no particular order.
  const Map& all() const { return trees_; }

  Tree* GetOrCreate(absl::string_view ns);
  // `tree`'s root lost a child: drop it at DropEmpty if it has none left.
  void MarkMaybeEmpty(const Tree& tree) { maybe_empty_.push_back(tree.ns); }
  void DropEmpty();
  void Clear() {
    trees_.clear();
    maybe_empty_.clear();
  }

  // Each tree is keyed by its namespace, non-empty, of the tenant's block
  // size and fingerprint setting, and its root belongs to it and has no
  // eviction entry.
  absl::Status CheckTrees() const;

 private:
  const int block_size_;
  const bool fingerprints_;
  Map trees_;
  std::vector<std::string> maybe_empty_;  // namespaces whose tree may be empty
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_NAMESPACE_TREES_H_
