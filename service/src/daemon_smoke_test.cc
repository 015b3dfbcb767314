// Launches the real oscarkvd binary on free ports with a small pool and drives one store/load
// round trip through the generated gRPC stub, the shared-memory mapping and ReadPages; checks
// health, /metrics, survival of garbage bytes on the port, and a clean SIGTERM exit. The local
// socket's tests are in daemon_local_socket_test.cc (the same binary).
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
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "daemon_test_util.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::GrpcHandshake;
using testing::Key;
using testing::MakePage;
using testing::RunToExit;
using testing::Start;
using testing::StopAndWait;
using testing::TinyProfile;
using testing::WaitExit;

TEST(DaemonSmoke, StoreLookupLoadAndCleanShutdown) {
  auto started = Start({"--shm-mode", "trusted"});  // this test writes pages into the pool file
  ASSERT_TRUE(started.ok()) << started.status();
  oscarkv::testing::LocalDaemon& d = **started;
  ASSERT_GT(d.pid(), 0);
  ASSERT_EQ(d.ready_line().rfind("oscarkvd ready ", 0), 0u) << d.ready_line();
  ASSERT_TRUE(!d.address().empty() && !d.metrics_address().empty() && !d.shm_path().empty())
      << d.ready_line();
  EXPECT_EQ(d.pool_bytes(), uint64_t{32 << 20});
  const std::string shm = d.shm_path();
  struct stat st;
  ASSERT_EQ(stat(shm.c_str(), &st), 0) << shm;

  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::KvCache::NewStub(channel);
  grpc::Status s;
  {
    grpc::ClientContext ctx;
    v1::HandshakeRequest req;
    v1::HandshakeResponse resp;
    req.set_wire_version(2);
    s = stub->Handshake(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(s.error_message().find("2"), std::string::npos);
  }
  v1::HandshakeResponse hs;
  {
    grpc::ClientContext ctx;
    v1::HandshakeRequest req;
    req.set_wire_version(1);
    req.set_client_name("smoke");
    ASSERT_TRUE(stub->Handshake(&ctx, req, &hs).ok());
    EXPECT_EQ(hs.shm_path(), shm);
    EXPECT_EQ(hs.shm_bytes(), uint64_t{32} << 20);
    EXPECT_EQ(hs.max_batch(), 4096u);
  }
  // Map the pool the way a same-host client does.
  int fd = open(hs.shm_path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  auto* base = static_cast<uint8_t*>(
      mmap(nullptr, hs.shm_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(base, MAP_FAILED);

  std::string codec;
  {
    grpc::ClientContext ctx;
    v1::RegisterCodecRequest req;
    *req.mutable_profile() = TinyProfile();
    v1::RegisterCodecResponse resp;
    ASSERT_TRUE(stub->RegisterCodec(&ctx, req, &resp).ok());
    codec = resp.codec_id();
    EXPECT_EQ(resp.int2_page_bytes(), 832u);
  }
  v1::ReserveResponse res;
  {
    grpc::ClientContext ctx;
    v1::ReserveRequest req;
    req.set_codec_id(codec);
    for (int i = 0; i < 2; ++i) {
      auto* it = req.add_items();
      it->set_key(Key(i));
      it->set_kind(v1::PAGE_KIND_INT2);
    }
    ASSERT_TRUE(stub->Reserve(&ctx, req, &res).ok());
    ASSERT_EQ(res.results_size(), 2);
    for (auto& r : res.results()) ASSERT_EQ(r.status().code(), 0) << r.status().message();
  }
  const std::string page0 = MakePage(TinyProfile(), PageKind::kInt2, 0);
  const std::string page1 = MakePage(TinyProfile(), PageKind::kInt2, 1);
  {
    // Page 0 over the portable stream, in two chunks; page 1 through shared memory.
    grpc::ClientContext ctx;
    v1::WriteResponse wr;
    auto writer = stub->WritePages(&ctx, &wr);
    v1::WriteChunk c;
    c.set_reservation_id(res.reservation_id());
    c.set_key(Key(0));
    c.set_offset(0);
    c.set_data(page0.substr(0, 500));
    ASSERT_TRUE(writer->Write(c));
    c.set_offset(500);
    c.set_data(page0.substr(500));
    ASSERT_TRUE(writer->Write(c));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    EXPECT_EQ(wr.bytes_written(), page0.size());
    std::memcpy(base + res.results(1).slot().offset(), page1.data(), page1.size());
  }
  {
    grpc::ClientContext ctx;
    v1::CommitRequest req;
    req.set_reservation_id(res.reservation_id());
    v1::CommitResponse resp;
    ASSERT_TRUE(stub->Commit(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.results_size(), 2);
    for (auto& r : resp.results()) EXPECT_EQ(r.code(), 0) << r.message();
  }
  v1::LookupResponse look;
  {
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    req.set_codec_id(codec);
    for (int i = 0; i < 4; ++i) req.add_keys(Key(i));
    req.set_pin(true);
    ASSERT_TRUE(stub->Lookup(&ctx, req, &look).ok());
    ASSERT_EQ(look.matched(), 2u);
    ASSERT_NE(look.lease_id(), 0u);
    // The fast path: a load is a copy out of the mapped pool.
    EXPECT_EQ(std::string(reinterpret_cast<char*>(base + look.pages(0).offset()), 832), page0);
    EXPECT_EQ(std::string(reinterpret_cast<char*>(base + look.pages(1).offset()), 832), page1);
  }
  {
    grpc::ClientContext ctx;
    v1::ReadRequest req;
    req.set_lease_id(look.lease_id());
    auto reader = stub->ReadPages(&ctx, req);
    std::map<std::string, std::string> got;
    v1::ReadChunk c;
    while (reader->Read(&c)) {
      std::string& p = got[c.key()];
      p.resize(c.page_bytes());
      p.replace(c.offset(), c.data().size(), c.data());
    }
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(got[Key(0)], page0);
    EXPECT_EQ(got[Key(1)], page1);
  }
  {
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    req.set_lease_id(look.lease_id());
    v1::ReleaseResponse resp;
    EXPECT_TRUE(stub->Release(&ctx, req, &resp).ok());
  }
  munmap(base, hs.shm_bytes());

  // Bad input gets a clear status; garbage bytes on the port do not hurt the daemon.
  {
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    req.set_codec_id("short");
    v1::LookupResponse resp;
    EXPECT_EQ(stub->Lookup(&ctx, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    const std::string& listen = d.address();
    const int port = std::stoi(listen.substr(listen.rfind(':') + 1));
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    std::string junk(4096, '\0');
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 131 + 7);
    (void)!write(sock, junk.data(), junk.size());
    close(sock);
  }
  {
    grpc::ClientContext ctx;
    v1::StatsResponse stats;
    ASSERT_TRUE(stub->Stats(&ctx, {}, &stats).ok());
    EXPECT_EQ(stats.pages(), 2u);
    EXPECT_EQ(stats.hits(), 2u);
    EXPECT_EQ(stats.leases(), 0u);
    EXPECT_EQ(stats.bytes_written(), 832u);
    EXPECT_EQ(stats.bytes_read(), 2u * 832u);
  }
  {
    // grpc.health.v1.Health/Check with an empty request: SERVING is field 1 = 1.
    grpc::GenericStub generic(channel);
    grpc::ClientContext ctx;
    grpc::ByteBuffer request, response;
    grpc::Slice empty("", 0);
    request = grpc::ByteBuffer(&empty, 1);
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status st) { done.set_value(st); });
    ASSERT_TRUE(done.get_future().get().ok());
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(response.Dump(&slices).ok());
    std::string bytes;
    for (auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  }
  {
    httplib::Client http("http://" + d.metrics_address());
    auto r = http.Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("oscarkv_lookups_total 1\n"), std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_pages 2\n"), std::string::npos);
    // Page 0 was hashed in its in-order copy into the slot (WritePages); page 1, written into
    // the pool by this test without checksums_verified, is the one Commit had to read again.
    EXPECT_NE(r->body.find("oscarkv_commit_rehashes_total 1\n"), std::string::npos);
    // Per-tenant series; without tenants: configured, the one "default" tenant.
    EXPECT_NE(r->body.find("oscarkv_tenant_pages{tenant=\"default\"} 2\n"), std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_tenant_quota_refusals_total{tenant=\"default\","
                           "quota=\"codecs\"} 0\n"),
              std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_pool_slots_used{slot_bytes=\"832\"} 2\n"), std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_rpc_duration_seconds_count{method=\"Lookup\"} 2"),
              std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_rpcs_total{method=\"Lookup\",code=\"INVALID_ARGUMENT\"} 1"),
              std::string::npos);
  }
  EXPECT_EQ(StopAndWait(d), 0);
  EXPECT_NE(stat(shm.c_str(), &st), 0) << "pool file left behind";
}

// SIGTERM while a ReadPages stream is in flight: the stream completes, new calls are refused,
// the daemon then exits 0.
TEST(DaemonSmoke, SigtermDrainsAnInFlightStream) {
  auto started = Start({"--drain-timeout-ms", "20000"});
  ASSERT_TRUE(started.ok()) << started.status();
  oscarkv::testing::LocalDaemon& d = **started;
  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::KvCache::NewStub(channel);
  v1::CodecProfile prof = TinyProfile("drain");
  prof.set_num_layers(4);
  prof.set_num_kv_heads(8);
  prof.set_head_dim(128);
  prof.set_page_tokens(64);
  prof.set_group_size(128);  // BF16 page: 1 MiB + 64 bytes
  std::string codec;
  {
    grpc::ClientContext ctx;
    v1::RegisterCodecRequest req;
    *req.mutable_profile() = prof;
    v1::RegisterCodecResponse resp;
    ASSERT_TRUE(stub->RegisterCodec(&ctx, req, &resp).ok());
    codec = resp.codec_id();
  }
  constexpr int kPages = 16;
  std::vector<std::string> pages;
  v1::ReserveResponse res;
  {
    grpc::ClientContext ctx;
    v1::ReserveRequest req;
    req.set_codec_id(codec);
    for (int i = 0; i < kPages; ++i) {
      auto* it = req.add_items();
      it->set_key(Key(i, 5));
      it->set_kind(v1::PAGE_KIND_BF16);
      pages.push_back(MakePage(prof, PageKind::kBf16, i, 64));
    }
    ASSERT_TRUE(stub->Reserve(&ctx, req, &res).ok());
    for (auto& r : res.results()) ASSERT_EQ(r.status().code(), 0) << r.status().message();
  }
  {
    grpc::ClientContext ctx;
    v1::WriteResponse wr;
    auto w = stub->WritePages(&ctx, &wr);
    for (int i = 0; i < kPages; ++i) {
      v1::WriteChunk c;
      c.set_reservation_id(res.reservation_id());
      c.set_key(Key(i, 5));
      c.set_data(pages[i]);
      ASSERT_TRUE(w->Write(c));
    }
    w->WritesDone();
    ASSERT_TRUE(w->Finish().ok());
    grpc::ClientContext cctx;
    v1::CommitRequest creq;
    creq.set_reservation_id(res.reservation_id());
    v1::CommitResponse cresp;
    ASSERT_TRUE(stub->Commit(&cctx, creq, &cresp).ok());
    for (auto& r : cresp.results()) ASSERT_EQ(r.code(), 0) << r.message();
  }
  v1::LookupResponse look;
  {
    grpc::ClientContext ctx;
    v1::LookupRequest req;
    req.set_codec_id(codec);
    for (int i = 0; i < kPages; ++i) req.add_keys(Key(i, 5));
    req.set_pin(true);
    ASSERT_TRUE(stub->Lookup(&ctx, req, &look).ok());
    ASSERT_EQ(look.matched(), static_cast<uint32_t>(kPages));
  }
  grpc::ClientContext ctx;
  v1::ReadRequest rd;
  rd.set_lease_id(look.lease_id());
  auto reader = stub->ReadPages(&ctx, rd);
  std::map<std::string, std::string> got;
  v1::ReadChunk c;
  ASSERT_TRUE(reader->Read(&c));
  got[c.key()].resize(c.page_bytes());
  got[c.key()].replace(c.offset(), c.data().size(), c.data());
  d.Signal(SIGTERM);  // mid-stream; the reader is slow
  {
    // A new call during the drain is refused. The drain starts when the daemon's signal thread
    // runs, which on a loaded machine can take a while: poll (the stream is held open meanwhile,
    // and the drain deadline is 20 s) instead of assuming it has begun after a fixed sleep.
    bool refused = false;
    for (int attempt = 0; attempt < 50 && !refused; ++attempt) {
      usleep(100000);
      auto fresh = v1::KvCache::NewStub(
          grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
      grpc::ClientContext sctx;
      sctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      v1::StatsResponse st;
      refused = !fresh->Stats(&sctx, {}, &st).ok();
    }
    EXPECT_TRUE(refused) << "a new call was still served 5 s after SIGTERM";
  }
  while (reader->Read(&c)) {
    std::string& p = got[c.key()];
    p.resize(c.page_bytes());
    p.replace(c.offset(), c.data().size(), c.data());
    usleep(5000);
  }
  grpc::Status fin = reader->Finish();
  EXPECT_TRUE(fin.ok()) << fin.error_message();
  ASSERT_EQ(got.size(), static_cast<size_t>(kPages));
  for (int i = 0; i < kPages; ++i) EXPECT_TRUE(got[Key(i, 5)] == pages[i]) << "page " << i;
  EXPECT_EQ(WaitExit(d, 20000), 0);
  struct stat st;
  EXPECT_NE(stat(d.shm_path().c_str(), &st), 0);
}

TEST(DaemonSmoke, BadFlagsAndBusyPortFailClearly) {
  // A bad flag: exit code 2, nothing left in /dev/shm.
  EXPECT_EQ(RunToExit({"--max-batch", "zero"}, 10000).exit_code, 2);
  // A second daemon on the first one's port: exit code 1 and its pool file removed.
  auto first = Start({});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string first_listen = (*first)->address();
  const testing::Exited second = RunToExit({"--listen", first_listen}, 10000);
  EXPECT_EQ(second.exit_code, 1) << second.output;
  // The same for a unix socket: a live daemon's socket is never taken over.
  const std::string sock = ::testing::TempDir() + "/oscarkvd_smoke_" + std::to_string(getpid());
  auto on_unix = Start({"--listen", "unix:" + sock});
  ASSERT_TRUE(on_unix.ok()) << on_unix.status();
  ASSERT_EQ((*on_unix)->address(), "unix:" + sock) << (*on_unix)->ready_line();
  EXPECT_EQ(RunToExit({"--listen", "unix:" + sock}, 10000).exit_code, 1);
  {
    auto channel = grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials());
    auto stub = v1::KvCache::NewStub(channel);
    v1::HandshakeResponse resp;
    ASSERT_TRUE(GrpcHandshake(*stub, &resp).ok());
    // Isolated (default): no pool path to map; the pool comes over the local socket.
    EXPECT_TRUE(resp.shm_isolated());
    EXPECT_EQ(resp.shm_path(), "");
    EXPECT_EQ(resp.shm_bytes(), (*on_unix)->pool_bytes());
  }
  EXPECT_EQ(StopAndWait(**on_unix), 0);
  struct stat st;
  EXPECT_NE(stat(sock.c_str(), &st), 0) << "socket file left behind";
  const std::string second_shm = "/dev/shm/oscarkvd-" +
                                 first_listen.substr(first_listen.rfind(':') + 1) + "-" +
                                 std::to_string(second.pid);
  EXPECT_NE(stat(second_shm.c_str(), &st), 0);
  EXPECT_EQ(StopAndWait(**first), 0);
}

// --cpus pins every daemon thread (gRPC's included) to the listed CPUs; a bad list is exit 2.
TEST(DaemonSmoke, CpusPinsEveryThread) {
  EXPECT_EQ(RunToExit({"--cpus", "zero"}, 10000).exit_code, 2);
  auto started = Start({"--cpus", "0"});
  ASSERT_TRUE(started.ok()) << started.status();
  oscarkv::testing::LocalDaemon& d = **started;
  int threads = 0;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(d.pid()) + "/task")) {
    std::ifstream f(t.path() / "status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        EXPECT_EQ(line.substr(line.find_first_not_of(" \t", 18)), "0") << t.path();
        ++threads;
      }
    }
  }
  EXPECT_GT(threads, 3);  // main, reaper, gRPC's
  EXPECT_EQ(StopAndWait(d), 0);
}

// SIGTERM with only an idle connection open (an inference engine keeps its channel to the
// daemon for good): the drain closes it 100 ms after the last call (~0.25 s here). Before,
// gRPC's Shutdown waited for the connection to go away: the daemon exited ~5 s after SIGTERM
// (measured 5.06 s with this test), whatever the drain timeout.
TEST(DaemonSmoke, SigtermWithAnIdleChannelDoesNotWaitForTheDeadline) {
  auto started = Start({"--drain-timeout-ms", "20000"});
  ASSERT_TRUE(started.ok()) << started.status();
  oscarkv::testing::LocalDaemon& d = **started;
  auto channel = grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::KvCache::NewStub(channel);
  v1::HandshakeResponse resp;
  ASSERT_TRUE(GrpcHandshake(*stub, &resp).ok());
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  d.Signal(SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitExit(d, 3000), 0) << "the drain waited for the idle connection";
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ drain ] exited %.2f s after SIGTERM with an idle channel open\n", secs);
  // The channel's next call fails: nobody serves the address any more.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::StatsResponse st;
  EXPECT_FALSE(stub->Stats(&ctx, {}, &st).ok());
}
}  // namespace
}  // namespace oscarkv::service
