// Block fingerprints: the 64-bit name of a cached block by which the
// eviction policies that remember evicted blocks (eviction.h: ADAPTIVE and
// SHADOW) know it again, and by which SHADOW samples blocks for its shadow
// caches.
//
// A fingerprint is a chain hash over the block's whole path and its
// namespace: XXH3 (xxHash) of the block's tokens, seeded with the parent
// block's fingerprint (a tree's first blocks chain from the hash of the
// namespace), so equal tokens under another prefix are another block. XXH3
// has no per-process seed: a given sequence of calls gives the same
// fingerprints, samples and evictions in every process. Trees of such a
// policy keep each cached block's fingerprint in its node
// (Node::fingerprints), so that an Insert hashes only the blocks it adds
// and an eviction hashes nothing.
//
// Thread safety: pure functions.
#ifndef PREFIXD_CORE_FINGERPRINTS_H_
#define PREFIXD_CORE_FINGERPRINTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/radix_tree.h"
#include "core/types.h"

namespace prefixd {

uint64_t NamespaceHash(absl::string_view ns);
uint64_t ChainHash(uint64_t parent, absl::Span<const Token> block);

// The fingerprint the first block below `parent` chains from.
// REQUIRES: parent's tree keeps fingerprints.
uint64_t FingerprintAbove(const Node& parent);

// The fingerprints of the first out.size() whole blocks of `tokens` below
// `parent`, in order, into out.
void ChainFingerprints(const Node& parent, absl::Span<const Token> tokens,
                       absl::Span<uint64_t> out);

// n's blocks have their fingerprints (in a tree that keeps them; else n
// has none).
absl::Status CheckFingerprints(const Node& n);

}  // namespace prefixd

#endif  // PREFIXD_CORE_FINGERPRINTS_H_
