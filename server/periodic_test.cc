#include "server/periodic.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace prefixd {
namespace {

TEST(PeriodicThreadTest, WakeRunsWithoutWaitingForTheInterval) {
  std::atomic<int> runs{0};
  absl::Notification ran;
  PeriodicThread t(absl::Hours(1), [&] {
    if (runs.fetch_add(1) == 0) ran.Notify();
  });
  t.Wake();
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  t.Stop();
  EXPECT_EQ(runs.load(), 1);
}

TEST(PeriodicThreadTest, RunsEveryInterval) {
  std::atomic<int> runs{0};
  absl::Notification ran_twice;
  PeriodicThread t(absl::Milliseconds(1), [&] {
    if (runs.fetch_add(1) == 1) ran_twice.Notify();
  });
  EXPECT_TRUE(ran_twice.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(PeriodicThreadTest, StopIsIdempotent) {
  PeriodicThread t(absl::Hours(1), [] {});
  t.Stop();
  t.Stop();
}

}  // namespace
}  // namespace prefixd
