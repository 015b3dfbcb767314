#include "oscarkv/tiering/tier_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "oscarkv/kernels/page_codec.h"

namespace oscarkv::tiering {
namespace {

CodecProfile Profile() {
  CodecProfile p;
  p.model_id = "test/tier";
  p.num_layers = 2;
  p.num_kv_heads = 1;
  p.head_dim = 64;
  p.group_size = 64;
  p.page_tokens = 16;
  return p;
}

std::vector<uint8_t> MakePage(uint32_t seed) {
  const CodecProfile p = Profile();
  std::mt19937 rng(seed);
  std::normal_distribution<float> n;
  std::vector<float> kv(2 * 2 * 16 * 64);
  for (auto& v : kv) v = n(rng);
  return *EncodePage(p, nullptr, PageKind::kInt2, {kv.data(), 2, 1, 64, 16}, 0, 16);
}

TierKey Key(uint32_t i) {
  TierKey k;
  k.codec = Profile().Id();
  std::memcpy(k.block.bytes.data(), &i, 4);
  return k;
}

const size_t kPage = MakePage(0).size();
constexpr uint64_t kSegmentHeader = 64;  // docs/FORMAT.md §5

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("oscarkv-tier-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

enum class Impl { kMemory, kSegments };

class TierStoreTest : public ::testing::TestWithParam<Impl> {
 protected:
  std::unique_ptr<TierStore> Open(uint64_t capacity) {
    if (GetParam() == Impl::kMemory) return NewMemoryTierStore(capacity);
    auto s = OpenSegmentTierStore({dir_.path(), capacity});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  TempDir dir_;
};

TEST_P(TierStoreTest, PutGetRoundTripAndMisses) {
  auto store = Open(100 * kPage);
  for (uint32_t i = 0; i < 10; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
  std::vector<uint8_t> out;
  for (uint32_t i = 0; i < 10; ++i) {
    ASSERT_TRUE(store->Get(Key(i), &out).ok());
    EXPECT_EQ(out, MakePage(i));
  }
  EXPECT_TRUE(absl::IsNotFound(store->Get(Key(99), &out)));
  EXPECT_TRUE(store->Contains(Key(3)));
  EXPECT_TRUE(store->Delete(Key(3)).ok());
  EXPECT_FALSE(store->Contains(Key(3)));
  EXPECT_TRUE(absl::IsNotFound(store->Delete(Key(3))));
  const TierStats s = store->Stats();
  EXPECT_EQ(s.pages, 9u);
  if (GetParam() == Impl::kMemory) {
    EXPECT_EQ(s.used_bytes, 9 * kPage);
  } else {  // file bytes: the deleted page's space is reclaimed with its segment
    EXPECT_EQ(s.used_bytes, 10 * kPage + kSegmentHeader);
  }
  EXPECT_EQ(s.hits, 10u);
  EXPECT_EQ(s.misses, 1u);
}

TEST_P(TierStoreTest, CapacityEvictsLeastRecentlyUsed) {
  if (GetParam() == Impl::kSegments) GTEST_SKIP() << "drops whole oldest segments: see below";
  auto store = Open(4 * kPage);
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
  std::vector<uint8_t> out;
  ASSERT_TRUE(store->Get(Key(0), &out).ok());  // 0 is now most recent; 1 is the LRU
  ASSERT_TRUE(store->Put(Key(4), MakePage(4)).ok());
  EXPECT_FALSE(store->Contains(Key(1)));
  EXPECT_TRUE(store->Contains(Key(0)));
  EXPECT_TRUE(store->Contains(Key(4)));
  EXPECT_LE(store->Stats().used_bytes, 4 * kPage);
  EXPECT_EQ(store->Stats().evictions, 1u);
}

TEST_P(TierStoreTest, OversizePageRejected) {
  auto store = Open(kPage - 1);
  EXPECT_TRUE(absl::IsResourceExhausted(store->Put(Key(0), MakePage(0))));
}

TEST_P(TierStoreTest, CorruptPageIsNeverReturned) {
  auto store = Open(10 * kPage);
  auto page = MakePage(5);
  page[page.size() / 2] ^= 1;  // stored corrupt (as a torn write or bit rot would leave it)
  ASSERT_TRUE(store->Put(Key(5), page).ok());
  std::vector<uint8_t> out;
  EXPECT_TRUE(absl::IsDataLoss(store->Get(Key(5), &out)));
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(store->Contains(Key(5)));  // dropped
  EXPECT_EQ(store->Stats().corruptions, 1u);
  // A page stored under another codec's key is corrupt too.
  TierKey other = Key(6);
  other.codec.bytes[0] ^= 1;
  ASSERT_TRUE(store->Put(other, MakePage(6)).ok());
  EXPECT_TRUE(absl::IsDataLoss(store->Get(other, &out)));
}

TEST_P(TierStoreTest, InjectedFaultsSurfaceAsErrorsNotBadData) {
  auto store = NewFaultInjectingTierStore(Open(50 * kPage), {0.2, 0.2, 0.3, 42});
  int put_ok = 0;
  for (uint32_t i = 0; i < 40; ++i) put_ok += store->Put(Key(i), MakePage(i)).ok();
  EXPECT_GT(put_ok, 20);
  EXPECT_LT(put_ok, 40);
  int errors = 0, good = 0;
  std::vector<uint8_t> out;
  for (int round = 0; round < 3; ++round) {
    for (uint32_t i = 0; i < 40; ++i) {
      absl::Status s = store->Get(Key(i), &out);
      if (s.ok()) {
        ASSERT_EQ(out, MakePage(i));  // whatever comes back OK is exactly right
        ++good;
      } else {
        ++errors;
      }
    }
  }
  EXPECT_GT(good, 0);
  EXPECT_GT(errors, 0);
}

TEST_P(TierStoreTest, ConcurrentPutsAndGetsStayConsistent) {
  auto store = Open(64 * kPage);
  std::vector<std::vector<uint8_t>> pages;
  for (uint32_t i = 0; i < 48; ++i) pages.push_back(MakePage(i));
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<uint8_t> out;
      for (int op = 0; op < 300; ++op) {
        const uint32_t i = rng() % 48;
        if (rng() % 3 == 0) {
          if (!store->Put(Key(i), pages[i]).ok()) bad++;
        } else if (store->Get(Key(i), &out).ok() && out != pages[i]) {
          bad++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(store->Stats().used_bytes, 64 * kPage);
}

INSTANTIATE_TEST_SUITE_P(Impls, TierStoreTest, ::testing::Values(Impl::kMemory, Impl::kSegments),
                         [](const auto& info) {
                           return info.param == Impl::kMemory ? "Memory" : "Segments";
                         });

// Segments of one page each, so capacities below count pages.
SegmentTierOptions OnePagePerSegment(const std::string& dir, uint64_t pages) {
  return {dir, pages * (kPage + kSegmentHeader), kPage + kSegmentHeader};
}

TEST(SegmentTierStore, SurvivesRestartAndTrimsToNewCapacity) {
  TempDir dir;
  {
    auto store = *OpenSegmentTierStore(OnePagePerSegment(dir.path(), 100));
    for (uint32_t i = 0; i < 20; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
    ASSERT_TRUE(store->Delete(Key(7)).ok());
  }
  {
    auto store = *OpenSegmentTierStore(OnePagePerSegment(dir.path(), 100));
    EXPECT_EQ(store->Stats().pages, 19u);
    std::vector<uint8_t> out;
    for (uint32_t i = 0; i < 20; ++i) {
      if (i == 7) {
        EXPECT_TRUE(absl::IsNotFound(store->Get(Key(i), &out)));
        continue;
      }
      ASSERT_TRUE(store->Get(Key(i), &out).ok()) << i;
      EXPECT_EQ(out, MakePage(i));
    }
  }
  {
    // Lower capacity: the oldest puts go first.
    auto store = *OpenSegmentTierStore(OnePagePerSegment(dir.path(), 5));
    EXPECT_EQ(store->Stats().pages, 5u);
    EXPECT_TRUE(store->Contains(Key(19)));
    EXPECT_FALSE(store->Contains(Key(0)));
  }
  {
    auto store = *OpenSegmentTierStore(OnePagePerSegment(dir.path(), 5));
    EXPECT_EQ(store->Stats().pages, 5u);  // the trim was persisted
  }
}

TEST(SegmentTierStore, BadOptionsAreClearErrors) {
  EXPECT_TRUE(absl::IsInvalidArgument(OpenSegmentTierStore({"", 1 << 20}).status()));
  EXPECT_FALSE(OpenSegmentTierStore({"/proc/oscarkv-cannot-create", 1 << 20}).ok());
  TempDir dir;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenSegmentTierStore({dir.path(), 0}).status()));
  {
    auto first = OpenSegmentTierStore({dir.path(), 1 << 20});
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_FALSE(OpenSegmentTierStore({dir.path(), 1 << 20}).ok());  // one process per tier
  }
}

std::vector<std::filesystem::path> SegmentFiles(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path segments = std::filesystem::path(dir) / "segments";
  for (const auto& e : std::filesystem::directory_iterator(segments)) {
    if (e.path().extension() == ".seg") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(SegmentTierStore, DropsWholeOldestSegmentsAndNeverExceedsCapacity) {
  TempDir dir;
  const uint64_t seg = 4 * kPage + kSegmentHeader;  // four pages a segment
  const uint64_t capacity = 4 * seg;
  auto store = *OpenSegmentTierStore({dir.path(), capacity, seg});
  for (uint32_t i = 0; i < 40; ++i) {
    ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
    ASSERT_LE(store->Stats().used_bytes, capacity) << i;
  }
  // Segments {36..39}, {32..35}, {28..31} and {24..27} are left: whole segments went, in order.
  for (uint32_t i = 0; i < 40; ++i) EXPECT_EQ(store->Contains(Key(i)), i >= 24) << i;
  EXPECT_EQ(store->Stats().evictions, 24u);
  EXPECT_EQ(SegmentFiles(dir.path()).size(), 4u);  // the dropped files are deleted
}

TEST(SegmentTierStore, ASegmentWhosePagesAreAllGoneIsDeletedAtOnce) {
  TempDir dir;
  const uint64_t seg = 4 * kPage + kSegmentHeader;  // four pages a segment
  auto store = *OpenSegmentTierStore({dir.path(), 100 * seg, seg});
  for (uint32_t i = 0; i < 12; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
  ASSERT_EQ(SegmentFiles(dir.path()).size(), 3u);
  const uint64_t before = store->Stats().used_bytes;
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(store->Delete(Key(i)).ok());
  EXPECT_EQ(SegmentFiles(dir.path()).size(), 3u);  // page 3 is still in the first one
  ASSERT_TRUE(store->Put(Key(3), MakePage(3)).ok());  // replaced: its old copy is dead
  EXPECT_EQ(SegmentFiles(dir.path()).size(), 3u);   // (and the new copy opened a fourth)
  EXPECT_EQ(store->Stats().used_bytes, before - seg + kPage + kSegmentHeader);
  std::vector<uint8_t> out;
  ASSERT_TRUE(store->Get(Key(3), &out).ok());
  EXPECT_EQ(out, MakePage(3));
  ASSERT_TRUE(store->Get(Key(4), &out).ok());
  EXPECT_EQ(out, MakePage(4));
}

TEST(SegmentTierStore, ReusedPagesAreRewrittenAwayFromTheDropEnd) {
  TempDir dir;
  auto store = *OpenSegmentTierStore(OnePagePerSegment(dir.path(), 8));
  for (uint32_t i = 0; i < 8; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
  EXPECT_FALSE(store->KeepsCopy(Key(0)));  // next to go: evicted again, it is written again
  EXPECT_TRUE(store->KeepsCopy(Key(7)));
  EXPECT_FALSE(store->KeepsCopy(Key(99)));
  ASSERT_TRUE(store->Put(Key(0), MakePage(0)).ok());  // as the daemon re-demotes it
  for (uint32_t i = 8; i < 12; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
  EXPECT_TRUE(store->Contains(Key(0)));
  EXPECT_FALSE(store->Contains(Key(1)));
  std::vector<uint8_t> out;
  ASSERT_TRUE(store->Get(Key(0), &out).ok());
  EXPECT_EQ(out, MakePage(0));
}

TEST(SegmentTierStore, TornTailAndMissingSegmentAreMissesAndRemovedAtOpen) {
  TempDir dir;
  {
    auto store = *OpenSegmentTierStore({dir.path(), 1 << 20, 4 * kPage + kSegmentHeader});
    for (uint32_t i = 0; i < 12; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
  }
  const auto files = SegmentFiles(dir.path());
  ASSERT_EQ(files.size(), 3u);
  std::filesystem::remove(files[0]);                                       // pages 0..3
  std::filesystem::resize_file(files[2], std::filesystem::file_size(files[2]) - kPage / 2);  // 11
  for (int reopen = 0; reopen < 2; ++reopen) {  // the second open finds the records removed
    auto store = *OpenSegmentTierStore({dir.path(), 1 << 20, 4 * kPage + kSegmentHeader});
    EXPECT_EQ(store->Stats().pages, 7u + reopen);  // and the page put by the last open
    std::vector<uint8_t> out;
    for (uint32_t i = 0; i < 12; ++i) {
      const bool kept = i >= 4 && i != 11;
      EXPECT_EQ(store->Contains(Key(i)), kept) << i;
      if (!kept) continue;
      ASSERT_TRUE(store->Get(Key(i), &out).ok()) << i;
      EXPECT_EQ(out, MakePage(i));
    }
    // New pages go to a new segment, never behind the torn tail.
    ASSERT_TRUE(store->Put(Key(100 + reopen), MakePage(100)).ok());
  }
}

TEST(SegmentTierStore, OverwrittenPageBytesAreDataLossAndRemoved) {
  TempDir dir;
  {
    auto store = *OpenSegmentTierStore({dir.path(), 1 << 20});
    for (uint32_t i = 0; i < 6; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
  }
  const auto files = SegmentFiles(dir.path());
  ASSERT_EQ(files.size(), 1u);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(kSegmentHeader + 2 * kPage + kPage / 2));  // page 2
    f.write("garbage!", 8);
  }
  for (int reopen = 0; reopen < 2; ++reopen) {
    auto store = *OpenSegmentTierStore({dir.path(), 1 << 20});
    std::vector<uint8_t> out;
    for (uint32_t i = 0; i < 6; ++i) {
      absl::Status s = store->Get(Key(i), &out);
      if (i == 2) {
        EXPECT_TRUE(reopen == 0 ? absl::IsDataLoss(s) : absl::IsNotFound(s)) << s;
        EXPECT_FALSE(store->Contains(Key(i)));
        continue;
      }
      ASSERT_TRUE(s.ok()) << i << ": " << s;
      EXPECT_EQ(out, MakePage(i));
    }
    EXPECT_EQ(store->Stats().corruptions, reopen == 0 ? 1u : 0u);
  }
}

TEST(SegmentTierStore, GetIntoReadsStraightIntoTheBufferAndChecksItsSize) {
  TempDir dir;
  auto store = *OpenSegmentTierStore({dir.path(), 1 << 20});
  ASSERT_TRUE(store->Put(Key(1), MakePage(1)).ok());
  EXPECT_EQ(*store->SizeOf(Key(1)), kPage);
  EXPECT_TRUE(absl::IsNotFound(store->SizeOf(Key(2)).status()));
  std::vector<uint8_t> slot(kPage);
  ASSERT_TRUE(store->GetInto(Key(1), slot).ok());
  EXPECT_EQ(slot, MakePage(1));
  std::vector<uint8_t> small(kPage - 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(store->GetInto(Key(1), small)));
}

// Pages of 256 KiB and more are written with O_DIRECT at 4096-aligned offsets: from an aligned
// buffer without a copy, from an unaligned one through the staging buffer.
TEST(SegmentTierStore, LargePagesGoDirectAlignedOrNotAndSurviveRestart) {
  CodecProfile big = Profile();
  big.num_layers = 36;
  big.num_kv_heads = 4;
  big.head_dim = 128;
  big.group_size = 128;
  big.page_tokens = 64;
  std::vector<std::vector<uint8_t>> pages;
  for (uint32_t i = 0; i < 4; ++i) {
    std::mt19937 rng(i);
    std::normal_distribution<float> n;
    std::vector<float> kv(2 * 36 * 64 * 4 * 128);
    for (auto& v : kv) v = n(rng);
    pages.push_back(*EncodePage(big, nullptr, PageKind::kInt2, {kv.data(), 36, 4, 128, 64}, 0, 64));
  }
  ASSERT_GE(pages[0].size(), 256u << 10);
  ASSERT_NE(pages[0].size() % 4096, 0u);  // a partial last block
  auto key = [&](uint32_t i) {
    TierKey k;
    k.codec = big.Id();
    k.block.bytes[0] = static_cast<uint8_t>(i + 1);
    return k;
  };
  TempDir dir;
  {
    auto store = *OpenSegmentTierStore({dir.path(), 64 << 20});
    for (uint32_t i = 0; i < 4; ++i) {
      const size_t shift = i % 2;  // odd pages from an unaligned copy
      std::vector<uint8_t> buf(pages[i].size() + 4096 + 1);
      uint8_t* p = buf.data() + (4096 - reinterpret_cast<uintptr_t>(buf.data()) % 4096) + shift;
      std::memcpy(p, pages[i].data(), pages[i].size());
      ASSERT_TRUE(store->Put(key(i), std::span<const uint8_t>(p, pages[i].size())).ok());
    }
    std::vector<uint8_t> out;
    for (uint32_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(store->Get(key(i), &out).ok()) << i;
      EXPECT_EQ(out, pages[i]);
    }
  }
  auto store = *OpenSegmentTierStore({dir.path(), 64 << 20});
  std::vector<uint8_t> out;
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(store->Get(key(i), &out).ok()) << i;
    EXPECT_EQ(out, pages[i]);
  }
  EXPECT_LE(store->Stats().used_bytes, 64u << 20);

  // PutMany: large (aligned and not) and small pages in one batch, written in runs; in a tier
  // of about three large pages, so the batch drops segments it has just written itself.
  TempDir small_dir;
  const uint64_t cap = 3 * (pages[0].size() + 3 * 4096) + 4096;
  auto tiny = *OpenSegmentTierStore({small_dir.path(), cap, pages[0].size() + 4096 + 64});
  std::vector<uint8_t> unaligned(pages[1].size() + 1);
  std::memcpy(unaligned.data() + 1, pages[1].data(), pages[1].size());
  const std::vector<uint8_t> little = MakePage(9);
  const std::vector<TierStore::PutItem> items = {
      {key(0), pages[0]}, {key(1), std::span<const uint8_t>(unaligned.data() + 1, pages[1].size())},
      {Key(9), little},   {key(2), pages[2]},
      {key(3), pages[3]}, {key(10), std::span<const uint8_t>(little.data(), 10)}};
  const std::vector<absl::Status> rs = tiny->PutMany(items);
  ASSERT_EQ(rs.size(), items.size());
  for (size_t i = 0; i + 1 < rs.size(); ++i) EXPECT_TRUE(rs[i].ok()) << i << ": " << rs[i];
  EXPECT_TRUE(absl::IsInvalidArgument(rs.back()));  // not a page
  EXPECT_LE(tiny->Stats().used_bytes, cap);
  EXPECT_GT(tiny->Stats().evictions, 0u);
  EXPECT_TRUE(tiny->Contains(key(3)));
  int served = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    if (!tiny->Contains(key(i))) continue;
    ASSERT_TRUE(tiny->Get(key(i), &out).ok()) << i;
    EXPECT_EQ(out, pages[i]);
    ++served;
  }
  EXPECT_GE(served, 2);
}

uint64_t BytesReadBySyscalls() {  // /proc/self/io rchar: read(), pread() and friends
  std::ifstream io("/proc/self/io");
  std::string name;
  uint64_t value = 0;
  while (io >> name >> value) {
    if (name == "rchar:") return value;
  }
  return 0;
}

// Issue 23 item 10: a tier of 100,000 (small) pages is reopened from its index and the segment
// files' sizes, without reading page bytes; then every page is served, byte-identical.
TEST(SegmentTierStore, RestartWith100kPagesReadsNoPageBytes) {
  TempDir dir;
  constexpr uint32_t kPages = 100000;
  const std::vector<uint8_t> page = MakePage(3);
  {
    auto store = *OpenSegmentTierStore({dir.path(), kPages * (kPage + 64)});
    for (uint32_t i = 0; i < kPages; ++i) ASSERT_TRUE(store->Put(Key(i), page).ok());
  }
  const uint64_t before = BytesReadBySyscalls();
  auto store = *OpenSegmentTierStore({dir.path(), kPages * (kPage + 64)});
  const uint64_t read = BytesReadBySyscalls() - before;
  ASSERT_EQ(store->Stats().pages, kPages);
  // The index is ~64 bytes a page; the pages are kPage bytes each.
  EXPECT_LT(read, kPages * kPage / 8) << "recovery read " << read << " bytes";
  std::vector<uint8_t> out(kPage);
  for (uint32_t i = 0; i < kPages; ++i) {
    ASSERT_TRUE(store->GetInto(Key(i), out).ok()) << i;
    ASSERT_EQ(out, page) << i;
  }
}

}  // namespace
}  // namespace oscarkv::tiering
