// `oscarkv bench kernels`: decode attention and quantize-on-write on the local GPU (see
// bench/kernel_bench.h). Without the CUDA kernels (no nvcc at build time) it says so.
#include <cstdio>

#include "command.h"

#if __has_include("kernel_bench.h")
#include "kernel_bench.h"
#define OSCARKV_HAVE_KERNEL_BENCH 1
#endif

namespace oscarkv::cli {
namespace {

int RunBenchKernels(int argc, char** argv) {
#ifdef OSCARKV_HAVE_KERNEL_BENCH
  return oscarkv::bench::KernelBenchMain(argc, argv);
#else
  std::fprintf(stderr, "oscarkv bench kernels: this build has no CUDA kernels (nvcc not found)\n");
  return 1;
#endif
}

}  // namespace

OSCARKV_COMMAND("bench kernels",
                "decode attention (SDPA vs BF16 vs INT2 pages) and quantize-on-write on the GPU",
                RunBenchKernels);

}  // namespace oscarkv::cli
