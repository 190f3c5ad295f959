// A deliberately simple model of PrefixCache's semantics, for differential
// tests and fuzzers (in the style of rax's fuzzTest): a map from each cached
// whole-block prefix to its block, LRU by scanning everything, and feasibility
// checked by trying the evictions on a copy. ADAPTIVE the same way: a class
// per block, the history as two lists of (namespace, prefix) searched
// linearly, the victim by a full scan. Retention hints as a plain priority
// and lapse time per block; the victim is the minimum of (effective
// priority, the policy's order). Slow and obviously right; it shares no code
// with the real cache.
#ifndef PREFIXD_CORE_REFERENCE_MODEL_H_
#define PREFIXD_CORE_REFERENCE_MODEL_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/cache.h"

namespace prefixd {

class ReferenceModel {
 public:
  struct Quota {
    uint64_t reserved = 0;  // blocks
    uint64_t limit = 0;     // blocks
  };
  // `history_blocks`: ADAPTIVE's per-list history size (0: the budget).
  ReferenceModel(int block_size, uint64_t budget_blocks, RopeShift shift,
                 std::map<std::string, Quota> tenants, absl::Duration lease_ttl,
                 EvictionPolicy policy = EvictionPolicy::kLru,
                 uint64_t history_blocks = 0);

  // Results use the real cache's types; lease IDs are the model's own.
  absl::StatusCode Match(const std::string& tenant, const std::string& ns,
                         const std::vector<Token>& tokens, int64_t offset,
                         bool pin, MatchResult* out);
  absl::StatusCode Insert(const std::string& tenant, const std::string& ns,
                          const std::vector<Token>& tokens,
                          const std::vector<BlockId>& ids, int64_t offset,
                          bool pin, InsertResult* out,
                          const std::optional<Retention>& retention = {});
  absl::StatusCode Release(const std::string& tenant, LeaseId lease);
  absl::StatusCode KeepAlive(const std::string& tenant, LeaseId lease);
  std::vector<BlockId> Evict(uint64_t n);  // scope: every tenant
  absl::StatusCode Invalidate(const std::vector<BlockId>& ids,
                              std::vector<BlockId>* removed);
  std::vector<BlockId> Reset(const std::string& tenant);
  void Advance(absl::Duration d);  // and expire leases

  uint64_t Cached(const std::string& tenant) const;
  uint64_t Pinned(const std::string& tenant) const;
  size_t Leases(const std::string& tenant) const;
  // TenantUsage's cached / evicted blocks by retention class.
  std::array<uint64_t, 3> CachedByRetention(const std::string& tenant) const;
  std::array<uint64_t, 3> EvictedByRetention(const std::string& tenant) const;

 private:
  using Key = std::vector<Token>;  // whole-block prefix, within one tree
  struct Block {
    BlockId id;
    uint64_t stamp;
    int64_t position;
    int pins = 0;
    bool seen_again = false;  // ADAPTIVE's and SHADOW's T2 (else T1)
    int priority = kDefaultRetentionPriority;
    absl::Time lapse = absl::InfiniteFuture();
  };
  struct TreeKey {
    std::string tenant, ns;
    bool operator<(const TreeKey& o) const {
      return tenant != o.tenant ? tenant < o.tenant : ns < o.ns;
    }
  };
  struct Lease {
    std::string tenant;
    TreeKey tree;
    std::vector<Key> path;
    absl::Time expiry;
  };
  // An evicted block, as ADAPTIVE's history remembers it: its list keeps
  // it while fewer than the history size were pushed to the list after it.
  struct Ghost {
    std::string ns;
    Key key;
    uint64_t push;  // the list's push number
    bool Is(const std::string& n, const Key& k) const {
      return ns == n && key == k;
    }
  };
  struct Adaptive {  // one tenant's ARC state
    uint64_t target = 0;
    std::vector<Ghost> lists[2];  // B1, B2; oldest first
    uint64_t pushes[2] = {0, 0};
  };
  // One of SHADOW's shadow caches: fingerprints by list, oldest first
  // (LRU: list 0 only; LIRS: probation, protected, and the ghosts).
  struct ShadowCache {
    bool lirs = false;
    uint64_t capacity = 1, probation = 0, ghost_capacity = 0;
    std::vector<uint64_t> lists[2];
    std::vector<uint64_t> ghosts;
    bool Access(uint64_t fp);
  };
  struct Shadows {  // one tenant's SHADOW state
    ShadowCache lru, lirs;
    uint64_t period = 1;
    uint64_t hits[2] = {0, 0};  // LRU's, LIRS's
    uint64_t accesses = 0;
  };
  struct State {
    std::map<TreeKey, std::map<Key, Block>> trees;
    std::set<BlockId> ids;
    uint64_t now_stamp = 0;
    std::map<std::string, Adaptive> adaptive;  // by tenant
    std::map<std::string, Shadows> shadows;    // by tenant
    std::map<std::string, std::array<uint64_t, 3>> evicted_by_retention;
  };
  struct Victim {
    TreeKey tree;
    Key key;
  };

  static Key Prefix(const std::vector<Token>& tokens, size_t blocks, int bs);
  // The priority a block has now: its hint's until it lapses, then 50.
  int Priority(const Block& b) const;
  bool HasChild(const State& s, const TreeKey& t, const Key& k) const;
  uint64_t CachedIn(const State& s, const std::string& tenant) const;
  uint64_t PinnedIn(const State& s, const std::string& tenant) const;
  // Whether pinning `more` unpinned blocks of `tenant` keeps the pinned
  // blocks above reservations within what the reservations leave of the
  // budget (PrefixCache::AdmitPins).
  bool PinsFit(const State& s, const std::string& tenant, uint64_t more) const;
  // The LRU evictable block among tenants accepted by `eligible`, skipping
  // `guarded` keys of tree `guard_tree`.
  bool FindVictim(const State& s, const std::set<std::string>& eligible,
                  bool respect_reserved, const TreeKey* guard_tree,
                  const std::set<Key>& guarded, Victim* v) const;
  // The victim tenant `tenant`'s policy picks among `leaves` (its evictable
  // ones); false if there are none.
  bool PickLeaf(const State& s, const std::string& tenant,
                const std::vector<Victim>& leaves, Victim* v) const;
  // Evicts v's block (and, under ADAPTIVE, remembers it).
  BlockId Remove(State& s, const Victim& v);
  // A tenant's ARC state, created with the target at half its limit.
  Adaptive& ArcOf(State& s, const std::string& tenant) const;
  // SHADOW: a tenant's shadows, created empty.
  Shadows& ShadowsOf(State& s, const std::string& tenant) const;
  // SHADOW: an Insert of `blocks` blocks of `tokens` into (tenant, ns)
  // succeeded: its sampled blocks, root first, go to the shadows.
  void Observe(State& s, const std::string& tenant, const std::string& ns,
               const std::vector<Token>& tokens, size_t blocks) const;
  // SHADOW: whether the LRU shadow leads (the victim is then LRU's).
  bool LruLeads(const State& s, const std::string& tenant) const;
  // The blocks a tenant's policy can hold: its limit within the budget.
  uint64_t Cap(const std::string& tenant) const {
    return std::min(quotas_.at(tenant).limit, budget_);
  }
  // ADAPTIVE, SHADOW: the class of a block cached anew (adapting ADAPTIVE's
  // target).
  bool SeenAgain(State& s, const std::string& tenant, const std::string& ns,
                 const Key& key);
  void DropEmpty(State& s);
  void EndLease(LeaseId id);

  int bs_;
  uint64_t budget_;
  RopeShift shift_;
  std::map<std::string, Quota> quotas_;
  absl::Duration ttl_;
  EvictionPolicy policy_;
  uint64_t history_;
  absl::Time now_ = absl::UnixEpoch();
  State state_;
  std::map<LeaseId, Lease> leases_;
  LeaseId next_lease_ = 1;
};

}  // namespace prefixd

#endif  // PREFIXD_CORE_REFERENCE_MODEL_H_
