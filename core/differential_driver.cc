#include "core/differential_driver.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"

namespace prefixd {
namespace {

constexpr int kBs = 2;
constexpr uint64_t kBudget = 24;
constexpr absl::Duration kLeaseTtl = absl::Seconds(10);
constexpr uint64_t kHistory = 6;  // ADAPTIVE's per list

std::string Describe(const MatchResult& r) {
  std::string out =
      absl::StrCat("matched=", r.matched_tokens, " lease=", r.lease_id != 0);
  for (const Segment& s : r.segments) {
    absl::StrAppend(&out, " {", absl::StrJoin(s.block_ids, ","), " @",
                    s.cached_position, " d", s.rope_delta, "}");
  }
  return out;
}

std::string Describe(const InsertResult& r) {
  return absl::StrCat("cached=", r.cached_tokens, " redundant=[",
                      absl::StrJoin(r.redundant_block_ids, ","), "] evicted=[",
                      absl::StrJoin(r.evicted_block_ids, ","),
                      "] lease=", r.lease_id != 0);
}

std::string CompareCodes(absl::StatusCode real, absl::StatusCode model) {
  if (real == model) return "";
  return absl::StrCat("real ", static_cast<int>(real), " model ",
                      static_cast<int>(model));
}

// Block ID lists compared as sets.
std::string CompareSorted(std::vector<BlockId> real,
                          std::vector<BlockId> model) {
  std::sort(real.begin(), real.end());
  std::sort(model.begin(), model.end());
  if (real == model) return "";
  return absl::StrCat("real [", absl::StrJoin(real, ","), "] model [",
                      absl::StrJoin(model, ","), "]");
}

}  // namespace

DifferentialDriver::DifferentialDriver(DifferentialChoices* choices,
                                       RopeShift shift, uint64_t seed,
                                       EvictionPolicy policy)
    : choices_(*choices) {
  const std::map<std::string, ReferenceModel::Quota> quotas = {
      {"a", {4, 14}}, {"b", {0, 24}}, {"c", {3, 9}}};
  CacheOptions o;
  o.block_size = kBs;
  o.block_bytes = 1;
  o.budget_bytes = kBudget;
  o.rope_shift = shift;
  o.clock = &clock_;
  o.seed = seed;
  o.dynamic_tenants = false;
  o.default_lease_ttl = kLeaseTtl;
  o.eviction_policy = policy;
  o.eviction_history_blocks = kHistory;
  for (const auto& [name, q] : quotas)
    o.tenants.push_back({name, {q.reserved, q.limit}});
  cache_ = std::move(PrefixCache::Create(o)).value();
  model_ = std::make_unique<ReferenceModel>(kBs, kBudget, shift, quotas,
                                            kLeaseTtl, policy, kHistory);
}

std::string DifferentialDriver::Run(int max_steps) {
  for (int step = 0; step < max_steps && !choices_.Exhausted(); ++step) {
    std::string err = Step();
    if (err.empty()) {
      absl::Status s = cache_->CheckInvariants();
      if (!s.ok()) err = s.ToString();
    }
    if (err.empty()) err = CompareCounts();
    if (!err.empty())
      return absl::StrCat("step ", step, " (", last_op_, "): ", err);
    absl::StrAppend(&log_, "  ", last_op_, "\n");
  }
  return "";
}

std::string DifferentialDriver::Step() {
  int t = 0;
  const DifferentialOp op = choices_.NextOp(&t);
  const std::string tenant(1, static_cast<char>('a' + t));
  switch (op) {
    case DifferentialOp::kMatch:
      return DoMatch(tenant);
    case DifferentialOp::kInsert:
      return DoInsert(tenant);
    case DifferentialOp::kRelease:
    case DifferentialOp::kKeepAlive:
      return DoLeaseOp(op, tenant);
    case DifferentialOp::kEvict:
      return DoEvict();
    case DifferentialOp::kInvalidate:
      return DoInvalidate();
    case DifferentialOp::kReset:
      return DoReset(tenant);
    case DifferentialOp::kMalformed:
      return DoMalformed(tenant);
    case DifferentialOp::kAdvance:
      return DoAdvance();
  }
  return absl::StrCat("unknown operation ", static_cast<int>(op));
}

std::string DifferentialDriver::Namespace() {
  return choices_.DefaultNamespace() ? "" : "x";
}

int64_t DifferentialDriver::Offset() { return kBs * choices_.OffsetBlocks(); }

// Few distinct blocks, so that prefixes are shared and diverge often.
std::vector<Token> DifferentialDriver::Tokens(int blocks) {
  std::vector<Token> t;
  for (int b = 0; b < blocks; ++b) {
    const Token v = static_cast<Token>(choices_.Int(0, 3));
    for (int j = 0; j < kBs; ++j) t.push_back(v * 100 + j);
  }
  return t;
}

BlockId DifferentialDriver::PickId(const std::string& key) {
  const auto cached = cached_ids_.find(key);
  const bool have_cached = cached != cached_ids_.end();
  switch (choices_.PickId(have_cached, !used_.empty())) {
    case DifferentialChoices::Id::kUsed:
      if (!used_.empty()) return used_[choices_.Int(0, used_.size() - 1)];
      break;
    case DifferentialChoices::Id::kCached:
      if (have_cached) return cached->second;
      break;
    case DifferentialChoices::Id::kFresh:
      break;
  }
  used_.push_back(next_id_);
  return next_id_++;
}

std::string DifferentialDriver::Key(const std::string& tenant,
                                    const std::string& ns,
                                    const std::vector<Token>& tokens,
                                    size_t blocks) {
  return absl::StrCat(
      tenant, "/", ns, "/",
      absl::StrJoin(tokens.begin(), tokens.begin() + blocks * kBs, ","));
}

std::string DifferentialDriver::DoMatch(const std::string& tenant) {
  const std::string ns = Namespace();
  std::vector<Token> tokens = Tokens(choices_.Int(1, 6));
  for (int extra = choices_.Int(0, kBs - 1); extra > 0; --extra)
    tokens.push_back(999);
  const int64_t offset = Offset();
  const bool pin = choices_.Pin(DifferentialOp::kMatch);
  last_op_ =
      absl::StrCat("match ", tenant, "/", ns, " [", absl::StrJoin(tokens, ","),
                   "] @", offset, pin ? " pin" : "");
  MatchQuery req{ns, tokens, offset, pin, absl::ZeroDuration()};
  auto real = cache_->Match(tenant, req);
  MatchResult want;
  const auto code = model_->Match(tenant, ns, tokens, offset, pin, &want);
  if (real.status().code() != code)
    return absl::StrCat("status ", real.status().ToString());
  if (!real.ok()) return "";
  if (Describe(*real) != Describe(want))
    return absl::StrCat("real ", Describe(*real), " model ", Describe(want));
  size_t i = 0;
  for (const Segment& s : real->segments) {
    for (BlockId id : s.block_ids)
      cached_ids_[Key(tenant, ns, tokens, ++i)] = id;
  }
  if (real->lease_id != 0)
    leases_.push_back({tenant, real->lease_id, want.lease_id});
  return "";
}

// Half the Inserts carry a hint: a priority of five levels (so that ties
// are common), lapsing after 0 (never) to 8 seconds (Advance moves 1 to 6),
// and half of those a range anywhere in the tokens, aligned or not.
std::optional<Retention> DifferentialDriver::PickRetention(size_t tokens) {
  const int kind = choices_.Int(0, 3);
  if (kind < 2) return std::nullopt;
  auto duration = [&] {
    return choices_.Int(0, 1) == 0 ? absl::ZeroDuration()
                                   : absl::Seconds(choices_.Int(1, 8));
  };
  Retention r;
  r.priority = 25 * choices_.Int(0, 4);
  r.duration = duration();
  if (kind == 3) {
    RetentionRange x;
    const int n = static_cast<int>(tokens);
    x.token_begin = static_cast<uint64_t>(choices_.Int(0, n - 1));
    const int end = choices_.Int(static_cast<int>(x.token_begin) + 1, n);
    x.token_end = end == n && choices_.Int(0, 1) == 0 ? 0 : end;
    x.priority = 25 * choices_.Int(0, 4);
    x.duration = duration();
    r.ranges.push_back(x);
  }
  return r;
}

std::string DifferentialDriver::DescribeRetention(
    const std::optional<Retention>& r) {
  if (!r.has_value()) return "";
  std::string out = absl::StrCat(" retention ", r->priority, "/",
                                 absl::FormatDuration(r->duration));
  for (const RetentionRange& x : r->ranges) {
    absl::StrAppend(&out, " range [", x.token_begin, ",", x.token_end, ") ",
                    x.priority, "/", absl::FormatDuration(x.duration));
  }
  return out;
}

std::string DifferentialDriver::DoInsert(const std::string& tenant) {
  const std::string ns = Namespace();
  const std::vector<Token> tokens = Tokens(choices_.Int(1, 6));
  std::vector<BlockId> ids;
  for (size_t b = 0; b < tokens.size() / kBs; ++b)
    ids.push_back(PickId(Key(tenant, ns, tokens, b + 1)));
  if (choices_.RepeatId() && ids.size() > 1) ids[1] = ids[0];
  const int64_t offset = Offset();
  const bool pin = choices_.Pin(DifferentialOp::kInsert);
  const std::optional<Retention> retention = PickRetention(tokens.size());
  last_op_ =
      absl::StrCat("insert ", tenant, "/", ns, " [", absl::StrJoin(tokens, ","),
                   "] ids [", absl::StrJoin(ids, ","), "] @", offset,
                   pin ? " pin" : "", DescribeRetention(retention));
  InsertRequest req{ns,       tokens, ids, offset, pin, absl::ZeroDuration(),
                    retention};
  auto real = cache_->Insert(tenant, req);
  InsertResult want;
  const auto code =
      model_->Insert(tenant, ns, tokens, ids, offset, pin, &want, retention);
  if (real.status().code() != code) {
    return absl::StrCat("status ", real.status().ToString(), " model code ",
                        static_cast<int>(code));
  }
  if (!real.ok()) return "";
  if (Describe(*real) != Describe(want))
    return absl::StrCat("real ", Describe(*real), " model ", Describe(want));
  for (size_t b = 0; b < ids.size(); ++b) {
    const auto& red = real->redundant_block_ids;
    if (std::find(red.begin(), red.end(), ids[b]) == red.end())
      cached_ids_[Key(tenant, ns, tokens, b + 1)] = ids[b];
  }
  if (real->lease_id != 0)
    leases_.push_back({tenant, real->lease_id, want.lease_id});
  return "";
}

// A Release or KeepAlive of a lease seen before, from its holder or from the
// step's tenant.
std::string DifferentialDriver::DoLeaseOp(DifferentialOp op,
                                          const std::string& tenant) {
  const bool release = op == DifferentialOp::kRelease;
  const char* name = release ? "release" : "keepalive";
  if (leases_.empty()) {
    last_op_ = absl::StrCat(name, " (no lease yet)");
    return "";
  }
  const KnownLease l = leases_[choices_.Int(0, leases_.size() - 1)];
  const std::string who = choices_.FromHolder(op) ? l.tenant : tenant;
  last_op_ = absl::StrCat(name, " ", who, " lease of ", l.tenant);
  if (release) {
    return CompareCodes(cache_->Release(who, l.real).code(),
                        model_->Release(who, l.model));
  }
  return CompareCodes(cache_->KeepAlive(who, {l.real}).status().code(),
                      model_->KeepAlive(who, l.model));
}

std::string DifferentialDriver::DoEvict() {
  const uint64_t n = choices_.EvictCount();
  last_op_ = absl::StrCat("evict ", n);
  auto real = cache_->Evict(TenantScope::All(), n);
  const auto want = model_->Evict(n);
  if (!real.ok() || *real != want) {
    return absl::StrCat(
        "real [",
        real.ok() ? absl::StrJoin(*real, ",") : real.status().ToString(),
        "] model [", absl::StrJoin(want, ","), "]");
  }
  return "";
}

std::string DifferentialDriver::DoInvalidate() {
  if (used_.empty()) {
    last_op_ = "invalidate (no ID used yet)";
    return "";
  }
  std::vector<BlockId> ids = {used_[choices_.Int(0, used_.size() - 1)]};
  if (choices_.SecondId()) {
    const BlockId second = used_[choices_.Int(0, used_.size() - 1)];
    if (second != ids[0]) ids.push_back(second);
  }
  last_op_ = absl::StrCat("invalidate ", absl::StrJoin(ids, ","));
  auto real = cache_->Invalidate(TenantScope::All(), ids);
  std::vector<BlockId> want;
  const auto code = model_->Invalidate(ids, &want);
  if (real.status().code() != code)
    return absl::StrCat("status ", real.status().ToString());
  if (!real.ok()) return "";
  return CompareSorted(*real, want);
}

std::string DifferentialDriver::DoReset(const std::string& tenant) {
  last_op_ = absl::StrCat("reset ", tenant);
  return CompareSorted(cache_->Reset(TenantScope::One(tenant)),
                       model_->Reset(tenant));
}

std::string DifferentialDriver::DoAdvance() {
  const absl::Duration d = absl::Seconds(choices_.Int(1, 6));
  last_op_ = absl::StrCat("advance ", absl::FormatDuration(d));
  clock_.Advance(d);
  cache_->ExpireLeases();
  model_->Advance(d);
  return "";
}

// Requests of a shape the model never sees: the cache must refuse them with
// INVALID_ARGUMENT (or NOT_FOUND for an unknown lease) and change nothing,
// which CompareCounts and CheckInvariants then verify.
std::string DifferentialDriver::DoMalformed(const std::string& tenant) {
  const int kind = choices_.Int(0, 5);
  std::vector<Token> tokens = Tokens(choices_.Int(0, 3));
  for (int extra = choices_.Int(0, kBs - 1); extra > 0; --extra)
    tokens.push_back(7);
  std::vector<BlockId> ids;
  for (int i = choices_.Int(0, 4); i > 0; --i) ids.push_back(PickId(""));
  int64_t offset = choices_.AnyInt64();
  last_op_ = absl::StrCat("malformed ", kind, " ", tenant, " [",
                          absl::StrJoin(tokens, ","), "] ids [",
                          absl::StrJoin(ids, ","), "] @", offset);
  absl::StatusCode want = absl::StatusCode::kInvalidArgument;
  absl::Status got;
  switch (kind) {
    case 0: {  // Match: empty tokens or an offset that is out of range
      if (!tokens.empty() && offset >= 0 && offset <= (int64_t{1} << 31))
        offset = -1 - (offset & 0xff);
      got =
          cache_
              ->Match(tenant, {"", tokens, offset, true, absl::ZeroDuration()})
              .status();
      break;
    }
    case 1: {  // Insert whose IDs do not fit its tokens
      if (ids.size() * kBs == tokens.size()) ids.push_back(next_id_++);
      got = cache_
                ->Insert(tenant, {"", tokens, ids, 0, false,
                                  absl::ZeroDuration(), std::nullopt})
                .status();
      break;
    }
    case 2: {  // Insert repeating an ID
      tokens = Tokens(2);
      const BlockId id = PickId("");
      ids = {id, id};
      got = cache_
                ->Insert(tenant, {"", tokens, ids, 0, false,
                                  absl::ZeroDuration(), std::nullopt})
                .status();
      break;
    }
    case 3:  // a namespace that is not printable ASCII
      tokens = Tokens(1);
      got = cache_
                ->Match(tenant, {std::string("n\0s", 3), tokens, 0, false,
                                 absl::ZeroDuration()})
                .status();
      break;
    case 4:  // a lease never issued
      want = absl::StatusCode::kNotFound;
      got = cache_->Release(tenant, (uint64_t{1} << 63) | offset);
      break;
    default:  // empty lists and Evict(0)
      got = choices_.Int(0, 2) == 0
                ? cache_->Evict(TenantScope::All(), 0).status()
            : choices_.Int(0, 1) == 0
                ? cache_->KeepAlive(tenant, {}).status()
                : cache_->Invalidate(TenantScope::All(), {}).status();
      break;
  }
  if (got.code() != want) return absl::StrCat("status ", got.ToString());
  return "";
}

std::string DifferentialDriver::CompareCounts() {
  for (const TenantUsage& t : cache_->Stats(TenantScope::All()).tenants) {
    const std::array<uint64_t, 3> cached = model_->CachedByRetention(t.tenant);
    const std::array<uint64_t, 3> evicted =
        model_->EvictedByRetention(t.tenant);
    for (int c = 0; c < 3; ++c) {
      if (t.cached_blocks_by_retention[c] != cached[c] ||
          t.evicted_blocks_by_retention[c] != evicted[c]) {
        return absl::StrCat("tenant ", t.tenant, " retention class ", c,
                            " real cached/evicted ",
                            t.cached_blocks_by_retention[c], "/",
                            t.evicted_blocks_by_retention[c], " model ",
                            cached[c], "/", evicted[c]);
      }
    }
    if (t.cached_blocks != model_->Cached(t.tenant) ||
        t.pinned_blocks != model_->Pinned(t.tenant) ||
        t.active_leases != model_->Leases(t.tenant)) {
      return absl::StrCat("tenant ", t.tenant, " real cached/pinned/leases ",
                          t.cached_blocks, "/", t.pinned_blocks, "/",
                          t.active_leases, " model ", model_->Cached(t.tenant),
                          "/", model_->Pinned(t.tenant), "/",
                          model_->Leases(t.tenant));
    }
  }
  return "";
}

}  // namespace prefixd
