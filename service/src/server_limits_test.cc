#include "server_limits.h"

#include "gtest/gtest.h"

namespace oscarkv::service {
namespace {

TEST(ServerLimits, PeerHostDropsThePort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.5:4711"), "ipv4:10.0.0.5");
  EXPECT_EQ(PeerHost("ipv6:[::1]:80"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(PeerHost("ipv4:"), "ipv4:");
}

TEST(ServerLimits, PerPeerAndTotalBoundsAreIndependentAndFreedOnLeave) {
  PeerCallLimits l(/*per_peer=*/2, /*total=*/3);
  EXPECT_TRUE(l.Enter("a").ok());
  EXPECT_TRUE(l.Enter("a").ok());
  absl::Status s = l.Enter("a");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("server.max_calls_per_peer"), std::string::npos) << s;
  EXPECT_EQ(l.in_flight("a"), 2u);
  EXPECT_TRUE(l.Enter("b").ok());  // another peer: its own budget
  s = l.Enter("c");                // but the total is reached
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("server.max_calls)"), std::string::npos) << s;
  EXPECT_EQ(l.total_in_flight(), 3);
  l.Leave("a");
  EXPECT_TRUE(l.Enter("c").ok());
  l.Leave("a");
  l.Leave("b");
  l.Leave("c");
  EXPECT_EQ(l.total_in_flight(), 0);
  EXPECT_EQ(l.in_flight("a"), 0u);
  PeerCallLimits none(0, 0);
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(none.Enter("a").ok());
}

}  // namespace
}  // namespace oscarkv::service
