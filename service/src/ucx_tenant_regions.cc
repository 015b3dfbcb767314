#include "ucx_tenant_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache_wire.h"

namespace oscarkv::service {

namespace {

std::string Errno(int e) { return std::strerror(e); }

int64_t NowUnixMs() { return absl::ToUnixMillis(absl::Now()); }

uint64_t AlignUp(uint64_t v) {
  return (v + TenantRegions::kAlign - 1) / TenantRegions::kAlign * TenantRegions::kAlign;
}

}  // namespace

struct TenantRegions::Region {
  struct Stage {
    uint64_t id = 0;
    uint64_t bytes = 0;  // aligned length of the range
    int64_t deadline_ms = 0;
    bool filling = true;  // being copied into: a free of it waits for its deadline
  };

  ~Region() { Close(); }
  // Creates the memfd, maps it, starts the data-plane child over a read-only descriptor of it.
  absl::Status Open(const TenantRegionOptions& options);
  void Close();  // idempotent

  // Zeroes [offset, offset + len), so freed pages do not linger readable. memset, not a hole
  // punched in the memfd: a hole would give the memory back, but every later stage would then
  // page-fault it in again on both sides (the daemon's copy, the child's reads); measured side by
  // side (ThroughputStagedVsPoolSideBySide) the staged path ran about twice as fast with memset.
  void Scrub(uint64_t offset, uint64_t len) { std::memset(base + offset, 0, len); }

  // Frees stages whose deadline passed (never one still being filled).
  void ReapExpired(int64_t now_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto it = stages.begin(); it != stages.end();) {
      if (it->second.deadline_ms <= now_ms && !it->second.filling) {
        Scrub(it->first, it->second.bytes);
        staged_bytes -= it->second.bytes;
        it = stages.erase(it);
      } else {
        ++it;
      }
    }
  }

  // First fit of `len` bytes among the gaps between stages; nullopt when none is big enough.
  std::optional<uint64_t> FindGap(uint64_t len) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    uint64_t cursor = 0;
    for (const auto& [off, st] : stages) {
      if (off - cursor >= len) return cursor;
      cursor = off + st.bytes;
    }
    if (bytes - cursor >= len) return cursor;
    return std::nullopt;
  }

  uint32_t tenant = 0;
  // Guards Open: the fields below up to `plane` are written once under it, then only read (by
  // threads that took it in RegionFor first).
  absl::Mutex init_mu;
  int fd = -1;     // the memfd, read-write: only the daemon holds it
  int ro_fd = -1;  // read-only open of it: what the data-plane child inherits
  uint8_t* base = nullptr;  // the daemon's writable mapping
  uint64_t bytes = 0;
  std::unique_ptr<UcxDataPlane> plane;

  absl::Mutex mu;
  std::map<uint64_t, Stage> stages ABSL_GUARDED_BY(mu);  // by offset
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
  uint64_t staged_bytes ABSL_GUARDED_BY(mu) = 0;
};

TenantRegions::TenantRegions(PageCache* cache, TenantRegionOptions options)
    : cache_(cache), options_(std::move(options)) {}

TenantRegions::~TenantRegions() {
  absl::MutexLock lock(&mu_);
  regions_.clear();
}

absl::Status TenantRegions::Region::Open(const TenantRegionOptions& options) {
  bytes = options.region_bytes;
  const std::string name = absl::StrCat("oscarkv-rma-tenant-", tenant);
  fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", Errno(errno)));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sizing a ", bytes, "-byte UCX staging region: ", Errno(errno)));
  }
  // Its size is fixed: the child's PROT_READ mapping can never be cut under it.
  (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap: ", Errno(errno)));
  base = static_cast<uint8_t*>(m);
  // A new open file description, read-only (a dup() would share the O_RDWR one).
  const std::string self = absl::StrCat("/proc/self/fd/", fd);
  ro_fd = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (ro_fd < 0) return absl::InternalError(absl::StrCat("open ", self, ": ", Errno(errno)));
  UcxDataPlaneOptions dpo;
  dpo.tls = options.tls;
  dpo.net_devices = options.net_devices;
  dpo.pool_bytes = bytes;
  dpo.shm_fd = ro_fd;  // always a child of its own, mapping only this region, read-only
  dpo.self_exe = options.self_exe;
  auto started = UcxDataPlane::Start(dpo);
  if (!started.ok()) {
    return absl::Status(started.status().code(), absl::StrCat("starting the tenant's UCX data "
                                                              "plane: ",
                                                              started.status().message()));
  }
  plane = std::move(*started);
  return absl::OkStatus();
}

void TenantRegions::Region::Close() {
  plane.reset();  // the child first: it maps the region
  if (base != nullptr) ::munmap(base, bytes);
  base = nullptr;
  if (ro_fd >= 0) ::close(ro_fd);
  ro_fd = -1;
  if (fd >= 0) ::close(fd);
  fd = -1;
}

absl::StatusOr<TenantRegions::Region*> TenantRegions::RegionFor(uint32_t tenant) {
  if (tenant >= options_.max_regions) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant id ", tenant, " has no UCX staging region"));
  }
  Region* r = nullptr;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Region>& slot = regions_[tenant];
    if (slot == nullptr) {
      slot = std::make_unique<Region>();
      slot->tenant = tenant;
    }
    r = slot.get();
  }
  // The first call of a tenant starts its child (about a second) under the region's own lock:
  // only that tenant's calls wait; a failed start is retried by its next call.
  absl::MutexLock lock(&r->init_mu);
  if (r->plane == nullptr) {
    if (absl::Status s = r->Open(options_); !s.ok()) {
      r->Close();
      return s;
    }
  }
  return r;
}

absl::StatusOr<pb::GetDataPlaneResponse> TenantRegions::DataPlane(const Caller& caller) {
  absl::StatusOr<Region*> r = RegionFor(caller.tenant_id);
  if (!r.ok()) return r.status();
  absl::StatusOr<pb::GetDataPlaneResponse> info = (*r)->plane->Info();
  if (!info.ok()) return info.status();
  info->set_staged(true);
  return info;
}

absl::Status TenantRegions::Stage(const Caller& caller, const pb::StageForRmaRequest& req,
                                  pb::StageForRmaResponse* resp) {
  if (static_cast<size_t>(req.free_stage_ids_size()) > kMaxStages) {
    return absl::InvalidArgumentError(absl::StrCat(
        req.free_stage_ids_size(), " stage ids to free; at most ", kMaxStages, " per call"));
  }
  absl::StatusOr<Region*> r_or = RegionFor(caller.tenant_id);
  if (!r_or.ok()) return r_or.status();
  Region& r = **r_or;
  const int64_t now = NowUnixMs();
  {
    absl::MutexLock lock(&r.mu);
    for (uint64_t id : req.free_stage_ids()) {
      for (auto it = r.stages.begin(); it != r.stages.end(); ++it) {
        if (it->second.id != id) continue;
        if (!it->second.filling) {
          r.Scrub(it->first, it->second.bytes);
          r.staged_bytes -= it->second.bytes;
          r.stages.erase(it);
        }
        break;
      }
    }
  }
  if (req.lease_id() == 0) return absl::OkStatus();

  // The same checks as ReadPages: the lease is the caller's and pins every key. The plan holds
  // pool references, so the pages stay valid while they are copied.
  pb::ReadRequest read;
  read.set_lease_id(req.lease_id());
  *read.mutable_keys() = req.keys();
  absl::StatusOr<std::unique_ptr<ReadPlan>> plan = wire::PrepareRead(*cache_, caller, read);
  if (!plan.ok()) return plan.status();
  const std::vector<ReadPlan::Page>& pages = (*plan)->pages();
  uint64_t total = 0;
  for (const ReadPlan::Page& p : pages) total += AlignUp(p.bytes);
  if (total > r.bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "StageForRma: ", pages.size(), " pages (", total, " bytes) exceed the ", r.bytes,
        "-byte UCX staging region (ucx.tenant_region_mb); stage fewer pages per call"));
  }
  if (pages.empty()) return absl::OkStatus();  // a lease of no pages: nothing staged (id 0)
  uint64_t start = 0, id = 0;
  const int64_t deadline = now + kStageTtlMs;
  {
    absl::MutexLock lock(&r.mu);
    std::optional<uint64_t> gap = r.stages.size() < kMaxStages ? r.FindGap(total) : std::nullopt;
    if (!gap) {
      // Reap only under pressure: a live stage is never cut short.
      r.ReapExpired(now);
      if (r.stages.size() < kMaxStages) gap = r.FindGap(total);
    }
    if (!gap) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "StageForRma: no free ", total, "-byte range in the UCX staging region (", r.staged_bytes,
          " of ", r.bytes, " bytes held by ", r.stages.size(), " stages); free stages that "
          "were read (free_stage_ids) or wait ", kStageTtlMs, " ms for them to expire"));
    }
    start = *gap;
    id = r.next_id++;
    r.stages[start] = Region::Stage{id, total, deadline, /*filling=*/true};
    r.staged_bytes += total;
  }
  // Copied outside the lock: the range is this stage's alone.
  uint64_t off = start;
  resp->Clear();
  for (const ReadPlan::Page& p : pages) {
    std::memcpy(r.base + off, p.data, p.bytes);
    pb::StagedPage* sp = resp->add_pages();
    sp->set_offset(off);
    sp->set_bytes(p.bytes);
    off += AlignUp(p.bytes);
  }
  {
    absl::MutexLock lock(&r.mu);
    auto it = r.stages.find(start);
    if (it != r.stages.end() && it->second.id == id) it->second.filling = false;
  }
  resp->set_stage_id(id);
  resp->set_deadline_unix_ms(static_cast<uint64_t>(deadline));
  return absl::OkStatus();
}

}  // namespace oscarkv::service
