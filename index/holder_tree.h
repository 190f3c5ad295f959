// HolderTree: the fleet index's blocks and who holds them (docs/index.md,
// "What the index holds").
//
// One radix tree per namespace (index/keys.h), core's tree
// (core/radix_tree.h) keyed by each block's fingerprint. The 64-bit word a
// node keeps per block is a *slot*: an index into slots_, which records the
// block's node, its place in the node's edge, its rolling key and its
// holders (worker, KV-cache group, tier; index/holders.h). The same prefix
// stored by several workers is one path. Each worker's holdings map its
// engine's block hashes to slots, to apply removals and to find the parent of a
// store.
//
//   tree "-":  root ── [A B C] ─┬─ [D]      slot(A) = {[A B C] #0, w0:GPU
//   w1:GPU}
//                               └─ [E F]    slot(D) = {[D] #0,     w0:GPU}
//   holdings of w0: hash_w0(A) -> (slot A, gen), hash_w0(B) -> ...
//
// A slot that is freed bumps its generation, so a worker's stale reference
// (after max_entries dropped the block) resolves to nothing instead of to
// the block that reuses the slot.
//
// Three lookups besides the walk by tokens:
// - by key (EnableKeyLookup): a block of a tree found by its rolling key,
//   for publishers that send the index's own hashes without tokens
//   (Mooncake's RFC #1527 store events) and routers that ask by hash (a
//   Score of keys finds each block this way, so it needs the lookup);
// - by engine hash (ScoreEngineHashes, StoreHashes): a block found through
//   any worker's holdings, for routers and bridges that speak only the
//   engines' hashes (SGLang's KV indexer API);
// - detached blocks: an engine hash reported without tokens that no worker
//   has stored with tokens is kept as a block of its own, outside every
//   namespace's tree, so that hash lookups still see who holds it.
//
// Thread safety: none; the owner (FleetIndex) serializes every call but
// Score and ScoreEngineHashes, which may run concurrently with each other
// (Score only writes recency stamps, with relaxed atomics) and never with a
// mutation.
#ifndef PREFIXD_INDEX_HOLDER_TREE_H_
#define PREFIXD_INDEX_HOLDER_TREE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/radix_tree.h"
#include "index/chunked_vector.h"
#include "index/events.h"
#include "index/group_rules.h"
#include "index/holders.h"
#include "index/keys.h"
#include "index/prefix_scorer.h"

namespace prefixd {

// Why blocks were not indexed or were dropped
// (prefixd_index_dropped_blocks_total{reason}).
enum class DropReason : int {
  kUnknownParent = 0,
  kExtraKeys = 1,
  kGroup = 2,
  kMaxEntries = 3,
  kBlockSize = 4,
  kUnknownHash = 5,  // a store without tokens whose key no block has
};
inline constexpr int kNumDropReasons = 6;
absl::string_view DropReasonName(DropReason reason);
using DropCounts = std::array<uint64_t, kNumDropReasons>;

// What a worker's registration says of the events it sends, for the
// events that do not say it themselves.
struct StoreDefaults {
  absl::string_view lora_name;  // the LoRA of stores naming none
  absl::string_view salt;       // the cache salt of root stores naming none
  // Its block hashes are the index's own rolling keys (Mooncake's RFC #1527
  // publishers): a store without tokens is placed by its keys, and a
  // parent it never stored itself is found by key.
  bool hashes_are_keys = false;
};

// A prompt as a Score reads it: its tokens (keys chained as the walk needs
// them, from the namespace's salt) or the keys themselves.
struct PromptKeys {
  absl::Span<const Token> tokens;  // whole blocks are read
  const BlockContent* content = nullptr;
  absl::string_view salt;
  absl::Span<const uint64_t> keys;  // instead of tokens, when not empty
};

class HolderTree {
 public:
  static constexpr uint32_t kMaxWorkers = kMaxHolderWorkers;
  static constexpr size_t kMaxMediums = 256;
  // The most blocks a node's edge holds: every edit of an edge (an append,
  // a split, a removal from its tail) costs at most this many blocks' worth
  // of copying, however long a chain an engine stores.
  static constexpr size_t kMaxEdgeBlocks = 256;

  HolderTree(int block_size, KeyScheme scheme);
  ~HolderTree();
  HolderTree(const HolderTree&) = delete;
  HolderTree& operator=(const HolderTree&) = delete;

  const KeyScheme& scheme() const { return scheme_; }
  // Makes room for worker ids up to `worker` (they hold nothing).
  void AddWorker(WorkerId worker);

  // Applies one event of `worker` in KV-cache group ev.group_idx
  // (REQUIRES: < kMaxGroups); blocks not indexed are added to *drops.
  // `stamp` is the recency max_entries orders leaves by. A store without
  // tokens is placed by its keys (REQUIRES: defaults.hashes_are_keys).
  void Store(WorkerId worker, const BlockStoredEvent& ev,
             const StoreDefaults& defaults, uint64_t stamp, DropCounts* drops);
  void Remove(WorkerId worker, const BlockRemovedEvent& ev);
  // Engine hashes the worker reports without tokens, in `group` and
  // `medium`: each held where some worker stored it with tokens, else as a
  // detached block.
  void StoreHashes(WorkerId worker, absl::Span<const EngineHash> hashes,
                   int group, absl::string_view medium, uint64_t stamp);
  // Drops everything the worker holds (BeginClearTier: what it holds in one
  // tier).
  void Clear(WorkerId worker);
  // Past `max_entries`, drops the least recently stored or routed leaf
  // blocks (every holder at once) until 1% of the bound is free;
  // `dropped(worker)` is told of each (block, holder) entry dropped.
  // Returns the blocks dropped.
  uint64_t Trim(uint64_t max_entries,
                absl::FunctionRef<void(WorkerId)> dropped);

  // The changes whose work grows with the index or a worker's holdings, in
  // steps of at most `max_blocks` block operations each (a block released
  // or dropped, an engine hash or a slot visited, a node scanned), for an
  // owner that lets Scores run between steps: a clear, a tier's clear, the
  // sweep of a worker's stale hashes, a max_entries trim and the build of
  // the key lookup. Each is a Begin call, then Step calls until *done.
  // After every step the tree passes CheckInvariants and holds a state
  // between the one before Begin and the one after the last step; between
  // steps nothing but Score and the read-only calls may run (so no map or
  // tree a step keeps an iterator into changes meanwhile).
  struct SlotRef {
    uint32_t slot;
    uint32_t gen;
  };
  struct Clearing {
    WorkerId worker = 0;
    // The worker's holdings, taken out (its new stores go to a new map).
    absl::flat_hash_map<EngineHash, SlotRef> blocks;
    absl::flat_hash_map<EngineHash, SlotRef>::iterator next;
  };
  void BeginClear(WorkerId worker, Clearing* clearing);
  // The blocks released by this step; true in *done once nothing is left.
  size_t ClearStep(Clearing& clearing, size_t max_blocks, bool* done);

  // A pass over one worker's engine-hash map, in place: the entries that no
  // longer name a block the worker holds are dropped, after (for a tier's
  // clear) the worker's holders in `medium` are removed.
  struct Sweeping {
    WorkerId worker = 0;
    int medium = -1;  // the tier cleared, or -1 for a sweep alone
    absl::flat_hash_map<EngineHash, SlotRef>::iterator next;
  };
  // Drops what the worker holds in the tier `medium` (SGLang's
  // CLEAR_ALL_AT_TIER); false, with nothing to do, if no event named it.
  bool BeginClearTier(WorkerId worker, absl::string_view medium,
                      Sweeping* sweeping);
  // The sweep of a worker whose map a store found stale (Hold: more than
  // twice as many hashes as held blocks), false if none is due. A worker
  // that keeps storing while max_entries trims thus cannot grow its map
  // without bound; its owner runs the sweeps after each store.
  bool BeginSweep(Sweeping* sweeping);
  // The map entries visited by this step; true in *done at the map's end.
  size_t SweepStep(Sweeping& sweeping, size_t max_blocks, bool* done);

  struct Trimming {
    uint64_t target = 0;  // the entries to get down to
    // The scan for leaves (TrimScanStep): the trees not entered yet, then
    // the children left to visit at each depth of the current tree.
    absl::flat_hash_map<std::string, std::unique_ptr<Tree>>::const_iterator
        next_tree;
    std::vector<std::pair<ChildSet::const_iterator, ChildSet::const_iterator>>
        path;
    // Leaves, least recent first (as stamped when scanned).
    using Leaf = std::pair<uint64_t, Node*>;
    std::priority_queue<Leaf, std::vector<Leaf>, std::greater<Leaf>> leaves;
  };
  // Null when the entries are within `max_entries`.
  std::unique_ptr<Trimming> BeginTrim(uint64_t max_entries);
  // The nodes visited by this step; true in *done once every leaf is in
  // trimming.leaves. Drops nothing.
  size_t TrimScanStep(Trimming& trimming, size_t max_blocks, bool* done);
  // The blocks dropped by this step; true in *done once the bound is met.
  // REQUIRES: the scan is done.
  size_t TrimStep(Trimming& trimming, size_t max_blocks,
                  absl::FunctionRef<void(WorkerId)> dropped, bool* done);

  // Keeps the lookup by key from now on. Without it, a Score of keys
  // matches nothing and a store of keys alone is dropped. Begin starts it
  // empty (nothing if it is kept already); each step adds the blocks of
  // the next `max_blocks` slots. Between steps the lookup is partial: a
  // Score of keys finds the blocks of the slots added so far, a state
  // between no lookup and the whole one (key_lookup() is already true).
  void BeginKeyLookup();
  // The slots visited by this step; true in *done once every one is in.
  size_t KeyLookupStep(size_t max_blocks, bool* done);
  void EnableKeyLookup();  // all at once
  bool key_lookup() const { return key_lookup_ != nullptr; }

  // Measures a prompt in namespace `ns` for worker ids below `workers`,
  // hybrid workers by their group rules. May run concurrently with other
  // Scores.
  void Score(const PromptKeys& prompt, const std::string& ns, size_t workers,
             const HybridRules& hybrid, uint64_t stamp, RouteScores* out) const;
  // The same for a prompt given as engine hashes in order (SGLang's page
  // hashes): each found through the holdings of any worker, or detached.
  void ScoreEngineHashes(absl::Span<const EngineHash> hashes, size_t workers,
                         const HybridRules& hybrid, RouteScores* out) const;
  // Per engine hash found, its holders (empty when unknown).
  absl::Span<const uint32_t> HoldersOfEngineHash(EngineHash hash) const;

  // Blocks the worker holds per medium (mediums with none left out).
  struct MediumBlocks {
    absl::string_view medium;
    uint64_t blocks = 0;
  };
  std::vector<MediumBlocks> Holdings(WorkerId worker) const;
  absl::string_view MediumName(size_t medium) const { return mediums_[medium]; }
  size_t num_mediums() const { return mediums_.size(); }
  // The medium id of a name, or -1 if no event named it.
  int FindMedium(absl::string_view medium) const;

  uint64_t entries() const { return entries_; }  // (block, holder) pairs
  // Engine hashes the workers' maps keep (some may name blocks max_entries
  // dropped, until a sweep; at most about twice the live ones).
  uint64_t engine_hashes() const;
  uint64_t blocks() const;  // distinct blocks
  uint64_t nodes() const;

  // The first broken invariant, if any (INTERNAL, naming it).
  absl::Status CheckInvariants() const;

 private:
  struct Slot;
  struct Tally;
  struct WorkerHoldings {
    // The engine's block hashes -> the blocks they name.
    absl::flat_hash_map<EngineHash, SlotRef> blocks;
    // Blocks held per medium, in any group.
    std::vector<uint64_t> medium_blocks;
    bool sweep_due = false;  // listed in sweeps_due_
  };
  class KeyLookup;

  // Lists the worker for a sweep once its hashes outnumber its held
  // blocks twice (and are more than a few thousand).
  void MarkIfStale(WorkerId worker, WorkerHoldings& held);
  uint32_t NewSlot();
  void FreeSlot(uint32_t slot);
  uint8_t MediumId(absl::string_view medium);
  uint8_t TierId(absl::string_view medium, absl::string_view locality,
                 absl::string_view ownership);
  // The slot `ref` names if it is still the block the worker stored.
  Slot* Resolve(SlotRef ref);
  const Slot* Resolve(SlotRef ref) const;
  uint64_t KeyOf(const Slot& s) const;
  Tree* GetOrCreateTree(const std::string& key);
  Tree* FindTree(const std::string& key) const;
  // Where a store starts: after `*used` blocks of the returned node, or
  // null if the parent is unknown.
  Node* StoreStart(WorkerId worker, const BlockStoredEvent& ev,
                   const StoreDefaults& defaults, size_t* used);
  void StoreChain(WorkerId worker, const BlockStoredEvent& ev, size_t chain,
                  Node* node, size_t used, uint64_t stamp);
  void StoreByKeys(WorkerId worker, const BlockStoredEvent& ev,
                   const StoreDefaults& defaults, DropCounts* drops);
  // Hangs `ids` (new slots) with their fingerprints and rolling keys below
  // `node` (after its last block): appended to a childless edge, else as
  // new children, no edge longer than kMaxEdgeBlocks.
  void AttachNew(Node* node, absl::Span<const Token> fingerprints,
                 absl::Span<const uint64_t> keys, absl::Span<const BlockId> ids,
                 uint64_t stamp);
  // Score of a prompt given as rolling keys: each block found by the lookup.
  void ScoreKeys(absl::Span<const uint64_t> keys, const std::string& ns,
                 uint64_t stamp, PrefixScorer* scorer) const;
  // Re-points the slots of `node`'s edge from block `from` on.
  void PlaceSlots(Node* node, size_t from);
  void Hold(WorkerId worker, uint32_t holder, uint32_t slot, EngineHash hash);
  // Removes one holder from the slot; true if its worker holds the slot in
  // no group and no medium any more.
  bool Unhold(uint32_t holder, uint32_t slot);
  // Removes every holder of `worker` from the slot (of one medium, or any
  // when medium < 0).
  void UnholdAll(WorkerId worker, uint32_t slot, int medium = -1);
  // The slot an engine hash names in some worker's holdings (the worker
  // *hint first), or a detached block's; null if none.
  const Slot* FindEngineHash(EngineHash hash, WorkerId* hint) const;
  uint32_t DetachedSlot(EngineHash hash, uint64_t stamp);
  // Drops trailing blocks without holders from childless nodes, from `node`
  // up towards the root.
  void Prune(Node* node);
  // Drops the last `blocks` blocks of a leaf (every holder of them),
  // removing the node when it has no block left; returns its parent then.
  Node* DropTail(Node* leaf, size_t blocks,
                 absl::FunctionRef<void(WorkerId)> dropped);
  absl::Status CheckNode(const Node& node, Tally* tally) const;
  absl::Status CheckTree(const Tree& tree, Tally* tally) const;
  absl::Status CheckCounts(const Tally& tally) const;
  absl::Status CheckSlots(const Tally& tally) const;

  const int block_size_;
  const KeyScheme scheme_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tree>> trees_;
  ChunkedVector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<WorkerHoldings> holdings_;  // by WorkerId
  // Reserved to kMaxMediums at construction and never reallocated, so that
  // views of the names stay valid for the tree's life.
  std::vector<std::string> mediums_;
  std::vector<Token> fingerprint_scratch_;  // Store's fingerprints
  std::vector<uint64_t> key_scratch_;       // and rolling keys
  uint64_t entries_ = 0;
  std::vector<WorkerId> sweeps_due_;       // see BeginSweep
  std::unique_ptr<KeyLookup> key_lookup_;  // null until enabled
  // While the lookup is built (KeyLookupStep): the first slot not added to
  // it yet; SIZE_MAX once it is whole.
  size_t key_lookup_next_ = SIZE_MAX;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_HOLDER_TREE_H_
