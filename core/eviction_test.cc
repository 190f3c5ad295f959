// The eviction policy's own structures (u64_map.h, eviction_history.h,
// shadow_cache.h), against simple models; the policies themselves are tested
// through PrefixCache (cache_test.cc and the differential test).
#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "core/eviction_history.h"
#include "core/shadow_cache.h"
#include "core/u64_map.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

// Random puts and erases over few keys (long probe runs, many backward
// shifts) and the key kept aside (~0), against std::map.
TEST(U64MapTest, AgreesWithStdMapUnderChurn) {
  U64Map m;
  std::map<uint64_t, uint64_t> want;
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t r = rng();
    const uint64_t key = r % 7 == 0 ? ~uint64_t{0} : (r >> 8) % 3000;
    if (r % 3 == 0) {
      uint64_t value = 0;
      const bool had = want.count(key) > 0;
      const uint64_t expect = had ? want[key] : 0;
      ASSERT_EQ(m.Erase(key, &value), had) << key;
      if (had) {
        ASSERT_EQ(value, expect);
      }
      want.erase(key);
    } else {
      uint64_t old = 0;
      const bool had = want.count(key) > 0;
      const uint64_t expect = had ? want[key] : 0;
      ASSERT_EQ(m.Put(key, i, &old), had) << key;
      if (had) {
        ASSERT_EQ(old, expect);
      }
      want[key] = i;
    }
    ASSERT_EQ(m.size(), want.size() - want.count(~uint64_t{0}));
  }
  for (uint64_t k = 0; k < 3000; ++k) {
    const uint64_t* v = m.Find(k);
    ASSERT_EQ(v != nullptr, want.count(k) > 0) << k;
    if (v != nullptr) {
      ASSERT_EQ(*v, want[k]);
    }
  }
  const uint64_t aside = 1;
  EXPECT_EQ(m.Erase(~uint64_t{0}, nullptr, &aside),
            want.count(~uint64_t{0}) > 0 && want[~uint64_t{0}] == 1);
}

TEST(HistoryTest, EachListKeepsItsLastPushesAndTakeFindsTheList) {
  History h(2);
  h.Push(0, 10);
  h.Push(0, 11);
  h.Push(1, 20);
  h.Push(0, 12);  // B1's last two pushes: 11 and 12; 10 goes
  EXPECT_EQ(h.size(0), 2u);
  EXPECT_EQ(h.size(1), 1u);
  EXPECT_EQ(h.Take(10), -1);
  EXPECT_EQ(h.Take(11), 0);
  EXPECT_EQ(h.Take(11), -1);  // taken once
  EXPECT_EQ(h.size(0), 1u);
  EXPECT_EQ(h.Take(20), 1);
  ASSERT_TRUE(h.CheckInvariants().ok()) << h.CheckInvariants();
}

// A taken fingerprint leaves a hole: the list holds fewer than `capacity`
// until the hole's push is `capacity` pushes old. A fingerprint pushed
// again lives from its newest push. ~0, the key the map keeps aside (and
// the mark of a taken ring slot), is a fingerprint like the others.
TEST(HistoryTest, TakenAndRepushedFingerprintsAgreeWithAWindowModel) {
  const uint64_t kCapacity = 5;
  History h(kCapacity);
  std::vector<std::pair<int, uint64_t>> pushes;  // (list, fp) in order
  std::map<uint64_t, size_t> newest;             // fp -> index in pushes
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const uint64_t r = rng() % 40;
    const uint64_t fp = r == 39 ? ~uint64_t{0} : r;
    const int list = static_cast<int>(rng() % 2);
    // The model: fp is in `list` if its newest push (not taken since) is
    // among that list's last kCapacity pushes.
    auto in_window = [&](size_t at) {
      size_t later = 0;
      for (size_t j = at + 1; j < pushes.size(); ++j)
        later += pushes[j].first == pushes[at].first;
      return later < kCapacity;
    };
    auto it = newest.find(fp);
    const int want = it != newest.end() && in_window(it->second)
                         ? pushes[it->second].first
                         : -1;
    if (rng() % 3 == 0) {
      ASSERT_EQ(h.Take(fp), want) << i;
      newest.erase(fp);
    } else {
      h.Push(list, fp);
      pushes.push_back({list, fp});
      newest[fp] = pushes.size() - 1;
    }
    ASSERT_TRUE(h.CheckInvariants().ok()) << h.CheckInvariants();
  }
}

// LIRS by hand: probation holds what came in once, protected what was
// hit or came back from the ghosts.
TEST(ShadowCacheTest, LirsEvictsProbationFirstAndRemembersGhosts) {
  ShadowCache c(ShadowCache::Rule::kLirs, /*capacity=*/3, /*probation=*/1,
                /*ghosts=*/2);
  EXPECT_FALSE(c.Access(1));
  EXPECT_FALSE(c.Access(2));
  EXPECT_TRUE(c.Access(1));   // 1 is protected; probation: 2
  EXPECT_FALSE(c.Access(3));  // probation: 2 3
  EXPECT_FALSE(c.Access(4));  // full, probation holds 2 > 1: 2 goes
  EXPECT_FALSE(c.Access(2));  // 3 goes; 2 was a ghost: protected 1 2
  EXPECT_TRUE(c.Access(1));
  EXPECT_TRUE(c.Access(2));
  EXPECT_FALSE(c.Access(3));  // probation holds 4 (not > 1): 1 goes; 3 was
                              // a ghost: protected 2 3
  EXPECT_FALSE(c.Access(1));  // 2 goes; 1 was a ghost: protected 3 1
  EXPECT_FALSE(c.Access(5));  // 3 goes; probation 4 5
  EXPECT_TRUE(c.Access(4));   // protected 1 4, probation 5
  EXPECT_TRUE(c.Access(1));   // without the ghosts, 1 would be gone
  EXPECT_EQ(c.size(), 3u);
  ASSERT_TRUE(c.CheckInvariants().ok()) << c.CheckInvariants();
}

// Both rules against a model of plain lists, under random accesses over
// few fingerprints (many hits, evictions and ghost returns).
TEST(ShadowCacheTest, AgreesWithAListModel) {
  for (ShadowCache::Rule rule :
       {ShadowCache::Rule::kLru, ShadowCache::Rule::kLirs}) {
    const bool lirs = rule == ShadowCache::Rule::kLirs;
    const uint64_t kCapacity = 8, kProbation = 2, kGhosts = 6;
    ShadowCache c(rule, kCapacity, kProbation, kGhosts);
    std::deque<uint64_t> lists[2];  // oldest first
    std::deque<uint64_t> ghosts;    // the newest kGhosts evicted, not taken
    std::mt19937_64 rng(11);
    for (int i = 0; i < 20000; ++i) {
      const uint64_t fp = rng() % 24;
      bool hit = false;
      for (auto& list : lists) {
        auto it = std::find(list.begin(), list.end(), fp);
        if (it == list.end()) continue;
        list.erase(it);
        lists[lirs ? 1 : 0].push_back(fp);
        hit = true;
      }
      if (!hit) {
        auto ghost = std::find(ghosts.begin(), ghosts.end(), fp);
        const bool again = ghost != ghosts.end();
        if (again) ghosts.erase(ghost);
        if (lists[0].size() + lists[1].size() == kCapacity) {
          const int l =
              lirs && lists[0].size() <= kProbation && !lists[1].empty();
          const uint64_t victim = lists[l].front();
          lists[l].pop_front();
          if (lirs) {
            ghosts.push_back(victim);
            if (ghosts.size() > kGhosts) ghosts.pop_front();
          }
        }
        lists[again ? 1 : 0].push_back(fp);
      }
      ASSERT_EQ(c.Access(fp), hit) << i;
      ASSERT_EQ(c.size(), lists[0].size() + lists[1].size()) << i;
      ASSERT_TRUE(c.CheckInvariants().ok()) << c.CheckInvariants();
    }
  }
}

}  // namespace
}  // namespace prefixd
