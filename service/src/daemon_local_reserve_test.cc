// Reserve frames on the daemon's local socket (local_control.h, Method kReserve) against the real
// oscarkvd binary: the same answers as the gRPC Reserve (per-item errors, unknown codec, keys in
// progress, one reservation table: a slot reserved over the socket is committed and aborted over
// gRPC), the frame's own limit, and bad input (before the handshake, unparsable) closing only
// that connection.
#include <string>

#include "daemon_test_util.h"
#include "local_frame_test_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::Answer;
using testing::GrpcHandshake;
using testing::Key;
using testing::LocalConn;
using testing::Start;
using testing::StopAndWait;
using testing::TinyProfile;

namespace lc = ::oscarkv::v1::local;

v1::ReserveRequest Reserve(const std::string& codec, std::initializer_list<std::string> keys) {
  v1::ReserveRequest r;
  r.set_codec_id(codec);
  for (const std::string& k : keys) {
    auto* item = r.add_items();
    item->set_key(k);
    item->set_kind(v1::PAGE_KIND_INT2);
  }
  return r;
}

TEST(DaemonLocalReserve, AnswersAsGrpcAndSharesTheReservationTable) {
  auto started = Start({});
  ASSERT_TRUE(started.ok()) << started.status();
  oscarkv::testing::LocalDaemon& d = **started;
  ASSERT_FALSE(d.local_socket().empty()) << d.ready_line();
  auto stub =
      v1::KvCache::NewStub(grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
  v1::HandshakeResponse ghs;
  ASSERT_TRUE(GrpcHandshake(*stub, &ghs).ok());
  std::string codec;
  uint64_t page_bytes = 0;
  {
    grpc::ClientContext ctx;
    v1::RegisterCodecRequest req;
    *req.mutable_profile() = TinyProfile("local-reserve");
    v1::RegisterCodecResponse resp;
    ASSERT_TRUE(stub->RegisterCodec(&ctx, req, &resp).ok());
    codec = resp.codec_id();
    page_bytes = resp.int2_page_bytes();
  }

  // Before the handshake: refused, then closed.
  {
    LocalConn c(d.local_socket());
    ASSERT_TRUE(c.ok());
    Answer a = c.Call(lc::Method::kReserve, 2, Reserve(codec, {Key(1)}).SerializeAsString());
    ASSERT_FALSE(a.closed);
    EXPECT_EQ(a.h.code, static_cast<uint32_t>(grpc::StatusCode::FAILED_PRECONDITION));
    EXPECT_NE(a.message.find("Handshake first"), std::string::npos) << a.message;
    EXPECT_TRUE(c.Recv().closed);
  }
  // An unparsable body: INVALID_ARGUMENT, then closed.
  {
    LocalConn c(d.local_socket());
    ASSERT_TRUE(c.Handshake("reserve-frames"));
    Answer a = c.Call(lc::Method::kReserve, 3, "\xff\xff\xff");
    ASSERT_FALSE(a.closed);
    EXPECT_NE(a.message.find("unparsable ReserveRequest"), std::string::npos) << a.message;
    EXPECT_EQ(a.h.code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_EQ(a.h.id, 0u) << "a malformed frame's answer has id 0";
    EXPECT_TRUE(c.Recv().closed);
  }

  LocalConn c(d.local_socket());
  ASSERT_TRUE(c.Handshake("reserve-frames"));
  // Per-item errors and slots: the same codes as gRPC's answer to the same request shape.
  v1::ReserveRequest mixed = Reserve(codec, {Key(1), "short", Key(2)});
  mixed.mutable_items(2)->set_kind(static_cast<v1::PageKind>(9));
  v1::ReserveRequest mixed_grpc = Reserve(codec, {Key(11), "short", Key(12)});
  mixed_grpc.mutable_items(2)->set_kind(static_cast<v1::PageKind>(9));
  Answer a = c.Call(lc::Method::kReserve, 10, mixed.SerializeAsString());
  ASSERT_FALSE(a.closed);
  ASSERT_EQ(a.h.code, 0u) << a.message;
  EXPECT_EQ(a.h.id, 10u);
  EXPECT_EQ(a.h.method, static_cast<uint16_t>(lc::Method::kReserve));
  v1::ReserveResponse local;
  ASSERT_TRUE(local.ParseFromString(a.body));
  v1::ReserveResponse remote;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Reserve(&ctx, mixed_grpc, &remote).ok());
  }
  ASSERT_EQ(local.results_size(), 3);
  ASSERT_EQ(remote.results_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(local.results(i).status().code(), remote.results(i).status().code()) << i;
  }
  EXPECT_EQ(local.results(0).status().code(), 0);
  EXPECT_EQ(local.results(0).slot().bytes(), page_bytes);
  EXPECT_EQ(local.results(1).status().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(local.results(2).status().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(local.reservation_id(), 0u);
  EXPECT_NE(local.reservation_id(), remote.reservation_id());

  // One reservation table: the key reserved over the socket is in progress for gRPC, and the
  // socket's reservation aborts over gRPC; then the key is free again for both.
  {
    grpc::ClientContext ctx;
    v1::ReserveResponse again;
    ASSERT_TRUE(stub->Reserve(&ctx, Reserve(codec, {Key(1)}), &again).ok());
    ASSERT_EQ(again.results_size(), 1);
    EXPECT_EQ(again.results(0).status().code(), static_cast<int>(grpc::StatusCode::ABORTED));
  }
  {
    Answer b = c.Call(lc::Method::kReserve, 11, Reserve(codec, {Key(11)}).SerializeAsString());
    ASSERT_EQ(b.h.code, 0u) << b.message;
    v1::ReserveResponse r;
    ASSERT_TRUE(r.ParseFromString(b.body));
    EXPECT_EQ(r.results(0).status().code(), static_cast<int>(grpc::StatusCode::ABORTED));
  }
  for (uint64_t id : {local.reservation_id(), remote.reservation_id()}) {
    grpc::ClientContext ctx;
    v1::AbortRequest req;
    req.set_reservation_id(id);
    v1::AbortResponse resp;
    EXPECT_TRUE(stub->Abort(&ctx, req, &resp).ok());
  }
  {
    Answer b = c.Call(lc::Method::kReserve, 12, Reserve(codec, {Key(1)}).SerializeAsString());
    ASSERT_EQ(b.h.code, 0u) << b.message;
    v1::ReserveResponse r;
    ASSERT_TRUE(r.ParseFromString(b.body));
    EXPECT_EQ(r.results(0).status().code(), 0);
    grpc::ClientContext ctx;
    v1::AbortRequest req;
    req.set_reservation_id(r.reservation_id());
    v1::AbortResponse resp;
    EXPECT_TRUE(stub->Abort(&ctx, req, &resp).ok());
  }

  // Unknown codec: the gRPC call's status.
  {
    v1::ReserveRequest req = Reserve(std::string(16, 'x'), {Key(3)});
    grpc::ClientContext ctx;
    v1::ReserveResponse r;
    const grpc::Status gs = stub->Reserve(&ctx, req, &r);
    EXPECT_FALSE(gs.ok());
    Answer b = c.Call(lc::Method::kReserve, 13, req.SerializeAsString());
    ASSERT_FALSE(b.closed);
    EXPECT_EQ(b.h.code, static_cast<uint32_t>(gs.error_code())) << b.message;
    EXPECT_TRUE(b.body.empty());
  }
  // One item over the frame's limit: refused before anything is reserved; the connection
  // stays usable.
  {
    v1::ReserveRequest big;
    big.set_codec_id(codec);
    for (uint32_t i = 0; i <= lc::kMaxReserveItems; ++i) {
      auto* item = big.add_items();
      item->set_key(Key(1000 + i));
      item->set_kind(v1::PAGE_KIND_INT2);
    }
    Answer b = c.Call(lc::Method::kReserve, 14, big.SerializeAsString());
    ASSERT_FALSE(b.closed);
    EXPECT_EQ(b.h.code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT));
    EXPECT_NE(b.message.find("at most"), std::string::npos) << b.message;
    Answer after = c.Call(lc::Method::kReserve, 15, Reserve(codec, {Key(1000)}).SerializeAsString());
    ASSERT_EQ(after.h.code, 0u) << after.message;
    v1::ReserveResponse r;
    ASSERT_TRUE(r.ParseFromString(after.body));
    EXPECT_EQ(r.results(0).status().code(), 0) << "the refused frame reserved key 1000";
  }
  EXPECT_EQ(StopAndWait(d), 0);
}

}  // namespace
}  // namespace oscarkv::service
