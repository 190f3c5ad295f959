// PrefixCache: the whole of prefixd's state, behind one small interface.
//
// Per tenant and namespace it keeps a radix tree of token prefixes whose
// edges carry the engine's KV block IDs (see docs/architecture.md). It answers
// longest-prefix matches, adopts newly computed blocks, pins paths with
// leases, and evicts least-recently-used blocks under a budget. Every block ID
// an engine hands to Insert is, at any moment, either cached in exactly one
// node or has been handed back exactly once (as redundant, evicted,
// invalidated or reset); CheckInvariants() verifies that and the rest.
//
// Tenants are the isolation boundary: a call names its tenant (the server
// takes it from the authenticated principal) and sees nothing of any other.
//
// Thread safety: all methods may be called concurrently. Each tenant has its
// own mutex, so one tenant's calls never wait for another's, except for the
// short exclusive section an Insert needs when the global budget is full and
// blocks of other tenants must be evicted (docs/architecture.md, "Locking").
#ifndef PREFIXD_CORE_CACHE_H_
#define PREFIXD_CORE_CACHE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/block_index.h"
#include "core/clock.h"
#include "core/events.h"
#include "core/mutex.h"
#include "core/types.h"

namespace prefixd {

class Tenant;

struct TenantQuota {
  uint64_t reserved_bytes = 0;  // others can never evict this tenant below it
  uint64_t limit_bytes = std::numeric_limits<uint64_t>::max();  // hard cap
};

struct TenantSpec {
  std::string name;
  TenantQuota quota;
};

// Bounds on what one request or one tenant may use. Request sizes past a
// limit are INVALID_ARGUMENT; counts of things kept (tenants, namespaces,
// leases) past a limit are RESOURCE_EXHAUSTED. Messages name the limit.
struct CacheLimits {
  size_t max_tokens_per_request = 1 << 20;
  size_t max_block_ids_per_request = 1 << 16;
  size_t max_namespaces_per_tenant = 1024;
  size_t max_tenants = 64;
  size_t max_leases_per_tenant = 1 << 16;
  size_t max_namespace_bytes = 128;
  int64_t max_position = int64_t{1} << 32;  // position_offset + tokens
  absl::Duration max_lease_ttl = absl::Hours(24);
};

// Which unpinned leaf block an eviction takes (docs/operations.md,
// "Choosing an eviction policy"). Every policy evicts whole unpinned leaf
// blocks, is deterministic for a given sequence of calls, keeps the budget
// exact and returns every evicted ID exactly once.
enum class EvictionPolicy { kLru, kAdaptive };

// "LRU", "ADAPTIVE": the names of config.proto's EvictionPolicy.
absl::string_view EvictionPolicyName(EvictionPolicy p);
// Case-insensitive "lru" / "adaptive"; false (and *p untouched) otherwise.
bool ParseEvictionPolicy(absl::string_view name, EvictionPolicy* p);

// Retention hints (docs/api.md, "Retention"): blocks with a lower priority
// are evicted first; a hint lapses after its duration, and the block is
// then ordinary (priority 50). Pins stay absolute, and hints never break
// the budget.
inline constexpr int kDefaultRetentionPriority = 50;
inline constexpr int kMaxRetentionPriority = 100;

// A hint for the blocks whose first token lies in [token_begin, token_end)
// of the Insert's tokens; token_end 0 means to the end.
struct RetentionRange {
  uint64_t token_begin = 0;
  uint64_t token_end = 0;
  int priority = kDefaultRetentionPriority;
  absl::Duration duration = absl::ZeroDuration();  // zero: never lapses
};

struct Retention {
  int priority = kDefaultRetentionPriority;
  absl::Duration duration = absl::ZeroDuration();  // zero: never lapses
  std::vector<RetentionRange> ranges;              // sorted, not overlapping
};

struct CacheOptions {
  int block_size = 16;                        // tokens per block
  uint64_t block_bytes = 16 * 131072;         // KV bytes per block
  uint64_t budget_bytes = uint64_t{4} << 30;  // KV bytes the cache may hold
  RopeShift rope_shift = RopeShift::kDeny;
  absl::Duration default_lease_ttl = absl::Seconds(300);
  size_t events_per_tenant = 4096;  // size of each event ring
  // Bytes each ring may hold (EventRing::Bytes); 0: no bound but the count.
  uint64_t event_ring_bytes = uint64_t{4} << 20;
  // Stored events carry their tokens, and a tenant's Cleared event the IDs
  // it removed: what a reader needs to tell others exactly what changed
  // (the KV event publisher, docs/index.md). Off, events stay small.
  bool detailed_events = false;
  CacheLimits limits;
  // Tenants known up front. Others are created on first use when
  // dynamic_tenants is set (with default_quota), else PERMISSION_DENIED.
  std::vector<TenantSpec> tenants;
  bool dynamic_tenants = true;
  TenantQuota default_quota;
  Clock* clock = nullptr;  // nullptr: Clock::Real()
  uint64_t seed = 0;       // lease-id generator seed; 0 = from the OS
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  // ADAPTIVE's remembered evicted blocks per tenant; 0: the budget in blocks.
  uint64_t eviction_history_blocks = 0;
};

// Which tenants a multi-tenant call (Evict, Invalidate, Reset, Stats,
// events) may act on. The server builds it from the principal.
struct TenantScope {
  bool all = false;
  std::vector<std::string> tenants;  // used when !all

  static TenantScope All() { return {true, {}}; }
  static TenantScope One(absl::string_view t) {
    return {false, {std::string(t)}};
  }
  bool Contains(absl::string_view tenant) const;
};

struct Segment {
  std::vector<BlockId> block_ids;
  int64_t cached_position =
      0;                   // absolute position of the first token as cached
  int64_t rope_delta = 0;  // requested position - cached position
};

struct MatchRequest {
  std::string ns;  // namespace (LoRA adapter, cache salt); "" is valid
  absl::Span<const Token> tokens;
  int64_t position_offset = 0;  // absolute position of tokens[0]
  bool pin = false;
  absl::Duration lease_ttl = absl::ZeroDuration();  // zero: the default
};

// Why a match under RoPE DENY stopped: the next query block is cached, but
// at another position, and DENY never offers blocks that need re-rotating.
struct RopeDenial {
  int64_t requested_position = 0;  // of the first block not matched
  int64_t cached_position = 0;     // where that block is cached
};

struct MatchResult {
  uint64_t matched_tokens = 0;
  std::vector<Segment> segments;
  LeaseId lease_id = 0;  // 0 when !pin or nothing matched
  // Set only when DENY stopped the match (see RopeDenial).
  std::optional<RopeDenial> rope_denied;
};

struct InsertRequest {
  std::string ns;
  absl::Span<const Token> tokens;
  absl::Span<const BlockId> block_ids;  // tokens.size() / block_size of them
  int64_t position_offset = 0;
  bool pin = false;
  absl::Duration lease_ttl = absl::ZeroDuration();
  // Set: every block the Insert covers (cached or new) takes this hint.
  // Unset: new blocks get priority 50, cached ones keep theirs.
  std::optional<Retention> retention;
};

struct InsertResult {
  uint64_t cached_tokens = 0;                // leading tokens already present
  std::vector<BlockId> redundant_block_ids;  // caller frees these
  std::vector<BlockId> evicted_block_ids;    // caller frees these
  LeaseId lease_id = 0;
};

struct TenantStats {
  std::string tenant;
  uint64_t reserved_bytes = 0;
  uint64_t limit_bytes = 0;
  uint64_t cached_blocks = 0;
  uint64_t pinned_blocks = 0;
  uint64_t tree_nodes = 0;
  uint64_t namespaces = 0;
  uint64_t active_leases = 0;
  uint64_t match_requests = 0;
  uint64_t match_tokens = 0;
  uint64_t match_hit_tokens = 0;
  uint64_t insert_requests = 0;
  uint64_t inserted_blocks = 0;
  uint64_t redundant_blocks = 0;
  uint64_t lease_expired = 0;
  std::array<uint64_t, kNumEvictReasons> evicted_blocks{};  // by EvictReason
  // By retention class: 0 priority < 50, 1 priority 50 (default or lapsed),
  // 2 priority > 50.
  uint64_t cached_blocks_by_retention[3] = {};
  uint64_t evicted_blocks_by_retention[3] = {};
};

struct CacheStats {
  int block_size = 0;
  uint64_t block_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t budget_blocks = 0;
  uint64_t resident_blocks = 0;      // cached blocks of the tenants in scope
  std::vector<TenantStats> tenants;  // sorted by name
};

// One node of a tree, for the debug dump (pre-order, root excluded).
struct DumpNode {
  int depth = 0;  // 1 for children of the root
  int64_t position = 0;
  uint64_t stamp = 0;
  int pins = 0;
  std::vector<Token> tokens;
  std::vector<BlockId> block_ids;
};

struct EventBatch {
  std::vector<Event> events;
  uint64_t next_sequence = 1;  // pass as from_sequence to continue
  // True when events between from_sequence and events.front() were dropped
  // from the ring: the reader must resynchronize (e.g. from a dump).
  bool missed = false;
};

// The header of a snapshot: the server's, carried through untouched.
struct SnapshotMeta {
  std::string fingerprint;
  uint64_t epoch = 0;
};

class PrefixCache {
 public:
  // Fails with INVALID_ARGUMENT on impossible options (block_size 0,
  // reservations above the budget, ...), naming the values.
  static absl::StatusOr<std::unique_ptr<PrefixCache>> Create(
      CacheOptions options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Longest whole-block prefix of req.tokens cached in (tenant, req.ns).
  // Stamps the matched blocks as most recently used. With req.pin and a
  // non-empty match, returns a lease that pins exactly the matched blocks.
  absl::StatusOr<MatchResult> Match(absl::string_view tenant,
                                    const MatchRequest& req);

  // Adopts req.block_ids for req.tokens (docs/api.md, "Insert"). On any error
  // nothing changes. `caller` is every tenant the caller may act for: blocks
  // of other tenants it evicts are not returned but parked with their
  // tenant, for its next Insert, Evict or Reset (Tenant::Park); the result
  // carries the tenant's own parked blocks.
  absl::StatusOr<InsertResult> Insert(
      absl::string_view tenant, const InsertRequest& req,
      const TenantScope& caller = TenantScope::All());

  // Many Matches or Inserts of one tenant, in order, with the tenant's lock
  // taken once (Inserts that must evict other tenants' blocks, and all after
  // them, run in the exclusive section). Each result is exactly what the
  // single call would have returned at that point; a failing request does
  // not stop the others.
  std::vector<absl::StatusOr<MatchResult>> MatchBatch(
      absl::string_view tenant, absl::Span<const MatchRequest> reqs);
  std::vector<absl::StatusOr<InsertResult>> InsertBatch(
      absl::string_view tenant, absl::Span<const InsertRequest> reqs,
      const TenantScope& caller = TenantScope::All());

  // Ends a lease. NOT_FOUND for unknown, expired or another tenant's lease.
  absl::Status Release(absl::string_view tenant, LeaseId lease);

  // Renews every lease by its TTL and returns the time left for each. If any
  // is unknown, NOT_FOUND naming it and no lease is renewed.
  absl::StatusOr<std::vector<absl::Duration>> KeepAlive(
      absl::string_view tenant, absl::Span<const LeaseId> leases);

  // Frees up to `blocks` unpinned blocks of the tenants in scope, least
  // recently used first (tenants above their reservation before the others),
  // and returns their IDs, followed by the scope's parked blocks (Insert).
  absl::StatusOr<std::vector<BlockId>> Evict(const TenantScope& scope,
                                             uint64_t blocks);

  // Removes the nodes holding `block_ids` and everything below them; returns
  // every removed ID. Leases on removed paths end. NOT_FOUND, changing
  // nothing, if an ID is not cached by a tenant in scope.
  absl::StatusOr<std::vector<BlockId>> Invalidate(
      const TenantScope& scope, absl::Span<const BlockId> block_ids);

  // Drops every tree and lease of the tenants in scope; returns their IDs
  // and their parked blocks (Insert).
  std::vector<BlockId> Reset(const TenantScope& scope);

  // Expires leases whose TTL has passed (calls do this lazily for their own
  // tenant; the server also calls it periodically). Returns how many ended.
  size_t ExpireLeases();

  CacheStats Stats(const TenantScope& scope) const;

  // Events of one tenant with sequence >= from_sequence, at most max_events.
  absl::StatusOr<EventBatch> ReadEvents(absl::string_view tenant,
                                        uint64_t from_sequence,
                                        size_t max_events) const;
  // The highest Event::order handed out so far (0: none). Every event whose
  // order is <= a value read here is in its ring by the time a ReadEvents
  // that starts after the read can see it.
  uint64_t last_event_order() const { return event_order_.load(); }
  // Every tenant that exists, in creation order.
  std::vector<std::string> TenantNames() const;

  // The tree of (tenant, ns), pre-order. NOT_FOUND for an unknown tenant or
  // namespace.
  absl::StatusOr<std::vector<DumpNode>> Dump(absl::string_view tenant,
                                             absl::string_view ns) const;
  // Namespaces that have a tree, sorted.
  absl::StatusOr<std::vector<std::string>> Namespaces(
      absl::string_view tenant) const;

  // Serializes every tenant's trees, leases (with the time they have left),
  // counters and event sequence, with a CRC-32 (format in snapshot.cc).
  std::string SaveSnapshot(const SnapshotMeta& meta) const;
  // The header of a snapshot, after checking its magic and checksum:
  // DATA_LOSS for anything truncated or corrupt.
  static absl::StatusOr<SnapshotMeta> ReadSnapshotMeta(absl::string_view bytes);
  // Restores a snapshot into this cache, which must be empty. DATA_LOSS for
  // a damaged file, FAILED_PRECONDITION for one that does not fit this
  // configuration (block size, budget, limits, unknown tenants). On error
  // the cache is half-built: discard it and start from a new one.
  absl::StatusOr<SnapshotMeta> LoadSnapshot(absl::string_view bytes);

  // Verifies every structural invariant (docs/architecture.md); returns
  // INTERNAL describing the first violation. Takes every lock: for tests.
  absl::Status CheckInvariants() const;

  const CacheOptions& options() const { return options_; }
  uint64_t budget_blocks() const { return budget_blocks_; }

 private:
  explicit PrefixCache(CacheOptions options);

  absl::StatusOr<Tenant*> FindOrCreateTenant(absl::string_view name);
  Tenant* FindTenant(absl::string_view name) const;
  std::vector<Tenant*> TenantsIn(const TenantScope& scope) const;
  std::vector<Tenant*> AllTenants() const;
  bool AllTenantsEmpty() const;

  absl::Status ValidateMatch(const MatchRequest& req) const;
  absl::Status ValidateInsert(const InsertRequest& req) const;
  // The body of Match with t->mu held and t's leases expired at `now`.
  absl::StatusOr<MatchResult> MatchLocked(Tenant* t, const MatchRequest& req,
                                          absl::Time now);
  // The body of Insert with t->mu held. `all` is null on the fast path
  // (only t locked: sets *needs_exclusive if other tenants must give up
  // blocks) and every tenant, all locked, in the exclusive section.
  absl::StatusOr<InsertResult> InsertLocked(Tenant* t, const InsertRequest& req,
                                            const TenantScope& caller,
                                            const std::vector<Tenant*>* all,
                                            bool* needs_exclusive);
  // Evicts up to n blocks, globally LRU among `from`, skipping tenants at or
  // below their reservation when respect_reserved. Appends the IDs of
  // tenants in `caller` to *out and parks the others' (null: all to *out).
  // Returns how many blocks went. REQUIRES: every tenant's mutex held
  // exclusively by the caller (reading a tenant's oldest stamp normalizes
  // its LRU set, tenant.h).
  uint64_t EvictGlobal(const std::vector<Tenant*>& from, uint64_t n,
                       bool respect_reserved, EvictReason reason,
                       const TenantScope* caller, std::vector<BlockId>* out);

  // Admission of a lease that pins `blocks` more of t's blocks (REQUIRES
  // t->mu). Pinned blocks above their tenant's reservation may fill only
  // what the reservations leave of the budget, so that every tenant can
  // always get back to its reservation by evicting unpinned blocks of
  // tenants above theirs. Adds t's share on success; RESOURCE_EXHAUSTED
  // naming the counts, changing nothing, otherwise.
  absl::Status AdmitPins(Tenant* t, uint64_t blocks);

  uint64_t NextStamp() {
    return stamp_.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  const CacheOptions options_;
  Clock* const clock_;
  const uint64_t budget_blocks_;

  BlockIndex index_;                // block ID -> owning tenant and node
  std::atomic<uint64_t> stamp_{0};  // logical recency clock
  std::atomic<int64_t> resident_blocks_{0};  // cached blocks over all tenants
  std::atomic<uint64_t> event_order_{0};     // the last Event::order taken
  // Sum over tenants of max(0, pinned - reserved) blocks (AdmitPins).
  std::atomic<int64_t> pinned_over_reserved_{0};
  std::atomic<uint64_t> reserved_blocks_{0};  // sum over existing tenants

  // Held (before any tenant mutex) by every call that locks more than one
  // tenant: global eviction, Evict, Invalidate, Reset, CheckInvariants.
  mutable Mutex exclusive_mu_ ABSL_ACQUIRED_BEFORE(tenants_mu_);
  mutable Mutex tenants_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tenant>> tenants_
      ABSL_GUARDED_BY(tenants_mu_);
  std::vector<Tenant*> tenant_order_
      ABSL_GUARDED_BY(tenants_mu_);  // creation order
  uint64_t seed_;  // lease-id generators of new tenants derive from it
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_CACHE_H_
