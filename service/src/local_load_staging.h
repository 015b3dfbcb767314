// The load side of isolated shared memory for callers that do not map the pool (tenants): a
// per-connection load staging region that the daemon creates and fills, and that the client
// maps read-only (AttachLoadStaging, StageRead: proto/oscarkv/v1/oscarkv.proto).
//
// What a tenant can see through it: only the bytes StageRead copied into it, and StageRead
// copies only pages pinned by a lease of the caller's own tenant (PageCache::PrepareRead, the
// check gRPC ReadPages makes). The region is a memfd created for one connection, so no other
// process is handed a descriptor of it; its seals keep the client from resizing it (SIGBUS in
// the daemon's copy) or mapping it writable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/service/caller.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv::service {

// Bounds the bytes of load staging regions (daemon memory the daemon itself writes) one tenant
// can hold through its connections. Thread-safe.
class LoadRegionLimiter {
 public:
  explicit LoadRegionLimiter(uint64_t per_tenant_bytes) : per_tenant_bytes_(per_tenant_bytes) {}
  // false when `bytes` more would put `tenant_id` over per_tenant_bytes.
  bool TryAcquire(uint32_t tenant_id, uint64_t bytes);
  void Release(uint32_t tenant_id, uint64_t bytes);
  uint64_t per_tenant_bytes() const { return per_tenant_bytes_; }

 private:
  const uint64_t per_tenant_bytes_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, uint64_t> held_ ABSL_GUARDED_BY(mu_);
};

class LoadStagingRegion {
 public:
  // A new sealed memfd of `bytes`, mapped read-write here, counted against `tenant_id` in
  // `limiter` (which must outlive the region) until it is destroyed. INVALID_ARGUMENT for 0
  // bytes; RESOURCE_EXHAUSTED over `max_bytes` or over the tenant's bytes of regions.
  static absl::StatusOr<std::unique_ptr<LoadStagingRegion>> Create(uint64_t bytes,
                                                                   uint64_t max_bytes,
                                                                   LoadRegionLimiter* limiter,
                                                                   uint32_t tenant_id);
  ~LoadStagingRegion();
  LoadStagingRegion(const LoadStagingRegion&) = delete;
  LoadStagingRegion& operator=(const LoadStagingRegion&) = delete;

  // A new read-only descriptor of the region (a new open file description), for the client;
  // the caller closes it.
  absl::StatusOr<int> OpenReadOnly() const;
  std::span<uint8_t> bytes() const { return {base_, size_}; }

 private:
  LoadStagingRegion() = default;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  LoadRegionLimiter* limiter_ = nullptr;
  uint32_t tenant_id_ = 0;
  uint64_t charged_ = 0;  // bytes held in limiter_
};

// StageRead: copies the requested chunk of a page the caller's lease pins into `region` (empty:
// none attached). The lease and key are checked on every call, as ReadPages checks them.
absl::Status StageReadChunk(PageCache& cache, const Caller& caller,
                            const ::oscarkv::v1::StageReadRequest& req,
                            std::span<uint8_t> region);

}  // namespace oscarkv::service
