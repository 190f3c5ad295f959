// HolderTree: the fleet index's blocks and who holds them (docs/index.md,
// "What the index holds").
//
// One radix tree per namespace (index/keys.h), core's tree
// (core/radix_tree.h) keyed by block fingerprints. The 64-bit word a node
// keeps per block is a *slot*: an index into slots_, which records the
// block's node and its holders, (worker, medium) pairs. The same tokens
// stored by several workers share one path. Each worker's holdings map its
// engine's block hashes to slots, only to apply removals and to find the
// parent of a store; nothing is keyed by an engine hash.
//
//   tree "-":  root ── [A B C] ─┬─ [D]      slot(A) = {node [A B C], w0:GPU
//   w1:GPU}
//                               └─ [E F]    slot(D) = {node [D],     w0:GPU}
//   holdings of w0: hash_w0(A) -> (slot A, gen), hash_w0(B) -> ...
//
// A slot that is freed bumps its generation, so a worker's stale reference
// (after max_entries dropped the block) resolves to nothing instead of to
// the block that reuses the slot.
//
// Score walks a prompt once and measures, per worker, the longest run of
// leading blocks it holds (in any medium and per medium): one walk, then
// one pass over the matched blocks' holders, whatever the number of
// workers.
//
// Thread safety: none; the owner (FleetIndex) serializes every call but
// Score, which may run concurrently with other Scores (it only writes
// recency stamps, with relaxed atomics) and never with a mutation.
#ifndef PREFIXD_INDEX_HOLDER_TREE_H_
#define PREFIXD_INDEX_HOLDER_TREE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/radix_tree.h"
#include "index/chunked_vector.h"
#include "index/events.h"
#include "index/group_rules.h"

namespace prefixd {

using WorkerId = uint32_t;

// Why blocks were not indexed or were dropped
// (prefixd_index_dropped_blocks_total{reason}).
enum class DropReason : int {
  kUnknownParent = 0,
  kExtraKeys = 1,
  kGroup = 2,
  kMaxEntries = 3,
  kBlockSize = 4,
};
inline constexpr int kNumDropReasons = 5;
absl::string_view DropReasonName(DropReason reason);
using DropCounts = std::array<uint64_t, kNumDropReasons>;

// Per worker, the longest leading runs a Score found.
struct RouteScores {
  uint64_t prompt_blocks = 0;
  size_t num_workers = 0;
  size_t num_mediums = 0;
  // run[w]: the prefix usable on w (for a plain worker, the leading blocks
  // it holds in any medium); run[W + w*M + m]: the leading blocks it holds
  // in medium m (a hybrid worker's full-attention groups only).
  absl::InlinedVector<uint32_t, 64> run;
  // A hybrid worker's full-attention run (the shortest of its full groups'
  // runs; 0 without one); empty when no worker is hybrid.
  std::vector<uint32_t> full;

  uint32_t Usable(WorkerId w) const { return run[w]; }
  uint32_t FullAttention(WorkerId w) const {
    return full.empty() ? run[w] : full[w];
  }
  uint32_t InMedium(WorkerId w, size_t m) const {
    return run[num_workers + w * num_mediums + m];
  }
};

class HolderTree {
 public:
  // The most workers and mediums a holder can name (with kMaxGroups
  // groups, index/group_rules.h).
  static constexpr uint32_t kMaxWorkers = 1u << 20;
  static constexpr size_t kMaxMediums = 256;
  // The most blocks a node's edge holds: every edit of an edge (an append,
  // a split, a removal from its tail) costs at most this many blocks' worth
  // of copying, however long a chain an engine stores.
  static constexpr size_t kMaxEdgeBlocks = 256;

  explicit HolderTree(int block_size);
  ~HolderTree();
  HolderTree(const HolderTree&) = delete;
  HolderTree& operator=(const HolderTree&) = delete;

  // Makes room for worker ids up to `worker` (they hold nothing).
  void AddWorker(WorkerId worker);

  // Applies one event of `worker` in KV-cache group ev.group_idx
  // (REQUIRES: < kMaxGroups); blocks not indexed are added to *drops.
  // `stamp` is the recency max_entries orders leaves by.
  void Store(WorkerId worker, const BlockStoredEvent& ev, uint64_t stamp,
             DropCounts* drops);
  void Remove(WorkerId worker, const BlockRemovedEvent& ev);
  // Drops everything the worker holds.
  void Clear(WorkerId worker);
  // Past `max_entries`, drops the least recently stored or routed leaf
  // blocks (every holder at once) until 1% of the bound is free;
  // `dropped(worker)` is told of each (block, holder) entry dropped.
  // Returns the blocks dropped.
  uint64_t Trim(uint64_t max_entries,
                absl::FunctionRef<void(WorkerId)> dropped);

  // Measures a prompt, given by its block keys (BlockKeys, index/keys.h),
  // in namespace `ns` for worker ids below `workers`, hybrid workers by
  // their group rules. May run concurrently with other Scores.
  void Score(absl::Span<const Token> keys, const std::string& ns,
             size_t workers, const HybridRules& hybrid, uint64_t stamp,
             RouteScores* out) const;

  // Blocks the worker holds per medium (mediums with none left out).
  struct MediumBlocks {
    absl::string_view medium;
    uint64_t blocks = 0;
  };
  std::vector<MediumBlocks> Holdings(WorkerId worker) const;
  absl::string_view MediumName(size_t medium) const { return mediums_[medium]; }

  uint64_t entries() const { return entries_; }  // (block, holder) pairs
  uint64_t blocks() const;                       // distinct blocks
  uint64_t nodes() const;

  // The first broken invariant, if any (INTERNAL, naming it).
  absl::Status CheckInvariants() const;

 private:
  struct Slot;
  struct Tally;
  struct SlotRef {
    uint32_t slot;
    uint32_t gen;
  };
  struct WorkerHoldings {
    // The engine's block hashes -> the blocks they name.
    absl::flat_hash_map<EngineHash, SlotRef> blocks;
    // Blocks held per medium, in any group.
    std::vector<uint64_t> medium_blocks;
  };
  class Scorer;

  uint32_t NewSlot(Node* node);
  void FreeSlot(uint32_t slot);
  uint8_t MediumId(absl::string_view medium);
  uint8_t TierId(absl::string_view medium, absl::string_view locality,
                 absl::string_view ownership);
  // The slot `ref` names if it is still the block the worker stored.
  Slot* Resolve(SlotRef ref);
  Tree* GetOrCreateTree(const std::string& key);
  // Where a store starts: after `*used` blocks of the returned node, or
  // null if the parent is unknown.
  Node* StoreStart(WorkerId worker, const BlockStoredEvent& ev, size_t* used);
  // Hangs `ids` (new slots) with their keys below `node` (after its last
  // block): appended to a childless edge, else as new children, no edge
  // longer than kMaxEdgeBlocks. Returns the first block's node.
  void AttachNew(Node* node, absl::Span<const Token> keys,
                 absl::Span<const BlockId> ids, uint64_t stamp);
  void Hold(WorkerId worker, uint32_t holder, uint32_t slot, EngineHash hash);
  // Removes one holder from the slot; true if its worker holds the slot in
  // no group and no medium any more.
  bool Unhold(uint32_t holder, uint32_t slot);
  // Removes every holder of `worker` from the slot.
  void UnholdAll(WorkerId worker, uint32_t slot);
  // Drops trailing blocks without holders from childless nodes, from `node`
  // up towards the root.
  void Prune(Node* node);
  // Drops the last `blocks` blocks of a leaf (every holder of them),
  // removing the node when it has no block left; returns its parent then.
  Node* DropTail(Node* leaf, size_t blocks,
                 absl::FunctionRef<void(WorkerId)> dropped);
  absl::Status CheckTree(const Tree& tree, Tally* tally) const;
  absl::Status CheckCounts(const Tally& tally) const;
  absl::Status CheckSlots(const Tally& tally) const;

  const int block_size_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tree>> trees_;
  ChunkedVector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<WorkerHoldings> holdings_;  // by WorkerId
  // Reserved to kMaxMediums at construction and never reallocated, so that
  // views of the names stay valid for the tree's life.
  std::vector<std::string> mediums_;
  std::vector<Token> key_scratch_;  // Store's keys
  uint64_t entries_ = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_HOLDER_TREE_H_
