// PagedDecoder: a decode plan copied to the device plus its workspace, and the launch options the
// plan gets (measured on the H200: bench/results/NOTES.md).
#include "oscarkv/cuda/decode_runner.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/internal/decode_launch.h"

namespace oscarkv::cuda {

struct PagedDecoder::State {
  DecodeShape shape;
  int32_t num_seqs = 0;
  int num_sms = 0;
  int int2_warps = 4;
  DecodePlan plan;
  DeviceBuffer items, item_indptr, order, launch_items, workspace;
  // CreateForCapture: the capacity, the fixed item count (every launch's grid), the INT2-kernel
  // item count the launch options were chosen for, and whether Update has planned a batch.
  bool capture = false;
  PagedDecoder::Capacity capacity;
  int32_t capacity_items = 0;
  int32_t options_n2 = 0;
  bool planned = false;
};

struct DecoderAccess {
  static const PagedDecoder::State& Get(const PagedDecoder& d) { return *d.s_; }
  static PagedDecoder Make() { return PagedDecoder(); }
  static PagedDecoder::State& Mut(PagedDecoder& d) { return *d.s_; }
};

PagedDecoder::PagedDecoder() : s_(std::make_unique<State>()) {}
PagedDecoder::PagedDecoder(PagedDecoder&&) noexcept = default;
PagedDecoder& PagedDecoder::operator=(PagedDecoder&&) noexcept = default;
PagedDecoder::~PagedDecoder() = default;

const DecodeShape& PagedDecoder::shape() const { return s_->shape; }
int32_t PagedDecoder::num_seqs() const { return s_->num_seqs; }
size_t PagedDecoder::page_bytes_read() const { return s_->plan.page_bytes_read; }
size_t PagedDecoder::workspace_bytes() const { return s_->workspace.bytes(); }

bool WantsWideInt2Ctas(const DecodeShape& shape, const DecodePlan& plan, int num_sms) {
  return shape.gqa() <= 4 && plan.num_int2_items <= 2 * num_sms &&
         plan.num_int2_items == static_cast<int32_t>(plan.items.size()) &&
         plan.int2_slices >= size_t{8} * static_cast<size_t>(std::max(num_sms, 1));
}

namespace {

// The default plan, or -- for batches whose default plan has at most 2 INT2-kernel CTAs per SM
// (B=1; the rotation kernel then runs first) -- a plan for about one 8-warp CTA per SM
// (DecodeParams::int2_warps; *wide). H200, B=1 x 100K: 112 / 120 / 128 / 136 / 144 CTAs in the
// INT2 kernel (16 of them BF16 items) took 28.3 / 27.1 / 26.2 / 25.6 (one per SM plus the BF16
// items) / 33.1 µs.
absl::StatusOr<DecodePlan> PlanWithRule(const DecodeShape& shape, const std::vector<int32_t>& indptr,
                                        const std::vector<int32_t>& ids,
                                        const std::vector<uint8_t>& kinds, int num_sms,
                                        const DecodePlanOptions& o, bool* wide) {
  auto plan = PlanDecode(shape, indptr, ids, kinds, num_sms, o.target_ctas, o.session5_slots,
                         o.tail_items);
  *wide = false;
  if (!plan.ok()) return plan.status();
  if (o.target_ctas <= 0 && !o.session5_slots && o.tail_items == 0 &&
      WantsWideInt2Ctas(shape, *plan, num_sms)) {
    *wide = true;
    return PlanDecode(shape, indptr, ids, kinds, num_sms,
                      o.wide_target > 0 ? o.wide_target : num_sms, false, 0);
  }
  return plan;
}

}  // namespace

absl::StatusOr<PagedDecoder> CreatePagedDecoder(const DecodeShape& shape,
                                                const std::vector<int32_t>& seq_page_indptr,
                                                const std::vector<int32_t>& seq_page_ids,
                                                const std::vector<uint8_t>& page_kinds,
                                                int num_sms, const DecodePlanOptions& o) {
  bool wide = false;
  auto plan = PlanWithRule(shape, seq_page_indptr, seq_page_ids, page_kinds, num_sms, o, &wide);
  if (!plan.ok()) return plan.status();
  PagedDecoder d = DecoderAccess::Make();
  auto& s = DecoderAccess::Mut(d);
  if (wide) s.int2_warps = 8;
  s.shape = shape;
  s.num_sms = num_sms;
  s.num_seqs = static_cast<int32_t>(seq_page_indptr.size() - 1);
  s.plan = *std::move(plan);
  auto items = DeviceBuffer::FromHost(s.plan.items);
  if (!items.ok()) return items.status();
  auto ip = DeviceBuffer::FromHost(s.plan.item_indptr);
  if (!ip.ok()) return ip.status();
  auto ord = DeviceBuffer::FromHost(s.plan.order);
  if (!ord.ok()) return ord.status();
  std::vector<DecodeWorkItem> launch;
  launch.reserve(s.plan.order.size());
  for (int32_t i : s.plan.order) launch.push_back(s.plan.items[i]);
  auto li = DeviceBuffer::FromHost(launch);
  if (!li.ok()) return li.status();
  auto ws = DeviceBuffer::Create(
      DecodeWorkspaceBytes(shape, s.num_seqs, static_cast<int32_t>(s.plan.items.size())));
  if (!ws.ok()) return ws.status();
  // fused_merge's arrival counters start at zero (each launch leaves them zero).
  if (ws->bytes() > 0) {
    if (absl::Status st = CudaStatus(cudaMemset(ws->get(), 0, ws->bytes()), "zero decode workspace");
        !st.ok()) {
      return st;
    }
  }
  s.items = *std::move(items);
  s.item_indptr = *std::move(ip);
  s.order = *std::move(ord);
  s.launch_items = *std::move(li);
  s.workspace = *std::move(ws);
  return d;
}

absl::StatusOr<PagedDecoder> PagedDecoder::Create(const DecodeShape& shape,
                                                  const std::vector<int32_t>& seq_page_indptr,
                                                  const std::vector<int32_t>& seq_page_ids,
                                                  const std::vector<uint8_t>& page_kinds,
                                                  int num_sms) {
  return CreatePagedDecoder(shape, seq_page_indptr, seq_page_ids, page_kinds, num_sms, {});
}

const DecodePlan& DecoderPlan(const PagedDecoder& decoder) {
  return DecoderAccess::Get(decoder).plan;
}

DecodeParams DecoderParams(const PagedDecoder& decoder) {
  const auto& s = DecoderAccess::Get(decoder);
  DecodeParams p;
  p.shape = s.shape;
  p.items = s.items.as<DecodeWorkItem>();
  p.num_items = s.capture ? s.capacity_items : static_cast<int32_t>(s.plan.items.size());
  p.item_indptr = s.item_indptr.as<int32_t>();
  // Capture: the batch's pair count follows the capacity's item_indptr (Update).
  if (s.capture) p.active_pairs = p.item_indptr + size_t(s.capacity.max_seqs) * s.shape.num_kv_heads + 1;
  p.item_order = s.order.as<int32_t>();
  p.launch_items = s.launch_items.as<DecodeWorkItem>();
  // A capture decoder runs every item in the INT2 kernel (one grid of capacity_items CTAs); its
  // plans give every (sequence, KV head) an item, so the last CTA of each pair merges.
  p.num_int2_items = s.capture ? s.capacity_items : s.plan.num_int2_items;
  p.workspace = s.workspace.get();
  p.fused_merge = s.capture || s.plan.empty_pairs == 0;
  // Query preparation (DecodeParams::rotate_in_cta, prepared_fragments, int2_ctas_per_sm).
  // Plans of at most 2 INT2-kernel CTAs per SM (B=1): the rotation kernel, with at most 2 INT2
  // CTAs per SM (its CTAs keep the INT2 CTAs off their SMs at dispatch, which would otherwise
  // stack BF16 items as third CTAs on SMs with two INT2 items). One-wave plans of 3 per SM (B=8 x
  // 32K): in every CTA (the rotation kernel's CTAs would make the scheduler put 3 INT2 items on
  // some SMs). Several waves (B=32): the rotation kernel. With the rotation kernel, it starts as a
  // programmatic dependent of the previous kernel when the INT2 kernel is this launch's only
  // kernel (then the previous kernel is one like it in back-to-back launches; a BF16 kernel would
  // let it start early and hold SMs) -- always so for a capture decoder, which runs every item
  // in the INT2 kernel.
  const int n2 = s.capture ? s.options_n2 : s.plan.num_int2_items;
  p.rotate_in_cta = n2 > 2 * s.num_sms && n2 <= 3 * s.num_sms;
  if (n2 <= 2 * s.num_sms) p.int2_ctas_per_sm = 2;
  p.early_rotation = !p.rotate_in_cta && p.fused_merge && (s.capture || n2 == p.num_items);
  // With the rotation kernel, the fragments (and BF16 items' queries) are loaded before the
  // first copies.
  p.fragments_before_copies = !p.rotate_in_cta;
  // The merge's partials in one bulk copy per chunk with 4-warp CTAs; 8-warp CTAs' 256 threads
  // copy them faster with cp.async.
  p.bulk_merge = s.int2_warps == 4;
  p.int2_warps = s.int2_warps;
  // 8-warp CTAs stream their pages with evict_first (R_K, the tables and the code stay in L2).
  p.stream_evict_first = true;
  p.early_slices = 1;
  p.table.num_seqs = s.num_seqs;
  return p;
}

DecodeParams DecoderParams(const PagedDecoder& decoder, const DecodeInputs& in) {
  DecodeParams p = DecoderParams(decoder);
  const int32_t n = p.table.num_seqs;
  p.table = in.table;
  p.table.num_seqs = n;
  p.q = in.q;
  p.rot_k = in.rot_k;
  p.rot_v = in.rot_v;
  p.unrotate_output = in.unrotate_output;
  p.softmax_scale = in.softmax_scale;
  p.out = in.out;
  p.lse = in.lse;
  return p;
}

absl::Status PagedDecoder::Run(const DecodeInputs& in, cudaStream_t stream) const {
  if (s_->capture && !s_->planned) {
    return absl::FailedPreconditionError("capture decoder: Update has not planned a batch yet");
  }
  if (in.table.num_seqs != 0 && in.table.num_seqs != s_->num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("decode inputs have ", in.table.num_seqs,
                                                   " sequences; the plan has ", s_->num_seqs));
  }
  if (s_->num_seqs > 0 && (in.table.page_ptrs == nullptr || in.table.page_kinds == nullptr ||
                           in.table.page_token_counts == nullptr ||
                           in.table.seq_page_indptr == nullptr || in.table.seq_page_ids == nullptr)) {
    return absl::InvalidArgumentError("decode inputs: the page table is incomplete");
  }
  return LaunchDecodeAttention(DecoderParams(*this, in), stream);
}

absl::StatusOr<PagedDecoder> PagedDecoder::CreateForCapture(const DecodeShape& shape,
                                                            const Capacity& cap, int num_sms) {
  if (absl::Status st = ValidateDecodeShape(shape); !st.ok()) return st;
  if (cap.max_seqs <= 0 || cap.max_pages_per_seq <= 0 || cap.max_seqs > (1 << 20) ||
      cap.max_pages_per_seq > (1 << 20) ||
      int64_t{cap.max_seqs} * cap.max_pages_per_seq > (int64_t{1} << 26)) {
    return absl::InvalidArgumentError(absl::StrCat("capture decoder: unsupported capacity ",
                                                   cap.max_seqs, " x ", cap.max_pages_per_seq));
  }
  // The largest batches: every sequence at its page limit, all INT2 (the launch options are
  // chosen for that plan) or all BF16 (more items per token).
  std::vector<int32_t> indptr(cap.max_seqs + 1), ids(size_t(cap.max_seqs) * cap.max_pages_per_seq);
  for (int32_t b = 0; b <= cap.max_seqs; ++b) indptr[b] = b * cap.max_pages_per_seq;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  bool wide = false;
  auto int2 = PlanWithRule(shape, indptr, ids,
                           std::vector<uint8_t>(ids.size(), static_cast<uint8_t>(PageKind::kInt2)),
                           num_sms, {}, &wide);
  if (!int2.ok()) return int2.status();
  bool wide_bf16 = false;
  auto bf16 = PlanWithRule(shape, indptr, ids,
                           std::vector<uint8_t>(ids.size(), static_cast<uint8_t>(PageKind::kBf16)),
                           num_sms, {}, &wide_bf16);
  if (!bf16.ok()) return bf16.status();
  const int32_t pairs = cap.max_seqs * static_cast<int32_t>(shape.num_kv_heads);
  PagedDecoder d;
  State& s = *d.s_;
  s.shape = shape;
  s.num_sms = num_sms;
  s.num_seqs = cap.max_seqs;
  s.int2_warps = wide ? 8 : 4;
  s.capture = true;
  s.capacity = cap;
  s.capacity_items = std::max({static_cast<int32_t>(int2->items.size()),
                               static_cast<int32_t>(bf16->items.size()), pairs});
  s.options_n2 = static_cast<int32_t>(int2->items.size());
  const size_t n = static_cast<size_t>(s.capacity_items);
  auto items = DeviceBuffer::Create(n * sizeof(DecodeWorkItem));
  if (!items.ok()) return items.status();
  // item_indptr, then the batch's pair count (DecodeParams::active_pairs).
  auto ip = DeviceBuffer::Create((size_t(pairs) + 2) * sizeof(int32_t));
  if (!ip.ok()) return ip.status();
  auto ord = DeviceBuffer::Create(n * sizeof(int32_t));
  if (!ord.ok()) return ord.status();
  auto li = DeviceBuffer::Create(n * sizeof(DecodeWorkItem));
  if (!li.ok()) return li.status();
  auto ws = DeviceBuffer::Create(DecodeWorkspaceBytes(shape, s.num_seqs, s.capacity_items));
  if (!ws.ok()) return ws.status();
  if (absl::Status st = CudaStatus(cudaMemset(ws->get(), 0, ws->bytes()), "zero decode workspace");
      !st.ok()) {
    return st;
  }
  s.items = *std::move(items);
  s.item_indptr = *std::move(ip);
  s.order = *std::move(ord);
  s.launch_items = *std::move(li);
  s.workspace = *std::move(ws);
  return d;
}

absl::Status PagedDecoder::Update(const std::vector<int32_t>& indptr,
                                  const std::vector<int32_t>& ids,
                                  const std::vector<uint8_t>& kinds, cudaStream_t stream) {
  State& s = *s_;
  if (!s.capture) return absl::InvalidArgumentError("Update needs a decoder made by CreateForCapture");
  if (indptr.empty() || indptr.size() - 1 > static_cast<size_t>(s.capacity.max_seqs)) {
    return absl::InvalidArgumentError(absl::StrCat("capture decoder: ", indptr.size() - 1,
                                                   " sequences (capacity ", s.capacity.max_seqs, ")"));
  }
  for (size_t b = 0; b + 1 < indptr.size(); ++b) {
    if (indptr[b + 1] - indptr[b] > s.capacity.max_pages_per_seq) {
      return absl::InvalidArgumentError(absl::StrCat("capture decoder: sequence ", b, " has ",
                                                     indptr[b + 1] - indptr[b], " pages (capacity ",
                                                     s.capacity.max_pages_per_seq, ")"));
    }
  }
  const int32_t H = static_cast<int32_t>(s.shape.num_kv_heads);
  const int32_t pairs = s.capacity.max_seqs * H;
  const int32_t batch_pairs = static_cast<int32_t>(indptr.size() - 1) * H;
  // The plan as Create would make it (the 8-warp rule when the decoder has 8-warp CTAs); a plan
  // with more items than the grid holds (with one empty item for every pair without items) is
  // made again for fewer CTAs.
  DecodePlanOptions o;
  DecodePlan plan;
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<DecodePlan> pl;
    if (attempt == 0 && s.int2_warps == 8) {
      pl = PlanDecode(s.shape, indptr, ids, kinds, s.num_sms, s.num_sms);
    } else {
      pl = PlanDecode(s.shape, indptr, ids, kinds, s.num_sms, o.target_ctas);
    }
    if (!pl.ok()) return pl.status();
    const int64_t need = int64_t(pl->items.size()) + pl->empty_pairs + (pairs - batch_pairs);
    if (need <= s.capacity_items) {
      plan = *std::move(pl);
      break;
    }
    if (attempt >= 8) {
      return absl::InvalidArgumentError(absl::StrCat("capture decoder: the batch needs ", need,
                                                     " work items, the decoder holds ", s.capacity_items));
    }
    const int64_t cur = o.target_ctas > 0 ? o.target_ctas : int64_t(pl->items.size());
    o.target_ctas = static_cast<int>(std::max<int64_t>(
        1, cur * (s.capacity_items - pl->empty_pairs - (pairs - batch_pairs)) / need - 1));
  }
  // Items in (sequence, KV head) order with an empty one (no slices) for every pair without
  // items (its CTA writes the pair's zero output), then padding items (kPaddingItemKind, in no
  // pair's range: their CTAs exit at once) up to the grid's size; the launch order is the
  // plan's, then the empty items, then the padding.
  std::vector<DecodeWorkItem> items;
  std::vector<int32_t> item_indptr, remap(plan.items.size(), -1), order;
  items.reserve(s.capacity_items);
  item_indptr.reserve(pairs + 2);
  item_indptr.push_back(0);
  std::vector<int32_t> empties;
  const int32_t padding_kind = kPaddingItemKind;
  for (int32_t pair = 0; pair < pairs; ++pair) {
    if (pair < batch_pairs) {
      for (int32_t i = plan.item_indptr[pair]; i < plan.item_indptr[pair + 1]; ++i) {
        remap[i] = static_cast<int32_t>(items.size());
        items.push_back(plan.items[i]);
      }
    }
    if (items.size() == static_cast<size_t>(item_indptr.back())) {
      empties.push_back(static_cast<int32_t>(items.size()));
      items.push_back({pair / H, pair % H, static_cast<int32_t>(PageKind::kInt2), 0, 0, 0});
    }
    item_indptr.push_back(static_cast<int32_t>(items.size()));
  }
  const int32_t real_items = static_cast<int32_t>(items.size());
  while (items.size() < static_cast<size_t>(s.capacity_items)) {
    items.push_back({0, 0, padding_kind, 0, 0, 0});
  }
  item_indptr.push_back(batch_pairs);
  order.reserve(items.size());
  for (int32_t i : plan.order) order.push_back(remap[i]);
  order.insert(order.end(), empties.begin(), empties.end());
  for (int32_t i = real_items; i < s.capacity_items; ++i) order.push_back(i);
  std::vector<DecodeWorkItem> launch;
  launch.reserve(order.size());
  for (int32_t i : order) launch.push_back(items[i]);
  // Pageable sources: each copy has read them when it returns.
  auto copy = [&](const DeviceBuffer& dst, const void* src, size_t bytes) {
    return CudaStatus(cudaMemcpyAsync(dst.get(), src, bytes, cudaMemcpyHostToDevice, stream),
                  "decode plan upload");
  };
  if (absl::Status st = copy(s.items, items.data(), items.size() * sizeof(DecodeWorkItem)); !st.ok()) return st;
  if (absl::Status st = copy(s.item_indptr, item_indptr.data(), item_indptr.size() * sizeof(int32_t));
      !st.ok()) {
    return st;
  }
  if (absl::Status st = copy(s.order, order.data(), order.size() * sizeof(int32_t)); !st.ok()) return st;
  if (absl::Status st = copy(s.launch_items, launch.data(), launch.size() * sizeof(DecodeWorkItem));
      !st.ok()) {
    return st;
  }
  s.plan = std::move(plan);
  s.planned = true;
  return absl::OkStatus();
}

}  // namespace oscarkv::cuda
