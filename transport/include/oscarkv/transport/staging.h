// Staging for buffers UCX cannot register -- GPU memory when the UCX build has no CUDA
// (Context::capabilities().needs_gpu_staging()). Pages travel by RMA into a registered host
// bounce buffer and are then copied to their destination by a caller-supplied function
// (cudaMemcpyAsync + stream sync in the engine, memcpy in tests), or the other way round for
// puts. The bounce buffer is split in two halves so the copy of one chunk overlaps the RMA of the
// next. Keeps this library free of CUDA: the caller decides, from the capability query, whether
// to use StagingBuffer or to register device memory directly (MemoryType::kCuda).
//
// Thread-safety: like an Endpoint, one thread at a time. For async DMA the caller may pin the
// bounce buffer (cudaHostRegister(base(), length())) after Create.
#pragma once

#include <functional>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "oscarkv/transport/transport.h"

namespace oscarkv::transport {

// Copies n bytes; dst/src are a staged (e.g. device) pointer and a bounce-buffer pointer.
using StageCopyFn = std::function<absl::Status(void* dst, const void* src, size_t n)>;

class StagingBuffer {
 public:
  // bounce_bytes (>= 2 x 4 KiB) is allocated through UCX (Context::Allocate) and registered.
  static absl::StatusOr<std::unique_ptr<StagingBuffer>> Create(Context& context,
                                                               size_t bounce_bytes);

  // For each desc: RMA get [remote, +length) into the bounce buffer, then
  // to_staged(desc.local, bounce, length). desc.local is the unregistered destination.
  // Descriptors larger than half the bounce buffer are split.
  absl::Status Get(Endpoint& ep, const RemoteMemory& remote, std::span<const TransferDesc> descs,
                   const StageCopyFn& to_staged,
                   absl::Duration timeout = absl::InfiniteDuration());
  // For each desc: from_staged(bounce, desc.local, length), then RMA put into the remote range.
  absl::Status Put(Endpoint& ep, const RemoteMemory& remote, std::span<const TransferDesc> descs,
                   const StageCopyFn& from_staged,
                   absl::Duration timeout = absl::InfiniteDuration());

  uint8_t* base() const { return region_->base(); }
  size_t length() const { return region_->length(); }

 private:
  struct Piece {
    uint8_t* staged;  // the unregistered side
    uint64_t remote;
    size_t length;
  };
  explicit StagingBuffer(std::unique_ptr<MemoryRegion> region) : region_(std::move(region)) {}
  // Splits descs into chunks of pieces, each chunk fitting in half the bounce buffer.
  absl::StatusOr<std::vector<std::vector<Piece>>> Chunk(const RemoteMemory& remote,
                                                        std::span<const TransferDesc> descs) const;
  std::unique_ptr<MemoryRegion> region_;
};

}  // namespace oscarkv::transport
