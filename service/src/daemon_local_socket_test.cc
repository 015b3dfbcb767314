// The daemon's same-host control socket against the real oscarkvd binary: answers identical to
// gRPC's, garbage and malformed frames, pipelining and backpressure, access mode, --local-socket
// off and explicit paths.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "daemon_test_util.h"
#include "local_frame_test_util.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::Answer;
using testing::Call;
using testing::DialLocal;
using testing::Frame;
using testing::GrpcHandshake;
using testing::Handshaken;
using testing::Key;
using testing::MakePage;
using testing::Recv;
using testing::RunToExit;
using testing::Start;
using testing::StopAndWait;
using testing::TinyProfile;

namespace lc = ::oscarkv::v1::local;

// Lookup and Release over the local socket answer exactly what gRPC answers; the handshake
// checks the wire version; calls before a handshake, malformed frames and a few thousand random
// ones each get a clear error (or just a close) and never stop the daemon, whose /metrics count
// the local calls; SIGTERM removes the socket file.
TEST(DaemonSmoke, LocalSocketMatchesGrpcAndSurvivesGarbageFrames) {
  auto started = Start({});
  ASSERT_TRUE(started.ok()) << started.status();
  oscarkv::testing::LocalDaemon& d = **started;
  ASSERT_FALSE(d.local_socket().empty()) << d.ready_line();
  const std::string path = d.local_socket();
  ASSERT_EQ(path, d.shm_path() + ".sock");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto stub =
      v1::KvCache::NewStub(grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
  v1::HandshakeResponse ghs;
  {
    ASSERT_TRUE(GrpcHandshake(*stub, &ghs).ok());
    EXPECT_EQ(ghs.local_socket(), path);
    EXPECT_NE(ghs.instance_id(), 0u);
  }
  std::string codec;
  {
    grpc::ClientContext ctx;
    v1::RegisterCodecRequest req;
    *req.mutable_profile() = TinyProfile("local");
    v1::RegisterCodecResponse resp;
    ASSERT_TRUE(stub->RegisterCodec(&ctx, req, &resp).ok());
    codec = resp.codec_id();
  }

  // Wire version: refused with the gRPC path's message, then closed.
  {
    const int fd = DialLocal(path);
    ASSERT_GE(fd, 0);
    v1::HandshakeRequest req;
    req.set_wire_version(2);
    Answer a = Call(fd, Frame(lc::Method::kHandshake, 7, req));
    ASSERT_FALSE(a.closed);
    EXPECT_EQ(a.h.id, 7u);
    EXPECT_EQ(a.h.code, static_cast<uint32_t>(grpc::StatusCode::FAILED_PRECONDITION));
    EXPECT_NE(a.message.find("wire version mismatch"), std::string::npos) << a.message;
    EXPECT_TRUE(Recv(fd).closed);
    close(fd);
  }
  // A Lookup before the handshake.
  {
    const int fd = DialLocal(path);
    v1::LookupRequest req;
    req.set_codec_id(codec);
    Answer a = Call(fd, Frame(lc::Method::kLookup, 3, req));
    ASSERT_FALSE(a.closed);
    EXPECT_EQ(a.h.code, static_cast<uint32_t>(grpc::StatusCode::FAILED_PRECONDITION));
    EXPECT_NE(a.message.find("Handshake first"), std::string::npos) << a.message;
    EXPECT_TRUE(Recv(fd).closed);
    close(fd);
  }
  // Handshake answer equals gRPC's; Lookup answers (hit, miss, bad key, unknown codec) equal.
  const int fd = DialLocal(path);
  {
    v1::HandshakeRequest req;
    req.set_wire_version(1);
    Answer a = Call(fd, Frame(lc::Method::kHandshake, 1, req));
    ASSERT_EQ(a.h.code, 0u) << a.message;
    v1::HandshakeResponse lhs;
    ASSERT_TRUE(lhs.ParseFromString(a.body));
    EXPECT_EQ(lhs.SerializeAsString(), ghs.SerializeAsString());
  }
  std::vector<v1::LookupRequest> lookups(4);
  for (auto& r : lookups) r.set_codec_id(codec);
  lookups[0].add_keys(Key(1));
  lookups[0].add_keys(Key(2));
  lookups[1].add_keys("short");
  lookups[2].set_codec_id(std::string(16, 'x'));
  lookups[2].add_keys(Key(1));
  for (int i = 0; i < 300; ++i) lookups[3].add_keys(Key(i, 9));  // pin a miss: no lease
  lookups[3].set_pin(true);
  int local_lookups = 0;
  for (size_t i = 0; i < lookups.size(); ++i) {
    grpc::ClientContext ctx;
    v1::LookupResponse gresp, lresp;
    grpc::Status gs = stub->Lookup(&ctx, lookups[i], &gresp);
    Answer a = Call(fd, Frame(lc::Method::kLookup, 100 + i, lookups[i]));
    ++local_lookups;
    ASSERT_FALSE(a.closed) << i;
    EXPECT_EQ(a.h.id, 100 + i);
    EXPECT_EQ(a.h.method, static_cast<uint16_t>(lc::Method::kLookup));
    EXPECT_EQ(a.h.code, static_cast<uint32_t>(gs.error_code())) << i << ": " << a.message;
    EXPECT_EQ(a.message, gs.error_message()) << i;
    ASSERT_TRUE(lresp.ParseFromString(a.body));
    EXPECT_EQ(lresp.SerializeAsString(), gresp.SerializeAsString()) << i;
  }
  {
    v1::ReleaseRequest req;
    req.set_lease_id(12345);  // unknown: OK, as over gRPC
    Answer a = Call(fd, Frame(lc::Method::kRelease, 200, req));
    EXPECT_EQ(a.h.code, 0u) << a.message;
    EXPECT_EQ(a.h.id, 200u);
  }
  // Pipelined: 50 requests out before any answer is read; answers in order.
  {
    for (int i = 0; i < 50; ++i) {
      const std::string f = Frame(lc::Method::kLookup, 1000 + i, lookups[0]);
      ASSERT_EQ(send(fd, f.data(), f.size(), MSG_NOSIGNAL), static_cast<ssize_t>(f.size()));
    }
    for (int i = 0; i < 50; ++i) {
      Answer a = Recv(fd);
      ASSERT_FALSE(a.closed);
      EXPECT_EQ(a.h.id, 1000u + i);
      EXPECT_EQ(a.h.code, 0u);
    }
    local_lookups += 50;
  }
  // Backpressure: 3,000 pipelined requests while nobody reads the answers for 300 ms. The
  // daemon's send buffer fills, it queues what it cannot send and stops reading this
  // connection until the answers drain; then every answer arrives, in order.
  {
    const int c = Handshaken(path);
    ASSERT_GE(c, 0);
    constexpr int kPipelined = 3000;
    std::thread sender([&] {
      for (int i = 0; i < kPipelined; ++i) {
        const std::string f = Frame(lc::Method::kLookup, 5000 + i, lookups[0]);
        if (send(c, f.data(), f.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(f.size())) {
          ADD_FAILURE() << "send " << i << ": " << std::strerror(errno);
          return;
        }
      }
    });
    usleep(300000);
    int in_order = 0;
    for (int i = 0; i < kPipelined; ++i) {
      Answer a = Recv(c);
      if (a.closed) break;
      in_order += a.h.id == 5000u + i && a.h.code == 0;
    }
    sender.join();
    EXPECT_EQ(in_order, kPipelined);
    local_lookups += kPipelined;
    close(c);
  }
  // Malformed frames: each gets INVALID_ARGUMENT naming the problem, then the close.
  struct Bad {
    std::string frame, why;
  };
  std::vector<Bad> bad;
  bad.push_back({"abc", "shorter than its header"});
  {
    std::string f = Frame(lc::Method::kLookup, 5, lookups[0]);
    f[0] ^= 0x55;
    bad.push_back({f, "magic"});
  }
  {
    std::string f = Frame(lc::Method::kLookup, 5, lookups[0]);
    f[4] = 9;  // frame version
    bad.push_back({f, "frame version 9"});
  }
  {
    std::string f = Frame(lc::Method::kLookup, 5, lookups[0]);
    f[6] = 77;  // method
    bad.push_back({f, "unknown method 77"});
  }
  {
    lc::RequestHeader h;
    h.method = static_cast<uint16_t>(lc::Method::kLookup);
    std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
    f += "\xff\xff\xff\xff\xff";
    bad.push_back({f, "unparsable LookupRequest"});
  }
  for (const Bad& b : bad) {
    const int c = Handshaken(path);
    ASSERT_GE(c, 0);
    Answer a = Call(c, b.frame);
    ASSERT_FALSE(a.closed) << b.why;
    EXPECT_EQ(a.h.code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT)) << b.why;
    // local_control.h: id 0 and method 0 (no request the client could match), then the close.
    EXPECT_EQ(a.h.id, 0u) << b.why;
    EXPECT_EQ(a.h.method, 0u) << b.why;
    EXPECT_NE(a.message.find(b.why), std::string::npos) << a.message;
    EXPECT_TRUE(Recv(c).closed) << b.why;
    close(c);
  }
  // Fuzz: random frames (random bytes; or a valid header with random method and body) on
  // handshaken connections until each closes. Whatever arrives, the daemon keeps serving.
  std::mt19937_64 rng(20261130);
  int garbage = 0;
  for (int conn = 0; conn < 60; ++conn) {
    const int c = Handshaken(path);
    ASSERT_GE(c, 0) << "daemon stopped accepting after " << garbage << " garbage frames";
    for (int k = 0; k < 40; ++k) {
      std::string f(rng() % 600, '\0');
      for (char& ch : f) ch = static_cast<char>(rng());
      if (rng() % 2 && f.size() >= sizeof(lc::RequestHeader)) {
        lc::RequestHeader h;
        h.method = static_cast<uint16_t>(rng() % 5);
        h.id = rng();
        std::memcpy(f.data(), &h, sizeof(h));
      }
      if (f.empty()) f = "x";
      ++garbage;
      if (send(c, f.data(), f.size(), MSG_NOSIGNAL) < 0) break;
      Answer a = Recv(c);
      if (a.closed) break;
      if (a.h.code != 0) {
        EXPECT_FALSE(a.message.empty());
      }
    }
    close(c);
  }
  // Still serving, locally and over gRPC.
  {
    Answer a = Call(fd, Frame(lc::Method::kLookup, 9999, lookups[0]));
    ASSERT_FALSE(a.closed);
    EXPECT_EQ(a.h.code, 0u);
    ++local_lookups;
    grpc::ClientContext ctx;
    v1::LookupResponse resp;
    EXPECT_TRUE(stub->Lookup(&ctx, lookups[0], &resp).ok());
  }
  close(fd);
  {
    httplib::Client http("http://" + d.metrics_address());
    auto r = http.Get("/metrics");
    ASSERT_TRUE(r);
    const std::string want = "oscarkv_local_calls_total{method=\"Lookup\"} ";
    const size_t at = r->body.find(want);
    ASSERT_NE(at, std::string::npos);
    const int counted = std::atoi(r->body.c_str() + at + want.size());
    // The fuzz's random frames may have carried a few well-formed Lookups of their own.
    EXPECT_GE(counted, local_lookups);
    EXPECT_NE(r->body.find("oscarkv_local_calls_total{method=\"Release\"} 1\n"), std::string::npos);
    const std::string mal = "\noscarkv_local_malformed_frames_total ";
    const size_t m = r->body.find(mal);
    ASSERT_NE(m, std::string::npos);
    EXPECT_GE(std::atoi(r->body.c_str() + m + mal.size()), static_cast<int>(bad.size()));
    // Local calls are in the per-method RPC series too: gRPC made 5 Lookups in this test.
    const std::string rpc = "oscarkv_rpc_duration_seconds_count{method=\"Lookup\"} ";
    const size_t h = r->body.find(rpc);
    ASSERT_NE(h, std::string::npos);
    EXPECT_GE(std::atoi(r->body.c_str() + h + rpc.size()), local_lookups + 5);
  }
  // The gRPC channel stays open (idle) across the SIGTERM: the drain closes it, it does not
  // wait for it (SigtermWithAnIdleChannelDoesNotWaitForTheDeadline).
  EXPECT_EQ(StopAndWait(d), 0);
  EXPECT_NE(stat(path.c_str(), &st), 0) << "socket file left behind";
}

// --local-socket off: the handshake announces none; an explicit path is used as given; a path
// another live daemon serves is refused at start.
// One uid holds at most server.local_max_connections_per_uid connections (each costs the daemon
// a descriptor, buffers and mapped staging): the next is answered RESOURCE_EXHAUSTED naming the
// key and closed, those already open keep working, and a closed one makes room again.
TEST(DaemonSmoke, LocalConnectionsPerUidAreBounded) {
  const std::string cfg = ::testing::TempDir() + "/local_per_uid_" + std::to_string(getpid()) + ".yaml";
  std::ofstream(cfg) << "server:\n  local_max_connections_per_uid: 3\n";
  auto started = Start({"--config", cfg});
  ASSERT_TRUE(started.ok()) << started.status();
  const std::string path = (*started)->local_socket();
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(Handshaken(path));
    ASSERT_GE(held.back(), 0) << i;
  }
  const int over = DialLocal(path);
  ASSERT_GE(over, 0);  // the kernel accepts; the daemon answers and closes
  const Answer refused = Recv(over);
  ASSERT_FALSE(refused.closed);
  EXPECT_EQ(refused.h.code, static_cast<uint32_t>(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(refused.message.find("local-socket connections open, the limit "
                                 "(server.local_max_connections_per_uid)"),
            std::string::npos)
      << refused.message;
  EXPECT_TRUE(Recv(over).closed);
  close(over);
  // The three still serve.
  for (int fd : held) EXPECT_TRUE(testing::SendHandshake(fd, "still-here"));
  // One closes: room for one more (the daemon notices the close asynchronously).
  close(held.back());
  held.pop_back();
  int again = -1;
  for (int i = 0; i < 100 && again < 0; ++i) {
    again = Handshaken(path);
    if (again < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(again, 0) << "no room after a connection closed";
  if (again >= 0) close(again);
  for (int fd : held) close(fd);
  EXPECT_EQ(StopAndWait(**started), 0);
  std::remove(cfg.c_str());
}

TEST(DaemonSmoke, LocalSocketOffAndExplicitPath) {
  auto off = Start({"--local-socket", "off"});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_NE((*off)->ready_line().find(" local=off"), std::string::npos) << (*off)->ready_line();
  EXPECT_EQ((*off)->local_socket(), "");
  {
    auto stub = v1::KvCache::NewStub(
        grpc::CreateChannel((*off)->address(), grpc::InsecureChannelCredentials()));
    v1::HandshakeResponse resp;
    ASSERT_TRUE(GrpcHandshake(*stub, &resp).ok());
    EXPECT_EQ(resp.local_socket(), "");
  }
  EXPECT_EQ(StopAndWait(**off), 0);

  const std::string path = "/tmp/oscarkv-smoke-" + std::to_string(getpid()) + ".sock";
  auto a = Start({"--local-socket", path});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ((*a)->local_socket(), path) << (*a)->ready_line();
  const int c = Handshaken(path);
  EXPECT_GE(c, 0);
  if (c >= 0) close(c);
  const testing::Exited b = RunToExit({"--local-socket", path}, 10000);
  EXPECT_EQ(b.output.find("oscarkvd ready"), std::string::npos)
      << "a second daemon took over a live local socket";
  EXPECT_NE(b.exit_code, 0);
  EXPECT_EQ(StopAndWait(**a), 0);
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

}  // namespace
}  // namespace oscarkv::service
