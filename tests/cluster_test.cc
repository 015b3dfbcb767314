// Three oscarkvd processes as one cluster: store through one ClusterClient, load through
// another; kill -9 a member during batch loads (misses within the bound, no hang, every returned
// page byte-identical to what was stored and checksum-verified); rejoin after restart; a member
// that hangs between a transfer and its lease release is reported down by that call. Runs on
// loopback ports, and with each daemon in its own network namespace ("host") when
// `ip netns add` works here.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <set>
#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "oscarkv/client/cluster_client.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

using Clock = std::chrono::steady_clock;
using client::ClusterClient;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Network namespaces "hosts": ns i has veth peer 10.213.<p>.<4i+2>/30, the root side
// 10.213.<p>.<4i+1>, p = pid % 256: test processes that run at the same time (ctest -j, or two
// checkouts on one machine) get distinct subnets (with one fixed subnet for every process, two
// concurrent netns tests routed each other's daemons away and failed: members never live).
// Every namespace and link is created and deleted by this test.
class NetnsHosts {
 public:
  static std::unique_ptr<NetnsHosts> Create(int n) {
    auto h = std::unique_ptr<NetnsHosts>(new NetnsHosts);
    const std::string tag = std::to_string(::getpid() % 100000);
    for (int i = 0; i < n; ++i) {
      const std::string ns = absl::StrCat("okvt", tag, "n", i);
      const std::string a = absl::StrCat("okv", tag, "a", i), b = absl::StrCat("okv", tag, "b", i);
      h->names_.push_back(ns);
      h->links_.push_back(a);
      const std::string net = absl::StrCat("10.213.", ::getpid() % 256, ".");
      const std::string root_ip = absl::StrCat(net, 4 * i + 1), peer_ip = absl::StrCat(net, 4 * i + 2);
      const std::string cmd = absl::StrCat(
          "ip netns add ", ns, " && ip link add ", a, " type veth peer name ", b,
          " && ip link set ", b, " netns ", ns, " && ip addr add ", root_ip, "/30 dev ", a,
          " && ip link set ", a, " up && ip netns exec ", ns, " ip addr add ", peer_ip, "/30 dev ", b,
          " && ip netns exec ", ns, " ip link set ", b, " up && ip netns exec ", ns,
          " ip link set lo up");
      if (std::system((cmd + " 2>/dev/null").c_str()) != 0) return nullptr;
      h->addrs_.push_back(peer_ip);
    }
    return h;
  }
  ~NetnsHosts() {
    for (const auto& l : links_) std::system(("ip link del " + l + " 2>/dev/null").c_str());
    for (const auto& n : names_) std::system(("ip netns del " + n + " 2>/dev/null").c_str());
  }
  const std::string& ns(int i) const { return names_[i]; }
  const std::string& ip(int i) const { return addrs_[i]; }

 private:
  std::vector<std::string> names_, links_, addrs_;
};

namespace pb = ::oscarkv::v1;

// A member seen through a gRPC proxy that forwards every call to one real daemon and can make
// lease releases hang until the caller's deadline: the member serves a Load's lookup and pages,
// then stops answering. (SIGSTOP cannot be timed to land between the transfer and the release.)
// It presents itself as a remote member -- no local socket, no shared memory -- so every call
// of a client goes through it. UCX page gets still go straight to the daemon's worker.
class ReleaseHangProxy final : public pb::KvCache::Service {
 public:
  static std::unique_ptr<ReleaseHangProxy> Start(const std::string& upstream) {
    auto p = std::unique_ptr<ReleaseHangProxy>(new ReleaseHangProxy(upstream));
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(p.get());
    p->server_ = b.BuildAndStart();
    if (p->server_ == nullptr || port == 0) return nullptr;
    p->address_ = absl::StrCat("127.0.0.1:", port);
    return p;
  }
  ~ReleaseHangProxy() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }

  const std::string& address() const { return address_; }
  void HangReleases(bool on) { hang_releases_ = on; }
  int hung_releases() const { return hung_releases_.load(); }
  int calls() const { return calls_.load(); }  // every call that reached the proxy

  grpc::Status Handshake(grpc::ServerContext* ctx, const pb::HandshakeRequest* req,
                         pb::HandshakeResponse* resp) override {
    grpc::Status s = Forward(ctx, &pb::KvCache::Stub::Handshake, *req, resp);
    resp->clear_local_socket();
    resp->clear_shm_path();
    resp->clear_shm_bytes();
    return s;
  }
  grpc::Status Release(grpc::ServerContext* ctx, const pb::ReleaseRequest* req,
                       pb::ReleaseResponse* resp) override {
    if (!hang_releases_) return Forward(ctx, &pb::KvCache::Stub::Release, *req, resp);
    ++calls_;
    ++hung_releases_;
    while (!ctx->IsCancelled() && std::chrono::system_clock::now() < ctx->deadline()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "release hung (test proxy)");
  }
#define OSCARKV_FORWARD(M)                                                               \
  grpc::Status M(grpc::ServerContext* ctx, const pb::M##Request* req, pb::M##Response* resp) \
      override {                                                                          \
    return Forward(ctx, &pb::KvCache::Stub::M, *req, resp);                               \
  }
  OSCARKV_FORWARD(RegisterCodec)
  OSCARKV_FORWARD(Lookup)
  OSCARKV_FORWARD(Reserve)
  OSCARKV_FORWARD(Commit)
  OSCARKV_FORWARD(Abort)
  OSCARKV_FORWARD(RenewLease)
  OSCARKV_FORWARD(Delete)
  OSCARKV_FORWARD(Stats)
  OSCARKV_FORWARD(PublishHandle)
  OSCARKV_FORWARD(OpenHandle)
  OSCARKV_FORWARD(CloseHandle)
  OSCARKV_FORWARD(GetDataPlane)
#undef OSCARKV_FORWARD
  grpc::Status ReadPages(grpc::ServerContext* ctx, const pb::ReadRequest* req,
                         grpc::ServerWriter<pb::ReadChunk>* out) override {
    ++calls_;
    grpc::ClientContext c;
    c.set_deadline(ctx->deadline());
    auto in = upstream_->ReadPages(&c, *req);
    pb::ReadChunk chunk;
    while (in->Read(&chunk)) {
      if (!out->Write(chunk)) {
        c.TryCancel();
        break;
      }
    }
    return in->Finish();
  }
  grpc::Status WritePages(grpc::ServerContext* ctx, grpc::ServerReader<pb::WriteChunk>* in,
                          pb::WriteResponse* resp) override {
    ++calls_;
    grpc::ClientContext c;
    c.set_deadline(ctx->deadline());
    auto out = upstream_->WritePages(&c, resp);
    pb::WriteChunk chunk;
    bool open = true;
    while (open && in->Read(&chunk)) open = out->Write(chunk);
    if (open) out->WritesDone();
    return out->Finish();
  }

 private:
  explicit ReleaseHangProxy(const std::string& upstream)
      : upstream_(pb::KvCache::NewStub(
            grpc::CreateChannel(upstream, grpc::InsecureChannelCredentials()))) {}

  template <typename Req, typename Resp>
  grpc::Status Forward(grpc::ServerContext* ctx,
                       grpc::Status (pb::KvCache::Stub::*call)(grpc::ClientContext*, const Req&,
                                                               Resp*),
                       const Req& req, Resp* resp) {
    ++calls_;
    grpc::ClientContext c;
    c.set_deadline(ctx->deadline());
    return (upstream_.get()->*call)(&c, req, resp);
  }

  std::unique_ptr<pb::KvCache::Stub> upstream_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<bool> hang_releases_{false};
  std::atomic<int> hung_releases_{0}, calls_{0};
};

// Every member answers every probe: membership changes only when a call reports a failure.
class AlwaysUpProber final : public cluster::Prober {
 public:
  bool Probe(const std::string&, absl::Duration) override { return true; }
};

// Modes: 0 loopback ports (gRPC page path), 1 network namespaces (gRPC), 2 loopback with pages
// loaded by UCX RMA over tcp.
class ClusterTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() == 1) {
      hosts_ = NetnsHosts::Create(3);
      if (hosts_ == nullptr) GTEST_SKIP() << "ip netns add / veth not permitted here";
    }
    for (int i = 0; i < 3; ++i) {
      daemons_.push_back(Start(i, ""));
      ASSERT_NE(daemons_.back(), nullptr);
      addrs_.push_back(daemons_.back()->address());
      if (hosts_) {
        EXPECT_EQ(addrs_.back().rfind(hosts_->ip(i) + ":", 0), 0u) << addrs_.back();
      }
    }
  }

  // Daemon i, on `listen` (empty: an ephemeral port of its host).
  std::unique_ptr<testing::LocalDaemon> Start(int i, const std::string& listen) {
    static int seq = 0;
    testing::LocalDaemonOptions o;
    std::vector<std::string> flags = {
        "--metrics-listen", "off", "--pool-mb", "64", "--node-id", absl::StrCat("node", i),
        "--shm-name", shm_names_.emplace_back(UniqueShmName("oscarkv-ct", seq++)), "--listen",
        listen.empty() ? (hosts_ ? hosts_->ip(i) : std::string("127.0.0.1")) + ":0" : listen,
        "--ucx", GetParam() == 2 ? "on" : "off", "--ucx-net-devices", "lo"};
    if (hosts_) {
      flags.push_back("--allow-plaintext");  // the namespaces' veth addresses are not loopback
      o.binary = "/usr/sbin/ip";
      if (::access(o.binary.c_str(), X_OK) != 0) o.binary = "/sbin/ip";
      o.flags = {"netns", "exec", hosts_->ns(i), OSCARKVD_PATH};
      o.flags.insert(o.flags.end(), flags.begin(), flags.end());
    } else {
      o.binary = OSCARKVD_PATH;
      o.flags = flags;
    }
    // OSCARKV_TEST_DAEMON_LOG=/path/prefix keeps each daemon's log (prefix-<member>-<seq>).
    const char* log = std::getenv("OSCARKV_TEST_DAEMON_LOG");
    o.log_path = log != nullptr ? absl::StrCat(log, "-", i, "-", seq) : "/dev/null";
    auto d = testing::LocalDaemon::Start(o);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *std::move(d) : nullptr;
  }

  std::unique_ptr<ClusterClient> Cluster(const std::string& name) {
    client::ClusterOptions o;
    o.membership.static_members = addrs_;
    // A member is declared dead by the prober only after two probes in a row went unanswered
    // for 1 s each: with one 300 ms probe, a healthy member on an overloaded CI box was
    // sometimes declared dead, and a Store or Load then routed its keys elsewhere, which these
    // tests (exact owners, exact matched counts) cannot tell from a routing bug. A member that
    // hangs or dies under traffic is still dropped at once by the failing call itself
    // (owner_timeout_ms), which is what the tests below measure.
    o.membership.probe_interval = absl::Milliseconds(200);
    o.membership.probe_timeout = absl::Milliseconds(1000);
    o.membership.failures_to_dead = 2;
    o.owner_timeout_ms = 600;
    o.client_name = name;
    if (GetParam() == 2) {
      o.ucx = true;
      o.ucx_tls = "tcp";
      o.ucx_net_devices = "lo";
    }
    auto c = ClusterClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // A request of `n` full pages: canonical keys and real INT2 pages.
  void MakeRequest(const client::Codec& codec, uint64_t seed, size_t n) {
    const auto tokens = Tokens(seed, n * codec.profile.page_tokens);
    keys_ = client::Client::BlockKeys(codec, tokens);
    pages_.clear();
    writes_.clear();
    for (size_t i = 0; i < n; ++i) pages_.push_back(MakePage(codec.profile, PageKind::kInt2, seed + i));
    for (size_t i = 0; i < n; ++i) writes_.push_back({keys_[i], PageKind::kInt2, pages_[i]});
  }

  // Waits (up to 5 s) until every client sees all three members live.
  static bool AllLive(std::initializer_list<ClusterClient*> clients) {
    const auto t0 = Clock::now();
    for (;;) {
      bool all = true;
      for (ClusterClient* c : clients) all &= c->membership().Live().size() == 3;
      if (all) return true;
      if (MsSince(t0) > 5000) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Stops the daemons, then removes the pool segments of those that were killed (a daemon
  // that exits cleanly removes its own).
  void TearDown() override {
    daemons_.clear();
    for (const std::string& n : shm_names_) ::shm_unlink(("/" + n).c_str());
  }

  // SIGSTOPs daemon i and returns once every one of its threads is stopped (false after 5 s).
  // kill() only queues the signal: the group stop begins when the thread it was delivered to
  // (oscarkvd's main thread, in sigwait) next runs, and until then the daemon's other threads
  // keep answering. On a loaded machine that took long enough for a whole Lookup, pin and
  // transfer to be served right after kill() returned. waitpid(WUNTRACED) reports a child
  // stopped only when its group stop is complete.
  bool StopAndWait(int i) {
    const pid_t pid = daemons_[i]->pid();
    if (::kill(pid, SIGSTOP) != 0) return false;
    const auto t0 = Clock::now();
    for (;;) {
      int st = 0;
      const pid_t r = ::waitpid(pid, &st, WUNTRACED | WNOHANG);
      if (r == pid) return WIFSTOPPED(st);
      if (r != 0 || MsSince(t0) > 5000) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  size_t OwnerIndexOf(const std::string& addr) const {
    return std::find(addrs_.begin(), addrs_.end(), addr) - addrs_.begin();
  }

  std::unique_ptr<NetnsHosts> hosts_;
  std::vector<std::unique_ptr<testing::LocalDaemon>> daemons_;
  std::vector<std::string> shm_names_;
  std::vector<std::string> addrs_;
  std::vector<BlockKey> keys_;
  std::vector<std::vector<uint8_t>> pages_;
  std::vector<client::PageWrite> writes_;
};

TEST_P(ClusterTest, StoreThroughOneLoadThroughAnother) {
  auto a = Cluster("node-a-engine");
  auto b = Cluster("node-b-engine");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(AllLive({a.get(), b.get()}));
  auto codec = a->RegisterCodec(*BuiltinProfile("refmodel"));
  ASSERT_TRUE(codec.ok()) << codec.status();
  MakeRequest(*codec, 100, 24);
  auto stored = a->Store(*codec, writes_);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->stored, 24u);
  auto looked = b->Lookup(*codec, keys_);
  ASSERT_TRUE(looked.ok());
  EXPECT_EQ(looked->matched, 24u);
  // b never registered the codec itself: members know it, b registers lazily where needed.
  auto loaded = b->Load(*codec, keys_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->matched, 24u);
  std::set<std::string> owners(loaded->owners.begin(), loaded->owners.end());
  EXPECT_GE(owners.size(), 2u) << "24 keys should spread over the members";
  for (size_t i = 0; i < 24; ++i) EXPECT_EQ(loaded->pages[i], pages_[i]) << i;
  // A longer request shares the prefix: matched is the stored prefix.
  MakeRequest(*codec, 100, 30);
  auto longer = b->Lookup(*codec, keys_);
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(longer->matched, 24u);

  // Handles through the cluster: published via a, loaded via b.
  std::vector<client::PageWrite> hw(writes_.begin(), writes_.begin() + 3);
  ASSERT_TRUE(a->PublishHandle(*codec, "req-x", hw, "meta", 30000).ok());
  auto h = b->LoadHandle(*codec, "req-x");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->pages.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(h->pages[i], pages_[i]);
  EXPECT_TRUE(b->CloseHandle(*codec, "req-x").ok());
}

// kill -9 one member while another client streams batch loads: loads never hang, every page
// returned equals the stored bytes, the killed member's keys become misses within 2 s, the
// others keep serving, and the member rejoins after a restart on its address. 10 rounds.
TEST_P(ClusterTest, KillDuringBatchTransferTenRounds) {
  auto a = Cluster("writer");
  auto b = Cluster("reader");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(AllLive({a.get(), b.get()}));
  auto codec = a->RegisterCodec(*BuiltinProfile("refmodel"));
  ASSERT_TRUE(codec.ok()) << codec.status();
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    MakeRequest(*codec, 1000 * (round + 1), 48);
    auto stored = a->Store(*codec, writes_);
    ASSERT_TRUE(stored.ok()) << stored.status();
    ASSERT_EQ(stored->stored + stored->deduplicated, 48u) << "all members should be live";
    const int victim = round % 3;
    // The first key the victim owns (with all members live).
    const auto groups = cluster::GroupByOwner(addrs_, keys_);
    ASSERT_FALSE(groups[victim].empty());
    const size_t victim_first = groups[victim][0];

    std::atomic<bool> stop{false};
    std::atomic<int> loads{0}, bad{0}, slow{0}, short_or_failed{0};
    std::atomic<int64_t> worst_ms{0};
    std::thread reader([&] {
      for (int i = 0; i < 400 && !stop.load(); ++i) {
        const auto t0 = Clock::now();
        auto r = b->Load(*codec, keys_);
        const int64_t ms = MsSince(t0);
        if (ms > 2000) ++slow;
        if (ms > worst_ms.load()) worst_ms = ms;
        ++loads;
        if (!r.ok() || r->matched < keys_.size()) ++short_or_failed;
        if (!r.ok()) continue;  // an error is acceptable; wrong data is not
        for (size_t j = 0; j < r->matched; ++j) bad += r->pages[j] != pages_[j];
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + 13 * round));
    const auto killed_at = Clock::now();
    daemons_[victim]->Kill(SIGKILL);
    // Within 2 s the victim's keys are misses and the prefix before them still loads.
    bool converged = false;
    for (int i = 0; i < 100 && MsSince(killed_at) < 2000; ++i) {
      auto r = b->Load(*codec, keys_);
      if (r.ok() && r->matched == victim_first) {
        converged = true;
        for (size_t j = 0; j < r->matched; ++j) EXPECT_EQ(r->pages[j], pages_[j]);
        break;
      }
    }
    stop = true;
    reader.join();
    EXPECT_TRUE(converged) << "victim's keys did not become misses within 2 s";
    std::printf("round %d: victim %d, %d loads during the kill (%d short/failed), worst load %lld ms,"
                " misses after %lld ms\n",
                round, victim, loads.load(), short_or_failed.load(),
                static_cast<long long>(worst_ms.load()), static_cast<long long>(MsSince(killed_at)));
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(slow.load(), 0);
    EXPECT_GT(loads.load(), 0);

    // Rejoin: restart on the same address; its keys route back to it (empty: misses), a
    // re-store through a makes the whole request load again through b.
    daemons_[victim] = Start(victim, addrs_[victim]);
    ASSERT_NE(daemons_[victim], nullptr);
    const auto restarted = Clock::now();
    bool rejoined = false;
    while (MsSince(restarted) < 3000) {
      auto live = b->membership().Live();
      auto live_a = a->membership().Live();
      if (live.size() == 3 && live_a.size() == 3) {
        rejoined = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(rejoined);
    auto again = a->Store(*codec, writes_);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->failed, 0u);
    auto full = b->Load(*codec, keys_);
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_EQ(full->matched, 48u);
    for (size_t j = 0; j < full->matched; ++j) EXPECT_EQ(full->pages[j], pages_[j]);
  }
}

// A member that hangs (SIGSTOP: connections stay open, nothing answers) costs at most one
// per-owner deadline: its keys are misses within 2 s; after SIGCONT it rejoins.
TEST_P(ClusterTest, HungMemberIsAMissWithinTheBound) {
  auto a = Cluster("writer");
  auto b = Cluster("reader");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(AllLive({a.get(), b.get()}));  // the owners below assume three live members
  auto codec = a->RegisterCodec(*BuiltinProfile("refmodel"));
  ASSERT_TRUE(codec.ok()) << codec.status();
  MakeRequest(*codec, 77, 24);
  ASSERT_TRUE(a->Store(*codec, writes_).ok());
  ASSERT_EQ(b->Load(*codec, keys_)->matched, 24u);  // b has live connections to everyone
  const auto groups = cluster::GroupByOwner(addrs_, keys_);
  const int victim = 1;
  ASSERT_FALSE(groups[victim].empty());
  // The member must be hung before the load starts: one still finishing its stop answers.
  ASSERT_TRUE(StopAndWait(victim)) << "the victim did not stop within 5 s";
  const auto t0 = Clock::now();
  auto r = b->Load(*codec, keys_);
  const int64_t ms = MsSince(t0);
  ::kill(daemons_[victim]->pid(), SIGCONT);
  ASSERT_TRUE(r.ok()) << r.status();
  std::printf("hung member: load returned in %lld ms, matched %u (victim's first key %zu)\n",
              static_cast<long long>(ms), r->matched, groups[victim][0]);
  EXPECT_LT(ms, 2000);
  EXPECT_EQ(r->matched, groups[victim][0]);
  for (size_t j = 0; j < r->matched; ++j) EXPECT_EQ(r->pages[j], pages_[j]);
  // Back: the prober sees it again and the full prefix loads.
  const auto resumed = Clock::now();
  bool full = false;
  absl::Status last;
  for (int i = 0; i < 200 && !full && MsSince(resumed) < 10000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto again = b->Load(*codec, keys_);
    full = again.ok() && again->matched == 24u;
    if (!again.ok()) last = again.status();
  }
  std::printf("hung member: rejoined %lld ms after SIGCONT\n",
              static_cast<long long>(MsSince(resumed)));
  EXPECT_TRUE(full) << "member did not rejoin after SIGCONT; last error: " << last
                    << "; live members: " << b->membership().Live().size();
}

// A member that serves a Load's lookup and pages, then hangs before the lease release: that
// Load still returns every verified page (at the cost of one owner_timeout_ms), and reports the
// member down, so the next call neither reaches it nor waits for it again: its keys are misses.
// Likewise a LoadHandle of a handle that member owns.
TEST_P(ClusterTest, HangAfterTheTransferMarksTheOwnerDown) {
  auto proxy = ReleaseHangProxy::Start(addrs_[0]);
  ASSERT_NE(proxy, nullptr);
  const std::vector<std::string> members = {proxy->address(), addrs_[1], addrs_[2]};
  client::ClusterOptions o;
  o.membership.static_members = members;
  o.membership.probe_interval = absl::Seconds(60);  // only the synchronous first round
  o.owner_timeout_ms = 600;
  o.client_name = "reader";
  if (GetParam() == 2) {
    o.ucx = true;
    o.ucx_tls = "tcp";
    o.ucx_net_devices = "lo";
  }
  auto c = ClusterClient::Connect(o, std::make_unique<AlwaysUpProber>());
  ASSERT_TRUE(c.ok()) << c.status();
  ClusterClient& cc = **c;
  auto codec = cc.RegisterCodec(*BuiltinProfile("refmodel"));
  ASSERT_TRUE(codec.ok()) << codec.status();
  MakeRequest(*codec, 555, 24);
  auto stored = cc.Store(*codec, writes_);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, 24u);
  const auto groups = cluster::GroupByOwner(members, keys_);
  ASSERT_FALSE(groups[0].empty()) << "the proxied member should own some of 24 keys";
  auto warm = cc.Load(*codec, keys_);  // connections made, releases answered
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_EQ(warm->matched, 24u);
  // On a loaded machine (ctest -j on 2 cores) a first release through the proxy can take longer
  // than owner_timeout_ms and mark its member down before any hang is injected (seen once in CI,
  // netns hosts): probe it back and warm again, so the test starts from three live members.
  for (int i = 0; i < 3 && cc.membership().Live().size() < 3u; ++i) {
    cc.membership().ProbeNow();
    warm = cc.Load(*codec, keys_);
    ASSERT_TRUE(warm.ok()) << warm.status();
  }
  ASSERT_EQ(cc.membership().Live().size(), 3u);

  proxy->HangReleases(true);
  const auto t0 = Clock::now();
  auto r = cc.Load(*codec, keys_);
  const int64_t ms = MsSince(t0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matched, 24u) << "the pages were served and verified before the hang";
  for (size_t j = 0; j < r->matched; ++j) EXPECT_EQ(r->pages[j], pages_[j]) << j;
  EXPECT_GE(proxy->hung_releases(), 1);
  EXPECT_LT(ms, 2000);
  const auto live = cc.membership().Live();
  EXPECT_EQ(std::count(live.begin(), live.end(), proxy->address()), 0)
      << "the member that hung on the release is still live";

  const int calls_before = proxy->calls();
  const auto t1 = Clock::now();
  auto next = cc.Load(*codec, keys_);
  const int64_t next_ms = MsSince(t1);
  ASSERT_TRUE(next.ok()) << next.status();
  std::printf("hang after transfer: load %lld ms (release hung), next load %lld ms, matched %u"
              " (hung member's first key %zu)\n",
              static_cast<long long>(ms), static_cast<long long>(next_ms), next->matched,
              groups[0][0]);
  EXPECT_EQ(proxy->calls(), calls_before) << "the next call went to the hung member";
  EXPECT_EQ(next->matched, groups[0][0]);
  for (size_t j = 0; j < next->matched; ++j) EXPECT_EQ(next->pages[j], pages_[j]) << j;

  // The same for a transfer handle owned by that member: back (a probe round), a handle it owns
  // published, then a LoadHandle whose release hangs returns every page and marks it down.
  proxy->HangReleases(false);
  cc.membership().ProbeNow();
  ASSERT_EQ(cc.membership().Live().size(), 3u);
  std::string handle;
  for (int i = 0; i < 256 && handle.empty(); ++i) {
    const std::string name = absl::StrCat("hang-after-transfer-", i);
    const BlockKey owner_key = ClusterClient::HandleOwnerKey(*codec, name);
    if (!cluster::GroupByOwner(members, std::span<const BlockKey>(&owner_key, 1))[0].empty()) handle = name;
  }
  ASSERT_FALSE(handle.empty()) << "no handle name owned by the proxied member";
  auto published = cc.PublishHandle(*codec, handle, writes_, "meta");
  ASSERT_TRUE(published.ok()) << published.status();
  proxy->HangReleases(true);
  const auto t2 = Clock::now();
  auto h = cc.LoadHandle(*codec, handle);
  const int64_t handle_ms = MsSince(t2);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->pages.size(), pages_.size());
  for (size_t j = 0; j < h->pages.size(); ++j) EXPECT_EQ(h->pages[j], pages_[j]) << j;
  EXPECT_LT(handle_ms, 2000);
  const auto live_after = cc.membership().Live();
  EXPECT_EQ(std::count(live_after.begin(), live_after.end(), proxy->address()), 0)
      << "the member that hung on the handle's release is still live";
  std::printf("hang after transfer: handle load %lld ms (release hung)\n",
              static_cast<long long>(handle_ms));
}

// Membership from a DNS name (the headless-service pattern) with the resolver seam standing in
// for DNS: the name resolves to every member; a member that leaves the answer stops owning keys,
// one that reappears owns them again.
TEST_P(ClusterTest, DnsMembershipFollowsTheAnswer) {
  auto answer = std::make_shared<std::vector<std::string>>(addrs_);
  auto mu = std::make_shared<absl::Mutex>();
  client::ClusterOptions o;
  o.membership.dns_name = "oscarkv.ns.svc.cluster.local:50051";
  o.membership.probe_interval = absl::Milliseconds(100);
  o.membership.probe_timeout = absl::Milliseconds(300);
  o.owner_timeout_ms = 600;
  if (GetParam() == 2) {
    o.ucx = true;
    o.ucx_net_devices = "lo";
  }
  auto c = ClusterClient::Connect(
      o, nullptr, [answer, mu](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
        EXPECT_EQ(name, "oscarkv.ns.svc.cluster.local:50051");
        absl::MutexLock l(mu.get());
        return *answer;
      });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->membership().Live().size(), 3u);
  auto codec = (*c)->RegisterCodec(*BuiltinProfile("refmodel"));
  ASSERT_TRUE(codec.ok());
  MakeRequest(*codec, 4242, 12);
  ASSERT_EQ((*c)->Store(*codec, writes_)->stored, 12u);
  ASSERT_EQ((*c)->Load(*codec, keys_)->matched, 12u);
  {
    absl::MutexLock l(mu.get());
    answer->erase(answer->begin());
  }
  bool left = false;
  for (int i = 0; i < 100 && !left; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = (*c)->membership().Live().size() == 2;
  }
  EXPECT_TRUE(left);
  {
    absl::MutexLock l(mu.get());
    *answer = addrs_;
  }
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    back = (*c)->membership().Live().size() == 3;
  }
  EXPECT_TRUE(back);
  auto r = (*c)->Load(*codec, keys_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->matched, 12u);
  for (size_t j = 0; j < r->matched; ++j) EXPECT_EQ(r->pages[j], pages_[j]);
}

INSTANTIATE_TEST_SUITE_P(Hosts, ClusterTest, ::testing::Values(0, 1, 2), [](const auto& info) {
  return std::string(info.param == 0 ? "loopback" : info.param == 1 ? "netns" : "loopback_ucx");
});

}  // namespace
}  // namespace oscarkv::testing
