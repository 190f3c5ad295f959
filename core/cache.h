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

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "core/block_index.h"
#include "core/cache_types.h"
#include "core/types.h"

namespace prefixd {

class Tenant;
class TenantsLock;
class Node;
// The lock of a tenant, for the lock annotations below (tenant.h).
Mutex& TenantMutex(const Tenant* t);

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
                                    const MatchQuery& req);

  // Adopts req.block_ids for req.tokens (docs/api.md, "Insert"). On any error
  // nothing changes. `caller` is every tenant the caller may act for: blocks
  // of other tenants it evicts are not returned but parked with their
  // tenant, for its next Insert, Evict or Reset (EventOutbox::Park); the result
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
      absl::string_view tenant, absl::Span<const MatchQuery> reqs);
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
  // The most bytes SaveSnapshot can write for a cache of these options at
  // every limit (tenants, namespaces, leases, budget blocks in one-block
  // nodes, IDs of every width), with up to budget blocks of IDs parked per
  // tenant. A larger file is not a snapshot of this configuration, so a
  // reader may refuse it before reading it. Saturates at UINT64_MAX.
  uint64_t MaxSnapshotBytes() const;
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
  // A new tenant with `quota`, last in creation order.
  Tenant* AddTenant(absl::string_view name, const TenantQuota& quota)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(tenants_mu_);
  Tenant* FindTenant(absl::string_view name) const;
  std::vector<Tenant*> TenantsIn(const TenantScope& scope) const;
  std::vector<Tenant*> AllTenants() const;
  bool AllTenantsEmpty() const;

  absl::Status ValidateMatch(const MatchQuery& req) const;
  absl::Status ValidateInsert(const InsertRequest& req) const;
  // The body of Match, with t's leases expired at `now`.
  absl::StatusOr<MatchResult> MatchLocked(Tenant* t, const MatchQuery& req,
                                          absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  // Insert runs in three steps. PlanInsert walks the tree, classifies the
  // caller's IDs (cached, redundant, new) and claims the IDs it will adopt;
  // the budget check decides whether the plan fits (FitBudget with t alone
  // locked, FitBudgetEvicting in the exclusive section); ApplyInsert
  // changes the tree and cannot fail. A plan that does not go ahead is
  // dropped (DropPlan), which undoes its claim and reservation.
  struct InsertPlan;
  enum class Budget {
    kFits,            // go ahead
    kNeedsExclusive,  // only other tenants' blocks can make room
    kRefused,         // cannot fit: InsertPlan::refusal says why
  };
  // Fills *plan, a new InsertPlan; on error nothing is claimed.
  absl::Status PlanInsert(Tenant* t, const InsertRequest& req, InsertPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  // The tenant's own limit: sets need_own, or the refusal.
  bool FitOwnLimit(const Tenant* t, InsertPlan* plan)
      ABSL_SHARED_LOCKS_REQUIRED(TenantMutex(t));
  // The fast path: reserves the plan's net new blocks in the resident count
  // if the budget has room for them, else kNeedsExclusive. Never evicts
  // another tenant's blocks.
  Budget FitBudget(Tenant* t, const InsertRequest& req, InsertPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  // The exclusive section (`all` holds every tenant): sets need_global, the
  // blocks other tenants above their reservation must give up.
  Budget FitBudgetEvicting(Tenant* t, const InsertRequest& req,
                           const TenantsLock& all, InsertPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  // Admission of the lease, last, when req.pin.
  Budget FitPins(Tenant* t, const InsertRequest& req, InsertPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  void DropPlan(const InsertPlan& plan);
  // Stores in *out the result of a plan the budget check judged `verdict`
  // (kFits or kRefused); *out is the batch's slot, so that the result is
  // not moved once more. `all`: every tenant, locked, when
  // plan->need_global > 0.
  void Conclude(Tenant* t, const InsertRequest& req, const TenantScope& caller,
                Budget verdict, const TenantsLock* all, InsertPlan* plan,
                absl::StatusOr<InsertResult>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  InsertResult ApplyInsert(Tenant* t, const InsertRequest& req,
                           const TenantScope& caller, const TenantsLock* all,
                           InsertPlan* plan)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  // Splits, stamps and attaches the plan's blocks; returns the node that
  // holds the last block of the request.
  Node* PlaceBlocks(Tenant* t, const InsertRequest& req, const InsertPlan& plan,
                    uint64_t stamp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));
  // Evicts up to n blocks, globally LRU among the tenants `from` holds,
  // skipping tenants at or below their reservation when respect_reserved.
  // Appends the IDs of tenants in `caller` to *out and parks the others'
  // (null: all to *out). Returns how many blocks went.
  uint64_t EvictGlobal(const TenantsLock& from, uint64_t n,
                       bool respect_reserved, EvictReason reason,
                       const TenantScope* caller, std::vector<BlockId>* out);

  // Admission of a lease that pins `blocks` more of t's blocks. Pinned blocks
  // above their tenant's reservation may fill only what the reservations leave
  // of the budget, so that every tenant can always get back to its reservation
  // by evicting unpinned blocks of tenants above theirs. Adds t's share on
  // success; RESOURCE_EXHAUSTED naming the counts, changing nothing, otherwise.
  absl::Status AdmitPins(Tenant* t, uint64_t blocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t));

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
