// The radix tree of one (tenant, namespace): nodes, edges and child lookup.
//
// Every edge holds whole blocks: `tokens` is a multiple of block_size long and
// `block_ids[i]` names the KV slot of tokens [i*bs, (i+1)*bs). Children are
// keyed by their first block's tokens, so at most one child starts with any
// given block. A chain of single children is stored as one node (rax-style
// compression); a node is split only at a block boundary, where a match ends
// or an insert diverges:
//
//   before: root -> [A B C]           Match [A B] splits after B:
//   after:  root -> [A B] -> [C]      [A B] gets the match's stamp, [C] keeps
//                                     its older one and stays the LRU leaf.
//
// The tree knows nothing of budgets, leases or locking: Tenant (tenant.h)
// owns trees and keeps their bookkeeping.
#ifndef PREFIXD_CORE_RADIX_TREE_H_
#define PREFIXD_CORE_RADIX_TREE_H_

#include <cassert>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "core/types.h"

namespace prefixd {

class Node;
struct Tree;

// A lookup key: the tokens of one block and their hash.
struct BlockKey {
  absl::Span<const Token> tokens;
  size_t hash;
};
BlockKey MakeBlockKey(absl::Span<const Token> block);

// Child sets hash a node by its first block; lookups use a BlockKey.
struct ChildHash {
  using is_transparent = void;
  size_t operator()(const std::unique_ptr<Node>& n) const;
  size_t operator()(const BlockKey& k) const { return k.hash; }
};
struct ChildEq {
  using is_transparent = void;
  bool operator()(const std::unique_ptr<Node>& a,
                  const std::unique_ptr<Node>& b) const;
  bool operator()(const std::unique_ptr<Node>& a, const BlockKey& k) const;
  bool operator()(const BlockKey& k, const std::unique_ptr<Node>& a) const {
    return (*this)(a, k);
  }
};
using ChildSet = absl::flat_hash_set<std::unique_ptr<Node>, ChildHash, ChildEq>;

// A node's tokens and block IDs live in one exact-size allocation (tokens,
// then the IDs at the next 8-byte boundary): at 10^7 cached tokens a node
// holds about 12 blocks, and two vectors cost 5 bytes per cached block more
// (docs/performance.md, target 4). In a tree that keeps fingerprints
// (Tree::fingerprints: the eviction policies that remember evicted blocks,
// core/fingerprints.h) each block's 64-bit fingerprint follows the IDs in
// the same allocation. The block size is the tree's (every node points at
// its tree, which is hot), so that a node stays at 104 bytes.
class Node {
 public:
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

 private:
  // First, next to key_hash: a lookup reads the key and the tokens pointer
  // of a child it has not touched yet, and both sit in one cache line.
  std::unique_ptr<std::byte[]> data_;
  uint32_t num_blocks_ = 0;

 public:
  // Leases (and in-flight inserts) whose path runs through here.
  int32_t pins = 0;
  // Hash of the first block (children of the parent are keyed by it).
  size_t key_hash = 0;
  Tree* tree = nullptr;
  Node* parent = nullptr;  // nullptr for the root
  int64_t position = 0;    // absolute position tokens[0] was computed at
  uint64_t stamp = 0;      // recency: the logical time of the last touch
  // The node's eviction class, retention priority and the stamp of its
  // entry in its tenant's eviction set, packed into one word
  // (core/class_priority_stamp.h); 0 for a root and a fresh node.
  uint64_t class_priority_stamp = 0;
  ChildSet children;

  int block_size() const;  // tokens per block: the tree's
  // The first token of the edge (the key of the first block), without the
  // block size.
  const Token* token_data() const {
    return reinterpret_cast<const Token*>(data_.get());
  }
  absl::Span<const Token> tokens() const {
    return {token_data(),
            size_t{num_blocks_} * static_cast<size_t>(block_size())};
  }
  absl::Span<const BlockId> block_ids() const {
    return {
        reinterpret_cast<const BlockId*>(data_.get() + IdsOffset(num_blocks_)),
        num_blocks_};
  }
  // One per block if the tree keeps fingerprints, else empty.
  absl::Span<const uint64_t> fingerprints() const {
    return {reinterpret_cast<const uint64_t*>(data_.get() +
                                              FingerprintsOffset(num_blocks_)),
            keeps_fingerprints() ? num_blocks_ : 0};
  }
  bool is_root() const { return parent == nullptr; }
  size_t num_blocks() const { return num_blocks_; }
  absl::Span<const Token> block(size_t i) const {
    assert(i < num_blocks_);
    const size_t bs = static_cast<size_t>(block_size());
    return {token_data() + i * bs, bs};
  }
  int64_t end_position() const {
    return position + static_cast<int64_t>(num_blocks_) * block_size();
  }
  // A node is evictable from its tail when nothing hangs below it and no
  // lease pins it.
  bool evictable() const { return !is_root() && children.empty() && pins == 0; }

  // Edge edits. `tokens` must be ids.size() whole blocks, and `fps` one
  // fingerprint per block if the tree keeps them, else empty. Assign
  // replaces the edge, Append extends it, DropFront(k) keeps blocks [k, n)
  // and DropBack(k) removes the last k. Only Assign and DropFront recompute
  // key_hash.
  // REQUIRES: `tree` is set.
  void Assign(absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
              absl::Span<const uint64_t> fps = {});
  void Append(absl::Span<const Token> tokens, absl::Span<const BlockId> ids,
              absl::Span<const uint64_t> fps = {});
  void DropFront(size_t blocks);
  void DropBack(size_t blocks = 1);

  Node* FindChild(absl::Span<const Token> first_block) const;

 private:
  // One part of an edge: whole blocks' tokens, IDs and fingerprints.
  struct Part {
    absl::Span<const Token> tokens;
    absl::Span<const BlockId> ids;
    absl::Span<const uint64_t> fps;
  };
  Part Whole() const { return {tokens(), block_ids(), fingerprints()}; }

  bool keeps_fingerprints() const;
  size_t IdsOffset(size_t blocks) const {
    const size_t token_bytes =
        blocks * static_cast<size_t>(block_size()) * sizeof(Token);
    return (token_bytes + alignof(BlockId) - 1) & ~(alignof(BlockId) - 1);
  }
  size_t FingerprintsOffset(size_t blocks) const {
    return IdsOffset(blocks) + blocks * sizeof(BlockId);
  }
  // Replaces the edge with the concatenation of two parts.
  void Rebuild(const Part& a, const Part& b);
};

// Memory per cached block is a target (docs/performance.md, target 4): a
// field more must make room for itself.
static_assert(sizeof(Node) <= 104, "Node grew past 104 bytes");

struct Tree {
  Tree(std::string ns_, int block_size_)
      : ns(std::move(ns_)), block_size(block_size_) {
    root.tree = this;
  }
  std::string ns;
  const int block_size;  // tokens per block, for every node of the tree
  // Whether every node keeps its blocks' fingerprints (Node::fingerprints);
  // set before the first node is added.
  bool fingerprints = false;
  Node root;
  uint64_t nodes = 0;  // excluding the root
  uint64_t blocks = 0;
};

inline int Node::block_size() const { return tree->block_size; }
inline bool Node::keeps_fingerprints() const { return tree->fingerprints; }

// One step of a walk from the root: `blocks` leading blocks of `node` matched
// the query from query block index `first_block` on.
struct WalkStep {
  Node* node;
  size_t blocks;
  size_t first_block;
};

// A walk's steps; inline up to 16 nodes (an 8k-token match on a tree that
// branches every 512 tokens) so that a Match allocates nothing for them.
using WalkPath = absl::InlinedVector<WalkStep, 16>;

// Follows whole blocks of `tokens` (tokens.size() / block_size of them) from
// the root. When `stop_at_position_change` is set (RoPE DENY), the walk stops
// before any node whose cached position differs from the requested one,
// taking `position_offset` as the position of tokens[0]; if `refused` is not
// null it is then set to that node (whose first block matched the query),
// so that a caller can say why the match is short. Untouched otherwise.
WalkPath Walk(const Tree& tree, absl::Span<const Token> tokens,
              int64_t position_offset, bool stop_at_position_change,
              const Node** refused = nullptr);

// Structural edits, shared by the sidecar's tenants (core/tenant.h) and the
// fleet index (index/fleet_index.h). They keep child sets and tree.nodes
// right; block counts, block lookups and eviction order are the caller's.
//
//   parent -> [b0 .. bk-1 | bk .. bm-1] -> children
// becomes
//   parent -> head [b0 .. bk-1] -> node [bk .. bm-1] -> children
// `node` keeps its identity (whatever points at it stays valid: leases, LRU
// entries, block lookups of the tail) and its children; the new head
// inherits position, stamp and pins. Returns the head.
// REQUIRES: 0 < blocks < node->num_blocks().
Node* SplitNode(Node* node, size_t blocks);
// A new child of `parent` holding `tokens` / `ids` (and `fps`, in a tree
// that keeps fingerprints), computed at `position`.
// REQUIRES: parent has no child starting with tokens' first block.
Node* AddChild(Node* parent, absl::Span<const Token> tokens,
               absl::Span<const BlockId> ids, int64_t position,
               absl::Span<const uint64_t> fps = {});
// Unlinks a childless non-root node from its parent and frees it.
void RemoveLeaf(Node* node);

// Pre-order visit of every node below (not including) `from`.
template <typename F>
void ForEachBelow(const Node& from, F&& f, int depth = 1) {
  for (const auto& child : from.children) {
    f(*child, depth);
    ForEachBelow(*child, f, depth + 1);
  }
}

}  // namespace prefixd

#endif  // PREFIXD_CORE_RADIX_TREE_H_
