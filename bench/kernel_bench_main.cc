// Standalone `bench kernels` (same as `oscarkv bench kernels`), for device runs that carry
// only this binary.
#include "kernel_bench.h"

int main(int argc, char** argv) { return oscarkv::bench::KernelBenchMain(argc, argv); }
