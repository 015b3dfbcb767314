// Marks functions usable from both host and device code, so the index math and numeric
// conversions that the CUDA kernels use are the same code the CPU reference runs and tests.
#pragma once

#if defined(__CUDACC__)
#define OSCARKV_HD __host__ __device__ __forceinline__
#else
#define OSCARKV_HD inline
#endif
