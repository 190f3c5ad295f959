// Many threads, several tenants, every operation at once; afterwards the
// invariants hold and every block ID a thread handed in is accounted for:
// cached now, or handed back exactly once.
#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "core/cache.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

class Ledger {
 public:
  void Given(BlockId id) {
    MutexLock l(&mu_);
    ++given_[id];
  }
  void Returned(absl::Span<const BlockId> ids) {
    MutexLock l(&mu_);
    for (BlockId id : ids) ++returned_[id];
  }
  // Every ID given is cached exactly once or returned exactly once.
  std::string Check(const std::vector<BlockId>& cached) {
    MutexLock l(&mu_);
    absl::flat_hash_map<BlockId, int> in_cache;
    for (BlockId id : cached) ++in_cache[id];
    for (const auto& [id, n] : given_) {
      const int ret = returned_.contains(id) ? returned_.at(id) : 0;
      const int c = in_cache.contains(id) ? in_cache.at(id) : 0;
      if (n != 1 || ret + c != 1) {
        return "block " + std::to_string(id) + ": given " + std::to_string(n) +
               ", returned " + std::to_string(ret) + ", cached " +
               std::to_string(c);
      }
    }
    if (in_cache.size() != cached.size()) return "an ID is cached twice";
    for (const auto& [id, n] : in_cache) {
      if (!given_.contains(id)) return "cached an ID nobody gave";
    }
    return "";
  }

 private:
  Mutex mu_;
  absl::flat_hash_map<BlockId, int> given_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockId, int> returned_ ABSL_GUARDED_BY(mu_);
};

TEST(ConcurrencyTest, MixedOperationsAcrossTenantsKeepEveryInvariant) {
  ManualClock clock;
  CacheOptions o;
  o.block_size = 4;
  o.block_bytes = 1;
  o.budget_bytes = 300;
  o.clock = &clock;
  o.tenants = {
      {"t0", {40, 120}}, {"t1", {0, 300}}, {"t2", {20, 100}}, {"t3", {0, 300}}};
  o.dynamic_tenants = false;
  o.default_lease_ttl = absl::Seconds(5);
  auto cache = std::move(PrefixCache::Create(o)).value();
  Ledger ledger;
  std::atomic<BlockId> next_id{1};
  constexpr int kThreads = 8;
  constexpr int kOps = 4000;

  auto worker = [&](int w) {
    std::mt19937 rng(1000 + w);
    auto uniform = [&](int lo, int hi) {
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    };
    const std::string tenant = "t" + std::to_string(w % 4);
    std::vector<LeaseId> leases;
    for (int i = 0; i < kOps; ++i) {
      std::vector<Token> tokens;
      const int blocks = uniform(1, 8);
      for (int b = 0; b < blocks; ++b) {
        const Token v = uniform(0, 5);
        for (int j = 0; j < 4; ++j) tokens.push_back(v * 10 + j);
      }
      const int op = uniform(0, 99);
      if (op < 35) {
        MatchQuery req{"", tokens, 0, uniform(0, 3) == 0, absl::ZeroDuration()};
        auto r = cache->Match(tenant, req);
        ASSERT_TRUE(r.ok()) << r.status();
        if (r->lease_id) leases.push_back(r->lease_id);
      } else if (op < 80) {
        std::vector<BlockId> ids;
        for (int b = 0; b < blocks; ++b) ids.push_back(next_id++);
        InsertRequest req{uniform(0, 4) == 0 ? "ns" : "",
                          tokens,
                          ids,
                          0,
                          uniform(0, 4) == 0,
                          absl::ZeroDuration(),
                          std::nullopt};
        auto r = cache->Insert(tenant, req);
        if (r.ok()) {
          for (BlockId id : ids) ledger.Given(id);
          ledger.Returned(r->redundant_block_ids);
          ledger.Returned(r->evicted_block_ids);
          if (r->lease_id) leases.push_back(r->lease_id);
        } else {
          // Refused: nothing was adopted; the IDs stay the caller's.
          ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
              << r.status();
        }
      } else if (op < 88) {
        if (!leases.empty()) {
          const size_t k = uniform(0, leases.size() - 1);
          absl::Status s = cache->Release(tenant, leases[k]);
          ASSERT_TRUE(s.ok() || s.code() == absl::StatusCode::kNotFound) << s;
          leases.erase(leases.begin() + k);
        }
      } else if (op < 93) {
        auto r = cache->Evict(TenantScope::One(tenant), uniform(1, 6));
        ASSERT_TRUE(r.ok());
        ledger.Returned(*r);
      } else if (op < 96) {
        // Invalidate something this tenant may hold; NOT_FOUND is expected.
        const BlockId id = uniform(1, static_cast<int>(next_id.load()));
        auto r = cache->Invalidate(TenantScope::One(tenant), {id});
        if (r.ok()) ledger.Returned(*r);
      } else if (op < 97) {
        ledger.Returned(cache->Reset(TenantScope::One(tenant)));
        leases.clear();
      } else if (op < 99) {
        cache->ExpireLeases();
        (void)cache->Stats(TenantScope::All());
      } else {
        clock.Advance(absl::Seconds(1));
      }
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < kThreads; ++w) threads.emplace_back(worker, w);
  for (auto& t : threads) t.join();

  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  std::vector<BlockId> cached;
  for (const std::string t : {"t0", "t1", "t2", "t3"}) {
    for (const std::string ns : {"", "ns"}) {
      auto dump = cache->Dump(t, ns);
      if (!dump.ok()) continue;
      for (const DumpNode& n : *dump)
        cached.insert(cached.end(), n.block_ids.begin(), n.block_ids.end());
    }
  }
  EXPECT_EQ(ledger.Check(cached), "");
  EXPECT_GT(cached.size(), 0);
  CacheStats stats = cache->Stats(TenantScope::All());
  EXPECT_LE(stats.resident_blocks, 300);
}

}  // namespace
}  // namespace prefixd
