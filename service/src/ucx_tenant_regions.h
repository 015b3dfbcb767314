// Per-tenant UCX access: a tenant that may not hold the pool's remote key (grpc_service.h,
// GetDataPlane) loads over UCX through a staging region of its own instead.
//
// Why not an rkey over the tenant's pages: a remote key is a capability only on RDMA hardware,
// where the NIC checks every access against a registration. UCX's tcp transport (and every
// transport without native RMA) emulates RMA with active messages, and the target's handlers
// (ucp/rma/rma_sw.c: ucp_get_req_handler, ucp_put_handler) read from and write to whatever
// address the request names, with no check against any registration or rkey. So a peer
// connected to a worker can read -- and write -- anything the worker's PROCESS maps. Isolation
// must therefore come from what the serving process maps, not from the key.
//
// So every tenant gets (lazily, on its first GetDataPlane; at most one per configured tenant):
// * a memfd of `region_bytes` that only the daemon maps writable, and
// * a UcxDataPlane child process (ucx_data_plane.h: re-executed oscarkvd, supervised and
//   restarted the same way) that inherits a read-only descriptor of that memfd, maps it
//   PROT_READ and registers it. The child maps no pool, no other tenant's region, no
//   certificate, no configuration: what a peer of that child's worker can reach is this
//   tenant's region plus the child's own UCX state.
// A load: StageForRma (the same lease checks as ReadPages) copies the leased pages into a free
// range of the caller's region -- a stage, freed by the client when read, or at its deadline --
// and answers the offsets; the client RMA-gets them from its child and verifies the checksums.
// A freed stage is zeroed. A region's memory is allocated as it is first used and then stays
// resident: at most max_regions x region_bytes in all.
//
// Bounds: one stage never exceeds the region; at most kMaxStages stages per region; a stage
// lives at most kStageTtlMs. RESOURCE_EXHAUSTED when a request does not fit.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpc_service.h"
#include "oscarkv/service/page_cache.h"
#include "ucx_data_plane.h"

namespace oscarkv::service {

struct TenantRegionOptions {
  std::string tls;          // UCX_TLS of the tenants' data-plane processes
  std::string net_devices;  // UCX_NET_DEVICES (DataPlaneNetDevices)
  uint64_t region_bytes = uint64_t{64} << 20;
  size_t max_regions = 0;  // the configured tenants; a tenant id at or past it is refused
  std::string self_exe = "/proc/self/exe";
};

class TenantRegions final : public TenantRma {
 public:
  static constexpr int64_t kStageTtlMs = 10000;
  static constexpr size_t kMaxStages = 256;
  static constexpr uint64_t kAlign = 256;  // every staged page starts at a multiple of this

  // `cache` must outlive this.
  TenantRegions(PageCache* cache, TenantRegionOptions options);
  ~TenantRegions() override;  // stops every tenant's data-plane process, unmaps every region
  TenantRegions(const TenantRegions&) = delete;
  TenantRegions& operator=(const TenantRegions&) = delete;

  absl::StatusOr<pb::GetDataPlaneResponse> DataPlane(const Caller& caller) override;
  absl::Status Stage(const Caller& caller, const pb::StageForRmaRequest& req,
                     pb::StageForRmaResponse* resp) override;

 private:
  struct Region;
  // The caller's region, created (and its process started) on first use; a failed start is
  // retried by the tenant's next call.
  absl::StatusOr<Region*> RegionFor(uint32_t tenant);

  PageCache* const cache_;
  const TenantRegionOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint32_t, std::unique_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace oscarkv::service
