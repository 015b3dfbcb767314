#include "window_pages.h"

#include <algorithm>
#include <map>

namespace oscarkv::engine {

WindowPageLayout BuildWindowPageLayout(uint32_t tokens, bool int2, uint32_t sink, uint32_t recent) {
  constexpr uint32_t P = kWindowPageTokens;
  WindowPageLayout L;
  L.tokens = tokens;
  if (!int2) {
    sink = tokens;  // one BF16 "sink" region [0, n)
    recent = 0;
  }
  // Start of the BF16 recent region of query position t (n = t + 1); == n when empty.
  auto recent_start = [&](uint32_t n) -> uint32_t {
    const int64_t a = std::max<int64_t>(sink, int64_t{n} - recent);
    return static_cast<uint32_t>(std::min<int64_t>(a, n));
  };

  // Page sets: BF16 per needed start residue, one INT2 set starting at the sink.
  std::map<uint32_t, int32_t> bf16_set;  // residue -> set index
  int32_t int2_set = -1;
  auto add_set = [&](PageKind kind, uint32_t first) {
    WindowPageSet s{kind, first, static_cast<uint32_t>(L.page_kinds.size()),
                    (tokens - first + P - 1) / P};
    for (uint32_t j = 0; j < s.num_pages; ++j) {
      L.page_kinds.push_back(static_cast<uint8_t>(kind));
      L.page_first_token.push_back(first + j * P);
    }
    L.sets.push_back(s);
    return static_cast<int32_t>(L.sets.size() - 1);
  };
  if (sink > 0 && tokens > 0) bf16_set[0] = -1;
  for (uint32_t n = 1; n <= tokens; ++n) {
    const uint32_t a = recent_start(n);
    if (a < n) bf16_set[a % P] = -1;
  }
  for (auto& [residue, index] : bf16_set) index = add_set(PageKind::kBf16, residue);
  if (int2 && int64_t{tokens} - recent > int64_t{sink}) int2_set = add_set(PageKind::kInt2, sink);

  // Entries, created on first use: (physical page, count) -> entry.
  std::vector<int32_t> entry_of(L.page_kinds.size() * P, -1);
  auto entry = [&](uint32_t page, uint32_t count) {
    int32_t& e = entry_of[size_t{page} * P + count - 1];
    if (e < 0) {
      e = static_cast<int32_t>(L.entry_page.size());
      L.entry_page.push_back(static_cast<int32_t>(page));
      L.entry_count.push_back(static_cast<uint16_t>(count));
      L.entry_kinds.push_back(L.page_kinds[page]);
    }
    return e;
  };
  // Tokens [a, b) of set s (a - first_token a multiple of 64).
  auto add_range = [&](int32_t s, uint32_t a, uint32_t b) {
    const WindowPageSet& set = L.sets[s];
    for (uint32_t t = a; t < b; t += P) {
      const uint32_t j = (t - set.first_token) / P;
      L.seq_entries.push_back(entry(set.first_page + j, std::min(P, b - t)));
    }
  };

  for (const WindowPageSet& s : L.sets) {
    L.set_dst_offset.push_back(static_cast<int32_t>(L.dst_page.size()));
    for (uint32_t i = 0; i < tokens - s.first_token; ++i) {
      L.dst_page.push_back(static_cast<int32_t>(s.first_page + i / P));
      L.dst_slot.push_back(static_cast<int32_t>(i % P));
    }
  }

  L.seq_indptr.push_back(0);
  for (uint32_t n = 1; n <= tokens; ++n) {
    const uint32_t s_end = std::min(sink, n), a = recent_start(n);
    if (s_end > 0) add_range(bf16_set.at(0), 0, s_end);
    if (a > sink) add_range(int2_set, sink, a);
    if (a < n) add_range(bf16_set.at(a % P), a, n);
    L.seq_indptr.push_back(static_cast<int32_t>(L.seq_entries.size()));
  }
  return L;
}

}  // namespace oscarkv::engine
