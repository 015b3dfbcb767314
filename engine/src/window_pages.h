// Page layout that gives every query position of a teacher-forced window its own decode-time
// view of the KV cache, so one batched decode launch (one "sequence" per query position)
// reproduces MixedPrecisionAttention's semantics exactly (host-only; used by CudaAttention).
//
// For query position t (n = t + 1 visible tokens) of an INT2 codec the view is
//   BF16 sink    [0, min(sink, n)),
//   INT2 history [sink, n - recent)               (empty unless n - recent > sink),
//   BF16 recent  [max(sink, n - recent), n);
// a BF16 codec sees [0, n) in BF16. Regions start at arbitrary tokens while page slots are
// 64-token aligned, so the layout keeps *page sets*: set (kind, first_token) holds tokens
// [first_token, tokens) in consecutive 64-token pages (page j = tokens first_token + 64j ...).
// BF16 sets exist for every start residue a region needs (sink: residue 0; recent: n - recent
// mod 64), INT2 one set starting at `sink`. A region [a, b) is then pages of the set with
// residue a % 64 (BF16) or the INT2 set, the last one with a partial token count; page-table
// entries are (physical page, token count) pairs, so the same page can appear with different
// counts in different sequences.
#pragma once

#include <cstdint>
#include <vector>

#include "oscarkv/kernels/page_format.h"

namespace oscarkv::engine {

inline constexpr uint32_t kWindowPageTokens = 64;

struct WindowPageSet {
  PageKind kind;
  uint32_t first_token;  // page j of the set holds tokens [first_token + 64j, +64) ∩ [0, tokens)
  uint32_t first_page;   // index of page 0 in WindowPageLayout::page_kinds
  uint32_t num_pages;
};

struct WindowPageLayout {
  uint32_t tokens = 0;
  std::vector<WindowPageSet> sets;
  std::vector<uint8_t> page_kinds;   // per physical page (PageKind)
  // Page-table entries: physical page and valid token count (1..64).
  std::vector<int32_t> entry_page;
  std::vector<uint16_t> entry_count;
  std::vector<uint8_t> entry_kinds;  // = page_kinds[entry_page[e]]
  // CSR: query position t reads entries seq_entries[seq_indptr[t] .. seq_indptr[t+1]).
  std::vector<int32_t> seq_indptr, seq_entries;
  // Token of entry slot s: first token of the entry's page + s.
  std::vector<uint32_t> page_first_token;  // per physical page
  // Write destinations: set s receives its tokens first_token + i, i in [0, tokens -
  // first_token), at (dst_page, dst_slot)[set_dst_offset[s] + i] = (its page i / 64, i % 64).
  std::vector<int32_t> dst_page, dst_slot, set_dst_offset;
};

// Layout for a window of `tokens` positions. int2 = false: every token BF16 (sink/recent unused).
WindowPageLayout BuildWindowPageLayout(uint32_t tokens, bool int2, uint32_t sink, uint32_t recent);

}  // namespace oscarkv::engine
