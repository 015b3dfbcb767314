// The same-host control path (Lookup/Release over oscarkvd's local socket) against a real
// daemon: answers equal gRPC's, pipelined async lookups, large lookups and fallbacks to gRPC,
// and a daemon that dies under a client.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <thread>

#include "oscarkv/v1/local_control.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using client::LookupPath;
using client::PageWrite;

std::unique_ptr<client::Client> ConnectPath(const std::string& addr, LookupPath path,
                                            bool dedicated = false) {
  client::ConnectOptions o;
  o.address = addr;
  o.lookup_path = path;
  o.dedicated_connection = dedicated;
  auto c = client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

void ExpectSame(const absl::StatusOr<client::LookupResult>& a,
                const absl::StatusOr<client::LookupResult>& b, const std::string& what) {
  ASSERT_EQ(a.ok(), b.ok()) << what << ": " << a.status() << " vs " << b.status();
  if (!a.ok()) {
    EXPECT_EQ(a.status().code(), b.status().code()) << what;
    EXPECT_EQ(a.status().message(), b.status().message()) << what;
    return;
  }
  EXPECT_EQ(a->matched, b->matched) << what;
  EXPECT_EQ(a->lease_ids.size(), b->lease_ids.size()) << what;
  ASSERT_EQ(a->pages.size(), b->pages.size()) << what;
  for (size_t i = 0; i < a->pages.size(); ++i) {
    EXPECT_EQ(a->pages[i].key, b->pages[i].key) << what << " page " << i;
    EXPECT_EQ(a->pages[i].offset, b->pages[i].offset) << what << " page " << i;
    EXPECT_EQ(a->pages[i].bytes, b->pages[i].bytes) << what << " page " << i;
    EXPECT_EQ(a->pages[i].kind, b->pages[i].kind) << what << " page " << i;
    EXPECT_EQ(a->pages[i].token_count, b->pages[i].token_count) << what << " page " << i;
  }
}

TEST(LocalPathTest, LookupReleaseAndLoadEqualGrpc) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto local = ConnectPath(daemon->address(), LookupPath::kLocal);
  auto grpc = ConnectPath(daemon->address(), LookupPath::kGrpc);
  auto autop = ConnectPath(daemon->address(), LookupPath::kAuto);
  ASSERT_TRUE(local && grpc && autop);
  EXPECT_EQ(local->server().lookup_path, LookupPath::kLocal);
  EXPECT_EQ(grpc->server().lookup_path, LookupPath::kGrpc);
  EXPECT_EQ(autop->server().lookup_path, LookupPath::kLocal) << "auto must pick the local socket";
  EXPECT_EQ(local->server().local_socket, daemon->shm_path() + ".sock");
  EXPECT_EQ(daemon->local_socket(), local->server().local_socket);
  const client::Codec codec = RegisterRefmodel(*local);
  ASSERT_TRUE(grpc->RegisterCodec(codec.profile).ok());

  const size_t n = 24;
  const auto keys = client::Client::BlockKeys(codec, Tokens(5, n * codec.profile.page_tokens));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < n; ++i) pages.push_back(MakePage(codec.profile, PageKind::kInt2, 40 + i));
  for (size_t i = 0; i < n; ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});
  ASSERT_EQ(local->Store(codec, writes)->stored, n);

  std::vector<BlockKey> partial(keys.begin(), keys.begin() + 10);
  const auto other = client::Client::BlockKeys(codec, Tokens(6, 4 * codec.profile.page_tokens));
  partial.insert(partial.end(), other.begin(), other.end());
  client::Codec unknown = codec;
  unknown.id.bytes[0] ^= 1;
  for (bool pin : {false, true}) {
    const client::LookupOptions opt{.pin = pin, .lease_ms = 20000};
    auto l = local->Lookup(codec, keys, opt);
    auto g = grpc->Lookup(codec, keys, opt);
    ExpectSame(l, g, pin ? "full, pinned" : "full, probe");
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->matched, n);
    EXPECT_EQ(l->pages.size(), pin ? n : 0u);
    auto la = local->LookupAsync(codec, keys, opt).get();
    ExpectSame(la, g, "async full");
    auto lp = local->Lookup(codec, partial, opt);
    auto gp = grpc->Lookup(codec, partial, opt);
    ExpectSame(lp, gp, "partial");
    ASSERT_TRUE(lp.ok());
    EXPECT_EQ(lp->matched, 10u);
    ExpectSame(local->Lookup(unknown, keys, opt), grpc->Lookup(unknown, keys, opt),
               "unknown codec");
    EXPECT_EQ(local->Lookup(unknown, keys, opt).status().code(), absl::StatusCode::kNotFound);
    if (pin) {
      EXPECT_EQ(local->GetStats()->leases, 5u);
      // A lease taken over one path may be released over the other: it is the daemon's lease.
      EXPECT_TRUE(local->Release(*g).ok());
      EXPECT_TRUE(grpc->Release(*l).ok());
      EXPECT_TRUE(local->Release(*la).ok());
      EXPECT_TRUE(local->Release(*lp).ok());
      EXPECT_TRUE(grpc->Release(*gp).ok());
      EXPECT_TRUE(local->Release(*lp).ok()) << "releasing twice is OK";
      EXPECT_EQ(local->GetStats()->leases, 0u);
      EXPECT_EQ(local->GetStats()->pinned_pages, 0u);
    }
  }
  // Load = pinning Lookup + copy + Release: over the local control path too, byte-identical.
  auto got = local->Load(codec, keys);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->matched, n);
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(got->pages[i] == pages[i]) << i;
  EXPECT_EQ(local->GetStats()->leases, 0u);
}

// More keys than a local frame holds: the client sends that lookup over gRPC (same answer).
TEST(LocalPathTest, LookupLargerThanAFrameGoesOverGrpc) {
  auto daemon = StartDaemon({"--max-batch", "8192"});
  ASSERT_NE(daemon, nullptr);
  auto local = ConnectPath(daemon->address(), LookupPath::kLocal);
  ASSERT_NE(local, nullptr);
  const client::Codec codec = RegisterRefmodel(*local);
  const size_t n = v1::local::kMaxLookupKeys + 100;
  const auto keys = client::Client::BlockKeys(codec, Tokens(8, n * codec.profile.page_tokens));
  ASSERT_EQ(local->Store(codec, std::vector<PageWrite>{{keys[0], PageKind::kInt2,
                                                        MakePage(codec.profile, PageKind::kInt2, 1)}})
                ->stored,
            1u);
  auto r = local->Lookup(codec, keys, {.pin = true});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 1u);
  EXPECT_EQ(r->lease_ids.size(), 1u);
  EXPECT_TRUE(local->Release(*r).ok());
  auto a = local->LookupAsync(codec, keys).get();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->matched, 1u);
  auto small = local->Lookup(codec, std::span(keys).first(3));
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->matched, 1u);
}

// No local socket, or one this process cannot reach: kAuto uses gRPC, kLocal fails Connect.
TEST(LocalPathTest, FallsBackToGrpcWhenTheSocketIsOffOrUnreachable) {
  {
    auto daemon = StartDaemon({"--local-socket", "off"});
    ASSERT_NE(daemon, nullptr);
    auto a = ConnectPath(daemon->address(), LookupPath::kAuto);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->server().lookup_path, LookupPath::kGrpc);
    EXPECT_EQ(a->server().local_socket, "");
    const client::Codec codec = RegisterRefmodel(*a);
    EXPECT_TRUE(a->Lookup(codec, client::Client::BlockKeys(codec, Tokens(1, 256))).ok());
    client::ConnectOptions o;
    o.address = daemon->address();
    o.lookup_path = LookupPath::kLocal;
    auto l = client::Client::Connect(o);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition) << l.status();
  }
  {
    auto daemon = StartDaemon();
    ASSERT_NE(daemon, nullptr);
    // The socket file gone (as for a client in another mount namespace): unreachable.
    ASSERT_EQ(::unlink((daemon->shm_path() + ".sock").c_str()), 0);
    auto a = ConnectPath(daemon->address(), LookupPath::kAuto);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->server().lookup_path, LookupPath::kGrpc);
    client::ConnectOptions o;
    o.address = daemon->address();
    o.lookup_path = LookupPath::kLocal;
    auto l = client::Client::Connect(o);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kUnavailable) << l.status();
    EXPECT_NE(l.status().message().find("local control socket"), std::string::npos);
  }
}

// Many threads of one process, shared and dedicated channels, pipelined LookupAsync: every
// callback runs once with the right answer.
TEST(LocalPathTest, PipelinedAsyncLookupsFromManyThreads) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto setup = ConnectPath(daemon->address(), LookupPath::kLocal);
  ASSERT_NE(setup, nullptr);
  const client::Codec codec = RegisterRefmodel(*setup);
  const auto keys = client::Client::BlockKeys(codec, Tokens(3, 8 * codec.profile.page_tokens));
  std::vector<std::vector<uint8_t>> pages;
  std::vector<PageWrite> writes;
  for (size_t i = 0; i < 5; ++i) pages.push_back(MakePage(codec.profile, PageKind::kInt2, i));
  for (size_t i = 0; i < 5; ++i) writes.push_back({keys[i], PageKind::kInt2, pages[i]});
  ASSERT_EQ(setup->Store(codec, writes)->stored, 5u);

  constexpr int kThreads = 6, kPerThread = 400;
  std::vector<std::unique_ptr<client::Client>> clients;
  for (int i = 0; i < kThreads; ++i) {
    clients.push_back(ConnectPath(daemon->address(), LookupPath::kLocal, i % 2 == 0));
    ASSERT_NE(clients.back(), nullptr);
  }
  std::atomic<int> ok{0}, bad{0}, calls{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const size_t len = 1 + static_cast<size_t>(i + t) % keys.size();
        const uint32_t want = static_cast<uint32_t>(std::min<size_t>(len, 5));
        clients[t]->LookupAsync(codec, std::span(keys).first(len), {},
                                [&, want](absl::StatusOr<client::LookupResult> r) {
                                  ++calls;
                                  (r.ok() && r->matched == want ? ok : bad)++;
                                });
      }
    });
  }
  for (auto& th : threads) th.join();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (calls.load() < kThreads * kPerThread && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  clients.clear();  // waits for callbacks in flight
  EXPECT_EQ(calls.load(), kThreads * kPerThread);
  EXPECT_EQ(ok.load(), kThreads * kPerThread);
  EXPECT_EQ(bad.load(), 0);
}

// A daemon that stops answering (SIGSTOP): blocking and async local lookups fail with
// DEADLINE_EXCEEDED after the RPC timeout, and work again once it resumes (the late answers
// of the timed-out calls are dropped, never delivered to later calls).
TEST(LocalPathTest, StalledDaemonTimesOutThenRecovers) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  client::ConnectOptions o;
  o.address = daemon->address();
  o.lookup_path = LookupPath::kLocal;
  o.rpc_timeout_ms = 400;
  o.dedicated_connection = true;
  auto c = client::Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const client::Codec codec = RegisterRefmodel(**c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(9, 3 * codec.profile.page_tokens));
  ASSERT_EQ((*c)->Store(codec, std::vector<PageWrite>{{keys[0], PageKind::kInt2,
                                                       MakePage(codec.profile, PageKind::kInt2, 3)}})
                ->stored,
            1u);
  ASSERT_TRUE((*c)->LookupAsync(codec, keys).get().ok());  // opens the async connection
  ASSERT_EQ(::kill(daemon->pid(), SIGSTOP), 0);
  // kill() returns before the process is stopped: wait until /proc says it is ('T').
  bool stopped = false;
  for (int i = 0; i < 400 && !stopped; ++i) {
    std::ifstream f("/proc/" + std::to_string(daemon->pid()) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    stopped = close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(stopped) << "oscarkvd did not stop";
  const auto t0 = std::chrono::steady_clock::now();
  auto async = (*c)->LookupAsync(codec, keys);
  auto r = (*c)->Lookup(codec, keys);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  auto a = async.get();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded) << a.status();
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(350));
  EXPECT_LT(waited, std::chrono::seconds(3));
  ASSERT_EQ(::kill(daemon->pid(), SIGCONT), 0);
  for (int i = 0; i < 3; ++i) {
    auto again = (*c)->LookupAsync(codec, keys).get();
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->matched, 1u);
    auto sync = (*c)->Lookup(codec, keys);
    ASSERT_TRUE(sync.ok()) << sync.status();
    EXPECT_EQ(sync->matched, 1u);
  }
}

// The daemon dies under a local client: blocking and async lookups fail with UNAVAILABLE
// promptly instead of hanging.
TEST(LocalPathTest, DaemonDeathFailsLocalCallsPromptly) {
  auto daemon = StartDaemon();
  ASSERT_NE(daemon, nullptr);
  auto c = ConnectPath(daemon->address(), LookupPath::kLocal);
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const auto keys = client::Client::BlockKeys(codec, Tokens(4, 256));
  ASSERT_TRUE(c->Lookup(codec, keys).ok());
  ASSERT_TRUE(c->LookupAsync(codec, keys).get().ok());
  daemon->Kill(SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c->Lookup(codec, keys);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  auto a = c->LookupAsync(codec, keys).get();
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable) << a.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  struct stat st;
  EXPECT_NE(::lstat(daemon->local_socket().c_str(), &st), 0) << "LocalDaemon left the socket";
}

}  // namespace
}  // namespace oscarkv::testing
