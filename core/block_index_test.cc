#include "core/block_index.h"

#include <cstdint>
#include <vector>

#include "core/radix_tree.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

constexpr uint64_t kPage = BlockIndex::kPageSize;

TEST(BlockIndexTest, ClaimSetNodeFindErase) {
  BlockIndex index;
  Node node;
  const std::vector<BlockId> ids = {0, 1, 2, kPage + 5, 7 * kPage};
  size_t failed = 99;
  ASSERT_TRUE(index.ClaimAll(ids, 3, &failed));
  EXPECT_EQ(failed, 99);  // untouched on success
  EXPECT_EQ(index.size(), 5);
  EXPECT_EQ(index.pages(), 3);
  auto owner = index.Find(kPage + 5);
  ASSERT_TRUE(owner.has_value());
  EXPECT_EQ(owner->tenant, 3);
  EXPECT_EQ(owner->node, nullptr);  // claimed, not yet attached

  index.SetNode(ids, &node);
  owner = index.Find(2);
  ASSERT_TRUE(owner.has_value());
  EXPECT_EQ(owner->tenant, 3);
  EXPECT_EQ(owner->node, &node);
  EXPECT_FALSE(index.Find(3).has_value());  // same page, never claimed
  EXPECT_FALSE(index.Find(2 * kPage).has_value());

  index.Erase(std::vector<BlockId>{0, 1});
  EXPECT_FALSE(index.Contains(0));
  EXPECT_TRUE(index.Contains(2));
  EXPECT_EQ(index.pages(), 3);
  index.Erase(2);
  EXPECT_EQ(index.pages(), 2);  // a page goes with its last id
  index.Erase(
      std::vector<BlockId>{kPage + 5, 7 * kPage, 12345});  // 12345 absent
  EXPECT_EQ(index.size(), 0);
  EXPECT_EQ(index.pages(), 0);
}

TEST(BlockIndexTest, RefusedClaimClaimsNothing) {
  BlockIndex index;
  size_t failed = 0;
  ASSERT_TRUE(index.ClaimAll(std::vector<BlockId>{40}, 1, &failed));
  // 40 is taken by tenant 1: the claim fails at its position and rolls back
  // the ids before it, including a new page.
  const std::vector<BlockId> ids = {10 * kPage, 41, 40, 42};
  EXPECT_FALSE(index.ClaimAll(ids, 2, &failed));
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(index.size(), 1);
  EXPECT_EQ(index.pages(), 1);
  EXPECT_EQ(index.Find(40)->tenant, 1);
  EXPECT_FALSE(index.Contains(41));
  EXPECT_FALSE(index.Contains(10 * kPage));
}

TEST(BlockIndexTest, RepeatedIdFailsAtItsSecondPosition) {
  BlockIndex index;
  size_t failed = 0;
  // Repeated in one page run, and across runs of different pages.
  EXPECT_FALSE(index.ClaimAll(std::vector<BlockId>{5, 6, 5}, 0, &failed));
  EXPECT_EQ(failed, 2);
  EXPECT_FALSE(
      index.ClaimAll(std::vector<BlockId>{5, 9 * kPage, 5}, 0, &failed));
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(index.size(), 0);
  EXPECT_EQ(index.pages(), 0);
}

TEST(BlockIndexTest, ExtremeIdsAndTenants) {
  BlockIndex index;
  Node node;
  const std::vector<BlockId> ids = {UINT64_MAX, UINT64_MAX - 1, 0,
                                    uint64_t{1} << 63};
  size_t failed = 0;
  ASSERT_TRUE(index.ClaimAll(ids, BlockIndex::kMaxTenants - 1, &failed));
  index.SetNode(ids, &node);
  for (BlockId id : ids) {
    auto owner = index.Find(id);
    ASSERT_TRUE(owner.has_value()) << id;
    EXPECT_EQ(owner->tenant, BlockIndex::kMaxTenants - 1);
    EXPECT_EQ(owner->node, &node);
  }
  index.Erase(ids);
  EXPECT_EQ(index.size(), 0);
}

TEST(BlockIndexTest, DensePoolCostsAboutOneWordPerId) {
  BlockIndex index;
  std::vector<BlockId> ids(100000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + i;
  size_t failed = 0;
  ASSERT_TRUE(index.ClaimAll(ids, 0, &failed));
  // 100,000 consecutive ids fill ceil pages, plus one partial at each end.
  EXPECT_LE(index.pages(), ids.size() / kPage + 2);
  EXPECT_EQ(index.size(), ids.size());
}

}  // namespace
}  // namespace prefixd
