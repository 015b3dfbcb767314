// LookupMessagePool: recycled Lookup messages come back empty (no keys, flags or pages of the
// previous call leak into the next), the pool reuses them, and it keeps at most kMaxFree.
#include <vector>

#include "grpc_service.h"
#include "gtest/gtest.h"

namespace oscarkv::service {
namespace {

using Holder = grpc::MessageHolder<pb::LookupRequest, pb::LookupResponse>;

TEST(LookupMessagePoolTest, RecycledMessagesComeBackEmpty) {
  LookupMessagePool pool;
  Holder* h = pool.AllocateMessages();
  const pb::LookupRequest* req = h->request();
  for (int i = 0; i < 32; ++i) h->request()->add_keys(std::string(16, char('a' + i % 26)));
  h->request()->set_codec_id(std::string(16, 'c'));
  h->request()->set_pin(true);
  h->request()->set_lease_ms(5000);
  h->response()->set_matched(32);
  h->response()->set_lease_id(7);
  h->response()->add_pages()->set_offset(4096);
  h->Release();
  EXPECT_EQ(pool.idle(), 1u);

  Holder* again = pool.AllocateMessages();
  EXPECT_EQ(again->request(), req);  // the same messages, reused
  EXPECT_EQ(pool.idle(), 0u);
  EXPECT_EQ(again->request()->keys_size(), 0);
  EXPECT_TRUE(again->request()->codec_id().empty());
  EXPECT_FALSE(again->request()->pin());
  EXPECT_EQ(again->request()->lease_ms(), 0u);
  EXPECT_EQ(again->response()->matched(), 0u);
  EXPECT_EQ(again->response()->lease_id(), 0u);
  EXPECT_EQ(again->response()->pages_size(), 0);
  // A shorter request parsed into the reused message carries only its own keys.
  pb::LookupRequest wire;
  wire.add_keys(std::string(16, 'z'));
  ASSERT_TRUE(again->request()->ParseFromString(wire.SerializeAsString()));
  ASSERT_EQ(again->request()->keys_size(), 1);
  EXPECT_EQ(again->request()->keys(0), std::string(16, 'z'));
  again->Release();
}

TEST(LookupMessagePoolTest, KeepsAtMostMaxFreeIdle) {
  LookupMessagePool pool;
  std::vector<Holder*> live;
  for (size_t i = 0; i < LookupMessagePool::kMaxFree + 10; ++i) {
    live.push_back(pool.AllocateMessages());
  }
  for (Holder* h : live) h->Release();
  EXPECT_EQ(pool.idle(), LookupMessagePool::kMaxFree);
}

}  // namespace
}  // namespace oscarkv::service
