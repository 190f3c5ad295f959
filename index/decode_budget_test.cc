#include "index/decode_budget.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

// Polls until `done` holds, for up to 10 s.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// A Reserve on a thread of its own.
class Asker {
 public:
  Asker(DecodeBudget* budget, int64_t bytes)
      : thread_([this, budget, bytes] {
          r_ = budget->Reserve(bytes, stop_);
          done_ = true;
        }) {}
  ~Asker() {
    stop_ = true;
    thread_.join();
  }
  bool done() const { return done_; }
  // Once done: what it got.
  DecodeBudget::Reservation& reservation() { return r_; }
  void Stop(DecodeBudget* budget) {
    stop_ = true;
    budget->WakeWaiters();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  DecodeBudget::Reservation r_;
  std::thread thread_;
};

const std::atomic<bool> kNoStop{false};

TEST(DecodeBudgetTest, ReservationsWithinTheBudgetAreHeldAtOnce) {
  DecodeBudget budget(100);
  DecodeBudget::Reservation a = budget.Reserve(40, kNoStop);
  DecodeBudget::Reservation b = budget.Reserve(60, kNoStop);
  EXPECT_TRUE(a.held());
  EXPECT_TRUE(b.held());
  EXPECT_EQ(budget.reserved_bytes(), 100);
  a.Release();
  EXPECT_FALSE(a.held());
  EXPECT_EQ(budget.reserved_bytes(), 60);
  {
    DecodeBudget::Reservation moved = std::move(b);
    EXPECT_FALSE(b.held());  // NOLINT(bugprone-use-after-move): tested
    EXPECT_EQ(budget.reserved_bytes(), 60);
  }
  EXPECT_EQ(budget.reserved_bytes(), 0);
  EXPECT_EQ(budget.peak_reserved_bytes(), 100);
  EXPECT_EQ(budget.waits(), 0u);
}

TEST(DecodeBudgetTest, AReservationThatDoesNotFitWaitsForARelease) {
  DecodeBudget budget(100);
  DecodeBudget::Reservation held = budget.Reserve(60, kNoStop);
  Asker asker(&budget, 50);
  ASSERT_TRUE(Eventually([&] { return budget.waiting() == 1; }));
  EXPECT_FALSE(asker.done());
  EXPECT_EQ(budget.reserved_bytes(), 60);
  held.Release();
  ASSERT_TRUE(Eventually([&] { return asker.done(); }));
  EXPECT_TRUE(asker.reservation().held());
  EXPECT_EQ(budget.reserved_bytes(), 50);
  EXPECT_EQ(budget.peak_reserved_bytes(), 60);  // never 110
  EXPECT_EQ(budget.waits(), 1u);
}

TEST(DecodeBudgetTest, OneLargerThanTheBudgetWaitsUntilItIsAlone) {
  DecodeBudget budget(100);
  DecodeBudget::Reservation small = budget.Reserve(10, kNoStop);
  Asker large(&budget, 500);
  ASSERT_TRUE(Eventually([&] { return budget.waiting() == 1; }));
  EXPECT_FALSE(large.done());
  small.Release();
  ASSERT_TRUE(Eventually([&] { return large.done(); }));
  EXPECT_TRUE(large.reservation().held());
  EXPECT_EQ(budget.reserved_bytes(), 500);
  // Alone means alone: the next one waits, however small.
  Asker next(&budget, 1);
  ASSERT_TRUE(Eventually([&] { return budget.waiting() == 1; }));
  EXPECT_FALSE(next.done());
  large.reservation().Release();
  ASSERT_TRUE(Eventually([&] { return next.done(); }));
  EXPECT_EQ(budget.reserved_bytes(), 1);
  EXPECT_EQ(budget.peak_reserved_bytes(), 500);
}

TEST(DecodeBudgetTest, ReservationsAreGrantedInTheOrderAsked) {
  DecodeBudget budget(100);
  DecodeBudget::Reservation held = budget.Reserve(90, kNoStop);
  Asker first(&budget, 50);
  ASSERT_TRUE(Eventually([&] { return budget.waiting() == 1; }));
  // 5 would fit beside 90, but 50 asked first: it is not overtaken.
  Asker second(&budget, 5);
  ASSERT_TRUE(Eventually([&] { return budget.waiting() == 2; }));
  EXPECT_FALSE(second.done());
  held.Release();
  ASSERT_TRUE(Eventually([&] { return first.done() && second.done(); }));
  EXPECT_EQ(budget.reserved_bytes(), 55);
  EXPECT_EQ(budget.waits(), 2u);
}

TEST(DecodeBudgetTest, StopEndsTheWaitEmptyHandedAndLetsTheNextOneIn) {
  DecodeBudget budget(100);
  DecodeBudget::Reservation held = budget.Reserve(60, kNoStop);
  Asker stopped(&budget, 50);
  ASSERT_TRUE(Eventually([&] { return budget.waiting() == 1; }));
  Asker behind(&budget, 30);  // fits beside 60, queued behind 50
  ASSERT_TRUE(Eventually([&] { return budget.waiting() == 2; }));
  stopped.Stop(&budget);
  ASSERT_TRUE(Eventually([&] { return stopped.done() && behind.done(); }));
  EXPECT_FALSE(stopped.reservation().held());
  EXPECT_TRUE(behind.reservation().held());
  EXPECT_EQ(budget.reserved_bytes(), 90);
  EXPECT_EQ(budget.waiting(), 0u);
}

TEST(DecodeAllowanceTest, AllowsItsBytesPerPayloadByteAndNoMore) {
  DecodeAllowance a(1 << 20);
  EXPECT_EQ(a.limit(), int64_t{24} << 20);
  EXPECT_TRUE(a.Take(size_t{24} << 20));
  EXPECT_FALSE(a.exceeded());
  EXPECT_FALSE(a.Take(1));
  EXPECT_TRUE(a.exceeded());
  EXPECT_FALSE(a.Take(0));  // once exceeded, it stays so
  EXPECT_EQ(a.taken(), int64_t{24} << 20);
}

TEST(DecodeAllowanceTest, ASmallPayloadGetsTheFloor) {
  DecodeAllowance a(10);
  EXPECT_EQ(a.limit(), kDecodeAllowanceFloor);
  EXPECT_FALSE(a.Take(static_cast<size_t>(kDecodeAllowanceFloor) + 1));
}

TEST(DecodeAllowanceTest, CountsWhatMallocTakes) {
  EXPECT_EQ(DecodeAllowance::ArrayBytes(0, 8), 0u);
  EXPECT_EQ(DecodeAllowance::ArrayBytes(1, 8), 32u);     // malloc's least chunk
  EXPECT_EQ(DecodeAllowance::ArrayBytes(100, 4), 416u);  // 400 + 8, by 16s
  EXPECT_EQ(DecodeAllowance::StringBytes(15), 0u);       // kept in the string
  EXPECT_EQ(DecodeAllowance::StringBytes(40), 64u);      // 41 + 8, by 16s
}

}  // namespace
}  // namespace prefixd
