// Device helpers of the wgmma extend-attention kernels (extend_attention_wgmma.cu, and
// extend_dense_wgmma.cu for plain prefill): their CTA shape, the channel order of their fp16
// tiles, the wgmma forms they issue (f16 / bf16 operands, A from registers or shared memory),
// shared-memory descriptors of the value tiles, mbarrier / named-barrier / TMA wrappers, the work
// items and the query rotation's R_K operand (their common consumer code: extend_consumer.cuh).
// The K-major descriptor, the 128-byte swizzle and the fences are the quantize stream kernel's
// (quantize_stream_device.cuh). Internal to kernels/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "oscarkv/cuda/extend_attention.h"
#include "quantize_stream_device.cuh"

namespace oscarkv::cuda::detail {
namespace {

// CTA shape of both kernels: two producer and two consumer warpgroups; registers per thread
// after setmaxnreg (the producers give theirs to the consumers: the CTA's 65536 = 256 x 96 +
// 256 x 160); the fp16 / bf16 operand tiles (64 keys x 128 channels: two 64-channel halves of
// 8 KiB, K and V per ring stage) and a 128 x 128 fp16 rotation as a B operand.
constexpr int kXProducers = 256;
constexpr int kXThreads = kXProducers + 256;
constexpr int kXProducerRegs = 96, kXConsumerRegs = 160;
constexpr int kXTile = 16384;
constexpr int kXStage = 2 * kXTile;
constexpr int kXRot = 32768;

// Channel order of the tiles: position p = 16b + 2i + e of a row holds channel 16b + i + 8e.
// An INT2 code word (16 channels, 2 bits each) then yields the fp16 pair of positions 2i, 2i+1
// with one shift and one mask ((w >> 2i) & 0x00030003). Keys and the query use the same order
// (the score is a sum over channels); the value product's columns come out in it and are put
// back when the output is written.
__host__ __device__ constexpr int ExtendChannel(int p) { return (p & ~15) | ((p >> 1) & 7) | ((p & 1) << 3); }
__host__ __device__ constexpr int ExtendPosition(int c) { return (c & ~15) | ((c & 7) << 1) | ((c >> 3) & 1); }

// The 32 fp32 accumulators of one wgmma m64n64 per thread, in the instruction's order: s0 holds
// row gid, s1 row gid + 8 of the warp's 16 rows, s0[2j + e] column 8j + 2·tig + e.
#define OSCARKV_WG_ACC32(s0, s1) \
  "+f"(s0[0]), "+f"(s0[1]), "+f"(s1[0]), "+f"(s1[1]), \
  "+f"(s0[2]), "+f"(s0[3]), "+f"(s1[2]), "+f"(s1[3]), \
  "+f"(s0[4]), "+f"(s0[5]), "+f"(s1[4]), "+f"(s1[5]), \
  "+f"(s0[6]), "+f"(s0[7]), "+f"(s1[6]), "+f"(s1[7]), \
  "+f"(s0[8]), "+f"(s0[9]), "+f"(s1[8]), "+f"(s1[9]), \
  "+f"(s0[10]), "+f"(s0[11]), "+f"(s1[10]), "+f"(s1[11]), \
  "+f"(s0[12]), "+f"(s0[13]), "+f"(s1[12]), "+f"(s1[13]), \
  "+f"(s0[14]), "+f"(s0[15]), "+f"(s1[14]), "+f"(s1[15])

// The 16 A-fragment registers of the value product's four k-steps (a[4][4]), read by the
// tensor cores until the product completes.
#define OSCARKV_WG_A16(a) \
  "+r"(a[0][0]), "+r"(a[0][1]), "+r"(a[0][2]), "+r"(a[0][3]), \
  "+r"(a[1][0]), "+r"(a[1][1]), "+r"(a[1][2]), "+r"(a[1][3]), \
  "+r"(a[2][0]), "+r"(a[2][1]), "+r"(a[2][2]), "+r"(a[2][3]), \
  "+r"(a[3][0]), "+r"(a[3][1]), "+r"(a[3][2]), "+r"(a[3][3])

// s (+)= A(64 x 16, this warp's 16 rows as mma.sync-style fp16 A fragments) · B(16 x 64 at desc).
template <int kAccumulate>
__device__ __forceinline__ void WgmmaF16N64(float (&s0)[16], float (&s1)[16], const uint32_t (&a)[4], uint64_t desc) {
#if OSCARKV_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : OSCARKV_WG_ACC32(s0, s1)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(kAccumulate));
#endif
}
// s (+)= A(64 x 16 at desc_a, K-major) · B(16 x 64 at desc_b): both operands in shared memory,
// fp16 (or bf16 with kBf16).
template <int kAccumulate, bool kBf16 = false>
__device__ __forceinline__ void WgmmaF16N64SS(float (&s0)[16], float (&s1)[16], uint64_t desc_a, uint64_t desc_b) {
#if OSCARKV_HAVE_WGMMA
  if constexpr (kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : OSCARKV_WG_ACC32(s0, s1)
        : "l"(desc_a), "l"(desc_b), "n"(kAccumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : OSCARKV_WG_ACC32(s0, s1)
        : "l"(desc_a), "l"(desc_b), "n"(kAccumulate));
  }
#endif
}
// y (+)= A(64 x 16, registers) · B(16 x 128 at desc); kTransB: B stored N-major (value tiles);
// fp16 operands (or bf16 with kBf16).
template <int kAccumulate, int kTransB, bool kBf16 = false>
__device__ __forceinline__ void WgmmaF16N128R(float (&y0)[32], float (&y1)[32], const uint32_t (&a)[4], uint64_t desc) {
#if OSCARKV_HAVE_WGMMA
#define OSCARKV_WG_N128R(TYPE)                                                              \
  asm volatile(                                                                           \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                         \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                      \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "  \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "  \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, " \
      "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                      \
      : OSCARKV_WG_ACC(y0, y1)                                                            \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(kAccumulate), "n"(kTransB))
  if constexpr (kBf16) {
    OSCARKV_WG_N128R("bf16");
  } else {
    OSCARKV_WG_N128R("f16");
  }
#undef OSCARKV_WG_N128R
#endif
}
// Fences and waits naming the registers they order (no access to them moves across).
__device__ __forceinline__ void WgmmaFence32(float (&s0)[16], float (&s1)[16]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" : OSCARKV_WG_ACC32(s0, s1) : : "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommitWait32(float (&s0)[16], float (&s1)[16]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n"
               : OSCARKV_WG_ACC32(s0, s1) : : "memory");
#endif
}
// Waits until at most one wgmma group of this warpgroup is pending (the score product issued
// before the value product), naming the scores.
__device__ __forceinline__ void WgmmaWait1Scores(float (&s0)[16], float (&s1)[16]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" : OSCARKV_WG_ACC32(s0, s1) : : "memory");
#endif
}
// Waits for every wgmma group of this warpgroup, naming the value product's accumulators and its
// A fragments (the tensor cores read them until it completes: their registers stay reserved).
__device__ __forceinline__ void WgmmaWaitValues(float (&y0)[32], float (&y1)[32], uint32_t (&a)[4][4]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n"
               : OSCARKV_WG_ACC(y0, y1), OSCARKV_WG_A16(a)
               :
               : "memory");
#endif
}
__device__ __forceinline__ void WgmmaFence64(float (&y0)[32], float (&y1)[32], uint32_t (&a)[4][4]) {
#if OSCARKV_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n"
               : OSCARKV_WG_ACC(y0, y1), OSCARKV_WG_A16(a)
               :
               : "memory");
#endif
}

// Descriptor of an N-major (MN-major), 128-byte swizzled B tile of 64-column blocks: block m of
// 64 columns at +8192·m bytes (leading byte offset), 8-row (k) groups 1024 bytes apart (stride).
__device__ __forceinline__ uint64_t ValueTileDesc(uint32_t smem_addr) {
  return SwizzledDesc((smem_addr >> 4) | ((8192u >> 4) << 16));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` of the mbarrier has completed (acquire).
__device__ __forceinline__ void MbarWaitParity(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred P1;\n XWAIT:\n mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      " @!P1 bra XWAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Thread 0, before MbarInitFence: the full (the producers arrive) and empty (the consumers
// arrive) barriers of a ring of `stages` stages, 8 bytes apart.
__device__ __forceinline__ void XInitRing(uint32_t full_bar, uint32_t empty_bar, int stages) {
  for (int s = 0; s < stages; ++s) {
    MbarInit(full_bar + 8 * s, kXProducers);
    MbarInit(empty_bar + 8 * s, 256);
  }
}
__device__ __forceinline__ void MbarInitFence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// The dynamic shared memory's base rounded up to 1 KiB (the 128-byte swizzle's alignment).
__device__ __forceinline__ uint8_t* XAlignedSmem(uint8_t* raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// TMA (cp.async.bulk.tensor) loads of one box into shared memory, completing on an mbarrier
// whose transaction count the issuing thread raised by the box's bytes first.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

__device__ __forceinline__ uint32_t Half2Bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 BitsHalf2(uint32_t w) { return *reinterpret_cast<__half2*>(&w); }
// Two fp32 values as the packed operand pair of the kernel's element type (fp16, or bf16 in the
// dense kernel).
template <bool kBf16>
__device__ __forceinline__ uint32_t PackPair(float a, float b) {
  if constexpr (kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    return Half2Bits(__floats2half2_rn(a, b));
  }
}

// One work item: the CTA rows of token block `tok0` of sequence `seq`, KV head h.
struct XItem {
  int seq, h, q_begin, num_new, tok0, p0, p1;
};
// Loads work item i of a launch over items_x token blocks per (sequence, KV head) (i / items_x =
// sequence · H + head; block items_x - 1 - i % items_x, the longest rows first); false when the
// block is past the sequence's new tokens or the sequence is the other kernel's (dense: it has
// prefix pages). The scalars that steer the wgmma code are broadcast from lane 0: ptxas then
// knows them warp-uniform and does not serialize the wgmmas behind divergent branches (C7520).
__device__ __forceinline__ bool XLoadItem(const ExtendParams& p, int i, int items_x, int tpc, bool dense, XItem& it) {
  const int H = static_cast<int>(p.shape.num_kv_heads), y = i / items_x;
  it.seq = y / H;
  it.h = y % H;
  // (The four loads first, so that an item that is skipped waits for one round trip.)
  it.q_begin = __shfl_sync(0xffffffffu, p.q_indptr[it.seq], 0);
  it.num_new = __shfl_sync(0xffffffffu, p.q_indptr[it.seq + 1], 0) - it.q_begin;
  it.p0 = __shfl_sync(0xffffffffu, p.table.seq_page_indptr[it.seq], 0);
  it.p1 = __shfl_sync(0xffffffffu, p.table.seq_page_indptr[it.seq + 1], 0);
  it.tok0 = (items_x - 1 - i % items_x) * tpc;
  return it.tok0 < it.num_new && (it.p1 == it.p0) == dense;
}

// R_K of one KV head (128 x 128 fp32, [input channel][column]) as the query rotation's K-major
// fp16 B operand at dst: n-row = position n (R_K column channel_of(n)), k = input channel. Thread
// t of 256 converts input channels 8m..8m+7 (one 16-byte chunk of an operand row) of columns
// 4cq..4cq+3, for two m; the lanes of a warp cover 8 chunks of 4 rows (conflict-free 16-byte
// stores) and read 64 contiguous bytes of 8 rows per load. kBatches: the 16 loads in flight in
// one batch (consumers) or two (producers, at 96 registers).
template <bool kDense, int kBatches>
__device__ __forceinline__ void XStoreRotK(uint8_t* dst, const float* r, int t) {
  auto position_of = [](int c) { return kDense ? c : ExtendPosition(c); };
  const int lane = t & 31, cq = (lane >> 3) + 4 * (t >> 5);
  constexpr int kPer = 2 / kBatches;
#pragma unroll 1
  for (int bt = 0; bt < kBatches; ++bt) {
    float4 v[kPer][8];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        v[u][k] = *reinterpret_cast<const float4*>(r + (8 * ((lane & 7) + 8 * (u + kPer * bt)) + k) * 128 + 4 * cq);
      }
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int m = (lane & 7) + 8 * (u + kPer * bt);
#pragma unroll
      for (int cc = 0; cc < 4; ++cc) {
        auto at = [&](int k) { return cc == 0 ? v[u][k].x : cc == 1 ? v[u][k].y : cc == 2 ? v[u][k].z : v[u][k].w; };
        const uint4 w = make_uint4(Half2Bits(__floats2half2_rn(at(0), at(1))), Half2Bits(__floats2half2_rn(at(2), at(3))),
                                   Half2Bits(__floats2half2_rn(at(4), at(5))), Half2Bits(__floats2half2_rn(at(6), at(7))));
        *reinterpret_cast<uint4*>(dst + (m >> 3) * 16384 + Swizzle128(position_of(4 * cq + cc), m & 7)) = w;
      }
    }
  }
}

}  // namespace
}  // namespace oscarkv::cuda::detail
