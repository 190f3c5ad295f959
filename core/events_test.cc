#include "core/events.h"

#include "gtest/gtest.h"

namespace prefixd {
namespace {

Event Stored(BlockId id) {
  Event e;
  e.block_ids = {id};
  return e;
}

TEST(EventRingTest, NumbersEventsFromOne) {
  EventRing ring(8);
  ring.Append(Stored(1));
  ring.Append(Stored(2));
  bool missed;
  uint64_t next;
  auto events = ring.Read(0, 10, &missed, &next);
  ASSERT_EQ(events.size(), 2);
  EXPECT_EQ(events[0].sequence, 1);
  EXPECT_EQ(events[1].sequence, 2);
  EXPECT_FALSE(missed);
  EXPECT_EQ(next, 3);
}

TEST(EventRingTest, ReadingPastTheEndWaitsAtTheEnd) {
  EventRing ring(8);
  ring.Append(Stored(1));
  bool missed;
  uint64_t next;
  EXPECT_TRUE(ring.Read(2, 10, &missed, &next).empty());
  EXPECT_FALSE(missed);
  EXPECT_EQ(next, 2);
}

TEST(EventRingTest, DroppedEventsAreReportedNotSkipped) {
  EventRing ring(3);
  for (BlockId i = 1; i <= 5; ++i) ring.Append(Stored(i));
  bool missed;
  uint64_t next;
  auto events = ring.Read(1, 10, &missed, &next);
  EXPECT_TRUE(missed);
  ASSERT_EQ(events.size(), 3);
  EXPECT_EQ(events[0].sequence, 3);
  EXPECT_EQ(next, 6);
  events = ring.Read(4, 10, &missed, &next);
  EXPECT_FALSE(missed);
  EXPECT_EQ(events.size(), 2);
}

TEST(EventRingTest, ReadsAreBounded) {
  EventRing ring(8);
  for (BlockId i = 1; i <= 5; ++i) ring.Append(Stored(i));
  bool missed;
  uint64_t next;
  auto events = ring.Read(1, 2, &missed, &next);
  EXPECT_EQ(events.size(), 2);
  EXPECT_EQ(next, 3);
}

}  // namespace
}  // namespace prefixd
