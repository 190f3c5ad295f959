#include "core/reference_model.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "core/fingerprints.h"

namespace prefixd {

using Code = absl::StatusCode;

namespace {

int RetentionClassOf(int priority) {
  if (priority < kDefaultRetentionPriority) return 0;
  return priority == kDefaultRetentionPriority ? 1 : 2;
}

// Block i's hint: the first range holding its first token, else the
// Insert's; the lapse time is now plus the duration (zero: never).
std::pair<int, absl::Time> HintOf(const Retention& r, size_t i, int bs,
                                  size_t tokens, absl::Time now) {
  const uint64_t first = i * bs;
  int priority = r.priority;
  absl::Duration d = r.duration;
  for (const RetentionRange& x : r.ranges) {
    const uint64_t end = x.token_end == 0 ? tokens : x.token_end;
    if (x.token_begin <= first && first < end) {
      priority = x.priority;
      d = x.duration;
      break;
    }
  }
  return {priority,
          d == absl::ZeroDuration() ? absl::InfiniteFuture() : now + d};
}

}  // namespace

ReferenceModel::ReferenceModel(int block_size, uint64_t budget_blocks,
                               RopeShift shift,
                               std::map<std::string, Quota> tenants,
                               absl::Duration lease_ttl, EvictionPolicy policy,
                               uint64_t history_blocks)
    : bs_(block_size),
      budget_(budget_blocks),
      shift_(shift),
      quotas_(std::move(tenants)),
      ttl_(lease_ttl),
      policy_(policy),
      history_(history_blocks != 0                 ? history_blocks
               : policy == EvictionPolicy::kShadow ? 4 * budget_blocks
                                                   : budget_blocks) {}

ReferenceModel::Key ReferenceModel::Prefix(const std::vector<Token>& tokens,
                                           size_t blocks, int bs) {
  return Key(tokens.begin(), tokens.begin() + blocks * bs);
}

int ReferenceModel::Priority(const Block& b) const {
  return b.lapse <= now_ ? kDefaultRetentionPriority : b.priority;
}

bool ReferenceModel::HasChild(const State& s, const TreeKey& t,
                              const Key& k) const {
  const auto& tree = s.trees.at(t);
  auto it = tree.upper_bound(k);
  return it != tree.end() && it->first.size() > k.size() &&
         std::equal(k.begin(), k.end(), it->first.begin());
}

uint64_t ReferenceModel::CachedIn(const State& s,
                                  const std::string& tenant) const {
  uint64_t n = 0;
  for (const auto& [t, tree] : s.trees) {
    if (t.tenant == tenant) n += tree.size();
  }
  return n;
}

bool ReferenceModel::FindVictim(const State& s,
                                const std::set<std::string>& eligible,
                                bool respect_reserved,
                                const TreeKey* guard_tree,
                                const std::set<Key>& guarded, Victim* v) const {
  bool found = false;
  std::pair<int, uint64_t> best;
  for (const std::string& tenant : eligible) {
    if (respect_reserved && CachedIn(s, tenant) <= quotas_.at(tenant).reserved)
      continue;
    std::vector<Victim> leaves;
    for (const auto& [t, tree] : s.trees) {
      if (t.tenant != tenant) continue;
      const bool guard =
          guard_tree != nullptr && !(t < *guard_tree) && !(*guard_tree < t);
      for (const auto& [key, block] : tree) {
        if (block.pins == 0 && !(guard && guarded.count(key)) &&
            !HasChild(s, t, key))
          leaves.push_back(Victim{t, key});
      }
    }
    Victim mine;
    if (!PickLeaf(s, tenant, leaves, &mine)) continue;
    const Block& b = s.trees.at(mine.tree).at(mine.key);
    const std::pair<int, uint64_t> key = {Priority(b), b.stamp};
    if (!found || key < best) {
      found = true;
      best = key;
      *v = mine;
    }
  }
  return found;
}

// Among the leaves of the lowest priority: LRU: the oldest leaf. ADAPTIVE:
// the oldest of T1 if T1 holds more blocks than the target, else of T2; the
// other class if that one has no leaf of that priority. SHADOW: LRU's while
// the LRU shadow leads, else ADAPTIVE's with a target of a fortieth of the
// limit.
bool ReferenceModel::PickLeaf(const State& s, const std::string& tenant,
                              const std::vector<Victim>& leaves,
                              Victim* v) const {
  const bool classes =
      policy_ != EvictionPolicy::kLru &&
      !(policy_ == EvictionPolicy::kShadow && LruLeads(s, tenant));
  bool want_again = false;
  if (classes) {
    uint64_t recent = 0;
    for (const auto& [t, tree] : s.trees) {
      if (t.tenant != tenant) continue;
      for (const auto& [key, block] : tree) recent += !block.seen_again;
    }
    auto it = s.adaptive.find(tenant);
    uint64_t target =
        it != s.adaptive.end() ? it->second.target : Cap(tenant) / 2;
    if (policy_ == EvictionPolicy::kShadow) target = Cap(tenant) / 40;
    want_again = recent <= target;
  }
  int lowest = kMaxRetentionPriority + 1;
  for (const Victim& leaf : leaves)
    lowest = std::min(lowest, Priority(s.trees.at(leaf.tree).at(leaf.key)));
  for (bool again : {want_again, !want_again}) {
    bool found = false;
    uint64_t best = 0;
    for (const Victim& leaf : leaves) {
      const Block& b = s.trees.at(leaf.tree).at(leaf.key);
      if (Priority(b) != lowest) continue;
      if (classes && b.seen_again != again) continue;
      if (!found || b.stamp < best) {
        found = true;
        best = b.stamp;
        *v = leaf;
      }
    }
    if (found) return true;
  }
  return false;
}

BlockId ReferenceModel::Remove(State& s, const Victim& v) {
  auto& tree = s.trees.at(v.tree);
  const Block block = tree.at(v.key);
  ++s.evicted_by_retention[v.tree.tenant][RetentionClassOf(Priority(block))];
  tree.erase(v.key);
  s.ids.erase(block.id);
  if (policy_ != EvictionPolicy::kLru) {
    Adaptive& a = ArcOf(s, v.tree.tenant);
    // SHADOW remembers in one list.
    const int l = block.seen_again && policy_ == EvictionPolicy::kAdaptive;
    const uint64_t push = a.pushes[l]++;
    std::vector<Ghost>& list = a.lists[l];
    list.push_back(Ghost{v.tree.ns, v.key, push});
    // Forget what is history_ pushes old.
    while (!list.empty() && list.front().push + history_ <= push)
      list.erase(list.begin());
  }
  return block.id;
}

ReferenceModel::Adaptive& ReferenceModel::ArcOf(
    State& s, const std::string& tenant) const {
  auto [it, added] = s.adaptive.try_emplace(tenant);
  if (added)
    it->second.target = std::min(quotas_.at(tenant).limit, budget_) / 2;
  return it->second;
}

bool ReferenceModel::SeenAgain(State& s, const std::string& tenant,
                               const std::string& ns, const Key& key) {
  if (policy_ == EvictionPolicy::kLru) return false;
  Adaptive& a = ArcOf(s, tenant);
  const uint64_t cap = std::min(quotas_.at(tenant).limit, budget_);
  const uint64_t n1 = a.lists[0].size(), n2 = a.lists[1].size();
  for (int l = 0; l < 2; ++l) {
    auto it = std::find_if(a.lists[l].begin(), a.lists[l].end(),
                           [&](const Ghost& g) { return g.Is(ns, key); });
    if (it == a.lists[l].end()) continue;
    a.lists[l].erase(it);
    if (policy_ == EvictionPolicy::kShadow) return true;  // no adaptation
    if (l == 0) {
      a.target = std::min(cap, a.target + std::max<uint64_t>(n2 / n1, 1));
    } else {
      const uint64_t step = std::max<uint64_t>(n1 / n2, 1);
      a.target = a.target > step ? a.target - step : 0;
    }
    return true;
  }
  return false;
}

// --- SHADOW's shadows, kept naively: vectors searched from end to end.

// Hit: fp becomes the newest of its list (LIRS: of protected). Miss: a
// ghost fp leaves the ghosts; a full cache evicts the oldest (LIRS: of
// probation while it holds more than `probation`, else of protected, else
// of probation) to the newest ghost, the ghosts keeping their newest
// `ghost_capacity`; fp comes in as the newest of probation, or of
// protected if it was a ghost.
bool ReferenceModel::ShadowCache::Access(uint64_t fp) {
  for (int l = 0; l < 2; ++l) {
    auto it = std::find(lists[l].begin(), lists[l].end(), fp);
    if (it == lists[l].end()) continue;
    lists[l].erase(it);
    lists[lirs ? 1 : 0].push_back(fp);
    return true;
  }
  auto ghost = std::find(ghosts.begin(), ghosts.end(), fp);
  const bool again = ghost != ghosts.end();
  if (again) ghosts.erase(ghost);
  if (lists[0].size() + lists[1].size() == capacity) {
    int l = 0;
    if (lirs && lists[0].size() <= probation && !lists[1].empty()) l = 1;
    const uint64_t victim = lists[l].front();
    lists[l].erase(lists[l].begin());
    if (lirs && ghost_capacity > 0) {
      ghosts.push_back(victim);
      if (ghosts.size() > ghost_capacity) ghosts.erase(ghosts.begin());
    }
  }
  lists[again ? 1 : 0].push_back(fp);
  return false;
}

// Each shadow holds a quarter of the limit (at least 1, at most 2^31); the
// LIRS one a probation of a fortieth of that and a quarter of the
// history's size as ghosts. The hit counts halve every four shadow
// capacities of sampled accesses.
ReferenceModel::Shadows& ReferenceModel::ShadowsOf(
    State& s, const std::string& tenant) const {
  auto [it, added] = s.shadows.try_emplace(tenant);
  if (added) {
    const uint64_t quarter = Cap(tenant) / 4;
    const uint64_t capacity =
        std::clamp<uint64_t>(quarter, 1, uint64_t{1} << 31);
    Shadows& sh = it->second;
    sh.lru.capacity = sh.lirs.capacity = capacity;
    sh.period = 4 * capacity;
    sh.lirs.lirs = true;
    sh.lirs.probation = quarter / 40;
    sh.lirs.ghost_capacity = history_ / 4;
  }
  return it->second;
}

void ReferenceModel::Observe(State& s, const std::string& tenant,
                             const std::string& ns,
                             const std::vector<Token>& tokens,
                             size_t blocks) const {
  if (policy_ != EvictionPolicy::kShadow) return;
  Shadows& sh = ShadowsOf(s, tenant);
  uint64_t fp = NamespaceHash(ns);
  for (size_t i = 0; i < blocks; ++i) {
    fp = ChainHash(fp, absl::MakeConstSpan(tokens).subspan(i * bs_, bs_));
    if ((fp >> 62) != 0) continue;  // not sampled
    sh.hits[0] += sh.lru.Access(fp);
    sh.hits[1] += sh.lirs.Access(fp);
    if (++sh.accesses == sh.period) {
      sh.hits[0] /= 2;
      sh.hits[1] /= 2;
      sh.accesses = 0;
    }
  }
}

bool ReferenceModel::LruLeads(const State& s, const std::string& tenant) const {
  auto it = s.shadows.find(tenant);
  return it != s.shadows.end() && it->second.hits[0] > it->second.hits[1];
}

void ReferenceModel::DropEmpty(State& s) {
  for (auto it = s.trees.begin(); it != s.trees.end();) {
    it = it->second.empty() ? s.trees.erase(it) : std::next(it);
  }
}

Code ReferenceModel::Match(const std::string& tenant, const std::string& ns,
                           const std::vector<Token>& tokens, int64_t offset,
                           bool pin, MatchResult* out) {
  *out = MatchResult{};
  auto it = state_.trees.find(TreeKey{tenant, ns});
  if (it == state_.trees.end()) return Code::kOk;
  auto& tree = it->second;
  size_t matched = 0;
  for (size_t k = 1; k <= tokens.size() / bs_; ++k) {
    auto b = tree.find(Prefix(tokens, k, bs_));
    if (b == tree.end()) break;
    const int64_t requested = offset + static_cast<int64_t>((k - 1) * bs_);
    if (shift_ == RopeShift::kDeny && b->second.position != requested) break;
    const int64_t delta = requested - b->second.position;
    if (out->segments.empty() || out->segments.back().rope_delta != delta) {
      out->segments.push_back(Segment{{}, b->second.position, delta});
    }
    out->segments.back().block_ids.push_back(b->second.id);
    matched = k;
  }
  if (matched == 0) return Code::kOk;
  if (pin) {
    uint64_t more = 0;
    for (size_t k = 1; k <= matched; ++k)
      more += tree.at(Prefix(tokens, k, bs_)).pins == 0;
    if (!PinsFit(state_, tenant, more)) {
      *out = MatchResult{};
      return Code::kResourceExhausted;
    }
  }
  const uint64_t stamp = ++state_.now_stamp;
  Lease lease{tenant, TreeKey{tenant, ns}, {}, now_ + ttl_};
  for (size_t k = 1; k <= matched; ++k) {
    Block& b = tree.at(Prefix(tokens, k, bs_));
    b.stamp = stamp;
    b.seen_again = true;
    if (pin) {
      ++b.pins;
      lease.path.push_back(Prefix(tokens, k, bs_));
    }
  }
  out->matched_tokens = matched * bs_;
  if (pin) {
    out->lease_id = next_lease_++;
    leases_[out->lease_id] = lease;
  }
  return Code::kOk;
}

Code ReferenceModel::Insert(const std::string& tenant, const std::string& ns,
                            const std::vector<Token>& tokens,
                            const std::vector<BlockId>& ids, int64_t offset,
                            bool pin, InsertResult* out,
                            const std::optional<Retention>& retention) {
  *out = InsertResult{};
  if (tokens.empty() || tokens.size() % bs_ != 0 ||
      ids.size() * bs_ != tokens.size()) {
    return Code::kInvalidArgument;
  }
  if (std::set<BlockId>(ids.begin(), ids.end()).size() != ids.size()) {
    return Code::kInvalidArgument;
  }
  const TreeKey tk{tenant, ns};
  const size_t n = ids.size();
  size_t cached = 0;
  std::vector<BlockId> redundant, claim;
  if (auto it = state_.trees.find(tk); it != state_.trees.end()) {
    while (cached < n && it->second.count(Prefix(tokens, cached + 1, bs_))) {
      const BlockId have = it->second.at(Prefix(tokens, cached + 1, bs_)).id;
      if (ids[cached] != have) redundant.push_back(ids[cached]);
      ++cached;
    }
  }
  claim = redundant;
  claim.insert(claim.end(), ids.begin() + cached, ids.end());
  for (BlockId id : claim) {
    if (state_.ids.count(id)) return Code::kInvalidArgument;
  }

  State s = state_;  // try everything on a copy
  const uint64_t stamp = s.now_stamp + 1;
  auto& tree = s.trees[tk];
  std::set<Key> guarded;
  for (size_t i = 0; i < n; ++i) {
    Key key = Prefix(tokens, i + 1, bs_);
    if (i >= cached) {
      tree[key] = Block{ids[i], stamp, offset + static_cast<int64_t>(i * bs_)};
      tree[key].seen_again = SeenAgain(s, tenant, ns, key);
      s.ids.insert(ids[i]);
    } else {
      tree.at(key).seen_again = true;
    }
    Block& b = tree.at(key);
    b.stamp = stamp;
    if (retention.has_value()) {
      std::tie(b.priority, b.lapse) =
          HintOf(*retention, i, bs_, tokens.size(), now_);
    }
    guarded.insert(std::move(key));
  }
  Observe(s, tenant, ns, tokens, n);
  std::vector<BlockId> evicted;
  Victim v;
  while (CachedIn(s, tenant) > quotas_.at(tenant).limit) {
    if (!FindVictim(s, {tenant}, false, &tk, guarded, &v))
      return Code::kResourceExhausted;
    evicted.push_back(Remove(s, v));
  }
  std::set<std::string> everyone;
  for (const auto& [name, q] : quotas_) everyone.insert(name);
  while (s.ids.size() > budget_) {
    if (!FindVictim(s, everyone, true, &tk, guarded, &v))
      return Code::kResourceExhausted;
    evicted.push_back(Remove(s, v));
  }
  if (pin) {
    uint64_t more = 0;
    for (const Key& k : guarded) more += tree.at(k).pins == 0;
    if (!PinsFit(s, tenant, more)) return Code::kResourceExhausted;
  }
  s.now_stamp = stamp;
  DropEmpty(s);
  state_ = std::move(s);
  if (pin) {
    Lease lease{tenant, tk, {}, now_ + ttl_};
    for (const Key& k : guarded) {
      ++state_.trees.at(tk).at(k).pins;
      lease.path.push_back(k);
    }
    out->lease_id = next_lease_++;
    leases_[out->lease_id] = lease;
  }
  out->cached_tokens = cached * bs_;
  out->redundant_block_ids = redundant;
  out->evicted_block_ids = evicted;
  return Code::kOk;
}

void ReferenceModel::EndLease(LeaseId id) {
  const Lease& lease = leases_.at(id);
  auto t = state_.trees.find(lease.tree);
  for (const Key& k : lease.path) {
    if (t == state_.trees.end()) break;
    auto b = t->second.find(k);
    if (b != t->second.end()) --b->second.pins;
  }
  leases_.erase(id);
}

Code ReferenceModel::Release(const std::string& tenant, LeaseId lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end() || it->second.tenant != tenant)
    return Code::kNotFound;
  EndLease(lease);
  return Code::kOk;
}

Code ReferenceModel::KeepAlive(const std::string& tenant, LeaseId lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end() || it->second.tenant != tenant)
    return Code::kNotFound;
  it->second.expiry = now_ + ttl_;
  return Code::kOk;
}

std::vector<BlockId> ReferenceModel::Evict(uint64_t n) {
  std::set<std::string> everyone;
  for (const auto& [name, q] : quotas_) everyone.insert(name);
  std::vector<BlockId> out;
  Victim v;
  for (bool respect : {true, false}) {
    while (out.size() < n &&
           FindVictim(state_, everyone, respect, nullptr, {}, &v)) {
      out.push_back(Remove(state_, v));
    }
  }
  DropEmpty(state_);
  return out;
}

Code ReferenceModel::Invalidate(const std::vector<BlockId>& ids,
                                std::vector<BlockId>* removed) {
  for (BlockId id : ids) {
    if (!state_.ids.count(id)) return Code::kNotFound;
  }
  for (BlockId id : ids) {
    if (!state_.ids.count(id)) continue;  // went with an earlier one
    for (auto& [t, tree] : state_.trees) {
      auto hit = std::find_if(tree.begin(), tree.end(), [id](const auto& kv) {
        return kv.second.id == id;
      });
      if (hit == tree.end()) continue;
      const Key root = hit->first;
      const TreeKey tk = t;
      auto below = [&](const Key& k) {
        return k.size() >= root.size() &&
               std::equal(root.begin(), root.end(), k.begin());
      };
      std::vector<LeaseId> ending;
      for (const auto& [lid, lease] : leases_) {
        if (!(lease.tree < tk) && !(tk < lease.tree) &&
            std::any_of(lease.path.begin(), lease.path.end(), below)) {
          ending.push_back(lid);
        }
      }
      for (LeaseId lid : ending) EndLease(lid);
      for (auto it = tree.begin(); it != tree.end();) {
        if (below(it->first)) {
          removed->push_back(it->second.id);
          state_.ids.erase(it->second.id);
          it = tree.erase(it);
        } else {
          ++it;
        }
      }
      break;
    }
  }
  DropEmpty(state_);
  return Code::kOk;
}

std::vector<BlockId> ReferenceModel::Reset(const std::string& tenant) {
  std::vector<BlockId> out;
  state_.adaptive.erase(tenant);
  state_.shadows.erase(tenant);
  for (auto it = leases_.begin(); it != leases_.end();) {
    it = it->second.tenant == tenant ? leases_.erase(it) : std::next(it);
  }
  for (auto it = state_.trees.begin(); it != state_.trees.end();) {
    if (it->first.tenant != tenant) {
      ++it;
      continue;
    }
    for (const auto& [k, b] : it->second) {
      out.push_back(b.id);
      state_.ids.erase(b.id);
    }
    it = state_.trees.erase(it);
  }
  return out;
}

void ReferenceModel::Advance(absl::Duration d) {
  now_ += d;
  std::vector<LeaseId> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.expiry <= now_) expired.push_back(id);
  }
  for (LeaseId id : expired) EndLease(id);
}

uint64_t ReferenceModel::Cached(const std::string& tenant) const {
  return CachedIn(state_, tenant);
}

uint64_t ReferenceModel::Pinned(const std::string& tenant) const {
  return PinnedIn(state_, tenant);
}

uint64_t ReferenceModel::PinnedIn(const State& s,
                                  const std::string& tenant) const {
  uint64_t n = 0;
  for (const auto& [t, tree] : s.trees) {
    if (t.tenant != tenant) continue;
    for (const auto& [k, b] : tree) n += b.pins > 0;
  }
  return n;
}

bool ReferenceModel::PinsFit(const State& s, const std::string& tenant,
                             uint64_t more) const {
  auto over = [](uint64_t pinned, uint64_t reserved) {
    return pinned > reserved ? pinned - reserved : 0;
  };
  const uint64_t mine = PinnedIn(s, tenant);
  const uint64_t reserved = quotas_.at(tenant).reserved;
  if (over(mine + more, reserved) <= over(mine, reserved)) return true;
  uint64_t reserved_all = 0, total = 0;
  for (const auto& [name, q] : quotas_) {
    reserved_all += q.reserved;
    total += over(PinnedIn(s, name) + (name == tenant ? more : 0), q.reserved);
  }
  return total <= (budget_ > reserved_all ? budget_ - reserved_all : 0);
}

std::array<uint64_t, 3> ReferenceModel::CachedByRetention(
    const std::string& tenant) const {
  std::array<uint64_t, 3> out = {0, 0, 0};
  for (const auto& [t, tree] : state_.trees) {
    if (t.tenant != tenant) continue;
    for (const auto& [k, b] : tree) ++out[RetentionClassOf(Priority(b))];
  }
  return out;
}

std::array<uint64_t, 3> ReferenceModel::EvictedByRetention(
    const std::string& tenant) const {
  auto it = state_.evicted_by_retention.find(tenant);
  return it == state_.evicted_by_retention.end() ? std::array<uint64_t, 3>{}
                                                 : it->second;
}

size_t ReferenceModel::Leases(const std::string& tenant) const {
  size_t n = 0;
  for (const auto& [id, lease] : leases_) n += lease.tenant == tenant;
  return n;
}

}  // namespace prefixd
