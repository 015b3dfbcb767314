#include "oscarkv/client/ucx_loader.h"

#include <chrono>
#include <cstring>
#include <optional>

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
    return info;
  }

  absl::StatusOr<LoadResult> Load(const Codec& codec, std::span<const BlockKey> keys) override {
    LookupOptions lo;
    lo.pin = true;
    OSCARKV_ASSIGN_OR_RETURN(LookupResult lookup, hc_->client().Lookup(codec, keys, lo));
    LoadResult out;
    absl::Status s = FetchVerified(codec, 0, lookup.pages, OwnedBuffers(lookup.pages, &out.pages),
                                   staged_, options_.connect.verify_checksums);
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
    absl::Status s = FetchVerified(codec, 0, lookup.pages, dst, direct_,
                                   options_.connect.verify_checksums);
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
    absl::Status Fetch(uint64_t, std::span<const PageRef> pages,
                       std::span<const std::span<uint8_t>> dst, bool hash,
                       std::vector<std::optional<uint64_t>>* digests) override {
      absl::MutexLock lock(&loader_->mu_);
      return direct_ ? loader_->GetDirect(pages, dst) : loader_->GetStaged(pages, dst, hash, digests);
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

  absl::Status GetStaged(std::span<const PageRef> refs, std::span<const std::span<uint8_t>> dst,
                         bool hash, std::vector<std::optional<uint64_t>>* digests)
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
      std::vector<transport::TransferDesc> descs;
      size_t used = 0;
      const size_t first = next;
      for (; next < refs.size() && used + refs[next].bytes <= buffer_.size(); ++next) {
        descs.push_back({buffer_.data() + used, remote_->base() + refs[next].offset,
                         refs[next].bytes});
        used += refs[next].bytes;
      }
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
  absl::Status GetDirect(std::span<const PageRef> refs, std::span<const std::span<uint8_t>> dst)
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
      if (by_region[r].empty()) continue;
      std::vector<transport::TransferDesc> descs;
      for (size_t i : by_region[r]) {
        descs.push_back({dst[i].data(), remote_->base() + refs[i].offset, refs[i].bytes});
      }
      OSCARKV_RETURN_IF_ERROR(RunGets(*user_regions_[r], descs));
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
