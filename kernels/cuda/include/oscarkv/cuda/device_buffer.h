// RAII device allocation for host code that drives the kernels (tests, benchmarks, engine
// backends). Not thread-safe per object.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "oscarkv/util/cuda_status.h"

namespace oscarkv::cuda {

using ::oscarkv::CudaStatus;  // the one cudaError_t -> absl::Status adapter (util/)

// True when a CUDA device is usable (tests skip otherwise).
inline bool HaveCudaDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Create(size_t bytes) {
    DeviceBuffer b;
    if (bytes == 0) return b;
    if (absl::Status s = CudaStatus(cudaMalloc(&b.ptr_, bytes), "cudaMalloc"); !s.ok()) return s;
    b.bytes_ = bytes;
    return b;
  }
  template <typename T>
  static absl::StatusOr<DeviceBuffer> FromHost(const std::vector<T>& v) {
    auto b = Create(v.size() * sizeof(T));
    if (!b.ok()) return b.status();
    if (!v.empty()) {
      absl::Status s = CudaStatus(cudaMemcpy(b->ptr_, v.data(), v.size() * sizeof(T),
                                         cudaMemcpyHostToDevice), "cudaMemcpy H2D");
      if (!s.ok()) return s;
    }
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = o.bytes_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

  template <typename T>
  absl::StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> v(bytes_ / sizeof(T));
    if (!v.empty()) {
      absl::Status s = CudaStatus(cudaMemcpy(v.data(), ptr_, v.size() * sizeof(T), cudaMemcpyDeviceToHost),
                              "cudaMemcpy D2H");
      if (!s.ok()) return s;
    }
    return v;
  }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace oscarkv::cuda
