// Random operations against PrefixCache and ReferenceModel side by side,
// comparing every result and checking every invariant after each step.
//
//   PREFIXD_DIFF_STEPS=1000000 ./core_differential_test   # a longer run
//   PREFIXD_DIFF_SEED=1234 ./core_differential_test       # replay one seed
#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cache.h"
#include "core/reference_model.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::strtoull(v, nullptr, 10) : fallback;
}

std::vector<BlockId> Flat(const MatchResult& r) {
  std::vector<BlockId> ids;
  for (const Segment& s : r.segments)
    ids.insert(ids.end(), s.block_ids.begin(), s.block_ids.end());
  return ids;
}

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

class Driver {
 public:
  Driver(uint64_t seed, RopeShift shift) : rng_(seed) {
    const std::map<std::string, ReferenceModel::Quota> quotas = {
        {"a", {4, 14}}, {"b", {0, 24}}, {"c", {3, 9}}};
    CacheOptions o;
    o.block_size = kBs;
    o.block_bytes = 1;
    o.budget_bytes = kBudget;
    o.rope_shift = shift;
    o.clock = &clock_;
    o.seed = seed + 1;
    o.dynamic_tenants = false;
    o.default_lease_ttl = absl::Seconds(10);
    for (const auto& [name, q] : quotas)
      o.tenants.push_back({name, {q.reserved, q.limit}});
    cache_ = std::move(PrefixCache::Create(o)).value();
    model_ = std::make_unique<ReferenceModel>(kBs, kBudget, shift, quotas,
                                              absl::Seconds(10));
  }

  // Runs `steps` operations; returns "" or the first disagreement.
  std::string Run(int steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      std::string err = Step();
      if (err.empty()) {
        absl::Status s = cache_->CheckInvariants();
        if (!s.ok()) err = s.ToString();
      }
      if (err.empty()) err = CompareCounts();
      if (!err.empty())
        return absl::StrCat("step ", step_, " (", last_op_, "): ", err);
    }
    return "";
  }

 private:
  static constexpr int kBs = 2;
  static constexpr uint64_t kBudget = 24;

  int Uniform(int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(1, 100) <= percent; }

  std::string Tenant() {
    return std::string(1, static_cast<char>('a' + Uniform(0, 2)));
  }
  std::string Ns() { return Chance(80) ? "" : "x"; }

  // Few distinct blocks, so that prefixes are shared and diverge often.
  std::vector<Token> Tokens(int blocks) {
    std::vector<Token> t;
    for (int b = 0; b < blocks; ++b) {
      const Token v = static_cast<Token>(Uniform(0, 3));
      for (int j = 0; j < kBs; ++j) t.push_back(v * 100 + j);
    }
    return t;
  }
  int64_t Offset() { return Chance(70) ? 0 : kBs * Uniform(0, 3); }

  BlockId PickId(const std::string& tenant, const std::string& ns,
                 const std::vector<Token>& tokens, size_t block) {
    // The ID cached at this position, as an engine passes back after a Match.
    if (Chance(30)) {
      MatchResult probe;
      std::vector<Token> prefix(tokens.begin(),
                                tokens.begin() + (block + 1) * kBs);
      auto it = cached_ids_.find(
          absl::StrCat(tenant, "/", ns, "/", absl::StrJoin(prefix, ",")));
      if (it != cached_ids_.end()) return it->second;
    }
    if (Chance(8) && !used_.empty()) return used_[Uniform(0, used_.size() - 1)];
    used_.push_back(next_id_);
    return next_id_++;
  }

  void Remember(const std::string& tenant, const std::string& ns,
                const std::vector<Token>& tokens, const MatchResult& m) {
    const auto ids = Flat(m);
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<Token> prefix(tokens.begin(), tokens.begin() + (i + 1) * kBs);
      cached_ids_[absl::StrCat(tenant, "/", ns, "/",
                               absl::StrJoin(prefix, ","))] = ids[i];
    }
  }

  std::string Step() {
    const int op = Uniform(1, 100);
    const std::string tenant = Tenant();
    if (op <= 30) return DoMatch(tenant);
    if (op <= 65) return DoInsert(tenant);
    if (op <= 73) return DoRelease(tenant);
    if (op <= 78) return DoKeepAlive(tenant);
    if (op <= 85) return DoEvict();
    if (op <= 90) return DoInvalidate();
    if (op <= 91) return DoReset(tenant);
    const absl::Duration d = absl::Seconds(Uniform(1, 6));
    last_op_ = absl::StrCat("advance ", absl::FormatDuration(d));
    clock_.Advance(d);
    cache_->ExpireLeases();
    model_->Advance(d);
    return "";
  }

  std::string DoMatch(const std::string& tenant) {
    const std::string ns = Ns();
    std::vector<Token> tokens = Tokens(Uniform(1, 6));
    for (int extra = Uniform(0, kBs - 1); extra > 0; --extra)
      tokens.push_back(999);
    const int64_t offset = Offset();
    const bool pin = Chance(30);
    last_op_ = absl::StrCat("match ", tenant, "/", ns, " [",
                            absl::StrJoin(tokens, ","), "] @", offset,
                            pin ? " pin" : "");
    MatchRequest req{ns, tokens, offset, pin, absl::ZeroDuration()};
    auto real = cache_->Match(tenant, req);
    MatchResult want;
    const auto code = model_->Match(tenant, ns, tokens, offset, pin, &want);
    if (real.status().code() != code)
      return absl::StrCat("status ", real.status().ToString());
    if (!real.ok()) return "";
    if (Describe(*real) != Describe(want)) {
      return absl::StrCat("real ", Describe(*real), " model ", Describe(want));
    }
    Remember(tenant, ns, tokens, *real);
    if (real->lease_id != 0)
      leases_.push_back({tenant, real->lease_id, want.lease_id});
    return "";
  }

  std::string DoInsert(const std::string& tenant) {
    const std::string ns = Ns();
    const std::vector<Token> tokens = Tokens(Uniform(1, 6));
    std::vector<BlockId> ids;
    for (size_t b = 0; b < tokens.size() / kBs; ++b)
      ids.push_back(PickId(tenant, ns, tokens, b));
    if (Chance(3) && ids.size() > 1) ids[1] = ids[0];
    const int64_t offset = Offset();
    const bool pin = Chance(25);
    last_op_ = absl::StrCat(
        "insert ", tenant, "/", ns, " [", absl::StrJoin(tokens, ","), "] ids [",
        absl::StrJoin(ids, ","), "] @", offset, pin ? " pin" : "");
    InsertRequest req{ns, tokens, ids, offset, pin, absl::ZeroDuration()};
    auto real = cache_->Insert(tenant, req);
    InsertResult want;
    const auto code =
        model_->Insert(tenant, ns, tokens, ids, offset, pin, &want);
    if (real.status().code() != code) {
      return absl::StrCat("status ", real.status().ToString(), " model code ",
                          static_cast<int>(code));
    }
    if (!real.ok()) return "";
    if (Describe(*real) != Describe(want)) {
      return absl::StrCat("real ", Describe(*real), " model ", Describe(want));
    }
    for (size_t b = 0; b < ids.size(); ++b) {
      std::vector<Token> prefix(tokens.begin(), tokens.begin() + (b + 1) * kBs);
      const bool redundant =
          std::find(real->redundant_block_ids.begin(),
                    real->redundant_block_ids.end(),
                    ids[b]) != real->redundant_block_ids.end();
      if (!redundant) {
        cached_ids_[absl::StrCat(tenant, "/", ns, "/",
                                 absl::StrJoin(prefix, ","))] = ids[b];
      }
    }
    if (real->lease_id != 0)
      leases_.push_back({tenant, real->lease_id, want.lease_id});
    return "";
  }

  struct KnownLease {
    std::string tenant;
    LeaseId real, model;
  };

  std::string DoRelease(const std::string& tenant) {
    if (leases_.empty()) return "";
    const KnownLease l = leases_[Uniform(0, leases_.size() - 1)];
    const std::string who =
        Chance(80) ? l.tenant : tenant;  // sometimes another tenant
    last_op_ = absl::StrCat("release ", who, " lease of ", l.tenant);
    const auto real = cache_->Release(who, l.real).code();
    const auto want = model_->Release(who, l.model);
    if (real != want)
      return absl::StrCat("real ", static_cast<int>(real), " model ",
                          static_cast<int>(want));
    return "";
  }

  std::string DoKeepAlive(const std::string& tenant) {
    if (leases_.empty()) return "";
    const KnownLease l = leases_[Uniform(0, leases_.size() - 1)];
    const std::string who = Chance(85) ? l.tenant : tenant;
    last_op_ = absl::StrCat("keepalive ", who, " lease of ", l.tenant);
    const auto real = cache_->KeepAlive(who, {l.real}).status().code();
    const auto want = model_->KeepAlive(who, l.model);
    if (real != want)
      return absl::StrCat("real ", static_cast<int>(real), " model ",
                          static_cast<int>(want));
    return "";
  }

  std::string DoEvict() {
    const uint64_t n = Uniform(1, 5);
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

  std::string DoInvalidate() {
    if (used_.empty()) return "";
    std::vector<BlockId> ids = {used_[Uniform(0, used_.size() - 1)]};
    if (Chance(30)) ids.push_back(used_[Uniform(0, used_.size() - 1)]);
    if (ids.size() == 2 && ids[0] == ids[1]) ids.pop_back();
    last_op_ = absl::StrCat("invalidate ", absl::StrJoin(ids, ","));
    auto real = cache_->Invalidate(TenantScope::All(), ids);
    std::vector<BlockId> want;
    const auto code = model_->Invalidate(ids, &want);
    if (real.status().code() != code)
      return absl::StrCat("status ", real.status().ToString());
    if (!real.ok()) return "";
    std::vector<BlockId> got = *real;
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    if (got != want) {
      return absl::StrCat("real [", absl::StrJoin(got, ","), "] model [",
                          absl::StrJoin(want, ","), "]");
    }
    return "";
  }

  std::string DoReset(const std::string& tenant) {
    last_op_ = absl::StrCat("reset ", tenant);
    std::vector<BlockId> got = cache_->Reset(TenantScope::One(tenant));
    std::vector<BlockId> want = model_->Reset(tenant);
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    if (got != want) return "reset results differ";
    return "";
  }

  std::string CompareCounts() {
    for (const TenantStats& t : cache_->Stats(TenantScope::All()).tenants) {
      if (t.cached_blocks != model_->Cached(t.tenant) ||
          t.pinned_blocks != model_->Pinned(t.tenant) ||
          t.active_leases != model_->Leases(t.tenant)) {
        return absl::StrCat(
            "tenant ", t.tenant, " real cached/pinned/leases ", t.cached_blocks,
            "/", t.pinned_blocks, "/", t.active_leases, " model ",
            model_->Cached(t.tenant), "/", model_->Pinned(t.tenant), "/",
            model_->Leases(t.tenant));
      }
    }
    return "";
  }

  std::mt19937_64 rng_;
  ManualClock clock_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<ReferenceModel> model_;
  std::vector<KnownLease> leases_;
  std::vector<BlockId> used_;
  std::map<std::string, BlockId> cached_ids_;
  BlockId next_id_ = 1;
  int step_ = 0;
  std::string last_op_;
};

TEST(DifferentialTest, RandomOperationsAgreeWithTheReferenceModel) {
  const uint64_t total = EnvOr("PREFIXD_DIFF_STEPS", 60000);
  const uint64_t fixed_seed = EnvOr("PREFIXD_DIFF_SEED", 0);
  const int per_seed = 2000;
  uint64_t seed = fixed_seed != 0 ? fixed_seed : std::random_device{}();
  for (uint64_t done = 0; done < total; done += per_seed, ++seed) {
    for (RopeShift shift : {RopeShift::kAllow, RopeShift::kDeny}) {
      Driver d(seed, shift);
      const std::string err = d.Run(per_seed / 2);
      ASSERT_EQ(err, "") << "seed " << seed << " (PREFIXD_DIFF_SEED=" << seed
                         << " replays it), shift " << static_cast<int>(shift);
    }
    if (fixed_seed != 0) break;
  }
}

}  // namespace
}  // namespace prefixd
