// KvIndex: what the rest of prefixd asks of the fleet index (docs/index.md),
// and the vocabulary of its answers.
//
// Ingestion (index/ingest.h) registers workers, applies their decoded
// batches in order and reports their stream states; the services ask Route
// and Stats. FleetIndex (index/fleet_index.h) implements it;
// InstrumentedIndex (index/instrumented_index.h) wraps any KvIndex and
// counts calls for the metrics, as llm-d's instrumented index does.
#ifndef PREFIXD_INDEX_KV_INDEX_H_
#define PREFIXD_INDEX_KV_INDEX_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "index/events.h"
#include "index/group_rules.h"
#include "index/holder_tree.h"
#include "index/keys.h"
#include "index/tier_scorer.h"

namespace prefixd {

struct IndexOptions {
  int block_size = 16;              // the engines' block size
  uint64_t max_entries = 50000000;  // (block, holder) entries
  // The rolling hash blocks are keyed by (index/keys.h).
  HashProfile hash_profile = HashProfile::kConductorXxh64;
  uint64_t hash_seed = 0;  // the RFC profile's seed
  // Finds blocks by their rolling keys (about 5 B per block): a Route by
  // keys (the Conductor API's /query_by_hash) needs it. Workers whose
  // hashes are the keys turn it on too.
  bool key_lookup = false;
};

// What a worker's registration says of it beyond its name (the Mooncake
// Conductor's /register, SGLang's KV indexer, or a `sources` entry).
struct WorkerLabels {
  std::string instance_id;  // the router-facing instance; "" = its name
  std::string tenant;       // "" = "default"
  std::string model;        // "" = not said (matches any model)
  int64_t dp_rank = 0;
  // The LoRA and cache salt of its events that name none.
  std::string lora_name;
  std::string salt;
  std::string address;  // where a router sends its requests, if known
  // Its block hashes are the index's own rolling keys (Mooncake's RFC #1527
  // publishers): stores without tokens are placed by them.
  bool hashes_are_keys = false;
  // SGLang's sliding-window component's length in tokens, which its events
  // do not give (FleetIndex::LearnComponents); 0: unknown.
  uint32_t swa_window_tokens = 0;

  absl::string_view Instance(absl::string_view name) const {
    return instance_id.empty() ? name : absl::string_view(instance_id);
  }
  // A store (its blocks placed by its keys: a Mooncake store, an RFC #1527
  // storage daemon): it holds blocks any engine of its tenant and model can
  // read, and serves no request.
  bool IsStore() const { return hashes_are_keys; }
  absl::string_view Tenant() const {
    return tenant.empty() ? absl::string_view("default")
                          : absl::string_view(tenant);
  }
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
  kRemoved = 5,      // the worker left (a pool address no longer resolves)
  kReconnect = 6,    // the connection came back: the engine may have restarted
  kInvalidated = 7,  // SGLang's bridge said so (InvalidateWorker)
};
inline constexpr int kNumClearReasons = 8;
absl::string_view ClearReasonName(ClearReason reason);

// Event types counted per worker (prefixd_index_events_total{type}).
inline constexpr int kNumEventTypes = 4;  // stored, removed, cleared, unknown
inline constexpr std::array<absl::string_view, kNumEventTypes> kEventTypeNames =
    {"BlockStored", "BlockRemoved", "AllBlocksCleared", "unknown"};

// Upper bounds (seconds) of prefixd_index_event_lag_seconds.
inline constexpr std::array<double, 12> kLagBuckets = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

// Which workers an answer lists (each field empty: any). An answer lists
// only the workers with a matched block unless all_workers is set or
// `workers` names them: with thousands of workers a prompt most of them do
// not hold would otherwise cost an entry per worker.
struct WorkerFilter {
  std::vector<std::string> workers;  // by name; each listed, matched or not
  absl::string_view tenant;          // by label; "default" matches ""
  absl::string_view model;           // by label; a worker without one matches
  absl::string_view instance;        // by label (or name)
  bool all_workers = false;          // list those with no matched block too

  // True if it names no worker and no label: only retired workers fail it.
  bool NamesNothing() const {
    return workers.empty() && tenant.empty() && model.empty() &&
           instance.empty();
  }
};

struct RouteQuery {
  absl::Span<const Token> tokens;
  // The prompt's content keys per block (multimodal inputs, prompt
  // embeddings), sorted within each block as events.h's BlockContent;
  // null or empty: none.
  const BlockContent* content = nullptr;
  // Instead of tokens: the prompt's rolling keys (index/keys.h), as a
  // router that hashes itself sends them.
  absl::Span<const uint64_t> keys;
  absl::string_view lora_name;
  int64_t lora_id = 0;
  absl::string_view cache_salt;
  WorkerFilter filter;
  // Also each engine's cumulative tier runs, the stores
  // (WorkerLabels::IsStore) the filter lets through extending them
  // (WorkerMatch::tiers; index/tier_scorer.h): the walk goes on to the end
  // of the prompt's match, keeping each block's holders.
  bool tier_runs = false;
};

// Engine hashes reported without tokens (SGLang's KV indexer API): held,
// given back, or every hash of one tier dropped.
struct HashUpdate {
  enum class Op { kReport, kRevoke, kClearTier };
  Op op = Op::kReport;
  std::string medium = "GPU";
  uint32_t groups = 1;  // a bit per KV-cache group (component)
  absl::Span<const EngineHash> hashes;
};

// Who holds an engine hash, one entry per (worker, medium).
struct HashHolding {
  EngineHash hash = 0;
  absl::string_view worker;
  absl::string_view medium;
  uint32_t groups = 0;  // a bit per group it holds the block in
  const WorkerLabels* labels = nullptr;  // the registry's, never null
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
  // The leading blocks the worker can reuse: for an engine serving a
  // hybrid model, as far as each of its KV-cache groups holds what it needs
  // (index/group_rules.h); otherwise the leading blocks it holds in any
  // medium.
  uint64_t matched_blocks = 0;
  // The leading blocks its full-attention group(s) hold (== matched_blocks
  // for a plain engine).
  uint64_t full_attention_blocks = 0;
  // per medium held along the prompt
  absl::InlinedVector<RouteMedium, 2> mediums;
  // An engine's cumulative tier runs, when the query asked (tier_runs);
  // zero for a store.
  TierRuns tiers;
  WorkerState state = WorkerState::kConnecting;
  int64_t last_seq = -1;
  int64_t lag_ms = 0;
  const WorkerLabels* labels = nullptr;  // the registry's, never null
};

struct RouteResult {
  // matched_blocks desc, then name; the workers with none only as the
  // filter asks (WorkerFilter).
  std::vector<WorkerMatch> workers;
  // The first LIVE engine with matched_blocks > 0 (never a store:
  // WorkerLabels::IsStore); empty if none.
  absl::string_view best_worker;
  uint64_t prompt_blocks = 0;
};

struct MediumCount {
  std::string medium;
  uint64_t blocks = 0;
};

// A KV-cache group a worker's events declared (hybrid models).
struct GroupStatus {
  int group = 0;
  GroupRule rule;
};

struct WorkerStatus {
  std::string worker;
  std::string endpoint;
  WorkerLabels labels;
  WorkerState state = WorkerState::kConnecting;
  std::string state_detail;
  // Why the worker was last cleared or put in ERROR; kept after it
  // recovers (state_detail is then empty).
  std::string last_error;
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
  int64_t event_version = 0;
  std::vector<GroupStatus> groups;  // declared groups; empty: plain engine
};

struct IndexStats {
  std::vector<WorkerStatus> workers;  // sorted by name
  uint64_t entries = 0;
  uint64_t max_entries = 0;
  uint64_t blocks = 0;  // distinct blocks (tree nodes' blocks)
  uint64_t nodes = 0;
  uint64_t engine_hashes = 0;  // kept in the workers' maps (HolderTree)
  DropCounts dropped = {};
  // Filled by InstrumentedIndex (zero from a bare FleetIndex).
  // prefixd_index_event_lag_seconds: per-bucket counts of kLagBuckets (last
  // = +Inf); the exporter makes them cumulative.
  std::array<uint64_t, kLagBuckets.size() + 1> lag_counts = {};
  double lag_sum = 0;
  uint64_t route_requests = 0;
  uint64_t route_prompt_blocks = 0;
  uint64_t route_matched_blocks = 0;
};

class KvIndex {
 public:
  virtual ~KvIndex() = default;

  virtual const IndexOptions& options() const = 0;

  // The worker named `name`, created (CONNECTING) if new; a retired worker
  // of that name comes back. `endpoint` is recorded for ListWorkers.
  virtual WorkerId AddWorker(absl::string_view name,
                             absl::string_view endpoint) = 0;
  // Clears the worker and hides it from Route and Stats until it is added
  // again.
  virtual void RetireWorker(WorkerId worker) = 0;

  // Stream bookkeeping: the state ingestion sees and why (`detail`, which
  // replaces the worker's state_detail; empty clears it), gaps and
  // replays.
  virtual void SetState(WorkerId worker, WorkerState state,
                        absl::string_view detail) = 0;
  virtual void CountGap(WorkerId worker) = 0;
  virtual void CountReplay(WorkerId worker, bool ok) = 0;

  // Applies one decoded batch that the stream numbered `seq`, in order.
  // Blocks of a wrong block_size put the worker in ERROR (cleared); a batch
  // whose stores all have the right size brings it back to LIVE (with its
  // state_detail cleared if it was not LIVE).
  virtual void Apply(WorkerId worker, const KvEventBatch& batch, int64_t seq,
                     absl::Time now) = 0;
  // Drops everything the worker holds and counts `reason`; the worker is
  // CONNECTING with `detail` as its state_detail, and no batch applied
  // (last_seq -1), as its stream starts over.
  virtual void ClearWorker(WorkerId worker, ClearReason reason,
                           absl::string_view detail) = 0;
  // Marks the batch numbered `seq` as consumed without applying it (an
  // undecodable payload, after ClearWorker).
  virtual void SetLastSeq(WorkerId worker, int64_t seq) = 0;

  // Replaces what the worker's registration says of it.
  virtual void SetLabels(WorkerId worker, const WorkerLabels& labels) = 0;
  // Sets only the address of its labels and returns the endpoint the
  // worker is followed at (AddWorker's last), unless RetireWorker retired
  // the worker since AddWorker last added it: then nullopt, and nothing
  // changes.
  virtual std::optional<std::string> SetAddress(WorkerId worker,
                                                absl::string_view address) = 0;
  // The endpoint the worker named `name` is followed at (AddWorker's
  // last), or nullopt when no worker of that name is followed: never
  // added, or retired since.
  virtual std::optional<std::string> EndpointOf(
      absl::string_view name) const = 0;
  // Hash-only reports of a worker (SGLang's KV indexer API), applied in
  // order; a report of a hash some worker stored with tokens holds that
  // block, Route sees it.
  virtual void ApplyHashes(WorkerId worker,
                           absl::Span<const HashUpdate> updates) = 0;
  // The KV-cache group rules a worker's registration declares (SGLang's
  // WorkerCacheSpec), instead of learning them from its events.
  virtual void SetGroupRules(
      WorkerId worker, const std::array<GroupRule, kMaxGroups>& rules) = 0;

  virtual RouteResult Route(const RouteQuery& query) const = 0;
  // The same measure for a prompt given as engine hashes in order.
  virtual RouteResult RouteEngineHashes(absl::Span<const EngineHash> hashes,
                                        const WorkerFilter& filter) const = 0;
  virtual std::vector<HashHolding> HashHoldings(
      absl::Span<const EngineHash> hashes) const = 0;
  virtual IndexStats Stats() const = 0;
};

}  // namespace prefixd

#endif  // PREFIXD_INDEX_KV_INDEX_H_
