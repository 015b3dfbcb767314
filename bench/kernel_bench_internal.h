// Private to bench/: what the kernel bench's sources share -- kernel_bench.cu (the report's
// driver: copy bandwidth, shared inputs, extend and quantize-on-write rows), kernel_bench_pages.cu
// (batches of OSCAR / BF16 pages in device pools, the input fills) and kernel_bench_decode.cu
// (the decode rows). Host code (CUDA runtime calls, no kernels); not installed.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernel_bench.h"
#include "oscarkv/cuda/decode_runner.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::bench {

using cuda::DeviceBuffer;

#define BENCH_RETURN_IF_ERROR(expr)            \
  do {                                         \
    absl::Status _st = (expr);                 \
    if (!_st.ok()) return _st;                 \
  } while (0)

constexpr int kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageTokens = 64;

// Median over `samples` of the per-call time (µs) of a batch of back-to-back calls sized to
// ~2 ms, so launch gaps do not dominate short kernels.
template <typename F>
absl::StatusOr<double> TimeMedianUs(F&& call, int samples) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto batch = [&](int reps) -> absl::StatusOr<double> {
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) {
      absl::Status s = call();
      if (!s.ok()) return s;
    }
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return 1000.0 * ms / reps;
  };
  auto warm = batch(3);
  if (!warm.ok()) return warm.status();
  const int reps = std::clamp(static_cast<int>(2000.0 / std::max(*warm, 1.0)), 3, 200);
  std::vector<double> v;
  for (int s = 0; s < samples; ++s) {
    auto t = batch(reps);
    if (!t.ok()) return t.status();
    v.push_back(*t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "timed launches"));
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The same measurement under CUDA-graph replay, the way engines run a decode step: `call(stream)`
// enqueues one launch; a graph of `reps` back-to-back calls (reps sized as above) is captured on a
// private stream, and the median over `samples` replays of the per-call time is returned. Each
// capture calls `call` reps times, so a call that cycles through inputs (page-pool copies) is
// captured with the same cycle as the eager batches.
template <typename F>
absl::StatusOr<double> TimeGraphMedianUs(F&& call, int samples) {
  cudaStream_t st = nullptr;
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "graph stream"));
  cudaEvent_t a = nullptr, b = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<double> v;
  absl::Status status = [&]() -> absl::Status {
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&a), "event"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&b), "event"));
    // Eager warm-up on the stream (first-launch attribute setting stays out of the capture).
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(a, st), "event"));
    for (int i = 0; i < 3; ++i) BENCH_RETURN_IF_ERROR(call(st));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(b, st), "event"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(b), "warm-up"));
    float ms = 0;
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, a, b), "event"));
    const int reps = std::clamp(static_cast<int>(2000.0 / std::max(1000.0 * ms / 3, 1.0)), 3, 200);
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture"));
    absl::Status cs = absl::OkStatus();
    for (int i = 0; i < reps && cs.ok(); ++i) cs.Update(call(st));
    const cudaError_t ce = cudaStreamEndCapture(st, &graph);
    BENCH_RETURN_IF_ERROR(cs);
    BENCH_RETURN_IF_ERROR(CudaStatus(ce, "end capture"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "instantiate"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(exec, st), "replay"));  // warm replay
    for (int s = 0; s < samples; ++s) {
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(a, st), "event"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(exec, st), "replay"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(b, st), "event"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(b), "replay"));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, a, b), "event"));
      v.push_back(1000.0 * ms / reps);
    }
    return CudaStatus(cudaGetLastError(), "graph replays");
  }();
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (a != nullptr) cudaEventDestroy(a);
  if (b != nullptr) cudaEventDestroy(b);
  cudaStreamDestroy(st);
  if (!status.ok()) return status;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// The bench's codec profile: Qwen3-8B's KV shape, `layers` layers per page.
CodecProfile BenchProfile(int layers);

// Roughly normal bf16 values (sum of four uniforms, std ~ `scale`) and uniform floats in [-1, 1),
// both a hash of the element index and `seed`; `blocks` CTAs of 256 threads on the default stream.
void LaunchFillBf16(int blocks, uint16_t* p, size_t n, uint32_t seed, float scale);
void LaunchFillFloat(int blocks, float* p, size_t n, uint32_t seed);

// A batch of sequences' pages in device pools, replicated `copies` times.
struct PagedBatch {
  std::unique_ptr<cuda::PagedDecoder> decoder;
  DeviceBuffer int2_pool, bf16_pool, kinds, counts, indptr, ids;
  std::vector<DeviceBuffer> ptr_tables;  // one per copy
  int copies = 1;
  // The torch op's decoder for the same batch (KernelBenchOptions::capture_timing): made by
  // CreateForCapture for 2B sequences, planned by Update; capture_indptr: the CSR offsets padded
  // to its capacity (sequences past the batch have no pages).
  std::unique_ptr<cuda::PagedDecoder> capture;
  DeviceBuffer capture_indptr;
};

// B sequences of L tokens each (PlanSequencePages: BF16 sink, INT2 history, BF16 tail; every page
// BF16 with all_bf16), filled from the source rows by the quantize-on-write kernel, planned for
// `sms` SMs and `target` CTAs (PlanDecode's), replicated DecodeCopies times; with
// o.capture_timing also the torch op's capture decoder.
absl::Status BuildBatch(const KernelBenchOptions& o, int B, int L, bool all_bf16, int sms, int target,
                        const DeviceBuffer& ksrc, const DeviceBuffer& vsrc, const void* rot_frag,
                        const float* clips, PagedBatch* out);

// The decode rows of `rows` (SDPA already filled in): BF16 pages, the default INT2 launch and
// its alternatives, graph replay, the capture decoder, other plan targets and --ab option sets.
// ksrc / vsrc: the shared source rows, frags / clips: the write kernel's rotation fragments and
// clips, rot: the rotations (R_K of layer 0 at rot_k on the device).
absl::Status RunDecodeRows(const KernelBenchOptions& o, int sms, const DeviceBuffer& ksrc,
                           const DeviceBuffer& vsrc, const void* frags, const float* clips,
                           const RotationSet& rot, const float* rot_k, std::vector<DecodeRow>* rows);

}  // namespace oscarkv::bench
