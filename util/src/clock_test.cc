#include "oscarkv/util/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock c(5000);
  EXPECT_EQ(c.NowMs(), 5000);
  EXPECT_EQ(c.UnixMs(), FakeClock::kUnixOffsetMs + 5000);
  c.Advance(250);
  EXPECT_EQ(c.NowMs(), 5250);
  const Clock& as_seam = c;
  EXPECT_EQ(as_seam.UnixMs() - as_seam.NowMs(), FakeClock::kUnixOffsetMs);
}

TEST(ClockTest, SystemClockIsMonotonicAndNearWallTime) {
  const Clock* c = SystemClock::Default();
  const int64_t a = c->NowMs();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GE(c->NowMs() - a, 5);
  const int64_t wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  EXPECT_LE(std::abs(c->UnixMs() - wall), 1000);
}

}  // namespace
}  // namespace oscarkv
