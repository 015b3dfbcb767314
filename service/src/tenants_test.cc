#include "oscarkv/service/tenants.h"

#include <thread>

#include "gtest/gtest.h"
#include "oscarkv/service/config.h"

namespace oscarkv::service {
namespace {

constexpr const char* kTwoTenants = R"(tls:
  cert: s.pem
  key: s.key
  client_ca: ca.pem
tenants:
  - name: tenant-a
    quota: {pool_mb: 16, pinned_pages: 10, leases: 3, handles: 2, codecs: 1}
    uids: [1000]
  - name: spiffe://example.org/tenant-b
    uids: [1001]
    gids: [2000]
  - name: admin
    role: admin
shared_namespaces:
  - name: common
    tenants: [tenant-a, spiffe://example.org/tenant-b]
)";

DaemonConfig Parsed(const std::string& yaml) {
  DaemonConfig c;
  absl::Status s = ApplyConfigYaml(yaml, "t.yaml", &c);
  EXPECT_TRUE(s.ok()) << s;
  return c;
}

TEST(TenantsConfig, ParsesTenantsQuotasRolesPeersAndSharedNamespaces) {
  DaemonConfig c = Parsed(kTwoTenants);
  ASSERT_EQ(c.tenants.size(), 3u);
  EXPECT_EQ(c.tenants[0].name, "tenant-a");
  EXPECT_EQ(c.tenants[0].pool_mb, 16u);
  EXPECT_EQ(c.tenants[0].codecs, 1u);
  EXPECT_EQ(c.tenants[0].uids, std::vector<uint32_t>{1000});
  EXPECT_FALSE(c.tenants[0].admin);
  EXPECT_FALSE(c.tenants[1].pool_mb.has_value());
  EXPECT_EQ(c.tenants[1].gids, std::vector<uint32_t>{2000});
  EXPECT_TRUE(c.tenants[2].admin);
  ASSERT_EQ(c.shared_namespaces.size(), 1u);
  EXPECT_EQ(c.shared_namespaces[0].tenants.size(), 2u);
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
}

TEST(TenantsConfig, ErrorsNameTheProblem) {
  auto error = [](const std::string& yaml) -> std::string {
    DaemonConfig c;
    absl::Status s = ApplyConfigYaml(yaml, "t.yaml", &c);
    if (s.ok()) s = c.Validate();
    return s.ok() ? "OK" : std::string(s.message());
  };
  const std::string tls = "tls: {cert: s.pem, key: s.key, client_ca: ca.pem}\n";
  EXPECT_NE(error(tls + "tenants:\n  - name: a\n    quota: {pool: 3}\n").find("unknown quota"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - name: a\n    quota: {leases: -1}\n")
                .find("tenants[0].quota.leases"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - name: a\n    colour: red\n").find("unknown key"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - name: a\n    role: root\n").find("admin or tenant"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - quota: {leases: 1}\n").find("has no name"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - name: a\n  - name: a\n").find("used twice"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - name: a b\n").find("printable"), std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - {name: a, uids: [7]}\n  - {name: b, uids: [7]}\n")
                .find("uid 7 is mapped to two tenants"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants: {name: a}\n").find("must be a list"), std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - name: a\nshared_namespaces:\n  - {name: c, tenants: [z]}\n")
                .find("unknown tenant 'z'"),
            std::string::npos);
  EXPECT_NE(error(tls + "tenants:\n  - {name: a, quota: {codecs: 200}}\n"
                        "  - {name: b, quota: {codecs: 57}}\n")
                .find("add up to 257"),
            std::string::npos);
  // Tenants and the SSD tier work together (the tier keys pages by namespace too).
  EXPECT_EQ(error(tls + "tier: {path: /tmp/t, capacity_mb: 8}\ntenants:\n  - name: a\n"), "OK");
  // Tenants without mTLS: nobody could be told apart.
  EXPECT_NE(error("tenants:\n  - name: a\n").find("need mTLS"), std::string::npos);
  EXPECT_EQ(error(tls + "tenants:\n  - name: a\n"), "OK");
}

TEST(Tenants, QuotasChargeRefundAndNameTheQuota) {
  DaemonConfig c = Parsed(kTwoTenants);
  auto reg = TenantRegistry::Create(c, uint64_t{300} << 20);
  ASSERT_TRUE(reg.ok()) << reg.status();
  Tenant* a = (*reg)->Find("tenant-a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->limit(Quota::kPoolBytes), uint64_t{16} << 20);
  EXPECT_TRUE(a->Charge(Quota::kLeases, 3).ok());
  absl::Status over = a->Charge(Quota::kLeases, 1);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("leases quota (3"), absl::string_view::npos) << over;
  EXPECT_NE(over.message().find("tenant-a"), absl::string_view::npos) << over;
  EXPECT_EQ(a->used(Quota::kLeases), 3u);
  a->Refund(Quota::kLeases, 1);
  EXPECT_TRUE(a->Charge(Quota::kLeases, 1).ok());
  a->Refund(Quota::kLeases, 100);  // never below zero
  EXPECT_EQ(a->used(Quota::kLeases), 0u);
  over = a->Charge(Quota::kPoolBytes, uint64_t{17} << 20);
  EXPECT_NE(over.message().find("pool_mb quota (16 MiB"), absl::string_view::npos) << over;

  // Defaults: an even share of the pool, and the documented counts.
  Tenant* b = (*reg)->Find("spiffe://example.org/tenant-b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->limit(Quota::kPoolBytes), uint64_t{100} << 20);
  EXPECT_EQ(b->limit(Quota::kPinnedPages), kDefaultQuotaPinnedPages);
  EXPECT_EQ(b->limit(Quota::kLeases), kDefaultQuotaLeases);
  EXPECT_EQ(b->limit(Quota::kHandles), kDefaultQuotaHandles);
  EXPECT_EQ(b->limit(Quota::kCodecs), kDefaultQuotaCodecs);
  // One tenant's charges never touch another's.
  EXPECT_EQ(b->used(Quota::kLeases), 0u);
}

TEST(Tenants, ChargesAreExactUnderConcurrency) {
  DaemonConfig c = Parsed(kTwoTenants);
  auto reg = TenantRegistry::Create(c, uint64_t{300} << 20);
  ASSERT_TRUE(reg.ok());
  Tenant* a = (*reg)->Find("tenant-a");
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) granted += a->Charge(Quota::kPinnedPages, 1).ok();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 10);
  EXPECT_EQ(a->used(Quota::kPinnedPages), 10u);
}

TEST(Tenants, IdentityFromCertificateNamesAndPeerCredentials) {
  DaemonConfig c = Parsed(kTwoTenants);
  auto reg = TenantRegistry::Create(c, uint64_t{300} << 20);
  ASSERT_TRUE(reg.ok());
  const TenantRegistry& r = **reg;
  EXPECT_TRUE(r.configured());
  auto t = r.FromCertificate({"tenant-a"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->name(), "tenant-a");
  // CN unknown, URI SAN known.
  t = r.FromCertificate({"some-host", "spiffe://example.org/tenant-b"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->name(), "spiffe://example.org/tenant-b");
  EXPECT_EQ(r.FromCertificate({"mallory"}).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r.FromCertificate({}).status().code(), absl::StatusCode::kUnauthenticated);

  ASSERT_TRUE(r.FromPeer(1000, 1000, 0).ok());
  EXPECT_EQ((*r.FromPeer(1000, 1000, 0))->name(), "tenant-a");
  EXPECT_EQ((*r.FromPeer(4242, 2000, 0))->name(), "spiffe://example.org/tenant-b");  // by gid
  // Root is no tenant unless mapped.
  EXPECT_EQ(r.FromPeer(0, 0, 0).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(r.maps_local_peers());

  // Namespaces: own, shared for members only.
  Tenant* a = r.Find("tenant-a");
  Tenant* admin = r.Find("admin");
  EXPECT_EQ(*r.NamespaceFor(*a, ""), a->id());
  auto common = r.NamespaceFor(*a, "common");
  ASSERT_TRUE(common.ok());
  EXPECT_TRUE(r.ns(*common)->shared);
  EXPECT_EQ(r.NamespaceFor(*admin, "common").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(r.NamespaceFor(*a, "nope").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(r.MayUse(*a, admin->id()));
}

TEST(Tenants, WithoutTenantsOneDefaultAdminTenantServesEveryone) {
  DaemonConfig c;
  auto reg = TenantRegistry::Create(c, uint64_t{64} << 20);
  ASSERT_TRUE(reg.ok());
  const TenantRegistry& r = **reg;
  EXPECT_FALSE(r.configured());
  EXPECT_EQ(r.size(), 1u);
  auto t = r.FromCertificate({});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE((*t)->admin());
  EXPECT_EQ((*t)->name(), TenantRegistry::kDefaultTenant);
  EXPECT_EQ((*t)->limit(Quota::kCodecs), c.max_codecs);
  EXPECT_EQ((*t)->limit(Quota::kLeases), kUnlimited);  // bounded by its pins
  EXPECT_EQ((*t)->limit(Quota::kPinnedPages), kSingleTenantPinnedPages);
  EXPECT_TRUE(r.FromPeer(0, 0, 1234).ok());
  EXPECT_TRUE(r.FromPeer(1234, 5, 1234).ok());
  EXPECT_EQ(r.FromPeer(99, 99, 1234).status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace oscarkv::service

namespace oscarkv::service {
namespace {

// pool_mb quotas promise room in the pool: together they must fit it, else the daemon refuses
// the config at start, naming the sum and the pool. Tenants without one get an even share of
// the pool, or what the explicit quotas leave when that is less.
TEST(Tenants, PoolQuotasMustFitThePool) {
  const std::string tls = "tls: {cert: /s.pem, key: /s.key, client_ca: /ca.pem}\n";
  auto create = [&](const std::string& tenants, uint64_t pool_mb) {
    DaemonConfig c;
    absl::Status s = ApplyConfigYaml(tls + "tenants:\n" + tenants, "t.yaml", &c);
    EXPECT_TRUE(s.ok()) << s;
    return TenantRegistry::Create(c, pool_mb << 20);
  };
  auto over = create("  - {name: a, quota: {pool_mb: 40}}\n  - {name: b, quota: {pool_mb: 40}}\n",
                     64);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument) << over.status();
  EXPECT_NE(over.status().message().find("pool_mb quotas add up to 80 MiB"), std::string::npos)
      << over.status();
  EXPECT_NE(over.status().message().find("the pool holds 64 MiB"), std::string::npos)
      << over.status();
  // Nothing left for the tenant without a quota.
  auto none_left = create("  - {name: a, quota: {pool_mb: 64}}\n  - {name: b}\n", 64);
  EXPECT_EQ(none_left.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none_left.status().message().find("1 tenant(s) without one"), std::string::npos)
      << none_left.status();
  // Exactly the pool: fine.
  auto exact = create("  - {name: a, quota: {pool_mb: 32}}\n  - {name: b, quota: {pool_mb: 32}}\n",
                      64);
  ASSERT_TRUE(exact.ok()) << exact.status();
  // b and c share what a leaves (24 MiB) rather than a third of the pool (21 MiB each would
  // still fit; 40 + 21 + 21 would not): each gets min(64 / 3, 24 / 2) = 12 MiB.
  auto mixed = create("  - {name: a, quota: {pool_mb: 40}}\n  - {name: b}\n  - {name: c}\n", 64);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ((*mixed)->Find("b")->limit(Quota::kPoolBytes), uint64_t{12} << 20);
  EXPECT_EQ((*mixed)->Find("c")->limit(Quota::kPoolBytes), uint64_t{12} << 20);
  // Without explicit quotas: the even share, as before.
  auto even = create("  - {name: a}\n  - {name: b}\n", 64);
  ASSERT_TRUE(even.ok());
  EXPECT_EQ((*even)->Find("a")->limit(Quota::kPoolBytes), uint64_t{32} << 20);
}

}  // namespace
}  // namespace oscarkv::service
