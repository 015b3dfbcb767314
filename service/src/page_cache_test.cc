#include "oscarkv/service/page_cache.h"

#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "test_pages.h"

namespace oscarkv::service {
namespace {

using testing::Key;
using testing::MakePage;
using testing::TinyProfile;
using Code = absl::StatusCode;

class PageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { Init(1 << 20, 4); }

  void Init(size_t pool_bytes, uint32_t shards, uint32_t max_batch = 4096) {
    cache_.reset();
    auto arena = CreateHeapArena(pool_bytes);
    ASSERT_TRUE(arena.ok());
    PagePoolOptions po;
    po.chunk_bytes = 64 << 10;
    pool_ = std::move(*PagePool::Create(std::move(*arena), po));
    CacheOptions co;
    co.index_shards = shards;
    co.max_batch = max_batch;
    co.default_lease_ms = 1000;
    co.max_lease_ms = 5000;
    co.reservation_ttl_ms = 2000;
    co.node_id = "test-node";
    cache_ = std::make_unique<PageCache>(pool_.get(), &clock_, co);
    codec_ = Register(TinyProfile());
  }

  std::string Register(const v1::CodecProfile& p) {
    v1::RegisterCodecRequest req;
    *req.mutable_profile() = p;
    v1::RegisterCodecResponse resp;
    EXPECT_TRUE(cache_->RegisterCodec(req, &resp).ok());
    return resp.codec_id();
  }

  v1::ReserveResponse Reserve(const std::vector<std::string>& keys,
                              v1::PageKind kind = v1::PAGE_KIND_INT2) {
    v1::ReserveRequest req;
    req.set_codec_id(codec_);
    for (const auto& k : keys) {
      auto* it = req.add_items();
      it->set_key(k);
      it->set_kind(kind);
    }
    v1::ReserveResponse resp;
    EXPECT_TRUE(cache_->Reserve(req, &resp).ok());
    return resp;
  }

  absl::Status Write(uint64_t res, const std::string& key, const std::string& bytes,
                     uint64_t offset = 0) {
    v1::WriteChunk c;
    c.set_reservation_id(res);
    c.set_key(key);
    c.set_offset(offset);
    c.set_data(bytes);
    uint64_t n = 0;
    return cache_->WriteChunk(c, &n);
  }

  v1::CommitResponse Commit(uint64_t res, const std::vector<std::string>& keys = {}) {
    v1::CommitRequest req;
    req.set_reservation_id(res);
    for (const auto& k : keys) req.add_keys(k);
    v1::CommitResponse resp;
    EXPECT_TRUE(cache_->Commit(req, &resp).ok());
    return resp;
  }

  // Reserve + write (in two chunks) + commit; page i gets seed i.
  void Store(const std::vector<uint32_t>& ids, uint32_t salt = 0) {
    std::vector<std::string> keys;
    for (uint32_t i : ids) keys.push_back(Key(i, salt));
    auto r = Reserve(keys);
    for (size_t j = 0; j < ids.size(); ++j) {
      ASSERT_EQ(r.results(j).status().code(), 0) << r.results(j).status().message();
      const std::string page = MakePage(TinyProfile(), PageKind::kInt2, ids[j]);
      ASSERT_TRUE(Write(r.reservation_id(), keys[j], page.substr(0, 100)).ok());
      ASSERT_TRUE(Write(r.reservation_id(), keys[j], page.substr(100), 100).ok());
    }
    auto c = Commit(r.reservation_id());
    ASSERT_EQ(c.results_size(), static_cast<int>(ids.size()));
    for (auto& s : c.results()) ASSERT_EQ(s.code(), 0) << s.message();
  }

  v1::LookupResponse Lookup(const std::vector<std::string>& keys, bool pin, uint32_t ms = 0) {
    v1::LookupRequest req;
    req.set_codec_id(codec_);
    for (const auto& k : keys) req.add_keys(k);
    req.set_pin(pin);
    req.set_lease_ms(ms);
    v1::LookupResponse resp;
    absl::Status s = cache_->Lookup(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }

  void ReleaseLease(uint64_t id) {
    v1::ReleaseRequest req;
    req.set_lease_id(id);
    v1::ReleaseResponse resp;
    EXPECT_TRUE(cache_->Release(req, &resp).ok());
  }

  FakeClock clock_;
  std::unique_ptr<PagePool> pool_;
  std::unique_ptr<PageCache> cache_;
  std::string codec_;
};

TEST_F(PageCacheTest, HandshakeChecksWireVersion) {
  v1::HandshakeRequest req;
  v1::HandshakeResponse resp;
  req.set_wire_version(7);
  absl::Status s = cache_->Handshake(req, &resp);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_NE(s.message().find("7"), absl::string_view::npos);
  EXPECT_NE(s.message().find("1"), absl::string_view::npos);
  req.set_wire_version(1);
  ASSERT_TRUE(cache_->Handshake(req, &resp).ok());
  EXPECT_EQ(resp.max_batch(), 4096u);
  EXPECT_EQ(resp.node_id(), "test-node");
  EXPECT_EQ(resp.shm_path(), "");  // heap arena: no fast path
}

TEST_F(PageCacheTest, RegisterCodecIsIdempotentAndValidates) {
  v1::RegisterCodecRequest req;
  *req.mutable_profile() = TinyProfile();
  v1::RegisterCodecResponse a, b;
  ASSERT_TRUE(cache_->RegisterCodec(req, &a).ok());
  ASSERT_TRUE(cache_->RegisterCodec(req, &b).ok());
  EXPECT_EQ(a.codec_id(), b.codec_id());
  EXPECT_EQ(a.codec_id(), codec_);
  EXPECT_EQ(a.int2_page_bytes(), 832u);
  EXPECT_EQ(a.bf16_page_bytes(), 4160u);
  EXPECT_EQ(a.codec_id(), std::string(reinterpret_cast<const char*>(
                                          testing::ToProfile(TinyProfile()).Id().bytes.data()),
                                      16));
  EXPECT_EQ(cache_->codecs(), 1u);
  req.mutable_profile()->set_head_dim(100);
  EXPECT_EQ(cache_->RegisterCodec(req, &a).code(), Code::kInvalidArgument);
  req.mutable_profile()->set_head_dim(64);
  req.mutable_profile()->set_rotation_digest("short");
  EXPECT_EQ(cache_->RegisterCodec(req, &a).code(), Code::kInvalidArgument);
  req.mutable_profile()->clear_rotation_digest();
  req.mutable_profile()->set_scale_dtype(9);
  EXPECT_EQ(cache_->RegisterCodec(req, &a).code(), Code::kInvalidArgument);
}

TEST_F(PageCacheTest, MalformedRequestsGetClearCodes) {
  v1::LookupRequest req;
  v1::LookupResponse resp;
  req.set_codec_id("short");
  EXPECT_EQ(cache_->Lookup(req, &resp).code(), Code::kInvalidArgument);
  req.set_codec_id(std::string(16, 'x'));
  EXPECT_EQ(cache_->Lookup(req, &resp).code(), Code::kNotFound);
  req.set_codec_id(codec_);
  req.add_keys(Key(1));
  req.add_keys("not-16-bytes");
  EXPECT_EQ(cache_->Lookup(req, &resp).code(), Code::kInvalidArgument);

  Init(1 << 20, 4, /*max_batch=*/8);
  v1::LookupRequest big;
  big.set_codec_id(codec_);
  for (int i = 0; i < 9; ++i) big.add_keys(Key(i));
  EXPECT_EQ(cache_->Lookup(big, &resp).code(), Code::kInvalidArgument);

  v1::ReserveRequest rr;
  rr.set_codec_id(codec_);
  rr.add_items()->set_key("bad");
  rr.mutable_items(0)->set_kind(v1::PAGE_KIND_INT2);
  auto* it = rr.add_items();
  it->set_key(Key(1));
  it->set_kind(v1::PAGE_KIND_UNSPECIFIED);
  v1::ReserveResponse rresp;
  ASSERT_TRUE(cache_->Reserve(rr, &rresp).ok());
  EXPECT_EQ(rresp.results(0).status().code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_EQ(rresp.results(1).status().code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_EQ(rresp.reservation_id(), 0u);
}

TEST_F(PageCacheTest, StoreLookupReadRoundTrip) {
  Store({0, 1, 2});
  auto miss = Lookup({Key(5), Key(0)}, true);
  EXPECT_EQ(miss.matched(), 0u);
  EXPECT_EQ(miss.lease_id(), 0u);
  auto probe = Lookup({Key(0), Key(1), Key(2), Key(3), Key(4)}, false);
  EXPECT_EQ(probe.matched(), 3u);
  EXPECT_EQ(probe.pages_size(), 0);
  EXPECT_EQ(probe.lease_id(), 0u);

  auto hit = Lookup({Key(0), Key(1), Key(2), Key(3)}, true);
  ASSERT_EQ(hit.matched(), 3u);
  ASSERT_NE(hit.lease_id(), 0u);
  EXPECT_EQ(hit.lease_deadline_unix_ms(), static_cast<uint64_t>(clock_.UnixMs() + 1000));
  ASSERT_EQ(hit.pages_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const auto& ref = hit.pages(i);
    EXPECT_EQ(ref.key(), Key(i));
    EXPECT_EQ(ref.bytes(), 832u);
    EXPECT_EQ(ref.kind(), v1::PAGE_KIND_INT2);
    EXPECT_EQ(ref.token_count(), 16u);
    EXPECT_EQ(ref.offset() % 64, 0u);
    // The fast path: the bytes at the offset are the page.
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool_->Data(ref.offset())), ref.bytes()),
              MakePage(TinyProfile(), PageKind::kInt2, i));
  }
  v1::ReadRequest rd;
  rd.set_lease_id(hit.lease_id());
  rd.add_keys(Key(1));
  auto plan = cache_->PrepareRead(rd);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ((*plan)->pages().size(), 1u);
  const auto& pg = (*plan)->pages()[0];
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(pg.data), pg.bytes),
            MakePage(TinyProfile(), PageKind::kInt2, 1));
  rd.clear_keys();
  rd.add_keys(Key(9));
  EXPECT_EQ(cache_->PrepareRead(rd).status().code(), Code::kNotFound);

  v1::StatsResponse st;
  ASSERT_TRUE(cache_->Stats({}, &st).ok());
  EXPECT_EQ(st.pages(), 3u);
  EXPECT_EQ(st.pinned_pages(), 3u);
  EXPECT_EQ(st.leases(), 1u);
  EXPECT_EQ(st.hits(), 6u);
  EXPECT_EQ(st.misses(), 2u + 2u + 1u);
  ReleaseLease(hit.lease_id());
  ReleaseLease(hit.lease_id());  // idempotent
  ASSERT_TRUE(cache_->Stats({}, &st).ok());
  EXPECT_EQ(st.pinned_pages(), 0u);
  EXPECT_EQ(st.leases(), 0u);
}

TEST_F(PageCacheTest, DedupConcurrentReservesConvergeOnOnePage) {
  auto a = Reserve({Key(1), Key(2), Key(1)});
  EXPECT_EQ(a.results(0).status().code(), 0);
  // Only reserved, not stored: in progress (ABORTED), never ALREADY_EXISTS.
  EXPECT_EQ(a.results(2).status().code(), static_cast<int>(Code::kAborted));
  auto b = Reserve({Key(1), Key(3)});
  EXPECT_EQ(b.results(0).status().code(), static_cast<int>(Code::kAborted));
  EXPECT_NE(b.results(0).status().message().find("retry"), std::string::npos);
  EXPECT_EQ(b.results(1).status().code(), 0);
  // Reserved but not committed: invisible.
  EXPECT_EQ(Lookup({Key(1)}, false).matched(), 0u);
  ASSERT_TRUE(Write(a.reservation_id(), Key(1), MakePage(TinyProfile(), PageKind::kInt2, 1)).ok());
  auto c = Commit(a.reservation_id(), {Key(1)});
  EXPECT_EQ(c.results(0).code(), 0);
  EXPECT_EQ(Reserve({Key(1)}).results(0).status().code(), static_cast<int>(Code::kAlreadyExists));
  EXPECT_EQ(Lookup({Key(1)}, false).matched(), 1u);
}

TEST_F(PageCacheTest, CommitVerifiesPagesAndReleasesBadSlots) {
  const size_t before = pool_->bytes_used();
  auto r = Reserve({Key(1), Key(2), Key(3), Key(4)});
  const uint64_t id = r.reservation_id();
  const size_t reserved4 = pool_->bytes_used();
  std::string good = MakePage(TinyProfile(), PageKind::kInt2, 1);
  std::string corrupt = good;
  corrupt[500] ^= 1;
  ASSERT_TRUE(Write(id, Key(1), corrupt).ok());
  ASSERT_TRUE(Write(id, Key(2), MakePage(TinyProfile("other-model"), PageKind::kInt2, 2)).ok());
  ASSERT_TRUE(Write(id, Key(3), "garbage").ok());
  auto c = Commit(id, {Key(1), Key(2), Key(3)});
  EXPECT_EQ(c.results(0).code(), static_cast<int>(Code::kDataLoss)) << c.results(0).message();
  EXPECT_EQ(c.results(1).code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_EQ(c.results(2).code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_NE(c.results(0).message().find("released"), std::string::npos);
  EXPECT_EQ(Lookup({Key(1)}, false).matched(), 0u);
  // The failed slots are free at once (only Key(4) still holds one) ...
  EXPECT_EQ(pool_->bytes_used() - before, (reserved4 - before) / 4);
  // ... and the key is free: a rewrite into the released slot is refused, a new Reserve of the
  // key gets a slot (not ALREADY_EXISTS, not in progress) and stores the good page.
  EXPECT_EQ(Write(id, Key(1), good).code(), Code::kNotFound);
  EXPECT_EQ(Commit(id, {Key(1)}).results(0).code(), static_cast<int>(Code::kNotFound));
  auto again = Reserve({Key(1)});
  ASSERT_EQ(again.results(0).status().code(), 0) << again.results(0).status().message();
  ASSERT_TRUE(Write(again.reservation_id(), Key(1), good).ok());
  c = Commit(again.reservation_id(), {Key(1), Key(1), Key(7), "short"});
  EXPECT_EQ(c.results(0).code(), 0);
  EXPECT_EQ(c.results(1).code(), 0);  // idempotent
  EXPECT_EQ(c.results(2).code(), static_cast<int>(Code::kNotFound));
  EXPECT_EQ(c.results(3).code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_EQ(Lookup({Key(1)}, false).matched(), 1u);
  // A committed page is immutable.
  EXPECT_EQ(Write(again.reservation_id(), Key(1), good).code(), Code::kFailedPrecondition);
  // Wrong kind: a BF16 page into an INT2 slot is the wrong size, so bad header/size.
  auto r2 = Reserve({Key(9)}, v1::PAGE_KIND_BF16);
  const std::string bf16 = MakePage(TinyProfile(), PageKind::kBf16, 9);
  ASSERT_TRUE(Write(r2.reservation_id(), Key(9), bf16).ok());
  EXPECT_EQ(Commit(r2.reservation_id()).results(0).code(), 0);
  auto look = Lookup({Key(9)}, true);
  ASSERT_EQ(look.pages_size(), 1);
  EXPECT_EQ(look.pages(0).kind(), v1::PAGE_KIND_BF16);
  EXPECT_EQ(look.pages(0).bytes(), bf16.size());
  // Out of range and unknown writes.
  EXPECT_EQ(Write(id, Key(4), "xx", 831).code(), Code::kOutOfRange);
  EXPECT_EQ(Write(id, Key(4), "x", ~uint64_t{0}).code(), Code::kOutOfRange);
  EXPECT_EQ(Write(id + 12345, Key(2), "x").code(), Code::kNotFound);
  EXPECT_EQ(Write(id, Key(77), "x").code(), Code::kNotFound);
  EXPECT_EQ(Write(id, "bad", "x").code(), Code::kInvalidArgument);
  v1::CommitRequest unknown;
  unknown.set_reservation_id(424242);
  v1::CommitResponse cr;
  EXPECT_EQ(cache_->Commit(unknown, &cr).code(), Code::kNotFound);
}

TEST_F(PageCacheTest, AbortFreesSlotsAndIsIdempotent) {
  const size_t before = pool_->bytes_used();
  auto r = Reserve({Key(1), Key(2)});
  EXPECT_GT(pool_->bytes_used(), before);
  v1::AbortRequest a;
  a.set_reservation_id(r.reservation_id());
  v1::AbortResponse ar;
  ASSERT_TRUE(cache_->Abort(a, &ar).ok());
  ASSERT_TRUE(cache_->Abort(a, &ar).ok());
  EXPECT_EQ(pool_->bytes_used(), before);
  EXPECT_EQ(Reserve({Key(1)}).results(0).status().code(), 0);
}

TEST_F(PageCacheTest, LeasesAndReservationsExpireWithTheClock) {
  Store({1, 2});
  auto hit = Lookup({Key(1), Key(2)}, true, 500);
  ASSERT_EQ(hit.matched(), 2u);
  auto r = Reserve({Key(3)});
  v1::RenewLeaseRequest renew;
  renew.set_lease_id(hit.lease_id());
  renew.set_lease_ms(100000);  // capped at max_lease_ms 5000
  v1::RenewLeaseResponse renew_resp;
  clock_.Advance(400);
  ASSERT_TRUE(cache_->RenewLease(renew, &renew_resp).ok());
  EXPECT_EQ(renew_resp.lease_deadline_unix_ms(), static_cast<uint64_t>(clock_.UnixMs() + 5000));
  clock_.Advance(4000);
  cache_->Reap();
  v1::StatsResponse st;
  ASSERT_TRUE(cache_->Stats({}, &st).ok());
  EXPECT_EQ(st.leases(), 1u);
  EXPECT_EQ(st.reservations(), 0u);  // the 2 s reservation expired
  EXPECT_EQ(Reserve({Key(3)}).results(0).status().code(), 0);  // slot reclaimed, key free
  v1::CommitResponse cr;
  v1::CommitRequest creq;
  creq.set_reservation_id(r.reservation_id());
  EXPECT_EQ(cache_->Commit(creq, &cr).code(), Code::kNotFound);
  clock_.Advance(1001);
  // Expired but not yet reaped: already unusable.
  EXPECT_EQ(cache_->RenewLease(renew, &renew_resp).code(), Code::kNotFound);
  v1::ReadRequest rd;
  rd.set_lease_id(hit.lease_id());
  EXPECT_EQ(cache_->PrepareRead(rd).status().code(), Code::kNotFound);
  cache_->Reap();
  ASSERT_TRUE(cache_->Stats({}, &st).ok());
  EXPECT_EQ(st.leases(), 0u);
  EXPECT_EQ(st.pinned_pages(), 0u);
  EXPECT_EQ(cache_->counters().leases_expired.load(), 1u);
  EXPECT_EQ(cache_->counters().reservations_expired.load(), 1u);
  EXPECT_EQ(Lookup({Key(1), Key(2)}, false).matched(), 2u);  // pages stay cached
}

TEST_F(PageCacheTest, EvictsUnpinnedPagesOnlyAndPrefersCold) {
  // 1 MiB pool of 832-byte INT2 slots.
  std::vector<uint32_t> ids;
  size_t capacity = 0;
  for (uint32_t i = 0;; ++i) {
    auto r = Reserve({Key(i)});
    if (cache_->counters().evictions.load() > 0 || r.results(0).status().code() != 0) {
      // The first eviction happened while reserving page i.
      ASSERT_EQ(r.results(0).status().code(), 0);
      capacity = i;
      ASSERT_TRUE(Write(r.reservation_id(), Key(i), MakePage(TinyProfile(), PageKind::kInt2, i)).ok());
      Commit(r.reservation_id());
      ids.push_back(i);
      break;
    }
    ASSERT_TRUE(Write(r.reservation_id(), Key(i), MakePage(TinyProfile(), PageKind::kInt2, i)).ok());
    ASSERT_EQ(Commit(r.reservation_id()).results(0).code(), 0);
    ids.push_back(i);
  }
  ASSERT_GT(capacity, 500u);
  // Which pages survive? Touch half of them (lookups set the clock bit), pin a few.
  std::vector<uint32_t> alive;
  for (uint32_t i : ids) {
    if (Lookup({Key(i)}, false).matched() == 1) alive.push_back(i);
  }
  ASSERT_EQ(alive.size(), capacity);
  std::set<uint32_t> hot, pinned;
  std::vector<uint64_t> leases;
  for (size_t j = 0; j < alive.size(); ++j) {
    if (j % 2 == 0) {
      auto l = Lookup({Key(alive[j])}, true);
      ASSERT_EQ(l.matched(), 1u);
      hot.insert(alive[j]);
      if (j % 20 == 0) {
        pinned.insert(alive[j]);
        leases.push_back(l.lease_id());
      } else {
        ReleaseLease(l.lease_id());
      }
    }
  }
  const uint64_t ev0 = cache_->counters().evictions.load();
  const size_t cold = alive.size() - hot.size();
  // Store cold/2 new pages (reserved only: they can't be evicted themselves).
  for (size_t j = 0; j < cold / 2; ++j) {
    auto r = Reserve({Key(100000 + j)});
    ASSERT_EQ(r.results(0).status().code(), 0) << r.results(0).status().message();
  }
  EXPECT_EQ(cache_->counters().evictions.load() - ev0, cold / 2);
  for (uint32_t i : hot) EXPECT_EQ(Lookup({Key(i)}, false).matched(), 1u) << "hot page evicted";
  // Now fill everything: only pinned pages must remain, then the pool is exhausted.
  for (size_t j = cold / 2;; ++j) {
    auto r = Reserve({Key(100000 + j)});
    if (r.results(0).status().code() != 0) {
      EXPECT_EQ(r.results(0).status().code(), static_cast<int>(Code::kResourceExhausted));
      break;
    }
    ASSERT_LT(j, 10 * capacity);
  }
  for (uint32_t i : pinned) {
    auto l = Lookup({Key(i)}, true);
    ASSERT_EQ(l.matched(), 1u) << "pinned page evicted";
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool_->Data(l.pages(0).offset())), 832),
              MakePage(TinyProfile(), PageKind::kInt2, i));
    ReleaseLease(l.lease_id());
  }
  v1::StatsResponse st;
  ASSERT_TRUE(cache_->Stats({}, &st).ok());
  EXPECT_EQ(st.pages(), pinned.size());
}

TEST_F(PageCacheTest, AnotherPageSizeEvictsWholeSpansNotTheWholeCache) {
  // Fill the pool with INT2 pages, then store BF16 pages: each needs a span of its own size,
  // which only appears when a whole INT2 span is free.
  uint32_t n = 0;
  while (cache_->counters().evictions.load() == 0) {
    Store({n++});
    ASSERT_LT(n, 5000u);
  }
  const uint64_t int2_pages = n - 1;
  const PagePoolStats st = pool_->Stats();
  size_t int2_span_slots = 0;
  for (const auto& c : st.classes) {
    if (c.slot_bytes == 832) int2_span_slots = c.slots_per_span;
  }
  ASSERT_GT(int2_span_slots, 0u);
  // Make three of four pages hot, so cold pages are scattered over every span: evicting cold
  // pages one at a time would never free a span.
  for (uint32_t i = 0; i < n; ++i) {
    if (i % 4 == 0) continue;
    auto l = Lookup({Key(i)}, true);
    if (l.lease_id() != 0) ReleaseLease(l.lease_id());
  }
  const uint64_t ev0 = cache_->counters().evictions.load();
  for (uint32_t i = 0; i < 8; ++i) {
    auto r = Reserve({Key(50000 + i)}, v1::PAGE_KIND_BF16);
    ASSERT_EQ(r.results(0).status().code(), 0) << r.results(0).status().message();
    ASSERT_TRUE(Write(r.reservation_id(), Key(50000 + i),
                      MakePage(TinyProfile(), PageKind::kBf16, i)).ok());
    ASSERT_EQ(Commit(r.reservation_id()).results(0).code(), 0);
  }
  const uint64_t evicted = cache_->counters().evictions.load() - ev0;
  EXPECT_GT(evicted, 0u);
  // Eight 4160-byte pages fit in a span or two freed by INT2 evictions.
  EXPECT_LE(evicted, 2 * int2_span_slots) << "of " << int2_pages << " INT2 pages";
  v1::StatsResponse stats;
  ASSERT_TRUE(cache_->Stats({}, &stats).ok());
  EXPECT_EQ(stats.pages(), int2_pages - evicted + 8);
  EXPECT_EQ(pool_->slots_used(), stats.pages());
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(Lookup({Key(50000 + i)}, false).matched(), 1u);
}

TEST_F(PageCacheTest, DeleteAndClearRespectPins) {
  Store({1, 2, 3, 4});
  auto l = Lookup({Key(1)}, true);
  const uint64_t off = l.pages(0).offset();
  v1::DeleteRequest del;
  del.set_codec_id(codec_);
  del.add_keys(Key(1));
  del.add_keys(Key(2));
  del.add_keys(Key(99));
  v1::DeleteResponse dr;
  ASSERT_TRUE(cache_->Delete(del, &dr).ok());
  EXPECT_EQ(dr.results(0).code(), static_cast<int>(Code::kFailedPrecondition));
  EXPECT_EQ(dr.results(1).code(), 0);
  EXPECT_EQ(dr.results(2).code(), static_cast<int>(Code::kNotFound));
  EXPECT_EQ(Lookup({Key(1)}, false).matched(), 0u);
  // The leased bytes stay valid until release.
  EXPECT_EQ(pool_->RefCount(off), 1u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(pool_->Data(off)), 832),
            MakePage(TinyProfile(), PageKind::kInt2, 1));
  ReleaseLease(l.lease_id());
  EXPECT_EQ(pool_->RefCount(off), 0u);

  auto l3 = Lookup({Key(3)}, true);
  v1::ClearRequest clr;
  v1::ClearResponse cr;
  ASSERT_TRUE(cache_->Clear(clr, &cr).ok());
  EXPECT_EQ(cr.pages_removed(), 1u);  // key 4; key 3 is pinned
  EXPECT_EQ(Lookup({Key(3)}, false).matched(), 1u);
  clr.set_include_pinned(true);
  ASSERT_TRUE(cache_->Clear(clr, &cr).ok());
  EXPECT_EQ(cr.pages_removed(), 1u);
  ReleaseLease(l3.lease_id());
  EXPECT_EQ(pool_->bytes_used(), 0u);
}

TEST_F(PageCacheTest, ConcurrentStoresAndLookupsNeverLoseOrCorruptPages) {
  Init(4 << 20, 16);
  constexpr int kThreads = 8, kKeys = 200;
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int iter = 0; iter < 300; ++iter) {
        std::vector<std::string> keys;
        std::vector<uint32_t> ids;
        const uint32_t start = rng() % kKeys;
        for (uint32_t i = start; i < std::min<uint32_t>(kKeys, start + 1 + rng() % 8); ++i) {
          keys.push_back(Key(i));
          ids.push_back(i);
        }
        if (rng() % 2) {
          v1::ReserveRequest rr;
          rr.set_codec_id(codec_);
          for (auto& k : keys) {
            auto* it = rr.add_items();
            it->set_key(k);
            it->set_kind(v1::PAGE_KIND_INT2);
          }
          v1::ReserveResponse resp;
          if (!cache_->Reserve(rr, &resp).ok()) ++errors;
          for (size_t j = 0; j < keys.size(); ++j) {
            if (resp.results(j).status().code() != 0) continue;
            std::string page = MakePage(TinyProfile(), PageKind::kInt2, ids[j]);
            // The shared-memory path: write straight into the slot.
            std::memcpy(pool_->Data(resp.results(j).slot().offset()), page.data(), page.size());
          }
          if (resp.reservation_id() != 0) {
            v1::CommitRequest cr;
            cr.set_reservation_id(resp.reservation_id());
            v1::CommitResponse cresp;
            if (!cache_->Commit(cr, &cresp).ok()) ++errors;
            for (auto& s : cresp.results()) errors += s.code() != 0;
          }
        } else {
          v1::LookupRequest lr;
          lr.set_codec_id(codec_);
          for (auto& k : keys) lr.add_keys(k);
          lr.set_pin(true);
          v1::LookupResponse resp;
          if (!cache_->Lookup(lr, &resp).ok()) ++errors;
          for (int j = 0; j < resp.pages_size(); ++j) {
            const std::string page = MakePage(TinyProfile(), PageKind::kInt2, ids[j]);
            if (std::memcmp(pool_->Data(resp.pages(j).offset()), page.data(), page.size()) != 0)
              ++errors;
          }
          if (resp.lease_id() != 0) {
            v1::ReleaseRequest rel;
            rel.set_lease_id(resp.lease_id());
            v1::ReleaseResponse rr;
            if (!cache_->Release(rel, &rr).ok()) ++errors;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  v1::StatsResponse st;
  ASSERT_TRUE(cache_->Stats({}, &st).ok());
  EXPECT_EQ(st.pinned_pages(), 0u);
  EXPECT_EQ(st.leases(), 0u);
  EXPECT_EQ(pool_->slots_used(), st.pages());
  EXPECT_LE(st.pages(), static_cast<uint64_t>(kKeys));
}

}  // namespace
}  // namespace oscarkv::service

namespace oscarkv::service {
namespace {

// FORMAT.md §1.1, enforced at Commit: reserved header fields are zero, and so are the token
// slots at and past token_count.
TEST_F(PageCacheTest, CommitRefusesNonZeroReservedFieldsAndUnusedSlots) {
  auto fix_checksum = [](std::string& page) {
    PageHeader h;
    std::memcpy(&h, page.data(), sizeof(h));
    h.checksum = ComputePageChecksum(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(page.data()), page.size()));
    std::memcpy(page.data(), &h, sizeof(h));
  };
  std::string reserved = MakePage(TinyProfile(), PageKind::kInt2, 1);
  reserved[36] = 1;  // reserved0
  fix_checksum(reserved);
  std::string tail = MakePage(TinyProfile(), PageKind::kInt2, 2, /*token_count=*/8);  // random tail
  std::string clean = tail;
  const PageGeometry g = GeometryFor(testing::ToProfile(TinyProfile()), PageKind::kInt2);
  for (uint32_t kv = 0; kv < 2; ++kv) {
    const size_t seg = g.segment_offset(0, kv, 0);
    for (size_t i = seg + g.code_row_offset(8); i < seg + g.code_row_offset(16); ++i) clean[i] = 0;
    for (size_t i = seg + g.scale_offset(8, 0); i < seg + g.segment_bytes(); ++i) clean[i] = 0;
  }
  fix_checksum(clean);
  auto r = Reserve({Key(1), Key(2), Key(3)});
  ASSERT_TRUE(Write(r.reservation_id(), Key(1), reserved).ok());
  ASSERT_TRUE(Write(r.reservation_id(), Key(2), tail).ok());
  ASSERT_TRUE(Write(r.reservation_id(), Key(3), clean).ok());
  auto c = Commit(r.reservation_id());
  EXPECT_EQ(c.results(0).code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_NE(c.results(0).message().find("reserved"), std::string::npos) << c.results(0).message();
  EXPECT_EQ(c.results(1).code(), static_cast<int>(Code::kInvalidArgument));
  EXPECT_NE(c.results(1).message().find("unused token slots"), std::string::npos);
  EXPECT_EQ(c.results(2).code(), 0) << c.results(2).message();
  EXPECT_EQ(Lookup({Key(3)}, false).matched(), 1u);
  EXPECT_EQ(Lookup({Key(2)}, false).matched(), 0u);
}

}  // namespace
}  // namespace oscarkv::service
