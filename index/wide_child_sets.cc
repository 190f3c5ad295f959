#include "index/wide_child_sets.h"

namespace prefixd {

bool MayRehash(size_t size, size_t capacity, uint64_t erased, size_t inserts) {
  return size >= WideChildSets::kFrom &&
         size + erased + inserts > capacity - capacity / 8;
}

bool WideChildSets::Added(Node* parent, size_t capacity_before) {
  const size_t size = parent->children.size();
  if (size < kFrom) return false;
  const bool rehashed = parent->children.capacity() != capacity_before;
  auto it = erased_.try_emplace(parent, kUnknown).first;
  if (rehashed) it->second = 0;  // a new table: no tombstones
  return rehashed && size > kFrom;
}

void WideChildSets::Erased(Node* parent) {
  auto it = erased_.find(parent);
  if (it == erased_.end()) return;
  if (parent->children.size() < kFrom / 2) {
    erased_.erase(it);
  } else if (it->second != kUnknown) {
    ++it->second;
  }
}

std::vector<WideChildSets::Due> WideChildSets::DueFor(size_t inserts) const {
  std::vector<Due> due;
  for (const auto& [node, erased] : erased_) {
    const ChildSet& set = node->children;
    if (erased == kUnknown ||
        MayRehash(set.size(), set.capacity(), erased, inserts)) {
      due.push_back({node, 2 * set.size() + inserts});
    }
  }
  return due;
}

}  // namespace prefixd
