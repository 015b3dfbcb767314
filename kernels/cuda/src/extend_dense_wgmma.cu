// Plain prefill (the sequences of an extend launch without prefix pages) on Hopper tensor cores
// (wgmma, sm_90a): the second launch of LaunchExtendWgmma (extend_attention_wgmma.cu, whose
// paged kernel skips these sequences; see extend_attention.h for the function).
//
// Work items as the paged kernel's CTAs: 128 query rows (the KV head's GQA group of query heads
// for 128 / gqa consecutive new tokens), sequence, KV head. Persistent CTAs, one per SM, four
// warpgroups:
//   * warpgroups 0 and 1 (producers, 96 registers per thread after setmaxnreg) convert each
//     item's R_K into one of two rotation buffers and load its key tiles of 64 new tokens --
//     bf16 rows by TMA (four boxes, one thread; 16-byte cp.async by all producers for a
//     sequence's partial last tile, which a box would overrun) -- straight into a 5-stage ring of
//     wgmma operand tiles (natural channel order, 128-byte swizzle), handed over with mbarriers.
//   * warpgroups 2 and 3 (consumers, 160 registers) as in the paged kernel, with bf16 query,
//     keys, values and probabilities (no conversion pass).

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "device_util.cuh"
#include "extend_internal.h"
#include "extend_consumer.cuh"
#include "extend_wgmma.cuh"

namespace oscarkv::cuda::detail {
namespace {

// (CTA shape, registers, tile and rotation sizes: extend_wgmma.cuh.) Shared memory: the stages, two rotation / query buffers (the producers convert the next work
// item's R_K into one while the consumers run the current item out of the other), the tiles'
// (valid, first token), barriers: full and empty per stage, then full and empty per buffer.
constexpr int kXDenseStages = 5;
constexpr int kXDenseRotOff = kXDenseStages * kXStage;
constexpr int kXDenseInfoOff = kXDenseRotOff + 2 * kXRot;
constexpr int kXDenseBarOff = kXDenseInfoOff + 8 * kXDenseStages;
constexpr int kXDenseSmemBytes = kXDenseBarOff + 8 * (2 * kXDenseStages + 4) + 1024;
static_assert(kXDenseRotOff % 1024 == 0 && kXDenseSmemBytes <= 232448, "dense shared memory layout");

// Tensor maps of the new tokens' K and V rows ([rows][num_kv_heads][128] bf16) for the dense
// kernel's TMA tile loads: boxes of 64 channels x 1 head x 64 rows, 128-byte swizzle.
struct XMaps {
  CUtensorMap k, v;
};

// kDiag 5 (bench diagnostic, outputs wrong): the producers hand over tiles without loading them.
// CTA c of G runs work items c, 2G - 1 - c, 2G + c, ... (each round in the other direction, the
// items of a round of similar weight) with one ring over all of them, so that the producers load
// the next item's first tiles and convert its R_K while the consumers finish the current one.
template <int kDiag = 0>
__global__ void __launch_bounds__(kXThreads, 1) ExtendDenseKernel(const ExtendParams p, const int items_x,
                                                                   const __grid_constant__ XMaps maps) {
  constexpr int kSt = kXDenseStages;
  constexpr bool kTma = kDiag != 5;
#if OSCARKV_HAVE_WGMMA
  extern __shared__ uint8_t smem_raw_base[];
  uint8_t* smem = XAlignedSmem(smem_raw_base);
  const DecodeShape& sh = p.shape;
  const int H = static_cast<int>(sh.num_kv_heads), Hq = static_cast<int>(sh.num_q_heads);
  const int gqa = static_cast<int>(sh.gqa());
  const int tpc = kExtendWgmmaRows / gqa;  // tokens per item
  const int total_items = static_cast<int>(p.table.num_seqs) * H * items_x;
  // The items of this CTA in order: calls f(item) for each that this kernel runs.
  auto for_items = [&](auto&& f) {
    const int c = blockIdx.x, g = gridDim.x;
    for (int k = 0; k * g < total_items; ++k) {
      const int i = k * g + ((k & 1) ? g - 1 - c : c);
      XItem it;
      if (i < total_items && XLoadItem(p, i, items_x, tpc, true, it)) f(it);
    }
  };
  const int role = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);  // warpgroup
  const uint32_t sbase = SmemAddr(smem);
  const uint32_t full_bar = sbase + kXDenseBarOff, empty_bar = full_bar + 8 * kSt;
  // R_K of a buffer written (by the producers), the buffer released (by the consumers).
  const uint32_t rfull_bar = empty_bar + 8 * kSt, rempty_bar = rfull_bar + 16;
  int2* info = reinterpret_cast<int2*>(smem + kXDenseInfoOff);
  if (threadIdx.x == 0) {
    XInitRing(full_bar, empty_bar, kSt);
    XInitRing(rfull_bar, rempty_bar, 2);
    MbarInitFence();
  }
  __syncthreads();

  if (role < 2) {
    // ---------------- producers ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kXProducerRegs));
    const int tid = threadIdx.x;
    {
      // Per item n of the CTA: R_K of its KV head into rotation buffer n % 2 (once the
      // consumers released the buffer's previous item), an L2 prefetch of its query rows, then
      // its tiles: tile x = new tokens [64x, 64x + 64), bf16 rows loaded into the ring's next
      // stage once the consumers released the stage's previous tile. A TMA tile completes its
      // full barrier by itself (transaction bytes); a cp.async tile is handed over once its
      // copies have landed -- at once when TMA loads the others (diag 5: kSt - 2 tiles later) --
      // and every pending tile before an item's R_K wait, which may block on the consumers
      // finishing the item before.
      int issued = 0, arrived = 0, n = 0;
      auto hand_over = [&]() {
        FenceProxyAsync();
        MbarArrive(full_bar + 8 * (arrived % kSt));
        ++arrived;
      };
      for_items([&](const XItem& it) {
        CpAsyncWait<0>();
        while (arrived < issued) hand_over();
        const int b = n & 1;
        MbarWaitParity(rempty_bar + 8 * b, ((n >> 1) & 1) ^ 1);
        if (p.rot_k != nullptr) XStoreRotK<true, 2>(smem + kXDenseRotOff + b * kXRot, p.rot_k + size_t(it.h) * 128 * 128, tid);
        FenceProxyAsync();
        MbarArrive(rfull_bar + 8 * b);
        const int last_tok = min(it.num_new, it.tok0 + tpc) - 1;
        const int num_tiles = (last_tok + 64) / 64;
        {  // the query rows: (last_tok - tok0 + 1) tokens of gqa heads, 512 bytes per head
          const float* q = p.q + (size_t(it.q_begin + it.tok0) * Hq + size_t(it.h) * gqa) * 128;
          const int lines = (last_tok - it.tok0 + 1) * gqa * 4;
          for (int l = tid; l < lines; l += kXProducers) {
            const int per_tok = gqa * 4;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(q + size_t(l / per_tok) * Hq * 128 + (l % per_tok) * 32));
          }
        }
        for (int x = 0; x < num_tiles; ++x) {
          const int stage = issued % kSt;
          MbarWaitParity(empty_bar + 8 * stage, ((issued / kSt) & 1) ^ 1);
          const int n0 = 64 * x, valid = min(64, it.num_new - n0);
          if (kTma && valid == 64) {  // one box per 64-channel half of K and V, on the full barrier
            if (tid == 0) {
              info[stage] = make_int2(valid, n0);
              const uint32_t st = sbase + stage * kXStage, bar = full_bar + 8 * stage;
              MbarArriveExpectTx(bar, kXStage);
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                TmaLoad3d(st + (u >> 1) * kXTile + (u & 1) * 8192, (u >> 1) ? &maps.v : &maps.k, 64 * (u & 1), it.h,
                          it.q_begin + n0, bar);
              }
            } else {
              MbarArrive(full_bar + 8 * stage);
            }
            ++issued;
            ++arrived;
            continue;
          }
          uint8_t* st = smem + stage * kXStage;
          for (int c = tid; c < (kDiag == 5 ? 0 : 2048); c += kXProducers) {
            const int kv = c >> 10, row = (c >> 4) & 63, ch = c & 15;
            const bool ok = row < valid;
            const uint16_t* base = kv ? p.v_new : p.k_new;
            const uint16_t* src = ok ? base + (size_t(it.q_begin + n0 + row) * H + it.h) * 128 + ch * 8 : base;
            CpAsync16(st + kv * kXTile + (ch >> 3) * 8192 + Swizzle128(row, ch & 7), src, ok);
          }
          if (tid == 0) info[stage] = make_int2(valid, n0);
          CpAsyncCommit();
          ++issued;
          if (kTma) {  // (the TMA tiles count on no pending copies)
            CpAsyncWait<0>();
            while (arrived < issued) hand_over();
          } else if (issued - arrived > kSt - 2) {
            CpAsyncWait<kSt - 2>();
            hand_over();
          }
        }
        ++n;
      });
      CpAsyncWait<0>();
      while (arrived < issued) hand_over();
      return;
    }
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kXConsumerRegs));
  const int ctid = threadIdx.x - kXProducers, wg = role - 2;
  // One item: its query rotated by the R_K at rot_off (written by the producers), then written
  // over it as the score product's A operand; its tiles are the ring's gbase, gbase + 1, ...;
  // returns how many.
  auto run_item = [&](const XItem& it, const int rot_off, const int gbase) -> int {
    const int num_tiles = (min(it.num_new, it.tok0 + tpc) - 1 + 64) / 64;
    const XRows w = XRowsOf(ctid, wg, gqa, Hq, tpc, it.tok0, it.num_new);
    uint8_t* q_tile = smem + rot_off + wg * kXTile;
    XStageQuery<true>(p, it, w, q_tile, sbase + rot_off, [] {});  // (R_K: the producers')
    XAcc acc;
    XAttendTiles<true, kSt>(acc, w, sbase, SmemAddr(q_tile), info, full_bar, empty_bar, gbase, num_tiles);
    XEpilogue<true>(p, acc, it, w, smem + rot_off, sbase + rot_off);
    return num_tiles;
  };
  int n = 0, g = 0;
  for_items([&](const XItem& it) {
    const int b = n & 1;
    MbarWaitParity(rfull_bar + 8 * b, (n >> 1) & 1);  // the producers wrote its R_K
    g += run_item(it, kXDenseRotOff + b * kXRot, g);
    MbarArrive(rempty_bar + 8 * b);  // done with the buffer (query, R_V)
    ++n;
  });
#else
  __trap();
#endif
}

// The tensor map of rows [rows][heads][128] bf16 at base (TMA boxes of 64 channels x 1 head x 64
// rows, 128-byte swizzle). The kernel reads only full tiles through it (rows of the sequence).
absl::Status EncodeRowMap(CUtensorMap* map, const uint16_t* base, uint32_t heads, uint64_t rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return absl::InternalError("extend attention: cuTensorMapEncodeTiled unavailable");
  const cuuint64_t dims[3] = {128, heads, rows};
  const cuuint64_t strides[2] = {256, cuuint64_t(heads) * 256};  // bytes, of dims 1 and 2
  const cuuint32_t box[3] = {64, 1, 64}, elem[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(base), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return absl::InternalError(absl::StrCat("extend attention: tensor map encode error ", static_cast<int>(r)));
  return absl::OkStatus();
}
}  // namespace

absl::Status PrepareExtendDense() {
  for (auto* k : {ExtendDenseKernel<0>, ExtendDenseKernel<5>}) {
    if (absl::Status s = CudaStatus(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kXDenseSmemBytes),
                                    "extend attention (plain prefill) shared memory");
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status LaunchExtendDense(const ExtendParams& p, int max_new_tokens, int items_x, cudaStream_t stream, int diag) {
  int dev = 0, sms = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return CudaStatus(e, "extend attention (plain prefill) device");
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) {
    return CudaStatus(e, "extend attention (plain prefill) SM count");
  }
  const int items = items_x * p.table.num_seqs * static_cast<int>(p.shape.num_kv_heads);
  const int ctas = diag == 3 ? items : std::max(1, std::min(items, sms));
  if (diag == 5) {
    ExtendDenseKernel<5><<<ctas, kXThreads, kXDenseSmemBytes, stream>>>(p, items_x, XMaps{});
  } else {
    // The tensor maps span num_seqs · max_new_tokens rows (>= the rows of the launch).
    XMaps maps;
    const uint64_t rows = uint64_t(p.table.num_seqs) * uint64_t(max_new_tokens);
    if (absl::Status s = EncodeRowMap(&maps.k, p.k_new, p.shape.num_kv_heads, rows); !s.ok()) return s;
    if (absl::Status s = EncodeRowMap(&maps.v, p.v_new, p.shape.num_kv_heads, rows); !s.ok()) return s;
    ExtendDenseKernel<0><<<ctas, kXThreads, kXDenseSmemBytes, stream>>>(p, items_x, maps);
  }
  return CudaStatus(cudaGetLastError(), "extend attention (plain prefill) launch");
}

}  // namespace oscarkv::cuda::detail
