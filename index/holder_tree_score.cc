// HolderTree's read side: the walks that feed a PrefixScorer.
#include <algorithm>
#include <atomic>

#include "index/holder_tree.h"
#include "index/holder_tree_internal.h"

namespace prefixd {
namespace {

// A prompt's block fingerprints, computed as the walk reaches them, kChunk
// blocks at a time: a long prompt whose match ends early costs about its
// matched blocks' hashes, not all of them, and the hashes of a chunk, which
// do not depend on each other, overlap in the CPU.
class LazyFingerprints {
 public:
  static constexpr size_t kChunk = 8;

  LazyFingerprints(const KeyScheme& scheme, const PromptKeys& prompt, size_t bs)
      : scheme_(scheme),
        prompt_(prompt),
        bs_(bs),
        blocks_(prompt.tokens.size() / bs) {}

  size_t blocks() const { return blocks_; }

  // Block b's fingerprint as the tree stores it. REQUIRES: b = 0, 1, ... in
  // order.
  absl::Span<const Token> Get(size_t b) {
    if (b == chunk_end_) Fill(b);
    return absl::MakeConstSpan(out_ + kKeyTokens * (b - chunk_begin_),
                               kKeyTokens);
  }

 private:
  void Fill(size_t b) {
    chunk_begin_ = b;
    chunk_end_ = std::min(blocks_, b + kChunk);
    for (size_t i = b; i < chunk_end_; ++i) {
      absl::Span<const ContentKey> extra;
      if (prompt_.content != nullptr) extra = prompt_.content->Of(i);
      StoreKey(scheme_.Fingerprint(prompt_.tokens.subspan(i * bs_, bs_), extra),
               out_ + kKeyTokens * (i - b));
    }
  }

  const KeyScheme& scheme_;
  const PromptKeys& prompt_;
  const size_t bs_;
  const size_t blocks_;
  size_t chunk_begin_ = 0;
  size_t chunk_end_ = 0;
  Token out_[kKeyTokens * kChunk];
};

// Recency stamps: other Scores may stamp the same node concurrently.
void Stamp(const Node* node, uint64_t stamp) {
  std::atomic_ref<uint64_t>(const_cast<Node*>(node)->stamp)
      .store(stamp, std::memory_order_relaxed);
}

// A PrefixScorer that also keeps each block's holders, and has the walk go
// on to the end of the match once the scorer is done.
class RecordingScorer {
 public:
  RecordingScorer(PrefixScorer* scorer,
                  std::vector<absl::Span<const uint32_t>>* holders)
      : scorer_(scorer), holders_(holders) {}

  bool Block(uint32_t b, absl::Span<const uint32_t> holders) {
    holders_->push_back(holders);
    if (scoring_) scoring_ = scorer_->Block(b, holders);
    return true;
  }

 private:
  PrefixScorer* const scorer_;
  std::vector<absl::Span<const uint32_t>>* const holders_;
  bool scoring_ = true;
};

}  // namespace

void HolderTree::Score(const PromptKeys& prompt, const std::string& ns,
                       size_t workers, const HybridRules& hybrid,
                       uint64_t stamp, RouteScores* out,
                       std::vector<absl::Span<const uint32_t>>* holders) const {
  out->prompt_blocks =
      prompt.keys.empty()
          ? prompt.tokens.size() / static_cast<size_t>(block_size_)
          : prompt.keys.size();
  PrefixScorer scorer(workers, mediums_.size(), hybrid, out);
  if (holders == nullptr) {
    Walk(prompt, ns, stamp, &scorer);
  } else {
    RecordingScorer recording(&scorer, holders);
    Walk(prompt, ns, stamp, &recording);
  }
  scorer.Finish();
}

// Down from the namespace's root while the prompt's fingerprints match,
// stamping each node it enters, feeding each matched block's holders to
// the scorer.
template <typename Scorer>
void HolderTree::Walk(const PromptKeys& prompt, const std::string& ns,
                      uint64_t stamp, Scorer* scorer) const {
  if (!prompt.keys.empty()) {
    WalkKeys(prompt.keys, ns, stamp, scorer);
    return;
  }
  LazyFingerprints fingerprints(scheme_, prompt,
                                static_cast<size_t>(block_size_));
  const Tree* tree = FindTree(ns);
  const Node* node = tree == nullptr ? nullptr : &tree->root;
  size_t used = 0;  // blocks of `node` matched so far
  for (uint32_t b = 0; node != nullptr && b < fingerprints.blocks(); ++b) {
    const absl::Span<const Token> fingerprint = fingerprints.Get(b);
    if (used == node->num_blocks()) {
      node = node->FindChild(fingerprint);
      if (node == nullptr) break;
      used = 0;
      Stamp(node, stamp);
      // The slots are scattered: ask for all of this edge's at once rather
      // than miss the cache once per block.
      const auto ids = node->block_ids();
      const size_t ahead = std::min(ids.size(), fingerprints.blocks() - b);
      for (size_t k = 0; k < ahead; ++k) __builtin_prefetch(&slots_[ids[k]]);
    } else if (!SameKey(node->block(used), fingerprint)) {
      break;
    }
    if (!scorer->Block(b, slots_[node->block_ids()[used]].holders)) break;
    ++used;
  }
}

// A rolling key names its whole prefix, so block b matches where the
// namespace's tree has its key, whatever the walk found before it. The
// lookup by key finds the block that starts each edge of the match; within
// an edge, where the tree does not branch, the next block is the only one
// that can carry the next key, so its slot's key is compared instead of
// looking the key up (three scattered reads: the set, the slot, its node).
template <typename Scorer>
void HolderTree::WalkKeys(absl::Span<const uint64_t> keys,
                          const std::string& ns, uint64_t stamp,
                          Scorer* scorer) const {
  const Tree* tree = FindTree(ns);
  if (tree == nullptr || key_lookup_ == nullptr) return;
  absl::Span<const BlockId> edge;  // the blocks of the edge matched into
  size_t pos = 0;                  // block b - 1's place in it
  for (uint32_t b = 0; b < keys.size(); ++b) {
    const Slot* s;
    if (pos + 1 < edge.size()) {
      s = &slots_[edge[++pos]];
      if (s->key != keys[b]) return;
    } else {
      const int64_t id = key_lookup_->Find(tree, keys[b]);
      if (id < 0) return;
      s = &slots_[static_cast<uint32_t>(id)];
      pos = s->pos;
      Stamp(s->node, stamp);
      edge = s->node->block_ids();
      const size_t ahead = std::min(edge.size() - pos, keys.size() - b);
      for (size_t k = 1; k < ahead; ++k)
        __builtin_prefetch(&slots_[edge[pos + k]]);
    }
    if (!scorer->Block(b, s->holders)) return;
  }
}

void HolderTree::ScoreEngineHashes(absl::Span<const EngineHash> hashes,
                                   size_t workers, const HybridRules& hybrid,
                                   RouteScores* out) const {
  out->prompt_blocks = hashes.size();
  PrefixScorer scorer(workers, mediums_.size(), hybrid, out);
  WorkerId hint = kMaxWorkers;
  for (uint32_t b = 0; b < hashes.size(); ++b) {
    const Slot* s = FindEngineHash(hashes[b], &hint);
    if (s == nullptr || !scorer.Block(b, s->holders)) break;
  }
  scorer.Finish();
}

absl::Span<const uint32_t> HolderTree::HoldersOfEngineHash(
    EngineHash hash) const {
  WorkerId hint = kMaxWorkers;
  const Slot* s = FindEngineHash(hash, &hint);
  if (s == nullptr) return {};
  return s->holders;
}

}  // namespace prefixd
