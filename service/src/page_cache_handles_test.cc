// PageCache transfer handles on a fake clock: publish pins, idempotency, open leases, delete
// while published, close, expiry by Reap.
#include "gtest/gtest.h"
#include "oscarkv/service/page_cache.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::Key;
using testing::MakePage;
using testing::TinyProfile;
using Code = absl::StatusCode;

class HandlesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto arena = CreateHeapArena(1 << 20);
    ASSERT_TRUE(arena.ok());
    PagePoolOptions po;
    po.chunk_bytes = 64 << 10;
    pool_ = std::move(*PagePool::Create(std::move(*arena), po));
    CacheOptions co;
    co.index_shards = 4;
    co.default_lease_ms = 1000;
    co.default_handle_ttl_ms = 3000;
    co.max_handle_ttl_ms = 10000;
    cache_ = std::make_unique<PageCache>(pool_.get(), &clock_, co);
    v1::RegisterCodecRequest req;
    *req.mutable_profile() = TinyProfile();
    v1::RegisterCodecResponse resp;
    ASSERT_TRUE(cache_->RegisterCodec(req, &resp).ok());
    codec_ = resp.codec_id();
    // Store pages 1..3.
    v1::ReserveRequest rr;
    rr.set_codec_id(codec_);
    for (uint32_t i = 1; i <= 3; ++i) {
      auto* it = rr.add_items();
      it->set_key(Key(i));
      it->set_kind(v1::PAGE_KIND_INT2);
    }
    v1::ReserveResponse res;
    ASSERT_TRUE(cache_->Reserve(rr, &res).ok());
    for (uint32_t i = 1; i <= 3; ++i) {
      v1::WriteChunk c;
      c.set_reservation_id(res.reservation_id());
      c.set_key(Key(i));
      c.set_data(MakePage(TinyProfile(), PageKind::kInt2, i));
      uint64_t n;
      ASSERT_TRUE(cache_->WriteChunk(c, &n).ok());
    }
    v1::CommitRequest cr;
    cr.set_reservation_id(res.reservation_id());
    v1::CommitResponse cresp;
    ASSERT_TRUE(cache_->Commit(cr, &cresp).ok());
  }

  absl::Status Publish(const std::string& name, std::vector<uint32_t> ids, uint32_t ttl = 0) {
    v1::PublishHandleRequest req;
    req.set_codec_id(codec_);
    req.set_handle(name);
    for (uint32_t i : ids) req.add_keys(Key(i));
    req.set_metadata("m-" + name);
    req.set_ttl_ms(ttl);
    v1::PublishHandleResponse resp;
    return cache_->PublishHandle(req, &resp);
  }
  absl::StatusOr<v1::OpenHandleResponse> Open(const std::string& name) {
    v1::OpenHandleRequest req;
    req.set_handle(name);
    v1::OpenHandleResponse resp;
    absl::Status s = cache_->OpenHandle(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }
  v1::StatsResponse Stats() {
    v1::StatsResponse st;
    EXPECT_TRUE(cache_->Stats({}, &st).ok());
    return st;
  }

  FakeClock clock_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PageCache> cache_;
  std::string codec_;
};

TEST_F(HandlesTest, PublishPinsOpenLeasesCloseUnpins) {
  ASSERT_TRUE(Publish("h", {1, 2, 3}).ok());
  EXPECT_EQ(Stats().pinned_pages(), 3u);
  EXPECT_EQ(Stats().handles(), 1u);
  EXPECT_TRUE(Publish("h", {1, 2, 3}).ok());                            // idempotent
  EXPECT_EQ(Publish("h", {1, 2}).code(), Code::kAlreadyExists);         // other pages
  EXPECT_EQ(Publish("x", {1, 9}).code(), Code::kNotFound);              // 9 not stored
  EXPECT_EQ(Stats().pinned_pages(), 3u);                                // nothing leaked
  EXPECT_EQ(Publish("", {1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(Publish(std::string(300, 'a'), {1}).code(), Code::kInvalidArgument);

  auto o = Open("h");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->pages_size(), 3);
  EXPECT_EQ(o->pages(1).key(), Key(2));
  EXPECT_EQ(o->metadata(), "m-h");
  EXPECT_EQ(o->codec_id(), codec_);
  EXPECT_NE(o->lease_id(), 0u);
  // The lease reads the pages even after the handle is closed and the keys deleted.
  v1::CloseHandleRequest close;
  close.set_handle("h");
  v1::CloseHandleResponse close_resp;
  ASSERT_TRUE(cache_->CloseHandle(close, &close_resp).ok());
  ASSERT_TRUE(cache_->CloseHandle(close, &close_resp).ok());
  v1::DeleteRequest del;
  del.set_codec_id(codec_);
  del.add_keys(Key(2));
  v1::DeleteResponse del_resp;
  ASSERT_TRUE(cache_->Delete(del, &del_resp).ok());
  v1::ReadRequest rd;
  rd.set_lease_id(o->lease_id());
  auto plan = cache_->PrepareRead(rd);
  ASSERT_TRUE(plan.ok());
  const std::string want = MakePage(TinyProfile(), PageKind::kInt2, 2);
  ASSERT_EQ((*plan)->pages()[1].bytes, want.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*plan)->pages()[1].data), want.size()),
            want);
  plan->reset();
  v1::ReleaseRequest rel;
  rel.set_lease_id(o->lease_id());
  v1::ReleaseResponse rel_resp;
  ASSERT_TRUE(cache_->Release(rel, &rel_resp).ok());
  EXPECT_EQ(Stats().pinned_pages(), 0u);
  EXPECT_EQ(Stats().handles(), 0u);
  EXPECT_EQ(Open("h").status().code(), Code::kNotFound);
}

TEST_F(HandlesTest, ExpiresWithTheClockAndNameIsReusable) {
  ASSERT_TRUE(Publish("h", {1, 2}, 500).ok());
  clock_.Advance(400);
  EXPECT_TRUE(Open("h").ok());
  clock_.Advance(200);
  EXPECT_EQ(Open("h").status().code(), Code::kNotFound);  // expired, not yet reaped
  // An expired name may be published again with other pages.
  ASSERT_TRUE(Publish("h", {3}, 100000).ok());  // ttl capped at 10 s
  clock_.Advance(2000);                        // the opener's 1 s lease is gone too
  cache_->Reap();
  EXPECT_EQ(Stats().pinned_pages(), 1u);
  clock_.Advance(9000);
  cache_->Reap();
  EXPECT_EQ(Stats().pinned_pages(), 0u);
  EXPECT_EQ(Stats().handles(), 0u);
}

}  // namespace
}  // namespace oscarkv::service
