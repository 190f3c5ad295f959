#include "core/cache.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <random>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "core/radix_tree.h"
#include "core/tenant.h"

namespace prefixd {

absl::string_view EvictReasonName(EvictReason reason) {
  switch (reason) {
    case EvictReason::kBudget:
      return "budget";
    case EvictReason::kLimit:
      return "limit";
    case EvictReason::kRequested:
      return "requested";
    case EvictReason::kInvalidated:
      return "invalidated";
    case EvictReason::kReset:
      return "reset";
  }
  return "unknown";
}

bool TenantScope::Contains(absl::string_view tenant) const {
  return all ||
         std::find(tenants.begin(), tenants.end(), tenant) != tenants.end();
}

namespace {

// The state of tenant i's lease-ID generator (SplitMix64, whose state steps
// by the golden ratio G). States must not differ by a multiple of G, or two
// tenants draw the same IDs a few leases apart and one finds the other's ID
// in its own table: seed ^ (G * (i + 1)) did for small seeds. The finalizer
// scatters them.
uint64_t TenantSeed(uint64_t seed, uint32_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// At most `max` IDs, then "... (N in all)": error messages stay readable.
std::string FormatIds(absl::Span<const BlockId> ids, size_t max = 8) {
  std::string out =
      absl::StrJoin(ids.subspan(0, std::min(max, ids.size())), ", ");
  if (ids.size() > max)
    absl::StrAppend(&out, ", ... (", ids.size(), " in all)");
  return out;
}

// Names (tenants and namespaces) are printable ASCII without spaces, so they
// can appear in logs, metrics labels and error messages unescaped.
absl::Status ValidateName(absl::string_view what, absl::string_view name,
                          size_t max_bytes, bool allow_empty) {
  if (name.empty() && !allow_empty) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  }
  if (name.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s of %d bytes exceeds the limit of %d bytes", what,
                        name.size(), max_bytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s has byte 0x%02x at offset %d; allowed are "
                          "printable ASCII characters without "
                          "spaces",
                          what, c, i));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePositions(int64_t offset, size_t tokens,
                               const CacheLimits& limits) {
  if (offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("position_offset %d is negative", offset));
  }
  if (offset > limits.max_position ||
      static_cast<int64_t>(tokens) > limits.max_position - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "position_offset %d + %d tokens exceeds max_position %d", offset,
        tokens, limits.max_position));
  }
  return absl::OkStatus();
}

absl::Status ValidateTokens(absl::Span<const Token> tokens,
                            const CacheLimits& limits) {
  if (tokens.empty()) return absl::InvalidArgumentError("tokens is empty");
  if (tokens.size() > limits.max_tokens_per_request) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d tokens exceed max_tokens_per_request %d",
                        tokens.size(), limits.max_tokens_per_request));
  }
  return absl::OkStatus();
}

absl::Status ValidatePriority(absl::string_view what, int priority,
                              absl::Duration duration) {
  if (priority < 0 || priority > kMaxRetentionPriority) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s priority %d is outside [0, %d]", what, priority,
                        kMaxRetentionPriority));
  }
  if (duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " duration ", absl::FormatDuration(duration), " is negative"));
  }
  return absl::OkStatus();
}

// Ranges are offsets into the Insert's tokens: sorted, disjoint, non-empty.
absl::Status ValidateRetention(const Retention& r, size_t tokens) {
  RETURN_IF_ERROR(ValidatePriority("retention", r.priority, r.duration));
  uint64_t prev_end = 0;
  for (size_t i = 0; i < r.ranges.size(); ++i) {
    const RetentionRange& x = r.ranges[i];
    const std::string what = absl::StrCat("retention range ", i);
    RETURN_IF_ERROR(ValidatePriority(what, x.priority, x.duration));
    const uint64_t end = x.token_end == 0 ? tokens : x.token_end;
    if (end > tokens) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s token_end %d exceeds the Insert's %d tokens", what, end, tokens));
    }
    if (x.token_begin >= end) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s is empty: token_begin %d >= token_end %d", what,
                          x.token_begin, end));
    }
    if (i > 0 && x.token_begin < prev_end) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "retention ranges %d [%d, %d) and %d [%d, %d) overlap or are out "
          "of order",
          i - 1, r.ranges[i - 1].token_begin, prev_end, i, x.token_begin, end));
    }
    prev_end = end;
  }
  return absl::OkStatus();
}

Hint MakeHint(int priority, absl::Duration duration, absl::Time now) {
  Hint h;
  h.priority = priority;
  if (priority != kDefaultRetentionPriority && duration > absl::ZeroDuration())
    h.lapse = now + duration;
  return h;
}

// An Insert's blocks [begin, end) that share one hint: each block takes the
// hint of the range holding its first token, else the Insert's.
struct HintRun {
  size_t begin, end;
  Hint hint;
};
std::vector<HintRun> HintRuns(const Retention& r, size_t blocks,
                              size_t block_size, absl::Time now) {
  const uint64_t tokens = blocks * block_size;
  std::vector<HintRun> runs;
  size_t ri = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const uint64_t first = b * block_size;
    auto end_of = [&](const RetentionRange& x) {
      return x.token_end == 0 ? tokens : x.token_end;
    };
    while (ri < r.ranges.size() && end_of(r.ranges[ri]) <= first) ++ri;
    const bool in = ri < r.ranges.size() && r.ranges[ri].token_begin <= first;
    const Hint h =
        in ? MakeHint(r.ranges[ri].priority, r.ranges[ri].duration, now)
           : MakeHint(r.priority, r.duration, now);
    if (!runs.empty() && runs.back().hint == h) {
      runs.back().end = b + 1;
    } else {
      runs.push_back({b, b + 1, h});
    }
  }
  return runs;
}

// Gives the cached blocks of an Insert, the path from the root to `end`,
// their hints, splitting nodes where the hint changes inside one.
void HintCachedPath(Tenant* t, Node* end, absl::Span<const HintRun> runs)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(TenantMutex(t)) {
  std::vector<Node*> path;
  for (Node* n = end; !n->is_root(); n = n->parent) path.push_back(n);
  std::reverse(path.begin(), path.end());
  size_t first = 0;  // the Insert's block at the node's head
  auto run = runs.begin();
  for (Node* n : path) {
    const size_t last = first + n->num_blocks();
    while (true) {
      while (run->end <= first) ++run;
      if (run->end >= last) break;
      // The hint changes inside n: its head up to the change goes apart.
      t->SetHint(t->SplitAt(n, run->end - first), run->hint);
      first = run->end;
    }
    t->SetHint(n, run->hint);
    first = last;
  }
  assert(first <= runs.back().end);
}

absl::StatusOr<absl::Duration> LeaseTtl(absl::Duration requested,
                                        const CacheOptions& o) {
  if (requested < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease_ttl ", absl::FormatDuration(requested), " is negative"));
  }
  if (requested > o.limits.max_lease_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lease_ttl ", absl::FormatDuration(requested), " exceeds the limit of ",
        absl::FormatDuration(o.limits.max_lease_ttl)));
  }
  return requested == absl::ZeroDuration() ? o.default_lease_ttl : requested;
}

// The same words for a lease that never existed, expired, was released or
// belongs to another tenant: callers cannot tell these apart.
absl::Status LeaseNotFound(LeaseId id) {
  return absl::NotFoundError(absl::StrFormat(
      "lease %016x not found (never issued, expired or released)", id));
}

uint64_t BlocksOf(uint64_t bytes, uint64_t block_bytes, uint64_t cap) {
  return std::min(bytes / block_bytes, cap);
}

// The common start of a batch: validate every request (the results of bad
// ones are their errors), and find or create the tenant only if at least one
// is valid, so that a batch of bad requests changes nothing.
template <typename Req, typename Result, typename Validate, typename Find>
absl::StatusOr<Tenant*> StartBatch(absl::Span<const Req> reqs,
                                   Validate validate, Find find_tenant,
                                   std::vector<absl::Status>* valid,
                                   std::vector<absl::StatusOr<Result>>* out) {
  valid->reserve(reqs.size());
  out->reserve(reqs.size());
  bool any = false;
  for (const Req& req : reqs) {
    valid->push_back(validate(req));
    any |= valid->back().ok();
    // A placeholder for the valid ones, replaced when they run.
    out->push_back(valid->back().ok() ? absl::UnknownError("not run")
                                      : valid->back());
  }
  if (!any) return absl::InvalidArgumentError("no valid request in the batch");
  absl::StatusOr<Tenant*> t = find_tenant();
  if (!t.ok()) out->assign(reqs.size(), t.status());
  return t;
}

// CacheOptions' sizes: blocks, the budget, the event rings, lease TTLs.
absl::Status ValidateSizes(const CacheOptions& o) {
  if (o.block_size < 1 || o.block_size > 65536) {
    return absl::InvalidArgumentError(
        absl::StrFormat("block_size %d is outside [1, 65536]", o.block_size));
  }
  if (o.block_bytes == 0) return absl::InvalidArgumentError("block_bytes is 0");
  if (o.budget_bytes / o.block_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("kv budget of %d bytes holds no block of %d bytes",
                        o.budget_bytes, o.block_bytes));
  }
  if (o.events_per_tenant == 0)
    return absl::InvalidArgumentError("events_per_tenant is 0");
  if (o.default_lease_ttl <= absl::ZeroDuration() ||
      o.default_lease_ttl > o.limits.max_lease_ttl) {
    return absl::InvalidArgumentError(absl::StrCat(
        "default lease ttl ", absl::FormatDuration(o.default_lease_ttl),
        " is not in (0, ", absl::FormatDuration(o.limits.max_lease_ttl), "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePolicy(const CacheOptions& o) {
  if (o.eviction_policy != EvictionPolicy::kLru &&
      o.eviction_policy != EvictionPolicy::kAdaptive &&
      o.eviction_policy != EvictionPolicy::kShadow) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "eviction_policy %d is none of LRU (0), ADAPTIVE (1), SHADOW (2)",
        static_cast<int>(o.eviction_policy)));
  }
  if (o.eviction_history_blocks > kMaxEvictionHistoryBlocks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("eviction_history_blocks %d exceeds the limit of %d",
                        o.eviction_history_blocks, kMaxEvictionHistoryBlocks));
  }
  return absl::OkStatus();
}

// How many tenants there may be, and the quota of those made on demand.
absl::Status ValidateTenantLimits(const CacheOptions& o) {
  if (o.limits.max_tenants > BlockIndex::kMaxTenants) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tenants %d is above the supported %d",
                        o.limits.max_tenants, BlockIndex::kMaxTenants));
  }
  if (o.tenants.size() > o.limits.max_tenants) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d tenants configured, max_tenants is %d",
                        o.tenants.size(), o.limits.max_tenants));
  }
  if (o.default_quota.reserved_bytes > o.default_quota.limit_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "default tenant quota reserves %d bytes above its limit of %d",
        o.default_quota.reserved_bytes, o.default_quota.limit_bytes));
  }
  return absl::OkStatus();
}

// The configured tenants: valid, distinct names; reservations within their
// limits and, together, within the budget.
absl::Status ValidateTenantSpecs(const CacheOptions& o) {
  absl::flat_hash_set<std::string> names;
  uint64_t reserved_total = 0;
  for (const TenantSpec& t : o.tenants) {
    RETURN_IF_ERROR(ValidateName(absl::StrCat("tenant name '", t.name, "'"),
                                 t.name, o.limits.max_namespace_bytes,
                                 /*allow_empty=*/false));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tenant '", t.name, "' configured twice"));
    }
    if (t.quota.reserved_bytes > t.quota.limit_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tenant '%s' reserves %d bytes, above its limit of %d bytes", t.name,
          t.quota.reserved_bytes, t.quota.limit_bytes));
    }
    reserved_total += t.quota.reserved_bytes;
  }
  if (reserved_total > o.budget_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tenant reservations total %d bytes, above the budget of %d bytes",
        reserved_total, o.budget_bytes));
  }
  return absl::OkStatus();
}

// The nodes of `tree`, pre-order, children in token order so that dumps
// are stable across runs.
std::vector<DumpNode> DumpTree(const Tree& tree) {
  std::vector<DumpNode> out;
  auto visit = [&](auto&& self, const Node& node, int depth) -> void {
    std::vector<const Node*> kids;
    for (const auto& c : node.children) kids.push_back(c.get());
    std::sort(kids.begin(), kids.end(), [](const Node* a, const Node* b) {
      const auto x = a->tokens(), y = b->tokens();
      return std::lexicographical_compare(x.begin(), x.end(), y.begin(),
                                          y.end());
    });
    for (const Node* c : kids) {
      out.push_back(DumpNode{
          depth, c->position, c->stamp, c->pins,
          std::vector<Token>(c->tokens().begin(), c->tokens().end()),
          std::vector<BlockId>(c->block_ids().begin(), c->block_ids().end())});
      self(self, *c, depth + 1);
    }
  };
  visit(visit, tree.root, 1);
  return out;
}

}  // namespace

// The matched blocks of a walk as segments, runs of blocks with one RoPE
// delta (requested position - cached position), merged across nodes that
// agree. Returns how many blocks matched.
size_t AppendSegments(const WalkPath& steps, int64_t position_offset,
                      size_t block_size, std::vector<Segment>* segments) {
  const size_t total_blocks = steps.back().first_block + steps.back().blocks;
  size_t matched_blocks = 0;
  for (const WalkStep& s : steps) {
    const int64_t requested =
        position_offset + static_cast<int64_t>(s.first_block * block_size);
    const int64_t delta = requested - s.node->position;
    if (segments->empty() || segments->back().rope_delta != delta) {
      segments->push_back(Segment{{}, s.node->position, delta});
      segments->back().block_ids.reserve(total_blocks - matched_blocks);
    }
    auto& ids = segments->back().block_ids;
    ids.insert(ids.end(), s.node->block_ids().begin(),
               s.node->block_ids().begin() + s.blocks);
    matched_blocks += s.blocks;
  }
  return matched_blocks;
}

// Where Invalidate cuts: (first listed ID, its index in its node), one cut
// per node, at its first listed block. Splitting once per listed ID would
// copy a long node's head again for every ID (quadratic), and so would
// searching the node's IDs once per listed ID. Each node's IDs are scanned
// once, for the first that is listed (an ID lies in one node only). Nodes
// are cut in the order of their first listed ID, so results keep the order
// they had. REQUIRES: every ID is cached.
std::vector<std::pair<BlockId, size_t>> InvalidationCuts(
    const BlockIndex& index, absl::Span<const BlockId> block_ids) {
  const absl::flat_hash_set<BlockId> listed(block_ids.begin(), block_ids.end());
  absl::flat_hash_set<const Node*> seen;
  std::vector<std::pair<BlockId, size_t>> cuts;
  for (BlockId id : block_ids) {
    const Node* node = index.Find(id)->node;
    if (!seen.insert(node).second) continue;
    const absl::Span<const BlockId> ids = node->block_ids();
    size_t j = 0;
    while (!listed.contains(ids[j])) ++j;
    cuts.push_back({ids[j], j});
  }
  return cuts;
}

// --- Construction and tenants -----------------------------------------------

absl::StatusOr<std::unique_ptr<PrefixCache>> PrefixCache::Create(
    CacheOptions o) {
  RETURN_IF_ERROR(ValidateSizes(o));
  RETURN_IF_ERROR(ValidatePolicy(o));
  RETURN_IF_ERROR(ValidateTenantLimits(o));
  RETURN_IF_ERROR(ValidateTenantSpecs(o));
  return std::unique_ptr<PrefixCache>(new PrefixCache(std::move(o)));
}

PrefixCache::PrefixCache(CacheOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      // Clamped so that signed arithmetic on block counts cannot overflow.
      budget_blocks_(std::min<uint64_t>(
          options_.budget_bytes / options_.block_bytes, uint64_t{1} << 62)),
      seed_(options_.seed != 0 ? options_.seed
                               : (uint64_t{std::random_device{}()} << 32) ^
                                     std::random_device{}()) {
  MutexLock lock(&tenants_mu_);
  for (const TenantSpec& spec : options_.tenants)
    AddTenant(spec.name, spec.quota);
}

PrefixCache::~PrefixCache() = default;

Tenant* PrefixCache::FindTenant(absl::string_view name) const {
  ReaderMutexLock lock(&tenants_mu_);
  auto it = tenants_.find(name);
  return it == tenants_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Tenant*> PrefixCache::FindOrCreateTenant(
    absl::string_view name) {
  if (Tenant* t = FindTenant(name)) return t;
  RETURN_IF_ERROR(ValidateName(absl::StrCat("tenant name '", name, "'"), name,
                               options_.limits.max_namespace_bytes,
                               /*allow_empty=*/false));
  if (!options_.dynamic_tenants) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant '", name, "' is not configured"));
  }
  MutexLock lock(&tenants_mu_);
  auto it = tenants_.find(name);
  if (it != tenants_.end()) return it->second.get();
  if (tenants_.size() >= options_.limits.max_tenants) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("tenant '%s' cannot be created: max_tenants %d reached",
                        name, options_.limits.max_tenants));
  }
  return AddTenant(name, options_.default_quota);
}

Tenant* PrefixCache::AddTenant(absl::string_view name,
                               const TenantQuota& quota) {
  const uint32_t i = static_cast<uint32_t>(tenant_order_.size());
  const uint64_t reserved =
      BlocksOf(quota.reserved_bytes, options_.block_bytes, budget_blocks_);
  auto t = std::make_unique<Tenant>(
      std::string(name), i, reserved,
      BlocksOf(quota.limit_bytes, options_.block_bytes, budget_blocks_),
      options_, &index_, &event_order_, &pinned_over_reserved_,
      TenantSeed(seed_, i));
  reserved_blocks_ += reserved;
  Tenant* raw = t.get();
  tenant_order_.push_back(raw);
  tenants_[std::string(name)] = std::move(t);
  return raw;
}

std::vector<Tenant*> PrefixCache::AllTenants() const {
  ReaderMutexLock lock(&tenants_mu_);
  return tenant_order_;
}

std::vector<Tenant*> PrefixCache::TenantsIn(const TenantScope& scope) const {
  std::vector<Tenant*> out;
  for (Tenant* t : AllTenants()) {
    if (scope.Contains(t->name())) out.push_back(t);
  }
  return out;
}

// --- Match -------------------------------------------------------------------

absl::Status PrefixCache::ValidateMatch(const MatchQuery& req) const {
  const CacheLimits& limits = options_.limits;
  RETURN_IF_ERROR(ValidateTokens(req.tokens, limits));
  RETURN_IF_ERROR(
      ValidateName("namespace", req.ns, limits.max_namespace_bytes, true));
  RETURN_IF_ERROR(
      ValidatePositions(req.position_offset, req.tokens.size(), limits));
  return LeaseTtl(req.lease_ttl, options_).status();
}

absl::StatusOr<MatchResult> PrefixCache::Match(absl::string_view tenant,
                                               const MatchQuery& req) {
  RETURN_IF_ERROR(ValidateMatch(req));
  ASSIGN_OR_RETURN(Tenant * t, FindOrCreateTenant(tenant));
  MutexLock lock(&TenantMutex(t));
  const absl::Time now = clock_->Now();
  t->ExpireLeases(now);
  return MatchLocked(t, req, now);
}

std::vector<absl::StatusOr<MatchResult>> PrefixCache::MatchBatch(
    absl::string_view tenant, absl::Span<const MatchQuery> reqs) {
  std::vector<absl::Status> valid;
  std::vector<absl::StatusOr<MatchResult>> out;
  absl::StatusOr<Tenant*> t = StartBatch(
      reqs, [this](const MatchQuery& r) { return ValidateMatch(r); },
      [&] { return FindOrCreateTenant(tenant); }, &valid, &out);
  if (!t.ok()) return out;
  MutexLock lock(&TenantMutex(*t));
  const absl::Time now = clock_->Now();
  (*t)->ExpireLeases(now);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (valid[i].ok()) out[i] = MatchLocked(*t, reqs[i], now);
  }
  return out;
}

absl::StatusOr<MatchResult> PrefixCache::MatchLocked(Tenant* t,
                                                     const MatchQuery& req,
                                                     absl::Time now) {
  const CacheLimits& limits = options_.limits;
  if (req.pin && t->leases().size() >= limits.max_leases_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tenant '%s' holds %d leases, the limit max_leases_per_tenant",
        t->name(), t->leases().size()));
  }
  const absl::Duration ttl = LeaseTtl(req.lease_ttl, options_).value();
  Tree* tree = t->trees().Find(req.ns);
  const Node* refused = nullptr;
  const WalkPath steps =
      tree == nullptr ? WalkPath{}
                      : Walk(*tree, req.tokens, req.position_offset,
                             options_.rope_shift == RopeShift::kDeny, &refused);
  if (req.pin && !steps.empty()) {
    uint64_t newly_pinned = 0;
    for (const WalkStep& s : steps) {
      if (s.node->pins == 0) newly_pinned += s.blocks;
    }
    RETURN_IF_ERROR(AdmitPins(t, newly_pinned));
  }
  TenantUsage& c = t->counters();
  ++c.match_requests;
  c.match_tokens += req.tokens.size();

  MatchResult result;
  if (refused != nullptr) {
    const size_t at =
        steps.empty() ? 0 : steps.back().first_block + steps.back().blocks;
    result.rope_denied = RopeDenial{
        req.position_offset + static_cast<int64_t>(at * options_.block_size),
        refused->position};
  }
  if (steps.empty()) return result;

  const size_t matched_blocks = AppendSegments(
      steps, req.position_offset, options_.block_size, &result.segments);
  Node* end = steps.back().node;
  if (steps.back().blocks < end->num_blocks())
    end = t->SplitAt(end, steps.back().blocks);
  t->TouchPath(end, NextStamp(), /*insert=*/false);
  result.matched_tokens = matched_blocks * options_.block_size;
  c.match_hit_tokens += result.matched_tokens;
  if (req.pin) result.lease_id = t->leases().Add(end, ttl, now);
  return result;
}

// --- Insert ------------------------------------------------------------------

absl::Status PrefixCache::ValidateInsert(const InsertRequest& req) const {
  const CacheLimits& limits = options_.limits;
  const size_t bs = options_.block_size;
  RETURN_IF_ERROR(ValidateTokens(req.tokens, limits));
  if (req.tokens.size() % bs != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d tokens are not a whole number of blocks of %d",
                        req.tokens.size(), bs));
  }
  if (req.block_ids.size() != req.tokens.size() / bs) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d block_ids for %d tokens; block_size %d needs %d",
        req.block_ids.size(), req.tokens.size(), bs, req.tokens.size() / bs));
  }
  if (req.block_ids.size() > limits.max_block_ids_per_request) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d block_ids exceed max_block_ids_per_request %d",
        req.block_ids.size(), limits.max_block_ids_per_request));
  }
  RETURN_IF_ERROR(
      ValidateName("namespace", req.ns, limits.max_namespace_bytes, true));
  RETURN_IF_ERROR(
      ValidatePositions(req.position_offset, req.tokens.size(), limits));
  RETURN_IF_ERROR(LeaseTtl(req.lease_ttl, options_).status());
  if (req.retention.has_value())
    RETURN_IF_ERROR(ValidateRetention(*req.retention, req.tokens.size()));
  return absl::OkStatus();
}

absl::StatusOr<InsertResult> PrefixCache::Insert(absl::string_view tenant,
                                                 const InsertRequest& req,
                                                 const TenantScope& caller) {
  return std::move(
      InsertBatch(tenant, absl::MakeConstSpan(&req, 1), caller)[0]);
}

// What an Insert will do, worked out before anything changes but the claim
// of its IDs in the block index (DropPlan undoes that).
struct PrefixCache::InsertPlan {
  absl::Time now;
  absl::Duration ttl;    // of the lease, if req.pin
  Tree* tree = nullptr;  // null: the namespace has no tree yet
  // The last node of the cached leading blocks (null: none are cached)
  // and how many of its blocks they take.
  Node* last = nullptr;
  size_t last_blocks = 0;
  size_t cached = 0;              // how many leading blocks are cached
  size_t n_new = 0;               // blocks to attach after them
  uint64_t protected_blocks = 0;  // unpinned blocks this insert touches
  // The caller's IDs for blocks cached under other IDs.
  std::vector<BlockId> redundant;
  std::vector<BlockId> claim;  // redundant and new IDs, claimed in the index
  // Set by the budget check (FitBudget, FitBudgetEvicting).
  uint64_t need_own = 0;     // own blocks to evict: the tenant's limit
  uint64_t need_global = 0;  // blocks to evict from any tenant: the budget
  int64_t reserved = 0;      // added to resident_blocks_ ahead of the apply
  absl::Status refusal;      // why, when the check says kRefused
};

// Runs the batch in order. Inserts that fit the budget run with only the
// tenant locked; from the first one that must evict other tenants' blocks
// on, the rest run in the exclusive section, so the order never changes.
std::vector<absl::StatusOr<InsertResult>> PrefixCache::InsertBatch(
    absl::string_view tenant, absl::Span<const InsertRequest> reqs,
    const TenantScope& caller) {
  std::vector<absl::Status> valid;
  std::vector<absl::StatusOr<InsertResult>> out;
  absl::StatusOr<Tenant*> found = StartBatch(
      reqs, [this](const InsertRequest& r) { return ValidateInsert(r); },
      [&] { return FindOrCreateTenant(tenant); }, &valid, &out);
  if (!found.ok()) return out;
  Tenant* t = *found;
  size_t done = 0;
  {
    MutexLock lock(&TenantMutex(t));
    for (; done < reqs.size(); ++done) {
      if (!valid[done].ok()) continue;
      InsertPlan plan;
      if (absl::Status s = PlanInsert(t, reqs[done], &plan); !s.ok()) {
        out[done] = std::move(s);
        continue;
      }
      const Budget verdict = FitBudget(t, reqs[done], &plan);
      if (verdict == Budget::kNeedsExclusive) {
        DropPlan(plan);
        break;
      }
      Conclude(t, reqs[done], caller, verdict, nullptr, &plan, &out[done]);
    }
  }
  if (done == reqs.size()) return out;
  // The global budget is full: evicting other tenants' blocks needs them all.
  MutexLock exclusive(&exclusive_mu_);
  ReaderMutexLock tenants(&tenants_mu_);
  TenantsLock all(tenant_order_);
  const absl::Time now = clock_->Now();
  for (Tenant* u : all.tenants()) {
    all.AssertHeld(u);
    u->ExpireLeases(now);
  }
  all.AssertHeld(t);
  for (; done < reqs.size(); ++done) {
    if (!valid[done].ok()) continue;
    InsertPlan plan;
    if (absl::Status s = PlanInsert(t, reqs[done], &plan); !s.ok()) {
      out[done] = std::move(s);
      continue;
    }
    const Budget verdict = FitBudgetEvicting(t, reqs[done], all, &plan);
    Conclude(t, reqs[done], caller, verdict, &all, &plan, &out[done]);
  }
  return out;
}

absl::Status PrefixCache::PlanInsert(Tenant* t, const InsertRequest& req,
                                     InsertPlan* out) {
  const CacheLimits& limits = options_.limits;
  InsertPlan& plan = *out;
  plan.now = clock_->Now();
  t->ExpireLeases(plan.now);
  ASSIGN_OR_RETURN(plan.ttl, LeaseTtl(req.lease_ttl, options_));

  plan.tree = t->trees().Find(req.ns);
  if (plan.tree == nullptr &&
      t->trees().size() >= limits.max_namespaces_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tenant '%s' has %d namespaces, the limit max_namespaces_per_tenant",
        t->name(), t->trees().size()));
  }
  if (req.pin && t->leases().size() >= limits.max_leases_per_tenant) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tenant '%s' holds %d leases, the limit max_leases_per_tenant",
        t->name(), t->leases().size()));
  }

  // Which leading blocks are cached, and which of the caller's IDs are
  // confirmed (the very ID cached there) or redundant (another ID).
  const WalkPath steps = plan.tree != nullptr ? Walk(*plan.tree, req.tokens,
                                                     req.position_offset, false)
                                              : WalkPath{};
  for (const WalkStep& s : steps) {
    for (size_t j = 0; j < s.blocks; ++j) {
      const BlockId want = req.block_ids[s.first_block + j];
      if (want != s.node->block_ids()[j]) plan.redundant.push_back(want);
    }
    plan.cached += s.blocks;
    if (s.node->pins == 0) plan.protected_blocks += s.blocks;
  }
  if (!steps.empty()) {
    plan.last = steps.back().node;
    plan.last_blocks = steps.back().blocks;
  }
  plan.n_new = req.block_ids.size() - plan.cached;
  plan.claim = plan.redundant;
  plan.claim.insert(plan.claim.end(), req.block_ids.begin() + plan.cached,
                    req.block_ids.end());
  // ClaimAll refuses an ID that is cached or repeated. Only claimed IDs can
  // repeat without also claiming a cached one: a confirmed ID is cached, so
  // passing it twice makes the second a claim of a cached ID.
  size_t failed = 0;
  if (!index_.ClaimAll(plan.claim, t->index(), &failed)) {
    const auto& claim = plan.claim;
    const BlockId id = claim[failed];
    const bool repeated = std::find(claim.begin(), claim.begin() + failed,
                                    id) != claim.begin() + failed;
    return absl::InvalidArgumentError(
        repeated ? absl::StrFormat("block id %d appears twice in block_ids", id)
                 : absl::StrFormat("block id %d is already cached", id));
  }
  return absl::OkStatus();
}

bool PrefixCache::FitOwnLimit(const Tenant* t, InsertPlan* plan) {
  // A tenant over its limit evicts its own blocks, but not those on the
  // path this insert touches.
  const uint64_t evictable_own =
      t->blocks().unpinned() - plan->protected_blocks;
  const uint64_t after = t->blocks().cached() + plan->n_new;
  plan->need_own =
      after > t->blocks().limit() ? after - t->blocks().limit() : 0;
  if (plan->need_own <= evictable_own) return true;
  plan->refusal = absl::ResourceExhaustedError(absl::StrFormat(
      "tenant '%s' limit is %d blocks: it caches %d (%d pinned), this insert "
      "adds %d, and only %d can be evicted",
      t->name(), t->blocks().limit(), t->blocks().cached(),
      t->blocks().pinned(), plan->n_new, evictable_own));
  return false;
}

PrefixCache::Budget PrefixCache::FitBudget(Tenant* t, const InsertRequest& req,
                                           InsertPlan* plan) {
  if (!FitOwnLimit(t, plan)) return Budget::kRefused;
  const int64_t net =
      static_cast<int64_t>(plan->n_new) - static_cast<int64_t>(plan->need_own);
  if (net > 0) {
    // Reserved before checking, so that two tenants' concurrent inserts
    // cannot both fit into the last free blocks.
    const int64_t before = resident_blocks_.fetch_add(net);
    if (before + net > static_cast<int64_t>(budget_blocks_)) {
      resident_blocks_.fetch_sub(net);
      return Budget::kNeedsExclusive;
    }
    plan->reserved = net;
  }
  return FitPins(t, req, plan);
}

PrefixCache::Budget PrefixCache::FitBudgetEvicting(Tenant* t,
                                                   const InsertRequest& req,
                                                   const TenantsLock& all,
                                                   InsertPlan* plan) {
  if (!FitOwnLimit(t, plan)) return Budget::kRefused;
  const int64_t net =
      static_cast<int64_t>(plan->n_new) - static_cast<int64_t>(plan->need_own);
  const int64_t budget = static_cast<int64_t>(budget_blocks_);
  // Nothing else changes the resident count while every tenant is locked.
  const int64_t resident = resident_blocks_.load();
  plan->need_global = resident + net > budget
                          ? static_cast<uint64_t>(resident + net - budget)
                          : 0;
  uint64_t available = 0, pinned = 0;
  for (Tenant* u : all.tenants()) {
    all.AssertHeld(u);
    uint64_t unpinned = u->blocks().unpinned(), have = u->blocks().cached();
    pinned += u->blocks().pinned();
    if (u == t) {  // after this insert's own evictions, with its path guarded
      unpinned -= plan->protected_blocks + plan->need_own;
      have = have + plan->n_new - plan->need_own;
    }
    if (have > u->blocks().reserved())
      available += std::min(unpinned, have - u->blocks().reserved());
  }
  if (plan->need_global > available) {
    plan->refusal = absl::ResourceExhaustedError(absl::StrFormat(
        "budget is %d blocks: %d cached (%d pinned), this insert adds %d, and "
        "only %d can be evicted from tenants above their reservation",
        budget_blocks_, resident, pinned, plan->n_new, available));
    return Budget::kRefused;
  }
  return FitPins(t, req, plan);
}

PrefixCache::Budget PrefixCache::FitPins(Tenant* t, const InsertRequest& req,
                                         InsertPlan* plan) {
  if (!req.pin) return Budget::kFits;
  // The lease pins the walked path's unpinned blocks and the new ones.
  plan->refusal = AdmitPins(t, plan->protected_blocks + plan->n_new);
  return plan->refusal.ok() ? Budget::kFits : Budget::kRefused;
}

void PrefixCache::DropPlan(const InsertPlan& plan) {
  if (plan.reserved != 0) resident_blocks_.fetch_sub(plan.reserved);
  index_.Erase(plan.claim);
}

void PrefixCache::Conclude(Tenant* t, const InsertRequest& req,
                           const TenantScope& caller, Budget verdict,
                           const TenantsLock* all, InsertPlan* plan,
                           absl::StatusOr<InsertResult>* out) {
  if (verdict == Budget::kRefused) {
    DropPlan(*plan);
    *out = std::move(plan->refusal);
    return;
  }
  *out = ApplyInsert(t, req, caller, all, plan);
}

Node* PrefixCache::PlaceBlocks(Tenant* t, const InsertRequest& req,
                               const InsertPlan& plan, uint64_t stamp) {
  const size_t bs = options_.block_size;
  const size_t cached = plan.cached;
  Tree* tree = plan.tree != nullptr ? plan.tree : t->GetOrCreateTree(req.ns);
  Node* end = &tree->root;
  if (plan.last != nullptr) {
    end = plan.last;
    if (plan.last_blocks < end->num_blocks())
      end = t->SplitAt(end, plan.last_blocks);
  }
  t->TouchPath(end, stamp, /*insert=*/true);
  std::vector<HintRun> runs;
  if (req.retention.has_value()) {
    runs = HintRuns(*req.retention, req.block_ids.size(), bs, plan.now);
    if (cached > 0) HintCachedPath(t, end, runs);
  }
  if (plan.n_new == 0) return end;
  const int64_t position =
      req.position_offset + static_cast<int64_t>(cached * bs);
  if (runs.empty()) {
    end = t->Attach(end, req.tokens.subspan(cached * bs),
                    req.block_ids.subspan(cached), position, stamp);
  }
  for (const HintRun& run : runs) {
    if (run.end <= cached) continue;
    const size_t b = std::max(run.begin, cached), n = run.end - b;
    end = t->Attach(
        end, req.tokens.subspan(b * bs, n * bs), req.block_ids.subspan(b, n),
        req.position_offset + static_cast<int64_t>(b * bs), stamp, run.hint);
  }
  t->outbox().LogStored(*tree,
                        cached > 0
                            ? std::optional<BlockId>(req.block_ids[cached - 1])
                            : std::nullopt,
                        req.tokens.subspan(cached * bs, plan.n_new * bs),
                        req.block_ids.subspan(cached), position,
                        static_cast<int64_t>(cached * bs));
  return end;
}

InsertResult PrefixCache::ApplyInsert(Tenant* t, const InsertRequest& req,
                                      const TenantScope& caller,
                                      const TenantsLock* all,
                                      InsertPlan* plan) {
  assert(plan->need_global == 0 || all != nullptr);
  Node* end = PlaceBlocks(t, req, *plan, NextStamp());
  // The guard pin keeps this insert's own path out of the victims. It is
  // not a lease: it must not count against the reservations (AdmitPins).
  t->blocks().PinPath(end, +1, /*sync=*/false);
  InsertResult result;
  for (uint64_t done = 0; done < plan->need_own;) {
    done += t->EvictRun(EvictReason::kLimit, plan->need_own - done,
                        &result.evicted_block_ids);
  }
  uint64_t evicted = plan->need_own;
  if (plan->need_global > 0) {
    evicted +=
        EvictGlobal(*all, plan->need_global, /*respect_reserved=*/true,
                    EvictReason::kBudget, &caller, &result.evicted_block_ids);
  }
  // The one update of the resident count: the blocks added, less those
  // evicted, less what the budget check reserved ahead.
  const int64_t delta = static_cast<int64_t>(plan->n_new) -
                        static_cast<int64_t>(evicted) - plan->reserved;
  if (delta != 0) resident_blocks_.fetch_add(delta);
  if (req.pin) result.lease_id = t->leases().Add(end, plan->ttl, plan->now);
  t->blocks().PinPath(end, -1);
  index_.Erase(plan->redundant);
  t->FlushRemovals();
  t->outbox().TakeParked(&result.evicted_block_ids);

  TenantUsage& c = t->counters();
  ++c.insert_requests;
  c.inserted_blocks += plan->n_new;
  c.redundant_blocks += plan->redundant.size();
  result.cached_tokens = plan->cached * options_.block_size;
  result.redundant_block_ids = std::move(plan->redundant);
  return result;
}

absl::Status PrefixCache::AdmitPins(Tenant* t, uint64_t blocks) {
  const uint64_t reserved = t->blocks().reserved();
  const uint64_t after = t->blocks().pinned() + blocks;
  const int64_t over =
      after > reserved ? static_cast<int64_t>(after - reserved) : 0;
  const int64_t add = over - t->blocks().pinned_over_reserved();
  if (add <= 0) return absl::OkStatus();
  const uint64_t reserved_all = reserved_blocks_.load();
  const int64_t pool = budget_blocks_ > reserved_all
                           ? static_cast<int64_t>(budget_blocks_ - reserved_all)
                           : 0;
  // Taken before checking, so that two tenants' concurrent admissions
  // cannot both fit into the last free blocks.
  const int64_t before = pinned_over_reserved_.fetch_add(add);
  if (before + add > pool) {
    pinned_over_reserved_.fetch_sub(add);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tenant '%s' would pin %d blocks, %d above its reservation of %d; "
        "the tenants' reservations (%d blocks) leave %d of the budget's %d "
        "blocks for pins above reservations, and %d are taken",
        t->name(), after, over, reserved, reserved_all, pool, budget_blocks_,
        before));
  }
  t->blocks().AdmitPinned(add);
  return absl::OkStatus();
}

uint64_t PrefixCache::EvictGlobal(const TenantsLock& from, uint64_t n,
                                  bool respect_reserved, EvictReason reason,
                                  const TenantScope* caller,
                                  std::vector<BlockId>* out) {
  uint64_t done = 0;
  std::vector<BlockId> run;
  while (done < n) {
    // Each tenant offers its policy's next victim; the oldest goes. It
    // stays the oldest while its blocks go one by one (stamps are unique),
    // so the tenant's whole run goes at once.
    Tenant* victim = nullptr;
    uint64_t oldest = 0;
    for (Tenant* u : from.tenants()) {
      from.AssertHeld(u);
      const uint64_t stamp = u->NextVictimPriorityStamp();
      if (stamp == 0) continue;
      if (respect_reserved && u->blocks().cached() <= u->blocks().reserved())
        continue;
      if (victim == nullptr || stamp < oldest) {
        victim = u;
        oldest = stamp;
      }
    }
    if (victim == nullptr) break;
    from.AssertHeld(victim);
    uint64_t limit = n - done;
    if (respect_reserved) {
      limit = std::min(limit,
                       victim->blocks().cached() - victim->blocks().reserved());
    }
    const bool own = caller == nullptr || caller->Contains(victim->name());
    std::vector<BlockId>* to = own ? out : &run;
    done += victim->EvictRun(reason, limit, to);
    if (!own) {
      for (BlockId id : run) victim->outbox().Park(id);
      run.clear();
    }
  }
  for (Tenant* u : from.tenants()) {
    from.AssertHeld(u);
    u->FlushRemovals();
  }
  return done;
}

// --- Leases ------------------------------------------------------------------

absl::Status PrefixCache::Release(absl::string_view tenant, LeaseId lease) {
  Tenant* t = FindTenant(tenant);
  if (t != nullptr) {
    MutexLock lock(&TenantMutex(t));
    t->ExpireLeases(clock_->Now());
    if (t->leases().End(lease)) return absl::OkStatus();
  }
  return LeaseNotFound(lease);
}

absl::StatusOr<std::vector<absl::Duration>> PrefixCache::KeepAlive(
    absl::string_view tenant, absl::Span<const LeaseId> leases) {
  if (leases.empty()) return absl::InvalidArgumentError("lease_ids is empty");
  if (leases.size() > options_.limits.max_leases_per_tenant) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d lease_ids exceed max_leases_per_tenant %d",
                        leases.size(), options_.limits.max_leases_per_tenant));
  }
  Tenant* t = FindTenant(tenant);
  if (t == nullptr) return LeaseNotFound(leases[0]);
  MutexLock lock(&TenantMutex(t));
  const absl::Time now = clock_->Now();
  t->ExpireLeases(now);
  for (LeaseId id : leases) {
    if (t->leases().Find(id) == nullptr) return LeaseNotFound(id);
  }
  std::vector<absl::Duration> out;
  for (LeaseId id : leases) {
    t->leases().Renew(id, now);
    out.push_back(t->leases().Find(id)->ttl);
  }
  return out;
}

size_t PrefixCache::ExpireLeases() {
  size_t n = 0;
  const absl::Time now = clock_->Now();
  for (Tenant* t : AllTenants()) {
    MutexLock lock(&TenantMutex(t));
    n += t->ExpireLeases(now);
  }
  return n;
}

// --- Evict, Invalidate, Reset ------------------------------------------------

absl::StatusOr<std::vector<BlockId>> PrefixCache::Evict(
    const TenantScope& scope, uint64_t blocks) {
  if (blocks == 0)
    return absl::InvalidArgumentError("blocks is 0; evict at least 1 block");
  if (blocks > options_.limits.max_block_ids_per_request) {
    return absl::InvalidArgumentError(
        absl::StrFormat("blocks %d exceeds max_block_ids_per_request %d",
                        blocks, options_.limits.max_block_ids_per_request));
  }
  MutexLock exclusive(&exclusive_mu_);
  TenantsLock locked(TenantsIn(scope));
  const absl::Time now = clock_->Now();
  for (Tenant* t : locked.tenants()) {
    locked.AssertHeld(t);
    t->ExpireLeases(now);
  }
  std::vector<BlockId> out;
  // Tenants above their reservation give first; the rest only if needed.
  EvictGlobal(locked, blocks, true, EvictReason::kRequested, nullptr, &out);
  if (out.size() < blocks) {
    EvictGlobal(locked, blocks - out.size(), false, EvictReason::kRequested,
                nullptr, &out);
  }
  resident_blocks_.fetch_sub(static_cast<int64_t>(out.size()));
  for (Tenant* t : locked.tenants()) {
    locked.AssertHeld(t);
    t->outbox().TakeParked(&out);
  }
  return out;
}

absl::StatusOr<std::vector<BlockId>> PrefixCache::Invalidate(
    const TenantScope& scope, absl::Span<const BlockId> block_ids) {
  if (block_ids.empty())
    return absl::InvalidArgumentError("block_ids is empty");
  if (block_ids.size() > options_.limits.max_block_ids_per_request) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d block_ids exceed max_block_ids_per_request %d", block_ids.size(),
        options_.limits.max_block_ids_per_request));
  }
  // One tenant's Invalidate (a TENANT principal's) touches only that
  // tenant, the block index and the resident count: its tenant lock is
  // enough, and other tenants' evicting Inserts need not wait for it.
  // Several tenants are locked together only under exclusive_mu_.
  const bool one = !scope.all && scope.tenants.size() == 1;
  std::optional<MutexLock> exclusive;
  if (!one) exclusive.emplace(&exclusive_mu_);
  TenantsLock locked(TenantsIn(scope));
  absl::flat_hash_map<uint32_t, Tenant*> by_index;
  for (Tenant* t : locked.tenants()) by_index[t->index()] = t;

  std::vector<BlockId> unknown;
  for (BlockId id : block_ids) {
    auto owner = index_.Find(id);
    if (!owner || owner->node == nullptr || !by_index.contains(owner->tenant)) {
      unknown.push_back(id);
    }
  }
  if (!unknown.empty()) {
    return absl::NotFoundError(
        absl::StrFormat("%d of %d block ids are not cached: %s", unknown.size(),
                        block_ids.size(), FormatIds(unknown)));
  }
  std::vector<BlockId> removed;
  for (const auto& [first, j] : InvalidationCuts(index_, block_ids)) {
    auto owner = index_.Find(first);
    if (!owner) continue;  // already gone with an ancestor cut earlier
    Tenant* t = by_index[owner->tenant];
    locked.AssertHeld(t);
    Node* node = owner->node;
    if (j > 0) t->SplitAt(node, j);  // `node` keeps the tail from block j
    t->RemoveSubtree(node, EvictReason::kInvalidated, &removed);
  }
  for (Tenant* t : locked.tenants()) {
    locked.AssertHeld(t);
    t->FlushRemovals();
  }
  resident_blocks_.fetch_sub(static_cast<int64_t>(removed.size()));
  return removed;
}

std::vector<BlockId> PrefixCache::Reset(const TenantScope& scope) {
  MutexLock exclusive(&exclusive_mu_);
  TenantsLock locked(TenantsIn(scope));
  std::vector<BlockId> removed;
  for (Tenant* t : locked.tenants()) {
    locked.AssertHeld(t);
    t->Clear(&removed);
  }
  resident_blocks_.fetch_sub(static_cast<int64_t>(removed.size()));
  for (Tenant* t : locked.tenants()) {
    locked.AssertHeld(t);
    t->outbox().TakeParked(&removed);
  }
  return removed;
}

// --- Reading -----------------------------------------------------------------

CacheStats PrefixCache::Stats(const TenantScope& scope) const {
  CacheStats s;
  s.block_size = options_.block_size;
  s.block_bytes = options_.block_bytes;
  s.budget_bytes = options_.budget_bytes;
  s.budget_blocks = budget_blocks_;
  const absl::Time now = clock_->Now();
  for (Tenant* t : TenantsIn(scope)) {
    MutexLock lock(&TenantMutex(t));
    s.tenants.push_back(t->Stats(options_.block_bytes, now));
    s.resident_blocks += t->blocks().cached();
  }
  std::sort(s.tenants.begin(), s.tenants.end(),
            [](const TenantUsage& a, const TenantUsage& b) {
              return a.tenant < b.tenant;
            });
  return s;
}

absl::StatusOr<EventBatch> PrefixCache::ReadEvents(absl::string_view tenant,
                                                   uint64_t from_sequence,
                                                   size_t max_events) const {
  EventBatch batch;
  Tenant* t = FindTenant(tenant);
  if (t == nullptr) return batch;  // exactly what a tenant with no events sees
  MutexLock lock(&TenantMutex(t));
  batch.events = t->outbox().ring().Read(from_sequence, max_events,
                                         &batch.missed, &batch.next_sequence);
  return batch;
}

std::vector<std::string> PrefixCache::TenantNames() const {
  ReaderMutexLock lock(&tenants_mu_);
  std::vector<std::string> out;
  out.reserve(tenant_order_.size());
  for (const Tenant* t : tenant_order_) out.push_back(t->name());
  return out;
}

absl::StatusOr<std::vector<DumpNode>> PrefixCache::Dump(
    absl::string_view tenant, absl::string_view ns) const {
  Tenant* t = FindTenant(tenant);
  if (t != nullptr) {
    MutexLock lock(&TenantMutex(t));
    if (const Tree* tree = t->trees().Find(ns)) return DumpTree(*tree);
  }
  return absl::NotFoundError(
      absl::StrCat("namespace '", ns, "' has no cached blocks"));
}

absl::StatusOr<std::vector<std::string>> PrefixCache::Namespaces(
    absl::string_view tenant) const {
  Tenant* t = FindTenant(tenant);
  if (t == nullptr) return std::vector<std::string>{};
  MutexLock lock(&TenantMutex(t));
  return t->trees().Namespaces();
}

absl::Status PrefixCache::CheckInvariants() const {
  MutexLock exclusive(&exclusive_mu_);
  ReaderMutexLock tenants(&tenants_mu_);
  TenantsLock all(tenant_order_);
  uint64_t cached = 0, pinned = 0;
  int64_t over_reserved = 0;
  for (const Tenant* t : all.tenants()) {
    all.AssertHeld(t);
    RETURN_IF_ERROR(t->CheckInvariants(index_));
    cached += t->blocks().cached();
    pinned += t->blocks().pinned();
    over_reserved +=
        std::max<int64_t>(0, static_cast<int64_t>(t->blocks().pinned()) -
                                 static_cast<int64_t>(t->blocks().reserved()));
  }
  if (over_reserved != pinned_over_reserved_.load()) {
    return absl::InternalError(
        absl::StrFormat("pinned blocks over reservations: counted %d, are %d",
                        pinned_over_reserved_.load(), over_reserved));
  }
  if (static_cast<int64_t>(cached) != resident_blocks_.load()) {
    return absl::InternalError(
        absl::StrFormat("resident count %d, trees hold %d blocks",
                        resident_blocks_.load(), cached));
  }
  // Every indexed ID is cached exactly once: the trees found each at its
  // node, and nothing else (no claim of a finished call) is left behind.
  if (index_.size() != cached) {
    return absl::InternalError(absl::StrFormat(
        "block index holds %d ids, trees hold %d", index_.size(), cached));
  }
  if (cached > budget_blocks_ && pinned <= budget_blocks_) {
    return absl::InternalError(
        absl::StrFormat("%d blocks cached over a budget of %d (%d pinned)",
                        cached, budget_blocks_, pinned));
  }
  return absl::OkStatus();
}

}  // namespace prefixd
