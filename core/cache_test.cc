#include "core/cache.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

std::vector<Token> Range(Token from, Token to) {  // [from, to]
  std::vector<Token> v(to - from + 1);
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<BlockId> MatchedIds(const MatchResult& r) {
  std::vector<BlockId> ids;
  for (const Segment& s : r.segments)
    ids.insert(ids.end(), s.block_ids.begin(), s.block_ids.end());
  return ids;
}

class CacheTest : public ::testing::Test {
 protected:
  // Byte sizes are block counts here: block_bytes 1.
  void Init(int block_size, uint64_t budget_blocks,
            std::vector<TenantSpec> tenants = {},
            RopeShift shift = RopeShift::kAllow) {
    CacheOptions o;
    o.block_size = block_size;
    o.block_bytes = 1;
    o.budget_bytes = budget_blocks;
    o.rope_shift = shift;
    o.tenants = std::move(tenants);
    o.clock = &clock_;
    o.seed = 42;
    o.default_lease_ttl = absl::Seconds(10);
    o.eviction_policy = policy_;
    o.eviction_history_blocks = history_blocks_;
    auto c = PrefixCache::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    cache_ = std::move(c).value();
  }

  MatchResult Match(std::vector<Token> tokens, int64_t offset = 0,
                    bool pin = false, absl::string_view tenant = "a") {
    MatchQuery req;
    req.tokens = tokens;
    req.position_offset = offset;
    req.pin = pin;
    auto r = cache_->Match(tenant, req);
    EXPECT_TRUE(r.ok()) << r.status();
    Check();
    return r.ok() ? *r : MatchResult{};
  }

  absl::StatusOr<InsertResult> TryInsert(std::vector<Token> tokens,
                                         std::vector<BlockId> ids,
                                         int64_t offset = 0, bool pin = false,
                                         absl::string_view tenant = "a") {
    InsertRequest req;
    req.tokens = tokens;
    req.block_ids = ids;
    req.position_offset = offset;
    req.pin = pin;
    auto r = cache_->Insert(tenant, req);
    Check();
    return r;
  }

  InsertResult Insert(std::vector<Token> tokens, std::vector<BlockId> ids,
                      int64_t offset = 0, bool pin = false,
                      absl::string_view tenant = "a") {
    auto r = TryInsert(std::move(tokens), std::move(ids), offset, pin, tenant);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : InsertResult{};
  }

  std::vector<BlockId> Evict(uint64_t n) {
    auto r = cache_->Evict(TenantScope::All(), n);
    EXPECT_TRUE(r.ok()) << r.status();
    Check();
    return r.ok() ? *r : std::vector<BlockId>{};
  }

  EvictionPolicy policy_ = EvictionPolicy::kLru;  // for Init
  uint64_t history_blocks_ = 0;

  void Check() {
    absl::Status s = cache_->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }

  // Everything observable about one tenant, to prove a rejected call
  // changed nothing.
  std::string Snapshot(absl::string_view tenant = "a") {
    std::string out;
    auto stats = cache_->Stats(TenantScope::One(tenant));
    for (const auto& t : stats.tenants) {
      absl::StrAppend(&out, t.tenant, " cached=", t.cached_blocks,
                      " pinned=", t.pinned_blocks, " nodes=", t.tree_nodes,
                      " leases=", t.active_leases, "\n");
    }
    auto namespaces = cache_->Namespaces(tenant);
    for (const auto& ns : *namespaces) {
      const std::vector<DumpNode> dump =
          cache_->Dump(tenant, ns).value_or(std::vector<DumpNode>{});
      for (const DumpNode& n : dump) {
        absl::StrAppend(&out, ns, " d", n.depth, " p", n.position, " s",
                        n.stamp, " pins", n.pins, " [",
                        absl::StrJoin(n.block_ids, ","), "]\n");
      }
    }
    return out;
  }

  ManualClock clock_;
  std::unique_ptr<PrefixCache> cache_;
};

// Issue tests 1-4, block_size 1.
TEST_F(CacheTest, EmptyCacheMatchesNothingAndInsertAdoptsAll) {
  Init(1, 100);
  EXPECT_EQ(Match({1, 2, 3}).matched_tokens, 0);
  InsertResult r = Insert({1, 2, 3}, {10, 20, 30});
  EXPECT_EQ(r.cached_tokens, 0);
  EXPECT_THAT(r.redundant_block_ids, IsEmpty());
  EXPECT_THAT(r.evicted_block_ids, IsEmpty());
}

TEST_F(CacheTest, MatchReturnsTheCachedPrefix) {
  Init(1, 100);
  Insert({1, 2, 3}, {10, 20, 30});
  MatchResult m = Match({1, 2, 3});
  EXPECT_EQ(m.matched_tokens, 3);
  EXPECT_THAT(MatchedIds(m), ElementsAre(10, 20, 30));
  EXPECT_THAT(MatchedIds(Match({1, 2})), ElementsAre(10, 20));
}

TEST_F(CacheTest, SecondInsertWithOtherIdsIsRedundant) {
  Init(1, 100);
  Insert({1, 2, 3}, {10, 20, 30});
  InsertResult r = Insert({1, 2, 3}, {11, 21, 31});
  EXPECT_EQ(r.cached_tokens, 3);
  EXPECT_THAT(r.redundant_block_ids, ElementsAre(11, 21, 31));
  EXPECT_THAT(MatchedIds(Match({1, 2, 3})), ElementsAre(10, 20, 30));
}

TEST_F(CacheTest, DivergingInsertKeepsCachedIdsAndConfirmsRepeats) {
  Init(1, 100);
  Insert({1, 2, 3}, {10, 20, 30});
  InsertResult r = Insert({1, 2, 4, 5}, {12, 22, 40, 50});
  EXPECT_EQ(r.cached_tokens, 2);
  EXPECT_THAT(r.redundant_block_ids, ElementsAre(12, 22));
  MatchResult m = Match({1, 2, 4, 5, 6});
  EXPECT_EQ(m.matched_tokens, 4);
  EXPECT_THAT(MatchedIds(m), ElementsAre(10, 20, 40, 50));
  EXPECT_EQ(Match({1, 2, 3, 4}).matched_tokens, 3);
  // As an engine does after a Match: pass the cached IDs back.
  r = Insert({1, 2, 4, 5}, {10, 20, 40, 50});
  EXPECT_EQ(r.cached_tokens, 4);
  EXPECT_THAT(r.redundant_block_ids, IsEmpty());
}

// Issue test 5.
TEST_F(CacheTest, OnlyWholeBlocksMatch) {
  Init(4, 100);
  Insert(Range(1, 8), {100, 200});
  EXPECT_EQ(Match(Range(1, 7)).matched_tokens, 4);
  EXPECT_EQ(Match({1, 2, 3}).matched_tokens, 0);
  InsertResult r = Insert({1, 2, 3, 4, 5, 6, 9, 10}, {101, 201});
  EXPECT_EQ(r.cached_tokens, 4);
  EXPECT_THAT(r.redundant_block_ids, ElementsAre(101));
}

TEST_F(CacheTest, InsertRejectsPartialBlocksAndCountMismatch) {
  Init(4, 100);
  auto r = TryInsert(Range(1, 6), {1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("6 tokens are not a whole number of blocks of 4"));
  r = TryInsert(Range(1, 8), {1});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("1 block_ids for 8 tokens"));
  EXPECT_EQ(Snapshot(), "");
}

// Issue test 6.
TEST_F(CacheTest, EvictionIsLeastRecentlyUsed) {
  Init(1, 100);
  Insert({1, 2}, {1, 2});
  Insert({3, 4}, {3, 4});
  EXPECT_THAT(Evict(2), ElementsAre(2, 1));  // tail first
}

TEST_F(CacheTest, MatchRefreshesRecency) {
  Init(1, 100);
  Insert({1, 2}, {1, 2});
  Insert({3, 4}, {3, 4});
  Match({1, 2});
  EXPECT_THAT(Evict(2), ElementsAre(4, 3));
}

TEST_F(CacheTest, PartialMatchOnlyRefreshesTheMatchedBlocks) {
  Init(1, 100);
  Insert({1, 2, 3}, {1, 2, 3});
  Insert({7}, {7});
  Match({1});  // [1] is now newer than [7]; [2 3] are older
  EXPECT_THAT(Evict(4), ElementsAre(3, 2, 7, 1));
}

// Issue test 7.
TEST_F(CacheTest, PinnedPathSurvivesEvictUntilReleased) {
  Init(1, 100);
  Insert({1, 2}, {1, 2});
  MatchResult m = Match({1, 2}, 0, /*pin=*/true);
  ASSERT_NE(m.lease_id, 0);
  Insert({1, 3}, {5, 3});  // sibling of 2, newer, unpinned
  EXPECT_THAT(Evict(10), ElementsAre(3));
  ASSERT_TRUE(cache_->Release("a", m.lease_id).ok());
  Check();
  // Once the leaf [2] goes, its parent [1] becomes an evictable leaf.
  EXPECT_THAT(Evict(10), ElementsAre(2, 1));
}

TEST_F(CacheTest, LeasePinsExactlyTheMatchedBlocks) {
  Init(1, 100);
  Insert({1, 2, 3}, {1, 2, 3});
  MatchResult m = Match({1}, 0, /*pin=*/true);
  EXPECT_THAT(Evict(10), ElementsAre(3, 2));
  EXPECT_EQ(cache_->Stats(TenantScope::All()).tenants[0].pinned_blocks, 1);
  ASSERT_TRUE(cache_->Release("a", m.lease_id).ok());
  EXPECT_THAT(Evict(10), ElementsAre(1));
}

// Issue test 8.
TEST_F(CacheTest, EverythingPinnedEvictsNothing) {
  Init(1, 100);
  Insert({1, 2}, {1, 2}, 0, /*pin=*/true);
  Insert({3}, {3}, 0, /*pin=*/true);
  EXPECT_THAT(Evict(5), IsEmpty());
}

// Issue test 9.
TEST_F(CacheTest, InsertPastBudgetEvictsLeastRecentlyUsed) {
  Init(1, 4);
  Insert({1, 2}, {1, 2});
  Insert({3, 4}, {3, 4});
  InsertResult r = Insert({5, 6}, {5, 6});
  EXPECT_THAT(r.evicted_block_ids, ElementsAre(2, 1));
  EXPECT_EQ(Match({1}).matched_tokens, 0);
  EXPECT_EQ(Match({3, 4}).matched_tokens, 2);
}

TEST_F(CacheTest, InsertIntoABudgetFullOfPinsIsRefusedAndChangesNothing) {
  Init(1, 4);
  Insert({1, 2}, {1, 2}, 0, true);
  Insert({3, 4}, {3, 4}, 0, true);
  const std::string before = Snapshot();
  auto r = TryInsert({5}, {5});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr("limit is 4 blocks: it caches 4 (4 pinned)"));
  r = TryInsert({5}, {5}, 0, false, "b");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr("budget is 4 blocks: 4 cached (4 pinned)"));
  EXPECT_EQ(Snapshot(), before);
  EXPECT_EQ(Snapshot("b"), "b cached=0 pinned=0 nodes=0 leases=0\n");
  // The refused ID was not kept: it can be inserted once there is room.
  EXPECT_THAT(Evict(1), IsEmpty());
}

TEST_F(CacheTest, InsertNeverEvictsItsOwnPath) {
  Init(1, 3);
  Insert({1, 2, 3}, {1, 2, 3});
  // Extends the only path; the path itself may not make room.
  auto r = TryInsert({1, 2, 3, 4}, {1, 2, 3, 4});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  // A sibling path can take the old tail's place.
  InsertResult ok = Insert({1, 5}, {1, 5});
  EXPECT_THAT(ok.evicted_block_ids, ElementsAre(3));
}

// Issue test 10.
TEST_F(CacheTest, CachedOrRepeatedIdsAreRejected) {
  Init(1, 100);
  Insert({1, 2}, {10, 20});
  Insert({9}, {90}, 0, false, "b");
  const std::string before = Snapshot() + Snapshot("b");
  auto r = TryInsert({5, 6}, {7, 7});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("block id 7 appears twice"));
  r = TryInsert({5, 6}, {8, 20});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("block id 20 is already cached"));
  r = TryInsert({5}, {90});  // cached by another tenant
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("block id 90 is already cached"));
  r = TryInsert({1, 3}, {90, 30});  // a redundant ID must not be cached either
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Snapshot() + Snapshot("b"), before);
}

// Issue test 11.
TEST_F(CacheTest, TenantsSeeOnlyTheirOwnBlocks) {
  Init(1, 100);
  Insert({1, 2, 3}, {10, 20, 30}, 0, false, "a");
  EXPECT_EQ(Match({1, 2, 3}, 0, false, "b").matched_tokens, 0);
  InsertResult r = Insert({1, 2, 3}, {11, 21, 31}, 0, false, "b");
  EXPECT_EQ(r.cached_tokens, 0);
  EXPECT_THAT(MatchedIds(Match({1, 2, 3}, 0, false, "b")),
              ElementsAre(11, 21, 31));
  EXPECT_THAT(MatchedIds(Match({1, 2, 3}, 0, false, "a")),
              ElementsAre(10, 20, 30));
}

TEST_F(CacheTest, NamespacesAreSeparateTrees) {
  Init(1, 100);
  InsertRequest req;
  std::vector<Token> tokens{1, 2};
  std::vector<BlockId> ids{1, 2};
  req.tokens = tokens;
  req.block_ids = ids;
  req.ns = "lora-a";
  ASSERT_TRUE(cache_->Insert("a", req).ok());
  EXPECT_EQ(Match({1, 2}).matched_tokens, 0);  // default namespace
  MatchQuery m;
  m.tokens = tokens;
  m.ns = "lora-a";
  EXPECT_EQ(cache_->Match("a", m)->matched_tokens, 2);
}

// Issue test 12.
TEST_F(CacheTest, TenantOverItsLimitEvictsItsOwnBlocks) {
  Init(1, 100, {{"a", {0, 3}}, {"b", {0, 100}}});
  Insert({50}, {50}, 0, false, "b");  // older than all of a's blocks
  Insert({1, 2}, {1, 2});
  InsertResult r = Insert({3, 4}, {3, 4});
  EXPECT_THAT(r.evicted_block_ids, ElementsAre(2));  // a's own LRU, not b's
  EXPECT_EQ(cache_->Stats(TenantScope::One("a")).tenants[0].evicted_blocks[1],
            1);
  EXPECT_EQ(Match({50}, 0, false, "b").matched_tokens, 1);
}

TEST_F(CacheTest, ReservationSurvivesAnotherTenantsFlood) {
  Init(1, 10, {{"a", {4, 10}}, {"b", {0, 10}}});
  Insert({1, 2, 3, 4}, {1, 2, 3, 4});  // a: exactly its reservation
  for (BlockId i = 0; i < 50; ++i) {
    Insert({1000 + static_cast<Token>(i)}, {100 + i}, 0, false, "b");
  }
  EXPECT_EQ(Match({1, 2, 3, 4}).matched_tokens, 4);
  EXPECT_EQ(cache_->Stats(TenantScope::One("b")).tenants[0].cached_blocks, 6);
}

// A reservation is a guarantee even when another tenant pins: pins above
// a tenant's reservation may use only what the reservations leave free.
TEST_F(CacheTest, PinsOfOthersNeverTakeAReservation) {
  Init(1, 10, {{"a", {4, 4}}, {"b", {0, 10}}});
  // b may pin 6 blocks (10 minus a's 4); the 7th is refused, changing nothing.
  Insert(Range(100, 105), {100, 101, 102, 103, 104, 105}, 0, true, "b");
  const std::string before = Snapshot("b");
  auto refused = TryInsert({200}, {200}, 0, true, "b");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("tenant 'b' would pin 7 blocks, 7 above its "
                        "reservation of 0; the tenants' reservations (4 "
                        "blocks) leave 6 of the budget's 10 blocks"));
  EXPECT_EQ(Snapshot("b"), before);
  // A Match that would pin b's unpinned blocks is held to the same bound.
  Insert(Range(300, 303), {300, 301, 302, 303}, 0, false, "b");
  MatchQuery m;
  std::vector<Token> tokens = Range(300, 303);
  m.tokens = tokens;
  m.pin = true;
  EXPECT_EQ(cache_->Match("b", m).status().code(),
            absl::StatusCode::kResourceExhausted);
  // a gets its whole reservation, from b's unpinned blocks.
  InsertResult r = Insert(Range(1, 4), {1, 2, 3, 4});
  EXPECT_THAT(r.evicted_block_ids, UnorderedElementsAre(300, 301, 302, 303));
  EXPECT_EQ(cache_->Stats(TenantScope::One("a")).tenants[0].cached_blocks, 4);
}

TEST_F(CacheTest, BorrowedBlocksAboveTheReservationAreFairGame) {
  Init(1, 6, {{"a", {2, 6}}, {"b", {0, 6}}});
  Insert({1, 2, 3, 4}, {1, 2, 3, 4});  // a borrows 2 above its reservation of 2
  InsertResult r = Insert({7, 8, 9, 10}, {7, 8, 9, 10}, 0, false, "b");
  EXPECT_THAT(r.evicted_block_ids, ElementsAre(4, 3));
  EXPECT_EQ(Match({1, 2, 3, 4}).matched_tokens, 2);
  EXPECT_EQ(cache_->Stats(TenantScope::One("a")).tenants[0].evicted_blocks[0],
            2);
}

// Issue test 13.
TEST_F(CacheTest, LeasesExpireOnTheInjectedClock) {
  Init(1, 100);
  InsertResult r = Insert({1, 2}, {1, 2}, 0, /*pin=*/true);
  ASSERT_NE(r.lease_id, 0);
  clock_.Advance(absl::Seconds(9));
  auto kept = cache_->KeepAlive("a", {r.lease_id});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_THAT(*kept, ElementsAre(absl::Seconds(10)));
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(Evict(5), IsEmpty());  // renewed: still pinned
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(cache_->ExpireLeases(), 1);
  EXPECT_EQ(cache_->Stats(TenantScope::All()).tenants[0].lease_expired, 1);
  EXPECT_THAT(Evict(5), ElementsAre(2, 1));
  EXPECT_EQ(cache_->Release("a", r.lease_id).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CacheTest, SecondReleaseAndForeignLeasesAreNotFound) {
  Init(1, 100);
  MatchResult none = Match({1}, 0, true);
  EXPECT_EQ(none.lease_id, 0);  // nothing matched, nothing to pin
  InsertResult r = Insert({1}, {1}, 0, true);
  EXPECT_EQ(cache_->Release("b", r.lease_id).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(cache_->KeepAlive("b", {r.lease_id}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(cache_->Release("a", r.lease_id).ok());
  absl::Status again = cache_->Release("a", r.lease_id);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.message(), HasSubstr(absl::StrFormat("%016x", r.lease_id)));
}

// Regression (core_ops_fuzzer): with seed 1, tenants a and c drew the same
// lease IDs two leases apart, so c's lease ID released one of a's.
TEST_F(CacheTest, TenantsNeverDrawTheSameLeaseIds) {
  for (uint64_t seed = 1; seed <= 64; ++seed) {
    CacheOptions o;
    o.block_size = 1;
    o.block_bytes = 1;
    o.budget_bytes = 1000;
    o.clock = &clock_;
    o.seed = seed;
    cache_ = std::move(PrefixCache::Create(o)).value();
    std::map<LeaseId, std::string> owner;
    for (int n = 0; n < 40; ++n) {
      for (const char* t : {"a", "b", "c", "d"}) {
        std::vector<Token> tokens = {static_cast<Token>(n)};
        std::vector<BlockId> ids = {static_cast<BlockId>(n * 10 + t[0])};
        InsertRequest req{
            "", tokens, ids, 0, true, absl::ZeroDuration(), std::nullopt};
        const LeaseId lease = cache_->Insert(t, req).value().lease_id;
        ASSERT_TRUE(owner.emplace(lease, t).second)
            << "seed " << seed << ": tenant " << t << " drew lease " << lease
            << " of tenant " << owner[lease];
      }
    }
    for (const auto& [lease, t] : owner) {
      for (const char* other : {"a", "b", "c", "d"}) {
        if (t == other) continue;
        ASSERT_EQ(cache_->Release(other, lease).code(),
                  absl::StatusCode::kNotFound)
            << "seed " << seed;
      }
    }
  }
}

TEST_F(CacheTest, KeepAliveWithOneUnknownLeaseRenewsNone) {
  Init(1, 100);
  InsertResult r = Insert({1}, {1}, 0, true);
  clock_.Advance(absl::Seconds(8));
  EXPECT_EQ(cache_->KeepAlive("a", {r.lease_id, 12345}).status().code(),
            absl::StatusCode::kNotFound);
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(cache_->ExpireLeases(), 1);  // not renewed
}

// Issue test 14.
TEST_F(CacheTest, InvalidateRemovesTheBlockAndEverythingBelow) {
  Init(1, 100);
  Insert({1, 2, 3, 4}, {1, 2, 3, 4});
  Insert({1, 2, 3, 9}, {1, 2, 3, 9});
  MatchResult lease = Match({1, 2, 3, 4}, 0, true);
  MatchResult outside = Match({1}, 0, true);
  auto removed = cache_->Invalidate(TenantScope::All(), {2});
  ASSERT_TRUE(removed.ok()) << removed.status();
  Check();
  EXPECT_THAT(*removed, UnorderedElementsAre(2, 3, 4, 9));
  EXPECT_THAT(MatchedIds(Match({1, 2, 3, 4})), ElementsAre(1));
  EXPECT_EQ(cache_->Release("a", lease.lease_id).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(cache_->Release("a", outside.lease_id).ok());
}

// Invalidate beside many leases and of a long node tail first: the results
// are exact. That it costs what it removes (ending the leases of each
// removed node without scanning them all; cutting a long node once, not
// re-splitting it per ID) is measured by core_bench's Invalidate benchmarks
// and bench/ratios.py (docs/performance.md), not timed here.
TEST_F(CacheTest, InvalidateBesideManyLeasesAndTailFirstIsExact) {
  Init(1, 1 << 20);
  Insert({0}, {1 << 30});
  MatchQuery pin;
  std::vector<Token> zero = {0};
  pin.tokens = zero;
  pin.pin = true;
  for (int i = 0; i < 65536; ++i) ASSERT_TRUE(cache_->Match("a", pin).ok());
  std::vector<BlockId> children;
  for (Token k = 1; k <= 8192; ++k) {
    InsertRequest req;
    std::vector<Token> tokens = {0, k};
    std::vector<BlockId> ids = {1 << 30, k};
    req.tokens = tokens;
    req.block_ids = ids;
    ASSERT_TRUE(cache_->Insert("a", req).ok());
    children.push_back(k);
  }
  auto removed = cache_->Invalidate(TenantScope::One("a"), children);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 8192u);
  EXPECT_EQ(cache_->Stats(TenantScope::One("a")).tenants[0].active_leases,
            65536u);

  std::vector<Token> tokens = Range(100000, 100000 + 32767);
  std::vector<BlockId> ids(tokens.begin(), tokens.end());
  InsertRequest req;
  req.tokens = tokens;
  req.block_ids = ids;
  ASSERT_TRUE(cache_->Insert("b", req).ok());
  std::vector<BlockId> reversed(ids.rbegin(), ids.rend());
  removed = cache_->Invalidate(TenantScope::One("b"), reversed);
  ASSERT_TRUE(removed.ok()) << removed.status();
  std::sort(removed->begin(), removed->end());
  EXPECT_EQ(*removed, ids);  // ids ascend
  Check();
}

TEST_F(CacheTest, InvalidateOfUnknownIdsChangesNothing) {
  Init(1, 100);
  Insert({1, 2}, {1, 2});
  Insert({5}, {5}, 0, false, "b");
  const std::string before = Snapshot();
  auto r = cache_->Invalidate(TenantScope::One("a"), {1, 77, 5});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(),
              HasSubstr("2 of 3 block ids are not cached: 77, 5"));
  EXPECT_EQ(Snapshot(), before);
}

TEST_F(CacheTest, ResetDropsTheScopedTenantsOnly) {
  Init(1, 100);
  Insert({1, 2}, {1, 2}, 0, true);
  Insert({1, 2}, {3, 4}, 0, false, "b");
  EXPECT_THAT(cache_->Reset(TenantScope::One("a")), UnorderedElementsAre(1, 2));
  Check();
  EXPECT_EQ(Match({1, 2}).matched_tokens, 0);
  EXPECT_EQ(Match({1, 2}, 0, false, "b").matched_tokens, 2);
  EXPECT_THAT(cache_->Reset(TenantScope::All()), UnorderedElementsAre(3, 4));
}

// Issue test 15.
TEST_F(CacheTest, RopeDeltasFormSegments) {
  Init(1, 100);
  Insert({1, 2}, {1, 2}, /*offset=*/0);
  MatchResult m = Match({1, 2}, /*offset=*/100);
  ASSERT_EQ(m.segments.size(), 1);
  EXPECT_EQ(m.segments[0].rope_delta, 100);
  EXPECT_EQ(m.segments[0].cached_position, 0);
  // A child computed at offset 100: [1 2] at 0..1, [3 4] at 102..103.
  Insert({1, 2, 3, 4}, {1, 2, 3, 4}, /*offset=*/100);
  m = Match({1, 2, 3, 4}, /*offset=*/50);
  ASSERT_EQ(m.segments.size(), 2);
  EXPECT_THAT(m.segments[0].block_ids, ElementsAre(1, 2));
  EXPECT_EQ(m.segments[0].rope_delta, 50);
  EXPECT_THAT(m.segments[1].block_ids, ElementsAre(3, 4));
  EXPECT_EQ(m.segments[1].cached_position, 102);
  EXPECT_EQ(m.segments[1].rope_delta, -50);
}

TEST_F(CacheTest, RopeDenyStopsAtTheFirstShiftedBlock) {
  Init(1, 100, {}, RopeShift::kDeny);
  Insert({1, 2}, {1, 2}, 0);
  Insert({1, 2, 3, 4}, {1, 2, 3, 4}, 100);
  EXPECT_EQ(Match({1, 2}, 100).matched_tokens, 0);
  MatchResult m = Match({1, 2, 3, 4}, 0);
  EXPECT_EQ(m.matched_tokens, 2);
  ASSERT_EQ(m.segments.size(), 1);
  EXPECT_EQ(m.segments[0].rope_delta, 0);
  // Why it stopped: block 3 is cached at 102, the query wanted it at 2.
  ASSERT_TRUE(m.rope_denied.has_value());
  EXPECT_EQ(m.rope_denied->requested_position, 2);
  EXPECT_EQ(m.rope_denied->cached_position, 102);
  m = Match({1, 2}, 100);
  ASSERT_TRUE(m.rope_denied.has_value());
  EXPECT_EQ(m.rope_denied->requested_position, 100);
  EXPECT_EQ(m.rope_denied->cached_position, 0);
  // A plain miss, or a full match, has no reason to give.
  EXPECT_FALSE(Match({7, 8}, 0).rope_denied.has_value());
  EXPECT_FALSE(Match({1, 2}, 0).rope_denied.has_value());
}

TEST_F(CacheTest, BadRequestsNameTheirValues) {
  Init(4, 100);
  MatchQuery m;
  EXPECT_THAT(cache_->Match("a", m).status().message(),
              HasSubstr("tokens is empty"));
  std::vector<Token> t = Range(1, 4);
  m.tokens = t;
  m.position_offset = -3;
  EXPECT_THAT(cache_->Match("a", m).status().message(),
              HasSubstr("position_offset -3"));
  m.position_offset = int64_t{1} << 40;
  EXPECT_THAT(cache_->Match("a", m).status().message(),
              HasSubstr("exceeds max_position"));
  m.position_offset = 0;
  m.ns = std::string(200, 'x');
  EXPECT_THAT(cache_->Match("a", m).status().message(), HasSubstr("200 bytes"));
  m.ns = "bad\nname";
  EXPECT_THAT(cache_->Match("a", m).status().message(),
              HasSubstr("0x0a at offset 3"));
  m.ns = "";
  m.lease_ttl = absl::Hours(100);
  EXPECT_THAT(cache_->Match("a", m).status().message(),
              HasSubstr("exceeds the limit"));
  EXPECT_THAT(cache_->Evict(TenantScope::All(), 0).status().message(),
              HasSubstr("blocks is 0"));
  EXPECT_EQ(
      cache_->Evict(TenantScope::All(), uint64_t{1} << 40).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Snapshot(), "");
}

TEST_F(CacheTest, UnknownTenantsAreRefusedWithoutDynamicTenants) {
  CacheOptions o;
  o.block_size = 1;
  o.block_bytes = 1;
  o.budget_bytes = 10;
  o.dynamic_tenants = false;
  o.tenants = {{"acme", {}}};
  auto c = PrefixCache::Create(o);
  ASSERT_TRUE(c.ok());
  MatchQuery m;
  std::vector<Token> t{1};
  m.tokens = t;
  auto r = (*c)->Match("other", m);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(r.status().message(), HasSubstr("'other'"));
  EXPECT_TRUE((*c)->Match("acme", m).ok());
}

TEST_F(CacheTest, CreateRejectsImpossibleOptions) {
  CacheOptions o;
  o.block_bytes = 1000;
  o.budget_bytes = 999;
  EXPECT_THAT(PrefixCache::Create(o).status().message(),
              HasSubstr("999 bytes holds no block"));
  o.budget_bytes = 10000;
  o.tenants = {{"a", {6000, 10000}}, {"b", {6000, 10000}}};
  EXPECT_THAT(PrefixCache::Create(o).status().message(),
              HasSubstr("total 12000 bytes"));
  o.tenants = {{"a", {2, 1}}};
  EXPECT_THAT(PrefixCache::Create(o).status().message(),
              HasSubstr("above its limit"));
  o.tenants = {};
  o.limits.max_tenants = 70000;  // the block index keeps 16 bits of tenant
  EXPECT_THAT(PrefixCache::Create(o).status().message(),
              HasSubstr("max_tenants 70000 is above the supported 65535"));
  o.limits.max_tenants = 65535;
  EXPECT_TRUE(PrefixCache::Create(o).ok());
}

TEST_F(CacheTest, EventsRecordStoresAndRemovals) {
  Init(1, 100);
  Insert({1, 2}, {1, 2});
  Insert({1, 2, 3}, {1, 2, 3});
  Evict(1);
  cache_->Reset(TenantScope::All());
  auto batch = cache_->ReadEvents("a", 1, 100);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->events.size(), 4);
  EXPECT_FALSE(batch->missed);
  EXPECT_EQ(batch->events[0].type, EventType::kBlockStored);
  EXPECT_THAT(batch->events[0].block_ids, ElementsAre(1, 2));
  EXPECT_FALSE(batch->events[0].has_parent);
  EXPECT_THAT(batch->events[1].block_ids, ElementsAre(3));
  EXPECT_EQ(batch->events[1].parent_block_id, 2);
  EXPECT_EQ(batch->events[2].type, EventType::kBlockRemoved);
  EXPECT_EQ(batch->events[2].reason, EvictReason::kRequested);
  EXPECT_EQ(batch->events[3].type, EventType::kCleared);
  EXPECT_EQ(batch->next_sequence, 5);
  // Another tenant sees nothing of it.
  EXPECT_TRUE(cache_->ReadEvents("b", 1, 100)->events.empty());
}

TEST_F(CacheTest, StatsCountHitsAndInserts) {
  Init(4, 100);
  Insert(Range(1, 8), {1, 2});
  Match(Range(1, 10));  // 10 tokens asked, 8 hit
  Insert(Range(1, 8), {7, 8});
  TenantUsage s = cache_->Stats(TenantScope::All()).tenants[0];
  EXPECT_EQ(s.match_requests, 1);
  EXPECT_EQ(s.match_tokens, 10);
  EXPECT_EQ(s.match_hit_tokens, 8);
  EXPECT_EQ(s.insert_requests, 2);
  EXPECT_EQ(s.inserted_blocks, 2);
  EXPECT_EQ(s.redundant_blocks, 2);
  EXPECT_EQ(s.cached_blocks, 2);
  EXPECT_EQ(s.tree_nodes, 1);
}

TEST_F(CacheTest, BatchesEqualTheSameCallsOneByOne) {
  // Two caches, one driven by batches and one by single calls, must end up
  // with the same results and the same trees, including a batch whose
  // middle insert has to evict another tenant's blocks (the exclusive
  // section) and a bad request that does not stop the rest.
  auto make = [&] {
    CacheOptions o;
    o.block_size = 1;
    o.block_bytes = 1;
    o.budget_bytes = 6;
    o.clock = &clock_;
    o.seed = 7;
    return std::move(PrefixCache::Create(o)).value();
  };
  auto batched = make(), single = make();
  for (PrefixCache* c : {batched.get(), single.get()}) {
    std::vector<Token> t{50, 51, 52};
    std::vector<BlockId> ids{50, 51, 52};
    InsertRequest r;
    r.tokens = t;
    r.block_ids = ids;
    ASSERT_TRUE(c->Insert("other", r).ok());
  }
  const std::vector<std::vector<Token>> tokens = {
      {1, 2}, {1, 3}, {7}, {9, 9}, {1, 2, 4}};
  const std::vector<std::vector<BlockId>> ids = {
      {1, 2}, {1, 3}, {}, {9, 9}, {1, 2, 4}};
  std::vector<InsertRequest> inserts(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    inserts[i].tokens = tokens[i];
    inserts[i].block_ids = ids[i];
  }
  auto got = batched->InsertBatch("a", inserts);
  ASSERT_EQ(got.size(), inserts.size());
  for (size_t i = 0; i < inserts.size(); ++i) {
    auto want = single->Insert("a", inserts[i]);
    ASSERT_EQ(got[i].status().code(), want.status().code()) << i;
    if (!want.ok()) continue;
    EXPECT_EQ(got[i]->cached_tokens, want->cached_tokens) << i;
    EXPECT_EQ(got[i]->redundant_block_ids, want->redundant_block_ids) << i;
    EXPECT_EQ(got[i]->evicted_block_ids, want->evicted_block_ids) << i;
  }
  EXPECT_EQ(got[2].status().code(),
            absl::StatusCode::kInvalidArgument);  // 1 token, 0 ids
  EXPECT_EQ(got[3].status().code(),
            absl::StatusCode::kInvalidArgument);    // id 9 twice
  EXPECT_FALSE(got[4]->evicted_block_ids.empty());  // past the budget of 6

  std::vector<MatchQuery> matches(3);
  std::vector<Token> m0{1, 2, 4}, m1{50}, m2{};
  matches[0].tokens = m0;
  matches[0].pin = true;
  matches[1].tokens = m1;
  matches[2].tokens = m2;  // empty: INVALID_ARGUMENT
  auto mgot = batched->MatchBatch("a", matches);
  for (size_t i = 0; i < matches.size(); ++i) {
    auto want = single->Match("a", matches[i]);
    ASSERT_EQ(mgot[i].status().code(), want.status().code()) << i;
    if (want.ok()) {
      EXPECT_EQ(MatchedIds(*mgot[i]), MatchedIds(*want)) << i;
    }
  }
  EXPECT_EQ(mgot[0]->matched_tokens, 3);
  EXPECT_NE(mgot[0]->lease_id, 0);
  for (const std::string tenant : {"a", "other"}) {
    for (const std::string ns : {""}) {
      auto a = batched->Dump(tenant, ns), b = single->Dump(tenant, ns);
      ASSERT_EQ(a.ok(), b.ok());
      if (!a.ok()) continue;
      ASSERT_EQ(a->size(), b->size());
      for (size_t i = 0; i < a->size(); ++i) {
        EXPECT_EQ((*a)[i].block_ids, (*b)[i].block_ids);
        EXPECT_EQ((*a)[i].pins, (*b)[i].pins);
      }
    }
  }
  EXPECT_TRUE(batched->CheckInvariants().ok());
}

TEST_F(CacheTest, ABatchOfBadRequestsCreatesNoTenant) {
  Init(2, 100);
  std::vector<InsertRequest> bad(2);
  std::vector<Token> odd{1, 2, 3};
  bad[0].tokens = odd;
  auto r = cache_->InsertBatch("newcomer", bad);
  EXPECT_EQ(r[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(cache_->Stats(TenantScope::All()).tenants.empty());
}

// --- Eviction policies -------------------------------------------------------

TEST(EvictionPolicyTest, NamesParseCaseInsensitively) {
  EvictionPolicy p = EvictionPolicy::kLru;
  EXPECT_TRUE(ParseEvictionPolicy("adaptive", &p));
  EXPECT_EQ(p, EvictionPolicy::kAdaptive);
  EXPECT_EQ(EvictionPolicyName(p), "ADAPTIVE");
  EXPECT_TRUE(ParseEvictionPolicy("shadow", &p));
  EXPECT_EQ(EvictionPolicyName(p), "SHADOW");
  EXPECT_TRUE(ParseEvictionPolicy("Lru", &p));
  EXPECT_EQ(p, EvictionPolicy::kLru);
  EXPECT_EQ(EvictionPolicyName(p), "LRU");
  EXPECT_FALSE(ParseEvictionPolicy("arc", &p));
  EXPECT_EQ(p, EvictionPolicy::kLru);  // left as it was
  EXPECT_EQ(CacheOptions().eviction_policy, EvictionPolicy::kLru);
}

// The default policy is exactly the LRU of the tests above: the same
// sequence under ADAPTIVE evicts the once-seen block first instead.
TEST_F(CacheTest, LruEvictsTheOldestEvenIfItWasReused) {
  Init(1, 2);
  Insert({1}, {1});
  Match({1});
  Insert({2}, {2});
  EXPECT_THAT(Insert({3}, {3}).evicted_block_ids, ElementsAre(1));
}

TEST_F(CacheTest, AdaptiveEvictsOnceSeenBlocksBeforeReusedOnes) {
  policy_ = EvictionPolicy::kAdaptive;
  Init(1, 2);
  Insert({1}, {1});
  Match({1});  // [1] is seen again: T2
  Insert({2}, {2});
  // T1 holds [2] and [3], more than the target (half the budget, 1): its
  // oldest goes, although [1] is older.
  EXPECT_THAT(Insert({3}, {3}).evicted_block_ids, ElementsAre(2));
}

TEST_F(CacheTest, AdaptiveHistoryHitGivesOnceSeenBlocksMoreRoom) {
  for (bool history_hit : {false, true}) {
    SCOPED_TRACE(history_hit);
    policy_ = EvictionPolicy::kAdaptive;
    Init(1, 2);
    Insert({1}, {1});
    Match({1});
    Insert({2}, {2});
    EXPECT_THAT(Insert({3}, {3}).evicted_block_ids, ElementsAre(2));
    // [2] again, while the history remembers it evicted from T1: the
    // target of T1 grows from 1 to 2 and [2] is cached as T2. T1 (just
    // [3]) is then not above the target, so T2's oldest leaf, [1], goes. A
    // block the history does not know leaves the target at 1, below T1's
    // [3] and [5]: [3] goes.
    const InsertResult r = history_hit ? Insert({2}, {4}) : Insert({5}, {5});
    EXPECT_THAT(r.evicted_block_ids, ElementsAre(history_hit ? 1 : 3));
  }
}

TEST_F(CacheTest, AdaptiveHistoryForgetsBeyondItsSize) {
  policy_ = EvictionPolicy::kAdaptive;
  history_blocks_ = 1;
  Init(1, 2);
  Insert({1}, {1});
  Match({1});
  Insert({2}, {2});
  EXPECT_THAT(Insert({3}, {3}).evicted_block_ids, ElementsAre(2));
  EXPECT_THAT(Insert({4}, {4}).evicted_block_ids, ElementsAre(3));
  // B1 keeps only [3] now: [2] comes back as a stranger, and T1 ([4], [2])
  // is above the target, so T1's oldest goes, not [1].
  EXPECT_THAT(Insert({2}, {5}).evicted_block_ids, ElementsAre(4));
}

TEST_F(CacheTest, AdaptiveHistoryKnowsBlocksByTheirWholePrefix) {
  policy_ = EvictionPolicy::kAdaptive;
  Init(1, 3);
  Insert({1}, {1});
  Match({1});
  Insert({2}, {2});
  Insert({6}, {6});
  EXPECT_THAT(Insert({3}, {3}).evicted_block_ids, ElementsAre(2));
  // [3 2] ends in the tokens of the evicted [2], but its prefix differs:
  // no history hit, so the target stays 1 and T1's oldest leaf, [6], goes.
  // (A hit would make [3 2] T2 and the target 2, and evict [1].)
  EXPECT_THAT(Insert({3, 2}, {3, 4}).evicted_block_ids, ElementsAre(6));
}

TEST_F(CacheTest, AdaptiveReturnsEveryEvictedIdOnceAndKeepsTheBudget) {
  policy_ = EvictionPolicy::kAdaptive;
  history_blocks_ = 8;
  Init(2, 16);
  std::vector<BlockId> returned;
  BlockId next = 1;
  uint64_t seed = 7;
  auto rnd = [&](int n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>((seed >> 33) % n);
  };
  for (int i = 0; i < 2000; ++i) {
    std::vector<Token> tokens;
    for (int b = 1 + rnd(5); b > 0; --b) {
      const Token v = static_cast<Token>(rnd(4));
      tokens.push_back(v);
      tokens.push_back(v + 10);
    }
    if (rnd(3) == 0) {
      Match(tokens);
      continue;
    }
    std::vector<BlockId> ids;
    for (size_t b = 0; b < tokens.size() / 2; ++b) ids.push_back(next++);
    const InsertResult r = Insert(tokens, ids);
    returned.insert(returned.end(), r.redundant_block_ids.begin(),
                    r.redundant_block_ids.end());
    returned.insert(returned.end(), r.evicted_block_ids.begin(),
                    r.evicted_block_ids.end());
    if (rnd(10) == 0) {
      const std::vector<BlockId> e = Evict(1 + rnd(3));
      returned.insert(returned.end(), e.begin(), e.end());
    }
    ASSERT_LE(cache_->Stats(TenantScope::All()).resident_blocks, 16u);
  }
  std::vector<BlockId> all = returned;
  for (const DumpNode& n :
       cache_->Dump("a", "").value_or(std::vector<DumpNode>{}))
    all.insert(all.end(), n.block_ids.begin(), n.block_ids.end());
  std::sort(all.begin(), all.end());
  std::vector<BlockId> want(next - 1);
  std::iota(want.begin(), want.end(), 1);
  EXPECT_EQ(all, want);  // each ID cached or returned, exactly once
}

TEST_F(CacheTest, AdaptiveStateSurvivesASnapshotAsOnceSeenBlocks) {
  policy_ = EvictionPolicy::kAdaptive;
  Init(1, 4);
  Insert({1, 2}, {1, 2});
  Match({1});
  const std::string bytes = cache_->SaveSnapshot({});
  Init(1, 4);
  ASSERT_TRUE(cache_->LoadSnapshot(bytes).ok());
  Check();  // every loaded block has its fingerprint
  // Loaded blocks are all T1: LRU order among them, tail first.
  EXPECT_THAT(Insert({5, 6, 7}, {5, 6, 7}).evicted_block_ids, ElementsAre(2));
}

// SHADOW holds blocks seen once (T1) to a fortieth of the limit while the
// LRU shadow does not lead (it has no hits yet here): the oldest T1 leaf
// goes although a T2 leaf is older, and a block cached while the history
// remembers it is T2 at once.
TEST_F(CacheTest, ShadowEvictsOnceSeenBlocksFirstAndRemembersThem) {
  policy_ = EvictionPolicy::kShadow;
  Init(1, 40);  // T1's target: 1 block
  Insert({1}, {1});
  Match({1});  // T2
  for (Token t = 2; t <= 40; ++t) Insert({t}, {static_cast<BlockId>(t)});
  EXPECT_THAT(Insert({41}, {41}).evicted_block_ids, ElementsAre(2));
  EXPECT_THAT(Insert({42}, {42}).evicted_block_ids, ElementsAre(3));
  // [2] comes back as T2; T1 ([4] ... [42]) still goes first.
  EXPECT_THAT(Insert({2}, {102}).evicted_block_ids, ElementsAre(4));
  // Once T1 holds no more than its target with the new block, T2's oldest
  // leaf goes: [1], matched before any of the others.
  for (Token t = 5; t <= 42; ++t) Match({t});
  EXPECT_THAT(Insert({81}, {81}).evicted_block_ids, ElementsAre(1));
  EXPECT_THAT(Insert({82}, {82}).evicted_block_ids, ElementsAre(81));
}

TEST_F(CacheTest, CreateRejectsAnUnknownEvictionPolicy) {
  CacheOptions o;
  o.eviction_policy = static_cast<EvictionPolicy>(7);
  auto c = PrefixCache::Create(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("eviction_policy 7"));
  o.eviction_policy = EvictionPolicy::kAdaptive;
  o.eviction_history_blocks = (uint64_t{1} << 32) + 1;
  c = PrefixCache::Create(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr("eviction_history_blocks 4294967297"));
}

// --- Retention hints
// -----------------------------------------------------------

TEST_F(CacheTest, RetentionValidationNamesTheValueAndChangesNothing) {
  Init(4, 100);
  Insert({1, 2, 3, 4}, {1});
  const std::string before = Snapshot();
  auto stats_before = cache_->Stats(TenantScope::All()).tenants[0];
  struct Case {
    Retention r;
    std::string message;
  };
  auto range = [](uint64_t b, uint64_t e, int p = 50) {
    return RetentionRange{b, e, p, absl::ZeroDuration()};
  };
  std::vector<Case> cases = {
      {{101, absl::ZeroDuration(), {}},
       "retention priority 101 is outside [0, 100]"},
      {{-1, absl::ZeroDuration(), {}},
       "retention priority -1 is outside [0, 100]"},
      {{50, absl::Seconds(-1), {}}, "retention duration -1s is negative"},
      {{50, absl::ZeroDuration(), {range(0, 4, 150)}},
       "retention range 0 priority 150 is outside [0, 100]"},
      {{50, absl::ZeroDuration(), {range(0, 12)}},
       "retention range 0 token_end 12 exceeds the Insert's 8 tokens"},
      {{50, absl::ZeroDuration(), {range(4, 4)}},
       "retention range 0 is empty: token_begin 4 >= token_end 4"},
      {{50, absl::ZeroDuration(), {range(8, 0)}},
       "retention range 0 is empty: token_begin 8 >= token_end 8"},
      {{50, absl::ZeroDuration(), {range(0, 6), range(4, 8)}},
       "retention ranges 0 [0, 6) and 1 [4, 8) overlap or are out of order"},
      {{50, absl::ZeroDuration(), {range(4, 8), range(0, 4)}},
       "retention ranges 0 [4, 8) and 1 [0, 4) overlap or are out of order"},
  };
  std::vector<Token> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<BlockId> ids = {1, 2};
  for (const Case& c : cases) {
    InsertRequest req;
    req.tokens = tokens;
    req.block_ids = ids;
    req.retention = c.r;
    auto r = cache_->Insert("a", req);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), c.message);
    EXPECT_EQ(Snapshot(), before);
  }
  const TenantUsage after = cache_->Stats(TenantScope::All()).tenants[0];
  EXPECT_EQ(after.insert_requests, stats_before.insert_requests);
  // A valid hint is applied: one block at 10 (the range), one at 80.
  InsertRequest req;
  req.tokens = tokens;
  req.block_ids = ids;
  req.retention = Retention{80, absl::Seconds(5), {range(0, 4, 10)}};
  ASSERT_TRUE(cache_->Insert("a", req).ok());
  const TenantUsage hinted = cache_->Stats(TenantScope::All()).tenants[0];
  EXPECT_EQ(hinted.cached_blocks_by_retention[0], 1u);  // the cached one
  EXPECT_EQ(hinted.cached_blocks_by_retention[1], 0u);
  EXPECT_EQ(hinted.cached_blocks_by_retention[2], 1u);
  Check();
}

// Hints under both policies: the order is by priority first.
class CacheRetentionTest
    : public CacheTest,
      public ::testing::WithParamInterface<EvictionPolicy> {
 protected:
  void SetUp() override { policy_ = GetParam(); }

  InsertResult InsertHinted(std::vector<Token> tokens, std::vector<BlockId> ids,
                            std::optional<Retention> retention,
                            absl::string_view tenant = "a") {
    InsertRequest req;
    req.tokens = tokens;
    req.block_ids = ids;
    req.retention = std::move(retention);
    auto r = cache_->Insert(tenant, req);
    EXPECT_TRUE(r.ok()) << r.status();
    Check();
    return r.ok() ? *r : InsertResult{};
  }
  static Retention Hint(int priority, absl::Duration d = absl::ZeroDuration()) {
    return Retention{priority, d, {}};
  }
  TenantUsage Usage(absl::string_view tenant = "a") {
    return cache_->Stats(TenantScope::One(tenant)).tenants[0];
  }
};

INSTANTIATE_TEST_SUITE_P(Policies, CacheRetentionTest,
                         ::testing::Values(EvictionPolicy::kLru,
                                           EvictionPolicy::kAdaptive,
                                           EvictionPolicy::kShadow),
                         [](const auto& info) {
                           return std::string(EvictionPolicyName(info.param));
                         });

TEST_P(CacheRetentionTest, LowerPriorityGoesFirst) {
  Init(1, 4);
  InsertHinted({1, 2}, {1, 2}, Hint(80));
  InsertHinted({3, 4}, {3, 4}, Hint(20));  // newer, but lower
  EXPECT_THAT(InsertHinted({5}, {5}, std::nullopt).evicted_block_ids,
              ElementsAre(4));
  EXPECT_THAT(InsertHinted({6}, {6}, std::nullopt).evicted_block_ids,
              ElementsAre(3));
  // Then the ordinary blocks, oldest first, before the priority-80 ones.
  EXPECT_THAT(InsertHinted({7}, {7}, std::nullopt).evicted_block_ids,
              ElementsAre(5));
  const TenantUsage u = Usage();
  EXPECT_EQ(u.evicted_blocks_by_retention[0], 2u);
  EXPECT_EQ(u.evicted_blocks_by_retention[1], 1u);
  EXPECT_EQ(u.evicted_blocks_by_retention[2], 0u);
  EXPECT_EQ(u.cached_blocks_by_retention[1], 2u);
  EXPECT_EQ(u.cached_blocks_by_retention[2], 2u);
}

TEST_P(CacheRetentionTest, TheCrossTenantChoiceComparesPriorities) {
  Init(1, 2);
  InsertHinted({1}, {1}, Hint(90), "a");
  InsertHinted({2}, {2}, Hint(10), "b");  // newer, lower
  EXPECT_THAT(InsertHinted({3}, {3}, std::nullopt, "a").evicted_block_ids,
              ElementsAre(2));
  EXPECT_EQ(Usage("b").cached_blocks, 0u);
  EXPECT_EQ(Usage("a").cached_blocks, 2u);
}

TEST_P(CacheRetentionTest, PinsBeatPriority) {
  Init(1, 2);
  InsertRequest req;
  std::vector<Token> tokens = {1};
  std::vector<BlockId> ids = {1};
  req.tokens = tokens;
  req.block_ids = ids;
  req.pin = true;
  req.retention = Hint(0);
  ASSERT_TRUE(cache_->Insert("a", req).ok());
  InsertHinted({2}, {2}, Hint(100));
  EXPECT_THAT(InsertHinted({3}, {3}, std::nullopt).evicted_block_ids,
              ElementsAre(2));
}

TEST_P(CacheRetentionTest, PriorityHundredIsStillEvictedForTheBudget) {
  Init(1, 2);
  InsertHinted({1, 2}, {1, 2}, Hint(100));
  EXPECT_THAT(InsertHinted({3, 4}, {3, 4}, Hint(100)).evicted_block_ids,
              ElementsAre(2, 1));
  EXPECT_EQ(Usage().evicted_blocks_by_retention[2], 2u);
}

TEST_P(CacheRetentionTest, AHintLapsesAfterItsDuration) {
  Init(1, 2);
  InsertHinted({1}, {1}, Hint(90, absl::Seconds(5)));
  InsertHinted({2}, {2}, std::nullopt);
  EXPECT_EQ(Usage().cached_blocks_by_retention[2], 1u);
  clock_.Advance(absl::Seconds(4));
  // Still held: the newer ordinary block goes.
  EXPECT_THAT(InsertHinted({3}, {3}, std::nullopt).evicted_block_ids,
              ElementsAre(2));
  clock_.Advance(absl::Seconds(1));
  // Lapsed: block 1 is ordinary and the oldest.
  EXPECT_EQ(Usage().cached_blocks_by_retention[2], 0u);
  EXPECT_THAT(InsertHinted({4}, {4}, std::nullopt).evicted_block_ids,
              ElementsAre(1));
}

TEST_P(CacheRetentionTest, TheLatestHintWins) {
  Init(1, 2);
  InsertHinted({1}, {1}, Hint(90));
  InsertHinted({1}, {1}, Hint(10));  // cached: takes the new hint
  InsertHinted({2}, {2}, std::nullopt);
  EXPECT_EQ(Usage().cached_blocks_by_retention[0], 1u);
  EXPECT_THAT(InsertHinted({3}, {3}, std::nullopt).evicted_block_ids,
              ElementsAre(1));
  // Without a hint, cached blocks keep theirs.
  InsertHinted({4}, {4}, Hint(90));
  InsertHinted({4}, {4}, std::nullopt);
  EXPECT_EQ(Usage().cached_blocks_by_retention[2], 1u);
}

TEST_P(CacheRetentionTest, RangesSplitNodesWhereTheHintChanges) {
  Init(2, 5);
  // One node of four blocks, ordinary.
  InsertHinted({1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 3, 4}, std::nullopt);
  // Its first two blocks again, at 90, the second of them by a range at 10.
  Retention r = Hint(90);
  r.ranges.push_back({2, 0, 10, absl::ZeroDuration()});
  InsertHinted({1, 2, 3, 4}, {1, 2}, r);
  const std::vector<DumpNode> dump = cache_->Dump("a", "").value();
  ASSERT_EQ(dump.size(), 3u);
  EXPECT_THAT(dump[0].block_ids, ElementsAre(1));
  EXPECT_THAT(dump[1].block_ids, ElementsAre(2));
  EXPECT_THAT(dump[2].block_ids, ElementsAre(3, 4));
  const TenantUsage u = Usage();
  EXPECT_EQ(u.cached_blocks_by_retention[0], 1u);
  EXPECT_EQ(u.cached_blocks_by_retention[1], 2u);
  EXPECT_EQ(u.cached_blocks_by_retention[2], 1u);
  // New blocks in runs of one hint: [5] at 20, [6, 7] at 70.
  Retention n = Hint(70);
  n.ranges.push_back({0, 2, 20, absl::ZeroDuration()});
  EXPECT_THAT(
      InsertHinted({9, 9, 10, 10, 11, 11}, {5, 6, 7}, n).evicted_block_ids,
      ElementsAre(4, 3));
  // Left: [1] 90 -> [2] 10, [5] 20 -> [6 7] 70. The leaves by priority.
  EXPECT_THAT(Evict(1), ElementsAre(2));
  EXPECT_THAT(Evict(1), ElementsAre(7));
  EXPECT_THAT(Evict(2), ElementsAre(6, 5));
  EXPECT_THAT(Evict(1), ElementsAre(1));
}

TEST_F(CacheTest, WithoutHintsEveryBlockCountsAsDefaultRetention) {
  Init(1, 3);
  Insert({1, 2}, {1, 2});
  Insert({3, 4}, {3, 4});  // evicts [2] (budget)
  Evict(1);
  ASSERT_TRUE(cache_->Invalidate(TenantScope::All(), {3}).ok());
  const TenantUsage s = cache_->Stats(TenantScope::All()).tenants[0];
  EXPECT_EQ(s.cached_blocks_by_retention[0], 0u);
  EXPECT_EQ(s.cached_blocks_by_retention[1], s.cached_blocks);
  EXPECT_EQ(s.cached_blocks_by_retention[2], 0u);
  EXPECT_EQ(s.evicted_blocks_by_retention[1], 2u);  // not the invalidated
  EXPECT_EQ(s.evicted_blocks_by_retention[0] + s.evicted_blocks_by_retention[2],
            0u);
}

}  // namespace
}  // namespace prefixd
