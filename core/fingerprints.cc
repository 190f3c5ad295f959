#include "core/fingerprints.h"

// Header-only: the hash inlines into the Insert path, and the daemon links
// no xxHash library.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace prefixd {

uint64_t NamespaceHash(absl::string_view ns) {
  return XXH3_64bits(ns.data(), ns.size());
}

uint64_t ChainHash(uint64_t parent, absl::Span<const Token> block) {
  return XXH3_64bits_withSeed(block.data(), block.size() * sizeof(Token),
                              parent);
}

uint64_t FingerprintAbove(const Node& parent) {
  if (parent.is_root()) return NamespaceHash(parent.tree->ns);
  return parent.fingerprints().back();
}

// The hash inlines here: an Insert calls this once for its new blocks.
void ChainFingerprints(const Node& parent, absl::Span<const Token> tokens,
                       absl::Span<uint64_t> out) {
  const size_t bs = static_cast<size_t>(parent.block_size());
  uint64_t fp = FingerprintAbove(parent);
  for (size_t i = 0; i < out.size(); ++i) {
    fp = ChainHash(fp, tokens.subspan(i * bs, bs));
    out[i] = fp;
  }
}

absl::Status CheckFingerprints(const Node& n) {
  const absl::Status wrong =
      absl::InternalError("a block's fingerprint is missing or wrong");
  const absl::Span<const uint64_t> fps = n.fingerprints();
  if (!n.tree->fingerprints) return fps.empty() ? absl::OkStatus() : wrong;
  if (fps.size() != n.num_blocks()) return wrong;
  uint64_t fp = FingerprintAbove(*n.parent);
  for (size_t i = 0; i < n.num_blocks(); ++i) {
    fp = ChainHash(fp, n.block(i));
    if (fps[i] != fp) return wrong;
  }
  return absl::OkStatus();
}

}  // namespace prefixd
