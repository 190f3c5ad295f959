#include "core/event_ring.h"

#include <atomic>

#include "core/cache.h"
#include "gmock/gmock.h"
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

// One event may carry 65,536 IDs: a ring bounded only by its count held
// 4096 x 512 KiB. It is bounded by bytes too, and keeps at least the newest.
TEST(EventRingTest, TheRingIsBoundedByBytes) {
  const uint64_t max_bytes = 1 << 20;
  EventRing ring(4096, nullptr, max_bytes);
  for (int i = 0; i < 64; ++i) {
    Event e;
    e.block_ids.assign(65536, static_cast<BlockId>(i));  // 512 KiB each
    ring.Append(std::move(e));
    EXPECT_LE(ring.bytes(), max_bytes) << "after event " << i;
    EXPECT_GE(ring.size(), 1u);
  }
  EXPECT_EQ(ring.size(), 1u);  // two such events do not fit in 1 MiB
  bool missed;
  uint64_t next;
  auto events = ring.Read(1, 10, &missed, &next);
  EXPECT_TRUE(missed);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].sequence, 64u);
  Event huge;
  huge.block_ids.assign(1 << 18, 7);  // 2 MiB: over the bound, kept alone
  ring.Append(std::move(huge));
  EXPECT_EQ(ring.size(), 1u);
  EXPECT_EQ(ring.Read(65, 1, &missed, &next).size(), 1u);
}

TEST(EventRingTest, RingsSharingACounterAreOrderedAcrossEachOther) {
  std::atomic<uint64_t> order{0};
  EventRing a(8, &order), b(8, &order);
  a.Append(Stored(1));
  b.Append(Stored(2));
  a.Append(Stored(3));
  bool missed;
  uint64_t next;
  auto ea = a.Read(1, 10, &missed, &next);
  auto eb = b.Read(1, 10, &missed, &next);
  ASSERT_EQ(ea.size(), 2);
  ASSERT_EQ(eb.size(), 1);
  EXPECT_EQ(ea[0].order, 1);
  EXPECT_EQ(eb[0].order, 2);
  EXPECT_EQ(ea[1].order, 3);
  EXPECT_EQ(eb[0].sequence, 1);  // sequences stay per ring
  EXPECT_EQ(order.load(), 3);
}

std::unique_ptr<PrefixCache> Cache(bool detailed) {
  CacheOptions o;
  o.block_size = 2;
  o.block_bytes = 1;
  o.budget_bytes = 100;
  o.detailed_events = detailed;
  return *PrefixCache::Create(o);
}

void Insert(PrefixCache& c, absl::string_view tenant, std::vector<Token> tokens,
            std::vector<BlockId> ids) {
  InsertRequest r;
  r.tokens = tokens;
  r.block_ids = ids;
  ASSERT_TRUE(c.Insert(tenant, r).ok());
}

TEST(CacheEventsTest, DetailedEventsCarryTokensAndResetIds) {
  auto c = Cache(true);
  Insert(*c, "a", {1, 2, 3, 4}, {10, 11});
  Insert(*c, "b", {1, 2}, {20});
  Insert(*c, "a", {1, 2, 3, 4, 5, 6}, {10, 11, 12});
  c->Reset(TenantScope::One("a"));
  auto a = c->ReadEvents("a", 1, 10);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->events.size(), 3);
  EXPECT_THAT(a->events[0].tokens, ::testing::ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(a->events[0].prefix_tokens, 0);
  EXPECT_THAT(a->events[1].tokens, ::testing::ElementsAre(5, 6));
  EXPECT_EQ(a->events[1].prefix_tokens, 4);
  EXPECT_EQ(a->events[1].position, 4);
  EXPECT_EQ(a->events[2].type, EventType::kCleared);
  EXPECT_THAT(a->events[2].block_ids,
              ::testing::UnorderedElementsAre(10, 11, 12));
  // The cache-wide order: b's store came between a's two.
  auto b = c->ReadEvents("b", 1, 10);
  ASSERT_EQ(b->events.size(), 1);
  EXPECT_LT(a->events[0].order, b->events[0].order);
  EXPECT_LT(b->events[0].order, a->events[1].order);
  EXPECT_EQ(c->last_event_order(), a->events[2].order);
  EXPECT_THAT(c->TenantNames(), ::testing::ElementsAre("a", "b"));
}

TEST(CacheEventsTest, PlainEventsStaySmall) {
  auto c = Cache(false);
  Insert(*c, "a", {1, 2}, {10});
  c->Reset(TenantScope::All());
  auto a = c->ReadEvents("a", 1, 10);
  ASSERT_EQ(a->events.size(), 2);
  EXPECT_TRUE(a->events[0].tokens.empty());
  EXPECT_TRUE(a->events[1].block_ids.empty());
}

}  // namespace
}  // namespace prefixd
