// The one cudaError_t -> absl::Status adapter. Include it only from code that is compiled with
// the CUDA toolkit (it includes cuda_runtime_api.h); nothing else in util/ needs CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace oscarkv {

// OK for cudaSuccess; otherwise INTERNAL "<what>: <CUDA's description of the error>".
inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace oscarkv
