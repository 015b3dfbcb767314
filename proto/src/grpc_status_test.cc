#include "oscarkv/proto/grpc_status.h"

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

TEST(GrpcStatusTest, CodesMapOneToOneBothWays) {
  for (int c = 1; c <= 16; ++c) {
    const absl::Status a(static_cast<absl::StatusCode>(c), "msg");
    const grpc::Status g = ToGrpc(a);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), "msg");
    const absl::Status back = FromGrpc(g);
    EXPECT_EQ(back, a);
    EXPECT_EQ(FromGrpc(g, "Lookup").message(), "Lookup: msg");
    EXPECT_EQ(FromGrpc(g, "Lookup").code(), a.code());
  }
  EXPECT_TRUE(FromGrpc(grpc::Status::OK, "Lookup").ok());
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace oscarkv
