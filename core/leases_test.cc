#include "core/leases.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

using ::testing::UnorderedElementsAre;

class LeaseTableTest : public ::testing::Test {
 protected:
  LeaseTableTest() {
    const std::vector<Token> tokens = {1, 2};
    const std::vector<BlockId> ids = {7};
    a_ = AddChild(&tree_.root, tokens, ids, 0);
    b_ = AddChild(a_, tokens, std::vector<BlockId>{8}, 2);
  }

  void ExpectConsistent() const {
    const absl::Status s = table_.CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }

  Tree tree_{"", 2};
  Node* a_;
  Node* b_;
  LeaseTable table_{42};
  const absl::Time t0_ = absl::FromUnixSeconds(1000);
};

TEST_F(LeaseTableTest, AddFindRemove) {
  const LeaseId x = table_.Add(a_, absl::Seconds(10), t0_);
  const LeaseId y = table_.Add(a_, absl::Seconds(20), t0_);
  EXPECT_NE(x, 0u);
  EXPECT_NE(x, y);
  EXPECT_EQ(table_.size(), 2u);
  ASSERT_NE(table_.Find(x), nullptr);
  EXPECT_EQ(table_.Find(x)->end, a_);
  EXPECT_EQ(table_.Find(x)->expiry, t0_ + absl::Seconds(10));
  EXPECT_EQ(table_.Find(y)->ttl, absl::Seconds(20));
  ExpectConsistent();

  EXPECT_EQ(table_.Remove(x), a_);
  EXPECT_EQ(table_.Remove(x), nullptr);  // already gone
  EXPECT_EQ(table_.Find(x), nullptr);
  EXPECT_EQ(table_.size(), 1u);
  ExpectConsistent();
}

TEST_F(LeaseTableTest, SameSeedDrawsSameIds) {
  LeaseTable other(42);
  EXPECT_EQ(table_.Add(a_, absl::Seconds(1), t0_),
            other.Add(b_, absl::Seconds(1), t0_));
}

TEST_F(LeaseTableTest, ExpiryOrderFollowsRenewals) {
  const LeaseId x = table_.Add(a_, absl::Seconds(10), t0_);
  const LeaseId y = table_.Add(b_, absl::Seconds(20), t0_);
  EXPECT_EQ(table_.FirstExpired(t0_ + absl::Seconds(9)), 0u);
  EXPECT_EQ(table_.FirstExpired(t0_ + absl::Seconds(10)), x);
  // Renewed at +15, x now expires at +25, after y.
  table_.Renew(x, t0_ + absl::Seconds(15));
  EXPECT_EQ(table_.Find(x)->expiry, t0_ + absl::Seconds(25));
  EXPECT_EQ(table_.FirstExpired(t0_ + absl::Seconds(19)), 0u);
  EXPECT_EQ(table_.FirstExpired(t0_ + absl::Seconds(30)), y);
  ExpectConsistent();
}

TEST_F(LeaseTableTest, EndingAtFindsOnlyThatNode) {
  const LeaseId x = table_.Add(a_, absl::Seconds(10), t0_);
  const LeaseId y = table_.Add(b_, absl::Seconds(10), t0_);
  const LeaseId z = table_.Add(b_, absl::Seconds(10), t0_);
  std::vector<LeaseId> out;
  table_.EndingAt(b_, &out);
  EXPECT_THAT(out, UnorderedElementsAre(y, z));
  out.clear();
  table_.EndingAt(a_, &out);
  EXPECT_THAT(out, UnorderedElementsAre(x));
}

TEST_F(LeaseTableTest, RestoreKeepsTheGivenIdAndExpiry) {
  table_.Restore(0x1234, b_, absl::Seconds(30), t0_ + absl::Seconds(5));
  ASSERT_NE(table_.Find(0x1234), nullptr);
  EXPECT_EQ(table_.FirstExpired(t0_ + absl::Seconds(5)), 0x1234u);
  EXPECT_TRUE(table_.contains(0x1234));
  table_.Clear();
  EXPECT_EQ(table_.size(), 0u);
  EXPECT_EQ(table_.FirstExpired(t0_ + absl::Hours(1)), 0u);
  ExpectConsistent();
}

}  // namespace
}  // namespace prefixd
