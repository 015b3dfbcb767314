// How many thread-block clusters of each size can be resident at once on this GPU for a CTA
// shaped like the 8-warp INT2 decode CTA (256 threads, one CTA per SM: its shared memory alone
// keeps a second one off), i.e. whether a split-K merge through distributed shared memory can
// hold every CTA of a (sequence, KV head) pair in one cluster at B=1 (8 pairs x 16 CTAs, issue 25).
// Prints cudaOccupancyMaxActiveClusters for cluster sizes 1..16 (9..16 need
// cudaFuncAttributeNonPortableClusterSizeAllowed), and then launches 8 clusters of 16 and 16
// clusters of 8 CTAs whose CTAs record their SM and %globaltimer at entry, to show whether they
// all ran at once (one wave) or in several.
// Built as bench/cluster_probe (CMake target cluster_probe); results in
// bench/results/h200_dec_s31_call1.txt.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int kThreads = 256;
constexpr int kSmem = 120 * 1024;  // > 228 KiB / 2: one CTA per SM, as the INT2 kernel's

__global__ void ProbeKernel(uint64_t* rec, int spin_ns) {
  extern __shared__ uint8_t smem[];
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  if (threadIdx.x == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    rec[2 * blockIdx.x] = t0;
    rec[2 * blockIdx.x + 1] = sm;
  }
  // Hold the SM for a while so that CTAs of a second wave start visibly later.
  uint64_t t = t0;
  while (t - t0 < static_cast<uint64_t>(spin_ns)) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  smem[threadIdx.x] = static_cast<uint8_t>(t);
}

bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

void LaunchWave(int cluster, int clusters, uint64_t* d_rec) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(cluster * clusters);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  if (!Check(cudaLaunchKernelEx(&cfg, ProbeKernel, d_rec, 20000), "launch")) return;
  if (!Check(cudaDeviceSynchronize(), "sync")) return;
  const int n = cluster * clusters;
  std::vector<uint64_t> rec(2 * n);
  cudaMemcpy(rec.data(), d_rec, rec.size() * 8, cudaMemcpyDeviceToHost);
  uint64_t t_min = ~0ull, t_max = 0;
  std::vector<int> sms;
  for (int i = 0; i < n; ++i) {
    t_min = std::min(t_min, rec[2 * i]);
    t_max = std::max(t_max, rec[2 * i]);
    sms.push_back(static_cast<int>(rec[2 * i + 1]));
  }
  std::sort(sms.begin(), sms.end());
  const int distinct = static_cast<int>(std::unique(sms.begin(), sms.end()) - sms.begin());
  int late = 0;
  for (int i = 0; i < n; ++i) late += rec[2 * i] - t_min > 10000;
  std::printf("  %2d clusters of %2d: %3d CTAs on %3d SMs, entry spread %.1f us, %d CTAs entered > 10 us "
              "after the first (a second wave)\n",
              clusters, cluster, n, distinct, (t_max - t_min) / 1e3, late);
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  if (!Check(cudaGetDeviceProperties(&prop, 0), "device")) return 1;
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  if (!Check(cudaFuncSetAttribute(ProbeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "smem")) return 1;
  if (!Check(cudaFuncSetAttribute(ProbeKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), "non-portable"))
    return 1;
  std::printf("max active clusters (256 threads, %d KiB dynamic shared memory, 1 CTA per SM):\n", kSmem / 1024);
  for (int c = 1; c <= 16; ++c) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(c * 16);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kSmem;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = c;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, ProbeKernel, &cfg);
    std::printf("  size %2d: %s%d clusters = %d CTAs\n", c, e == cudaSuccess ? "" : cudaGetErrorString(e), n, n * c);
  }
  uint64_t* d_rec = nullptr;
  if (!Check(cudaMalloc(&d_rec, 2 * 256 * sizeof(uint64_t)), "malloc")) return 1;
  std::printf("launches (each CTA holds its SM for 20 us):\n");
  LaunchWave(16, 8, d_rec);
  LaunchWave(8, 16, d_rec);
  LaunchWave(8, 15, d_rec);
  LaunchWave(4, 32, d_rec);
  LaunchWave(2, 64, d_rec);
  cudaFree(d_rec);
  return 0;
}
