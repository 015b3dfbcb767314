// What one gRPC client may hold open, against a real daemon: calls in flight per peer and in
// total (server.max_calls_per_peer, server.max_calls). Open WritePages streams hold their calls;
// the next call from that peer is RESOURCE_EXHAUSTED naming the limit, until one stream ends.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

namespace pb = ::oscarkv::v1;

std::string WriteConfig(const std::string& yaml) {
  static int n = 0;
  const std::string path = ::testing::TempDir() + "/server_limits_" + std::to_string(::getpid()) +
                           "_" + std::to_string(++n) + ".yaml";
  std::ofstream(path) << yaml;
  return path;
}

grpc::Status Handshake(pb::KvCache::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::HandshakeRequest req;
  req.set_wire_version(pb::WIRE_VERSION_1);
  pb::HandshakeResponse resp;
  return stub.Handshake(&ctx, req, &resp);
}

// A WritePages stream held open (nothing written) until Close().
struct OpenStream {
  explicit OpenStream(pb::KvCache::Stub& stub) { writer = stub.WritePages(&ctx, &resp); }
  grpc::Status Close() {
    writer->WritesDone();
    return writer->Finish();
  }
  grpc::ClientContext ctx;
  pb::WriteResponse resp;
  std::unique_ptr<grpc::ClientWriter<pb::WriteChunk>> writer;
};

// Calls until one is refused, for up to `ms` (the streams reach the daemon asynchronously).
grpc::Status UntilRefused(pb::KvCache::Stub& stub, int ms = 10000) {
  grpc::Status s;
  for (int waited = 0; waited < ms; waited += 50) {
    s = Handshake(stub);
    if (!s.ok()) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

// Opens `n` streams with `open` and probes with `probe` until a call is refused. A stream and a
// probe race to the daemon (a sync stream's handler may start after a probe that was sent later),
// so a probe may take a stream's place and the stream is the call refused; then every stream is
// closed and the round is tried again (at most 5 rounds). Returns the refusal the probe got,
// with the streams of the round that got it still open in `held`.
grpc::Status HoldAndProbe(int n, const std::function<std::unique_ptr<OpenStream>(int)>& open,
                          pb::KvCache::Stub& probe,
                          std::vector<std::unique_ptr<OpenStream>>* held) {
  grpc::Status refused;
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < n; ++i) held->push_back(open(i));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    refused = UntilRefused(probe, 3000);
    if (!refused.ok()) return refused;
    for (auto& h : *held) (void)h->Close();  // one of them was refused in the probe's place
    held->clear();
  }
  return refused;
}

grpc::Status UntilServed(pb::KvCache::Stub& stub) {
  grpc::Status s;
  for (int i = 0; i < 200; ++i) {
    s = Handshake(stub);
    if (s.ok()) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

// Before: no limit (each open stream holds a sync-pool thread; gRPC's pool grows without bound).
TEST(ServerLimits, OpenStreamsOfOnePeerAreBoundedAndFreedWhenTheyEnd) {
  auto d = StartDaemon({"--config", WriteConfig("server:\n  max_calls_per_peer: 3\n")});
  ASSERT_NE(d, nullptr);
  auto stub = pb::KvCache::NewStub(
      grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(Handshake(*stub).ok());
  std::vector<std::unique_ptr<OpenStream>> held;
  const grpc::Status refused =
      HoldAndProbe(3, [&](int) { return std::make_unique<OpenStream>(*stub); }, *stub, &held);
  ASSERT_EQ(held.size(), 3u) << "no call was refused in 5 rounds: " << refused.error_message();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("gRPC calls in flight, the limit per peer "
                                         "(server.max_calls_per_peer)"),
            std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("peer ipv4:127.0.0.1 has 3"), std::string::npos)
      << refused.error_message();
  // One stream ends (an empty WritePages is OK): the peer may call again.
  const grpc::Status closed = held.back()->Close();
  EXPECT_TRUE(closed.ok()) << closed.error_message();
  held.pop_back();
  const grpc::Status again = UntilServed(*stub);
  EXPECT_TRUE(again.ok()) << again.error_message();
  for (auto& h : held) EXPECT_TRUE(h->Close().ok());
}

TEST(ServerLimits, CallsOfAllPeersTogetherAreBounded) {
  auto d = StartDaemon(
      {"--config", WriteConfig("server:\n  max_calls_per_peer: 0\n  max_calls: 2\n")});
  ASSERT_NE(d, nullptr);
  // Two channels (two connections) share the daemon-wide bound.
  auto one = pb::KvCache::NewStub(
      grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials()));
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // its own connection
  auto two = pb::KvCache::NewStub(grpc::CreateCustomChannel(
      d->address(), grpc::InsecureChannelCredentials(), args));
  ASSERT_TRUE(Handshake(*one).ok());  // both connected before the streams open
  ASSERT_TRUE(Handshake(*two).ok());
  std::vector<std::unique_ptr<OpenStream>> held;
  const grpc::Status refused = HoldAndProbe(
      2, [&](int i) { return std::make_unique<OpenStream>(i == 0 ? *one : *two); }, *two, &held);
  ASSERT_EQ(held.size(), 2u) << "no call was refused in 5 rounds: " << refused.error_message();
  OpenStream& a = *held[0];
  OpenStream& b = *held[1];
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("2 gRPC calls in flight, its limit (server.max_calls)"),
            std::string::npos)
      << refused.error_message();
  EXPECT_TRUE(a.Close().ok());
  EXPECT_TRUE(UntilServed(*one).ok());
  EXPECT_TRUE(b.Close().ok());
}

}  // namespace
}  // namespace oscarkv::testing
