// `oscarkv bench kernels`: decode attention and quantize-on-write on the local GPU (see
// bench/kernel_bench.h). Without the CUDA kernels (no nvcc at build time) it says so.
#include <cstdio>

#include "command.h"

// Set by the oscarkv_bench target, which exists only where the CUDA kernels are built (the
// header is on the include path either way, for the CPU benchmarks beside it).
#ifdef OSCARKV_HAVE_KERNEL_BENCH
#include "kernel_bench.h"
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
