// Per-tenant UCX access against a real daemon: tenants by mTLS client certificates (made by
// openssl at test time), UCX over tcp on loopback. A tenant gets a data plane of its own (a
// child process mapping only the tenant's staging region) and loads its pages through
// StageForRma; another tenant cannot stage them, never finds them in its own region, and cannot
// reach them with the first tenant's key; a killed tenant child is restarted and the loader
// reconnects; a corrupt page is DATA_LOSS at the tenant's client; requests that do not fit the
// region are refused with RESOURCE_EXHAUSTED; throughput of the staged path beside the pool's.
// With tenants no process maps the pool for UCX unless ucx.allow_unverified_rma asks for it
// (admins stage through data planes of their own, like tenants), so a raw peer of any data-plane process the daemon runs, with made-up
// addresses and keys, finds none of another tenant's pages.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "oscarkv/client/ucx_loader.h"
#include "oscarkv/transport/transport.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "tenant_pki.h"
#include "test_util.h"
#include "ucx_test_peer.h"

namespace oscarkv::testing {
namespace {

namespace pb = ::oscarkv::v1;

constexpr uint64_t kRegionBytes = uint64_t{1} << 20;  // ucx.tenant_region_mb: 1
constexpr uint64_t kAlign = 256;                      // each staged page's slot granularity

uint64_t Aligned(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string KeyString(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

// Whether `hay` holds a 256-byte run from the middle of `page` (random codes: no false hits).
bool Holds(const std::vector<uint8_t>& hay, const std::vector<uint8_t>& page) {
  const size_t at = page.size() / 2;
  const auto needle = std::span<const uint8_t>(page).subspan(at, 256);
  return std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

std::vector<pid_t> TenantChildren(pid_t daemon) { return DataPlaneChildren(daemon, kRegionBytes); }

class UcxTenantTest : public TenantPkiTest<UcxTenantTest> {
 public:
  static constexpr const char* kPkiTag = "ucx_tenant_test";

 protected:
  void SetUp() override {
    TenantPkiTest::SetUp();
    if (HasFatalFailure()) return;
    daemon_ = StartTenantDaemon(1);
    ASSERT_NE(daemon_, nullptr);
  }
  // A daemon with mTLS, tenant-a, tenant-b and an admin, UCX tcp on lo, tenant regions of
  // `region_mb` MiB.
  std::unique_ptr<testing::LocalDaemon> StartTenantDaemon(
      int region_mb, const std::vector<std::string>& extra = {}) {
    const std::string cfg = pki_->path("ucx_tenants_" + std::to_string(region_mb) + ".yaml");
    std::ofstream(cfg) << "tls:\n  cert: " << pki_->path("server.pem") << "\n  key: "
                       << pki_->path("server.key") << "\n  client_ca: " << pki_->path("ca.pem")
                       << "\nucx:\n  tls: tcp\n  net_devices: lo\n  tenant_region_mb: "
                       << region_mb
                       << "\ntenants:\n  - name: tenant-a\n  - name: tenant-b\n"
                          "  - name: admin\n    role: admin\n";
    std::vector<std::string> flags = {"--config", cfg};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return StartDaemon(flags);
  }

  client::ConnectOptions Options(const std::string& who) const {
    client::ConnectOptions o;
    o.address = address_.empty() ? daemon_->address() : address_;
    o.rpc_timeout_ms = 5000;
    o.data_path = client::DataPath::kGrpc;  // control plane only; pages come by UCX
    o.tls_ca_file = pki_->path("ca.pem");
    o.tls_cert_file = pki_->path(who + ".pem");
    o.tls_key_file = pki_->path(who + ".key");
    o.tls_server_name = server_name_;
    return o;
  }
  std::unique_ptr<client::Client> As(const std::string& who) {
    auto c = client::Client::Connect(Options(who));
    EXPECT_TRUE(c.ok()) << who << ": " << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  std::unique_ptr<client::UcxLoader> Loader(const std::string& who) {
    client::UcxLoaderOptions o;
    o.connect = Options(who);
    o.tls = "tcp";
    o.net_devices = client_devices_;
    o.buffer_bytes = 8 << 20;
    o.peer_timeout_ms = 1000;
    o.transfer_timeout_ms = 1500;
    auto l = client::UcxLoader::Connect(o);
    EXPECT_TRUE(l.ok()) << who << ": " << l.status();
    return l.ok() ? *std::move(l) : nullptr;
  }
  // Raw gRPC as `who`, for the calls the client library makes for it.
  std::unique_ptr<pb::KvCache::Stub> Stub(const std::string& who) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadTextFile(pki_->path("ca.pem"));
    o.pem_private_key = ReadTextFile(pki_->path(who + ".key"));
    o.pem_cert_chain = ReadTextFile(pki_->path(who + ".pem"));
    return pb::KvCache::NewStub(grpc::CreateChannel(daemon_->address(), grpc::SslCredentials(o)));
  }
  static grpc::Status Call(pb::KvCache::Stub& stub, const pb::GetDataPlaneRequest& req,
                           pb::GetDataPlaneResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub.GetDataPlane(&ctx, req, resp);
  }
  static grpc::Status Call(pb::KvCache::Stub& stub, const pb::StageForRmaRequest& req,
                           pb::StageForRmaResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub.StageForRma(&ctx, req, resp);
  }
  // A pinning Lookup of `keys` as the client's tenant: the lease id.
  static uint64_t Pin(client::Client& c, const client::Codec& codec,
                      std::span<const BlockKey> keys) {
    client::LookupOptions lo;
    lo.pin = true;
    auto r = c.Lookup(codec, keys, lo);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    EXPECT_EQ(r->matched, keys.size());
    EXPECT_EQ(r->lease_ids.size(), 1u);
    return r->lease_ids.empty() ? 0 : r->lease_ids[0];
  }
  static pb::StageForRmaRequest StageRequest(uint64_t lease, std::span<const BlockKey> keys) {
    pb::StageForRmaRequest req;
    req.set_lease_id(lease);
    for (const BlockKey& k : keys) req.add_keys(KeyString(k));
    return req;
  }

  std::unique_ptr<testing::LocalDaemon> daemon_;
  std::string address_;  // set: the clients of Options() dial this daemon instead
  std::string server_name_;            // the name checked against the daemon's certificate
  std::string client_devices_ = "lo";  // the loaders' UCX_NET_DEVICES
};

TEST_F(UcxTenantTest, TenantLoadsItsPagesThroughItsOwnDataPlane) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 100, 40);  // ~3 regions' worth: several stages
  auto stored = a->Store(codec, p.writes);
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->stored, 40u);

  auto loader = Loader("tenant-a");
  ASSERT_NE(loader, nullptr);
  auto info = loader->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->staged);
  // Stages are freed after each load: five loads of three regions' worth through one region.
  for (int round = 0; round < 5; ++round) {
    auto r = loader->Load(codec, p.keys);
    ASSERT_TRUE(r.ok()) << round << ": " << r.status();
    ASSERT_EQ(r->matched, 40u);
    for (size_t i = 0; i < 40; ++i) ASSERT_EQ(r->pages[i], p.bytes[i]) << round << "/" << i;
  }
  // Straight into a registered engine buffer.
  std::vector<uint8_t> engine(size_t{40} * codec.int2_page_bytes);
  ASSERT_TRUE(loader->RegisterBuffer(engine.data(), engine.size()).ok());
  std::vector<std::span<uint8_t>> slots;
  for (size_t i = 0; i < 40; ++i) {
    slots.emplace_back(engine.data() + i * codec.int2_page_bytes, codec.int2_page_bytes);
  }
  auto n = loader->LoadInto(codec, p.keys, slots);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 40u);
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_TRUE(std::equal(p.bytes[i].begin(), p.bytes[i].end(), slots[i].begin())) << i;
  }
  // A transfer handle of the tenant, by RMA through the same region.
  ASSERT_TRUE(loader->handles().PublishKeys(codec, "ucx-tenant-handle", p.keys, "", 60000).ok());
  auto h = loader->LoadHandle(codec, "ucx-tenant-handle");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->pages.size(), 40u);
  for (size_t i = 0; i < 40; ++i) EXPECT_EQ(h->pages[i], p.bytes[i]) << i;

  // The tenant's data plane covers its region only; there is no pool data plane to get: an
  // admin gets a staged data plane of its own too.
  pb::GetDataPlaneResponse mine, pool;
  ASSERT_TRUE(Call(*Stub("tenant-a"), pb::GetDataPlaneRequest(), &mine).ok());
  EXPECT_TRUE(mine.staged());
  EXPECT_EQ(mine.pool_bytes(), kRegionBytes);
  grpc::Status s = Call(*Stub("admin"), pb::GetDataPlaneRequest(), &pool);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(pool.staged());
  EXPECT_EQ(pool.pool_bytes(), kRegionBytes);
  EXPECT_NE(pool.worker_address(), mine.worker_address());
  client::UcxLoaderOptions ao;
  ao.connect = Options("admin");
  ao.tls = "tcp";
  ao.net_devices = "lo";
  auto admin_loader = client::UcxLoader::Connect(ao);
  ASSERT_TRUE(admin_loader.ok()) << admin_loader.status();
  auto admin_info = (*admin_loader)->Info();
  ASSERT_TRUE(admin_info.ok()) << admin_info.status();
  EXPECT_TRUE(admin_info->staged);
}

// With tenants and the default config, no data-plane process maps the pool: each maps only its
// tenant's region. A raw UCX peer on tenant B's worker, naming the address where the daemon
// maps the pool with B's key and with a made-up key, and reading all of B's region, finds none
// of A's pages, while A's are staged (unfreed) in A's region.
TEST_F(UcxTenantTest, WithTenantsNoDataPlaneProcessMapsThePool) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 250, 4);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  const uint64_t lease = Pin(*a, codec, p.keys);
  ASSERT_NE(lease, 0u);
  pb::GetDataPlaneResponse dp_a, dp_b;
  ASSERT_TRUE(Call(*Stub("tenant-a"), pb::GetDataPlaneRequest(), &dp_a).ok());
  ASSERT_TRUE(Call(*Stub("tenant-b"), pb::GetDataPlaneRequest(), &dp_b).ok());
  pb::StageForRmaResponse staged;
  ASSERT_TRUE(Call(*Stub("tenant-a"), StageRequest(lease, p.keys), &staged).ok());

  const uint64_t pool_at = PoolMappedAt(daemon_->pid(), daemon_->shm_path());
  ASSERT_NE(pool_at, 0u) << "the daemon does not map " << daemon_->shm_path();
  const std::vector<pid_t> planes = DataPlaneChildren(daemon_->pid(), 0);
  EXPECT_EQ(planes.size(), 2u);  // tenant-a's and tenant-b's; none for the pool
  for (pid_t child : planes) {
    EXPECT_EQ(PoolMappedAt(child, daemon_->shm_path()), 0u) << "data-plane process " << child
                                                        << " maps the pool";
  }
  EXPECT_EQ(TenantChildren(daemon_->pid()).size(), planes.size());

  auto peer = RawPeer::Connect(dp_b.worker_address(), kRegionBytes);
  ASSERT_NE(peer, nullptr);
  auto region_b = peer->Get(dp_b.pool_rkey(), dp_b.pool_base(), kRegionBytes);
  ASSERT_TRUE(region_b.ok()) << region_b.status();
  for (size_t i = 0; i < 4; ++i) EXPECT_FALSE(Holds(*region_b, p.bytes[i])) << i;
  // The pool's address in the daemon means nothing in B's child: the get fails (the child may
  // die of it and is restarted) or reads the child's own memory -- never A's pages.
  auto at_pool = peer->Get(dp_b.pool_rkey(), pool_at, kRegionBytes);
  if (at_pool.ok()) {
    for (size_t i = 0; i < 4; ++i) EXPECT_FALSE(Holds(*at_pool, p.bytes[i])) << i;
  }
  // A made-up key (a well-formed one the daemon never issued: the peer's own) at the same
  // address, on a fresh endpoint (B's child may have been restarted by the get above).
  pb::GetDataPlaneResponse dp_b2;
  grpc::Status live;
  for (int i = 0; i < 100; ++i) {  // UNAVAILABLE while a crashed child is restarted
    live = Call(*Stub("tenant-b"), pb::GetDataPlaneRequest(), &dp_b2);
    if (live.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(live.ok()) << live.error_message();
  auto forged = RawPeer::Connect(dp_b2.worker_address(), kRegionBytes);
  ASSERT_NE(forged, nullptr);
  auto got = forged->Get(forged->OwnKey(), pool_at, kRegionBytes);
  if (got.ok()) {
    for (size_t i = 0; i < 4; ++i) EXPECT_FALSE(Holds(*got, p.bytes[i])) << i;
  }
  // A still loads its pages through its own data plane.
  auto loader = Loader("tenant-a");
  ASSERT_NE(loader, nullptr);
  auto r = loader->Load(codec, p.keys);
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(r->pages[i], p.bytes[i]) << i;
  ASSERT_TRUE(a->Release(lease).ok());
}

// ucx.allow_unverified_rma with tenants: the pool data plane runs again, for admins only (its
// key reads every page); tenants keep their own.
TEST_F(UcxTenantTest, AllowUnverifiedRmaStartsThePoolDataPlaneForAdmins) {
  auto d = StartTenantDaemon(1, {"--ucx-allow-unverified-rma"});
  ASSERT_NE(d, nullptr);
  address_ = d->address();
  pb::GetDataPlaneResponse mine, pool;
  auto stub = [&](const std::string& who) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadTextFile(pki_->path("ca.pem"));
    o.pem_private_key = ReadTextFile(pki_->path(who + ".key"));
    o.pem_cert_chain = ReadTextFile(pki_->path(who + ".pem"));
    return pb::KvCache::NewStub(grpc::CreateChannel(d->address(), grpc::SslCredentials(o)));
  };
  ASSERT_TRUE(Call(*stub("tenant-a"), pb::GetDataPlaneRequest(), &mine).ok());
  ASSERT_TRUE(Call(*stub("admin"), pb::GetDataPlaneRequest(), &pool).ok());
  EXPECT_TRUE(mine.staged());
  EXPECT_FALSE(pool.staged());
  EXPECT_EQ(mine.pool_bytes(), kRegionBytes);
  EXPECT_EQ(pool.pool_bytes(), uint64_t{64} << 20);
  EXPECT_NE(mine.worker_address(), pool.worker_address());
  // The pool's data-plane process maps the pool (the control for the check of
  // WithTenantsNoDataPlaneProcessMapsThePool); the tenant's does not.
  const std::vector<pid_t> pool_planes = DataPlaneChildren(d->pid(), uint64_t{64} << 20);
  ASSERT_EQ(pool_planes.size(), 1u);
  EXPECT_NE(PoolMappedAt(pool_planes[0], d->shm_path()), 0u);
  for (pid_t child : TenantChildren(d->pid())) EXPECT_EQ(PoolMappedAt(child, d->shm_path()), 0u);
  auto admin_loader = Loader("admin");
  ASSERT_NE(admin_loader, nullptr);
  auto admin_info = admin_loader->Info();
  ASSERT_TRUE(admin_info.ok()) << admin_info.status();
  EXPECT_FALSE(admin_info->staged);
  address_.clear();
}

// Tenants on a non-loopback address need no opt-in (there is no pool data plane): the tenant's
// own data plane listens on that interface and serves its pages there.
TEST_F(UcxTenantTest, TenantsOnANonLoopbackAddressStartWithoutThePoolDataPlane) {
  const auto [ip, dev] = NonLoopbackInterface();
  if (ip.empty()) GTEST_SKIP() << "this host has no non-loopback IPv4 interface";
  auto d = StartTenantDaemon(1, {"--listen", ip + ":0", "--ucx-net-devices", dev});
  ASSERT_NE(d, nullptr);
  address_ = d->address();
  server_name_ = "localhost";  // the test server certificate's name
  client_devices_ = dev;
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 1500, 4);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  auto loader = Loader("tenant-a");
  ASSERT_NE(loader, nullptr);
  auto r = loader->Load(codec, p.keys);
  ASSERT_TRUE(r.ok()) << r.status();
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(r->pages[i], p.bytes[i]) << i;
  EXPECT_EQ(DataPlaneChildren(d->pid(), 0).size(), 1u);  // tenant-a's only
  address_.clear();
  server_name_.clear();
  client_devices_ = "lo";
}

TEST_F(UcxTenantTest, TenantBCannotStageTenantAsPagesNorReachThemWithItsEndpoint) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  const client::Codec codec = RegisterRefmodel(*a);
  const client::Codec codec_b = RegisterRefmodel(*b);
  TenantPages p = MakeTenantPages(codec, 200, 4);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  const uint64_t lease = Pin(*a, codec, p.keys);
  ASSERT_NE(lease, 0u);
  auto stub_a = Stub("tenant-a"), stub_b = Stub("tenant-b");

  // A stages its pages and keeps the stage (not freed) while B tries everything it can.
  pb::GetDataPlaneResponse dp_a, dp_b;
  ASSERT_TRUE(Call(*stub_a, pb::GetDataPlaneRequest(), &dp_a).ok());
  pb::StageForRmaResponse staged;
  grpc::Status s = Call(*stub_a, StageRequest(lease, p.keys), &staged);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(staged.pages_size(), 4);

  // B cannot stage A's lease, by keys or whole.
  pb::StageForRmaResponse refused;
  s = Call(*stub_b, StageRequest(lease, p.keys), &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  s = Call(*stub_b, StageRequest(lease, {}), &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(refused.pages_size(), 0);
  // B's own Lookup of the same keys pins nothing of A's.
  client::LookupOptions lo;
  lo.pin = true;
  auto lb = b->Lookup(codec_b, p.keys, lo);
  ASSERT_TRUE(lb.ok()) << lb.status();
  EXPECT_EQ(lb->matched, 0u);

  // B's data plane is its own: another process, another region.
  ASSERT_TRUE(Call(*stub_b, pb::GetDataPlaneRequest(), &dp_b).ok());
  EXPECT_TRUE(dp_b.staged());
  EXPECT_NE(dp_b.worker_address(), dp_a.worker_address());

  // Positive control: A's own child serves A's staged bytes at the answered offsets.
  auto peer_a = RawPeer::Connect(dp_a.worker_address(), kRegionBytes);
  ASSERT_NE(peer_a, nullptr);
  auto got = peer_a->Get(dp_a.pool_rkey(), dp_a.pool_base() + staged.pages(0).offset(),
                         staged.pages(0).bytes());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, p.bytes[0]);

  // Everything B's endpoint reaches with its own key -- its whole region -- holds none of A's
  // bytes, while A's are staged.
  auto peer_b = RawPeer::Connect(dp_b.worker_address(), kRegionBytes);
  ASSERT_NE(peer_b, nullptr);
  auto region_b = peer_b->Get(dp_b.pool_rkey(), dp_b.pool_base(), kRegionBytes);
  ASSERT_TRUE(region_b.ok()) << region_b.status();
  for (size_t i = 0; i < 4; ++i) EXPECT_FALSE(Holds(*region_b, p.bytes[i])) << i;

  // A's key on B's endpoint names addresses of A's child, but the get runs in B's child: it
  // fails (nothing mapped there; B's child may die of it and is restarted) or reads B's child's
  // own memory -- never A's pages.
  auto cross = peer_b->Get(dp_a.pool_rkey(), dp_a.pool_base(), kRegionBytes);
  if (cross.ok()) {
    for (size_t i = 0; i < 4; ++i) EXPECT_FALSE(Holds(*cross, p.bytes[i])) << i;
  } else {
    std::printf("A's key on B's endpoint: %s\n", std::string(cross.status().message()).c_str());
  }

  // A is unaffected: it still loads its pages by RMA.
  auto loader = Loader("tenant-a");
  ASSERT_NE(loader, nullptr);
  auto r = loader->Load(codec, p.keys);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->matched, 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(r->pages[i], p.bytes[i]) << i;
  ASSERT_TRUE(a->Release(lease).ok());
}

// The documented limit of emulated (tcp) RMA: a peer that reaches a tenant's worker address can
// read what that child maps -- the tenant's region -- whatever key it holds. Freed stages are
// scrubbed, so what it can find is only the stages not yet freed.
TEST_F(UcxTenantTest, APeerOfATenantsWorkerReadsOnlyItsUnfreedStages) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 300, 2);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  const uint64_t lease = Pin(*a, codec, p.keys);
  auto stub_a = Stub("tenant-a");
  pb::GetDataPlaneResponse dp;
  ASSERT_TRUE(Call(*stub_a, pb::GetDataPlaneRequest(), &dp).ok());
  pb::StageForRmaResponse staged;
  ASSERT_TRUE(Call(*stub_a, StageRequest(lease, p.keys), &staged).ok());

  auto peer = RawPeer::Connect(dp.worker_address(), kRegionBytes);
  ASSERT_NE(peer, nullptr);
  auto before = peer->Get(dp.pool_rkey(), dp.pool_base(), kRegionBytes);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_TRUE(Holds(*before, p.bytes[0]));
  EXPECT_TRUE(Holds(*before, p.bytes[1]));

  pb::StageForRmaRequest free_only;
  free_only.add_free_stage_ids(staged.stage_id());
  pb::StageForRmaResponse none;
  ASSERT_TRUE(Call(*stub_a, free_only, &none).ok());
  EXPECT_EQ(none.stage_id(), 0u);
  auto after = peer->Get(dp.pool_rkey(), dp.pool_base(), kRegionBytes);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(std::all_of(after->begin(), after->end(), [](uint8_t v) { return v == 0; }));
  ASSERT_TRUE(a->Release(lease).ok());
}

TEST_F(UcxTenantTest, KilledTenantChildIsRestartedAndTheLoaderReconnects) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 400, 8);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  auto loader = Loader("tenant-a");
  ASSERT_NE(loader, nullptr);
  ASSERT_TRUE(loader->Load(codec, p.keys).ok());
  pb::GetDataPlaneResponse before;
  ASSERT_TRUE(Call(*Stub("tenant-a"), pb::GetDataPlaneRequest(), &before).ok());

  const std::vector<pid_t> children = TenantChildren(daemon_->pid());
  ASSERT_EQ(children.size(), 1u);  // only tenant-a asked for a data plane
  ASSERT_EQ(::kill(children[0], SIGKILL), 0);

  // Errors (never a wrong page) until the supervisor has restarted it, then loads again.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  absl::StatusOr<client::LoadResult> r = absl::UnavailableError("not tried");
  int failures = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    r = loader->Load(codec, p.keys);
    if (r.ok()) break;
    ++failures;
    EXPECT_TRUE(r.status().code() == absl::StatusCode::kUnavailable ||
                r.status().code() == absl::StatusCode::kDeadlineExceeded)
        << r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->matched, 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(r->pages[i], p.bytes[i]) << i;
  std::printf("tenant child restarted: %d failed loads before the first good one\n", failures);
  pb::GetDataPlaneResponse after;
  ASSERT_TRUE(Call(*Stub("tenant-a"), pb::GetDataPlaneRequest(), &after).ok());
  EXPECT_NE(after.worker_address(), before.worker_address());
  const std::vector<pid_t> now = TenantChildren(daemon_->pid());
  ASSERT_EQ(now.size(), 1u);
  EXPECT_NE(now[0], children[0]);
}

// A page corrupted in the pool reaches the tenant's region as the daemon copies it, and the
// tenant's client refuses it: DATA_LOSS for Load, LoadInto and LoadHandle alike. (Trusted shm
// mode: the test corrupts the page through the pool file.)
TEST_F(UcxTenantTest, ACorruptPageIsDataLossThroughTheStagedPath) {
  auto d = StartTenantDaemon(1, {"--shm-mode", "trusted"});
  ASSERT_NE(d, nullptr);
  address_ = d->address();
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 1000, 6);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  auto loader = Loader("tenant-a");
  ASSERT_NE(loader, nullptr);
  auto info = loader->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->staged);
  ASSERT_TRUE(loader->Load(codec, p.keys).ok());

  // Find page 3 in the pool file by its bytes and flip one bit in its body.
  std::vector<uint8_t> pool;
  {
    const std::string bytes = ReadTextFile(d->shm_path());
    pool.assign(bytes.begin(), bytes.end());
  }
  const auto needle = std::span<const uint8_t>(p.bytes[3]).subspan(p.bytes[3].size() / 2, 256);
  const auto at = std::search(pool.begin(), pool.end(), needle.begin(), needle.end());
  ASSERT_NE(at, pool.end());
  const off_t off = static_cast<off_t>(at - pool.begin());
  const int fd = ::open(d->shm_path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = pool[off] ^ 0x04;
  ASSERT_EQ(::pwrite(fd, &byte, 1, off), 1);
  ::close(fd);

  EXPECT_EQ(loader->Load(codec, p.keys).status().code(), absl::StatusCode::kDataLoss);
  std::vector<uint8_t> engine(size_t{6} * codec.int2_page_bytes);
  ASSERT_TRUE(loader->RegisterBuffer(engine.data(), engine.size()).ok());
  std::vector<std::span<uint8_t>> slots;
  for (size_t i = 0; i < 6; ++i) {
    slots.emplace_back(engine.data() + i * codec.int2_page_bytes, codec.int2_page_bytes);
  }
  EXPECT_EQ(loader->LoadInto(codec, p.keys, slots).status().code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(loader->handles().PublishKeys(codec, "corrupt", p.keys, "", 10000).ok());
  EXPECT_EQ(loader->LoadHandle(codec, "corrupt").status().code(), absl::StatusCode::kDataLoss);
  // The pages before it are still good, and the loader still works.
  auto good = loader->Load(codec, std::span<const BlockKey>(p.keys).subspan(0, 3));
  ASSERT_TRUE(good.ok()) << good.status();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(good->pages[i], p.bytes[i]) << i;
  address_.clear();
}

// Three loaders of one tenant share its region: rounds of half a region, a loader waiting for
// room while the others free theirs; every page right.
TEST_F(UcxTenantTest, ConcurrentLoadersOfOneTenantShareItsRegion) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 600, 40);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  std::vector<std::unique_ptr<client::UcxLoader>> loaders;
  for (int i = 0; i < 3; ++i) {
    loaders.push_back(Loader("tenant-a"));
    ASSERT_NE(loaders.back(), nullptr);
  }
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5 && errors[t].empty(); ++round) {
        auto r = loaders[t]->Load(codec, p.keys);
        if (!r.ok()) {
          errors[t] = r.status().ToString();
        } else if (r->matched != 40 || r->pages != p.bytes) {
          errors[t] = "wrong pages in round " + std::to_string(round);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 3; ++t) EXPECT_EQ(errors[t], "") << "loader " << t;
}

// Side by side in one run (printed, not asserted): the pool path (an admin, the pool key) and
// the staged path (a tenant: StageForRma copies, then RMA from its own child), 40 refmodel
// pages (2.95 MB) per load, 10 loads each, interleaved, median of 3; with the 1 MiB region of
// this fixture (rounds of half a region: 6 StageForRma per load) and with the default 64 MiB.
TEST_F(UcxTenantTest, ThroughputStagedVsPoolSideBySide) {
  auto mbps = [](client::UcxLoader& l, const client::Codec& c, const TenantPages& p) {
    EXPECT_TRUE(l.Load(c, p.keys).ok());  // warm: connected, region touched
    uint64_t bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) {
      auto r = l.Load(c, p.keys);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) bytes += r->bytes;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return bytes / s / 1e6;
  };
  // The pool path needs the pool data plane, which with tenants runs only when allowed.
  std::unique_ptr<testing::LocalDaemon> big = StartTenantDaemon(64, {"--ucx-allow-unverified-rma"});
  ASSERT_NE(big, nullptr);
  struct Path {
    std::string name, who, address;
    std::unique_ptr<client::UcxLoader> loader;
    client::Codec codec;
    TenantPages pages;
    std::vector<double> mbps;
  };
  std::vector<Path> paths;
  auto add = [&](const std::string& name, const std::string& who, const std::string& address) {
    paths.push_back({name, who, address, nullptr, {}, {}, {}});
  };
  add("pool key (admin)", "admin", big->address());
  add("tenant staged, 64 MiB region", "tenant-a", big->address());
  add("tenant staged, 1 MiB region", "tenant-a", daemon_->address());
  uint64_t seed = 700;
  for (Path& p : paths) {
    address_ = p.address;
    auto c = As(p.who);
    ASSERT_NE(c, nullptr);
    p.codec = RegisterRefmodel(*c);
    p.pages = MakeTenantPages(p.codec, seed += 100, 40);
    ASSERT_TRUE(c->Store(p.codec, p.pages.writes).ok());
    p.loader = Loader(p.who);
    ASSERT_NE(p.loader, nullptr);
  }
  address_.clear();
  for (int i = 0; i < 3; ++i) {
    for (Path& p : paths) p.mbps.push_back(mbps(*p.loader, p.codec, p.pages));
  }
  std::printf("UCX tcp/lo, 40 refmodel pages x 10 loads, median of 3 interleaved runs:\n");
  double pool = 0;
  for (Path& p : paths) {
    std::sort(p.mbps.begin(), p.mbps.end());
    if (pool == 0) pool = p.mbps[1];
    std::printf("  %-30s %6.0f MB/s  %.2f of the pool path\n", p.name.c_str(), p.mbps[1],
                p.mbps[1] / pool);
  }
}

TEST_F(UcxTenantTest, StagesBeyondTheRegionAreResourceExhausted) {
  auto a = As("tenant-a");
  ASSERT_NE(a, nullptr);
  const client::Codec codec = RegisterRefmodel(*a);
  TenantPages p = MakeTenantPages(codec, 500, 40);
  ASSERT_TRUE(a->Store(codec, p.writes).ok());
  const uint64_t lease = Pin(*a, codec, p.keys);
  ASSERT_NE(lease, 0u);
  auto stub = Stub("tenant-a");
  pb::GetDataPlaneResponse dp;
  ASSERT_TRUE(Call(*stub, pb::GetDataPlaneRequest(), &dp).ok());
  const std::span<const BlockKey> keys(p.keys);

  // One request larger than the whole region.
  pb::StageForRmaResponse resp;
  grpc::Status s = Call(*stub, StageRequest(lease, keys), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("ucx.tenant_region_mb"), std::string::npos)
      << s.error_message();

  // Two stages of a bit under half the region fit; a third does not until one is freed.
  const uint64_t slot = Aligned(codec.int2_page_bytes);
  const size_t per = kRegionBytes / 2 / slot;
  ASSERT_GT(per, 0u);
  ASSERT_GT(3 * per * slot, kRegionBytes);
  pb::StageForRmaResponse first, second, third;
  ASSERT_TRUE(Call(*stub, StageRequest(lease, keys.subspan(0, per)), &first).ok());
  ASSERT_TRUE(Call(*stub, StageRequest(lease, keys.subspan(per, per)), &second).ok());
  EXPECT_NE(first.stage_id(), second.stage_id());
  s = Call(*stub, StageRequest(lease, keys.subspan(2 * per, per)), &third);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  pb::StageForRmaRequest retry = StageRequest(lease, keys.subspan(2 * per, per));
  retry.add_free_stage_ids(first.stage_id());
  s = Call(*stub, retry, &third);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(third.pages_size(), static_cast<int>(per));
  for (const pb::StagedPage& sp : third.pages()) {
    EXPECT_LE(sp.offset() + sp.bytes(), kRegionBytes);
    EXPECT_EQ(sp.offset() % kAlign, 0u);
  }

  // More ids to free than a region can have stages: refused before anything is done.
  pb::StageForRmaRequest many;
  for (uint64_t i = 0; i < 257; ++i) many.add_free_stage_ids(i + 1);
  s = Call(*stub, many, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // A key the lease does not pin.
  const BlockKey stranger = MakeTenantPages(codec, 900, 1).keys[0];
  s = Call(*stub, StageRequest(lease, std::span<const BlockKey>(&stranger, 1)), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // Without a pool data plane an admin stages through its own region too, but only its own
  // leases (the same check as ReadPages): tenant-a's lease is unknown to it.
  s = Call(*Stub("admin"), StageRequest(lease, keys.subspan(0, 1)), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // Free-only, including unknown ids: OK.
  pb::StageForRmaRequest free_all;
  free_all.add_free_stage_ids(second.stage_id());
  free_all.add_free_stage_ids(third.stage_id());
  free_all.add_free_stage_ids(987654321);
  ASSERT_TRUE(Call(*stub, free_all, &resp).ok());
  ASSERT_TRUE(a->Release(lease).ok());
}

}  // namespace
}  // namespace oscarkv::testing
