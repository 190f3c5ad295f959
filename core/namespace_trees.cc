#include "core/namespace_trees.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace prefixd {

std::vector<std::string> NamespaceTrees::Namespaces() const {
  std::vector<std::string> out;
  for (const auto& [ns, tree] : trees_) out.push_back(ns);
  std::sort(out.begin(), out.end());
  return out;
}

Tree* NamespaceTrees::GetOrCreate(absl::string_view ns) {
  auto& slot = trees_[ns];
  if (slot == nullptr) {
    slot = std::make_unique<Tree>(std::string(ns), block_size_);
    slot->fingerprints = fingerprints_;
  }
  return slot.get();
}

void NamespaceTrees::DropEmpty() {
  for (const std::string& ns : maybe_empty_) {
    auto it = trees_.find(ns);
    if (it != trees_.end() && it->second->root.children.empty())
      trees_.erase(it);
  }
  maybe_empty_.clear();
}

absl::Status NamespaceTrees::CheckTrees() const {
  for (const auto& [ns, tree] : trees_) {
    if (tree->ns != ns)
      return absl::InternalError("tree keyed under another namespace");
    if (tree->root.children.empty())
      return absl::InternalError(absl::StrCat("empty tree '", ns, "' kept"));
    if (tree->block_size != block_size_) {
      return absl::InternalError(
          absl::StrFormat("tree '%s' has block_size %d, the tenant %d", ns,
                          tree->block_size, block_size_));
    }
    if (tree->fingerprints != fingerprints_)
      return absl::InternalError(absl::StrCat(
          "tree '", ns, "' does not keep fingerprints as the tenant does"));
    if (tree->root.tree != tree.get())
      return absl::InternalError("root points at another tree");
    if (tree->root.class_priority_stamp != 0)
      return absl::InternalError("a root has an LRU entry or a class");
  }
  return absl::OkStatus();
}

}  // namespace prefixd
