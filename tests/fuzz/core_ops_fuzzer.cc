// libFuzzer: operation sequences decoded from the input run against
// PrefixCache and core/reference_model.cc side by side (the differential
// test's driver, with bytes instead of a seeded generator), comparing every
// result and running CheckInvariants() after every operation. Any
// disagreement or broken invariant aborts with the operation log.
//
// Sizes are kept small (block size 2, a 24-block budget, three tenants with
// reservations and limits, four distinct blocks of tokens) so that prefixes
// are shared, trees split, budgets fill and leases pin often. Shapes the
// model does not know (empty, misaligned or mismatched requests, negative
// offsets) are sent to the cache alone: they must be INVALID_ARGUMENT and
// change nothing.
//
//   build-fuzz/tests/fuzz/core_ops_fuzzer tests/fuzz/corpus/core_ops_fuzzer
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/cache.h"
#include "core/clock.h"
#include "core/reference_model.h"

namespace prefixd {
namespace {

constexpr int kBs = 2;
constexpr uint64_t kBudget = 24;
constexpr int kMaxSteps = 256;

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
  Driver(FuzzedDataProvider* in, RopeShift shift) : in_(*in) {
    const std::map<std::string, ReferenceModel::Quota> quotas = {
        {"a", {4, 14}}, {"b", {0, 24}}, {"c", {3, 9}}};
    CacheOptions o;
    o.block_size = kBs;
    o.block_bytes = 1;
    o.budget_bytes = kBudget;
    o.rope_shift = shift;
    o.clock = &clock_;
    o.seed = 1;
    o.dynamic_tenants = false;
    o.default_lease_ttl = absl::Seconds(10);
    for (const auto& [name, q] : quotas)
      o.tenants.push_back({name, {q.reserved, q.limit}});
    cache_ = std::move(PrefixCache::Create(o)).value();
    model_ = std::make_unique<ReferenceModel>(kBs, kBudget, shift, quotas,
                                              absl::Seconds(10));
  }

  void Run() {
    for (int step = 0; step < kMaxSteps && in_.remaining_bytes() > 0; ++step) {
      std::string err = Step();
      if (err.empty()) {
        absl::Status s = cache_->CheckInvariants();
        if (!s.ok()) err = s.ToString();
      }
      if (err.empty()) err = CompareCounts();
      if (!err.empty()) {
        std::fprintf(stderr, "core_ops_fuzzer: step %d (%s): %s\nlog:\n%s\n",
                     step, last_op_.c_str(), err.c_str(), log_.c_str());
        std::abort();
      }
      absl::StrAppend(&log_, "  ", last_op_, "\n");
    }
  }

 private:
  int Int(int lo, int hi) { return in_.ConsumeIntegralInRange(lo, hi); }
  std::string Tenant() {
    return std::string(1, static_cast<char>('a' + Int(0, 2)));
  }
  std::string Ns() { return in_.ConsumeBool() ? "" : "x"; }
  int64_t Offset() { return kBs * Int(0, 3); }

  std::vector<Token> Tokens(int blocks) {
    std::vector<Token> t;
    for (int b = 0; b < blocks; ++b) {
      const Token v = static_cast<Token>(Int(0, 3));
      for (int j = 0; j < kBs; ++j) t.push_back(v * 100 + j);
    }
    return t;
  }

  // A fresh ID, one used before (cached, returned or never adopted), or
  // the ID cached at that position (an engine confirming a Match).
  BlockId PickId(const std::string& key) {
    switch (Int(0, 3)) {
      case 0:
        if (!used_.empty()) return used_[Int(0, used_.size() - 1)];
        break;
      case 1: {
        auto it = cached_ids_.find(key);
        if (it != cached_ids_.end()) return it->second;
        break;
      }
      default:
        break;
    }
    used_.push_back(next_id_);
    return next_id_++;
  }

  static std::string Key(const std::string& tenant, const std::string& ns,
                         const std::vector<Token>& tokens, size_t blocks) {
    return absl::StrCat(
        tenant, "/", ns, "/",
        absl::StrJoin(tokens.begin(), tokens.begin() + blocks * kBs, ","));
  }

  std::string Step() {
    const std::string tenant = Tenant();
    switch (Int(0, 10)) {
      case 0:
      case 1:
        return DoMatch(tenant);
      case 2:
      case 3:
      case 4:
        return DoInsert(tenant);
      case 5:
        return DoRelease(tenant);
      case 6:
        return DoKeepAlive(tenant);
      case 7:
        return DoEvict();
      case 8:
        return in_.ConsumeBool() ? DoInvalidate() : DoReset(tenant);
      case 9:
        return DoMalformed(tenant);
      default: {
        const absl::Duration d = absl::Seconds(Int(1, 6));
        last_op_ = absl::StrCat("advance ", absl::FormatDuration(d));
        clock_.Advance(d);
        cache_->ExpireLeases();
        model_->Advance(d);
        return "";
      }
    }
  }

  std::string DoMatch(const std::string& tenant) {
    const std::string ns = Ns();
    std::vector<Token> tokens = Tokens(Int(1, 6));
    for (int extra = Int(0, kBs - 1); extra > 0; --extra) tokens.push_back(999);
    const int64_t offset = Offset();
    const bool pin = in_.ConsumeBool();
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

  std::string DoInsert(const std::string& tenant) {
    const std::string ns = Ns();
    const std::vector<Token> tokens = Tokens(Int(1, 6));
    std::vector<BlockId> ids;
    for (size_t b = 0; b < tokens.size() / kBs; ++b)
      ids.push_back(PickId(Key(tenant, ns, tokens, b + 1)));
    const int64_t offset = Offset();
    const bool pin = in_.ConsumeBool();
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

  struct KnownLease {
    std::string tenant;
    LeaseId real, model;
  };

  std::string DoRelease(const std::string& tenant) {
    if (leases_.empty()) return "";
    const KnownLease l = leases_[Int(0, leases_.size() - 1)];
    const std::string who = in_.ConsumeBool() ? l.tenant : tenant;
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
    const KnownLease l = leases_[Int(0, leases_.size() - 1)];
    const std::string who = in_.ConsumeBool() ? l.tenant : tenant;
    last_op_ = absl::StrCat("keepalive ", who, " lease of ", l.tenant);
    const auto real = cache_->KeepAlive(who, {l.real}).status().code();
    const auto want = model_->KeepAlive(who, l.model);
    if (real != want)
      return absl::StrCat("real ", static_cast<int>(real), " model ",
                          static_cast<int>(want));
    return "";
  }

  std::string DoEvict() {
    const uint64_t n = Int(1, 8);
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
    std::vector<BlockId> ids = {used_[Int(0, used_.size() - 1)]};
    if (in_.ConsumeBool()) {
      const BlockId second = used_[Int(0, used_.size() - 1)];
      if (second != ids[0]) ids.push_back(second);
    }
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
    if (got != want) {
      return absl::StrCat("real [", absl::StrJoin(got, ","), "] model [",
                          absl::StrJoin(want, ","), "]");
    }
    return "";
  }

  // Requests of a shape the model never sees: the cache must refuse them
  // with INVALID_ARGUMENT (or NOT_FOUND for an unknown lease) and change
  // nothing, which CompareCounts and CheckInvariants then verify.
  std::string DoMalformed(const std::string& tenant) {
    const int kind = Int(0, 5);
    std::vector<Token> tokens = Tokens(Int(0, 3));
    for (int extra = Int(0, kBs - 1); extra > 0; --extra) tokens.push_back(7);
    std::vector<BlockId> ids;
    for (int i = Int(0, 4); i > 0; --i) ids.push_back(PickId(""));
    int64_t offset = in_.ConsumeIntegral<int64_t>();
    last_op_ = absl::StrCat("malformed ", kind, " ", tenant, " [",
                            absl::StrJoin(tokens, ","), "] ids [",
                            absl::StrJoin(ids, ","), "] @", offset);
    absl::StatusCode want = absl::StatusCode::kInvalidArgument;
    absl::Status got;
    switch (kind) {
      case 0: {  // Match: empty tokens or an offset that is out of range
        if (!tokens.empty() && offset >= 0 && offset <= (int64_t{1} << 31))
          offset = -1 - (offset & 0xff);
        got = cache_
                  ->Match(tenant,
                          {"", tokens, offset, true, absl::ZeroDuration()})
                  .status();
        break;
      }
      case 1: {  // Insert whose IDs do not fit its tokens
        if (ids.size() * kBs == tokens.size()) ids.push_back(next_id_++);
        got = cache_
                  ->Insert(tenant,
                           {"", tokens, ids, 0, false, absl::ZeroDuration()})
                  .status();
        break;
      }
      case 2: {  // Insert repeating an ID
        tokens = Tokens(2);
        const BlockId id = PickId("");
        ids = {id, id};
        got = cache_
                  ->Insert(tenant,
                           {"", tokens, ids, 0, false, absl::ZeroDuration()})
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
        got = Int(0, 2) == 0 ? cache_->Evict(TenantScope::All(), 0).status()
              : Int(0, 1) == 0
                  ? cache_->KeepAlive(tenant, {}).status()
                  : cache_->Invalidate(TenantScope::All(), {}).status();
        break;
    }
    if (got.code() != want) return absl::StrCat("status ", got.ToString());
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

  FuzzedDataProvider& in_;
  ManualClock clock_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<ReferenceModel> model_;
  std::vector<KnownLease> leases_;
  std::vector<BlockId> used_;
  std::map<std::string, BlockId> cached_ids_;
  BlockId next_id_ = 1;
  std::string last_op_;
  std::string log_;
};

}  // namespace
}  // namespace prefixd

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const auto shift =
      in.ConsumeBool() ? prefixd::RopeShift::kAllow : prefixd::RopeShift::kDeny;
  prefixd::Driver(&in, shift).Run();
  return 0;
}
