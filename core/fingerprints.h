// BlockFingerprints: the fingerprint of every block one tenant caches, for
// ADAPTIVE's history (eviction.h), which remembers evicted blocks by them.
//
// A fingerprint is a 64-bit chain hash over the block's whole path and its
// namespace: absl::HashOf(parent's chain hash, the block's tokens), so equal
// tokens under another prefix are another block. Each cached block's is
// kept, in one vector per node, so that neither an Insert nor an eviction
// hashes more than the blocks it adds or removes, and an eviction finds its
// block's next to the last one's. Under LRU nothing is kept and every
// method is a no-op.
//
// Thread safety: none; the owning tenant's mutex guards it.
#ifndef PREFIXD_CORE_FINGERPRINTS_H_
#define PREFIXD_CORE_FINGERPRINTS_H_

#include <cassert>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/radix_tree.h"
#include "core/types.h"

namespace prefixd {

uint64_t NamespaceHash(absl::string_view ns);
uint64_t ChainHash(uint64_t parent, absl::Span<const Token> block);

class BlockFingerprints {
 public:
  // `kept`: whether the policy needs them (ADAPTIVE).
  explicit BlockFingerprints(bool kept) : kept_(kept) {}

  // The fingerprint the first block below `parent` chains from.
  uint64_t Above(const Node& parent) const;
  // Blocks appended to n (a new node or a leaf extended in place).
  void Append(const Node* n, absl::Span<const uint64_t> fps) {
    if (kept_) {
      std::vector<uint64_t>& v = fps_[n];
      v.insert(v.end(), fps.begin(), fps.end());
    }
  }
  // Computes those of all n's blocks (a snapshot's nodes).
  void Compute(const Node& n);
  // SplitAt moved tail's first `blocks` blocks to `head`.
  void Split(const Node* head, const Node* tail, size_t blocks);
  // The last `blocks` blocks of n go: calls f(fingerprint) for each, the
  // tail's first. The node's entry goes with its last block.
  template <typename F>
  void PopBack(const Node& n, size_t blocks, F&& f) {
    if (!kept_) return;
    auto it = fps_.find(&n);
    assert(it != fps_.end() && it->second.size() == n.num_blocks() &&
           blocks <= n.num_blocks());
    std::vector<uint64_t>& fps = it->second;
    for (size_t i = 0; i < blocks; ++i) {
      f(fps.back());
      fps.pop_back();
    }
    if (fps.empty()) fps_.erase(it);
  }
  // n is removed with all its blocks.
  void Drop(const Node* n) {
    if (kept_) fps_.erase(n);
  }
  void Clear() { fps_.clear(); }

  // n's blocks have their fingerprints (under LRU: nothing is kept).
  absl::Status CheckNode(const Node& n) const;
  // One vector per cached node (under LRU: none).
  absl::Status CheckCount(uint64_t nodes) const;

 private:
  const bool kept_;
  // node -> its blocks' fingerprints, in order.
  absl::flat_hash_map<const Node*, std::vector<uint64_t>> fps_;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_FINGERPRINTS_H_
