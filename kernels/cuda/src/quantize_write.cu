// Quantize-on-write kernel: rotate (tensor cores), clip, INT2-quantize or bf16-round, and store
// rows into their page slots.
//
// A CTA owns one (layer, K|V, KV head) and loops over tiles of 16 tokens per warp. Lane
// (gid, tig) ends up holding channels [32·tig, 32·tig+32) of tokens gid and gid+8 of its warp's
// tile: the mma k order (input channels) and n order (output channels) are permuted in the
// prepared fragments so that both the loads and the packed code stores are contiguous. The
// rotating selecting kernels (the default codec write) rotate on wgmma where this file is built
// for sm_90a (8-warp CTAs, see WgmmaF16N128), on mma.sync otherwise.
//
// Files: quantize_write_rotation.cuh (CTA sizes, fragments, wgmma), quantize_write_select.cuh
// (quantile clip, range selection), quantize_write_kernel.cuh (the kernel); this file launches.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "quantize_write_kernel.cuh"

namespace oscarkv::cuda {
namespace {

using namespace detail;

// Resident CTAs of `kernel` on the current device (SMs x CTAs per SM), cached.
cudaError_t CachedSlots(const void* kernel, int threads, int smem, int* slots) {
  struct Entry {
    const void* kernel;
    int smem, device, slots;
  };
  static std::mutex mu;
  static std::vector<Entry> cache;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  for (const Entry& c : cache) {
    if (c.kernel == kernel && c.smem == smem && c.device == device) {
      *slots = c.slots;
      return cudaSuccess;
    }
  }
  int sms = 0, per_sm = 0;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (e != cudaSuccess) return e;
  *slots = sms * per_sm;
  cache.push_back({kernel, smem, device, *slots});
  return cudaSuccess;
}

// Whether the kernels of this build for the current device are the sm_90a ones (wgmma), from
// a one-thread probe kernel; cached per device.
cudaError_t WgmmaAvailable(bool* have) {
  static std::mutex mu;
  static std::vector<std::pair<int, bool>> cache;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, h] : cache) {
    if (d == device) {
      *have = h;
      return cudaSuccess;
    }
  }
  int* flag = nullptr;
  e = cudaMalloc(&flag, sizeof(int));
  if (e != cudaSuccess) return e;
  WgmmaProbeKernel<<<1, 1>>>(flag);
  int host = 0;
  e = cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost);
  const cudaError_t f = cudaFree(flag);
  if (e == cudaSuccess) e = f;
  if (e != cudaSuccess) return e;
  *have = host != 0;
  cache.emplace_back(device, *have);
  return cudaSuccess;
}

}  // namespace

bool QuantizeWriteHasWgmma() {
  bool have = false;
  return WgmmaAvailable(&have) == cudaSuccess && have;
}

absl::Status PrepareRotationFragments(const float* matrices, int count, void* fragments,
                                      cudaStream_t stream) {
  if (count <= 0) return absl::OkStatus();
  if (matrices == nullptr || fragments == nullptr) {
    return absl::InvalidArgumentError("PrepareRotationFragments: null buffer");
  }
  PrepareFragmentsKernel<<<count, 256, 0, stream>>>(matrices, static_cast<uint8_t*>(fragments));
  return CudaStatus(cudaGetLastError(), "prepare rotation fragments");
}

absl::Status LaunchQuantizeWrite(const QuantizeWriteArgs& p, cudaStream_t stream) {
  if (p.head_dim != 128 || (p.group_size != 128 && p.group_size != 64)) {
    return absl::InvalidArgumentError("quantize-on-write needs head_dim 128 and group 128 or 64");
  }
  if (!IsRangeMode(static_cast<uint8_t>(p.range_mode))) {
    return absl::InvalidArgumentError("quantize-on-write: unknown range mode");
  }
  if (p.num_tokens <= 0 || p.layer_count == 0) return absl::OkStatus();
  if (p.k_src == nullptr || p.v_src == nullptr || p.page_ptrs == nullptr ||
      p.page_kinds == nullptr || p.dst_page == nullptr || p.dst_slot == nullptr) {
    return absl::InvalidArgumentError("quantize-on-write: missing buffer");
  }
  if (p.first_layer + p.layer_count > p.num_layers) {
    return absl::InvalidArgumentError("quantize-on-write: layers out of range");
  }
  if (p.src_token_stride % 8 != 0 || p.src_head_stride % 8 != 0 || p.src_layer_stride % 8 != 0) {
    return absl::InvalidArgumentError("quantize-on-write: source strides must be 16-byte multiples");
  }
  using LoadPath = QuantizeWriteArgs::LoadPath;
  // The streaming kernel (quantize_stream.cu) takes every launch it supports under kAuto:
  // rotated (R hi + lo) or already rotated rows, no clip, min-max or unbiased-fixed ranges.
  const bool stream_path = p.load_path == LoadPath::kStream || p.load_path == LoadPath::kStream3;
  if (p.load_path == LoadPath::kAuto || stream_path) {
    const char* why = nullptr;
    const bool fits = StreamWriteSupports(p, &why);
    if (!fits && stream_path) {
      return absl::InvalidArgumentError(absl::StrCat("quantize-on-write: the streaming kernel does not take ", why));
    }
    if (fits) {
      bool have = false;
      cudaError_t e = WgmmaAvailable(&have);
      if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write wgmma probe");
      if (have) return LaunchStreamWrite(p, stream);
      if (stream_path) {
        return absl::UnimplementedError("quantize-on-write: this build has no sm_90a (wgmma) kernels");
      }
    }
  }
  const bool g128 = p.group_size == 128;
  // Per-head modes live in device memory (unknown here): any table takes the selecting kernel,
  // which handles min-max heads at run time too.
  const bool select = p.range_modes != nullptr || p.range_mode != RangeMode::kMinMax;
  const bool rot = p.rot_fragments != nullptr;
  const bool wg_path = p.load_path == LoadPath::kWgmma4 || p.load_path == LoadPath::kWgmma8 ||
                       p.load_path == LoadPath::kWgmma12;
  const bool staged = p.load_path == LoadPath::kStaged ||
                      (!select && (p.load_path == LoadPath::kAuto || wg_path));
  const bool round1 = p.load_path == LoadPath::kRound1 && select;  // min-max kernels: unchanged
  // wgmma rotation (rotating kernels on sm_90a builds): warps per CTA, 0 for mma.sync. kAuto
  // takes 8-warp CTAs (2 per SM, 16 warps, 128 registers) for the selecting kernels -- measured
  // on an H200 (default codec write, us): 4 warps 248.5, 8 warps 174.9, 12 warps 199.3, mma.sync
  // 221.3 (session 13). The staged min-max / bf16 kernels take wgmma (4-warp CTAs, one
  // warpgroup) only when asked (kWgmma*): faster into INT2 pages (142.8 -> 113.4 us), slower
  // into BF16 pages (125.0 -> 141.7 us: the warpgroup's lock step exposes the ring's loads), and
  // the page kinds are not known here.
  bool have_wgmma = false;
  if (rot && (p.load_path == LoadPath::kAuto || wg_path)) {
    cudaError_t e = WgmmaAvailable(&have_wgmma);
    if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write wgmma probe");
    if (!have_wgmma && wg_path) {
      return absl::UnimplementedError("quantize-on-write: this build has no sm_90a (wgmma) kernels");
    }
  }
  const int wg = !have_wgmma                         ? 0
                 : !select                           ? (wg_path ? 4 : 0)
                 : p.load_path == LoadPath::kWgmma4  ? 4
                 : p.load_path == LoadPath::kWgmma12 ? 12
                                                     : 8;  // kWgmma8, kAuto
  // Round 3's selecting kernels (kAhead above): kAuto / kDirect take the rows one tile ahead
  // unrotated, an L1 prefetch one tile ahead rotated.
  const int ahead = p.load_path == LoadPath::kLoadAhead    ? 1
                    : p.load_path == LoadPath::kLoadAtTile ? 0
                    : p.load_path == LoadPath::kPrefetchL1 ? 2
                    : rot                                  ? 2
                                                           : 1;
  const int frag_bytes = !rot ? 0 : p.precise_rotation ? kFragSmem : kFragSmem / 2;
  // Shared memory: fragments, bins (selecting kernels), then the staged kernels' load rings.
  const int stages = !staged ? 0 : rot ? kStagesOf<true, true> : kStagesOf<true, false>;
  auto launch = [&](auto kernel, int warps) -> absl::Status {
    const int tile_tokens = 16 * warps, tiles = (p.num_tokens + tile_tokens - 1) / tile_tokens;
    const int smem = frag_bytes + BinBytes(select, warps) + warps * stages * kStageBytes;
    const int items = static_cast<int>(p.num_kv_heads * 2 * p.layer_count);
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write smem attribute");
    int per_cta;
    if (staged) {
      // One balanced wave: the fewest tiles per CTA such that all CTAs fit on the device at
      // once (cached per kernel, shared-memory size and device).
      int slots = 0;
      e = CachedSlots(reinterpret_cast<const void*>(kernel), 32 * warps, smem, &slots);
      if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write occupancy");
      if (slots <= 0) return absl::InternalError("quantize-on-write: kernel does not fit an SM");
      const int x = std::max(1, slots / items);
      per_cta = (tiles + x - 1) / x;
    } else if (select && !round1) {
      // Direct selecting kernels: tiles per CTA (up to 8, at least 2 when rotated, to amortize
      // the fragment load) minimizing the modelled makespan, waves x tiles per CTA (CTAs take
      // equal time), the larger count on ties (fewer fragment loads).
      int slots = 0;
      e = CachedSlots(reinterpret_cast<const void*>(kernel), 32 * warps, smem, &slots);
      if (e != cudaSuccess) return CudaStatus(e, "quantize-on-write occupancy");
      if (slots <= 0) return absl::InternalError("quantize-on-write: kernel does not fit an SM");
      long best = -1;
      per_cta = rot ? 2 : 1;
      for (int pc = per_cta; pc <= 8; ++pc) {
        const long ctas = static_cast<long>((tiles + pc - 1) / pc) * items;
        const long span = (ctas + slots - 1) / slots * pc;
        if (best < 0 || span <= best) {
          best = span;
          per_cta = pc;
        }
      }
    } else {
      // Round 1: rotated CTAs amortize the fragment load over several tiles; the rotated
      // selecting kernel takes 4 (measured side by side on an H200, default codec write: 4 tiles
      // 301.6 us, 8 tiles 313.9 us, 16 tiles 412.4 us -- a shorter last wave). The kernel
      // strides over tiles by the grid's width.
      per_cta = rot ? (select ? 4 : 8) : 2;
    }
    dim3 grid((tiles + per_cta - 1) / per_cta, p.num_kv_heads, 2 * p.layer_count);
    kernel<<<grid, 32 * warps, smem, stream>>>(p, per_cta);
    return absl::OkStatus();
  };
  // Template arguments: group, select, rotate, staged.
  absl::Status st;
  auto pick = [&](auto g, auto sel, auto rt) {
    constexpr int kG = decltype(g)::value;
    constexpr bool kSel = decltype(sel)::value, kRot = decltype(rt)::value;
    if (staged) {
      if constexpr (!kSel && kRot) {
        if (wg == 4) {
          st = launch(QuantizeWriteKernel<kG, false, true, true, false, 0, 4>, 4);
          return;
        }
      }
      st = launch(QuantizeWriteKernel<kG, kSel, kRot, true>, WarpsOf(kSel, kRot, false));
    } else if constexpr (kSel) {
      // The rotating selecting kernels' warp counts (wgmma), then the load-path variants that
      // every selecting kernel has.
      if constexpr (kRot) {
        if (wg == 4) {
          st = launch(QuantizeWriteKernel<kG, true, true, false, false, 2, 4>, 4);
          return;
        }
        if (wg == 8 && p.load_path == LoadPath::kAuto && p.clips == nullptr) {
          // Without the clip code: the default codec write (`--clip none`) 174.2 -> 169.0 us on
          // an H200 (session 13; a smaller kernel, fewer instruction-cache stalls).
          st = launch(QuantizeWriteKernel<kG, true, true, false, false, 2, 8, false>, 8);
          return;
        }
        if (wg == 8 || wg == 12) {
          st = wg == 8 ? launch(QuantizeWriteKernel<kG, true, true, false, false, 2, 8>, 8)
                       : launch(QuantizeWriteKernel<kG, true, true, false, false, 2, 12>, 12);
          return;
        }
      }
      if (round1) {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false, true>, WarpsOf(kSel, kRot, true));
      } else if (ahead == 1) {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false, false, 1>, WarpsOf(kSel, kRot, false));
      } else if (ahead == 2) {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false, false, 2>, WarpsOf(kSel, kRot, false));
      } else {
        st = launch(QuantizeWriteKernel<kG, kSel, kRot, false>, WarpsOf(kSel, kRot, false));
      }
    } else {
      st = launch(QuantizeWriteKernel<kG, kSel, kRot, false>, WarpsOf(kSel, kRot, false));
    }
  };
  using T = std::true_type;
  using F = std::false_type;
  using G128 = std::integral_constant<int, 128>;
  using G64 = std::integral_constant<int, 64>;
  auto by_group = [&](auto sel, auto rt) { g128 ? pick(G128{}, sel, rt) : pick(G64{}, sel, rt); };
  if (select) {
    rot ? by_group(T{}, T{}) : by_group(T{}, F{});
  } else {
    rot ? by_group(F{}, T{}) : by_group(F{}, F{});
  }
  if (!st.ok()) return st;
  return CudaStatus(cudaGetLastError(), "quantize-on-write launch");
}


absl::Status LaunchQuantizeWrite(const QuantizeWriteParams& p, cudaStream_t stream) {
  return LaunchQuantizeWrite(QuantizeWriteArgs(p), stream);
}

}  // namespace oscarkv::cuda
