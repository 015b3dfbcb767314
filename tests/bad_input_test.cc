// Bad input against a real oscarkvd, straight through the gRPC stubs (no client-side checks in
// the way): each gets a clear status and the daemon keeps serving. Also raw garbage bytes on the
// gRPC port.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <random>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

namespace pb = ::oscarkv::v1;
using ::testing::HasSubstr;

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = StartDaemon({"--max-batch", "16"});
    ASSERT_NE(daemon_, nullptr);
    stub_ = pb::KvCache::NewStub(
        grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials()));
    pb::RegisterCodecRequest req;
    const CodecProfile p = *BuiltinProfile("refmodel");
    auto* pp = req.mutable_profile();
    pp->set_model_id(p.model_id);
    pp->set_model_revision(p.model_revision);
    pp->set_num_layers(p.num_layers);
    pp->set_num_kv_heads(p.num_kv_heads);
    pp->set_tp_size(1);
    pp->set_head_dim(p.head_dim);
    pp->set_page_tokens(p.page_tokens);
    pp->set_group_size(p.group_size);
    pp->set_scale_dtype(1);
    pp->set_sink_tokens(p.sink_tokens);
    pp->set_recent_tokens(p.recent_tokens);
    pb::RegisterCodecResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->RegisterCodec(&ctx, req, &resp).ok());
    codec_id_ = resp.codec_id();
    profile_ = p;
  }

  // The daemon still answers a normal call.
  void ExpectServing() {
    pb::StatsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = stub_->Stats(&ctx, pb::StatsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(daemon_->Running());
  }

  static std::string Key(uint64_t seed) {
    std::string k(16, '\0');
    for (int i = 0; i < 16; ++i) k[i] = static_cast<char>(SplitMix(seed + i));
    return k;
  }

  // Reserves one INT2 slot for `key`; returns the reservation id (0 on failure).
  uint64_t ReserveOne(const std::string& key) {
    pb::ReserveRequest req;
    req.set_codec_id(codec_id_);
    auto* item = req.add_items();
    item->set_key(key);
    item->set_kind(pb::PAGE_KIND_INT2);
    pb::ReserveResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Reserve(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok() || resp.results_size() != 1 || resp.results(0).status().code() != 0) return 0;
    return resp.reservation_id();
  }

  grpc::Status Write(uint64_t reservation, const std::string& key, uint64_t offset,
                     const std::string& data) {
    pb::WriteResponse resp;
    grpc::ClientContext ctx;
    auto w = stub_->WritePages(&ctx, &resp);
    pb::WriteChunk chunk;
    chunk.set_reservation_id(reservation);
    chunk.set_key(key);
    chunk.set_offset(offset);
    chunk.set_data(data);
    w->Write(chunk);
    w->WritesDone();
    return w->Finish();
  }

  pb::ItemStatus CommitOne(uint64_t reservation, const std::string& key) {
    pb::CommitRequest req;
    req.set_reservation_id(reservation);
    req.add_keys(key);
    pb::CommitResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Commit(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.results_size() == 1 ? resp.results(0) : pb::ItemStatus();
  }

  std::unique_ptr<testing::LocalDaemon> daemon_;
  std::unique_ptr<pb::KvCache::Stub> stub_;
  std::string codec_id_;
  CodecProfile profile_;
};

TEST_F(BadInputTest, WrongWireVersion) {
  pb::HandshakeRequest req;
  req.set_wire_version(99);
  pb::HandshakeResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->Handshake(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  ExpectServing();
}

TEST_F(BadInputTest, UnknownCodec) {
  pb::LookupRequest req;
  req.set_codec_id(Key(1));  // 16 bytes, never registered
  req.add_keys(Key(2));
  pb::LookupResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->Lookup(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_FALSE(s.error_message().empty());

  pb::ReserveRequest rr;
  rr.set_codec_id(Key(1));
  rr.add_items()->set_key(Key(3));
  pb::ReserveResponse rresp;
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->Reserve(&ctx2, rr, &rresp).error_code(), grpc::StatusCode::NOT_FOUND);

  pb::RegisterCodecRequest bad;
  bad.mutable_profile()->set_model_id("x");
  bad.mutable_profile()->set_head_dim(100);  // unsupported shape
  pb::RegisterCodecResponse bresp;
  grpc::ClientContext ctx3;
  EXPECT_EQ(stub_->RegisterCodec(&ctx3, bad, &bresp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ExpectServing();
}

TEST_F(BadInputTest, OversizeBatch) {
  pb::LookupRequest req;
  req.set_codec_id(codec_id_);
  for (int i = 0; i < 17; ++i) req.add_keys(Key(100 + i));  // --max-batch 16
  pb::LookupResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->Lookup(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("16"));

  pb::ReserveRequest rr;
  rr.set_codec_id(codec_id_);
  for (int i = 0; i < 17; ++i) {
    auto* it = rr.add_items();
    it->set_key(Key(200 + i));
    it->set_kind(pb::PAGE_KIND_INT2);
  }
  pb::ReserveResponse rresp;
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->Reserve(&ctx2, rr, &rresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectServing();
}

TEST_F(BadInputTest, MalformedKeys) {
  pb::LookupRequest req;
  req.set_codec_id(codec_id_);
  req.add_keys(Key(1).substr(0, 15));
  pb::LookupResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->Lookup(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();

  pb::LookupRequest short_codec;
  short_codec.set_codec_id("abc");
  short_codec.add_keys(Key(1));
  grpc::ClientContext ctx2;
  s = stub_->Lookup(&ctx2, short_codec, &resp);
  EXPECT_THAT(s.error_code(), ::testing::AnyOf(grpc::StatusCode::INVALID_ARGUMENT,
                                               grpc::StatusCode::NOT_FOUND));

  // A 17-byte key in a reserve: rejected as a whole or as that item.
  pb::ReserveRequest rr;
  rr.set_codec_id(codec_id_);
  auto* it = rr.add_items();
  it->set_key(Key(5) + "x");
  it->set_kind(pb::PAGE_KIND_INT2);
  auto* it2 = rr.add_items();
  it2->set_key(Key(6));
  it2->set_kind(pb::PAGE_KIND_UNSPECIFIED);  // no such kind
  pb::ReserveResponse rresp;
  grpc::ClientContext ctx3;
  s = stub_->Reserve(&ctx3, rr, &rresp);
  if (s.ok()) {
    ASSERT_EQ(rresp.results_size(), 2);
    EXPECT_EQ(rresp.results(0).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(rresp.results(1).status().code(), grpc::StatusCode::INVALID_ARGUMENT);
  } else {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  ExpectServing();
}

TEST_F(BadInputTest, WrongPageSizeAndBadPages) {
  const auto page = MakePage(profile_, PageKind::kInt2, 1);
  // Bytes past the end of the slot.
  const std::string k1 = Key(10);
  const uint64_t r1 = ReserveOne(k1);
  ASSERT_NE(r1, 0u);
  grpc::Status s = Write(r1, k1, page.size() - 10, std::string(100, 'x'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  s = Write(r1, k1, page.size() + 1, "x");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();

  // A BF16 page written into an INT2 slot (only its first part fits): bad header for the slot.
  const auto bf16 = MakePage(profile_, PageKind::kBf16, 2);
  const std::string k2 = Key(20);
  const uint64_t r2 = ReserveOne(k2);
  ASSERT_NE(r2, 0u);
  ASSERT_TRUE(Write(r2, k2, 0, std::string(reinterpret_cast<const char*>(bf16.data()), page.size())).ok());
  pb::ItemStatus c2 = CommitOne(r2, k2);
  EXPECT_EQ(c2.code(), grpc::StatusCode::INVALID_ARGUMENT) << c2.message();
  EXPECT_FALSE(c2.message().empty());

  // A flipped payload byte: checksum mismatch.
  std::string corrupt(reinterpret_cast<const char*>(page.data()), page.size());
  corrupt[1000] ^= 1;
  const std::string k3 = Key(30);
  const uint64_t r3 = ReserveOne(k3);
  ASSERT_NE(r3, 0u);
  ASSERT_TRUE(Write(r3, k3, 0, corrupt).ok());
  pb::ItemStatus c3 = CommitOne(r3, k3);
  EXPECT_EQ(c3.code(), grpc::StatusCode::DATA_LOSS) << c3.message();

  // Garbage instead of a page.
  const std::string k4 = Key(40);
  const uint64_t r4 = ReserveOne(k4);
  ASSERT_NE(r4, 0u);
  ASSERT_TRUE(Write(r4, k4, 0, std::string(page.size(), '\x5a')).ok());
  EXPECT_EQ(CommitOne(r4, k4).code(), grpc::StatusCode::INVALID_ARGUMENT);

  // None of them became visible; a good page after all that is fine.
  pb::LookupRequest look;
  look.set_codec_id(codec_id_);
  for (const auto& k : {k1, k2, k3, k4}) look.add_keys(k);
  pb::LookupResponse lresp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Lookup(&ctx, look, &lresp).ok());
  EXPECT_EQ(lresp.matched(), 0u);
  const std::string k5 = Key(50);
  const uint64_t r5 = ReserveOne(k5);
  ASSERT_NE(r5, 0u);
  ASSERT_TRUE(Write(r5, k5, 0, std::string(reinterpret_cast<const char*>(page.data()), page.size())).ok());
  EXPECT_EQ(CommitOne(r5, k5).code(), 0);
  ExpectServing();
}

TEST_F(BadInputTest, GarbageBytesOnThePort) {
  const std::string addr = daemon_->address();
  const auto colon = addr.rfind(':');
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(addr.substr(colon + 1), &port));
  std::mt19937 rng(42);
  for (int round = 0; round < 8; ++round) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    std::string junk(round == 0 ? 24 : 16384 * round, '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    if (round == 1) junk.replace(0, 24, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");  // valid preface, junk frames
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    if (round % 2 == 0) ::close(fd);  // odd rounds: keep the garbage connection open meanwhile
    ExpectServing();
    if (round % 2 == 1) ::close(fd);
  }
  ExpectServing();
}

}  // namespace
}  // namespace oscarkv::testing
