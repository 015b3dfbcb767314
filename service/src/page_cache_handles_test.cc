// PageCache transfer handles on a fake clock: publish pins, idempotency, open leases, delete
// while published, close, expiry by Reap.
#include "gtest/gtest.h"
#include "oscarkv/service/page_cache.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::BKey;
using testing::Bytes;
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
    auto reg = cache_->RegisterCodec(caller_, testing::ToProfile(TinyProfile()));
    ASSERT_TRUE(reg.ok());
    codec_ = reg->id;
    // Store pages 1..3.
    ReserveArgs rr;
    rr.codec = codec_;
    for (uint32_t i = 1; i <= 3; ++i) rr.items.push_back({BKey(i), PageKind::kInt2});
    auto res = cache_->Reserve(caller_, rr);
    ASSERT_TRUE(res.ok());
    for (uint32_t i = 1; i <= 3; ++i) {
      const std::string page = MakePage(TinyProfile(), PageKind::kInt2, i);
      ASSERT_TRUE(cache_->WriteChunk(caller_, {res->reservation_id, BKey(i), 0, Bytes(page)}).ok());
    }
    CommitArgs cr;
    cr.reservation_id = res->reservation_id;
    cr.all_items = true;
    ASSERT_TRUE(cache_->Commit(caller_, cr).ok());
  }

  absl::Status Publish(const std::string& name, std::vector<uint32_t> ids, uint32_t ttl = 0) {
    PublishHandleArgs args;
    args.codec = codec_;
    args.name = name;
    for (uint32_t i : ids) args.keys.push_back(BKey(i));
    args.metadata = "m-" + name;
    args.ttl_ms = ttl;
    return cache_->PublishHandle(caller_, args).status();
  }
  absl::StatusOr<OpenedHandle> Open(const std::string& name) {
    return cache_->OpenHandle(caller_, {name, 0});
  }
  CacheStats Stats() {
    auto st = cache_->Stats(caller_);
    EXPECT_TRUE(st.ok());
    return st.ok() ? *st : CacheStats{};
  }

  const Caller caller_{};
  FakeClock clock_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PageCache> cache_;
  CodecId codec_;
};

TEST_F(HandlesTest, PublishPinsOpenLeasesCloseUnpins) {
  ASSERT_TRUE(Publish("h", {1, 2, 3}).ok());
  EXPECT_EQ(Stats().pinned_pages, 3u);
  EXPECT_EQ(Stats().handles, 1u);
  EXPECT_TRUE(Publish("h", {1, 2, 3}).ok());                            // idempotent
  EXPECT_EQ(Publish("h", {1, 2}).code(), Code::kAlreadyExists);         // other pages
  EXPECT_EQ(Publish("x", {1, 9}).code(), Code::kNotFound);              // 9 not stored
  EXPECT_EQ(Stats().pinned_pages, 3u);                                // nothing leaked
  EXPECT_EQ(Publish("", {1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(Publish(std::string(300, 'a'), {1}).code(), Code::kInvalidArgument);

  auto o = Open("h");
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->pages.size(), 3u);
  EXPECT_EQ(o->pages[1].key, BKey(2));
  EXPECT_EQ(o->pages[1].token_count, 16u);
  EXPECT_EQ(o->metadata, "m-h");
  EXPECT_EQ(o->codec, codec_);
  EXPECT_NE(o->lease_id, 0u);
  // The lease reads the pages even after the handle is closed and the keys deleted.
  ASSERT_TRUE(cache_->CloseHandle(caller_, "h").ok());
  ASSERT_TRUE(cache_->CloseHandle(caller_, "h").ok());
  ASSERT_TRUE(cache_->Delete(caller_, {codec_, {BKey(2)}}).ok());
  auto plan = cache_->PrepareRead(caller_, {o->lease_id, {}});
  ASSERT_TRUE(plan.ok());
  const std::string want = MakePage(TinyProfile(), PageKind::kInt2, 2);
  ASSERT_EQ((*plan)->pages()[1].bytes, want.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*plan)->pages()[1].data), want.size()),
            want);
  plan->reset();
  ASSERT_TRUE(cache_->Release(caller_, o->lease_id).ok());
  EXPECT_EQ(Stats().pinned_pages, 0u);
  EXPECT_EQ(Stats().handles, 0u);
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
  EXPECT_EQ(Stats().pinned_pages, 1u);
  clock_.Advance(9000);
  cache_->Reap();
  EXPECT_EQ(Stats().pinned_pages, 0u);
  EXPECT_EQ(Stats().handles, 0u);
}

}  // namespace
}  // namespace oscarkv::service
