// The kernel bench's driver (RunKernelBench, kernel_bench.h): the device, copy bandwidth, the shared
// source rows and rotations, then the decode rows (kernel_bench_decode.cu), the extend rows and the
// quantize-on-write rows.
#include "kernel_bench.h"
#include "kernel_bench_internal.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "oscarkv/cuda/decode_runner.h"
#include "extend_internal.h"  // kernels/cuda/src: the extend kernels' diagnostics
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/internal/decode_launch.h"
#include "oscarkv/cuda/internal/quantize_launch.h"
#include "oscarkv/cuda/extend_attention.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::bench {
namespace {

__global__ void CopyKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

}  // namespace

absl::StatusOr<KernelBenchReport> RunKernelBench(const KernelBenchOptions& o) {
  KernelBenchReport r;
  cudaDeviceProp prop{};
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable CUDA device (", e != cudaSuccess ? cudaGetErrorString(e) : "none found",
        "): the kernel bench runs on a GPU machine, e.g. through scripts/gpu/run_all.sh"));
  }
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, 0), "device properties"));
  r.device = prop.name;
  r.sms = prop.multiProcessorCount;
  r.decode_ctas_per_sm = cuda::DecodeKernelOccupancy(128);
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&r.l2_bytes, cudaDevAttrL2CacheSize, 0), "L2 size"));
  r.warm_l2 = o.warm_l2;

  // SDPA first (its own process; frees its memory when it exits).
  if (!o.sdpa_command.empty() && !o.shapes.empty()) {
    auto rows = RunSdpaBaseline(o);
    if (!rows.ok()) {
      r.sdpa_error = std::string(rows.status().message());
    } else {
      r.decode = *std::move(rows);
    }
  }
  if (r.decode.empty()) {
    for (auto [b, l] : o.shapes) r.decode.push_back(DecodeRow{b, l});
  }

  // Copy bandwidth: 2 GiB read + 2 GiB written.
  {
    const size_t bytes = size_t{2} << 30;
    auto src = DeviceBuffer::Create(bytes);
    auto dst = DeviceBuffer::Create(bytes);
    if (!src.ok() || !dst.ok()) return absl::ResourceExhaustedError("copy buffers");
    cudaMemset(src->get(), 1, bytes);
    const int blocks = r.sms * 8;
    auto us = TimeMedianUs([&] {
      CopyKernel<<<blocks, 512>>>(src->as<uint4>(), dst->as<uint4>(), bytes / 16);
      return absl::OkStatus();
    }, o.samples);
    if (!us.ok()) return us.status();
    r.copy_gbps = 2.0 * bytes / (*us * 1e-6) / 1e9;
  }

  // Shared inputs: source rows (for page fills and quantize-on-write), rotations, clips.
  int max_len = o.quant_tokens;
  for (auto [b, l] : o.shapes) max_len = std::max(max_len, l);
  for (const ExtendShape& e : o.extend_shapes) max_len = std::max({max_len, e.prefix, e.batch * e.new_tokens});
  const size_t src_elems = size_t(max_len) * kKvHeads * kHeadDim;
  auto ksrc = DeviceBuffer::Create(src_elems * 2);
  auto vsrc = DeviceBuffer::Create(src_elems * 2);
  if (!ksrc.ok() || !vsrc.ok()) return absl::ResourceExhaustedError("source rows");
  LaunchFillBf16(1024, ksrc->as<uint16_t>(), src_elems, 1, 1.0f);
  LaunchFillBf16(1024, vsrc->as<uint16_t>(), src_elems, 2, 0.5f);
  RotationSet rot = RotationSet::Hadamard(1, kKvHeads, kHeadDim, 0.96f, 0.92f);
  auto mats = DeviceBuffer::FromHost(rot.matrices());  // [1][2][8][128][128]
  auto frags = DeviceBuffer::Create(size_t{2} * kKvHeads * cuda::kRotationFragmentBytes);
  std::vector<float> clip_v(2 * kKvHeads), noclip(2 * kKvHeads, 1.0f);
  for (int i = 0; i < 2 * kKvHeads; ++i) clip_v[i] = i < kKvHeads ? 0.96f : 0.92f;
  auto clips = DeviceBuffer::FromHost(clip_v);
  auto noclips = DeviceBuffer::FromHost(noclip);
  // The engine's launch: a per-head range-mode table (here every head unbiased) and clips.
  std::vector<uint8_t> unbiased_modes(2 * kKvHeads, static_cast<uint8_t>(RangeMode::kUnbiased));
  auto mode_table = DeviceBuffer::FromHost(unbiased_modes);
  // The same with unbiased-fixed modes (candidates 6 and 7, what `oscarkv calibrate --range
  // fixed` picks on the reference model).
  std::vector<uint8_t> fixed_modes(2 * kKvHeads);
  for (int i = 0; i < 2 * kKvHeads; ++i) fixed_modes[i] = static_cast<uint8_t>(UnbiasedFixed(6 + i % 2));
  auto fixed_table = DeviceBuffer::FromHost(fixed_modes);
  if (!mode_table.ok() || !fixed_table.ok()) return absl::InternalError("range modes");
  if (!mats.ok() || !frags.ok() || !clips.ok() || !noclips.ok()) return absl::InternalError("rotations");
  BENCH_RETURN_IF_ERROR(cuda::PrepareRotationFragments(mats->as<float>(), 2 * kKvHeads, frags->get(), nullptr));
  const float* rot_k = mats->as<float>();  // layer 0, K matrices are the first 8

  BENCH_RETURN_IF_ERROR(RunDecodeRows(o, r.sms, *ksrc, *vsrc, frags->get(), clips->as<float>(), rot, rot_k,
                                      &r.decode));

  // Extend attention: per shape, B sequences of OSCAR pages of `prefix` tokens (none: plain
  // prefill) and `new_tokens` new tokens each (the shared source rows as their K/V), beside
  // SDPA on dense BF16 K/V of the same shape and mask (run first, in its own process).
  if (!o.extend_shapes.empty()) {
    for (const ExtendShape& e : o.extend_shapes) {
      ExtendRow row;
      row.batch = e.batch;
      row.prefix = e.prefix;
      row.new_tokens = e.new_tokens;
      row.flops = 4.0 * e.batch * e.new_tokens * (e.prefix + e.new_tokens / 2.0) * kHeadDim * kQHeads;
      r.extend.push_back(row);
    }
    if (!o.sdpa_command.empty()) {
      if (absl::Status s = RunSdpaExtendBaseline(o, &r.extend); !s.ok()) {
        r.sdpa_error += std::string(r.sdpa_error.empty() ? "" : "; ") + "extend: " + std::string(s.message());
      }
    }
  }
  for (ExtendRow& row : r.extend) {
    const int B = row.batch, P = row.prefix, C = row.new_tokens;
    std::fprintf(stderr, "[bench] extend B=%d prefix=%d new=%d\n", B, P, C);
    PagedBatch pb;
    DeviceBuffer empty_indptr, empty_table;
    cuda::DecodeShape shape{static_cast<uint32_t>(o.layers), kKvHeads, kQHeads, kHeadDim, 128, kPageTokens, 0};
    cuda::ExtendParams e;
    e.shape = shape;
    if (P > 0) {
      BENCH_RETURN_IF_ERROR(BuildBatch(o, B, P, false, r.sms, 0, *ksrc, *vsrc, frags->get(), clips->as<float>(), &pb));
      e.table.page_ptrs = pb.ptr_tables[0].as<const uint8_t*>();
      e.table.page_kinds = pb.kinds.as<uint8_t>();
      e.table.page_token_counts = pb.counts.as<uint16_t>();
      e.table.seq_page_indptr = pb.indptr.as<int32_t>();
      e.table.seq_page_ids = pb.ids.as<int32_t>();
    } else {  // plain prefill: every sequence without pages
      auto ip = DeviceBuffer::FromHost(std::vector<int32_t>(B + 1, 0));
      auto tb = DeviceBuffer::Create(64);
      if (!ip.ok() || !tb.ok()) return absl::InternalError("extend table");
      empty_indptr = *std::move(ip);
      empty_table = *std::move(tb);
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(empty_table.get(), 0, 64), "extend table"));
      e.table.page_ptrs = empty_table.as<const uint8_t*>();
      e.table.page_kinds = empty_table.as<uint8_t>();
      e.table.page_token_counts = empty_table.as<uint16_t>();
      e.table.seq_page_indptr = empty_indptr.as<int32_t>();
      e.table.seq_page_ids = empty_table.as<int32_t>();
    }
    const size_t total = size_t(B) * C;
    auto q = DeviceBuffer::Create(total * kQHeads * kHeadDim * 4);
    auto out = DeviceBuffer::Create(total * kQHeads * kHeadDim * 4);
    auto lse = DeviceBuffer::Create(total * kQHeads * 4);
    std::vector<int32_t> q_indptr(B + 1);
    for (int b = 0; b <= B; ++b) q_indptr[b] = b * C;
    auto qi = DeviceBuffer::FromHost(q_indptr);
    if (!q.ok() || !out.ok() || !lse.ok() || !qi.ok()) return absl::InternalError("extend buffers");
    LaunchFillFloat(256, q->as<float>(), total * kQHeads * kHeadDim, 7);
    e.table.num_seqs = B;
    e.q_indptr = qi->as<int32_t>();
    e.max_new_tokens = C;
    e.q = q->as<float>();
    e.k_new = ksrc->as<uint16_t>();  // [B·C][8][128] bf16 rows (the shared source rows)
    e.v_new = vsrc->as<uint16_t>();
    e.rot_k = rot_k;
    e.out = out->as<float>();
    e.lse = lse->as<float>();
    auto plan = cuda::PlanExtend(shape, B, C);
    if (!plan.ok()) return plan.status();
    row.tensor_cores = plan->tensor_cores;
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(e.out, 0xff, total * kQHeads * kHeadDim * 4), "poison"));
    BENCH_RETURN_IF_ERROR(cuda::LaunchExtendAttention(*plan, e, nullptr));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "extend"));
    {  // every output written and finite (the GPU tests check the values)
      auto h = out->ToHost<float>();
      if (!h.ok()) return h.status();
      for (float v : *h) {
        if (!std::isfinite(v)) return absl::InternalError("extend bench: non-finite or unwritten output");
      }
    }
    auto us = TimeMedianUs([&] { return cuda::LaunchExtendAttention(*plan, e, nullptr); }, o.samples);
    if (!us.ok()) return us.status();
    row.us = *us;
    if (plan->tensor_cores && B == 1 && P == 32768) {
      for (int diag : {1, 2}) {
        auto d = TimeMedianUs([&] { return cuda::detail::LaunchExtendWgmma(e, C, nullptr, diag); }, o.samples);
        if (!d.ok()) return d.status();
        (diag == 1 ? row.diag_no_dequant_us : row.diag_no_copies_us) = *d;
      }
    }
    if (plan->tensor_cores && P == 0) {
      auto ref = out->ToHost<float>();  // the reported kernel's outputs, which 3 and 4 reproduce
      if (!ref.ok()) return ref.status();
      for (int diag : {3, 4, 5}) {
        auto d = TimeMedianUs([&] { return cuda::detail::LaunchExtendWgmma(e, C, nullptr, diag); }, o.samples);
        if (!d.ok()) return d.status();
        double* at[] = {&row.diag_dense_per_item_us, &row.diag_dense_persistent_us, &row.diag_dense_no_copies_us};
        *at[diag - 3] = *d;
        if (diag == 5) continue;
        auto h = out->ToHost<float>();
        if (!h.ok()) return h.status();
        double diff = 0;
        for (size_t i = 0; i < h->size(); ++i) diff = std::max(diff, double(std::fabs((*h)[i] - (*ref)[i])));
        // (printed, not fatal: the GPU tests check the reported kernel; a diagnostic's time
        // counts only with equal outputs)
        std::fprintf(stderr, "[bench] extend B=%d new=%d diag %d: max |out - reported kernel's| %.3g%s\n", B, C, diag, diff,
                     diff <= 1e-3 ? "" : " MISMATCH");
      }
    }
  }

  // Quantize-on-write: quant_tokens tokens of one layer, 8 KV heads, K and V.
  if (o.quantize) {
    const CodecProfile prof = BenchProfile(o.layers);
    const int T = o.quant_tokens, pages = (T + kPageTokens - 1) / kPageTokens;
    for (PageKind kind : {PageKind::kInt2, PageKind::kBf16}) {
      const PageGeometry g = GeometryFor(prof, kind);
      auto pool = DeviceBuffer::Create(size_t(pages) * g.page_bytes());
      if (!pool.ok()) return pool.status();
      std::vector<uint8_t*> ptrs(pages);
      for (int i = 0; i < pages; ++i) ptrs[i] = pool->as<uint8_t>() + size_t(i) * g.page_bytes();
      std::vector<uint8_t> kinds(pages, static_cast<uint8_t>(kind));
      std::vector<int32_t> dp(T), ds(T);
      for (int t = 0; t < T; ++t) {
        dp[t] = t / kPageTokens;
        ds[t] = t % kPageTokens;
      }
      auto d_ptrs = DeviceBuffer::FromHost(ptrs);
      auto d_kinds = DeviceBuffer::FromHost(kinds);
      auto d_dp = DeviceBuffer::FromHost(dp);
      auto d_ds = DeviceBuffer::FromHost(ds);
      if (!d_ptrs.ok() || !d_kinds.ok() || !d_dp.ok() || !d_ds.ok()) return absl::InternalError("upload");
      using LP = cuda::QuantizeWriteArgs::LoadPath;
      struct Variant {
        const char* name;
        bool rotate, clip, precise = true;
        RangeMode mode = RangeMode::kMinMax;
        LP load = LP::kAuto;
        // 0: `clips` as above, `range_mode`; 1: the engine's launch (a per-head mode table, clip
        // ratios 1.0 passed); 2: a per-head mode table, no clips; 3: the unbiased-fixed mode
        // table (promised min-max / fixed only), no clips.
        int tables = 0;
      };
      std::vector<Variant> variants;
      // The first row is the write a calibrated codec performs (`oscarkv calibrate` defaults:
      // K and V rotated -- V is not absorbed unless `calibrate absorb` ran --, no quantile clip
      // (`--clip none`), unbiased-fixed ranges with the candidate chosen per head (`--range
      // fixed`)), launched as the engine launches it (a per-head mode table it promises holds
      // only min-max / unbiased-fixed modes, no clip table): the streaming kernel. The JSON's
      // quant_bw_fraction is that row. Rows naming a load path force it; "unbiased v2" rows are
      // the previous default rule (8 candidates per group) on its kernels; "round-N kernel" rows
      // are those rounds' kernels as they were, side by side.
      const RangeMode kUb = RangeMode::kUnbiased, kMm = RangeMode::kMinMax, kFx = UnbiasedFixed(6);
      if (kind == PageKind::kInt2) {
        variants = {{"int2 default codec: rotate+unbiased-fixed per head (no clip)", true, false, true, kFx, LP::kAuto, 3},
                    {"int2 default codec, one mode for every head (fixed 6)", true, false, true, kFx},
                    {"int2 default codec, streaming kernel with 3 warpgroups (kStream3)", true, false, true, kFx, LP::kStream3, 3},
                    {"int2 default codec, wgmma 8-warp kernel (kWgmma8)", true, false, true, kFx, LP::kWgmma8, 3},
                    {"int2 default codec, R bf16 hi only (diagnostic)", true, false, false, kFx, LP::kStream, 3},
                    {"int2 default codec (run 2)", true, false, true, kFx, LP::kAuto, 3},
                    {"int2 unbiased v2 (previous default): rotate+unbiased (no clip)", true, false, true, kUb},
                    {"int2 unbiased v2, wgmma with the clip code (kWgmma8)", true, false, true, kUb, LP::kWgmma8},
                    {"int2 unbiased v2, mma.sync rotation (round 3)", true, false, true, kUb, LP::kPrefetchL1},
                    {"int2 unbiased v2, engine launch (mode table, clip ratios 1.0)", true, false, true, kUb, LP::kAuto, 1},
                    {"int2 unbiased v2, R fp16 only", true, false, false, kUb},
                    {"int2 prerotated+unbiased-fixed (flush / R_V absorbed)", false, false, true, kFx},
                    {"int2 prerotated+unbiased v2 (flush / R_V absorbed)", false, false, true, kUb},
                    {"int2 rotate+clip+unbiased v2 (OSCAR clips)", true, true, true, kUb},
                    {"int2 rotate+clip, min-max", true, true, true, kMm},
                    {"int2 rotate, min-max", true, false, true, kMm},
                    {"int2 rotate, min-max, streaming kernel with 3 warpgroups (kStream3)", true, false, true, kMm, LP::kStream3},
                    {"int2 rotate, min-max, mma.sync staged (kStaged)", true, false, true, kMm, LP::kStaged},
                    {"int2 rotate, min-max, wgmma (staged)", true, false, true, kMm, LP::kWgmma4},
                    {"int2 rotate, min-max, R bf16 hi only (diagnostic)", true, false, false, kMm, LP::kStream},
                    {"int2 rotate, min-max, round-1 kernel", true, false, true, kMm, LP::kRound1},
                    {"int2 prerotated, min-max", false, false, true, kMm},
                    {"int2 prerotated+clip, min-max", false, true, true, kMm},
                    {"int2 rotate+clip, range search", true, true, true, RangeMode::kSearch}};
      } else {
        // The engine writes its BF16 pages with its per-head range-mode table: the "engine launch"
        // rows (the streaming kernel with the default codec's table).
        variants = {{"bf16 rotate (sink/tail)", true, false},
                    {"bf16 rotate (sink/tail), streaming kernel with 3 warpgroups (kStream3)", true, false, true, kMm, LP::kStream3},
                    {"bf16 rotate (sink/tail), mma.sync staged (kStaged)", true, false, true, kMm, LP::kStaged},
                    {"bf16 rotate (sink/tail), round-1 kernel", true, false, true, kMm, LP::kRound1},
                    {"bf16 rotate (sink/tail), R fp16 only", true, false, false},
                    {"bf16 rotate, engine launch (default codec's mode table)", true, false, true, kFx, LP::kAuto, 3},
                    {"bf16 rotate, engine launch (unbiased v2 table, clip ratios 1.0)", true, false, true, kUb, LP::kAuto, 1}};
      }
      for (const Variant& v : variants) {
        if (!o.quant_rows.empty() &&
            std::none_of(o.quant_rows.begin(), o.quant_rows.end(),
                         [&](const std::string& s) { return std::string(v.name).find(s) != std::string::npos; })) {
          continue;
        }
        cuda::QuantizeWriteArgs q;
        q.num_layers = o.layers;
        q.num_kv_heads = kKvHeads;
        q.page_tokens = kPageTokens;
        q.k_src = ksrc->as<uint16_t>();
        q.v_src = vsrc->as<uint16_t>();
        q.src_token_stride = kKvHeads * kHeadDim;
        q.src_head_stride = kHeadDim;
        q.num_tokens = T;
        q.page_ptrs = d_ptrs->as<uint8_t*>();
        q.page_kinds = d_kinds->as<uint8_t>();
        q.dst_page = d_dp->as<int32_t>();
        q.dst_slot = d_ds->as<int32_t>();
        q.rot_fragments = v.rotate ? frags->get() : nullptr;
        q.clips = v.clip ? clips->as<float>() : v.tables == 1 ? noclips->as<float>() : nullptr;
        if (v.tables != 0) q.range_modes = (v.tables == 3 ? fixed_table : mode_table)->as<uint8_t>();
        q.range_modes_fixed_only = v.tables == 3;
        q.precise_rotation = v.precise;
        q.load_path = v.load;
        q.range_mode = v.mode;
        auto us = TimeMedianUs([&] { return cuda::LaunchQuantizeWrite(q, nullptr); }, o.samples);
        if (!us.ok()) return us.status();
        const double row_out = kind == PageKind::kInt2 ? 32 + 4 : 256;
        const double bytes = 2.0 * T * kKvHeads * (256 + row_out);
        r.quant.push_back({v.name, *us, bytes});
      }
    }
    // The write beside the attention and projections of the same prefill step.
    BENCH_RETURN_IF_ERROR(MeasurePrefillStep(o, ksrc->as<uint16_t>(), vsrc->as<uint16_t>(), rot_k, &r));
  }
  return r;
}

}  // namespace oscarkv::bench

