// FleetIndex: which worker (engine data-parallel rank) holds which prefix,
// built from the KV events the engines publish (docs/index.md).
//
// Two parts under one lock: the blocks and their holders (HolderTree,
// index/holder_tree.h) and the workers (WorkerRegistry,
// index/worker_registry.h). Route is a Score of the prompt in the tree (one
// walk, whatever the number of workers) and then the assembly of the answer
// from the scores and the registry.
//
// Thread safety: every method may be called from any thread. mu_ guards
// both parts: applies and registry changes take it exclusively; Route,
// Stats and CheckInvariants share it (Route's recency stamps are relaxed
// atomics, index/holder_tree.h). A change never holds mu_ for more than
// kSliceBlocks block operations: a long store or removal goes in as
// slices; a clear, a tier's clear, the sweep of a stale engine-hash map, a
// max_entries trim (its scan of the leaves too) and the build of the key
// lookup in steps; and mu_ is released between them so that waiting Routes
// run. writer_mu_, held by a change
// from start to end, keeps other changes out meanwhile: a Route between
// slices sees a state between the one before the change and the one after,
// and each worker's changes apply whole, in order.
#ifndef PREFIXD_INDEX_FLEET_INDEX_H_
#define PREFIXD_INDEX_FLEET_INDEX_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "base/mutex.h"
#include "index/holder_tree.h"
#include "index/kv_index.h"
#include "index/worker_registry.h"

namespace prefixd {

class FleetIndex final : public KvIndex {
 public:
  explicit FleetIndex(IndexOptions options);
  FleetIndex(const FleetIndex&) = delete;
  FleetIndex& operator=(const FleetIndex&) = delete;

  const IndexOptions& options() const override { return options_; }
  WorkerId AddWorker(absl::string_view name,
                     absl::string_view endpoint) override;
  void RetireWorker(WorkerId worker) override;
  void SetState(WorkerId worker, WorkerState state,
                absl::string_view detail) override;
  void CountGap(WorkerId worker) override;
  void CountReplay(WorkerId worker, bool ok) override;
  void Apply(WorkerId worker, const KvEventBatch& batch, int64_t seq,
             absl::Time now) override;
  void ClearWorker(WorkerId worker, ClearReason reason,
                   absl::string_view detail) override;
  void SetLastSeq(WorkerId worker, int64_t seq) override;
  void SetLabels(WorkerId worker, const WorkerLabels& labels) override;
  std::optional<std::string> EndpointOf(absl::string_view name) const override;
  std::optional<std::string> SetAddress(WorkerId worker,
                                        absl::string_view address) override;
  void ApplyHashes(WorkerId worker,
                   absl::Span<const HashUpdate> updates) override;
  void SetGroupRules(WorkerId worker,
                     const std::array<GroupRule, kMaxGroups>& rules) override;
  RouteResult Route(const RouteQuery& query) const override;
  RouteResult RouteEngineHashes(absl::Span<const EngineHash> hashes,
                                const WorkerFilter& filter) const override;
  std::vector<HashHolding> HashHoldings(
      absl::Span<const EngineHash> hashes) const override;
  IndexStats Stats() const override;

  // The first broken invariant of the tree, if any.
  absl::Status CheckInvariants() const;

  // The block operations (a block stored, removed, cleared or trimmed) one
  // hold of mu_ may do before the change lets readers in: tens of
  // microseconds, so that a Route waits for a slice, not for a batch of a
  // few hundred blocks (docs/performance.md, "Slices of 64").
  static constexpr size_t kSliceBlocks = 64;
  // The most block operations one hold of mu_ did, and how many times a
  // change released mu_ between slices (for tests: FleetIndexTestPeer).
  struct HoldStats {
    uint64_t max_blocks = 0;
    uint64_t yields = 0;
    // Hash tables grown aside before a store (GrowAside), and rehashed
    // inside one all the same (HolderTree::Sizes::grown_in_place).
    uint64_t grown_aside = 0;
    uint64_t grown_in_place = 0;
    // The most entries one growth copied into a set of the lookup by key
    // (HolderTree::KeyLookup: a set, not the whole lookup).
    uint64_t largest_key_copy = 0;
  };

 private:
  // Tests read the hold statistics and set the hook between slices.
  friend class FleetIndexTestPeer;
  HoldStats hold_stats() const;
  // Called between slices, with mu_ released (it may Route, Stats or
  // CheckInvariants, not change anything). Set before any change.
  void SetBetweenSlicesForTest(std::function<void()> hook);
  class Writer;
  class Reader;
  // The batch's stores of another block size, if any: nothing of it can be
  // trusted to line up with the index's blocks.
  bool RejectBlockSize(WorkerRecord& w, const KvEventBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The batch's events, in order (a long one in slices, see Budget).
  void ApplyEvents(WorkerRecord& w, const KvEventBatch& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sparse stores (BlockStoredEvent::sparse) waiting in *waiting, in
  // order; empties it.
  void StoreWaiting(WorkerRecord& w,
                    std::vector<const BlockStoredEvent*>* waiting,
                    uint64_t stamp, DropCounts* drops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores the event, or counts why not (a group without a rule).
  void StoreLocked(WorkerRecord& w, const BlockStoredEvent& ev, uint64_t stamp,
                   DropCounts* drops) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the rule a store declares for its group (REQUIRES: group_idx
  // in range).
  void LearnGroup(WorkerRecord& w, const BlockStoredEvent& ev)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SGLang's component-typed store (BlockStoredEvent::components).
  void StoreComponents(WorkerRecord& w, const BlockStoredEvent& ev,
                       uint64_t stamp, DropCounts* drops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LearnComponents(WorkerRecord& w, uint32_t components)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The removal in each group of `components` (a set of group bits).
  void RemoveComponents(WorkerId worker, const BlockRemovedEvent& ev,
                        uint32_t components) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Index updates by engine hash (ApplyHashes' and SGLang's components').
  void ApplyUpdates(WorkerId worker, absl::Span<const HashUpdate> updates,
                    uint64_t stamp) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A store of engine hashes alone in group g, in slices.
  void StoreHashesSliced(WorkerId worker, absl::Span<const EngineHash> hashes,
                         int g, absl::string_view medium, uint64_t stamp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A store or removal of more blocks than the hold has left, as slices.
  void StoreSliced(WorkerId worker, const BlockStoredEvent& ev,
                   const StoreDefaults& defaults, uint64_t stamp,
                   DropCounts* drops) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveSliced(WorkerId worker, const BlockRemovedEvent& ev)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearLocked(WorkerRecord& w, ClearReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Trim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sweeps of stale engine-hash maps the last store made due.
  void SweepStale() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one of the tree's jobs (nothing for null) in steps within the
  // hold's budget.
  void Run(std::unique_ptr<HolderTree::Job> job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The block operations this hold of mu_ may still do, releasing and
  // taking mu_ again first when none are left.
  size_t Budget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Spend(size_t blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    hold_blocks_ += blocks;
  }
  void Yield() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a store of up to `inserts` block hashes of `id`: the tables it
  // would rehash are grown aside (HolderTree::GrowthFor), copied with mu_
  // shared so that Routes go on, and swapped in with it held.
  void GrowAside(WorkerId id, size_t inserts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndHold() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The prompt as EAGLE's bigram blocks (each with the token after it as a
  // content key, kept in *content).
  PromptKeys BigramPrompt(const RouteQuery& q, BlockContent* content) const;
  // The holders of a prompt's matched blocks, in order (one walk's).
  using HeldBlocks = std::vector<absl::Span<const uint32_t>>;
  // Per worker id, its tier runs (RouteQuery::tier_runs) over the walks.
  std::vector<TierRuns> ScoreTiers(
      const WorkerFilter& filter, const RouteScores& scores,
      std::initializer_list<const HeldBlocks*> walks) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // `tiers`: per worker id, or null when the query did not ask.
  RouteResult Assemble(const WorkerFilter& filter, const RouteScores& scores,
                       const std::vector<TierRuns>* tiers, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool Passes(const WorkerFilter& filter, const WorkerRecord& w) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  WorkerStatus StatusOf(const WorkerRecord& w, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const IndexOptions options_;
  Mutex writer_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  HolderTree tree_ ABSL_GUARDED_BY(mu_);
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  // The group rules of workers serving hybrid models, for Score.
  HybridRules hybrid_ ABSL_GUARDED_BY(mu_);
  // Set once any worker has stored EAGLE's bigram blocks: a Route by tokens
  // then also walks the prompt as such blocks (BigramPrompt).
  bool bigram_blocks_ ABSL_GUARDED_BY(mu_) = false;
  // Recency for max_entries: Apply and Route advance it; Route under the
  // shared lock, hence atomic.
  mutable std::atomic<uint64_t> clock_{0};
  size_t hold_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  HoldStats hold_stats_ ABSL_GUARDED_BY(mu_);
  // Routes waiting for mu_: a change that releases it between slices waits
  // for them to get it (absl::Mutex would let the writer take it back
  // first).
  mutable std::atomic<int> waiting_readers_{0};
  std::function<void()> between_slices_;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_FLEET_INDEX_H_
