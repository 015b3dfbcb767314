// Host-side split-KV planning for the paged decode kernel.
#include <algorithm>
#include <cstdint>
#include <functional>

#include "absl/strings/str_cat.h"
#include "oscarkv/cuda/internal/decode_launch.h"

namespace oscarkv::cuda {

absl::Status ValidateDecodeShape(const DecodeShape& s) {
  if (s.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat("decode kernel needs head_dim 128, got ", s.head_dim));
  }
  if (s.group_size != 128 && s.group_size != 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode kernel needs group 128 or 64, got ", s.group_size));
  }
  if (s.page_tokens < kSliceTokens || s.page_tokens > 256 || s.page_tokens % kSliceTokens != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("decode kernel needs page_tokens 64, 128 or 256, got ", s.page_tokens));
  }
  if (s.num_kv_heads == 0 || s.num_q_heads == 0 || s.num_q_heads % s.num_kv_heads != 0 ||
      s.num_q_heads / s.num_kv_heads > 8) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported heads: ", s.num_q_heads,
                                                   " query heads over ", s.num_kv_heads,
                                                   " KV heads (GQA ratio 1..8)"));
  }
  if (s.layer >= s.num_layers) return absl::InvalidArgumentError("layer out of range");
  return absl::OkStatus();
}

absl::StatusOr<DecodePlan> PlanDecode(const DecodeShape& shape,
                                      const std::vector<int32_t>& indptr,
                                      const std::vector<int32_t>& ids,
                                      const std::vector<uint8_t>& kinds, int num_sms,
                                      int target_ctas, bool session5_slots, int tail_items) {
  if (absl::Status st = ValidateDecodeShape(shape); !st.ok()) return st;
  if (indptr.empty() || indptr[0] != 0) {
    return absl::InvalidArgumentError("seq_page_indptr must start at 0");
  }
  const size_t num_seqs = indptr.size() - 1;
  for (size_t b = 0; b < num_seqs; ++b) {
    if (indptr[b + 1] < indptr[b]) return absl::InvalidArgumentError("seq_page_indptr decreases");
  }
  if (static_cast<size_t>(indptr.back()) != ids.size()) {
    return absl::InvalidArgumentError("seq_page_indptr does not end at the number of page ids");
  }
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= kinds.size()) {
      return absl::InvalidArgumentError(absl::StrCat("page id ", id, " out of range"));
    }
    const uint8_t k = kinds[id];
    if (k != static_cast<uint8_t>(PageKind::kInt2) && k != static_cast<uint8_t>(PageKind::kBf16)) {
      return absl::InvalidArgumentError(absl::StrCat("page ", id, " has unknown kind ", int{k}));
    }
  }
  const uint32_t spp = shape.slices_per_page();
  const uint32_t H = shape.num_kv_heads;
  // Cost model: an INT2 slice reads ~7x fewer bytes than a BF16 slice.
  constexpr int64_t kInt2Cost = 1, kBf16Cost = 7;
  // Per-item latency (slice table, query rotation, pipeline fill, partial write), in the same
  // units: about 4 µs, i.e. ~6 INT2 slices of one CTA or ~2 BF16 slices.
  constexpr int64_t kItemOverhead = 8;
  int64_t total_cost = 0, bf16_cost = 0;
  for (int32_t id : ids) {
    const bool int2 = kinds[id] == static_cast<uint8_t>(PageKind::kInt2);
    total_cost += (int2 ? kInt2Cost : kBf16Cost) * spp;
    if (!int2) bf16_cost += kBf16Cost * spp;
  }
  total_cost *= H;
  bf16_cost *= H;
  // One wave of resident CTAs: the INT2 kernel fits 3 per SM, the BF16 kernel 2 (96 KiB of
  // stages each). When BF16 slices carry most of the cost, aim for the BF16 kernel's wave, so
  // the last wave is not a half-empty second one. A small INT2 batch (under 64 slices per CTA
  // at 3 per SM, e.g. B=1 up to ~100K tokens) also aims for 2 per SM: the issue-bound INT2 CTAs
  // of one SM share its schedulers, so the SMs holding 3 of ~2.8 items per SM would set the
  // time, and larger items amortise the prologue (H200, B=1 x 100K: 42.9 -> 38.3 µs).
  const int64_t sms = std::max(1, num_sms);
  const bool bf16_heavy = 2 * bf16_cost > total_cost;
  const int64_t int2_cost = total_cost - bf16_cost;
  const bool default_target = target_ctas <= 0;
  if (default_target) {
    target_ctas = static_cast<int>(sms * (bf16_heavy || total_cost < 64 * 3 * sms ? 2 : 3));
  }
  // Slots that only the INT2 kernel's BF16 items (planned after the INT2 items) reach first:
  // the third CTA slot of each SM when the INT2 items aim for 2 per SM (see below).
  int64_t spare_slots = 0;

  // Maximal runs of one page kind per (sequence, KV head), in plan order.
  struct Run {
    int32_t seq, head, first, len;
    uint8_t kind;
  };
  std::vector<Run> runs;
  for (size_t b = 0; b < num_seqs; ++b) {
    const int32_t p0 = indptr[b], p1 = indptr[b + 1];
    const int32_t total_slices = (p1 - p0) * static_cast<int32_t>(spp);
    for (uint32_t h = 0; h < H; ++h) {
      int32_t s = 0;
      while (s < total_slices) {
        const uint8_t kind = kinds[ids[p0 + s / static_cast<int32_t>(spp)]];
        int32_t run_end = s;
        while (run_end < total_slices &&
               kinds[ids[p0 + run_end / static_cast<int32_t>(spp)]] == kind) {
          ++run_end;
        }
        runs.push_back({static_cast<int32_t>(b), static_cast<int32_t>(h), s, run_end - s, kind});
        s = run_end;
      }
    }
  }
  auto is_int2 = [](uint8_t k) { return k == static_cast<uint8_t>(PageKind::kInt2); };
  // Items of a run for a per-item cost budget: equal parts of at most budget / unit cost slices.
  auto parts_of = [&](const Run& r, int64_t budget) {
    const int64_t unit_cost = is_int2(r.kind) ? kInt2Cost : kBf16Cost;
    const int32_t max_slices =
        static_cast<int32_t>(std::clamp<int64_t>(budget / unit_cost, 1, kMaxItemSlices));
    return (r.len + max_slices - 1) / max_slices;
  };
  // Estimated finishing time of the plan for a budget: CTAs dispatched in plan order (INT2
  // items, then BF16) to the first free of target_ctas slots. An INT2 item's 4 warps take
  // every 4th slice, so its time is set by ceil(slices / 4).
  std::vector<int64_t> slot_end;
  auto makespan = [&](int64_t budget) {
    slot_end.assign(static_cast<size_t>(target_ctas), 0);
    bool spare_added = false;
    std::make_heap(slot_end.begin(), slot_end.end(), std::greater<int64_t>());
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1 && !spare_added) {  // the third CTA slots of the SMs, free from the start
        spare_added = true;
        for (int64_t i = 0; i < spare_slots; ++i) {
          slot_end.push_back(0);
          std::push_heap(slot_end.begin(), slot_end.end(), std::greater<int64_t>());
        }
      }
      for (const Run& r : runs) {
        if (is_int2(r.kind) != (pass == 0)) continue;
        const int32_t parts = parts_of(r, budget);
        for (int32_t part = 0; part < parts; ++part) {
          const int64_t n = int64_t{r.len} * (part + 1) / parts - int64_t{r.len} * part / parts;
          const int64_t cost = kItemOverhead + (is_int2(r.kind) ? 4 * kInt2Cost * ((n + 3) / 4)
                                                                : kBf16Cost * n);
          std::pop_heap(slot_end.begin(), slot_end.end(), std::greater<int64_t>());
          slot_end.back() += cost;
          std::push_heap(slot_end.begin(), slot_end.end(), std::greater<int64_t>());
        }
      }
    }
    return *std::max_element(slot_end.begin(), slot_end.end());
  };
  // Budget: the one-wave share of the total cost, then the best of a geometric range around
  // it by the estimate (ties: the larger budget, i.e. fewer items).
  auto choose_budget = [&]() {
    const int64_t base = std::max<int64_t>(4, (total_cost + target_ctas - 1) / target_ctas);
    int64_t budget = (base + 3) / 4 * 4;
    if (!runs.empty()) {
      int64_t best = makespan(budget);
      for (double f = 0.25; f <= 4.0; f *= 1.04) {
        const int64_t b = std::max<int64_t>(4, static_cast<int64_t>(base * f));
        const int64_t m = makespan(b);
        if (m < best || (m == best && b > budget)) {
          best = m;
          budget = b;
        }
      }
    }
    return budget;
  };
  int64_t budget = choose_budget();
  // An INT2-dominated plan that does not fit one resident wave of the INT2 kernel (3 CTAs per
  // SM) only because of its BF16 items (sink, recent tokens), while its INT2 slices fit 2 items
  // per SM of at most 128 slices, is re-planned with the INT2 items aimed at 2 per SM and the
  // BF16 items in the third slots, so every CTA is resident at once and the SMs hold equal INT2
  // work (H200, B=8 x 32K: 320 INT2 items of ~101 slices + 128 BF16 items on 396 slots, 75.2
  // µs, vs 256 of ~127 + the BF16 items in the third slots, 67.2 µs in the same call). Plans that
  // already fit keep their slots: a BF16 item in the third slot slows its SM's two INT2 items
  // (B=1 x 100K: 264 INT2 items + 16 BF16 in third slots 42.4 µs vs 240 + 16 on 2 per SM 38.1).
  // session5_slots keeps the previous planner, for side-by-side measurement.
  if (default_target && !session5_slots && !bf16_heavy && int2_cost <= 128 * 2 * sms) {
    int64_t items = 0;
    for (const Run& r : runs) items += parts_of(r, budget);
    if (items > 3 * sms) {
      target_ctas = static_cast<int>(2 * sms);
      spare_slots = sms;
      budget = choose_budget();
    }
  }

  // tail_items: in a plan of more INT2 items than CTA slots, the last part of the last
  // tail_items / 2 INT2 runs of at least 2 parts is split in two halves, dispatched after every
  // other INT2 item (see decode_attention.h).
  std::vector<bool> split_last(runs.size(), false);
  if (tail_items >= 2) {
    int64_t int2_items = 0;
    for (const Run& r : runs) {
      if (is_int2(r.kind)) int2_items += parts_of(r, budget);
    }
    if (int2_items > target_ctas) {
      int64_t left = tail_items / 2;
      for (size_t i = runs.size(); i-- > 0 && left > 0;) {
        if (is_int2(runs[i].kind) && parts_of(runs[i], budget) >= 2 && runs[i].len >= 4) {
          split_last[i] = true;
          --left;
        }
      }
    }
  }
  std::vector<bool> tail;  // per item: one of the split halves

  DecodePlan plan;
  plan.item_indptr.reserve(num_seqs * H + 1);
  plan.item_indptr.push_back(0);
  const PageGeometry g2 = shape.geometry(PageKind::kInt2);
  const size_t int2_slice_bytes = 2 * (kSliceTokens * g2.code_row_bytes() +
                                       size_t{kSliceTokens} * g2.groups_per_row() * 4);
  const size_t bf16_slice_bytes = 2 * size_t{kSliceTokens} * shape.head_dim * 2;
  size_t ri = 0;
  for (size_t b = 0; b < num_seqs; ++b) {
    for (uint32_t h = 0; h < H; ++h) {
      for (; ri < runs.size() && runs[ri].seq == static_cast<int32_t>(b) &&
             runs[ri].head == static_cast<int32_t>(h);
           ++ri) {
        const Run& r = runs[ri];
        const int32_t parts = parts_of(r, budget);
        auto add = [&](int32_t b0, int32_t b1, bool is_tail) {
          plan.items.push_back({static_cast<int32_t>(b), static_cast<int32_t>(h),
                                static_cast<int32_t>(r.kind), b0, b1 - b0, indptr[b]});
          tail.push_back(is_tail);
          if (is_int2(r.kind)) {
            plan.int2_slices += b1 - b0;
            plan.page_bytes_read += size_t(b1 - b0) * int2_slice_bytes;
          } else {
            plan.bf16_slices += b1 - b0;
            plan.page_bytes_read += size_t(b1 - b0) * bf16_slice_bytes;
          }
        };
        for (int32_t part = 0; part < parts; ++part) {
          const int32_t b0 = r.first + static_cast<int32_t>(int64_t{r.len} * part / parts);
          const int32_t b1 = r.first + static_cast<int32_t>(int64_t{r.len} * (part + 1) / parts);
          if (part == parts - 1 && split_last[ri] && b1 - b0 >= 2) {
            const int32_t mid = b0 + (b1 - b0) / 2;
            add(b0, mid, true);
            add(mid, b1, true);
            ++plan.tail_items;
            ++plan.tail_items;
          } else {
            add(b0, b1, false);
          }
        }
      }
      plan.item_indptr.push_back(static_cast<int32_t>(plan.items.size()));
      if (plan.item_indptr.back() == plan.item_indptr[plan.item_indptr.size() - 2]) ++plan.empty_pairs;
    }
  }
  // INT2-dominated batches run every item in the INT2 kernel (its BF16 items after the INT2
  // ones, on the same CTA slots); otherwise the BF16 items go to the BF16 kernel.
  const bool fused = !bf16_heavy;
  // INT2 items (the split tail halves last among them), then the BF16 items.
  for (int pass = 0; pass < 3; ++pass) {
    const int32_t kind = pass < 2 ? static_cast<int32_t>(PageKind::kInt2) : static_cast<int32_t>(PageKind::kBf16);
    for (size_t i = 0; i < plan.items.size(); ++i) {
      if (plan.items[i].kind == kind && (pass == 2 || tail[i] == (pass == 1))) {
        plan.order.push_back(static_cast<int32_t>(i));
      }
    }
    if (pass == 1) plan.num_int2_items = static_cast<int32_t>(plan.order.size());
  }
  if (fused) plan.num_int2_items = static_cast<int32_t>(plan.order.size());
  return plan;
}

size_t DecodeWorkspaceBytes(const DecodeShape& shape, int32_t num_seqs, int32_t num_items) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  // Partial outputs [item][gqa][d], then (max, sum) pairs [item][gqa][2].
  const size_t po = align(sizeof(float) * size_t(num_items) * shape.gqa() * shape.head_dim);
  const size_t pml = align(sizeof(float) * 2 * size_t(num_items) * shape.gqa());
  const size_t counters = align(sizeof(int32_t) * size_t(num_seqs) * shape.num_kv_heads);
  // Rotated, scaled queries [seq][query head][d] (the rotation kernel's output).
  const size_t qrot = align(sizeof(float) * size_t(num_seqs) * shape.num_q_heads * shape.head_dim);
  // share_rotation's (ticket, published) pairs.
  const size_t tickets = align(sizeof(int32_t) * 2 * size_t(num_seqs) * shape.num_kv_heads);
  // The rotation kernel's int8 query fragments: 32 lanes x 64 bytes per (sequence, KV head).
  const size_t fragments = size_t(num_seqs) * shape.num_kv_heads * 32 * 64;
  return po + pml + counters + qrot + tickets + fragments;
}

}  // namespace oscarkv::cuda
