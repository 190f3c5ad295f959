#include "core/radix_tree.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
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
         std::memcmp(a->token_data(), k.tokens.data(),
                     k.tokens.size() * sizeof(Token)) == 0;
}

void Node::Rebuild(const Part& a, const Part& b) {
  const size_t blocks = a.ids.size() + b.ids.size();
  const bool fps = keeps_fingerprints();
  assert(a.tokens.size() + b.tokens.size() ==
         blocks * static_cast<size_t>(block_size()));
  assert(!fps || a.fps.size() + b.fps.size() == blocks);
  assert(blocks <= UINT32_MAX);
  const size_t bytes =
      fps ? FingerprintsOffset(blocks) + blocks * sizeof(uint64_t)
          : FingerprintsOffset(blocks);
  auto data = std::make_unique_for_overwrite<std::byte[]>(bytes);
  // Each array is the two parts' back to back.
  auto put = [](std::byte* to, auto first, auto second) {
    using T = typename decltype(first)::value_type;
    if (!first.empty()) std::memcpy(to, first.data(), first.size() * sizeof(T));
    if (!second.empty())
      std::memcpy(to + first.size() * sizeof(T), second.data(),
                  second.size() * sizeof(T));
  };
  put(data.get(), a.tokens, b.tokens);
  put(data.get() + IdsOffset(blocks), a.ids, b.ids);
  if (fps) put(data.get() + FingerprintsOffset(blocks), a.fps, b.fps);
  data_ = std::move(data);
  num_blocks_ = static_cast<uint32_t>(blocks);
}

void Node::Assign(absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
                  absl::Span<const uint64_t> fps) {
  Rebuild({tokens, ids, fps}, {});
  key_hash = MakeBlockKey(block(0)).hash;
}

void Node::Append(absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
                  absl::Span<const uint64_t> fps) {
  Rebuild(Whole(), {tokens, ids, fps});
}

void Node::DropFront(size_t blocks) {
  assert(blocks < num_blocks_);
  const size_t bs = static_cast<size_t>(block_size());
  const Part all = Whole();
  Rebuild({all.tokens.subspan(blocks * bs), all.ids.subspan(blocks),
           all.fps.subspan(std::min(blocks, all.fps.size()))},
          {});
  key_hash = MakeBlockKey(block(0)).hash;
}

void Node::DropBack(size_t blocks) {
  assert(blocks > 0 && num_blocks_ > blocks);
  // The IDs, then the fingerprints, move down to the new end of the tokens
  // (each lands below where it was, so neither overwrites what is still to
  // move); the allocation keeps its size until the node is rebuilt or freed.
  const size_t n = num_blocks_, kept = n - blocks;
  std::memmove(data_.get() + IdsOffset(kept), data_.get() + IdsOffset(n),
               kept * sizeof(BlockId));
  if (keeps_fingerprints()) {
    std::memmove(data_.get() + FingerprintsOffset(kept),
                 data_.get() + FingerprintsOffset(n), kept * sizeof(uint64_t));
  }
  num_blocks_ = static_cast<uint32_t>(kept);
}

Node* Node::FindChild(absl::Span<const Token> first_block) const {
  // Most inner nodes have one or two children: comparing their first blocks
  // costs less than hashing the query block for a probe.
  if (children.size() <= 2) {
    for (const auto& c : children) {
      const Token* key = reinterpret_cast<const Token*>(c->data_.get());
      if (key[0] == first_block[0] &&
          std::memcmp(key, first_block.data(),
                      first_block.size() * sizeof(Token)) == 0) {
        return c.get();
      }
    }
    return nullptr;
  }
  auto it = children.find(MakeBlockKey(first_block));
  return it == children.end() ? nullptr : it->get();
}

Node* SplitNode(Node* node, size_t blocks) {
  assert(blocks > 0 && blocks < node->num_blocks());
  Node* parent = node->parent;
  auto handle =
      parent->children.extract(BlockKey{node->block(0), node->key_hash});
  assert(!handle.empty());
  std::unique_ptr<Node> owned = std::move(handle.value());

  auto head = std::make_unique<Node>();
  const size_t split_tokens = blocks * static_cast<size_t>(node->block_size());
  head->tree = node->tree;
  head->parent = parent;
  head->Assign(node->tokens().subspan(0, split_tokens),
               node->block_ids().subspan(0, blocks),
               node->fingerprints().subspan(
                   0, std::min(blocks, node->fingerprints().size())));
  head->position = node->position;
  head->stamp = node->stamp;
  head->pins = node->pins;

  node->DropFront(blocks);
  node->position += static_cast<int64_t>(split_tokens);
  node->parent = head.get();

  Node* h = head.get();
  h->children.insert(std::move(owned));
  parent->children.insert(std::move(head));
  ++h->tree->nodes;
  return h;
}

Node* AddChild(Node* parent, absl::Span<const Token> tokens,
               absl::Span<const BlockId> ids, int64_t position,
               absl::Span<const uint64_t> fps) {
  auto child = std::make_unique<Node>();
  child->tree = parent->tree;
  child->parent = parent;
  child->Assign(tokens, ids, fps);
  child->position = position;
  Node* raw = child.get();
  auto [it, inserted] = parent->children.insert(std::move(child));
  assert(inserted);
  (void)it;
  (void)inserted;
  ++parent->tree->nodes;
  return raw;
}

void RemoveLeaf(Node* node) {
  assert(!node->is_root() && node->children.empty());
  Tree* tree = node->tree;
  auto handle =
      node->parent->children.extract(BlockKey{node->block(0), node->key_hash});
  assert(!handle.empty());
  --tree->nodes;
  // `handle` frees the node here.
}

WalkPath Walk(const Tree& tree, absl::Span<const Token> tokens,
              int64_t position_offset, bool stop_at_position_change,
              const Node** refused) {
  const size_t bs = static_cast<size_t>(tree.block_size);
  const size_t query_blocks = tokens.size() / bs;
  WalkPath steps;
  const Node* node = &tree.root;
  size_t i = 0;  // query block index
  while (i < query_blocks) {
    Node* child = node->FindChild(tokens.subspan(i * bs, bs));
    if (child == nullptr) break;
    if (stop_at_position_change &&
        child->position != position_offset + static_cast<int64_t>(i * bs)) {
      if (refused != nullptr) *refused = child;
      break;
    }
    // The first block matched by key. Compare the rest of the edge with one
    // memcmp (the common case: all of it matches); only on a difference find
    // the first differing block.
    const size_t len = std::min(child->num_blocks(), query_blocks - i) * bs;
    const Token* cached = child->token_data();
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
