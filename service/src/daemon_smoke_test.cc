// Launches the real oscarkvd binary on free ports with a small pool and drives one store/load
// round trip through the generated gRPC stub, the shared-memory mapping and ReadPages; checks
// health, /metrics, survival of garbage bytes on the port, and a clean SIGTERM exit.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "oscarkv/v1/local_control.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::Key;
using testing::MakePage;
using testing::TinyProfile;

struct Daemon {
  pid_t pid = -1;
  std::map<std::string, std::string> ready;  // fields of the ready line
  std::string line;
};

// Starts oscarkvd and waits (up to 20 s) for its ready line.
Daemon Start(std::vector<std::string> extra) {
  Daemon d;
  int out[2];
  if (pipe(out) != 0) return d;
  std::vector<std::string> args = {OSCARKVD_PATH, "--listen", "127.0.0.1:0", "--metrics-listen",
                                   "127.0.0.1:0", "--pool-mb", "32", "--log-level", "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  d.pid = fork();
  if (d.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline && d.line.find('\n') == std::string::npos) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    d.line.append(buf, n);
  }
  close(out[0]);
  std::istringstream in(d.line.substr(0, d.line.find('\n')));
  std::string word;
  while (in >> word) {
    if (auto eq = word.find('='); eq != std::string::npos) {
      d.ready[word.substr(0, eq)] = word.substr(eq + 1);
    }
  }
  return d;
}

// Exit code of `pid` once it exits (killing it after `ms`: then -1).
int WaitExit(pid_t pid, int ms) {
  int status = 0;
  for (int i = 0; i < ms / 50; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

int StopAndWait(pid_t pid) {
  kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(50000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// A gRPC Handshake at wire version 1.
grpc::Status GrpcHandshake(v1::KvCache::Stub& stub, v1::HandshakeResponse* resp) {
  grpc::ClientContext ctx;
  v1::HandshakeRequest req;
  req.set_wire_version(1);
  return stub.Handshake(&ctx, req, resp);
}

TEST(DaemonSmoke, StoreLookupLoadAndCleanShutdown) {
  Daemon d = Start({});
  ASSERT_GT(d.pid, 0);
  ASSERT_EQ(d.line.rfind("oscarkvd ready ", 0), 0u) << "no ready line: '" << d.line << "'";
  ASSERT_TRUE(d.ready.count("listen") && d.ready.count("metrics") && d.ready.count("shm"));
  EXPECT_EQ(d.ready["pool_bytes"], std::to_string(32 << 20));
  const std::string shm = d.ready["shm"];
  struct stat st;
  ASSERT_EQ(stat(shm.c_str(), &st), 0) << shm;

  auto channel = grpc::CreateChannel(d.ready["listen"], grpc::InsecureChannelCredentials());
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
    const std::string& listen = d.ready["listen"];
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
    httplib::Client http("http://" + d.ready["metrics"]);
    auto r = http.Get("/metrics");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_NE(r->body.find("oscarkv_lookups_total 1\n"), std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_pages 2\n"), std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_pool_slots_used{slot_bytes=\"832\"} 2\n"), std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_rpc_duration_seconds_count{method=\"Lookup\"} 2"),
              std::string::npos);
    EXPECT_NE(r->body.find("oscarkv_rpcs_total{method=\"Lookup\",code=\"INVALID_ARGUMENT\"} 1"),
              std::string::npos);
  }
  EXPECT_EQ(StopAndWait(d.pid), 0);
  EXPECT_NE(stat(shm.c_str(), &st), 0) << "pool file left behind";
}

// SIGTERM while a ReadPages stream is in flight: the stream completes, new calls are refused,
// the daemon then exits 0.
TEST(DaemonSmoke, SigtermDrainsAnInFlightStream) {
  Daemon d = Start({"--drain-timeout-ms", "20000"});
  ASSERT_TRUE(d.ready.count("listen")) << d.line;
  auto channel = grpc::CreateChannel(d.ready["listen"], grpc::InsecureChannelCredentials());
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
  kill(d.pid, SIGTERM);  // mid-stream; the reader is slow
  usleep(200000);
  {
    // A new call during the drain is refused.
    auto fresh = v1::KvCache::NewStub(
        grpc::CreateChannel(d.ready["listen"], grpc::InsecureChannelCredentials()));
    grpc::ClientContext sctx;
    sctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::StatsResponse st;
    EXPECT_FALSE(fresh->Stats(&sctx, {}, &st).ok());
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
  EXPECT_EQ(WaitExit(d.pid, 20000), 0);
  struct stat st;
  EXPECT_NE(stat(d.ready["shm"].c_str(), &st), 0);
}

TEST(DaemonSmoke, BadFlagsAndBusyPortFailClearly) {
  // A bad flag: exit code 2, nothing left in /dev/shm.
  Daemon bad = Start({"--max-batch", "zero"});
  EXPECT_EQ(WaitExit(bad.pid, 10000), 2);
  // A second daemon on the first one's port: exit code 1 and its pool file removed.
  Daemon first = Start({});
  ASSERT_TRUE(first.ready.count("listen")) << first.line;
  Daemon second = Start({"--listen", first.ready["listen"]});
  EXPECT_EQ(WaitExit(second.pid, 10000), 1);
  // The same for a unix socket: a live daemon's socket is never taken over.
  const std::string sock = ::testing::TempDir() + "/oscarkvd_smoke_" + std::to_string(getpid());
  Daemon on_unix = Start({"--listen", "unix:" + sock});
  ASSERT_EQ(on_unix.ready["listen"], "unix:" + sock) << on_unix.line;
  Daemon thief = Start({"--listen", "unix:" + sock});
  EXPECT_EQ(WaitExit(thief.pid, 10000), 1);
  {
    auto channel = grpc::CreateChannel("unix:" + sock, grpc::InsecureChannelCredentials());
    auto stub = v1::KvCache::NewStub(channel);
    v1::HandshakeResponse resp;
    ASSERT_TRUE(GrpcHandshake(*stub, &resp).ok());
    EXPECT_EQ(resp.shm_path(), on_unix.ready["shm"]);
  }
  EXPECT_EQ(StopAndWait(on_unix.pid), 0);
  struct stat st;
  EXPECT_NE(stat(sock.c_str(), &st), 0) << "socket file left behind";
  const std::string second_shm = "/dev/shm/oscarkvd-" +
                                 first.ready["listen"].substr(first.ready["listen"].rfind(':') + 1) +
                                 "-" + std::to_string(second.pid);
  EXPECT_NE(stat(second_shm.c_str(), &st), 0);
  EXPECT_EQ(StopAndWait(first.pid), 0);
}

// --cpus pins every daemon thread (gRPC's included) to the listed CPUs; a bad list is exit 2.
TEST(DaemonSmoke, CpusPinsEveryThread) {
  Daemon bad = Start({"--cpus", "zero"});
  EXPECT_EQ(WaitExit(bad.pid, 10000), 2);
  Daemon d = Start({"--cpus", "0"});
  ASSERT_TRUE(d.ready.count("listen")) << d.line;
  int threads = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(d.pid) + "/task")) {
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
  EXPECT_EQ(StopAndWait(d.pid), 0);
}

// ---- The same-host control socket (proto/oscarkv/v1/local_control.h), spoken raw. ----

namespace lc = ::oscarkv::v1::local;

int DialLocal(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

std::string Frame(lc::Method m, uint64_t id, const google::protobuf::MessageLite& msg) {
  lc::RequestHeader h;
  h.method = static_cast<uint16_t>(m);
  h.id = id;
  std::string f(reinterpret_cast<const char*>(&h), sizeof(h));
  f += msg.SerializeAsString();
  return f;
}

struct Answer {
  bool closed = false;  // EOF instead of a frame
  lc::ResponseHeader h;
  std::string message, body;
};

Answer Recv(int fd) {
  Answer a;
  std::string buf(lc::kMaxFrameBytes + 1, '\0');
  const ssize_t n = recv(fd, buf.data(), buf.size(), 0);
  if (n <= 0) {
    a.closed = true;
    return a;
  }
  EXPECT_GE(n, static_cast<ssize_t>(sizeof(a.h)));
  std::memcpy(&a.h, buf.data(), sizeof(a.h));
  EXPECT_EQ(a.h.magic, lc::kMagic);
  a.message = buf.substr(sizeof(a.h), a.h.message_bytes);
  a.body = buf.substr(sizeof(a.h) + a.h.message_bytes, n - sizeof(a.h) - a.h.message_bytes);
  return a;
}

Answer Call(int fd, const std::string& frame) {
  EXPECT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  return Recv(fd);
}

// A handshaken connection.
int Handshaken(const std::string& path) {
  const int fd = DialLocal(path);
  if (fd < 0) return -1;
  v1::HandshakeRequest req;
  req.set_wire_version(1);
  req.set_client_name("smoke-local");
  Answer a = Call(fd, Frame(lc::Method::kHandshake, 1, req));
  if (a.closed || a.h.code != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Lookup and Release over the local socket answer exactly what gRPC answers; the handshake
// checks the wire version; calls before a handshake, malformed frames and a few thousand random
// ones each get a clear error (or just a close) and never stop the daemon, whose /metrics count
// the local calls; SIGTERM removes the socket file.
TEST(DaemonSmoke, LocalSocketMatchesGrpcAndSurvivesGarbageFrames) {
  Daemon d = Start({});
  ASSERT_TRUE(d.ready.count("local")) << d.line;
  const std::string path = d.ready["local"];
  ASSERT_EQ(path, d.ready["shm"] + ".sock");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto stub = v1::KvCache::NewStub(
      grpc::CreateChannel(d.ready["listen"], grpc::InsecureChannelCredentials()));
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
    httplib::Client http("http://" + d.ready["metrics"]);
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
  EXPECT_EQ(StopAndWait(d.pid), 0);
  EXPECT_NE(stat(path.c_str(), &st), 0) << "socket file left behind";
}

// SIGTERM with only an idle connection open (an inference engine keeps its channel to the
// daemon for good): the drain closes it 100 ms after the last call (~0.25 s here). Before,
// gRPC's Shutdown waited for the connection to go away: the daemon exited ~5 s after SIGTERM
// (measured 5.06 s with this test), whatever the drain timeout.
TEST(DaemonSmoke, SigtermWithAnIdleChannelDoesNotWaitForTheDeadline) {
  Daemon d = Start({"--drain-timeout-ms", "20000"});
  ASSERT_TRUE(d.ready.count("listen")) << d.line;
  auto channel = grpc::CreateChannel(d.ready["listen"], grpc::InsecureChannelCredentials());
  auto stub = v1::KvCache::NewStub(channel);
  v1::HandshakeResponse resp;
  ASSERT_TRUE(GrpcHandshake(*stub, &resp).ok());
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  kill(d.pid, SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(WaitExit(d.pid, 3000), 0) << "the drain waited for the idle connection";
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ drain ] exited %.2f s after SIGTERM with an idle channel open\n", secs);
  // The channel's next call fails: nobody serves the address any more.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::StatsResponse st;
  EXPECT_FALSE(stub->Stats(&ctx, {}, &st).ok());
}

// --local-socket off: the handshake announces none; an explicit path is used as given; a path
// another live daemon serves is refused at start.
TEST(DaemonSmoke, LocalSocketOffAndExplicitPath) {
  Daemon off = Start({"--local-socket", "off"});
  ASSERT_TRUE(off.ready.count("listen")) << off.line;
  EXPECT_EQ(off.ready["local"], "off");
  {
    auto stub = v1::KvCache::NewStub(
        grpc::CreateChannel(off.ready["listen"], grpc::InsecureChannelCredentials()));
    v1::HandshakeResponse resp;
    ASSERT_TRUE(GrpcHandshake(*stub, &resp).ok());
    EXPECT_EQ(resp.local_socket(), "");
  }
  EXPECT_EQ(StopAndWait(off.pid), 0);

  const std::string path = "/tmp/oscarkv-smoke-" + std::to_string(getpid()) + ".sock";
  Daemon a = Start({"--local-socket", path});
  ASSERT_EQ(a.ready["local"], path) << a.line;
  const int c = Handshaken(path);
  EXPECT_GE(c, 0);
  if (c >= 0) close(c);
  Daemon b = Start({"--local-socket", path});
  EXPECT_FALSE(b.ready.count("listen")) << "a second daemon took over a live local socket";
  if (b.pid > 0) {
    EXPECT_NE(WaitExit(b.pid, 10000), 0);
  }
  EXPECT_EQ(StopAndWait(a.pid), 0);
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0);
}

}  // namespace
}  // namespace oscarkv::service
