#include "window_pages.h"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

namespace oscarkv::engine {
namespace {

// Expected precision of key s for query t under the decode semantics of attention.h:
// 2 = BF16, 1 = INT2 (PageKind values), 0 = not visible.
uint8_t Expected(bool int2, uint32_t sink, uint32_t recent, uint32_t t, uint32_t s) {
  if (s > t) return 0;
  if (!int2) return 2;
  if (s < sink || int64_t{s} >= int64_t{t} + 1 - recent) return 2;
  return 1;
}

// Every query position sees exactly its keys, each once, in the right precision; pages are
// filled from slot 0 and every set's pages hold the set's tokens in order.
void CheckLayout(uint32_t T, bool int2, uint32_t sink, uint32_t recent) {
  SCOPED_TRACE(testing::Message() << "T=" << T << " int2=" << int2 << " sink=" << sink
                                  << " recent=" << recent);
  const WindowPageLayout L = BuildWindowPageLayout(T, int2, sink, recent);
  ASSERT_EQ(L.seq_indptr.size(), size_t{T} + 1);
  ASSERT_EQ(L.page_kinds.size(), L.page_first_token.size());
  ASSERT_EQ(L.set_dst_offset.size(), L.sets.size());
  for (size_t si = 0; si < L.sets.size(); ++si) {
    const WindowPageSet& s = L.sets[si];
    EXPECT_EQ(s.num_pages, (T - s.first_token + 63) / 64);
    for (uint32_t j = 0; j < s.num_pages; ++j) {
      EXPECT_EQ(L.page_first_token[s.first_page + j], s.first_token + 64 * j);
      EXPECT_EQ(L.page_kinds[s.first_page + j], static_cast<uint8_t>(s.kind));
    }
    // Token first_token + i lands in the slot of the page that holds it.
    for (uint32_t i = 0; i < T - s.first_token; ++i) {
      const int32_t page = L.dst_page[L.set_dst_offset[si] + i];
      EXPECT_EQ(L.page_first_token[page] + L.dst_slot[L.set_dst_offset[si] + i], s.first_token + i);
      EXPECT_GE(page, static_cast<int32_t>(s.first_page));
      EXPECT_LT(page, static_cast<int32_t>(s.first_page + s.num_pages));
    }
  }
  EXPECT_EQ(L.dst_page.size(), L.dst_slot.size());
  for (uint32_t t = 0; t < T; ++t) {
    std::vector<uint8_t> seen(T, 0);
    for (int32_t i = L.seq_indptr[t]; i < L.seq_indptr[t + 1]; ++i) {
      const int32_t e = L.seq_entries[i];
      const uint32_t page = L.entry_page[e], count = L.entry_count[e];
      ASSERT_GE(count, 1u);
      ASSERT_LE(count, 64u);
      ASSERT_EQ(L.entry_kinds[e], L.page_kinds[page]);
      for (uint32_t k = 0; k < count; ++k) {
        const uint32_t s = L.page_first_token[page] + k;
        ASSERT_LT(s, T);
        ASSERT_EQ(seen[s], 0) << "t=" << t << " reads token " << s << " twice";
        seen[s] = L.page_kinds[page];
      }
    }
    for (uint32_t s = 0; s < T; ++s) {
      ASSERT_EQ(seen[s], Expected(int2, sink, recent, t, s)) << "t=" << t << " s=" << s;
    }
  }
}

TEST(WindowPages, EveryQueryPositionSeesItsDecodeView) {
  for (auto [T, int2, sink, recent] : std::vector<std::tuple<uint32_t, bool, uint32_t, uint32_t>>{
           {700, false, 64, 256},  // BF16 codec
           {700, true, 64, 256},   // the published windows
           {700, true, 0, 0},      // no BF16 windows
           {700, true, 5, 37},     // unaligned sink and recent
           {300, true, 64, 256},   // shorter than sink + recent: no INT2 at all
           {129, true, 0, 70},
           {1, true, 64, 256},
           {2048, true, 64, 256}}) {
    CheckLayout(T, int2, sink, recent);
  }
}

TEST(WindowPages, MemoryStaysSmallForTheEvalWindow) {
  const WindowPageLayout L = BuildWindowPageLayout(2048, true, 64, 256);
  // 64 BF16 residue sets (<= 32 pages each) and one INT2 set.
  EXPECT_EQ(L.sets.size(), 65u);
  EXPECT_LE(L.page_kinds.size(), 65u * 32);
  // Entries per query: <= 1 sink + 31 INT2 + 5 recent.
  EXPECT_LE(L.seq_entries.size(), size_t{2048} * 37);
}

}  // namespace
}  // namespace oscarkv::engine
