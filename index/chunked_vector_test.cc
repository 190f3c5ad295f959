#include "index/chunked_vector.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(ChunkedVectorTest, GrowsWithoutMovingWhatItHolds) {
  ChunkedVector<uint64_t, 8> v;
  EXPECT_EQ(v.size(), 0u);
  uint64_t& first = v.emplace_back();
  EXPECT_EQ(first, 0u);  // value-initialised
  first = 7;
  for (uint64_t i = 1; i < 100; ++i) v.emplace_back() = i * 3;
  ASSERT_EQ(v.size(), 100u);
  EXPECT_EQ(&v[0], &first);  // 12 chunks later, still where it was
  EXPECT_EQ(v[0], 7u);
  for (uint64_t i = 1; i < 100; ++i) EXPECT_EQ(v[i], i * 3) << i;
  const auto& cv = v;
  EXPECT_EQ(cv[99], 297u);
}

}  // namespace
}  // namespace prefixd
