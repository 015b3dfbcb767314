// PageCache with configured tenants (tenants.h): namespaces keep equal keys apart, ids and handle
// names of another tenant are unknown, quotas are charged and given back exactly (leases ended
// by Release and by the reaper, handles closed and expired, pages deleted and evicted), and a
// tenant over its pool quota evicts only its own pages.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

// UnregisterCodec: the slot and the owner's codec quota come back; another tenant's
// registration is NOT_FOUND to it; in use it is refused unless drop_pages, which removes the
// pages (a pinned one's lease keeps its memory until released), reservations and handles.
TEST_F(PageCacheTenantsTest, UnregisterCodecFreesItsSlotAndQuota) {
  Tenant& a = *tenants_->Find("a");
  const CodecProfile other = testing::ToProfile(TinyProfile("other"));
  auto second = cache_->RegisterCodec(a_, other);
  ASSERT_TRUE(second.ok()) << second.status();
  const CodecProfile third = testing::ToProfile(TinyProfile("third"));
  EXPECT_EQ(cache_->RegisterCodec(a_, third).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a.used(Quota::kCodecs), 2u);
  EXPECT_EQ(cache_->codecs(), 3u);  // a's two, b's one
  auto un = cache_->UnregisterCodec(a_, second->id, false);
  ASSERT_TRUE(un.ok()) << un.status();
  EXPECT_EQ(un->codecs, 1u);
  EXPECT_EQ(un->pages_removed, 0u);
  EXPECT_EQ(a.used(Quota::kCodecs), 1u);
  EXPECT_EQ(cache_->codecs(), 2u);
  // Gone: a second call and every call naming it are NOT_FOUND.
  EXPECT_EQ(cache_->UnregisterCodec(a_, second->id, false).status().code(), Code::kNotFound);
  const BlockKey k = BKey(1);
  EXPECT_EQ(cache_->Lookup(a_, {second->id, std::span<const BlockKey>(&k, 1)}).status().code(),
            Code::kNotFound);
  // The freed quota and slot take another registration; 256 cycles never fill the table.
  for (int i = 0; i < 300; ++i) {
    auto r = cache_->RegisterCodec(a_, i % 2 ? other : third);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status();
    ASSERT_TRUE(cache_->UnregisterCodec(a_, r->id, false).ok()) << i;
  }
  EXPECT_EQ(a.used(Quota::kCodecs), 1u);
  EXPECT_EQ(cache_->codecs(), 2u);
}

TEST_F(PageCacheTenantsTest, UnregisterCodecOfAnotherTenantIsNotFound) {
  ASSERT_TRUE(Store(a_, 1).ok());
  const CodecProfile other = testing::ToProfile(TinyProfile("other"));
  auto only_a = cache_->RegisterCodec(a_, other);
  ASSERT_TRUE(only_a.ok());
  // b never registered `other`: a's registration of it is not b's to see.
  EXPECT_EQ(cache_->UnregisterCodec(b_, only_a->id, true).status().code(), Code::kNotFound);
  // b's own registration of the shared profile goes; a's (with its page) stays.
  ASSERT_TRUE(cache_->UnregisterCodec(b_, codec_, true).ok());
  EXPECT_EQ(Matched(a_, 1), 1u);
  EXPECT_EQ(cache_->Lookup(b_, {codec_, {}}).status().code(), Code::kNotFound);
  ASSERT_TRUE(cache_->UnregisterCodec(a_, only_a->id, false).ok());  // a's codecs quota is 2
  // A shared namespace's registration belongs to the member that made it.
  const Caller a_common = CallerOf("a", "common"), b_common = CallerOf("b", "common");
  ASSERT_TRUE(cache_->RegisterCodec(a_common, testing::ToProfile(TinyProfile())).ok());
  EXPECT_EQ(cache_->UnregisterCodec(b_common, codec_, false).status().code(),
            Code::kPermissionDenied);
  EXPECT_TRUE(cache_->UnregisterCodec(a_common, codec_, false).ok());
  EXPECT_EQ(Matched(a_, 1), 1u);
}

TEST_F(PageCacheTenantsTest, UnregisterCodecInUseNeedsDropPages) {
  Tenant& a = *tenants_->Find("a");
  for (uint32_t id : {1, 2, 3}) ASSERT_TRUE(Store(a_, id).ok());
  auto un = cache_->UnregisterCodec(a_, codec_, false);
  EXPECT_EQ(un.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(un.status().message().find("3 pool pages"), absl::string_view::npos) << un.status();
  EXPECT_EQ(Matched(a_, 1), 1u);  // refused: nothing changed
  // A pinned page, a handle and a reservation still being stored: all dropped.
  auto lease = Pin(a_, {BKey(1)});
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(cache_->PublishHandle(a_, {"h", codec_, {BKey(2)}, "", 0}).ok());
  ReserveArgs args;
  args.codec = codec_;
  args.items.push_back({BKey(9), PageKind::kInt2});
  auto res = cache_->Reserve(a_, args);
  ASSERT_TRUE(res.ok() && res->items[0].status.ok());
  EXPECT_EQ(cache_->UnregisterCodec(a_, codec_, false).status().code(),
            Code::kFailedPrecondition);
  un = cache_->UnregisterCodec(a_, codec_, true);
  ASSERT_TRUE(un.ok()) << un.status();
  EXPECT_EQ(un->pages_removed, 3u);
  EXPECT_EQ(a.pages.load(), 0u);
  EXPECT_EQ(a.used(Quota::kHandles), 0u);
  EXPECT_EQ(a.used(Quota::kCodecs), 0u);
  EXPECT_EQ(cache_->OpenHandle(a_, {"h", 0}).status().code(), Code::kNotFound);
  CommitArgs ca{res->reservation_id, true, {}, false};
  EXPECT_EQ(cache_->Commit(a_, ca).status().code(), Code::kNotFound);
  EXPECT_EQ(cache_->OpenReservations(), 0u);
  // The lease still holds its page's memory until released; then everything is back.
  EXPECT_GT(pool_->bytes_used(), 0u);
  ASSERT_TRUE(cache_->Release(a_, lease->lease_id).ok());
  EXPECT_EQ(a.used(Quota::kPinnedPages), 0u);
  EXPECT_EQ(a.used(Quota::kPoolBytes), 0u);
  // Registered again: the same id, an empty codec (b's pages were never touched).
  ASSERT_TRUE(cache_->RegisterCodec(a_, testing::ToProfile(TinyProfile())).ok());
  EXPECT_EQ(Matched(a_, 1), 0u);
  ASSERT_TRUE(Store(a_, 1).ok());
  EXPECT_EQ(Matched(a_, 1), 1u);
}

TEST_F(PageCacheTenantsTest, FreeUnusedCodecsFreesOnlyEmptyOwnRegistrations) {
  ASSERT_TRUE(Store(a_, 1).ok());
  ASSERT_TRUE(Store(b_, 1).ok());
  auto other = cache_->RegisterCodec(a_, testing::ToProfile(TinyProfile("other")));
  ASSERT_TRUE(other.ok());
  // a's `other` is empty, its tiny one holds a page: only `other` goes.
  auto freed = cache_->FreeUnusedCodecs(a_, std::nullopt);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 1u);
  EXPECT_EQ(Matched(a_, 1), 1u);
  ASSERT_TRUE(cache_->Clear(a_, {}).ok());
  freed = cache_->FreeUnusedCodecs(a_, codec_);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, 1u);
  EXPECT_EQ(tenants_->Find("a")->used(Quota::kCodecs), 0u);
  EXPECT_EQ(Matched(b_, 1), 1u);  // b's registration and page are b's
}

// Lookups, pins and stores racing the unregistration (drop_pages) and re-registration of their
// codec: every answer is OK, NOT_FOUND or a store's usual refusal, never a crash; once the
// leases are gone, the last unregistration leaves no page and no pool byte behind.
TEST_F(PageCacheTenantsTest, UnregisterRacingCallsIsSafe) {
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t i = 0; !stop.load(); ++i) {
        const uint32_t id = 100 + (i + t) % 8;
        absl::Status s = t == 0 ? Store(a_, id) : absl::OkStatus();
        if (!s.ok() && s.code() != Code::kNotFound && s.code() != Code::kAlreadyExists &&
            s.code() != Code::kAborted) {
          ++bad;
        }
        const BlockKey k = BKey(id);
        auto r = cache_->Lookup(a_, {codec_, std::span<const BlockKey>(&k, 1), t == 2});
        if (!r.ok() && r.status().code() != Code::kNotFound &&
            r.status().code() != Code::kResourceExhausted) {
          ++bad;
        }
        if (r.ok() && r->lease_id != 0) (void)cache_->Release(a_, r->lease_id);
      }
    });
  }
  for (int round = 0; round < 200; ++round) {
    auto un = cache_->UnregisterCodec(a_, codec_, /*drop_pages=*/true);
    ASSERT_TRUE(un.ok()) << round << ": " << un.status();
    // Nothing of the earlier registration survives into the next one.
    ASSERT_TRUE(cache_->RegisterCodec(a_, testing::ToProfile(TinyProfile())).ok());
  }
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_TRUE(cache_->UnregisterCodec(a_, codec_, true).ok());
  Tenant& a = *tenants_->Find("a");
  EXPECT_EQ(a.pages.load(), 0u);
  EXPECT_EQ(a.used(Quota::kPoolBytes), 0u);
  EXPECT_EQ(a.used(Quota::kLeases), 0u);
  EXPECT_EQ(cache_->OpenReservations(), 0u);
}

}  // namespace
}  // namespace oscarkv::service
