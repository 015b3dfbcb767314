// The CUDA attention backend in a build without CUDA (nvcc was not found at configure time).
#include "oscarkv/engine/cuda_attention.h"

namespace oscarkv::engine {

bool CudaAttentionCompiled() { return false; }

absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeCudaAttention(KvCodec, const CudaAttentionOptions&) {
  return absl::UnimplementedError(
      "this oscarkv was built without CUDA (no nvcc at configure time); use --device cpu");
}

}  // namespace oscarkv::engine
