// The UCX data plane end to end: oscarkvd serves its pool over UCX (GetDataPlane), a UcxLoader
// fetches leased pages and handle pages by RMA get, over tcp and over shm; kill -9 of the daemon
// during batch transfers (10 rounds) gives errors, never a wrong page, within the bound. The
// whole-pool data plane where another host could reach it (a non-loopback or wildcard listen
// address, or devices named off loopback) is a startup error unless explicitly allowed.
#include <fcntl.h>
#include <unistd.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "oscarkv/client/ucx_loader.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"
#include "ucx_test_peer.h"

namespace oscarkv::testing {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

struct Stored {
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> pages;
};

Stored StorePages(client::Client& c, const client::Codec& codec, uint64_t seed, size_t n) {
  Stored s;
  s.keys = client::Client::BlockKeys(codec, Tokens(seed, n * codec.profile.page_tokens));
  std::vector<client::PageWrite> w;
  for (size_t i = 0; i < n; ++i) s.pages.push_back(MakePage(codec.profile, PageKind::kInt2, seed + i));
  for (size_t i = 0; i < n; ++i) w.push_back({s.keys[i], PageKind::kInt2, s.pages[i]});
  auto r = c.Store(codec, w);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) {
    EXPECT_EQ(r->stored, n);
  }
  return s;
}

std::unique_ptr<client::UcxLoader> Loader(const std::string& addr, const std::string& tls) {
  client::UcxLoaderOptions o;
  o.connect.address = addr;
  o.connect.data_path = client::DataPath::kGrpc;  // control plane only; pages come by UCX
  o.connect.rpc_timeout_ms = 1000;
  o.tls = tls;
  if (tls == "tcp") o.net_devices = "lo";
  o.buffer_bytes = 8 << 20;  // smaller than a batch: several RMA rounds
  o.peer_timeout_ms = 1000;
  o.transfer_timeout_ms = 1500;
  auto l = client::UcxLoader::Connect(o);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *std::move(l) : nullptr;
}

std::vector<std::string> DaemonFlags(const std::string& tls) {
  std::vector<std::string> f = {"--ucx-tls", tls};
  if (tls == "tcp") f.insert(f.end(), {"--ucx-net-devices", "lo"});
  return f;
}

class UcxDataPlaneTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxDataPlaneTest, LoadAndHandleByRma) {
  const std::string tls = GetParam();
  // Trusted mode: the test corrupts a page through the pool file (and the data plane runs in
  // its own process, which maps that file).
  std::vector<std::string> flags = DaemonFlags(tls);
  flags.insert(flags.end(), {"--shm-mode", "trusted"});
  auto d = StartDaemon(flags);
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  Stored s = StorePages(*c, codec, 500, 40);

  auto loader = Loader(d->address(), tls);
  ASSERT_NE(loader, nullptr);
  auto info = loader->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string lanes = absl::StrJoin(info->endpoint_transports, ",");
  std::printf("tls=%s daemon=[%s] endpoint=[%s] peer_failure_detection=%d\n", tls.c_str(),
              absl::StrJoin(info->daemon_transports, ",").c_str(), lanes.c_str(),
              info->peer_failure_detection);
  if (tls == "tcp") {
    EXPECT_TRUE(absl::StrContains(lanes, "tcp")) << lanes;
  }
  if (tls == "shm") {
    EXPECT_FALSE(absl::StrContains(lanes, "tcp")) << lanes;
  }

  const auto t0 = Clock::now();
  auto r = loader->Load(codec, s.keys);
  const int64_t ms = MsSince(t0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->matched, 40u);
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(r->pages[i], s.pages[i]) << i;
  std::printf("tls=%s: %u pages, %llu bytes by RMA in %lld ms\n", tls.c_str(), r->matched,
              static_cast<unsigned long long>(r->bytes), static_cast<long long>(ms));

  // Engine buffers: pages straight into a registered caller buffer.
  std::vector<uint8_t> engine(size_t{40} * codec.int2_page_bytes + 4096);
  ASSERT_TRUE(loader->RegisterBuffer(engine.data(), engine.size()).ok());
  std::vector<std::span<uint8_t>> slots;
  for (size_t i = 0; i < 40; ++i) {
    slots.emplace_back(engine.data() + i * codec.int2_page_bytes, codec.int2_page_bytes);
  }
  std::vector<uint64_t> sizes;
  auto n = loader->LoadInto(codec, s.keys, slots, &sizes);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 40u);
  for (size_t i = 0; i < 40; ++i) {
    ASSERT_EQ(sizes[i], s.pages[i].size());
    EXPECT_TRUE(std::equal(s.pages[i].begin(), s.pages[i].end(), slots[i].begin())) << i;
  }
  std::vector<uint8_t> unregistered(codec.int2_page_bytes);
  std::vector<std::span<uint8_t>> bad = {std::span<uint8_t>(unregistered)};
  EXPECT_EQ(loader->LoadInto(codec, std::span(s.keys).subspan(0, 1), bad).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Handles: published through the plain client, loaded by RMA.
  std::vector<BlockKey> hk(s.keys.begin(), s.keys.begin() + 5);
  ASSERT_TRUE(loader->handles().PublishKeys(codec, "pd-1", hk, "state", 10000).ok());
  auto h = loader->LoadHandle(codec, "pd-1");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->pages.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(h->pages[i], s.pages[i]);
  EXPECT_EQ(h->info.metadata, "state");
  ASSERT_TRUE(loader->handles().Close("pd-1").ok());

  // A page corrupted in the pool: DATA_LOSS through the staged RMA load, the RMA straight into
  // engine buffers, and the handle load -- the one load path verifies each of them.
  auto pin = c->Lookup(codec, std::span(s.keys).subspan(3, 1), {.pin = true});
  ASSERT_TRUE(pin.ok() && pin->matched == 1);
  const uint64_t off = pin->pages[0].offset + 4096;
  ASSERT_TRUE(c->Release(*pin).ok());
  const int fd = ::open(d->shm_path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(off)), 1);
  byte ^= 0x02;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(off)), 1);
  ::close(fd);
  EXPECT_EQ(loader->Load(codec, s.keys).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(loader->LoadInto(codec, s.keys, slots).status().code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(loader->handles().PublishKeys(codec, "pd-2", hk, "", 10000).ok());
  EXPECT_EQ(loader->LoadHandle(codec, "pd-2").status().code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(loader->handles().Close("pd-2").ok());

  auto st = c->GetStats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->leases, 0u) << "every lease released after the RMA loads";
  EXPECT_EQ(st->pinned_pages, 0u);
}

TEST(UcxDataPlane, DisabledDaemonAnswersFailedPrecondition) {
  auto d = StartDaemon({"--ucx", "off"});
  ASSERT_NE(d, nullptr);
  client::UcxLoaderOptions o;
  o.connect.address = d->address();
  o.net_devices = "lo";
  auto l = client::UcxLoader::Connect(o);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition) << l.status();
}

// kill -9 the daemon while a loader streams RMA batch loads: each load returns verified,
// byte-identical pages or an error (UNAVAILABLE), never hangs past the bound; 10 rounds.
TEST_P(UcxDataPlaneTest, KillDuringTransferTenRounds) {
  const std::string tls = GetParam();
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(round);
    auto d = StartDaemon(DaemonFlags(tls));
    ASSERT_NE(d, nullptr);
    auto c = Connect(d->address());
    ASSERT_NE(c, nullptr);
    const client::Codec codec = RegisterRefmodel(*c);
    Stored s = StorePages(*c, codec, 7000 + round * 100, 48);
    auto loader = Loader(d->address(), tls);
    ASSERT_NE(loader, nullptr);
    std::atomic<bool> stop{false};
    std::atomic<int> ok_loads{0}, errors{0}, bad{0};
    std::atomic<int64_t> worst{0};
    std::thread t([&] {
      for (int i = 0; i < 300 && !stop; ++i) {
        const auto t0 = Clock::now();
        auto r = loader->Load(codec, s.keys);
        const int64_t ms = MsSince(t0);
        if (ms > worst) worst = ms;
        if (!r.ok()) {
          ++errors;
          continue;
        }
        ++ok_loads;
        for (size_t j = 0; j < r->matched; ++j) bad += r->pages[j] != s.pages[j];
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(30 + 7 * round));
    const auto killed = Clock::now();
    d->Kill(SIGKILL);
    // Within the bound, loads fail.
    bool failing = false;
    while (MsSince(killed) < 2500 && !failing) {
      failing = errors.load() > 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop = true;
    t.join();
    std::printf("tls=%s round %d: %d loads ok, %d failed, worst %lld ms\n", tls.c_str(), round,
                ok_loads.load(), errors.load(), static_cast<long long>(worst.load()));
    EXPECT_TRUE(failing) << "loads kept succeeding after kill -9";
    EXPECT_EQ(bad.load(), 0);
    EXPECT_LT(worst.load(), 3000);
  }
}

// The other direction of a vanishing peer: a client killed with -9 while the daemon answers its
// RMA gets (over tcp the daemon itself sends the data back) must not take the daemon down --
// UCX 1.13 aborts the process that owns the worker in that case, which is why the data plane
// runs in its own supervised process. After each of 10 kills the same daemon still serves every
// page, correct, to a new loader within a bounded time.
TEST_P(UcxDataPlaneTest, ClientKilledDuringTransferDaemonKeepsServing) {
  const std::string tls = GetParam();
  auto d = StartDaemon(DaemonFlags(tls));
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  Stored s = StorePages(*c, codec, 9100, 48);
  std::vector<std::string> argv = {OSCARKV_UCX_LOAD_LOOP_PATH, d->address(), tls};
  for (const BlockKey& k : s.keys) argv.push_back(k.Hex());
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(round);
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(out[1], 1);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<char*> a;
      for (auto& x : argv) a.push_back(x.data());
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      ::_exit(127);
    }
    ::close(out[1]);
    // Wait for the first successful load, then kill at a varying point of the next ones.
    std::string line;
    char ch;
    while (line.find('\n') == std::string::npos && ::read(out[0], &ch, 1) == 1) line += ch;
    ::close(out[0]);
    EXPECT_TRUE(absl::StartsWith(line, "loading 48")) << "helper said: " << line;
    std::this_thread::sleep_for(std::chrono::milliseconds(3 + 11 * round));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(d->Running()) << "oscarkvd died after the client was killed in round " << round;
    // The data plane may be restarting (its process can die with the client's endpoint): a new
    // loader gets every page, correct, within a few seconds.
    const auto t0 = Clock::now();
    absl::Status last;
    bool loaded = false;
    while (!loaded && MsSince(t0) < 8000) {
      client::UcxLoaderOptions o;
      o.connect.address = d->address();
      o.connect.data_path = client::DataPath::kGrpc;
      o.tls = tls;
      if (tls == "tcp") o.net_devices = "lo";
      auto l = client::UcxLoader::Connect(o);
      if (!l.ok()) {
        last = l.status();
      } else if (auto r = (*l)->Load(codec, s.keys); !r.ok()) {
        last = r.status();
      } else {
        ASSERT_EQ(r->matched, s.keys.size());
        for (size_t j = 0; j < r->matched; ++j) EXPECT_EQ(r->pages[j], s.pages[j]) << "page " << j;
        loaded = true;
      }
      if (!loaded) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(loaded) << "no successful load within 8 s after the kill; last error: " << last;
    ASSERT_TRUE(d->Running());
  }
  // Give the daemon time to notice the dead endpoints, then check once more.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_TRUE(d->Running());
  auto r = c->Lookup(codec, s.keys);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, s.keys.size());
}

// A raw UCX peer holding the pool's key (an admin's, or any process that reached the loopback
// worker) puts over a committed page, in both shm modes: the data plane maps the pool read-only,
// so the put faults its process (which is restarted) and the page loads intact.
class UcxPoolWriteTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxPoolWriteTest, ARawPutCannotChangeACommittedPage) {
  std::vector<std::string> flags = DaemonFlags("tcp");
  flags.insert(flags.end(), {"--shm-mode", GetParam()});
  auto d = StartDaemon(flags);
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  Stored s = StorePages(*c, codec, 700, 2);
  auto pin = c->Lookup(codec, s.keys, {.pin = true});
  ASSERT_TRUE(pin.ok() && pin->matched == 2);
  const uint64_t offset = pin->pages[0].offset;
  ASSERT_TRUE(c->Release(*pin).ok());

  auto stub = v1::KvCache::NewStub(
      grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials()));
  v1::GetDataPlaneResponse dp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status st = stub->GetDataPlane(&ctx, v1::GetDataPlaneRequest(), &dp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  ASSERT_FALSE(dp.staged());
  auto peer = RawPeer::Connect(dp.worker_address(), 4096);
  ASSERT_NE(peer, nullptr);
  const std::vector<uint8_t> garbage(256, 0x5a);
  const absl::Status put = peer->Put(dp.pool_rkey(), dp.pool_base() + offset + 100, garbage);
  std::printf("shm_mode=%s: raw put over a committed page: %s\n", GetParam().c_str(),
              put.ToString().c_str());
  auto loaded = c->Load(codec, s.keys);
  ASSERT_TRUE(loaded.ok()) << loaded.status() << " (the put changed the page)";
  ASSERT_EQ(loaded->matched, 2u);
  EXPECT_TRUE(loaded->pages[0] == s.pages[0]);
}

INSTANTIATE_TEST_SUITE_P(Modes, UcxPoolWriteTest, ::testing::Values("isolated", "trusted"));

// Side by side on one daemon per UCX transport: the same 40-page prefix loaded 10 times by each
// path (every load includes Lookup + Release and the checksum of every page). Prints MB/s.
TEST(UcxDataPlane, ThroughputSideBySide) {
  for (const std::string tls : {"tcp", "shm"}) {
    auto d = StartDaemon(DaemonFlags(tls));
    ASSERT_NE(d, nullptr);
    auto c = Connect(d->address(), client::DataPath::kSharedMemory);
    auto g = Connect(d->address(), client::DataPath::kGrpc);
    ASSERT_NE(c, nullptr);
    ASSERT_NE(g, nullptr);
    const client::Codec codec = RegisterRefmodel(*c);
    RegisterRefmodel(*g);
    Stored s = StorePages(*c, codec, 900, 40);
    auto loader = Loader(d->address(), tls);
    ASSERT_NE(loader, nullptr);
    auto measure = [&](const char* name, auto load) {
      uint64_t bytes = 0;
      const auto t0 = Clock::now();
      for (int i = 0; i < 10; ++i) bytes += load();
      const double s_ = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("daemon ucx=%s  %-10s %8.1f MB/s  (%llu bytes in %.1f ms)\n", tls.c_str(), name,
                  bytes / s_ / 1e6, static_cast<unsigned long long>(bytes), s_ * 1e3);
    };
    measure(("ucx-" + tls).c_str(), [&]() -> uint64_t {
      auto r = loader->Load(codec, s.keys);
      EXPECT_TRUE(r.ok() && r->matched == 40u);
      return r.ok() ? r->bytes : 0;
    });
    if (tls == "tcp") {
      measure("grpc", [&]() -> uint64_t {
        auto r = g->Load(codec, s.keys);
        EXPECT_TRUE(r.ok() && r->matched == 40u);
        return r.ok() ? r->bytes : 0;
      });
      measure("shm-map", [&]() -> uint64_t {
        auto r = c->Load(codec, s.keys);
        EXPECT_TRUE(r.ok() && r->matched == 40u);
        return r.ok() ? r->bytes : 0;
      });
    }
  }
}

// Starts oscarkvd with `flags`, expecting it to refuse: its stderr.
std::string FailedStart(const std::vector<std::string>& flags) {
  static int seq = 0;
  testing::LocalDaemonOptions o;
  o.binary = OSCARKVD_PATH;
  o.flags = {"--metrics-listen", "off", "--pool-mb", "64", "--shm-name",
             UniqueShmName("oscarkv-ucxexp", seq++)};
  o.flags.insert(o.flags.end(), flags.begin(), flags.end());
  o.log_path = ::testing::TempDir() + "/ucx_exposure_" + std::to_string(::getpid()) + ".log";
  auto d = testing::LocalDaemon::Start(o);
  EXPECT_FALSE(d.ok()) << "started with " << absl::StrJoin(flags, " ");
  std::ifstream f(o.log_path);
  std::stringstream log;
  log << f.rdbuf();
  std::remove(o.log_path.c_str());
  return log.str();
}

// A daemon whose whole-pool data plane another host could reach refuses to start, saying why
// and what to do: the default config on a wildcard or non-loopback listen address (no tenants),
// and devices named beyond loopback on a loopback listen address.
TEST(UcxPoolExposure, OffHostWholePoolDataPlaneIsRefused) {
  const std::string refusal = "oscarkvd: refusing the whole-pool UCX data plane on ";
  std::string log = FailedStart({"--listen", "0.0.0.0:0", "--allow-plaintext"});
  EXPECT_NE(log.find(refusal + "all (UCX_TLS tcp)"), std::string::npos) << log;
  EXPECT_NE(log.find("read and write the entire pool"), std::string::npos) << log;
  EXPECT_NE(log.find("--ucx-allow-unverified-rma"), std::string::npos) << log;
  log = FailedStart({"--ucx-net-devices", "all"});  // on 127.0.0.1
  EXPECT_NE(log.find(refusal + "all"), std::string::npos) << log;
  const auto [ip, dev] = NonLoopbackInterface();
  if (ip.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 interface";
  log = FailedStart({"--listen", ip + ":0", "--allow-plaintext"});
  EXPECT_NE(log.find(refusal + dev + " (UCX_TLS tcp)"), std::string::npos) << log;
  log = FailedStart({"--ucx-net-devices", "lo," + dev});
  EXPECT_NE(log.find(refusal + "lo," + dev), std::string::npos) << log;
  log = FailedStart({"--listen", ip + ":0", "--allow-plaintext", "--ucx-tls", "shm,tcp"});
  EXPECT_NE(log.find(refusal + dev + " (UCX_TLS shm,tcp)"), std::string::npos) << log;
}

// The same non-loopback address starts when the pool data plane stays on this host (loopback
// devices, shared-memory transports only), is off, or is explicitly allowed off-host (flag or
// YAML key); where it runs, a client of this host still loads every page by RMA.
TEST(UcxPoolExposure, OffHostListenStartsWhenThePoolPlaneStaysHereOrIsAllowed) {
  const auto [ip, dev] = NonLoopbackInterface();
  if (ip.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 interface";
  const std::string cfg = ::testing::TempDir() + "/ucx_allow_" + std::to_string(::getpid()) +
                          ".yaml";
  std::ofstream(cfg) << "ucx:\n  tls: tcp\n  allow_unverified_rma: true\n";
  struct Case {
    std::vector<std::string> flags;
    std::string client_tls, client_devices;  // empty tls: no UCX load tried
  };
  const std::vector<Case> cases = {
      {{"--ucx-net-devices", "lo"}, "tcp", "lo"},
      {{"--ucx-tls", "shm"}, "shm", ""},
      {{"--ucx", "off"}, "", ""},
      {{"--ucx-allow-unverified-rma"}, "tcp", dev},
      {{"--config", cfg}, "tcp", dev},
  };
  uint64_t seed = 11000;
  for (const Case& k : cases) {
    SCOPED_TRACE(absl::StrJoin(k.flags, " "));
    std::vector<std::string> flags = {"--listen", ip + ":0", "--allow-plaintext"};
    flags.insert(flags.end(), k.flags.begin(), k.flags.end());
    auto d = StartDaemon(flags);
    ASSERT_NE(d, nullptr);
    if (k.client_tls.empty()) continue;
    auto c = Connect(d->address(), client::DataPath::kGrpc);
    ASSERT_NE(c, nullptr);
    const client::Codec codec = RegisterRefmodel(*c);
    Stored s = StorePages(*c, codec, seed += 100, 4);
    client::UcxLoaderOptions o;
    o.connect.address = d->address();
    o.connect.data_path = client::DataPath::kGrpc;
    o.connect.rpc_timeout_ms = 2000;
    o.tls = k.client_tls;
    o.net_devices = k.client_devices;
    o.peer_timeout_ms = 1000;
    o.transfer_timeout_ms = 1500;
    auto l = client::UcxLoader::Connect(o);
    ASSERT_TRUE(l.ok()) << l.status();
    auto r = (*l)->Load(codec, s.keys);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->matched, 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(r->pages[i], s.pages[i]) << i;
  }
  std::remove(cfg.c_str());
}

INSTANTIATE_TEST_SUITE_P(Tls, UcxDataPlaneTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace oscarkv::testing
