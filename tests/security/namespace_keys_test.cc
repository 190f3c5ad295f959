// (tenant, namespace) is a structured key in core: tenant -> namespace ->
// tree, never one string made by concatenation. Pairs whose concatenations
// agree ("ab"+"c" and "a"+"bc", with or without a separator a caller could
// also send) must never see each other's blocks, events, dumps or stats.
#include <string>
#include <vector>

#include "core/cache.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;

constexpr int kBlockSize = 4;

std::unique_ptr<PrefixCache> NewCache() {
  CacheOptions o;
  o.block_size = kBlockSize;
  o.block_bytes = 1;
  o.budget_bytes = 1 << 20;
  o.dynamic_tenants = true;
  o.seed = 1;
  absl::StatusOr<std::unique_ptr<PrefixCache>> c = PrefixCache::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

const std::vector<Token> kPrompt = {1, 2, 3, 4, 5, 6, 7, 8};

uint64_t Matched(PrefixCache* cache, const std::string& tenant,
                 const std::string& ns) {
  MatchQuery m;
  m.ns = ns;
  m.tokens = kPrompt;
  absl::StatusOr<MatchResult> r = cache->Match(tenant, m);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->matched_tokens : 0;
}

struct Key {
  std::string tenant, ns;
};

// Each group: keys whose tenant and namespace concatenate alike under some
// separator ("" or one a naive key might use).
const std::vector<std::vector<Key>> kCollidingKeys = {
    {{"ab", "c"}, {"a", "bc"}, {"abc", ""}},
    {{"a/b", "c"}, {"a", "b/c"}},
    {{"a:b", "c"}, {"a", "b:c"}},
    {{"a",
      "b\x1f"
      "c"}},  // a namespace with a control byte is refused
};

TEST(NamespaceKeysTest, ConcatenationLookalikesNeverCollide) {
  for (const std::vector<Key>& group : kCollidingKeys) {
    for (size_t owner = 0; owner < group.size(); ++owner) {
      std::unique_ptr<PrefixCache> cache = NewCache();
      const Key& k = group[owner];
      InsertRequest in;
      in.ns = k.ns;
      in.tokens = kPrompt;
      const std::vector<BlockId> ids = {10, 11};
      in.block_ids = ids;
      absl::StatusOr<InsertResult> r = cache->Insert(k.tenant, in);
      if (!r.ok()) {
        // Names are printable ASCII: the cache refuses the rest rather than
        // store a key that could be confused in logs or labels.
        EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
        continue;
      }
      EXPECT_EQ(Matched(cache.get(), k.tenant, k.ns), kPrompt.size());
      for (size_t other = 0; other < group.size(); ++other) {
        if (other == owner) continue;
        const Key& o = group[other];
        EXPECT_EQ(Matched(cache.get(), o.tenant, o.ns), 0u)
            << "(" << k.tenant << ", " << k.ns << ") leaks into (" << o.tenant
            << ", " << o.ns << ")";
        absl::StatusOr<EventBatch> events = cache->ReadEvents(o.tenant, 0, 100);
        ASSERT_TRUE(events.ok());
        if (o.tenant != k.tenant) {
          EXPECT_TRUE(events->events.empty());
        }
        CacheStats s = cache->Stats(TenantScope::One(o.tenant));
        for (const TenantUsage& t : s.tenants) {
          if (t.tenant != k.tenant) {
            EXPECT_EQ(t.cached_blocks, 0u);
          }
        }
        EXPECT_FALSE(cache->Dump(o.tenant, o.ns).ok() &&
                     !cache->Dump(o.tenant, o.ns)->empty());
      }
      ASSERT_TRUE(cache->CheckInvariants().ok());
    }
  }
}

TEST(NamespaceKeysTest, SameTenantNamespacesAreSeparateTrees) {
  std::unique_ptr<PrefixCache> cache = NewCache();
  InsertRequest in;
  in.ns = "bc";
  in.tokens = kPrompt;
  const std::vector<BlockId> ids = {1, 2};
  in.block_ids = ids;
  ASSERT_TRUE(cache->Insert("a", in).ok());
  EXPECT_EQ(Matched(cache.get(), "a", "b"), 0u);
  EXPECT_EQ(Matched(cache.get(), "a", "bcd"), 0u);
  EXPECT_EQ(Matched(cache.get(), "a", ""), 0u);
  EXPECT_EQ(Matched(cache.get(), "a", "bc"), kPrompt.size());
  EXPECT_THAT(*cache->Namespaces("a"), ElementsAre("bc"));
}

}  // namespace
}  // namespace prefixd
