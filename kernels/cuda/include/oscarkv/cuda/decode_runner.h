// PagedDecoder: a decode plan copied to the device plus its workspace -- the host glue between
// PlanDecode and LaunchDecodeAttention. Plan once per batch composition, launch per layer.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include "oscarkv/cuda/decode_attention.h"
#include "oscarkv/cuda/device_buffer.h"

namespace oscarkv::cuda {

// Whether PagedDecoder re-plans a batch for one 8-warp INT2 CTA per SM (DecodeParams::int2_warps)
// given its default plan: GQA <= 4 (packed_int8_values' 8-warp kernel), at most 2 INT2 CTAs
// per SM (one wave with the rotation kernel: B=1), every item in the INT2 kernel (an
// INT2-dominated batch; a BF16-heavy one keeps its BF16 kernel's two CTAs per SM), and at least
// 8 INT2 slices per SM (a slice per warp; shorter batches were not measured with 8 warps and keep
// the 4-warp plan).
inline bool WantsWideInt2Ctas(const DecodeShape& shape, const DecodePlan& plan, int num_sms) {
  return shape.gqa() <= 4 && plan.num_int2_items <= 2 * num_sms &&
         plan.num_int2_items == static_cast<int32_t>(plan.items.size()) &&
         plan.int2_slices >= size_t{8} * static_cast<size_t>(std::max(num_sms, 1));
}

class PagedDecoder {
 public:
  static absl::StatusOr<PagedDecoder> Create(const DecodeShape& shape,
                                             const std::vector<int32_t>& seq_page_indptr,
                                             const std::vector<int32_t>& seq_page_ids,
                                             const std::vector<uint8_t>& page_kinds, int num_sms,
                                             int target_ctas = 0, bool session5_slots = false,
                                             int tail_items = 0, int wide_target = 0) {
    auto plan = PlanDecode(shape, seq_page_indptr, seq_page_ids, page_kinds, num_sms, target_ctas,
                           session5_slots, tail_items);
    if (!plan.ok()) return plan.status();
    PagedDecoder d;
    // Batches whose default plan has at most 2 INT2-kernel CTAs per SM (B=1; Params() then
    // picks the rotation kernel): about one 8-warp CTA per SM instead (DecodeParams::int2_warps).
    // wide_target (bench only): that plan aimed at this many CTAs instead of num_sms (H200, B=1 x
    // 100K: 112 / 120 / 128 / 136 / 144 CTAs in the INT2 kernel, 16 of them BF16 items,
    // 28.3 / 27.1 / 26.2 / 25.6 (the default's 136) / 33.1 µs; bench/results/NOTES.md session 23).
    if (target_ctas <= 0 && !session5_slots && tail_items == 0 && WantsWideInt2Ctas(shape, *plan, num_sms)) {
      auto wide = PlanDecode(shape, seq_page_indptr, seq_page_ids, page_kinds, num_sms,
                             wide_target > 0 ? wide_target : num_sms, false, 0);
      if (!wide.ok()) return wide.status();
      plan = *std::move(wide);
      d.int2_warps_ = 8;
    }
    d.shape_ = shape;
    d.num_sms_ = num_sms;
    d.num_seqs_ = static_cast<int32_t>(seq_page_indptr.size() - 1);
    d.plan_ = *std::move(plan);
    auto items = DeviceBuffer::FromHost(d.plan_.items);
    if (!items.ok()) return items.status();
    auto ip = DeviceBuffer::FromHost(d.plan_.item_indptr);
    if (!ip.ok()) return ip.status();
    auto ord = DeviceBuffer::FromHost(d.plan_.order);
    if (!ord.ok()) return ord.status();
    d.order_ = *std::move(ord);
    std::vector<DecodeWorkItem> launch;
    launch.reserve(d.plan_.order.size());
    for (int32_t i : d.plan_.order) launch.push_back(d.plan_.items[i]);
    auto li = DeviceBuffer::FromHost(launch);
    if (!li.ok()) return li.status();
    d.launch_items_ = *std::move(li);
    auto ws = DeviceBuffer::Create(DecodeWorkspaceBytes(shape, d.num_seqs_,
                                                        static_cast<int32_t>(d.plan_.items.size())));
    if (!ws.ok()) return ws.status();
    // fused_merge's arrival counters start at zero (each launch leaves them zero).
    if (ws->bytes() > 0) {
      if (absl::Status st = CudaOk(cudaMemset(ws->get(), 0, ws->bytes()), "zero decode workspace");
          !st.ok()) {
        return st;
      }
    }
    d.items_ = *std::move(items);
    d.item_indptr_ = *std::move(ip);
    d.workspace_ = *std::move(ws);
    return d;
  }

  // Params with shape, plan and workspace filled in; the caller sets table, q, out, lse,
  // rotations and options.
  DecodeParams Params() const {
    DecodeParams p;
    p.shape = shape_;
    p.items = items_.as<DecodeWorkItem>();
    p.num_items = static_cast<int32_t>(plan_.items.size());
    p.item_indptr = item_indptr_.as<int32_t>();
    p.item_order = order_.as<int32_t>();
    p.launch_items = launch_items_.as<DecodeWorkItem>();
    p.num_int2_items = plan_.num_int2_items;
    p.workspace = workspace_.get();
    p.fused_merge = plan_.empty_pairs == 0;
    // Query preparation (DecodeParams::rotate_in_cta, prepared_fragments, int2_ctas_per_sm;
    // H200, bench/results/NOTES.md session 13). Plans of at most 2 INT2-kernel CTAs per SM
    // (B=1): the rotation kernel, with at most 2 INT2 CTAs per SM (its CTAs keep the INT2 CTAs
    // off their SMs at dispatch, which would otherwise stack BF16 items as third CTAs on SMs
    // with two INT2 items). One-wave plans of 3 per SM (B=8 x 32K): in every CTA (the rotation
    // kernel's CTAs would make the scheduler put 3 INT2 items on some SMs). Several waves (B=32):
    // the rotation kernel.
    // With the rotation kernel, it starts as a programmatic dependent of the previous kernel
    // when the INT2 kernel is this launch's only kernel (then the previous kernel is one like it
    // in back-to-back launches; a BF16 kernel would let it start early and hold SMs).
    // H200, B=1 x 100K: 32.8 us (in-CTA rotation, main 60e7603) -> 30.7 (rotation kernel, 2 per
    // SM) -> 28.8 (early_rotation, bulk_merge); B=32 x 32K 181.6 -> 175.5.
    const int n2 = plan_.num_int2_items;
    p.rotate_in_cta = n2 > 2 * num_sms_ && n2 <= 3 * num_sms_;
    if (n2 <= 2 * num_sms_) p.int2_ctas_per_sm = 2;
    p.early_rotation = !p.rotate_in_cta && p.fused_merge && n2 == p.num_items;
    // With the rotation kernel, the fragments (and BF16 items' queries) are loaded before the
    // first copies (several waves: session 15; one wave: session 20).
    p.fragments_before_copies = !p.rotate_in_cta;
    // The merge's partials in one bulk copy per chunk with 4-warp CTAs; 8-warp CTAs' 256 threads
    // copy them faster with cp.async (B=1 x 100K -0.2..-0.4 µs, session 23).
    p.bulk_merge = int2_warps_ == 4;
    p.int2_warps = int2_warps_;
    // 8-warp CTAs stream their pages with evict_first (R_K, the tables and the code stay in L2).
    p.stream_evict_first = true;
    p.early_slices = 1;
    p.table.num_seqs = num_seqs_;
    return p;
  }
  const DecodePlan& plan() const { return plan_; }
  size_t workspace_bytes() const { return workspace_.bytes(); }

 private:
  DecodeShape shape_;
  int32_t num_seqs_ = 0;
  int num_sms_ = 0;
  int int2_warps_ = 4;
  DecodePlan plan_;
  DeviceBuffer items_, item_indptr_, order_, launch_items_, workspace_;
};

}  // namespace oscarkv::cuda
