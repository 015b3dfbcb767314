#include "oscarkv/client/ucx_loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/transport/transport.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "client_internal.h"
#include "page_fetch.h"
#include "rpc_core.h"

namespace oscarkv::client {
namespace {

namespace pb = ::oscarkv::v1;

class UcxLoaderImpl final : public UcxLoader {
 public:
  UcxLoaderImpl(UcxLoaderOptions options, std::unique_ptr<HandleClient> hc,
                std::shared_ptr<RpcCore> rpc)
      : options_(std::move(options)),
        hc_(std::move(hc)),
        rpc_(std::move(rpc)),
        staged_(this, /*direct=*/false),
        direct_(this, /*direct=*/true) {}
  ~UcxLoaderImpl() override {
    absl::MutexLock lock(&mu_);
    Disconnect();
    user_regions_.clear();
    region_.reset();
    buffer_.clear();
    context_.reset();
  }

  absl::Status Init() {
    absl::MutexLock lock(&mu_);
    transport::ContextOptions co;
    co.tls = options_.tls;
    co.net_devices = options_.net_devices;
    co.name = "oscarkv-client";
    OSCARKV_ASSIGN_OR_RETURN(context_, transport::Context::Create(co));
    buffer_.resize(options_.buffer_bytes);
    OSCARKV_ASSIGN_OR_RETURN(region_, context_->Register(buffer_.data(), buffer_.size()));
    return EnsureConnected();
  }

  HandleClient& handles() override { return *hc_; }

  absl::StatusOr<UcxDataPlaneInfo> Info() override {
    absl::MutexLock lock(&mu_);
    OSCARKV_RETURN_IF_ERROR(EnsureConnected());
    UcxDataPlaneInfo info;
    info.daemon_transports.assign(dp_.transports().begin(), dp_.transports().end());
    info.endpoint_transports = ep_->Transports();
    info.peer_failure_detection = peer_detect_;
    info.staged = dp_.staged();
    return info;
  }

  absl::StatusOr<LoadResult> Load(const Codec& codec, std::span<const BlockKey> keys) override {
    LookupOptions lo;
    lo.pin = true;
    OSCARKV_ASSIGN_OR_RETURN(LookupResult lookup, hc_->client().Lookup(codec, keys, lo));
    LoadResult out;
    absl::Status s =
        FetchByLease(codec, lookup, OwnedBuffers(lookup.pages, &out.pages), staged_);
    // A dead daemon's leases die with it; a failure after good pages is still reported.
    absl::Status released = hc_->client().Release(lookup);
    if (!s.ok()) return s;
    out.release_status = std::move(released);
    out.matched = lookup.matched;
    for (const PageRef& r : lookup.pages) {
      out.kinds.push_back(r.kind);
      out.bytes += r.bytes;
    }
    return out;
  }

  absl::Status RegisterBuffer(void* base, size_t bytes) override {
    absl::MutexLock lock(&mu_);
    OSCARKV_ASSIGN_OR_RETURN(auto region, context_->Register(base, bytes));
    user_regions_.push_back(std::move(region));
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> LoadInto(const Codec& codec, std::span<const BlockKey> keys,
                                    std::span<const std::span<uint8_t>> dst,
                                    std::vector<uint64_t>* bytes_out) override {
    if (dst.size() < keys.size()) {
      return absl::InvalidArgumentError(absl::StrCat(keys.size(), " keys but only ", dst.size(),
                                                     " destination buffers"));
    }
    LookupOptions lo;
    lo.pin = true;
    OSCARKV_ASSIGN_OR_RETURN(LookupResult lookup, hc_->client().Lookup(codec, keys, lo));
    absl::Status s = FetchByLease(codec, lookup, dst, direct_);
    hc_->client().Release(lookup).IgnoreError();
    if (!s.ok()) return s;
    if (bytes_out != nullptr) {
      bytes_out->clear();
      for (const PageRef& r : lookup.pages) bytes_out->push_back(r.bytes);
    }
    return lookup.matched;
  }

  absl::StatusOr<HandlePages> LoadHandle(const Codec& codec, const std::string& handle) override {
    OSCARKV_ASSIGN_OR_RETURN(HandleInfo info, hc_->Open(handle, 0));
    HandlePages out;
    absl::Status s = info.codec_id == codec.id
                         ? FetchVerified(codec, info.lease_id, info.pages,
                                         OwnedBuffers(info.pages, &out.pages), staged_,
                                         options_.connect.verify_checksums)
                         : absl::InvalidArgumentError(absl::StrCat(
                               "handle '", handle, "' holds codec ", info.codec_id.Hex()));
    absl::Status released = hc_->client().Release(info.lease_id);
    if (!s.ok()) return s;
    out.release_status = std::move(released);
    info.lease_id = 0;
    for (const auto& p : out.pages) out.bytes += p.size();
    out.info = std::move(info);
    return out;
  }

 private:
  // A Lookup pins one lease per max_batch chunk of its keys (client.h): page i belongs to
  // lease_ids[i / max_batch]. A staging data plane stages each page under its own lease.
  absl::Status FetchByLease(const Codec& codec, const LookupResult& lookup,
                            std::span<const std::span<uint8_t>> dst, PageSource& source) {
    const size_t batch = std::max<size_t>(1, hc_->client().server().max_batch);
    const std::span<const PageRef> pages(lookup.pages);
    for (size_t begin = 0, chunk = 0; begin < pages.size(); begin += batch, ++chunk) {
      const size_t n = std::min(batch, pages.size() - begin);
      const uint64_t lease = chunk < lookup.lease_ids.size() ? lookup.lease_ids[chunk] : 0;
      OSCARKV_RETURN_IF_ERROR(FetchVerified(codec, lease, pages.subspan(begin, n),
                                            dst.subspan(begin, n), source,
                                            options_.connect.verify_checksums, begin));
    }
    return absl::OkStatus();
  }

  absl::Status GetDataPlane(pb::GetDataPlaneResponse* resp) {
    auto ctx = rpc_->Context();
    return FromGrpc(rpc_->stub().GetDataPlane(ctx.get(), pb::GetDataPlaneRequest(), resp),
                    "GetDataPlane");
  }

  void Disconnect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    remote_.reset();
    ep_.reset();
    worker_.reset();
  }

  absl::Status EnsureConnected() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ep_ != nullptr && ep_->failed()) Disconnect();
    if (ep_ != nullptr && peer_detect_) return absl::OkStatus();
    pb::GetDataPlaneResponse dp;
    OSCARKV_RETURN_IF_ERROR(GetDataPlane(&dp));
    if (ep_ != nullptr) {
      if (dp.worker_address() == dp_.worker_address() && dp.pool_rkey() == dp_.pool_rkey()) {
        return absl::OkStatus();
      }
      Disconnect();  // the daemon restarted: never read through the old endpoint
    }
    dp_ = dp;
    peer_detect_ = context_->capabilities().peer_failure_detection && dp.peer_failure_detection();
    // A fresh worker per connection: requests abandoned on a dead peer stay with the old one.
    OSCARKV_ASSIGN_OR_RETURN(worker_, transport::Worker::Create(*context_));
    transport::EndpointOptions eo;
    eo.peer_timeout = absl::Milliseconds(options_.peer_timeout_ms);
    eo.error_handling = peer_detect_ ? transport::EndpointOptions::ErrorHandling::kPeer
                                     : transport::EndpointOptions::ErrorHandling::kNone;
    auto ep = worker_->Connect(dp.worker_address(), eo);
    if (!ep.ok()) {
      worker_.reset();
      return ep.status();
    }
    ep_ = std::move(*ep);
    auto remote = ep_->ImportRemote(dp.pool_rkey());
    if (!remote.ok()) {
      Disconnect();
      return remote.status();
    }
    remote_ = std::move(*remote);
    return absl::OkStatus();
  }

  // The UCX data path as a PageSource. Staged: RMA gets into the registered buffer (rounds of
  // at most buffer_bytes), then each page copied out to its destination and hashed in the same
  // pass. Direct: RMA gets straight into caller buffers registered with RegisterBuffer (the
  // pages are hashed by FetchVerified after they landed: the CPU never copied them).
  class Source final : public PageSource {
   public:
    Source(UcxLoaderImpl* loader, bool direct) : loader_(loader), direct_(direct) {}
    absl::Status Fetch(uint64_t lease_id, std::span<const PageRef> pages,
                       std::span<const std::span<uint8_t>> dst, bool hash,
                       std::vector<std::optional<uint64_t>>* digests) override {
      absl::MutexLock lock(&loader_->mu_);
      absl::Status s = direct_ ? loader_->GetDirect(lease_id, pages, dst)
                               : loader_->GetStaged(lease_id, pages, dst, hash, digests);
      loader_->FreeStages();
      return s;
    }

   private:
    UcxLoaderImpl* const loader_;
    const bool direct_;
  };

  absl::Status RunGets(transport::MemoryRegion& local,
                       const std::vector<transport::TransferDesc>& descs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status s = ep_->Run(transport::Direction::kGet, local, *remote_, descs,
                              absl::Milliseconds(options_.transfer_timeout_ms));
    if (s.ok()) return s;
    Disconnect();  // after Run returned, no request still writes into the buffer
    return absl::Status(s.code() == absl::StatusCode::kDeadlineExceeded
                            ? absl::StatusCode::kUnavailable
                            : s.code(),
                        absl::StrCat("UCX get from ", options_.connect.address, ": ", s.message()));
  }

  // Tenant data plane (GetDataPlaneResponse.staged): the daemon copies refs[first, last) into
  // the tenant's staging region (StageForRma, the lease's own checks) and answers where; the
  // gets then read that region. The stage id is freed by the next StageForRma (FreeStages).
  absl::StatusOr<std::vector<uint64_t>> Stage(uint64_t lease_id, std::span<const PageRef> refs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t need = 0;
    for (const PageRef& r : refs) need += StagedSize(r.bytes);
    if (need > dp_.pool_bytes()) {  // one page larger than the region: waiting cannot help
      return absl::ResourceExhaustedError(absl::StrCat(
          "a ", refs[0].bytes, "-byte page does not fit this tenant's ", dp_.pool_bytes(),
          "-byte UCX staging region (the daemon's ucx.tenant_region_mb)"));
    }
    pb::StageForRmaRequest req;
    req.set_lease_id(lease_id);
    for (const PageRef& r : refs) {
      req.add_keys(reinterpret_cast<const char*>(r.key.bytes.data()), r.key.bytes.size());
    }
    for (uint64_t id : to_free_) req.add_free_stage_ids(id);
    pb::StageForRmaResponse resp;
    // A region full of other loaders' stages (same tenant) frees up as they read theirs: retry
    // for at most one transfer timeout. This loader holds no stage here (the request frees its
    // last one first), and a round is at most half a region, so two loaders never wait.
    const auto give_up = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(options_.transfer_timeout_ms);
    for (int wait_ms = 1;; wait_ms = std::min(wait_ms * 2, 50)) {
      auto ctx = rpc_->Context();
      absl::Status s = FromGrpc(rpc_->stub().StageForRma(ctx.get(), req, &resp), "StageForRma");
      if (s.ok()) break;
      if (s.code() != absl::StatusCode::kResourceExhausted ||
          std::chrono::steady_clock::now() >= give_up) {
        return s;
      }
      to_free_.clear();  // freed by the refused call (frees happen first)
      req.clear_free_stage_ids();
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    }
    to_free_.clear();
    if (resp.stage_id() != 0) to_free_.push_back(resp.stage_id());
    if (static_cast<size_t>(resp.pages_size()) != refs.size()) {
      return absl::InternalError("StageForRma: daemon answered a page count != key count");
    }
    std::vector<uint64_t> offsets;
    for (size_t i = 0; i < refs.size(); ++i) {
      const pb::StagedPage& p = resp.pages(static_cast<int>(i));
      if (p.bytes() != refs[i].bytes || p.offset() > dp_.pool_bytes() ||
          p.bytes() > dp_.pool_bytes() - p.offset()) {
        return absl::DataLossError(absl::StrCat("StageForRma: page ", i, " staged as ",
                                                p.bytes(), " bytes at ", p.offset(),
                                                ", outside what was asked"));
      }
      offsets.push_back(p.offset());
    }
    return offsets;
  }

  // Frees the stages this loader has read (one small call; on failure they expire).
  void FreeStages() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (to_free_.empty()) return;
    pb::StageForRmaRequest req;
    for (uint64_t id : to_free_) req.add_free_stage_ids(id);
    pb::StageForRmaResponse resp;
    auto ctx = rpc_->Context();
    if (rpc_->stub().StageForRma(ctx.get(), req, &resp).ok()) to_free_.clear();
    if (to_free_.size() > 64) to_free_.clear();  // the daemon frees them at their deadline
  }

  // Where page i of a round is read from: the pool (pool key) or the tenant's staging region.
  // `budget` bounds the bytes of one round (each staged page takes its size rounded up to
  // kStageAlign); `n` pages starting at `first` fit it.
  static constexpr uint64_t kStageAlign = 256;
  static uint64_t StagedSize(uint64_t bytes) {
    return (bytes + kStageAlign - 1) / kStageAlign * kStageAlign;
  }
  absl::StatusOr<std::vector<uint64_t>> RemoteOffsets(uint64_t lease_id,
                                                      std::span<const PageRef> refs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (dp_.staged()) return Stage(lease_id, refs);
    std::vector<uint64_t> offsets;
    for (const PageRef& r : refs) offsets.push_back(r.offset);
    return offsets;
  }
  // Pages [first, end) that fit one round of at most `limit` bytes (at least one page).
  size_t RoundEnd(std::span<const PageRef> refs, size_t first, uint64_t limit) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t used = 0;
    size_t end = first;
    for (; end < refs.size(); ++end) {
      const uint64_t need = dp_.staged() ? StagedSize(refs[end].bytes) : refs[end].bytes;
      if (end > first && used + need > limit) break;
      used += need;
    }
    return end;
  }
  uint64_t RoundLimit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return dp_.staged() ? dp_.pool_bytes() / 2 : UINT64_MAX;
  }

  absl::Status GetStaged(uint64_t lease_id, std::span<const PageRef> refs,
                         std::span<const std::span<uint8_t>> dst, bool hash,
                         std::vector<std::optional<uint64_t>>* digests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const PageRef& r : refs) {
      if (r.bytes > buffer_.size()) {
        return absl::InvalidArgumentError(absl::StrCat("a ", r.bytes, "-byte page exceeds the ",
                                                       buffer_.size(), "-byte UCX buffer"));
      }
    }
    size_t next = 0;
    while (next < refs.size()) {
      OSCARKV_RETURN_IF_ERROR(EnsureConnected());
      const size_t first = next;
      // Both bounds: this loader's receive buffer, and (staged) the tenant's region.
      size_t end = first;
      for (uint64_t used = 0; end < refs.size() && used + refs[end].bytes <= buffer_.size();
           ++end) {
        used += refs[end].bytes;
      }
      end = std::min(end, RoundEnd(refs, first, RoundLimit()));
      OSCARKV_ASSIGN_OR_RETURN(std::vector<uint64_t> remote,
                               RemoteOffsets(lease_id, refs.subspan(first, end - first)));
      std::vector<transport::TransferDesc> descs;
      size_t used = 0;
      for (size_t i = first; i < end; ++i) {
        descs.push_back({buffer_.data() + used, remote_->base() + remote[i - first],
                         refs[i].bytes});
        used += refs[i].bytes;
      }
      next = end;
      OSCARKV_RETURN_IF_ERROR(RunGets(*region_, descs));
      used = 0;
      for (size_t i = first; i < next; ++i) {
        const std::span<const uint8_t> page(buffer_.data() + used, refs[i].bytes);
        used += refs[i].bytes;
        if (hash) {
          (*digests)[i] = CopyPageWithChecksum(dst[i], page);
        } else {
          std::memcpy(dst[i].data(), page.data(), page.size());
        }
      }
    }
    return absl::OkStatus();
  }

  // RMA straight into caller buffers: one batch per registered region.
  absl::Status GetDirect(uint64_t lease_id, std::span<const PageRef> refs,
                         std::span<const std::span<uint8_t>> dst)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::vector<size_t>> by_region(user_regions_.size());  // page indices
    for (size_t i = 0; i < refs.size(); ++i) {
      size_t r = 0;
      while (r < user_regions_.size() &&
             !user_regions_[r]->Contains(dst[i].data(), refs[i].bytes)) {
        ++r;
      }
      if (r == user_regions_.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dst[", i, "] is not inside a buffer given to RegisterBuffer"));
      }
      by_region[r].push_back(i);
    }
    OSCARKV_RETURN_IF_ERROR(EnsureConnected());
    for (size_t r = 0; r < by_region.size(); ++r) {
      // Rounds of at most one staging region (one round in the pool).
      const std::vector<size_t>& idx = by_region[r];
      for (size_t first = 0; first < idx.size();) {
        std::vector<PageRef> round;
        uint64_t used = 0;
        size_t end = first;
        for (; end < idx.size(); ++end) {
          const uint64_t need = dp_.staged() ? StagedSize(refs[idx[end]].bytes) : 0;
          if (end > first && used + need > RoundLimit()) break;
          used += need;
          round.push_back(refs[idx[end]]);
        }
        OSCARKV_ASSIGN_OR_RETURN(std::vector<uint64_t> remote, RemoteOffsets(lease_id, round));
        std::vector<transport::TransferDesc> descs;
        for (size_t k = first; k < end; ++k) {
          const size_t i = idx[k];
          descs.push_back({dst[i].data(), remote_->base() + remote[k - first], refs[i].bytes});
        }
        OSCARKV_RETURN_IF_ERROR(RunGets(*user_regions_[r], descs));
        first = end;
      }
    }
    return absl::OkStatus();
  }

  const UcxLoaderOptions options_;
  std::unique_ptr<HandleClient> hc_;
  const std::shared_ptr<RpcCore> rpc_;
  Source staged_, direct_;
  absl::Mutex mu_;
  std::unique_ptr<transport::Context> context_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> buffer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<transport::MemoryRegion> region_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<transport::MemoryRegion>> user_regions_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<transport::Worker> worker_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<transport::Endpoint> ep_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<transport::RemoteMemory> remote_ ABSL_GUARDED_BY(mu_);
  pb::GetDataPlaneResponse dp_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> to_free_ ABSL_GUARDED_BY(mu_);  // stages read, not yet freed
  bool peer_detect_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxLoader>> UcxLoader::Connect(const UcxLoaderOptions& options) {
  if (options.buffer_bytes == 0) return absl::InvalidArgumentError("buffer_bytes must be > 0");
  OSCARKV_ASSIGN_OR_RETURN(std::unique_ptr<HandleClient> hc,
                           HandleClient::Connect(options.connect));
  OSCARKV_ASSIGN_OR_RETURN(ClientCore core, CoreOf(hc->client()));
  auto loader = std::make_unique<UcxLoaderImpl>(options, std::move(hc), std::move(core.rpc));
  OSCARKV_RETURN_IF_ERROR(loader->Init());
  return std::unique_ptr<UcxLoader>(std::move(loader));
}

}  // namespace oscarkv::client
