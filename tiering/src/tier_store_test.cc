#include "oscarkv/tiering/tier_store.h"

#include <filesystem>
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
  k.block.bytes[0] = static_cast<uint8_t>(i);
  k.block.bytes[1] = static_cast<uint8_t>(i >> 8);
  return k;
}

const size_t kPage = MakePage(0).size();

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

enum class Impl { kMemory, kRocksDb };

class TierStoreTest : public ::testing::TestWithParam<Impl> {
 protected:
  std::unique_ptr<TierStore> Open(uint64_t capacity) {
    if (GetParam() == Impl::kMemory) return NewMemoryTierStore(capacity);
    auto s = OpenRocksDbTierStore({dir_.path(), capacity});
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
  EXPECT_EQ(s.used_bytes, 9 * kPage);
  EXPECT_EQ(s.hits, 10u);
  EXPECT_EQ(s.misses, 1u);
}

TEST_P(TierStoreTest, CapacityEvictsLeastRecentlyUsed) {
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

INSTANTIATE_TEST_SUITE_P(Impls, TierStoreTest, ::testing::Values(Impl::kMemory, Impl::kRocksDb),
                         [](const auto& info) {
                           return info.param == Impl::kMemory ? "Memory" : "RocksDb";
                         });

TEST(RocksDbTierStore, SurvivesRestartAndTrimsToNewCapacity) {
  TempDir dir;
  {
    auto store = *OpenRocksDbTierStore({dir.path(), 100 * kPage});
    for (uint32_t i = 0; i < 20; ++i) ASSERT_TRUE(store->Put(Key(i), MakePage(i)).ok());
    ASSERT_TRUE(store->Delete(Key(7)).ok());
  }
  {
    auto store = *OpenRocksDbTierStore({dir.path(), 100 * kPage});
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
    auto store = *OpenRocksDbTierStore({dir.path(), 5 * kPage});
    EXPECT_EQ(store->Stats().pages, 5u);
    EXPECT_TRUE(store->Contains(Key(19)));
    EXPECT_FALSE(store->Contains(Key(0)));
  }
  {
    auto store = *OpenRocksDbTierStore({dir.path(), 5 * kPage});
    EXPECT_EQ(store->Stats().pages, 5u);  // the trim was persisted
  }
}

TEST(RocksDbTierStore, BadOptionsAreClearErrors) {
  EXPECT_TRUE(absl::IsInvalidArgument(OpenRocksDbTierStore({"", 1 << 20}).status()));
  EXPECT_FALSE(OpenRocksDbTierStore({"/proc/oscarkv-cannot-create", 1 << 20}).ok());
  TempDir dir;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenRocksDbTierStore({dir.path(), 0}).status()));
}

}  // namespace
}  // namespace oscarkv::tiering
