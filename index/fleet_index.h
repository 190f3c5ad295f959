// FleetIndex: which worker (engine data-parallel rank) holds which prefix,
// built from the KV events the engines publish (docs/index.md).
//
// One radix tree per index namespace (LoRA + cache_salt), core's tree
// (core/radix_tree.h): the same compressed edges of whole blocks as the
// sidecar's cache, each block keyed by a 64-bit fingerprint of its token ids
// (two Tokens) rather than the ids themselves. The 64-bit word the sidecar
// keeps per block (the engine's block ID) is here a *slot*: an index into
// slots_, which records the block's node and its holders (worker x medium). The
// same tokens stored by several workers share one path; each worker keeps its
// own map from its engine's block hashes to slots, used only to apply
// BlockRemoved and to find the parent of a BlockStored.
//
//   tree "n:lora-a\x1fsalt":  root ── [A B C] ── [D]       slots: A {w0:GPU,
//   w1:GPU}
//                                        └────── [E F]            D {w0:GPU}
//                                        ...
//   worker w0: hash(A) -> slot A, hash(B) -> slot B, ...
//
// Route walks the prompt once through the tree and scores every worker by
// the longest run of leading blocks it holds (one walk, not one per worker).
//
// Thread safety: every public method may be called from any thread. Applies
// and registry changes take the index's lock exclusively; Route and the
// read-only accessors share it. Route's recency stamps are written with
// relaxed atomics under the shared lock (see Touch in fleet_index.cc).
#ifndef PREFIXD_INDEX_FLEET_INDEX_H_
#define PREFIXD_INDEX_FLEET_INDEX_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/radix_tree.h"
#include "index/chunked_vector.h"
#include "index/events.h"

namespace prefixd {

struct IndexOptions {
  int block_size = 16;              // the engines' block size
  uint64_t max_entries = 50000000;  // (block, holder) entries
};

// Values equal prefixd.v1.WorkerState's.
enum class WorkerState : int {
  kConnecting = 1,
  kLive = 2,
  kReplaying = 3,
  kError = 4,
};
absl::string_view WorkerStateName(WorkerState state);

// Why a worker was cleared (label `reason` of prefixd_index_clears_total).
enum class ClearReason : int {
  kAllBlocksCleared = 0,
  kRestart = 1,
  kReplayFailed = 2,
  kUndecodable = 3,
  kBlockSize = 4,
  kRemoved = 5,    // the worker left (a pool address no longer resolves)
  kReconnect = 6,  // the connection came back: the engine may have restarted
};
inline constexpr int kNumClearReasons = 7;
absl::string_view ClearReasonName(ClearReason reason);

// Why blocks were not indexed or were dropped
// (prefixd_index_dropped_blocks_total).
enum class DropReason : int {
  kUnknownParent = 0,
  kExtraKeys = 1,
  kGroup = 2,
  kMaxEntries = 3,
  kBlockSize = 4,
};
inline constexpr int kNumDropReasons = 5;
absl::string_view DropReasonName(DropReason reason);

// Event types counted per worker (prefixd_index_events_total{type}).
inline constexpr int kNumEventTypes = 4;  // stored, removed, cleared, unknown
inline constexpr std::array<absl::string_view, kNumEventTypes> kEventTypeNames =
    {"BlockStored", "BlockRemoved", "AllBlocksCleared", "unknown"};

using WorkerId = uint32_t;

// Upper bounds (seconds) of prefixd_index_event_lag_seconds.
inline constexpr std::array<double, 12> kLagBuckets = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

struct RouteQuery {
  absl::Span<const Token> tokens;
  absl::string_view lora_name;
  int64_t lora_id = 0;
  absl::string_view cache_salt;
  std::vector<std::string> workers;  // only these (empty: all)
};

struct MediumCount {
  std::string medium;
  uint64_t blocks = 0;
};

// Route's answer names workers and mediums by views of the index's own
// names, which live as long as the index (workers are retired, never freed;
// mediums are never renamed): a Route allocates no strings.
struct RouteMedium {
  absl::string_view medium;
  uint64_t blocks = 0;
};

struct WorkerMatch {
  absl::string_view worker;
  uint64_t matched_blocks = 0;
  // per medium held along the prompt
  absl::InlinedVector<RouteMedium, 2> mediums;
  WorkerState state = WorkerState::kConnecting;
  int64_t last_seq = -1;
  int64_t lag_ms = 0;
};

struct RouteResult {
  std::vector<WorkerMatch> workers;  // matched_blocks desc, then name
  absl::string_view best_worker;     // empty if nobody holds block 0
  uint64_t prompt_blocks = 0;
};

struct WorkerStatus {
  std::string worker;
  std::string endpoint;
  WorkerState state = WorkerState::kConnecting;
  std::string state_detail;
  std::vector<MediumCount> mediums;  // blocks held per medium
  uint64_t events = 0;
  std::array<uint64_t, kNumEventTypes> events_by_type = {};
  uint64_t gaps = 0;
  uint64_t replays_ok = 0;
  uint64_t replays_failed = 0;
  uint64_t dropped_blocks = 0;
  uint64_t unknown_fields = 0;  // fields the decoder skipped
  std::array<uint64_t, kNumClearReasons> clears = {};
  int64_t last_seq = -1;
  int64_t last_event_unix_ms = 0;
  int64_t lag_ms = 0;
};

struct IndexStats {
  std::vector<WorkerStatus> workers;  // sorted by name
  uint64_t entries = 0;
  uint64_t max_entries = 0;
  uint64_t blocks = 0;  // distinct blocks (tree nodes' blocks)
  uint64_t nodes = 0;
  std::array<uint64_t, kNumDropReasons> dropped = {};
  // prefixd_index_event_lag_seconds: cumulative counts per kLagBuckets bound
  // are derived by the exporter; here per-bucket counts (last = +Inf).
  std::array<uint64_t, kLagBuckets.size() + 1> lag_counts = {};
  double lag_sum = 0;
  uint64_t route_requests = 0;
  uint64_t route_prompt_blocks = 0;
  uint64_t route_matched_blocks = 0;
};

class FleetIndex {
 public:
  explicit FleetIndex(IndexOptions options);
  ~FleetIndex();
  FleetIndex(const FleetIndex&) = delete;
  FleetIndex& operator=(const FleetIndex&) = delete;

  const IndexOptions& options() const { return options_; }

  // The worker named `name`, created (CONNECTING) if new; a retired worker of
  // that name comes back. `endpoint` is recorded for ListWorkers.
  WorkerId AddWorker(absl::string_view name, absl::string_view endpoint);
  // Clears the worker and hides it from Route and ListWorkers until it is
  // added again.
  void RetireWorker(WorkerId worker);

  void SetState(WorkerId worker, WorkerState state,
                absl::string_view detail = "");
  void CountGap(WorkerId worker);
  void CountReplay(WorkerId worker, bool ok);

  // Applies one decoded batch that the stream numbered `seq`, in order.
  // Blocks of a wrong block_size put the worker in ERROR (cleared); a batch
  // whose stores all have the right size brings it back to LIVE.
  void Apply(WorkerId worker, const KvEventBatch& batch, int64_t seq,
             absl::Time now);
  // Drops everything the worker holds; counts `reason`; the worker's state
  // becomes CONNECTING unless `detail` asks for ERROR via SetState after.
  void ClearWorker(WorkerId worker, ClearReason reason,
                   absl::string_view detail = "");
  // Marks the batch numbered `seq` as consumed without applying it (an
  // undecodable payload, after ClearWorker).
  void SetLastSeq(WorkerId worker, int64_t seq);

  RouteResult Route(const RouteQuery& query) const;
  IndexStats Stats() const;
  uint64_t entries() const;

  // Appends a description of the first broken invariant to *error.
  bool CheckInvariants(std::string* error) const;

  // The namespace key of a LoRA name / id and salt (tests, Route).
  static std::string NamespaceKey(absl::string_view lora_name, int64_t lora_id,
                                  absl::string_view cache_salt);

 private:
  struct Slot;
  struct Worker;
  struct SlotRef {
    uint32_t slot;
    uint32_t gen;
  };

  uint32_t NewSlot(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint8_t MediumId(absl::string_view medium) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slot `ref` names if it is still the block the worker stored.
  Slot* Resolve(SlotRef ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void ApplyStored(Worker& w, const BlockStoredEvent& ev, uint64_t stamp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRemoved(Worker& w, const BlockRemovedEvent& ev)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountDropped(Worker& w, DropReason reason, size_t blocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Hold(Worker& w, uint32_t slot, uint8_t medium, EngineHash hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes (w, medium) from the slot; returns true if w holds it no more.
  bool Unhold(Worker& w, uint32_t slot, uint8_t medium)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops trailing blocks without holders from childless nodes, from `node`
  // up towards the root.
  void Prune(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearLocked(Worker& w, ClearReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnforceMaxEntries() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Tree* GetOrCreateTree(const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  WorkerStatus StatusLocked(const Worker& w, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const IndexOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tree>> trees_
      ABSL_GUARDED_BY(mu_);
  ChunkedVector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, WorkerId> worker_ids_ ABSL_GUARDED_BY(mu_);
  // Reserved to kMaxMediums at construction and never reallocated, so that
  // Route's views of the names stay valid.
  std::vector<std::string> mediums_ ABSL_GUARDED_BY(mu_);
  std::vector<Token> key_scratch_ ABSL_GUARDED_BY(mu_);  // ApplyStored's keys
  uint64_t entries_ ABSL_GUARDED_BY(mu_) = 0;
  std::array<uint64_t, kNumDropReasons> dropped_ ABSL_GUARDED_BY(mu_) = {};
  std::array<uint64_t, kLagBuckets.size() + 1> lag_counts_
      ABSL_GUARDED_BY(mu_) = {};
  double lag_sum_ ABSL_GUARDED_BY(mu_) = 0;
  // Recency for max_entries: Apply and Route advance it; Route under the
  // shared lock, hence atomic.
  mutable std::atomic<uint64_t> clock_{0};
  mutable std::atomic<uint64_t> route_requests_{0};
  mutable std::atomic<uint64_t> route_prompt_blocks_{0};
  mutable std::atomic<uint64_t> route_matched_blocks_{0};
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_FLEET_INDEX_H_
