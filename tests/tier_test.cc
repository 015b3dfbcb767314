// The SSD tier in a real oscarkvd (segment files, RocksDB index) in a temp dir: evicted pages
// come back byte-identical, a restart (SIGTERM or kill -9) serves what reached the tier and
// nothing corrupt, a damaged (overwritten, truncated) tier file is a miss, and the tier never
// exceeds its capacity.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "test_util.h"

namespace oscarkv::testing {
namespace {

namespace fs = std::filesystem;
using client::PageWrite;

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/oscarkv-tier-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

v1::StatsResponse DaemonStats(const std::string& addr) {
  auto stub = v1::KvCache::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::StatsResponse resp;
  EXPECT_TRUE(stub->Stats(&ctx, v1::StatsRequest(), &resp).ok());
  return resp;
}

std::unique_ptr<testing::LocalDaemon> StartTiered(const std::string& dir, int pool_mb, int tier_mb,
                                                 std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--pool-mb", std::to_string(pool_mb), "--tier-path", dir,
                                    "--tier-mb", std::to_string(tier_mb)};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return StartDaemon(flags);
}

struct Pages {
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<PageWrite> writes(size_t begin, size_t end) const {
    std::vector<PageWrite> w;
    for (size_t i = begin; i < end; ++i) w.push_back({keys[i], PageKind::kInt2, bytes[i]});
    return w;
  }
};

Pages MakePages(const client::Codec& codec, uint64_t seed, size_t n) {
  Pages p;
  p.keys = client::Client::BlockKeys(codec, Tokens(seed, n * codec.profile.page_tokens));
  for (size_t i = 0; i < n; ++i) {
    p.bytes.push_back(MakePage(codec.profile, PageKind::kInt2, seed * 100003 + i));
  }
  return p;
}

// Loads every page in chunks (a chunk's pages must fit the pool pinned at once). Per page:
// 1 = byte-identical, 0 = a miss; a page that comes back different fails the test.
std::vector<int> LoadAll(client::Client& c, const client::Codec& codec, const Pages& p,
                         size_t chunk = 8) {
  std::vector<int> got(p.keys.size(), 0);
  for (size_t b = 0; b < p.keys.size(); b += chunk) {
    const size_t n = std::min(chunk, p.keys.size() - b);
    for (size_t i = b; i < b + n; ++i) {
      // One key per Load: a miss in the middle must not hide the pages after it.
      auto r = c.Load(codec, std::span<const BlockKey>(&p.keys[i], 1));
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok() || r->matched == 0) continue;
      EXPECT_EQ(r->pages[0], p.bytes[i]) << "page " << i << " served with other bytes";
      got[i] = r->pages[0] == p.bytes[i];
    }
  }
  return got;
}

TEST(TierTest, EvictedPagesComeBackByteIdenticalAndSurviveSigterm) {
  TempDir dir;
  auto d = StartTiered(dir.path, 8, 256);
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const size_t pool_pages = d->pool_bytes() / codec.int2_page_bytes;
  const Pages p = MakePages(codec, 1, 3 * pool_pages);  // 3x the pool
  for (size_t b = 0; b < p.keys.size(); b += 16) {
    auto st = c->Store(codec, p.writes(b, std::min(b + 16, p.keys.size())));
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->failed, 0u) << st->item_status[0];
  }
  v1::StatsResponse s = DaemonStats(d->address());
  EXPECT_GT(s.evictions(), pool_pages);
  EXPECT_EQ(s.tier_demote_drops(), 0u);
  // A probe counts tier pages without reading them; storing them again is deduplicated.
  EXPECT_EQ(c->Lookup(codec, std::span<const BlockKey>(p.keys.data(), 8), {})->matched, 8u);
  auto again = c->Store(codec, p.writes(0, 8));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->deduplicated, 8u);
  std::vector<int> got = LoadAll(*c, codec, p);
  EXPECT_EQ(std::count(got.begin(), got.end(), 1), static_cast<long>(p.keys.size()));
  s = DaemonStats(d->address());
  EXPECT_GT(s.tier_promotions(), 0u);
  EXPECT_GT(s.tier_demotions(), 0u);
  EXPECT_LE(s.tier_bytes(), s.tier_capacity_bytes());
  c.reset();

  // SIGTERM demotes what is only in the pool; a restart on the same tier serves every page,
  // with the codec registration the tier persisted (before any client registers it).
  ASSERT_EQ(*d->Stop(), 0);
  d = StartTiered(dir.path, 8, 256);
  ASSERT_NE(d, nullptr);
  s = DaemonStats(d->address());
  EXPECT_EQ(s.codecs(), 1u);
  EXPECT_EQ(s.tier_pages(), p.keys.size());
  c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  got = LoadAll(*c, codec, p);
  EXPECT_EQ(std::count(got.begin(), got.end(), 1), static_cast<long>(p.keys.size()));
}

TEST(TierTest, TierFullEvictsLeastRecentAndNeverExceedsCapacity) {
  TempDir dir;
  auto d = StartTiered(dir.path, 8, 2);  // 2 MiB: ~27 reference pages
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const Pages p = MakePages(codec, 2, 3 * d->pool_bytes() / codec.int2_page_bytes);
  for (size_t b = 0; b < p.keys.size(); b += 8) {
    auto st = c->Store(codec, p.writes(b, std::min(b + 8, p.keys.size())));
    ASSERT_TRUE(st.ok() && st->failed == 0);
    const v1::StatsResponse s = DaemonStats(d->address());
    ASSERT_LE(s.tier_bytes(), s.tier_capacity_bytes());
    ASSERT_LE(s.tier_bytes(), 2u << 20);
  }
  // Queued demotions are still visible (served from the queue): wait until the writer has put
  // them all, so what is left is what the tier itself holds.
  for (int i = 0; i < 200 && DaemonStats(d->address()).tier_queued_bytes() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const v1::StatsResponse s = DaemonStats(d->address());
  EXPECT_EQ(s.tier_queued_bytes(), 0u);
  EXPECT_GT(s.tier_evictions(), 0u);
  EXPECT_GT(s.tier_pages(), 0u);
  // The oldest pages are gone from both tiers (a miss, never wrong bytes); the newest are in.
  std::vector<int> got = LoadAll(*c, codec, p);
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got.back(), 1);
}

// Damages the files that hold page bytes (the segment files, docs/FORMAT.md §5): stretches of
// every one but the newest are overwritten with garbage, and the newest is cut to half its size
// (a torn tail). Returns how many files it damaged.
int DamageSegmentFiles(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".seg") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());  // by segment id: the newest last
  std::mt19937 rng(5);
  for (size_t i = 0; i < files.size(); ++i) {
    const auto size = fs::file_size(files[i]);
    if (i + 1 == files.size() && files.size() > 1) {
      fs::resize_file(files[i], size / 2);
      continue;
    }
    std::fstream f(files[i], std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t off = 4096; off + 4096 < size; off += 300000) {
      std::string junk(512, '\0');
      for (char& ch : junk) ch = static_cast<char>(rng());
      f.seekp(static_cast<std::streamoff>(off));
      f.write(junk.data(), junk.size());
    }
  }
  return static_cast<int>(files.size());
}

TEST(TierTest, DamagedTierFileIsAMissAndRemovedNeverServed) {
  TempDir dir;
  auto d = StartTiered(dir.path, 8, 256);
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  const client::Codec codec = RegisterRefmodel(*c);
  const Pages p = MakePages(codec, 3, 2 * d->pool_bytes() / codec.int2_page_bytes);
  for (size_t b = 0; b < p.keys.size(); b += 16) {
    ASSERT_TRUE(c->Store(codec, p.writes(b, std::min(b + 16, p.keys.size())))->failed == 0);
  }
  c.reset();
  ASSERT_EQ(*d->Stop(), 0);  // everything into the tier, files closed
  ASSERT_GE(DamageSegmentFiles(dir.path), 2);
  d = StartTiered(dir.path, 8, 256);
  ASSERT_NE(d, nullptr);
  c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  std::vector<int> got = LoadAll(*c, codec, p);  // fails on any page served with other bytes
  const long served = std::count(got.begin(), got.end(), 1);
  EXPECT_LT(served, static_cast<long>(p.keys.size()));
  EXPECT_GT(served, 0);  // the damage hit some pages, not the whole tier
  const v1::StatsResponse s = DaemonStats(d->address());
  EXPECT_GT(s.tier_corruptions() + s.tier_misses(), 0u);
  // Removed: the damaged pages are misses for probes too, and can be stored afresh.
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == 1) continue;
    EXPECT_EQ(c->Lookup(codec, std::span<const BlockKey>(&p.keys[i], 1), {})->matched, 0u) << i;
    auto st = c->Store(codec, p.writes(i, i + 1));
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->stored, 1u) << st->item_status[0];
    break;
  }
}

// kill -9 in the middle of a demotion burst (stores that evict) or of promotions (loads of
// tier pages), then a restart on the same tier: every page is served byte-identical or is a
// miss. Ten rounds.
TEST(TierTest, Kill9DuringDemotionAndPromotionNeverServesCorruptPages) {
  TempDir dir;
  const client::Codec* codec_ptr = nullptr;
  client::Codec codec;
  std::vector<Pages> all;
  for (int round = 0; round < 10; ++round) {
    auto d = StartTiered(dir.path, 4, 64, {"--drain-timeout-ms", "200"});
    ASSERT_NE(d, nullptr);
    auto c = Connect(d->address());
    ASSERT_NE(c, nullptr);
    if (codec_ptr == nullptr) {
      codec = RegisterRefmodel(*c);
      codec_ptr = &codec;
    }
    // Everything stored so far: correct or a miss.
    for (const Pages& p : all) {
      std::vector<int> got = LoadAll(*c, codec, p, 4);
      (void)got;
    }
    if (HasFatalFailure()) return;
    Pages p = MakePages(codec, 100 + round, d->pool_bytes() / codec.int2_page_bytes + 24);
    std::atomic<bool> stop{false};
    std::thread worker([&] {
      auto wc = Connect(d->address());
      if (wc == nullptr) return;
      for (size_t b = 0; b < p.keys.size() && !stop; b += 4) {
        (void)wc->Store(codec, p.writes(b, std::min(b + 4, p.keys.size())));
        if (round % 2 == 1 && b >= 8) {  // odd rounds: promotions in flight too
          (void)wc->Load(codec, std::span<const BlockKey>(p.keys.data(), 4));
        }
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(60 + 17 * round));
    ::kill(d->pid(), SIGKILL);
    stop = true;
    worker.join();
    c.reset();
    d.reset();
    all.push_back(std::move(p));
  }
  auto d = StartTiered(dir.path, 4, 64);
  ASSERT_NE(d, nullptr);
  auto c = Connect(d->address());
  ASSERT_NE(c, nullptr);
  long served = 0;
  for (const Pages& p : all) {
    std::vector<int> got = LoadAll(*c, codec, p, 4);
    served += std::count(got.begin(), got.end(), 1);
  }
  EXPECT_GT(served, 0);  // what reached the tier before the kills
}

}  // namespace
}  // namespace oscarkv::testing
