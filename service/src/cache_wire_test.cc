// The wire translation (cache_wire.h): what only the wire can get wrong -- key and codec id
// lengths, page kinds -- gets the codes and messages the daemon has always answered, per item
// where the call has per-item results, and the other items still run in order.
#include "cache_wire.h"

#include "gtest/gtest.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::Key;
using testing::MakePage;
using testing::TinyProfile;
using Code = absl::StatusCode;

constexpr int kInvalid = static_cast<int>(Code::kInvalidArgument);

class CacheWireTest : public ::testing::Test {
 protected:
  void SetUp() override { Init(4096); }

  void Init(uint32_t max_batch) {
    cache_.reset();
    PagePoolOptions po;
    po.chunk_bytes = 64 << 10;
    pool_ = std::move(*PagePool::Create(std::move(*CreateHeapArena(1 << 20)), po));
    CacheOptions co;
    co.index_shards = 4;
    co.max_batch = max_batch;
    co.node_id = "wire-node";
    cache_ = std::make_unique<PageCache>(pool_.get(), &clock_, co);
    pb::RegisterCodecRequest req;
    *req.mutable_profile() = TinyProfile();
    pb::RegisterCodecResponse resp;
    ASSERT_TRUE(wire::RegisterCodec(*cache_, caller_, req, &resp).ok());
    codec_ = resp.codec_id();
  }

  // Stores page i under Key(i) through the wire calls.
  void Store(uint32_t i) {
    pb::ReserveRequest rr;
    rr.set_codec_id(codec_);
    rr.add_items()->set_key(Key(i));
    rr.mutable_items(0)->set_kind(pb::PAGE_KIND_INT2);
    pb::ReserveResponse res;
    ASSERT_TRUE(wire::Reserve(*cache_, caller_, rr, &res).ok());
    ASSERT_EQ(res.results(0).status().code(), 0);
    pb::WriteChunk c;
    c.set_reservation_id(res.reservation_id());
    c.set_key(Key(i));
    c.set_data(MakePage(TinyProfile(), PageKind::kInt2, i));
    auto n = wire::WriteChunk(*cache_, caller_, c);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(*n, c.data().size());
    pb::CommitRequest cr;
    cr.set_reservation_id(res.reservation_id());
    pb::CommitResponse cresp;
    ASSERT_TRUE(wire::Commit(*cache_, caller_, cr, &cresp).ok());
    ASSERT_EQ(cresp.results_size(), 1);
    ASSERT_EQ(cresp.results(0).code(), 0) << cresp.results(0).message();
  }

  const Caller caller_{};
  FakeClock clock_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PageCache> cache_;
  std::string codec_;
};

TEST_F(CacheWireTest, HandshakeAndRegisterCodec) {
  pb::HandshakeRequest hs;
  pb::HandshakeResponse hr;
  hs.set_wire_version(7);
  EXPECT_EQ(wire::Handshake(*cache_, caller_, hs, &hr).code(), Code::kFailedPrecondition);
  hs.set_wire_version(pb::WIRE_VERSION_1);
  ASSERT_TRUE(wire::Handshake(*cache_, caller_, hs, &hr).ok());
  EXPECT_EQ(hr.wire_version(), 1u);
  EXPECT_EQ(hr.node_id(), "wire-node");
  EXPECT_EQ(hr.max_batch(), 4096u);
  EXPECT_EQ(hr.server_version(), kServerVersion);

  pb::RegisterCodecRequest req;
  *req.mutable_profile() = TinyProfile();
  pb::RegisterCodecResponse resp;
  ASSERT_TRUE(wire::RegisterCodec(*cache_, caller_, req, &resp).ok());
  EXPECT_EQ(resp.codec_id(), codec_);
  EXPECT_EQ(resp.codec_id(), std::string(reinterpret_cast<const char*>(
                                             testing::ToProfile(TinyProfile()).Id().bytes.data()),
                                         16));
  EXPECT_EQ(resp.int2_page_bytes(), 832u);
  EXPECT_EQ(resp.bf16_page_bytes(), 4160u);
  req.mutable_profile()->set_head_dim(100);  // the cache's validation
  EXPECT_EQ(wire::RegisterCodec(*cache_, caller_, req, &resp).code(), Code::kInvalidArgument);
  req.mutable_profile()->set_head_dim(64);
  req.mutable_profile()->set_rotation_digest("short");  // the wire conversion's
  EXPECT_EQ(wire::RegisterCodec(*cache_, caller_, req, &resp).code(), Code::kInvalidArgument);
  req.mutable_profile()->clear_rotation_digest();
  req.mutable_profile()->set_scale_dtype(9);
  EXPECT_EQ(wire::RegisterCodec(*cache_, caller_, req, &resp).code(), Code::kInvalidArgument);
  EXPECT_EQ(cache_->codecs(), 1u);
}

TEST_F(CacheWireTest, MalformedRequestsGetClearCodes) {
  pb::LookupRequest req;
  pb::LookupResponse resp;
  req.set_codec_id("short");
  absl::Status s = wire::Lookup(*cache_, caller_, req, &resp);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "codec_id must be 16 bytes, got 5");
  req.set_codec_id(std::string(16, 'x'));
  s = wire::Lookup(*cache_, caller_, req, &resp);
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_NE(s.message().find("register it with RegisterCodec first"), std::string::npos);
  req.set_codec_id(codec_);
  req.add_keys(Key(1));
  req.add_keys("not-16-bytes");
  s = wire::Lookup(*cache_, caller_, req, &resp);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "keys[1] has 12 bytes; keys are 16 bytes");

  Init(/*max_batch=*/8);
  pb::LookupRequest big;
  big.set_codec_id(codec_);
  for (int i = 0; i < 9; ++i) big.add_keys(Key(i));
  EXPECT_EQ(wire::Lookup(*cache_, caller_, big, &resp).code(), Code::kInvalidArgument);

  pb::WriteChunk chunk;
  chunk.set_key("bad");
  EXPECT_EQ(wire::WriteChunk(*cache_, caller_, chunk).status().code(), Code::kInvalidArgument);
  pb::ReadRequest rd;
  rd.add_keys("bad");
  EXPECT_EQ(wire::PrepareRead(*cache_, caller_, rd).status().code(), Code::kInvalidArgument);
  pb::ClearRequest clr;
  pb::ClearResponse cresp;
  clr.set_codec_id("short");
  EXPECT_EQ(wire::Clear(*cache_, caller_, clr, &cresp).code(), Code::kInvalidArgument);
  clr.set_codec_id(std::string(16, 'x'));  // unknown: nothing to clear
  ASSERT_TRUE(wire::Clear(*cache_, caller_, clr, &cresp).ok());
  EXPECT_EQ(cresp.pages_removed(), 0u);
}

TEST_F(CacheWireTest, PerItemWireErrorsKeepTheirPlaces) {
  Store(5);
  pb::ReserveRequest rr;
  rr.set_codec_id(codec_);
  rr.add_items()->set_key("bad");
  rr.mutable_items(0)->set_kind(pb::PAGE_KIND_INT2);
  rr.add_items()->set_key(Key(1));
  rr.mutable_items(1)->set_kind(pb::PAGE_KIND_UNSPECIFIED);
  rr.add_items()->set_key(Key(2));
  rr.mutable_items(2)->set_kind(pb::PAGE_KIND_INT2);
  rr.add_items()->set_key(Key(3));
  rr.mutable_items(3)->set_kind(static_cast<pb::PageKind>(257));  // not INT2 cut to a byte
  rr.add_items()->set_key(Key(5));
  rr.mutable_items(4)->set_kind(pb::PAGE_KIND_INT2);
  pb::ReserveResponse rresp;
  ASSERT_TRUE(wire::Reserve(*cache_, caller_, rr, &rresp).ok());
  ASSERT_EQ(rresp.results_size(), 5);
  EXPECT_EQ(rresp.results(0).status().code(), kInvalid);
  EXPECT_EQ(rresp.results(0).status().message(), "key has 3 bytes; keys are 16 bytes");
  EXPECT_EQ(rresp.results(1).status().code(), kInvalid);
  EXPECT_EQ(rresp.results(1).status().message(), "page kind 0 is not INT2 (1) or BF16 (2)");
  EXPECT_EQ(rresp.results(2).status().code(), 0);
  EXPECT_EQ(rresp.results(2).slot().key(), Key(2));
  EXPECT_EQ(rresp.results(2).slot().bytes(), 832u);
  EXPECT_EQ(rresp.results(2).slot().kind(), pb::PAGE_KIND_INT2);
  EXPECT_EQ(rresp.results(3).status().code(), kInvalid);
  EXPECT_EQ(rresp.results(4).status().code(), static_cast<int>(Code::kAlreadyExists));
  EXPECT_FALSE(rresp.results(4).has_slot());
  ASSERT_NE(rresp.reservation_id(), 0u);

  pb::WriteChunk c;
  c.set_reservation_id(rresp.reservation_id());
  c.set_key(Key(2));
  c.set_data(MakePage(TinyProfile(), PageKind::kInt2, 2));
  ASSERT_TRUE(wire::WriteChunk(*cache_, caller_, c).ok());
  pb::CommitRequest cr;
  cr.set_reservation_id(rresp.reservation_id());
  cr.add_keys("short");
  cr.add_keys(Key(2));
  cr.add_keys(Key(7));
  pb::CommitResponse cresp;
  ASSERT_TRUE(wire::Commit(*cache_, caller_, cr, &cresp).ok());
  ASSERT_EQ(cresp.results_size(), 3);
  EXPECT_EQ(cresp.results(0).code(), kInvalid);
  EXPECT_EQ(cresp.results(1).code(), 0) << cresp.results(1).message();
  EXPECT_EQ(cresp.results(2).code(), static_cast<int>(Code::kNotFound));
  // Only bad keys: the reservation is still looked up (unknown -> the call fails).
  pb::CommitRequest only_bad;
  only_bad.set_reservation_id(424242);
  only_bad.add_keys("x");
  EXPECT_EQ(wire::Commit(*cache_, caller_, only_bad, &cresp).code(), Code::kNotFound);

  pb::LookupRequest lr;
  lr.set_codec_id(codec_);
  lr.add_keys(Key(2));
  lr.add_keys(Key(5));
  lr.set_pin(true);
  pb::LookupResponse lresp;
  ASSERT_TRUE(wire::Lookup(*cache_, caller_, lr, &lresp).ok());
  EXPECT_EQ(lresp.matched(), 2u);
  ASSERT_EQ(lresp.pages_size(), 2);
  EXPECT_EQ(lresp.pages(1).key(), Key(5));
  EXPECT_EQ(lresp.pages(1).token_count(), 16u);
  EXPECT_EQ(lresp.pages(1).kind(), pb::PAGE_KIND_INT2);
  EXPECT_NE(lresp.lease_id(), 0u);
  pb::ReleaseRequest rel;
  rel.set_lease_id(lresp.lease_id());
  pb::ReleaseResponse rel_resp;
  ASSERT_TRUE(wire::Release(*cache_, caller_, rel, &rel_resp).ok());

  pb::DeleteRequest del;
  del.set_codec_id(codec_);
  del.add_keys(Key(5));
  del.add_keys("bad");
  del.add_keys(Key(9));
  pb::DeleteResponse dresp;
  ASSERT_TRUE(wire::Delete(*cache_, caller_, del, &dresp).ok());
  ASSERT_EQ(dresp.results_size(), 3);
  EXPECT_EQ(dresp.results(0).code(), 0);
  EXPECT_EQ(dresp.results(1).code(), kInvalid);
  EXPECT_EQ(dresp.results(2).code(), static_cast<int>(Code::kNotFound));

  pb::StatsResponse st;
  ASSERT_TRUE(wire::Stats(*cache_, caller_, {}, &st).ok());
  EXPECT_EQ(st.pages(), 1u);  // key 2
  EXPECT_EQ(st.node_id(), "wire-node");
  EXPECT_EQ(st.codecs(), 1u);
}

TEST_F(CacheWireTest, HandlesRoundTrip) {
  Store(1);
  pb::PublishHandleRequest pub;
  pub.set_codec_id(codec_);
  pub.set_handle("h");
  pub.add_keys(Key(1));
  pub.add_keys("bad");
  pb::PublishHandleResponse presp;
  absl::Status s = wire::PublishHandle(*cache_, caller_, pub, &presp);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "keys[1] has 3 bytes; keys are 16 bytes");
  pub.mutable_keys()->RemoveLast();
  pub.set_metadata("meta");
  ASSERT_TRUE(wire::PublishHandle(*cache_, caller_, pub, &presp).ok());
  EXPECT_GT(presp.deadline_unix_ms(), 0u);
  pb::OpenHandleRequest open;
  open.set_handle("h");
  pb::OpenHandleResponse oresp;
  ASSERT_TRUE(wire::OpenHandle(*cache_, caller_, open, &oresp).ok());
  EXPECT_EQ(oresp.codec_id(), codec_);
  EXPECT_EQ(oresp.metadata(), "meta");
  ASSERT_EQ(oresp.pages_size(), 1);
  EXPECT_EQ(oresp.pages(0).key(), Key(1));
  EXPECT_NE(oresp.lease_id(), 0u);
  pb::RenewLeaseRequest renew;
  renew.set_lease_id(oresp.lease_id());
  pb::RenewLeaseResponse renew_resp;
  ASSERT_TRUE(wire::RenewLease(*cache_, caller_, renew, &renew_resp).ok());
  EXPECT_GT(renew_resp.lease_deadline_unix_ms(), 0u);
  pb::CloseHandleRequest close;
  close.set_handle("h");
  pb::CloseHandleResponse close_resp;
  ASSERT_TRUE(wire::CloseHandle(*cache_, caller_, close, &close_resp).ok());
  EXPECT_EQ(wire::OpenHandle(*cache_, caller_, open, &oresp).code(), Code::kNotFound);
}

}  // namespace
}  // namespace oscarkv::service
