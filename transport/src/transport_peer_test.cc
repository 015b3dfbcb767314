// Two processes on one host: this test (the client) and transport_test_peer (a daemon-like peer
// holding a registered pool of real pages), over UCX with UCX_TLS=tcp (loopback only) and shm.
// Pages are verified end to end: header checksum (ParsePageHeaderStandalone) and exact bytes.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/testing/bootstrap.h"
#include "oscarkv/transport/staging.h"
#include "oscarkv/transport/transport.h"
#include "test_pages.h"

namespace oscarkv::transport {
namespace {

using ::oscarkv::testing::PeerProcess;
using ::oscarkv::testing::RecvBlob;
using ::oscarkv::testing::SendBlob;
using ::oscarkv::testing::ParseControlFd;
using ::oscarkv::testing::UniqueFd;

std::string PeerBinary() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string self(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return self.substr(0, self.rfind('/') + 1) + "transport_test_peer";
}

// A connected peer: the child process, our endpoint to it and its pool.
struct Peer {
  PeerProcess process;
  std::unique_ptr<Endpoint> ep;
  std::unique_ptr<RemoteMemory> pool;
  // Sends a control command and returns the reply.
  std::string Ask(const std::string& cmd) {
    EXPECT_TRUE(SendBlob(process.control_fd(), cmd).ok());
    auto r = RecvBlob(process.control_fd(), absl::Seconds(10));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }
  // Endpoint-side objects go first, then the process (closing the control fd ends it).
  void Release() {
    pool.reset();
    ep.reset();
  }
};

struct Mode {
  std::string name;  // test-name suffix
  std::string tls;   // UCX_TLS of both processes
  EndpointOptions::ErrorHandling error_handling;
  bool ucx_pool;  // the peer's pool from Context::Allocate (else registered user memory)
};

class PeerTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    ContextOptions o;
    o.tls = GetParam().tls;
    o.net_devices = "lo";
    auto ctx = Context::Create(o);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = std::move(*ctx);
    auto w = Worker::Create(*ctx_);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = std::move(*w);
  }

  // Starts a peer with `pages` pages of `shape`/`kind` seeded `seed` and connects to it.
  absl::StatusOr<Peer> StartPeer(const std::string& shape, PageKind kind, uint32_t pages,
                                 uint32_t seed,
                                 absl::Duration peer_timeout = EndpointOptions().peer_timeout) {
    Peer p;
    auto proc = PeerProcess::Spawn(
        {PeerBinary(), absl::StrCat("--tls=", GetParam().tls), absl::StrCat("--shape=", shape),
         absl::StrCat("--kind=", kind == PageKind::kBf16 ? "bf16" : "int2"),
         absl::StrCat("--pages=", pages), absl::StrCat("--seed=", seed), "--max-seconds=60",
         GetParam().ucx_pool ? "--alloc=ucx" : "--alloc=user"},
        {});
    if (!proc.ok()) return proc.status();
    p.process = std::move(*proc);
    auto address = RecvBlob(p.process.control_fd(), absl::Seconds(20));
    if (!address.ok()) return address.status();
    auto memory = RecvBlob(p.process.control_fd(), absl::Seconds(5));
    if (!memory.ok()) return memory.status();
    peer_address_ = *address;
    peer_memory_ = *memory;
    EndpointOptions eo;
    eo.name = absl::StrCat("peer-", p.process.pid());
    eo.error_handling = GetParam().error_handling;
    eo.peer_timeout = peer_timeout;
    auto ep = worker_->Connect(*address, eo);
    if (!ep.ok()) return ep.status();
    p.ep = std::move(*ep);
    auto pool = p.ep->ImportRemote(*memory);
    if (!pool.ok()) return pool.status();
    p.pool = std::move(*pool);
    return p;
  }

  std::string peer_address_, peer_memory_;  // blobs of the last peer started
  std::unique_ptr<Context> ctx_;
  std::vector<std::unique_ptr<Worker>> stale_workers_;  // destroyed after worker_
  std::unique_ptr<Worker> worker_;
};

// Checks slot `slot` of `buf` holds exactly page `index` of the pool seeded `seed`.
void ExpectPage(const CodecProfile& profile, PageKind kind, const uint8_t* page, uint32_t seed,
                uint32_t index) {
  const size_t bytes = GeometryFor(profile, kind).page_bytes();
  ASSERT_TRUE(ParsePageHeaderStandalone({page, bytes}).ok()) << "page " << index;
  std::vector<uint8_t> want(bytes);
  ASSERT_TRUE(testing::FillPage(profile, kind, seed, index, want).ok());
  EXPECT_EQ(std::memcmp(page, want.data(), bytes), 0) << "page " << index << " bytes differ";
}

void GetAndVerify(PeerTest* t, Peer& peer, const std::string& shape, PageKind kind,
                  uint32_t pages, uint32_t seed, Worker& worker, Context& ctx) {
  auto profile = BuiltinProfile(shape);
  ASSERT_TRUE(profile.ok());
  const size_t bytes = GeometryFor(*profile, kind).page_bytes();
  std::vector<uint8_t> local(bytes * pages, 0);
  auto region = ctx.Register(local.data(), local.size());
  ASSERT_TRUE(region.ok()) << region.status();
  // Local slot j receives remote page perm[j]: a shuffled gather, as a lookup hit would do.
  std::vector<uint32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<TransferDesc> descs;
  for (uint32_t j = 0; j < pages; ++j) {
    descs.push_back({local.data() + j * bytes, peer.pool->base() + perm[j] * bytes, bytes});
  }
  absl::Status s = peer.ep->Run(Direction::kGet, **region, *peer.pool, descs, absl::Seconds(30));
  ASSERT_TRUE(s.ok()) << s;
  for (uint32_t j = 0; j < pages; ++j) ExpectPage(*profile, kind, &local[j * bytes], seed, perm[j]);
}

TEST_P(PeerTest, GetsRealPagesVerifiedEndToEnd) {
  auto peer = StartPeer("refmodel", PageKind::kInt2, 64, 7);
  ASSERT_TRUE(peer.ok()) << peer.status();
  GetAndVerify(this, *peer, "refmodel", PageKind::kInt2, 64, 7, *worker_, *ctx_);
  std::vector<std::string> tls = peer->ep->Transports();
  EXPECT_FALSE(tls.empty());
  std::printf("[ %s ] endpoint lanes: %s\n", GetParam().name.c_str(),
              absl::StrJoin(tls, " ").c_str());
  for (const std::string& t : tls) {
    if (GetParam().tls == "tcp") {
      EXPECT_THAT(t, ::testing::StartsWith("tcp/lo")) << t;
    }
    if (GetParam().tls == "shm") {
      EXPECT_THAT(t, ::testing::Not(::testing::StartsWith("tcp"))) << t;
    }
  }
  peer->Release();
  auto exit_code = peer->process.CloseAndWait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
}

TEST_P(PeerTest, GetsQwen3PagesVerifiedEndToEnd) {
  // Qwen3-8B shape: 1.33 MB INT2 pages and 9.44 MB BF16 pages.
  auto int2 = StartPeer("qwen3-8b", PageKind::kInt2, 12, 11);
  ASSERT_TRUE(int2.ok()) << int2.status();
  GetAndVerify(this, *int2, "qwen3-8b", PageKind::kInt2, 12, 11, *worker_, *ctx_);
  auto bf16 = StartPeer("qwen3-8b", PageKind::kBf16, 3, 12);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  GetAndVerify(this, *bf16, "qwen3-8b", PageKind::kBf16, 3, 12, *worker_, *ctx_);
}

TEST_P(PeerTest, PutsRealPagesVerifiedAtThePeer) {
  const uint32_t pages = 48;
  auto peer = StartPeer("refmodel", PageKind::kInt2, pages, 3);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto profile = BuiltinProfile("refmodel");
  const size_t bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  // Our pages (seed 99) go into the peer's slots in reverse order.
  std::vector<uint8_t> mine(bytes * pages);
  for (uint32_t i = 0; i < pages; ++i) {
    ASSERT_TRUE(testing::FillPage(*profile, PageKind::kInt2, 99, i, {&mine[i * bytes], bytes}).ok());
  }
  auto region = ctx_->Register(mine.data(), mine.size());
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<TransferDesc> descs;
  for (uint32_t i = 0; i < pages; ++i) {
    descs.push_back({&mine[i * bytes], peer->pool->base() + (pages - 1 - i) * bytes, bytes});
  }
  auto t = peer->ep->Post(Direction::kPut, **region, *peer->pool, descs);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ((*t)->num_ok(), pages);
  t->reset();
  // The peer checks every slot's checksum itself...
  EXPECT_EQ(peer->Ask("count-valid"), absl::StrCat(pages));
  // ...and reading the slots back gives exactly our pages.
  std::vector<uint8_t> back(bytes * pages, 0);
  auto back_region = ctx_->Register(back.data(), back.size());
  ASSERT_TRUE(back_region.ok());
  std::vector<TransferDesc> read;
  for (uint32_t i = 0; i < pages; ++i) {
    read.push_back({&back[i * bytes], peer->pool->base() + i * bytes, bytes});
  }
  ASSERT_TRUE(peer->ep->Run(Direction::kGet, **back_region, *peer->pool, read, absl::Seconds(30)).ok());
  for (uint32_t i = 0; i < pages; ++i) {
    ExpectPage(*profile, PageKind::kInt2, &back[i * bytes], 99, pages - 1 - i);
  }
}

TEST_P(PeerTest, PeerKilledMidBatchFailsInBoundAndNeverReportsBadPages) {
  const uint32_t pages = 64, seed = 21;
  const absl::Duration bound = absl::Seconds(1);
  auto peer = StartPeer("refmodel", PageKind::kInt2, pages, seed, bound);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto profile = BuiltinProfile("refmodel");
  const size_t bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  // Each op has its own destination slot, so an op reported OK owns its bytes.
  const uint32_t ops = 512;
  std::vector<uint8_t> local(bytes * ops);
  auto region = ctx_->Register(local.data(), local.size());
  ASSERT_TRUE(region.ok());
  std::vector<TransferDesc> descs;
  for (uint32_t j = 0; j < ops; ++j) {
    descs.push_back({&local[j * bytes], peer->pool->base() + (j % pages) * bytes, bytes});
  }

  std::vector<std::vector<uint8_t>> expected(pages, std::vector<uint8_t>(bytes));
  for (uint32_t i = 0; i < pages; ++i) {
    ASSERT_TRUE(testing::FillPage(*profile, PageKind::kInt2, seed, i, expected[i]).ok());
  }
  std::atomic<int64_t> killed_at_ns{0};
  const pid_t pid = peer->process.pid();
  std::jthread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ::kill(pid, SIGKILL);
    killed_at_ns = absl::ToUnixNanos(absl::Now());
  });
  absl::Status failure;
  int batches = 0, batches_after_kill = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(15);
  while (absl::Now() < give_up) {
    const int64_t k = killed_at_ns.load();
    if (k != 0 && batches_after_kill > 0 &&
        absl::Now() - absl::FromUnixNanos(k) > absl::Seconds(3)) {
      break;
    }
    if (k != 0) ++batches_after_kill;
    std::fill(local.begin(), local.end(), 0);
    auto t = peer->ep->Post(Direction::kGet, **region, *peer->pool, descs);
    if (!t.ok()) {
      failure = t.status();
      break;
    }
    absl::Status s = (*t)->Wait(absl::Seconds(10));
    ++batches;
    ASSERT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << "batch hung: " << s;
    for (uint32_t j = 0; j < ops; ++j) {
      if (!(*t)->op_status(j).ok()) continue;
      const uint8_t* got = &local[j * bytes];
      ASSERT_TRUE(ParsePageHeaderStandalone({got, bytes}).ok()) << "op " << j << " reported OK";
      ASSERT_EQ(std::memcmp(got, expected[j % pages].data(), bytes), 0) << "op " << j;
    }
    if (!s.ok()) {
      failure = s;
      break;
    }
  }
  killer.join();
  const absl::Time killed = absl::FromUnixNanos(killed_at_ns.load());
  const absl::Duration detect = absl::Now() - killed;
  std::printf("[ %s ] peer SIGKILLed during batch %d; %d batches after; then after %s: %s\n",
              GetParam().name.c_str(), batches - batches_after_kill, batches_after_kill,
              absl::FormatDuration(detect).c_str(), failure.ToString().c_str());
  if (GetParam().error_handling == EndpointOptions::ErrorHandling::kNone && GetParam().ucx_pool &&
      failure.ok()) {
    // A UCX-allocated pool is a shared segment this process has mapped: RMA on it needs nothing
    // from the peer, so gets keep returning its pages after the peer died -- every one of them
    // verified above. Nothing is corrupted; the control plane (gRPC) notices the death.
    EXPECT_GT(batches_after_kill, 0);
  } else {
    ASSERT_FALSE(failure.ok()) << "no error within 3 s of SIGKILL (" << batches << " batches)";
    EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
    // Ops already answered before the kill may still land; after the last completion the
    // watchdog waits peer_timeout, then at most ~0.35 s of forced close and drain; plus slack
    // for this shared 2-core machine.
    EXPECT_LT(detect, bound + absl::Milliseconds(1500)) << failure;
  }
  EXPECT_EQ(peer->ep->failed(), !failure.ok());
  peer->Release();
  peer->process.Kill(SIGKILL);  // reap

  // The process recovers: a new peer, a new endpoint, verified pages. With peer error handling
  // the same worker is reused; without it (shm), requests abandoned to the dead peer can stay
  // queued on the worker's shared-memory interfaces, so a fresh worker is the documented path.
  if (GetParam().error_handling == EndpointOptions::ErrorHandling::kNone) {
    auto w = Worker::Create(*ctx_);
    ASSERT_TRUE(w.ok()) << w.status();
    stale_workers_.push_back(std::move(worker_));
    worker_ = std::move(*w);
  }
  auto again = StartPeer("refmodel", PageKind::kInt2, 16, 5);
  ASSERT_TRUE(again.ok()) << again.status();
  GetAndVerify(this, *again, "refmodel", PageKind::kInt2, 16, 5, *worker_, *ctx_);
}

TEST_P(PeerTest, StagesUnregisteredBuffersThroughABounceBuffer) {
  // Stand-in for GPU memory when UCX lacks CUDA: plain memory that is never registered, reached
  // only through the staging copy function.
  const uint32_t pages = 24, seed = 13;
  auto peer = StartPeer("refmodel", PageKind::kInt2, pages, seed);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto profile = BuiltinProfile("refmodel");
  const size_t bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  // 3 pages of bounce: halves of 1.5 pages, so pages are split across chunks.
  auto staging = StagingBuffer::Create(*ctx_, 3 * bytes);
  ASSERT_TRUE(staging.ok()) << staging.status();
  std::vector<uint8_t> device(bytes * pages, 0);
  size_t copies = 0;
  auto copy = [&](void* dst, const void* src, size_t n) {
    ++copies;
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  };
  std::vector<TransferDesc> descs;
  for (uint32_t i = 0; i < pages; ++i) {  // reversed gather
    descs.push_back({&device[i * bytes], peer->pool->base() + (pages - 1 - i) * bytes, bytes});
  }
  ASSERT_TRUE((*staging)->Get(*peer->ep, *peer->pool, descs, copy, absl::Seconds(30)).ok());
  EXPECT_GT(copies, pages);  // split pages take two copies
  for (uint32_t i = 0; i < pages; ++i) {
    ExpectPage(*profile, PageKind::kInt2, &device[i * bytes], seed, pages - 1 - i);
  }
  // Put back in the original order, then the peer verifies every slot.
  std::vector<TransferDesc> back;
  for (uint32_t i = 0; i < pages; ++i) {
    back.push_back({&device[i * bytes], peer->pool->base() + i * bytes, bytes});
  }
  ASSERT_TRUE((*staging)->Put(*peer->ep, *peer->pool, back, copy, absl::Seconds(30)).ok());
  EXPECT_EQ(peer->Ask("count-valid"), absl::StrCat(pages));
  EXPECT_EQ((*staging)->Get(*peer->ep, *peer->pool,
                            std::vector<TransferDesc>{{device.data(), peer->pool->base() + 1, 0}},
                            copy)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(PeerTest, PeerKilledDuringPutBatchNeverHangs) {
  const uint32_t pages = 64;
  const absl::Duration bound = absl::Seconds(1);
  auto peer = StartPeer("refmodel", PageKind::kInt2, pages, 2, bound);
  ASSERT_TRUE(peer.ok()) << peer.status();
  auto profile = BuiltinProfile("refmodel");
  const size_t bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  std::vector<uint8_t> mine(bytes * pages);
  for (uint32_t i = 0; i < pages; ++i) {
    ASSERT_TRUE(testing::FillPage(*profile, PageKind::kInt2, 4, i, {&mine[i * bytes], bytes}).ok());
  }
  auto region = ctx_->Register(mine.data(), mine.size());
  ASSERT_TRUE(region.ok());
  std::vector<TransferDesc> descs;
  for (uint32_t j = 0; j < 512; ++j) {
    descs.push_back({&mine[(j % pages) * bytes], peer->pool->base() + (j % pages) * bytes, bytes});
  }
  std::atomic<int64_t> killed_at_ns{0};
  const pid_t pid = peer->process.pid();
  std::jthread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ::kill(pid, SIGKILL);
    killed_at_ns = absl::ToUnixNanos(absl::Now());
  });
  absl::Status failure;
  int after = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(15);
  while (absl::Now() < give_up) {
    const int64_t k = killed_at_ns.load();
    if (k != 0 && after > 0 && absl::Now() - absl::FromUnixNanos(k) > absl::Seconds(3)) break;
    if (k != 0) ++after;
    auto t = peer->ep->Post(Direction::kPut, **region, *peer->pool, descs);
    if (!t.ok()) {
      failure = t.status();
      break;
    }
    absl::Status s = (*t)->Wait(absl::Seconds(10));
    ASSERT_NE(s.code(), absl::StatusCode::kDeadlineExceeded) << "put batch hung: " << s;
    if (!s.ok()) {
      // A failed put batch never reports an op as landed.
      EXPECT_EQ((*t)->num_ok(), 0u) << s;
      failure = s;
      break;
    }
  }
  killer.join();
  const absl::Duration detect = absl::Now() - absl::FromUnixNanos(killed_at_ns.load());
  std::printf("[ %s ] put: peer SIGKILLed; after %s: %s\n", GetParam().name.c_str(),
              absl::FormatDuration(detect).c_str(), failure.ToString().c_str());
  if (GetParam().error_handling == EndpointOptions::ErrorHandling::kNone && GetParam().ucx_pool &&
      failure.ok()) {
    return;  // puts into the dead peer's still-mapped segment complete; nobody reads them
  }
  ASSERT_FALSE(failure.ok());
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
  EXPECT_LT(detect, bound + absl::Milliseconds(1500)) << failure;
  peer->Release();
}

TEST_P(PeerTest, OneContextManyThreadsEachWithItsWorker) {
  // The documented threading model: the Context (Register) is shared, each thread drives its own
  // Worker and Endpoint to the same peer.
  const uint32_t pages = 32, seed = 17;
  Peer first;
  {
    auto peer = StartPeer("refmodel", PageKind::kInt2, pages, seed);
    ASSERT_TRUE(peer.ok()) << peer.status();
    first = std::move(*peer);
  }
  auto profile = BuiltinProfile("refmodel");
  const size_t bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  const uint64_t base = first.pool->base();
  std::vector<std::vector<uint8_t>> expected(pages, std::vector<uint8_t>(bytes));
  for (uint32_t i = 0; i < pages; ++i) {
    ASSERT_TRUE(testing::FillPage(*profile, PageKind::kInt2, seed, i, expected[i]).ok());
  }
  std::vector<std::string> errors(4);
  {
    std::vector<std::jthread> threads;
    for (int th = 0; th < 4; ++th) {
      threads.emplace_back([&, th] {
        auto fail = [&](const absl::Status& s) { errors[th] = s.ToString(); };
        auto w = Worker::Create(*ctx_);
        if (!w.ok()) return fail(w.status());
        std::vector<uint8_t> local(bytes * pages);
        auto region = ctx_->Register(local.data(), local.size());  // concurrent registration
        if (!region.ok()) return fail(region.status());
        EndpointOptions eo;
        eo.error_handling = GetParam().error_handling;
        auto ep = (*w)->Connect(peer_address_, eo);
        if (!ep.ok()) return fail(ep.status());
        auto remote = (*ep)->ImportRemote(peer_memory_);
        if (!remote.ok()) return fail(remote.status());
        for (int round = 0; round < 5; ++round) {
          std::vector<TransferDesc> d;
          for (uint32_t i = 0; i < pages; ++i) {
            const uint32_t src = (i + th + round) % pages;
            d.push_back({&local[i * bytes], base + src * bytes, bytes});
          }
          if (absl::Status s = (*ep)->Run(Direction::kGet, **region, **remote, d,
                                          absl::Seconds(30));
              !s.ok()) {
            return fail(s);
          }
          for (uint32_t i = 0; i < pages; ++i) {
            const uint32_t src = (i + th + round) % pages;
            if (std::memcmp(&local[i * bytes], expected[src].data(), bytes) != 0) {
              return fail(absl::DataLossError(absl::StrCat("page ", src, " differs")));
            }
          }
        }
      });
    }
  }
  for (int th = 0; th < 4; ++th) EXPECT_EQ(errors[th], "") << "thread " << th;
}

// CPU seconds (user + system) used so far by process `pid`.
double CpuSeconds(pid_t pid) {
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[2048];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Fields after the ")" of the command name: state is field 3; utime, stime are 14 and 15.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return -1;
  std::vector<std::string> w = absl::StrSplit(p + 2, ' ');
  double ut = 0, st = 0;
  if (w.size() < 13 || !absl::SimpleAtod(w[11], &ut) || !absl::SimpleAtod(w[12], &st)) return -1;
  return (ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

TEST_P(PeerTest, IdleServingAndWaitingDoNotSpin) {
  auto peer = StartPeer("refmodel", PageKind::kInt2, 8, 1);
  ASSERT_TRUE(peer.ok()) << peer.status();
  GetAndVerify(this, *peer, "refmodel", PageKind::kInt2, 8, 1, *worker_, *ctx_);
  // The peer serves (progress + sleep on its event fd) with nothing to do for a second.
  const double before = CpuSeconds(peer->process.pid());
  absl::SleepFor(absl::Seconds(1));
  const double used = CpuSeconds(peer->process.pid()) - before;
  ASSERT_GE(before, 0);
  EXPECT_LT(used, 0.1) << "an idle serving peer used " << used << " CPU seconds in 1 s";
  // Our own idle waiting: Worker::WaitForEvents for a second costs next to no CPU either.
  const double self_before = CpuSeconds(getpid());
  for (int i = 0; i < 10; ++i) worker_->WaitForEvents(absl::Milliseconds(100));
  EXPECT_LT(CpuSeconds(getpid()) - self_before, 0.1);
  std::printf("[ %s ] idle peer: %.3f CPU s per s\n", GetParam().name.c_str(), used);
}

INSTANTIATE_TEST_SUITE_P(
    Transports, PeerTest,
    ::testing::Values(Mode{"tcp", "tcp", EndpointOptions::ErrorHandling::kPeer, false},
                      Mode{"tcp_ucxpool", "tcp", EndpointOptions::ErrorHandling::kPeer, true},
                      Mode{"shm", "shm", EndpointOptions::ErrorHandling::kNone, false},
                      Mode{"shm_ucxpool", "shm", EndpointOptions::ErrorHandling::kNone, true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace oscarkv::transport
