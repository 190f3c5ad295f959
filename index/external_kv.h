// ExternalKv: the fleet index as SGLang's KV indexer sees it (docs/index.md,
// "As sgl-router's KV indexer"). A bridge pushes each worker's event
// batches as engine hashes without tokens (Apply), installs snapshots
// (ReplaceSnapshot) and declares the workers it serves
// (ConfigureExpected); a router asks how long a prefix of page hashes each
// worker holds (MatchPrefix), who holds which hash (Match), and how often a
// hash was hit (HitCounts).
//
// What this class adds to KvIndex: each worker's stream (its epoch and last
// applied seq, and whether a gap left it unknown until a snapshot), its
// cache spec turned into KV-cache group rules, the address a router knows
// it by, and the hit counters. Holdings live in the index, so workers fed
// over ZeroMQ answer MatchPrefix and Match by their engine hashes too.
//
// Workers: a worker_id the index does not know is created here and is
// *owned* by this class (ConfigureExpected removes it when left out); a
// worker_id the index already follows (a ZeroMQ source) is only given an
// address and, with a spec, group rules, and is never removed here; its
// labels stay its registration's. When that source goes (the worker is
// retired), the worker's next batch here adds it back as owned, until a
// source follows it again (its next batch or ConfigureExpected sees the
// source's endpoint and gives it back).
//
// Components map to KV-cache groups: FULL -> group 0 (full attention),
// SWA -> group 1 (sliding window), MAMBA -> group 2 (state). Tiers map to
// mediums: HBM -> GPU, DRAM -> CPU, SSD -> DISK.
//
// Thread safety: every method may be called from any thread. mu_ guards
// the streams and is held across each mutation's index calls, so one
// worker's batches apply in the order their calls took it; hits_mu_ guards
// the hit counters. Lock order: mu_, then the index's own lock; hits_mu_
// is never held with mu_. MatchPrefix takes neither.
#ifndef PREFIXD_INDEX_EXTERNAL_KV_H_
#define PREFIXD_INDEX_EXTERNAL_KV_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/mutex.h"
#include "index/kv_index.h"

namespace prefixd {

// TierType values (kv_indexer.v1).
inline constexpr int kTierHbm = 1;
inline constexpr int kTierDram = 2;
inline constexpr int kTierSsd = 3;
// "GPU", "CPU", "DISK" for kTierHbm..kTierSsd (REQUIRES: one of them).
absl::string_view TierMedium(int tier);
// The tier of a medium name, or 0 for mediums no tier names.
int MediumTier(absl::string_view medium);

struct CacheSpec {
  uint32_t version = 0;
  uint32_t components = 0;
  uint32_t swa_window_tokens = 0;
  uint32_t full_tier_mask = 0;
  uint32_t swa_tier_mask = 0;
  uint32_t mamba_tier_mask = 0;

  friend bool operator==(const CacheSpec& a, const CacheSpec& b) {
    return a.version == b.version && a.components == b.components &&
           a.swa_window_tokens == b.swa_window_tokens &&
           a.full_tier_mask == b.full_tier_mask &&
           a.swa_tier_mask == b.swa_tier_mask &&
           a.mamba_tier_mask == b.mamba_tier_mask;
  }
};

// The group rules of `spec` for pages of `page_tokens` tokens: FULL in
// group 0, SWA (a window of cdiv(swa_window_tokens, page_tokens) pages) in
// group 1, MAMBA in group 2. REQUIRES: page_tokens > 0.
std::array<GroupRule, kMaxGroups> RulesForSpec(const CacheSpec& spec,
                                               uint32_t page_tokens);

// One action of a batch, or one tier of a snapshot (op kReport). The spans
// view the caller's request. REQUIRES (checked by the reader of the wire
// request): tier 1..3; component_masks and block_sizes empty or as long as
// hashes; masks within kAllComponents.
struct ExternalAction {
  HashUpdate::Op op = HashUpdate::Op::kReport;
  int tier = kTierHbm;
  absl::Span<const EngineHash> hashes;
  absl::Span<const uint32_t> component_masks;
  absl::Span<const uint32_t> block_sizes;
};

struct ExternalBatch {
  absl::string_view worker_id;  // REQUIRES: not empty
  uint64_t seq = 0;
  std::vector<ExternalAction> actions;
  absl::string_view address;
  std::optional<CacheSpec> spec;
  absl::string_view epoch;
  bool enforce_sequence = false;
};

struct ApplyOutcome {
  uint64_t applied_seq = 0;
  bool duplicate = false;
};

struct ExternalSnapshot {
  absl::string_view worker_id;  // REQUIRES: not empty
  absl::string_view address;
  absl::string_view epoch;
  uint64_t applied_seq = 0;
  std::vector<ExternalAction> tiers;  // each op kReport
  std::optional<CacheSpec> spec;
};

struct ExpectedWorker {
  absl::string_view worker_id;  // REQUIRES: not empty, unique in the call
  absl::string_view address;
  std::optional<CacheSpec> spec;
};

struct ExpectedCounts {
  uint32_t total = 0;
  uint32_t ready = 0;
};

// MatchPrefix's answer. Views of the index's names and labels, valid as
// long as the index.
struct PrefixMatch {
  absl::string_view worker;
  absl::string_view address;
  uint32_t blocks = 0;
};
struct PrefixAnswer {
  std::vector<PrefixMatch> matches;  // blocks desc, then worker name
  uint32_t best_blocks = 0;
  uint32_t blocks_read = 0;
};

// Match's answer: per worker (in the order they first hold an asked hash),
// per tier (ascending), the hashes held and the components of each.
struct TierHoldings {
  int tier = 0;
  std::vector<EngineHash> hashes;
  std::vector<uint32_t> component_masks;
};
struct NodeHoldings {
  absl::string_view worker;
  absl::string_view address;
  std::vector<TierHoldings> tiers;
};

struct HitCount {
  EngineHash hash = 0;
  uint64_t hits = 0;
};

class ExternalKv {
 public:
  struct Options {
    // Hashes whose hits are counted; past it, hashes not yet counted are
    // not counted (those counted keep counting).
    size_t max_hit_counts = size_t{1} << 20;
  };

  // `index` must outlive this object.
  ExternalKv(KvIndex* index, Options options);
  ExternalKv(const ExternalKv&) = delete;
  ExternalKv& operator=(const ExternalKv&) = delete;

  // Applies one batch in order, all of it or none (FAILED_PRECONDITION,
  // naming the seqs or epochs, for a batch that a gap or a restart makes
  // unusable; the index is then cleared of the worker as its stream says).
  absl::StatusOr<ApplyOutcome> Apply(const ExternalBatch& batch);
  // Replaces all the worker holds in every tier by the snapshot's hashes;
  // its stream continues from snapshot.applied_seq + 1.
  uint64_t ReplaceSnapshot(const ExternalSnapshot& snapshot);
  // Adds (or updates) these workers and removes the owned ones left out.
  ExpectedCounts ConfigureExpected(absl::Span<const ExpectedWorker> workers);
  // Clears what the worker holds; until a snapshot, its batches with
  // enforce_sequence are refused. Answers the counts over every worker
  // this class knows. NOT_FOUND for a worker it does not know (never named
  // by a batch, snapshot or ConfigureExpected, removed, or retired since).
  absl::StatusOr<ExpectedCounts> Invalidate(absl::string_view worker_id);
  // New for every ExternalKv, and so at every start of the daemon: a
  // bridge that sees it change installs its snapshots again.
  const std::string& epoch() const { return epoch_; }

  // Per worker passing `filter` with an address, the longest prefix of
  // `hashes` it can reuse (> 0 only).
  PrefixAnswer MatchPrefix(absl::Span<const EngineHash> hashes,
                           const WorkerFilter& filter) const;
  // Who holds each distinct hash, workers of `tenant` only ("" = any).
  // With count_as_hit, each held hash counts one hit.
  std::vector<NodeHoldings> Match(absl::Span<const EngineHash> hashes,
                                  bool count_as_hit, absl::string_view tenant);
  // Each distinct hash counted so far, in the order asked.
  std::vector<HitCount> HitCounts(absl::Span<const EngineHash> hashes) const;

 private:
  struct Stream {
    WorkerId id = 0;
    bool owned = false;  // created here; ConfigureExpected may remove it
    std::string epoch;
    bool has_seq = false;  // a snapshot or batch set applied_seq
    uint64_t applied_seq = 0;
    // A gap or restart with enforce_sequence: refused until a snapshot.
    bool needs_snapshot = false;
    std::optional<CacheSpec> spec;
    uint32_t page_tokens = 0;  // learned from block_sizes; 0: not yet
  };

  // The worker's stream, its address set to `address`: a new stream when
  // the worker is new to this class or was retired since (its source
  // removed), which starts over as this class's.
  Stream& StreamAt(absl::string_view worker_id, absl::string_view address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Stream& NewStream(absl::string_view worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the worker's group rules when its spec or page size changed.
  void SetSpec(Stream& s, const std::optional<CacheSpec>& spec,
               absl::Span<const ExternalAction> actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION (after clearing the worker) when the batch's epoch
  // or seq says what it holds is no longer known; sets *duplicate for a
  // batch already applied.
  absl::Status CheckStream(Stream& s, const ExternalBatch& batch,
                           bool* duplicate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountHits(const std::vector<EngineHash>& held);
  // Of the workers named, how many hold what is known of them.
  ExpectedCounts Count(const std::vector<absl::string_view>& workers) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  KvIndex* const index_;
  const Options options_;
  const std::string epoch_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, Stream> streams_ ABSL_GUARDED_BY(mu_);
  mutable Mutex hits_mu_;
  absl::flat_hash_map<EngineHash, uint64_t> hits_ ABSL_GUARDED_BY(hits_mu_);
};

// The index updates of a list of actions, in order: a REPORT with
// component masks becomes, per run of equal masks, a report of the
// components it holds and a revoke of those it no longer holds.
std::vector<HashUpdate> HashUpdatesOf(absl::Span<const ExternalAction> actions);

// SGLang's components (group bits) of `hashes` in `medium`, as index
// updates: held now in the groups of `report`, no longer in those of
// `revoke` (either may be 0). The report comes first, so that a block
// keeps its place in the tree while its components change. Both of
// SGLang's doors use it: this API's masked REPORTs and its component-typed
// events (FleetIndex).
void AddComponentUpdates(absl::string_view medium, uint32_t report,
                         uint32_t revoke, absl::Span<const EngineHash> hashes,
                         std::vector<HashUpdate>* out);

}  // namespace prefixd

#endif  // PREFIXD_INDEX_EXTERNAL_KV_H_
