#include "core/fingerprints.h"

#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_format.h"

namespace prefixd {

// absl::HashOf, as the fleet index keys its blocks: fingerprints live only
// in this process's memory (a snapshot's are recomputed on load), so its
// per-process seed does no harm.
uint64_t NamespaceHash(absl::string_view ns) { return absl::HashOf(ns); }

uint64_t ChainHash(uint64_t parent, absl::Span<const Token> block) {
  return absl::HashOf(parent, block);
}

uint64_t BlockFingerprints::Above(const Node& parent) const {
  if (parent.is_root()) return NamespaceHash(parent.tree->ns);
  auto it = fps_.find(&parent);
  assert(it != fps_.end() && !it->second.empty());
  return it->second.back();
}

void BlockFingerprints::Compute(const Node& n) {
  if (!kept_) return;
  uint64_t fp = Above(*n.parent);
  std::vector<uint64_t>& v = fps_[&n];
  v.clear();
  for (size_t i = 0; i < n.num_blocks(); ++i)
    v.push_back(fp = ChainHash(fp, n.block(i)));
}

void BlockFingerprints::Split(const Node* head, const Node* tail,
                              size_t blocks) {
  if (!kept_) return;
  // The head's are copied out before fps_[head] inserts: a rehash moves
  // the tail's vector, and a reference to it would dangle.
  std::vector<uint64_t>& t = fps_[tail];
  assert(t.size() > blocks);
  std::vector<uint64_t> first(t.begin(), t.begin() + blocks);
  t.erase(t.begin(), t.begin() + blocks);
  fps_[head] = std::move(first);
}

absl::Status BlockFingerprints::CheckNode(const Node& n) const {
  const absl::Status wrong =
      absl::InternalError("a block's fingerprint is missing or wrong");
  if (!kept_) return fps_.empty() ? absl::OkStatus() : wrong;
  if (!n.parent->is_root()) {
    auto p = fps_.find(n.parent);
    if (p == fps_.end() || p->second.size() != n.parent->num_blocks())
      return wrong;
  }
  auto it = fps_.find(&n);
  if (it == fps_.end() || it->second.size() != n.num_blocks()) return wrong;
  uint64_t fp = Above(*n.parent);
  for (size_t i = 0; i < n.num_blocks(); ++i) {
    fp = ChainHash(fp, n.block(i));
    if (it->second[i] != fp) return wrong;
  }
  return absl::OkStatus();
}

absl::Status BlockFingerprints::CheckCount(uint64_t nodes) const {
  if (fps_.size() == (kept_ ? nodes : 0)) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "fingerprints of %d nodes, %d nodes cached", fps_.size(), nodes));
}

}  // namespace prefixd
