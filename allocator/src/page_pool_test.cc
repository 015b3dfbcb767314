#include "oscarkv/allocator/page_pool.h"

#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace oscarkv {
namespace {

std::unique_ptr<PagePool> MakePool(size_t arena_bytes, PagePoolOptions o) {
  auto arena = CreateHeapArena(arena_bytes);
  EXPECT_TRUE(arena.ok()) << arena.status();
  auto pool = PagePool::Create(std::move(*arena), o);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return std::move(*pool);
}

PagePoolOptions SmallChunks(size_t chunk, size_t span) {
  PagePoolOptions o;
  o.chunk_bytes = chunk;
  o.target_span_bytes = span;
  return o;
}

TEST(PagePool, RejectsBadOptionsAndSizes) {
  auto arena = CreateHeapArena(1 << 20);
  ASSERT_TRUE(arena.ok());
  EXPECT_FALSE(PagePool::Create(std::move(*arena), SmallChunks(3000, 1 << 20)).ok());
  arena = CreateHeapArena(1 << 20);
  EXPECT_FALSE(PagePool::Create(std::move(*arena), SmallChunks(2 << 20, 2 << 20)).ok());
  auto pool = MakePool(1 << 20, SmallChunks(64 << 10, 256 << 10));
  EXPECT_EQ(pool->SizeClassFor(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->SizeClassFor((1 << 20) + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Allocate(99).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PagePool, SameSizeSameClassAndAlignedSlots) {
  auto pool = MakePool(4 << 20, SmallChunks(64 << 10, 256 << 10));
  auto a = pool->SizeClassFor(1000);
  auto b = pool->SizeClassFor(1000);
  auto c = pool->SizeClassFor(1001);  // both round up to 1024
  auto d = pool->SizeClassFor(1025);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, *c);
  EXPECT_NE(*a, *d);
  EXPECT_EQ(pool->SlotBytes(*d), 1088u);
  for (int i = 0; i < 50; ++i) {
    auto off = pool->Allocate(*d);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(*off % 64, 0u);
  }
}

TEST(PagePool, ExactCapacityAndReuseAcrossClasses) {
  // 16 chunks of 64 KiB; class A slots of 16 KiB (4 per chunk), class B a 3-chunk slot.
  auto pool = MakePool(1 << 20, SmallChunks(64 << 10, 64 << 10));
  SizeClassId a = *pool->SizeClassFor(16 << 10);
  SizeClassId b = *pool->SizeClassFor(3 * (64 << 10));
  std::vector<uint64_t> slots;
  for (;;) {
    auto off = pool->Allocate(a);
    if (!off.ok()) {
      EXPECT_EQ(off.status().code(), absl::StatusCode::kResourceExhausted);
      break;
    }
    slots.push_back(*off);
  }
  EXPECT_EQ(slots.size(), 64u);
  EXPECT_EQ(pool->bytes_used(), size_t{1} << 20);
  EXPECT_FALSE(pool->Allocate(b).ok());
  for (uint64_t s : slots) EXPECT_TRUE(pool->Unref(s));
  EXPECT_EQ(pool->bytes_used(), 0u);
  EXPECT_EQ(pool->Stats().chunks_free, 16u);
  // All memory went back: five 3-chunk slots fit in 16 chunks.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(pool->Allocate(b).ok()) << i;
  EXPECT_FALSE(pool->Allocate(b).ok());
}

TEST(PagePool, SpanOfSlotDescribesTheSpan) {
  auto pool = MakePool(1 << 20, SmallChunks(64 << 10, 64 << 10));
  SizeClassId a = *pool->SizeClassFor(16 << 10);
  uint64_t first = *pool->Allocate(a);
  uint64_t second = *pool->Allocate(a);
  SpanInfo info;
  ASSERT_TRUE(pool->SpanOfSlot(second, &info).ok());
  EXPECT_EQ(info.start, first);
  EXPECT_EQ(info.slot_bytes, 16u << 10);
  EXPECT_EQ(info.slots, 4u);
  EXPECT_EQ(info.cls, a);
  EXPECT_FALSE(pool->SpanOfSlot(second + 64, &info).ok());
  pool->Unref(first);
  pool->Unref(second);
  EXPECT_FALSE(pool->SpanOfSlot(second, &info).ok());
}

TEST(PagePool, RefcountsFreeAtZeroOnly) {
  auto pool = MakePool(1 << 20, SmallChunks(64 << 10, 64 << 10));
  SizeClassId a = *pool->SizeClassFor(4096);
  uint64_t off = *pool->Allocate(a);
  EXPECT_EQ(pool->RefCount(off), 1u);
  pool->Ref(off);
  pool->Ref(off);
  EXPECT_EQ(pool->RefCount(off), 3u);
  EXPECT_FALSE(pool->Unref(off));
  EXPECT_FALSE(pool->Unref(off));
  EXPECT_TRUE(pool->CheckSlot(off).ok());
  EXPECT_TRUE(pool->Unref(off));
  EXPECT_EQ(pool->RefCount(off), 0u);
  EXPECT_FALSE(pool->CheckSlot(off).ok());
  // A stray extra Unref is ignored rather than corrupting the free list.
  EXPECT_FALSE(pool->Unref(off));
  EXPECT_EQ(pool->slots_used(), 0u);
  EXPECT_FALSE(pool->CheckSlot(off + 64).ok());
  EXPECT_FALSE(pool->CheckSlot(uint64_t{1} << 40).ok());
}

// Long random sequences of Allocate/Ref/Unref checked against a trivial model: a map from
// offset to (class, refcount). Checks after every step: slots are aligned, inside the arena and
// never overlap; refcounts and byte accounting agree; Allocate fails only when the pool is
// really full.
struct ModelSlot {
  SizeClassId cls;
  size_t bytes;
  uint32_t refs;
};

void RunModel(uint32_t seed, size_t arena_bytes, PagePoolOptions opt,
              const std::vector<size_t>& sizes, int steps, bool single_chunk_spans) {
  auto pool = MakePool(arena_bytes, opt);
  std::vector<SizeClassId> classes;
  for (size_t s : sizes) classes.push_back(*pool->SizeClassFor(s));
  std::map<uint64_t, ModelSlot> model;
  std::vector<uint64_t> live;  // offsets in model, for random picks
  std::mt19937 rng(seed);
  size_t failures = 0;
  const size_t chunks = arena_bytes / opt.chunk_bytes;
  // Phases bias towards filling or draining, so both "full" and "empty" are visited.
  for (int step = 0; step < steps; ++step) {
    const bool filling = (step / 500) % 2 == 0;
    const int r = static_cast<int>(rng() % 100);
    if (live.empty() || r < (filling ? 60 : 25)) {
      const size_t ci = rng() % classes.size();
      auto off = pool->Allocate(classes[ci]);
      const size_t slot = pool->SlotBytes(classes[ci]);
      if (!off.ok()) {
        ASSERT_EQ(off.status().code(), absl::StatusCode::kResourceExhausted);
        ++failures;
        // No free slot of this class may exist...
        size_t live_in_class = 0;
        for (auto& [o, m] : model) live_in_class += m.cls == classes[ci];
        const PagePoolStats st = pool->Stats();
        const SizeClassStats& cs = st.classes[classes[ci]];
        ASSERT_EQ(live_in_class, cs.spans * cs.slots_per_span) << "free slot but alloc failed";
        if (single_chunk_spans) {
          // ...and with one-chunk spans, no chunk may be untouched by every live slot.
          std::set<size_t> touched;
          for (auto& [o, m] : model) {
            for (size_t c = o / opt.chunk_bytes; c <= (o + m.bytes - 1) / opt.chunk_bytes; ++c)
              touched.insert(c);
          }
          ASSERT_EQ(touched.size(), chunks) << "an empty chunk exists but alloc failed";
          ASSERT_EQ(st.chunks_free, 0u);
        }
        continue;
      }
      ASSERT_EQ(*off % 64, 0u);
      ASSERT_LE(*off + slot, arena_bytes);
      // No overlap with neighbours.
      auto next = model.lower_bound(*off);
      if (next != model.end()) {
        ASSERT_GE(next->first, *off + slot) << "overlaps next";
      }
      if (next != model.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.bytes, *off) << "overlaps previous";
      }
      model[*off] = {classes[ci], slot, 1};
      live.push_back(*off);
      std::memset(pool->Data(*off), static_cast<int>(*off % 251), 64);
    } else if (r < 40) {
      const uint64_t off = live[rng() % live.size()];
      pool->Ref(off);
      ++model[off].refs;
    } else {
      const size_t i = rng() % live.size();
      const uint64_t off = live[i];
      // Content written at allocation is intact: nobody else got this slot.
      ASSERT_EQ(pool->Data(off)[63], static_cast<uint8_t>(off % 251));
      const bool freed = pool->Unref(off);
      ModelSlot& m = model[off];
      ASSERT_EQ(freed, m.refs == 1);
      if (--m.refs == 0) {
        model.erase(off);
        live[i] = live.back();
        live.pop_back();
      }
    }
    if (step % 97 == 0) {
      size_t bytes = 0;
      for (auto& [o, m] : model) {
        bytes += m.bytes;
        ASSERT_EQ(pool->RefCount(o), m.refs);
        SizeClassId cls;
        ASSERT_TRUE(pool->CheckSlot(o, &cls).ok());
        ASSERT_EQ(cls, m.cls);
      }
      ASSERT_EQ(pool->bytes_used(), bytes);
      ASSERT_EQ(pool->slots_used(), model.size());
      const PagePoolStats st = pool->Stats();
      size_t span_chunks = 0;
      for (auto& c : st.classes) span_chunks += c.spans * c.span_chunks;
      ASSERT_EQ(st.chunks_free + span_chunks, chunks);
    }
  }
  EXPECT_GT(failures, 0u) << "the sequence never filled the pool";
  for (auto& [o, m] : model) {
    for (uint32_t i = 0; i < m.refs; ++i) pool->Unref(o);
  }
  EXPECT_EQ(pool->bytes_used(), 0u);
  EXPECT_EQ(pool->Stats().chunks_free, chunks);
}

TEST(PagePoolModel, OneChunkSpans) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    RunModel(seed, 32 * (64 << 10), SmallChunks(64 << 10, 64 << 10), {1000, 5000, 20000, 65536},
             20000, /*single_chunk_spans=*/true);
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(PagePoolModel, MultiChunkSpansOfMixedSizes) {
  // Page-like sizes: small INT2-ish slots and slots larger than a chunk (BF16-ish).
  for (uint32_t seed = 11; seed <= 16; ++seed) {
    RunModel(seed, 64 * (64 << 10), SmallChunks(64 << 10, 256 << 10),
             {20737 * 4, 147457, 3000, 300000}, 20000, /*single_chunk_spans=*/false);
    if (testing::Test::HasFatalFailure()) return;
  }
}

TEST(PagePool, ConcurrentThreadsNeverShareASlot) {
  auto pool = MakePool(8 << 20, SmallChunks(64 << 10, 256 << 10));
  std::vector<SizeClassId> classes = {*pool->SizeClassFor(4096), *pool->SizeClassFor(100000)};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<uint64_t, size_t>> mine;
      for (int i = 0; i < 20000; ++i) {
        if (mine.empty() || rng() % 2) {
          const SizeClassId c = classes[rng() % 2];
          auto off = pool->Allocate(c);
          if (!off.ok()) continue;
          const size_t n = pool->SlotBytes(c);
          std::memset(pool->Data(*off), t + 1, 64);
          std::memset(pool->Data(*off) + n - 64, t + 1, 64);
          mine.push_back({*off, n});
        } else {
          const size_t k = rng() % mine.size();
          auto [off, n] = mine[k];
          if (pool->Data(off)[0] != t + 1 || pool->Data(off)[n - 1] != t + 1) ++errors;
          pool->Ref(off);  // a reader pins it
          pool->Unref(off);
          if (!pool->Unref(off)) ++errors;
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (auto [off, n] : mine) pool->Unref(off);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(pool->bytes_used(), 0u);
  EXPECT_EQ(pool->Stats().chunks_free, pool->Stats().chunks_total);
}

}  // namespace
}  // namespace oscarkv
