// Tenants with the SSD tier against real daemons (mTLS certificates made by openssl at test
// time, the segment tier in a temp dir): two tenants store different pages under the same block
// keys into a pool too small for them, so both demote; each gets back only its own bytes, before
// and after a restart on the same tier path; one tenant's clear/delete leave the other's tier
// pages; pool_mb accounting holds through promotions; a tier written without tenants (also in
// the codecs format of before namespaces) stays readable, and is refused clearly with tenants.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tenant_pki.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

// tenant-a's pool_mb (1) is below its pages; tenant-b gets the default share of the 8 MiB pool
// (8 / 3 tenants = 2 MiB).
std::string TenantsYaml(const TenantPki& pki) {
  return "tls:\n  cert: " + pki.path("server.pem") + "\n  key: " + pki.path("server.key") +
         "\n  client_ca: " + pki.path("ca.pem") +
         "\ntenants:\n"
         "  - name: tenant-a\n"
         "    quota: {pool_mb: 1}\n"
         "  - name: tenant-b\n"
         "  - name: admin\n"
         "    role: admin\n";
}

class TenantsTierTest : public TenantPkiTest<TenantsTierTest> {
 public:
  static constexpr const char* kPkiTag = "tenants_tier_test";

 protected:
  void SetUp() override {
    TenantPkiTest::SetUp();
    if (HasFatalFailure()) return;
    tier_ = pki_->path("tier");
    std::filesystem::remove_all(tier_);
    ASSERT_TRUE(Restart());
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(tier_);
  }
  bool Restart() {
    if (daemon_ != nullptr && *daemon_->Stop() != 0) return false;  // SIGTERM: demotes the pool
    const std::string cfg = pki_->path("tenants.yaml");
    std::ofstream(cfg) << TenantsYaml(*pki_);
    daemon_ = StartDaemon({"--config", cfg, "--pool-mb", "8", "--tier-path", tier_, "--tier-mb",
                           "256"});
    return daemon_ != nullptr;
  }
  // Per key: 1 = the tenant's own bytes, 0 = a miss; other bytes fail the test.
  static size_t LoadOwn(client::Client& c, const client::Codec& codec, const TenantPages& p) {
    size_t own = 0;
    for (size_t i = 0; i < p.keys.size(); ++i) {
      auto r = c.Load(codec, std::span<const BlockKey>(&p.keys[i], 1));
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || r->matched == 0) continue;
      EXPECT_EQ(r->pages[0], p.bytes[i]) << "page " << i << " served with another's bytes";
      own += r->pages[0] == p.bytes[i];
    }
    return own;
  }
  std::unique_ptr<client::Client> As(const std::string& cert) {
    client::ConnectOptions o;
    o.address = daemon_->address();
    o.rpc_timeout_ms = 5000;
    o.tls_ca_file = pki_->path("ca.pem");
    o.tls_cert_file = pki_->path(cert + ".pem");
    o.tls_key_file = pki_->path(cert + ".key");
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << cert << ": " << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  std::unique_ptr<testing::LocalDaemon> daemon_;
  std::string tier_;
};

TEST_F(TenantsTierTest, EachTenantGetsBackOnlyItsOwnTierPagesAcrossARestart) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  client::Codec ca = RegisterRefmodel(*a), cb = RegisterRefmodel(*b);
  ASSERT_EQ(ca.id, cb.id);
  constexpr size_t kPages = 40;  // ~3 MiB each: over A's 1 MiB and B's 2 MiB pool_mb
  const TenantPages pa = MakeTenantPages(ca, 500, kPages);
  TenantPages pb = pa;  // the same block keys, other bytes
  for (size_t i = 0; i < kPages; ++i) {
    pb.bytes[i] = MakePage(cb.profile, PageKind::kInt2, 9000 + i);
    pb.writes[i] = {pb.keys[i], PageKind::kInt2, pb.bytes[i]};
  }
  for (size_t i = 0; i < kPages; i += 8) {
    const auto w = [&](const TenantPages& p) {
      return std::span<const client::PageWrite>(p.writes).subspan(i, 8);
    };
    auto sa = a->Store(ca, w(pa));
    ASSERT_TRUE(sa.ok()) << sa.status();
    ASSERT_EQ(sa->failed, 0u);
    auto sb = b->Store(cb, w(pb));
    ASSERT_TRUE(sb.ok()) << sb.status();
    ASSERT_EQ(sb->failed, 0u);
  }
  // Both demoted: neither holds all of its pages in the pool, each within its pool_mb.
  for (client::Client* c : {a.get(), b.get()}) {
    auto st = c->GetStats();
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_LT(st->pages, kPages);
    EXPECT_LE(st->pool_used_bytes, st->pool_bytes);
  }
  EXPECT_EQ(LoadOwn(*a, ca, pa), kPages);
  EXPECT_EQ(LoadOwn(*b, cb, pb), kPages);
  // Promotions are charged to the promoting tenant: still within its quota.
  auto sa = a->GetStats();
  ASSERT_TRUE(sa.ok());
  EXPECT_GT(sa->pool_used_bytes, 0u);
  EXPECT_LE(sa->pool_used_bytes, sa->pool_bytes);

  // A restart on the same tier path gives every page back to its owner (the codecs file names
  // each registration's tenant; no client registers before the loads).
  a.reset();
  b.reset();
  ASSERT_TRUE(Restart());
  a = As("tenant-a");
  b = As("tenant-b");
  ASSERT_TRUE(a && b);
  auto stats = a->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->codecs, 1u);  // re-registered for tenant-a from the tier
  EXPECT_EQ(LoadOwn(*a, ca, pa), kPages);
  EXPECT_EQ(LoadOwn(*b, cb, pb), kPages);

  // B's clear removes B's pages, pool and tier, and none of A's.
  auto cleared = b->Clear(nullptr, /*include_pinned=*/true);
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  EXPECT_GE(*cleared, kPages);
  EXPECT_EQ(FoundKeys(*b, cb, pb.keys), 0u);
  EXPECT_EQ(LoadOwn(*a, ca, pa), kPages);
  // A's delete of one key leaves B nothing to lose and A without that page, tier included.
  auto del = a->Delete(ca, std::span<const BlockKey>(pa.keys.data(), 1));
  ASSERT_TRUE(del.ok());
  EXPECT_TRUE((*del)[0].ok()) << (*del)[0];
  EXPECT_EQ(FoundKeys(*a, ca, std::span<const BlockKey>(pa.keys.data(), 1)), 0u);
  EXPECT_EQ(FoundKeys(*a, ca, std::span<const BlockKey>(pa.keys).subspan(1)), kPages - 1);
  // Clearing A refunds every byte it was charged, promoted pages included.
  ASSERT_TRUE(a->Clear(nullptr, true).ok());
  sa = a->GetStats();
  ASSERT_TRUE(sa.ok());
  EXPECT_EQ(sa->pool_used_bytes, 0u);
  EXPECT_EQ(sa->pages, 0u);
  EXPECT_EQ(FoundKeys(*a, ca, pa.keys), 0u);
}

// UnregisterCodec with the tier: refused while the codec's pages are in the tier, then with
// drop_pages its pool and tier pages go and its registration leaves the codecs file, so a
// restart does not bring it back; tenant-b's registration of the same codec, and its pages,
// survive both. Tenant-b's call cannot reach tenant-a's registration.
TEST_F(TenantsTierTest, UnregisteredCodecsStayGoneAcrossARestart) {
  auto a = As("tenant-a"), b = As("tenant-b");
  ASSERT_TRUE(a && b);
  client::Codec ca = RegisterRefmodel(*a), cb = RegisterRefmodel(*b);
  constexpr size_t kPages = 40;  // over tenant-a's 1 MiB pool_mb: some are demoted
  const TenantPages pa = MakeTenantPages(ca, 300, kPages), pb = MakeTenantPages(cb, 400, 2);
  for (size_t i = 0; i < kPages; i += 8) {
    auto sa = a->Store(ca, std::span<const client::PageWrite>(pa.writes).subspan(i, 8));
    ASSERT_TRUE(sa.ok() && sa->failed == 0) << sa.status();
  }
  ASSERT_TRUE(b->Store(cb, pb.writes).ok());
  auto st = a->GetStats();
  ASSERT_TRUE(st.ok());
  ASSERT_LT(st->pages, kPages);  // the rest are in the tier
  auto refused = a->UnregisterCodec(ca.id, /*drop_pages=*/false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("SSD-tier pages"), std::string::npos);
  ASSERT_TRUE(b->UnregisterCodec(cb.id, false).status().code() ==
              absl::StatusCode::kFailedPrecondition);  // b's own, with b's pages
  auto dropped = a->UnregisterCodec(ca.id, /*drop_pages=*/true);
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_GE(*dropped, kPages);
  EXPECT_EQ(a->UnregisterCodec(ca.id, true).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a->Lookup(ca, pa.keys).status().code(), absl::StatusCode::kNotFound);
  st = a->GetStats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->codecs, 0u);
  EXPECT_EQ(st->pool_used_bytes, 0u);
  EXPECT_EQ(FoundKeys(*b, cb, pb.keys), 2u);

  a.reset();
  b.reset();
  ASSERT_TRUE(Restart());
  a = As("tenant-a");
  b = As("tenant-b");
  ASSERT_TRUE(a && b);
  st = a->GetStats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->codecs, 0u);  // not re-registered from the tier
  auto sb = b->GetStats();
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->codecs, 1u);  // b's is
  EXPECT_EQ(a->Lookup(ca, pa.keys).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FoundKeys(*b, cb, pb.keys), 2u);
  ca = RegisterRefmodel(*a);  // registered anew: empty
  EXPECT_EQ(FoundKeys(*a, ca, pa.keys), 0u);
}

// A tier written without tenants -- as a codecs file of before namespaces (OKVCODE1) too -- still
// serves a daemon without tenants, and a daemon with tenants refuses it at start, saying why.
TEST_F(TenantsTierTest, ATierWrittenWithoutTenantsStaysReadableOrIsRefusedClearly) {
  ASSERT_EQ(*daemon_->Stop(), 0);
  daemon_.reset();
  std::filesystem::remove_all(tier_);
  const std::vector<std::string> plain = {"--pool-mb", "8", "--tier-path", tier_, "--tier-mb",
                                          "64"};
  auto d = StartDaemon(plain);
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const TenantPages p = MakeTenantPages(codec, 700, 4);
  ASSERT_TRUE(c->Store(codec, p.writes).ok());
  c.reset();
  ASSERT_EQ(*d->Stop(), 0);  // SIGTERM demotes the pages

  // Rewrite the codecs file as the old format: OKVCODE1, records of (u32 length, profile).
  const std::string codecs = tier_ + "/codecs";
  const std::string v2 = ReadTextFile(codecs);
  ASSERT_EQ(v2.substr(0, 8), "OKVCODE2");
  uint32_t label = 0;
  std::memcpy(&label, v2.data() + 8, 4);
  ASSERT_EQ(label, 0u);  // no tenants: the empty namespace label
  std::ofstream(codecs, std::ios::binary | std::ios::trunc) << "OKVCODE1" << v2.substr(12);
  d = StartDaemon(plain);
  ASSERT_NE(d, nullptr);
  c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(TenantsTierTest::LoadOwn(*c, codec, p), p.keys.size());
  c.reset();
  ASSERT_EQ(*d->Stop(), 0);

  // With tenants its pages would have no owner: refused, naming the tier and the way out.
  const std::string cfg = pki_->path("tenants.yaml");
  std::ofstream(cfg) << TenantsYaml(*pki_);
  testing::LocalDaemonOptions o;
  o.binary = OSCARKVD_PATH;
  o.log_path = pki_->path("refused.log");
  o.flags = {"--metrics-listen", "off", "--shm-name", UniqueShmName("oscarkv-it-tt", 0),
             "--config", cfg};
  o.flags.insert(o.flags.end(), plain.begin(), plain.end());
  auto refused = testing::LocalDaemon::Start(o);
  EXPECT_FALSE(refused.ok());
  const std::string log = ReadTextFile(o.log_path);
  EXPECT_NE(log.find("holds pages of a daemon without tenants"), std::string::npos) << log;
  EXPECT_NE(log.find("move the directory away"), std::string::npos) << log;
}

}  // namespace
}  // namespace oscarkv::testing
