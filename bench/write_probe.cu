// write_probe: what bounds the streaming quantize-on-write kernel on an sm_90a GPU, measured in
// three parts, all in one run (see --help):
//   pipes  issue rates of the instructions the quantization is made of (warp instructions per
//          cycle per SM, 16 warps, 8 independent chains each);
//   tile   the per-tile quantization code of quantize_stream_device.cuh (the kernel's own
//          functions) on register rows, cycles per warp-tile per scheduler, alone and beside the
//          rotation's wgmmas (R hi + lo, or hi only) in the same or in other warpgroups;
//   walk   the kernel's tile walk (rings, cp.async, shared-memory reads, code stores) with a
//          synthetic ALU load in place of the quantization, GB/s counted as `oscarkv bench
//          kernels` counts the write, against a copy kernel measured in the same run, and the
//          same walk without global loads (its instruction issue alone).
// The tile and walk parts give the cycle budget a write at a given fraction of copy leaves for
// the quantization, and what the default codec's code needs (bench/results/NOTES.md session 26).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "device_util.cuh"
#include "quantize_stream.h"
#include "quantize_stream_device.cuh"

namespace oscarkv::write_probe {
using namespace oscarkv::cuda::detail;

constexpr int kSms = 132;  // CTAs of the tile and walk parts (one per SM of an H200)

// The SM clock a kernel ran at: CTA 0's thread 0 stores (clock64, globaltimer ns) at its start
// (clk[0], clk[1]) and end (clk[2], clk[3]).
__device__ __forceinline__ void MarkClock(long long* clk, int at) {
  if (clk == nullptr || blockIdx.x != 0 || threadIdx.x != 0) return;
  long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  clk[at] = clock64();
  clk[at + 1] = ns;
}
double ClockMhz(const long long* clk_dev) {
  long long c[4] = {0, 0, 0, 0};
  cudaMemcpy(c, clk_dev, sizeof(c), cudaMemcpyDeviceToHost);
  return c[3] > c[1] ? static_cast<double>(c[2] - c[0]) / static_cast<double>(c[3] - c[1]) * 1e3 : 0.0;
}

// ---- pipes ----------------------------------------------------------------------------------
constexpr int kChains = 8, kUnroll = 16;
template <int OP>
__device__ __forceinline__ void PipeStep(float (&f)[kChains], uint32_t (&u)[kChains], unsigned long long (&w)[kChains],
                                         float a, float b, uint32_t ia) {
#pragma unroll
  for (int i = 0; i < kChains; ++i) {
    const bool odd = i & 1;
    if (OP == 0 || (OP >= 6 && OP <= 8 && !odd)) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(f[i]) : "f"(a), "f"(b));
    if (OP == 1 || (OP == 6 && odd)) asm volatile("fma.rm.f32 %0, %0, %1, %2;" : "+f"(f[i]) : "f"(a), "f"(b));
    if (OP == 2) asm volatile("fma.rn.sat.f32 %0, %0, %1, %2;" : "+f"(f[i]) : "f"(a), "f"(b));
    if (OP == 3) asm volatile("min.f32 %0, %0, %1;" : "+f"(f[i]) : "f"(a));
    if (OP == 4 || (OP == 7 && odd)) asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(u[i]) : "r"(ia), "r"(ia));
    if (OP == 5 || (OP == 8 && odd))
      asm volatile("{.reg .u32 lo;\n cvt.u32.u64 lo, %0;\n mad.wide.u32 %0, lo, %1, %0;}" : "+l"(w[i]) : "r"(ia));
  }
}
template <int OP>
__global__ void __launch_bounds__(512) PipeKernel(float* out, long long* cycles, float a, float b, uint32_t ia, int iters) {
  float f[kChains];
  uint32_t u[kChains];
  unsigned long long w[kChains];
  for (int i = 0; i < kChains; ++i) {
    f[i] = threadIdx.x * 1e-3f + i;
    u[i] = threadIdx.x + i;
    w[i] = u[i];
  }
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) PipeStep<OP>(f, u, w, a, b, ia);
  }
  __syncthreads();
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < kChains; ++i) s += f[i] + static_cast<float>(u[i]) + static_cast<float>(w[i]);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

// ---- tile -----------------------------------------------------------------------------------
// Rows per thread as in the kernel: y[r][j] = row (wrow + gid + 8r), channel 32·tig + j.
enum Work : int { kIdle = 0, kRanges = 1, kMinMax = 2, kFixed = 3 };
template <int kWork>
__device__ __forceinline__ uint32_t Quantize(const float (&y)[2][32], int ci, int tig) {
  uint32_t cw[2][2] = {{0u, 0u}, {0u, 0u}}, pw = 0u;
  int mine = 0;
  if constexpr (kWork == kFixed) {
    FixedCodes2<128>(y, ci, tig, cw, pw, mine);  // its ranges included, as in the kernel
  } else {
    float mn[2], mx[2];
    RowRanges<128>(y, mn, mx);
    if constexpr (kWork == kRanges) return __float_as_uint(mn[0]) ^ __float_as_uint(mx[0]) ^ __float_as_uint(mn[1]) ^ __float_as_uint(mx[1]);
    pw = PackParams(MinMaxCodes(y[0], mn[0], mx[0], cw[0])) ^ PackParams(MinMaxCodes(y[1], mn[1], mx[1], cw[1]));
  }
  return pw ^ static_cast<uint32_t>(mine) ^ cw[0][0] ^ cw[0][1] ^ cw[1][0] ^ cw[1][1];
}
// kParts wgmmas per k-step (2: R hi + lo as the product, 1: hi only), one tile's 8 k-steps.
template <int kParts>
__device__ __forceinline__ void Rotate(float (&y)[2][32], uint32_t alo, uint32_t rlo) {
  WgmmaFenceAcc(y[0], y[1]);
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const uint32_t koff = ((s >> 2) * kHalfTile + (s & 3) * 32) >> 4, roff = ((s >> 2) * 16384 + (s & 3) * 32) >> 4;
    if (s == 0) {
      WgmmaBf16<0>(y[0], y[1], SwizzledDesc(alo + koff), SwizzledDesc(rlo + roff));
    } else {
      WgmmaBf16<1>(y[0], y[1], SwizzledDesc(alo + koff), SwizzledDesc(rlo + roff));
    }
    if (kParts == 2) WgmmaBf16<1>(y[0], y[1], SwizzledDesc(alo + koff), SwizzledDesc(rlo + 2048 + roff));
  }
  WgmmaCommit();
  WgmmaWait(y[0], y[1]);
}
// Four warpgroups; warpgroup w's role is nibble w of `roles`: 0 idle, 1 quantize register rows,
// 2 rotate (hi + lo), 3 rotate (hi + lo) then quantize the result (the kernel's order),
// 4 rotate (hi only), 5 rotate (hi only) then quantize. Cycles per iteration per warpgroup.
template <int kWork>
__global__ void __launch_bounds__(512, 1) TileKernel(uint32_t* out, long long* cycles, int iters, int roles, int ci,
                                                     long long* clk) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), tig = tid & 3;
  const int role = (roles >> (4 * wg)) & 15;
  // R image (64 KiB) then one 16 KiB row tile per warpgroup: finite bf16 values.
  for (int i = tid; i < (65536 + 4 * 16384) / 4; i += 512) {
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ ((i * 2654435761u) & 0x007f007fu);
  }
  __syncthreads();
  float base[16];
  for (int j = 0; j < 16; ++j) base[j] = (j - 8) * 0.1f + tid * 1e-4f;
  const uint32_t rlo = SwizzledDescLo(SmemAddr(smem)), alo = SwizzledDescLo(SmemAddr(smem + 65536 + wg * 16384));
  uint32_t sink = 0u;
  MarkClock(clk, 0);
  const long long t0 = clock64();
  for (int it = 0; it < iters && role != 0; ++it) {
    float y[2][32];
    if (role == 1) {  // fresh rows each iteration (64 FFMAs, the "rows only" row's cost)
      const float f = 1.0f + it * 1e-6f;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int j = 0; j < 32; ++j) y[r][j] = __fmaf_rn(base[(3 * j + 5 * r) & 15], f, (j - 16) * 0.01f);
      }
    } else if (role >= 4) {
      Rotate<1>(y, alo, rlo);
    } else {
      Rotate<2>(y, alo, rlo);
    }
    if (role == 1 || role == 3 || role == 5) {
      sink ^= kWork == kIdle ? __float_as_uint(y[0][3]) ^ __float_as_uint(y[1][17]) : Quantize<kWork>(y, ci, tig);
    } else {
      sink ^= __float_as_uint(y[0][3]) ^ __float_as_uint(y[1][17]);
    }
  }
  const long long t1 = clock64();
  MarkClock(clk, 2);
  out[blockIdx.x * 512 + tid] = sink;
  if ((tid & 127) == 0) cycles[blockIdx.x * 4 + wg] = t1 - t0;
}

// ---- walk -----------------------------------------------------------------------------------
constexpr int kHeads = 8, kStages = 3, kWgs = 4;
// The streaming kernel's walk for rows already rotated (4 warpgroups, 3-stage rings): each CTA
// takes a contiguous range of the (K|V, head) matrices' 64-row tiles, warpgroup w tiles w, w + 4,
// ...; a thread reads its two rows from the swizzled ring, runs `load` x 64 FFMAs on them and
// stores 8 bytes of codes per row (and a 4-byte parameter word per row from one lane of four).
// Without kLoad it issues no global loads (and reads whatever the rings hold): the walk's issue
// time alone.
template <bool kLoad>
__global__ void __launch_bounds__(512, 1) WalkKernel(const uint16_t* k, const uint16_t* v, uint8_t* dst, int T, int load,
                                                     int total_tiles, long long* clk) {
  MarkClock(clk, 0);
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), tw = tid & 127, lane = tid & 31;
  const int gid = lane >> 2, tig = lane & 3, wrow = 16 * ((tid >> 5) & 3);
  uint8_t* ring = smem + wg * kStages * kTileBytes;
  const int tiles_per_mat = T / kTileRows;
  const TileSpan span = CtaTileSpan(total_tiles);
  for (long long g = span.begin; g < span.end;) {
    const MatrixRun run = NextMatrixRun(g, span.end, tiles_per_mat);
    const int mat = run.mat, t_first = run.t_first, t_end = run.t_end;
    const uint16_t* src = (mat / kHeads ? v : k) + (mat % kHeads) * 128;
    uint8_t* out = dst + static_cast<size_t>(mat) * T * 36;
    __syncthreads();
    const int n = t_first + wg < t_end ? (t_end - t_first - wg + kWgs - 1) / kWgs : 0;
    auto tile_of = [&](int i) { return t_first + wg + kWgs * i; };
    const int cchunk = tw & 15, crow = tw >> 4;
    const int cdst = (cchunk >> 3) * kHalfTile + Swizzle128(crow, cchunk & 7);
    auto issue = [&](int i, int stage) {
      if (kLoad && i < n) {
        const uint16_t* gsrc = src + int64_t(tile_of(i) * kTileRows + crow) * kHeads * 128 + 8 * cchunk;
        uint8_t* st = ring + stage * kTileBytes + cdst;
#pragma unroll
        for (int q = 0; q < 8; ++q) CpAsync16(st + q * 1024, gsrc + q * 8 * kHeads * 128);
      }
      CpAsyncCommit();
    };
    for (int s = 0; s < kStages - 1; ++s) issue(s, s);
    for (int i = 0; i < n; ++i) {
      CpAsyncWait<kStages - 2>();
      asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
      float y[2][32];
      LoadTileRows(ring + (i % kStages) * kTileBytes, wrow + gid, tig, y);
      issue(i + kStages - 1, (i + kStages - 1) % kStages);
      for (int l = 0; l < load; ++l) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
          for (int j = 0; j < 32; ++j) y[r][j] = __fmaf_rn(y[r][j], 0.999f, 1e-3f);
        }
      }
      uint32_t c[2][2] = {{0u, 0u}, {0u, 0u}};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int j = 0; j < 32; ++j) c[r][j / 16] += (__float_as_uint(y[r][j]) >> 30) << (2 * (j % 16));
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = tile_of(i) * kTileRows + wrow + gid + 8 * r;
        *reinterpret_cast<uint2*>(out + size_t(tok) * 32 + 8 * tig) = make_uint2(c[r][0], c[r][1]);
        if (tig == 0) *reinterpret_cast<uint32_t*>(out + size_t(T) * 32 + size_t(tok) * 4) = c[r][0] ^ c[r][1];
      }
    }
    CpAsyncWait<0>();
  }
  MarkClock(clk, 2);
}
// The copy kernel of `oscarkv bench kernels` (kernel_bench.cu), on the same 2 GiB each way.
__global__ void CopyKernel(const uint4* __restrict__ a, uint4* __restrict__ b, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) b[i] = a[i];
}

// ---- host -----------------------------------------------------------------------------------
bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "write_probe: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}
template <class F>
float MedianUs(F launch, int samples) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < samples; ++i) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1000.f);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <int OP>
bool Pipe(const char* name, float* out, long long* cyc) {
  const int iters = 200;
  PipeKernel<OP><<<kSms, 512>>>(out, cyc, 1.0000001f, 1e-7f, 3u, 4);
  PipeKernel<OP><<<kSms, 512>>>(out, cyc, 1.0000001f, 1e-7f, 3u, iters);
  if (!Check(cudaDeviceSynchronize(), name)) return false;
  std::vector<long long> c(kSms);
  cudaMemcpy(c.data(), cyc, kSms * sizeof(long long), cudaMemcpyDeviceToHost);
  const double instr = 16.0 * iters * kUnroll * kChains, rate = instr / *std::max_element(c.begin(), c.end());
  std::printf("  %-34s %5.2f  %5.2f\n", name, rate, rate / 4);
  return true;
}

// Cycles per iteration of each warpgroup (the slowest CTA's), roles as TileKernel reads them.
template <int kWork>
bool Tile(const char* name, int roles, int ci, uint32_t* out, long long* cyc, long long* clk, double* per_wg = nullptr) {
  const int iters = 200, smem = 65536 + 4 * 16384;
  cudaFuncSetAttribute(TileKernel<kWork>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  TileKernel<kWork><<<kSms, 512, smem>>>(out, cyc, 4, roles, ci, nullptr);
  TileKernel<kWork><<<kSms, 512, smem>>>(out, cyc, iters, roles, ci, clk);
  if (!Check(cudaDeviceSynchronize(), name)) return false;
  std::vector<long long> c(kSms * 4);
  cudaMemcpy(c.data(), cyc, c.size() * sizeof(long long), cudaMemcpyDeviceToHost);
  std::printf("  %-52s", name);
  for (int w = 0; w < 4; ++w) {
    long long mx = 0;
    for (int i = 0; i < kSms; ++i) mx = std::max(mx, c[4 * i + w]);
    const double per = static_cast<double>(mx) / iters;
    if (per_wg != nullptr) per_wg[w] = per;
    if (((roles >> (4 * w)) & 15) == 0) {
      std::printf("       -");
    } else {
      std::printf(" %7.0f", per);
    }
  }
  std::printf("  %5.0f MHz\n", ClockMhz(clk));
  return true;
}

int Usage(const char* argv0, int rc) {
  std::printf(
      "usage: %s [--part pipes|tile|walk|all] [--candidate I]\n\n"
      "Measures, on an sm_90a GPU (H100/H200), what bounds the streaming quantize-on-write kernel\n"
      "(kernels/cuda/src/quantize_stream.cu), each part printing a table:\n"
      "  pipes  warp instructions per cycle per SM (and per scheduler) of FFMA with each rounding,\n"
      "         FMNMX, IMAD, IMAD.WIDE and mixes, 16 warps per SM, 8 independent chains each.\n"
      "  tile   the kernel's own quantization code (quantize_stream_device.cuh) on register rows,\n"
      "         and the rotation's wgmmas (16 per 64-row tile: R hi + lo; 8: hi only), per warpgroup,\n"
      "         four warpgroups per SM: cycles per iteration (one 64-row tile per warpgroup); divide by\n"
      "         4 for cycles per warp-tile per scheduler when all four warpgroups work.\n"
      "  walk   the kernel's tile walk over 32768 tokens x 8 heads x K|V (rings, cp.async, shared\n"
      "         reads, code stores) with N x 64 FFMAs per thread per tile instead of the quantization:\n"
      "         GB/s as `oscarkv bench kernels` counts the write (bf16 rows in, 36 bytes per row out)\n"
      "         and the fraction of a copy kernel's bandwidth measured in the same run; then the same\n"
      "         walk without global loads (its instruction issue alone).\n"
      "--candidate I: the unbiased-fixed candidate of the tile part (0..7, default 6).\n"
      "Needs a GPU of compute capability 9.0; built only where nvcc targets sm_90.\n",
      argv0);
  return rc;
}

}  // namespace oscarkv::write_probe

int main(int argc, char** argv) {
  using namespace oscarkv::write_probe;
  std::string part = "all";
  int ci = 6;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return Usage(argv[0], 0);
    if (a == "--part" && i + 1 < argc) {
      part = argv[++i];
    } else if (a == "--candidate" && i + 1 < argc) {
      ci = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "write_probe: unknown argument '%s'\n", a.c_str());
      return Usage(argv[0], 2);
    }
  }
  if (part != "all" && part != "pipes" && part != "tile" && part != "walk") {
    std::fprintf(stderr, "write_probe: --part must be pipes, tile, walk or all\n");
    return 2;
  }
  if (ci < 0 || ci > 7) {
    std::fprintf(stderr, "write_probe: --candidate must be 0..7\n");
    return 2;
  }
  cudaDeviceProp prop{};
  if (!Check(cudaGetDeviceProperties(&prop, 0), "device")) return 1;
  if (prop.major != 9) {
    std::fprintf(stderr, "write_probe: needs compute capability 9.x (found %d.%d)\n", prop.major, prop.minor);
    return 1;
  }
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  std::printf("device: %s, %d SMs, SM clock up to %d MHz\n", prop.name, prop.multiProcessorCount, clock_khz / 1000);
  float* fout = nullptr;
  uint32_t* uout = nullptr;
  long long *cyc = nullptr, *clk = nullptr;
  if (!Check(cudaMalloc(&fout, kSms * 512 * 4), "alloc") || !Check(cudaMalloc(&uout, kSms * 512 * 4), "alloc") ||
      !Check(cudaMalloc(&cyc, kSms * 4 * sizeof(long long)), "alloc") || !Check(cudaMalloc(&clk, 4 * sizeof(long long)), "alloc")) {
    return 1;
  }
  bool ok = true;
  if (part == "all" || part == "pipes") {
    std::printf("\npipes: warp instructions per cycle, per SM and per scheduler (16 warps per SM)\n");
    ok = ok && Pipe<0>("FFMA (rn)", fout, cyc) && Pipe<1>("FFMA.RM", fout, cyc) && Pipe<2>("FFMA.SAT", fout, cyc) &&
         Pipe<3>("FMNMX", fout, cyc) && Pipe<4>("IMAD", fout, cyc) && Pipe<5>("IMAD.WIDE.U32 (64-bit accumulate)", fout, cyc) &&
         Pipe<6>("FFMA | FFMA.RM", fout, cyc) && Pipe<7>("FFMA | IMAD", fout, cyc) && Pipe<8>("FFMA | IMAD.WIDE.U32", fout, cyc);
  }
  double alu = 0, mma = 0, both = 0, mma1 = 0, both1 = 0, w[4];
  if (ok && (part == "all" || part == "tile")) {
    std::printf("\ntile: cycles per iteration of each warpgroup (one 64-row tile each), unbiased-fixed candidate %d\n", ci);
    std::printf("  %-52s %7s %7s %7s %7s  %9s\n", "warpgroups' work", "wg0", "wg1", "wg2", "wg3", "SM clock");
    ok = ok && Tile<kIdle>("rows only (the rows' 64 FFMAs)", 0x1111, ci, uout, cyc, clk) &&
         Tile<kRanges>("group ranges", 0x1111, ci, uout, cyc, clk) && Tile<kMinMax>("ranges + min-max codes", 0x1111, ci, uout, cyc, clk) &&
         Tile<kFixed>("ranges + unbiased-fixed (default codec's rule)", 0x1111, ci, uout, cyc, clk, w);
    alu = w[0];
    ok = ok && Tile<kIdle>("rotation R hi + lo (16 wgmma)", 0x2222, ci, uout, cyc, clk, w);
    mma = w[0];
    ok = ok && Tile<kIdle>("rotation R hi only (8 wgmma)", 0x4444, ci, uout, cyc, clk, w);
    mma1 = w[0];
    ok = ok && Tile<kFixed>("2 wg unbiased-fixed alone", 0x0011, ci, uout, cyc, clk) &&
         Tile<kFixed>("2 wg unbiased-fixed beside 2 wg rotating (hi + lo)", 0x2211, ci, uout, cyc, clk) &&
         Tile<kFixed>("rotate hi + lo, then unbiased-fixed (the kernel)", 0x3333, ci, uout, cyc, clk, w);
    both = w[0];
    ok = ok && Tile<kFixed>("rotate hi only, then unbiased-fixed", 0x5555, ci, uout, cyc, clk, w);
    both1 = w[0];
    if (ok) {
      std::printf("  per warp-tile per scheduler: rule %.0f, rotation %.0f (hi only %.0f); together %.0f (hi only %.0f),\n"
                  "  %.0f%% (%.0f%%) of the sum: the wgmmas slow the schedulers' other issue\n",
                  alu / 4, mma / 4, mma1 / 4, both / 4, both1 / 4, 100 * both / (alu + mma), 100 * both1 / (alu + mma1));
    }
  }
  if (ok && (part == "all" || part == "walk")) {
    const int T = 32768, total = 2 * kHeads * (T / kTileRows);
    uint16_t *k = nullptr, *v = nullptr;
    uint8_t* dst = nullptr;
    uint4 *ca = nullptr, *cb = nullptr;
    const size_t copy_bytes = size_t{2} << 30;
    ok = Check(cudaMalloc(&k, size_t(T) * kHeads * 256), "alloc") && Check(cudaMalloc(&v, size_t(T) * kHeads * 256), "alloc") &&
         Check(cudaMalloc(&dst, size_t(2 * kHeads) * T * 36), "alloc") && Check(cudaMalloc(&ca, copy_bytes), "alloc") &&
         Check(cudaMalloc(&cb, copy_bytes), "alloc");
    if (ok) {
      cudaMemset(ca, 1, copy_bytes);
      cudaMemset(k, 0x3c, size_t(T) * kHeads * 256);
      cudaMemset(v, 0x3c, size_t(T) * kHeads * 256);
      const float cus = MedianUs([&] { CopyKernel<<<kSms * 8, 512>>>(ca, cb, copy_bytes / 16); }, 30);
      const double copy = 2.0 * copy_bytes / cus / 1e3;
      std::printf("\nwalk: 32768 tokens x 8 heads x K|V, copy kernel %.0f GB/s (read + write) in this run\n", copy);
      std::printf("  %-26s %8s %8s %9s %10s %16s\n", "FFMAs per thread per tile", "us", "GB/s", "of copy", "SM clock",
                  "us without loads");
      const int smem = 1024 + kWgs * kStages * kTileBytes;
      cudaFuncSetAttribute(WalkKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      cudaFuncSetAttribute(WalkKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      const double bytes = 2.0 * T * kHeads * (256 + 36);
      for (int load : {0, 4, 8, 10, 12, 14, 16, 20}) {
        const float us = MedianUs([&] { WalkKernel<true><<<kSms, 512, smem>>>(k, v, dst, T, load, total, clk); }, 30);
        const double mhz = ClockMhz(clk);
        const float bare = MedianUs([&] { WalkKernel<false><<<kSms, 512, smem>>>(k, v, dst, T, load, total, nullptr); }, 30);
        if (!Check(cudaGetLastError(), "walk")) {
          ok = false;
          break;
        }
        std::printf("  %-26d %8.1f %8.0f %8.0f%% %6.0f MHz %16.1f\n", load * 64, us, bytes / us / 1e3, 100 * bytes / us / 1e3 / copy,
                    mhz, bare);
      }
    }
    cudaFree(k);
    cudaFree(v);
    cudaFree(dst);
    cudaFree(ca);
    cudaFree(cb);
  }
  cudaFree(fout);
  cudaFree(uout);
  cudaFree(cyc);
  cudaFree(clk);
  return ok ? 0 : 1;
}
