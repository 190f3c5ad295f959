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
// - by key (BeginKeyLookup): a block of a tree found by its rolling key,
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
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
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
#include "index/wide_child_sets.h"

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
  // An RFC #1527 store of another tenant's object than its worker's (a
  // Mooncake store master names each object's tenant; its registration is
  // one tenant's).
  kOtherTenant = 6,
};
inline constexpr int kNumDropReasons = 7;
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

  // A store of up to `inserts` block hashes of `worker` may find a table it
  // inserts into (the worker's engine-hash map, the key lookup, the child
  // set of a node with many children) due to grow or to be cleaned of
  // erased entries: an O(size) rehash inside the store.
  // An owner that lets Scores run beside its changes has such tables grown
  // aside before the store instead:
  //
  //   auto g = tree.GrowthFor(worker, inserts);  // null if none is due
  //   g->Build();  // larger copies; the tree is only read (Scores go on)
  //   g->Adopt();  // swaps them in, O(1)
  //   g.reset();   // frees the tables replaced; the tree is not touched
  //
  // with nothing changing the tree between the three calls. Tables below
  // kGrowAsideFrom entries rehash in place (a few microseconds).
  static constexpr size_t kGrowAsideFrom = WideChildSets::kFrom;
  class Growth;
  std::unique_ptr<Growth> GrowthFor(WorkerId worker, size_t inserts);

  // The changes whose work grows with the index or a worker's holdings are
  // jobs done in steps of at most `max_ops` operations each (a block
  // released or dropped, an engine hash or a slot visited, a node
  // scanned), for an owner that lets Scores run between steps: a clear, a
  // tier's clear, the sweep of a worker's stale hashes, a max_entries trim
  // and the build of the key lookup. After every step the tree passes
  // CheckInvariants and holds a state between the one before the job began
  // and the one after its last step; between steps nothing but Score and
  // the read-only calls may run (a step keeps iterators into the tree's
  // maps), and a job ends before the next one begins.
  class Job {
   public:
    virtual ~Job() = default;
    // Returns the operations done; true in *done once the job is over.
    virtual size_t Step(size_t max_ops, bool* done) = 0;
  };
  // Drops everything the worker holds.
  std::unique_ptr<Job> BeginClear(WorkerId worker);
  // Drops what the worker holds in the tier `medium` (SGLang's
  // CLEAR_ALL_AT_TIER); null, with nothing to do, if no event named it.
  std::unique_ptr<Job> BeginClearTier(WorkerId worker,
                                      absl::string_view medium);
  // The sweep of a worker whose engine-hash map a store found stale (more
  // than twice as many hashes as held blocks): the entries that no longer
  // name a block it holds are dropped. Null if none is due. A worker that
  // keeps storing while max_entries trims thus cannot grow its map
  // without bound; the owner begins sweeps after each store until null.
  std::unique_ptr<Job> BeginSweep();
  // What a trim dropped, read once its job is over.
  struct Trimmed {
    uint64_t blocks = 0;
    std::vector<uint64_t> entries_by_worker;  // (block, holder) pairs
  };
  // Past `max_entries`, drops the least recently stored or routed leaf
  // blocks (every holder at once) until 1% of the bound is free, scanning
  // for the leaves first; null when the entries are within the bound.
  std::unique_ptr<Job> BeginTrim(uint64_t max_entries, Trimmed* trimmed);
  // Keeps the lookup by key from now on (null if it is kept already).
  // Without it, a Score of keys matches nothing and a store of keys alone
  // is dropped. While the job runs the lookup is partial: a Score of keys
  // finds the blocks of the slots added so far, a state between no lookup
  // and the whole one (key_lookup() is already true).
  std::unique_ptr<Job> BeginKeyLookup();
  bool key_lookup() const { return key_lookup_ != nullptr; }

  // Measures a prompt in namespace `ns` for worker ids below `workers`,
  // hybrid workers by their group rules. May run concurrently with other
  // Scores.
  // With `holders` (else null), the walk goes on to the end of the
  // prompt's match and appends each matched block's holders to it, in
  // order: views of the tree's, valid until the tree next changes.
  void Score(const PromptKeys& prompt, const std::string& ns, size_t workers,
             const HybridRules& hybrid, uint64_t stamp, RouteScores* out,
             std::vector<absl::Span<const uint32_t>>* holders = nullptr) const;
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

  uint64_t entries() const { return entries_; }  // (block, holder) pairs
  struct Sizes {
    uint64_t blocks = 0;  // distinct blocks
    uint64_t nodes = 0;
    // Engine hashes the workers' maps keep (some may name blocks
    // max_entries dropped, until a sweep; at most about twice the live
    // ones).
    uint64_t engine_hashes = 0;
    // Rehashes of a table of at least kGrowAsideFrom entries inside a
    // store (none when every store's tables were grown aside).
    uint64_t grown_in_place = 0;
  };
  Sizes sizes() const;

  // The first broken invariant, if any (INTERNAL, naming it).
  absl::Status CheckInvariants() const;

 private:
  // How far ahead a removal asks for the worker's map entries of its
  // hashes, and for the slots they name: the map and the slots are far
  // larger than the caches, and read at random (Remove).
  static constexpr size_t kMapAhead = 8;
  static constexpr size_t kSlotAhead = 4;
  struct Slot;
  struct Tally;
  // A block of a worker's holdings: its slot, while the slot's generation
  // is still `gen`.
  struct SlotRef {
    uint32_t slot;
    uint32_t gen;
  };
  struct WorkerHoldings {
    // The engine's block hashes -> the blocks they name.
    absl::flat_hash_map<EngineHash, SlotRef> blocks;
    // Blocks held per medium, in any group.
    std::vector<uint64_t> medium_blocks;
    // Erasures from `blocks` since it was made: at most its tombstones.
    uint64_t erased = 0;
    bool sweep_due = false;  // listed in sweeps_due_
    // Has held a block of a token tree since it was last cleared (listed in
    // tokened_workers_): only such a worker can hold a hash outside the
    // detached blocks' tree.
    bool tokened = false;
  };
  class KeyLookup;
  // The jobs (holder_tree_jobs.cc).
  class ClearJob;
  class SweepJob;
  class TrimJob;
  class KeyLookupJob;

  // Lists the worker for a sweep once its hashes outnumber its held
  // blocks twice (and are more than a few thousand).
  void MarkIfStale(WorkerId worker, WorkerHoldings& held);
  uint32_t NewSlot();
  void FreeSlot(uint32_t slot);
  uint8_t MediumId(absl::string_view medium);
  // The medium id of a name, or -1 if no event named it.
  int FindMedium(absl::string_view medium) const;
  uint8_t TierId(absl::string_view medium, absl::string_view locality,
                 absl::string_view ownership);
  // The slot `ref` names if it is still the block the worker stored.
  Slot* Resolve(SlotRef ref);
  const Slot* Resolve(SlotRef ref) const;
  Tree* GetOrCreateTree(const std::string& key);
  Tree* FindTree(const std::string& key) const;
  // Where a store starts: after `*used` blocks of the returned node, or
  // null, with *why: the parent is unknown, or in another namespace than
  // the one the store names by its salt.
  Node* StoreStart(WorkerId worker, const BlockStoredEvent& ev,
                   const StoreDefaults& defaults, size_t* used,
                   DropReason* why);
  void StoreChain(WorkerId worker, const BlockStoredEvent& ev, size_t chain,
                  Node* node, size_t used, absl::string_view salt,
                  uint64_t stamp);
  void StoreByKeys(WorkerId worker, const BlockStoredEvent& ev,
                   const StoreDefaults& defaults, DropCounts* drops);
  void StoreByEngineHash(WorkerId worker, const BlockStoredEvent& ev,
                         DropCounts* drops);
  // Hangs `ids` (new slots) with their fingerprints and rolling keys below
  // `node` (after its last block): appended to a childless edge, else as
  // new children, no edge longer than kMaxEdgeBlocks.
  void AttachNew(Node* node, absl::Span<const Token> fingerprints,
                 absl::Span<const uint64_t> keys, absl::Span<const BlockId> ids,
                 uint64_t stamp);
  // Down the namespace's tree while the prompt matches, each matched
  // block's holders to `scorer` until it answers false. Defined and
  // instantiated in holder_tree_score.cc.
  template <typename Scorer>
  void Walk(const PromptKeys& prompt, const std::string& ns, uint64_t stamp,
            Scorer* scorer) const;
  // The walk of a prompt given as rolling keys: each block found by the
  // lookup.
  template <typename Scorer>
  void WalkKeys(absl::Span<const uint64_t> keys, const std::string& ns,
                uint64_t stamp, Scorer* scorer) const;
  // core's structural edits (core/radix_tree.h), with wide_ told of every
  // change to a child set and every node freed.
  Node* NewChild(Node* parent, absl::Span<const Token> fingerprints,
                 absl::Span<const BlockId> ids);
  Node* Split(Node* node, size_t blocks);
  void Unlink(Node* leaf);
  // Frees the tree of namespace `ns`, which holds no block.
  void DropTree(const std::string& ns);
  // Re-points the slots of `node`'s edge from block `from` on.
  void PlaceSlots(Node* node, size_t from);
  // The worker holds the slot as `holder` (AddHolder), and its `hash`
  // names the slot (MapHash): a block the hash named before loses the
  // worker, and is pruned if nobody else holds it.
  void Hold(WorkerId worker, uint32_t holder, uint32_t slot, EngineHash hash);
  void AddHolder(WorkerId worker, uint32_t holder, uint32_t slot);
  void MapHash(WorkerId worker, uint32_t slot, EngineHash hash);
  // Removes one holder from the slot; true if its worker holds the slot in
  // no group and no medium any more.
  bool Unhold(uint32_t holder, uint32_t slot);
  // Removes every holder of `worker` from the slot (of one medium, or any
  // when medium < 0).
  void UnholdAll(WorkerId worker, uint32_t slot, int medium = -1);
  // The slot an engine hash names in some worker's holdings (the worker
  // *hint first), or a detached block's; null if none.
  const Slot* FindEngineHash(EngineHash hash, WorkerId* hint) const;
  // The same in the holdings of the worker *hint and of tokened_workers_
  // only: a worker never tokened holds a hash in its detached block, which
  // FindDetached finds.
  const Slot* FindHeldEngineHash(EngineHash hash, WorkerId* hint) const;
  // The detached block of `hash` in `detached` (may be null), or null;
  // *hint becomes a worker that holds it.
  const Slot* FindDetached(const Tree* detached, EngineHash hash,
                           WorkerId* hint) const;
  // Lists the worker in tokened_workers_ once; Untokened takes it off (it
  // holds nothing: cleared).
  void MarkTokened(WorkerId worker);
  void Untokened(WorkerId worker);
  // Whether `tree` is the detached blocks' tree.
  static bool IsDetached(const Tree& tree);
  // The detached block of `hash` in `detached` (the detached blocks'
  // tree), made if new.
  uint32_t DetachedSlot(Tree* detached, EngineHash hash, uint64_t stamp);
  // Drops trailing blocks without holders from childless nodes, from `node`
  // up towards the root, and the namespace's tree if that leaves it empty.
  void Prune(Node* node);
  // The same without dropping the tree; returns the node it stopped at (a
  // node with children, one whose last block has a holder, or the root).
  Node* PruneEmptyTail(Node* node);
  // Drops the last `blocks` blocks of a leaf (every holder of them),
  // removing the node when it has no block left; returns its parent then.
  Node* DropTail(Node* leaf, size_t blocks, Trimmed* trimmed);
  absl::Status CheckNode(const Node& node, Tally* tally) const;
  absl::Status CheckWide(const Node& node, Tally* tally) const;
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
  std::vector<uint64_t> key_scratch_;       // and its new blocks' keys
  uint64_t entries_ = 0;
  uint64_t grown_in_place_ = 0;       // see Sizes
  std::vector<WorkerId> sweeps_due_;  // see BeginSweep
  // Workers that have held a block of a token tree since they were last
  // cleared (a cleared or retired worker is unlisted), in no order.
  std::vector<WorkerId> tokened_workers_;
  std::unique_ptr<KeyLookup> key_lookup_;  // null until enabled
  WideChildSets wide_;                     // see GrowthFor
  // While the lookup is built (BeginKeyLookup): the first slot not added to
  // it yet; SIZE_MAX once it is whole.
  size_t key_lookup_next_ = SIZE_MAX;
};

// Larger copies of the tables a store is about to rehash (see GrowthFor).
class HolderTree::Growth {
 public:
  ~Growth();
  Growth(const Growth&) = delete;
  Growth& operator=(const Growth&) = delete;

  // Copies the tables into ones with room for twice their entries and the
  // store's. Reads the tree only.
  void Build();
  // Puts the copies in the tables' place. REQUIRES: Build.
  void Adopt();
  // The most entries Build copied into one set of the lookup by key.
  size_t largest_key_copy() const;

 private:
  friend class HolderTree;
  struct KeyCopy;
  struct ChildCopy;
  Growth(HolderTree* tree, WorkerId worker, size_t blocks_to,
         std::vector<std::unique_ptr<KeyCopy>> keys,
         std::vector<WideChildSets::Due> children);

  HolderTree* const tree_;
  const WorkerId worker_;
  const size_t blocks_to_;  // the engine-hash map's new size; 0: kept
  absl::flat_hash_map<EngineHash, SlotRef> blocks_;
  std::vector<std::unique_ptr<KeyCopy>> keys_;  // the lookup's sets due
  std::vector<std::unique_ptr<ChildCopy>> children_;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_HOLDER_TREE_H_
