#include "core/radix_tree.h"

#include <algorithm>
#include <cstring>

#include "absl/hash/hash.h"

namespace prefixd {

BlockKey MakeBlockKey(absl::Span<const Token> block) {
  return BlockKey{block, absl::Hash<absl::Span<const Token>>()(block)};
}

size_t ChildHash::operator()(const std::unique_ptr<Node>& n) const {
  return n->key_hash;
}

bool ChildEq::operator()(const std::unique_ptr<Node>& a,
                         const std::unique_ptr<Node>& b) const {
  return a->key_hash == b->key_hash &&
         std::equal(a->block(0).begin(), a->block(0).end(),
                    b->block(0).begin());
}

bool ChildEq::operator()(const std::unique_ptr<Node>& a,
                         const BlockKey& k) const {
  return a->key_hash == k.hash &&
         std::memcmp(a->tokens.data(), k.tokens.data(),
                     k.tokens.size() * sizeof(Token)) == 0;
}

Node* Node::FindChild(absl::Span<const Token> first_block) const {
  auto it = children.find(MakeBlockKey(first_block));
  return it == children.end() ? nullptr : it->get();
}

std::vector<WalkStep> Walk(const Tree& tree, absl::Span<const Token> tokens,
                           int64_t position_offset,
                           bool stop_at_position_change) {
  const size_t bs = static_cast<size_t>(tree.root.block_size);
  const size_t query_blocks = tokens.size() / bs;
  std::vector<WalkStep> steps;
  steps.reserve(8);
  const Node* node = &tree.root;
  size_t i = 0;  // query block index
  while (i < query_blocks) {
    Node* child = node->FindChild(tokens.subspan(i * bs, bs));
    if (child == nullptr) break;
    if (stop_at_position_change &&
        child->position != position_offset + static_cast<int64_t>(i * bs)) {
      break;
    }
    // The first block matched by key. Compare the rest of the edge with one
    // memcmp (the common case: all of it matches); only on a difference find
    // the first differing block.
    const size_t len = std::min(child->tokens.size(), (query_blocks - i) * bs);
    const Token* cached = child->tokens.data();
    const Token* query = tokens.data() + i * bs;
    size_t same = len;
    if (std::memcmp(cached + bs, query + bs, (len - bs) * sizeof(Token)) != 0) {
      same = bs;
      while (std::memcmp(cached + same, query + same, bs * sizeof(Token)) == 0)
        same += bs;
    }
    const size_t k = same / bs;
    steps.push_back(WalkStep{child, k, i});
    i += k;
    if (k < child->num_blocks()) break;
    node = child;
  }
  return steps;
}

}  // namespace prefixd
