// The plain structs PrefixCache's interface takes and returns: options and
// limits, requests and results, statistics, dumps and event batches. Kept
// apart from cache.h so that core's internals (tenant.h) can use them
// without the cache class itself.
#ifndef PREFIXD_CORE_CACHE_TYPES_H_
#define PREFIXD_CORE_CACHE_TYPES_H_

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/clock.h"
#include "core/event_ring.h"
#include "core/types.h"

namespace prefixd {

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

// How a tenant picks the block to evict (docs/architecture.md, "Eviction").
// Every policy evicts whole unpinned leaf blocks, is deterministic for a
// given sequence of calls and keeps the budget exact.
enum class EvictionPolicy {
  kLru,       // least recently used leaf
  kAdaptive,  // ARC adapted to leaf eviction, per tenant
  kShadow,    // LIRS-like, overruled by LRU when an LRU shadow hits more
};
// "LRU", "ADAPTIVE", "SHADOW"
absl::string_view EvictionPolicyName(EvictionPolicy p);
// Case-insensitive "lru" / "adaptive" / "shadow"; false (leaving *p) for
// anything else.
bool ParseEvictionPolicy(absl::string_view name, EvictionPolicy* p);

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
  // ADAPTIVE's remembered evicted blocks per tenant, in each of its two
  // histories; 0: the budget in blocks. At most kMaxEvictionHistoryBlocks.
  uint64_t eviction_history_blocks = 0;
};
inline constexpr uint64_t kMaxEvictionHistoryBlocks = uint64_t{1} << 32;

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
  // Absolute position of the first token as cached.
  int64_t cached_position = 0;
  int64_t rope_delta = 0;  // requested position - cached position
};

struct MatchQuery {
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

// Retention hints (an Insert's `retention`): a priority per block, lower
// evicted first, lapsing after a duration (docs/api.md, "Retention";
// docs/architecture.md says how the tenant keeps them).
inline constexpr int kDefaultRetentionPriority = 50;
inline constexpr int kMaxRetentionPriority = 100;
struct RetentionRange {
  uint64_t token_begin = 0;
  uint64_t token_end = 0;  // 0: to the end of the Insert's tokens
  int priority = kDefaultRetentionPriority;
  absl::Duration duration = absl::ZeroDuration();  // zero: never lapses
};
struct Retention {
  int priority = kDefaultRetentionPriority;
  absl::Duration duration = absl::ZeroDuration();  // zero: never lapses
  std::vector<RetentionRange> ranges;              // sorted, not overlapping
};

struct InsertRequest {
  std::string ns;
  absl::Span<const Token> tokens;
  absl::Span<const BlockId> block_ids;  // tokens.size() / block_size of them
  int64_t position_offset = 0;
  bool pin = false;
  absl::Duration lease_ttl = absl::ZeroDuration();
  std::optional<Retention> retention;
};

struct InsertResult {
  uint64_t cached_tokens = 0;                // leading tokens already present
  std::vector<BlockId> redundant_block_ids;  // caller frees these
  std::vector<BlockId> evicted_block_ids;    // caller frees these
  LeaseId lease_id = 0;
};

// The retention classes of TenantUsage's counts, as Stats and /metrics
// name them.
inline constexpr const char* kRetentionClassNames[3] = {"low", "default",
                                                        "high"};

struct TenantUsage {
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
  // By retention priority: [0] below 50, [1] 50 (default or lapsed), [2]
  // above. Evicted counts the policy's evictions (budget, limit, requested)
  // by the block's priority when it went.
  // kRetentionClassNames names them.
  uint64_t cached_blocks_by_retention[3] = {};
  uint64_t evicted_blocks_by_retention[3] = {};
};

struct CacheStats {
  int block_size = 0;
  uint64_t block_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t budget_blocks = 0;
  uint64_t resident_blocks = 0;      // cached blocks of the tenants in scope
  std::vector<TenantUsage> tenants;  // sorted by name
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

}  // namespace prefixd

#endif  // PREFIXD_CORE_CACHE_TYPES_H_
