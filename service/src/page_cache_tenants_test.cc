// PageCache with configured tenants (tenants.h): namespaces keep equal keys apart, ids and handle
// names of another tenant are unknown, quotas are charged and given back exactly (leases ended
// by Release and by the reaper, handles closed and expired, pages deleted and evicted), and a
// tenant over its pool quota evicts only its own pages.
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "oscarkv/service/config.h"
#include "oscarkv/service/metrics.h"
#include "oscarkv/service/page_cache.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::BKey;
using testing::Bytes;
using testing::MakePage;
using testing::TinyProfile;
using Code = absl::StatusCode;

class PageCacheTenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig c;
    ASSERT_TRUE(ApplyConfigYaml(R"(tenants:
  - name: a
    quota: {pool_mb: 1, pinned_pages: 3, leases: 2, handles: 1, codecs: 2}
  - name: b
shared_namespaces:
  - {name: common, tenants: [a, b]}
)",
                                "t.yaml", &c)
                    .ok());
    auto reg = TenantRegistry::Create(c, uint64_t{4} << 20);
    ASSERT_TRUE(reg.ok()) << reg.status();
    tenants_ = *std::move(reg);
    auto arena = CreateHeapArena(4 << 20);
    ASSERT_TRUE(arena.ok());
    PagePoolOptions po;
    po.chunk_bytes = 64 << 10;
    pool_ = std::move(*PagePool::Create(std::move(*arena), po));
    CacheOptions co;
    co.index_shards = 4;
    co.default_lease_ms = 1000;
    co.tenants = tenants_.get();
    cache_ = std::make_unique<PageCache>(pool_.get(), &clock_, co);
    a_ = CallerOf("a", "");
    b_ = CallerOf("b", "");
    for (const Caller& c : {a_, b_}) {
      auto reg_codec = cache_->RegisterCodec(c, testing::ToProfile(TinyProfile()));
      ASSERT_TRUE(reg_codec.ok()) << reg_codec.status();
      codec_ = reg_codec->id;
    }
  }

  Caller CallerOf(const std::string& tenant, const std::string& ns) {
    Tenant* t = tenants_->Find(tenant);
    Caller c;
    c.tenant = tenant;
    c.admin = t->admin();
    c.tenant_id = t->id();
    c.ns = *tenants_->NamespaceFor(*t, ns);
    return c;
  }

  // Reserve + write + commit of page `id`; the Reserve item's status.
  absl::Status Store(const Caller& c, uint32_t id) {
    ReserveArgs args;
    args.codec = codec_;
    args.items.push_back({BKey(id), PageKind::kInt2});
    auto r = cache_->Reserve(c, args);
    if (!r.ok()) return r.status();
    if (!r->items[0].status.ok()) return r->items[0].status;
    const std::string page = MakePage(TinyProfile(), PageKind::kInt2, id);
    auto w = cache_->WriteChunk(c, {r->reservation_id, BKey(id), 0, Bytes(page)});
    if (!w.ok()) return w.status();
    CommitArgs ca;
    ca.reservation_id = r->reservation_id;
    ca.all_items = true;
    auto done = cache_->Commit(c, ca);
    if (!done.ok()) return done.status();
    return (*done)[0];
  }

  uint32_t Matched(const Caller& c, uint32_t id) {
    const BlockKey k = BKey(id);
    auto r = cache_->Lookup(c, {codec_, std::span<const BlockKey>(&k, 1)});
    return r.ok() ? r->matched : 99;
  }

  absl::StatusOr<LookupResult> Pin(const Caller& c, std::vector<BlockKey> keys) {
    keys_hold_ = std::move(keys);
    return cache_->Lookup(c, {codec_, keys_hold_, /*pin=*/true});
  }

  FakeClock clock_;
  std::unique_ptr<TenantRegistry> tenants_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PageCache> cache_;
  Caller a_, b_;
  CodecId codec_;
  std::vector<BlockKey> keys_hold_;
};

TEST_F(PageCacheTenantsTest, EqualKeysOfTwoTenantsAreTwoPages) {
  ASSERT_TRUE(Store(a_, 1).ok());
  EXPECT_EQ(Matched(a_, 1), 1u);
  EXPECT_EQ(Matched(b_, 1), 0u);
  ASSERT_TRUE(Store(b_, 1).ok());  // not ALREADY_EXISTS: B's own copy
  EXPECT_EQ(tenants_->Find("a")->pages.load(), 1u);
  EXPECT_EQ(tenants_->Find("b")->pages.load(), 1u);
  // B's delete of the key removes B's page only.
  auto del = cache_->Delete(b_, {codec_, {BKey(1)}});
  ASSERT_TRUE(del.ok());
  EXPECT_TRUE((*del)[0].ok());
  EXPECT_EQ(Matched(a_, 1), 1u);
  EXPECT_EQ(Matched(b_, 1), 0u);
  // A shared namespace is a third place: empty until a member stores there.
  const Caller common = CallerOf("b", "common");
  ASSERT_TRUE(cache_->RegisterCodec(common, testing::ToProfile(TinyProfile())).ok());
  EXPECT_EQ(Matched(common, 1), 0u);
  ASSERT_TRUE(Store(common, 1).ok());
  EXPECT_EQ(Matched(CallerOf("a", "common"), 1), 1u);
}

TEST_F(PageCacheTenantsTest, IdsOfAnotherTenantAreUnknown) {
  ASSERT_TRUE(Store(a_, 2).ok());
  auto lease = Pin(a_, {BKey(2)});
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(cache_->RenewLease(b_, {lease->lease_id, 100}).status().code(), Code::kNotFound);
  EXPECT_EQ(cache_->PrepareRead(b_, {lease->lease_id, {}}).status().code(), Code::kNotFound);
  EXPECT_TRUE(cache_->Release(b_, lease->lease_id).ok());  // a no-op
  EXPECT_TRUE(cache_->RenewLease(a_, {lease->lease_id, 100}).ok());
  EXPECT_TRUE(cache_->Release(a_, lease->lease_id).ok());

  ReserveArgs args;
  args.codec = codec_;
  args.items.push_back({BKey(3), PageKind::kInt2});
  auto r = cache_->Reserve(a_, args);
  ASSERT_TRUE(r.ok() && r->items[0].status.ok());
  const std::string page = MakePage(TinyProfile(), PageKind::kInt2, 3);
  EXPECT_EQ(cache_->WriteChunk(b_, {r->reservation_id, BKey(3), 0, Bytes(page)}).status().code(),
            Code::kNotFound);
  CommitArgs ca{r->reservation_id, true, {}, false};
  EXPECT_EQ(cache_->Commit(b_, ca).status().code(), Code::kNotFound);
  EXPECT_TRUE(cache_->Abort(b_, r->reservation_id).ok());  // a no-op
  ASSERT_TRUE(cache_->WriteChunk(a_, {r->reservation_id, BKey(3), 0, Bytes(page)}).ok());
  auto done = cache_->Commit(a_, ca);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE((*done)[0].ok()) << (*done)[0];
}

TEST_F(PageCacheTenantsTest, QuotasAreGivenBackByReleaseReaperCloseAndDelete) {
  Tenant& a = *tenants_->Find("a");
  for (uint32_t id : {10, 11, 12}) ASSERT_TRUE(Store(a_, id).ok());
  auto l1 = Pin(a_, {BKey(10), BKey(11)});
  ASSERT_TRUE(l1.ok()) << l1.status();
  EXPECT_EQ(a.used(Quota::kLeases), 1u);
  EXPECT_EQ(a.used(Quota::kPinnedPages), 2u);
  // 2 + 2 > 3 pins: refused, and nothing of it stays charged or pinned.
  auto over = Pin(a_, {BKey(11), BKey(12)});
  EXPECT_EQ(over.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a.used(Quota::kLeases), 1u);
  EXPECT_EQ(a.used(Quota::kPinnedPages), 2u);
  EXPECT_EQ(cache_->counters().pinned_pages.load(), 2);
  ASSERT_TRUE(cache_->Release(a_, l1->lease_id).ok());
  EXPECT_EQ(a.used(Quota::kLeases), 0u);
  EXPECT_EQ(a.used(Quota::kPinnedPages), 0u);
  // The reaper gives an expired lease back too.
  ASSERT_TRUE(Pin(a_, {BKey(12)}).ok());
  clock_.Advance(2000);
  cache_->Reap();
  EXPECT_EQ(a.used(Quota::kLeases), 0u);
  EXPECT_EQ(a.used(Quota::kPinnedPages), 0u);
  // Handles: one allowed; closing gives it (and its pins) back.
  PublishHandleArgs h{"h", codec_, {BKey(10)}, "", 0};
  ASSERT_TRUE(cache_->PublishHandle(a_, h).ok());
  h.name = "h2";
  EXPECT_EQ(cache_->PublishHandle(a_, h).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a.used(Quota::kPinnedPages), 1u);
  EXPECT_EQ(cache_->OpenHandle(b_, {"h", 0}).status().code(), Code::kNotFound);
  EXPECT_TRUE(cache_->CloseHandle(b_, "h").ok());  // B has no "h": a no-op
  EXPECT_EQ(a.used(Quota::kHandles), 1u);
  ASSERT_TRUE(cache_->CloseHandle(a_, "h").ok());
  EXPECT_EQ(a.used(Quota::kHandles), 0u);
  EXPECT_EQ(a.used(Quota::kPinnedPages), 0u);
  // Pool bytes: deleting every page gives them all back.
  EXPECT_GT(a.used(Quota::kPoolBytes), 0u);
  auto del = cache_->Delete(a_, {codec_, {BKey(10), BKey(11), BKey(12)}});
  ASSERT_TRUE(del.ok());
  EXPECT_EQ(a.used(Quota::kPoolBytes), 0u);
  EXPECT_EQ(a.pages.load(), 0u);
  // Codecs: two for a (tiny, registered in SetUp, and one more); b registers others.
  ASSERT_TRUE(cache_->RegisterCodec(a_, testing::ToProfile(TinyProfile("other"))).ok());
  auto third = cache_->RegisterCodec(a_, testing::ToProfile(TinyProfile("third")));
  EXPECT_EQ(third.status().code(), Code::kResourceExhausted);
  EXPECT_NE(third.status().message().find("codecs quota"), absl::string_view::npos);
  EXPECT_TRUE(cache_->RegisterCodec(b_, testing::ToProfile(TinyProfile("other"))).ok());
}

TEST_F(PageCacheTenantsTest, OverItsPoolQuotaATenantEvictsOnlyItsOwnPages) {
  Tenant& a = *tenants_->Find("a");
  ASSERT_TRUE(Store(b_, 500).ok());
  const uint64_t quota = a.limit(Quota::kPoolBytes);  // 1 MiB: 1260 pages of 832 bytes
  constexpr uint32_t kPages = 1500;
  uint32_t stored = 0;
  for (uint32_t id = 0; id < kPages; ++id) stored += Store(a_, id).ok();
  EXPECT_EQ(stored, kPages);  // each store over the quota evicted an older page of a
  EXPECT_LE(a.used(Quota::kPoolBytes), quota);
  EXPECT_LT(a.pages.load(), kPages);
  EXPECT_GT(a.pages.load(), kPages / 2);
  EXPECT_EQ(Matched(b_, 500), 1u);
  EXPECT_EQ(Matched(a_, kPages - 1), 1u);  // the newest survived
  // Clear gives every byte back.
  ASSERT_TRUE(cache_->Clear(a_, {}).ok());
  EXPECT_EQ(a.used(Quota::kPoolBytes), 0u);
}

// Per-tenant Prometheus series: pages, lookups, quota use, limits and refusals, labelled by
// tenant; a store over the pool quota that evicts the tenant's own pages is no refusal, a
// Reserve item that finds every page of the tenant reserved is one.
TEST_F(PageCacheTenantsTest, MetricsHaveSeriesPerTenant) {
  Tenant& a = *tenants_->Find("a");
  for (uint32_t id : {20, 21}) ASSERT_TRUE(Store(a_, id).ok());
  ASSERT_TRUE(Store(b_, 20).ok());
  EXPECT_EQ(Matched(a_, 20), 1u);
  EXPECT_EQ(Matched(b_, 99), 0u);
  auto l1 = Pin(a_, {BKey(20), BKey(21)});
  ASSERT_TRUE(l1.ok()) << l1.status();
  EXPECT_EQ(Pin(a_, {BKey(20), BKey(21)}).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a.refusals(Quota::kPinnedPages), 1u);
  EXPECT_EQ(a.refusals(Quota::kLeases), 0u);
  ASSERT_TRUE(cache_->Release(a_, l1->lease_id).ok());

  // 1500 stores into a 1 MiB quota (1260 pages): older pages of a are evicted, nothing refused.
  for (uint32_t id = 100; id < 1600; ++id) ASSERT_TRUE(Store(a_, id).ok()) << id;
  EXPECT_EQ(a.refusals(Quota::kPoolBytes), 0u);
  ASSERT_TRUE(cache_->Clear(a_, {}).ok());
  // Reserved, uncommitted slots cannot be evicted: past the quota the items are refused.
  uint32_t refused = 0;
  for (uint32_t batch = 0; batch < 2; ++batch) {
    ReserveArgs args;
    args.codec = codec_;
    for (uint32_t i = 0; i < 700; ++i) {
      args.items.push_back({BKey(5000 + batch * 700 + i), PageKind::kInt2});
    }
    auto r = cache_->Reserve(a_, args);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const auto& item : r->items) refused += item.status.code() == Code::kResourceExhausted;
  }
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(a.refusals(Quota::kPoolBytes), refused);

  Metrics m;
  const std::string text = m.Render(*cache_);
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find("\n" + line + "\n"), std::string::npos) << line << "\n" << text;
  };
  has("# TYPE oscarkv_tenant_quota_refusals_total counter");
  has("oscarkv_tenant_pages{tenant=\"b\"} 1");
  has("oscarkv_tenant_lookups_total{tenant=\"b\"} 1");
  has("oscarkv_tenant_lookup_misses_total{tenant=\"b\"} 1");
  has("oscarkv_tenant_quota_refusals_total{tenant=\"a\",quota=\"pinned_pages\"} 1");
  has("oscarkv_tenant_quota_refusals_total{tenant=\"a\",quota=\"pool_bytes\"} " +
      std::to_string(refused));
  has("oscarkv_tenant_quota_refusals_total{tenant=\"b\",quota=\"pool_bytes\"} 0");
  has("oscarkv_tenant_quota_used{tenant=\"a\",quota=\"pool_bytes\"} " +
      std::to_string(a.used(Quota::kPoolBytes)));
  has("oscarkv_tenant_quota_limit{tenant=\"a\",quota=\"pool_bytes\"} " +
      std::to_string(a.limit(Quota::kPoolBytes)));
  has("oscarkv_tenant_quota_limit{tenant=\"a\",quota=\"leases\"} 2");
  has("oscarkv_tenant_quota_used{tenant=\"b\",quota=\"codecs\"} 1");
  // b's limits are the defaults (pool_mb: an even share of the pool; pinned_pages 4096).
  has("oscarkv_tenant_quota_limit{tenant=\"b\",quota=\"pool_bytes\"} " +
      std::to_string(tenants_->Find("b")->limit(Quota::kPoolBytes)));
  has("oscarkv_tenant_quota_limit{tenant=\"b\",quota=\"pinned_pages\"} 4096");
}

}  // namespace
}  // namespace oscarkv::service
