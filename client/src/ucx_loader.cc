#include "oscarkv/client/ucx_loader.h"

#include <chrono>
#include <cstring>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/transport/transport.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

namespace oscarkv::client {
namespace {

namespace pb = ::oscarkv::v1;

class UcxLoaderImpl final : public UcxLoader {
 public:
  UcxLoaderImpl(UcxLoaderOptions options, std::unique_ptr<HandleClient> hc)
      : options_(std::move(options)), hc_(std::move(hc)) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    // A channel of its own, with short reconnect backoff: a subchannel shared with older
    // channels may still be backing off from a previous incarnation of the daemon at this
    // address and would fail calls to the restarted one.
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub_ = pb::KvCache::NewStub(grpc::CreateCustomChannel(
        options_.connect.address, grpc::InsecureChannelCredentials(), args));
  }
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
    absl::Status s = Fetch(codec, lookup.pages, &out.pages);
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
    absl::Status s = FetchInto(codec, lookup.pages, dst);
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
                         ? Fetch(codec, info.pages, &out.pages)
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
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(options_.connect.rpc_timeout_ms));
    grpc::Status s = stub_->GetDataPlane(&ctx, pb::GetDataPlaneRequest(), resp);
    if (s.ok()) return absl::OkStatus();
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("GetDataPlane: ", s.error_message()));
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

  // RMA gets of `refs` into the registered buffer (rounds of at most buffer_bytes), each page
  // verified, then copied into *pages.
  absl::Status Fetch(const Codec& codec, const std::vector<PageRef>& refs,
                     std::vector<std::vector<uint8_t>>* pages) {
    absl::MutexLock lock(&mu_);
    pages->clear();
    pages->reserve(refs.size());
    for (const PageRef& r : refs) {
      if (r.bytes != codec.page_bytes(r.kind)) {
        return absl::DataLossError(absl::StrCat("daemon says a ", PageKindName(r.kind), " page is ",
                                                r.bytes, " bytes; the codec's is ",
                                                codec.page_bytes(r.kind)));
      }
      if (r.bytes > buffer_.size()) {
        return absl::InvalidArgumentError(absl::StrCat("a ", r.bytes, "-byte page exceeds the ",
                                                       buffer_.size(), "-byte UCX buffer"));
      }
    }
    size_t next = 0;
    while (next < refs.size()) {
      OSCARKV_RETURN_IF_ERROR(EnsureConnected());
      std::vector<transport::TransferDesc> descs;
      size_t used = 0, first = next;
      for (; next < refs.size() && used + refs[next].bytes <= buffer_.size(); ++next) {
        descs.push_back({buffer_.data() + used, remote_->base() + refs[next].offset,
                         refs[next].bytes});
        used += refs[next].bytes;
      }
      absl::Status s = ep_->Run(transport::Direction::kGet, *region_, *remote_, descs,
                                absl::Milliseconds(options_.transfer_timeout_ms));
      if (!s.ok()) {
        pages->clear();
        Disconnect();  // after Run returned, no request still writes into the buffer
        return absl::Status(s.code() == absl::StatusCode::kDeadlineExceeded
                                ? absl::StatusCode::kUnavailable
                                : s.code(),
                            absl::StrCat("UCX get from ", options_.connect.address, ": ",
                                         s.message()));
      }
      used = 0;
      for (size_t i = first; i < next; ++i) {
        std::span<const uint8_t> page(buffer_.data() + used, refs[i].bytes);
        used += refs[i].bytes;
        auto hdr = ParsePageHeader(page, codec.profile, options_.connect.verify_checksums);
        if (!hdr.ok() || hdr->kind != static_cast<uint8_t>(refs[i].kind)) {
          pages->clear();
          return absl::DataLossError(absl::StrCat(
              "page ", i, " fetched by UCX failed verification: ",
              hdr.ok() ? std::string("wrong kind") : std::string(hdr.status().message())));
        }
        pages->emplace_back(page.begin(), page.end());
      }
    }
    return absl::OkStatus();
  }

  // RMA straight into caller buffers: one batch per registered region.
  absl::Status FetchInto(const Codec& codec, const std::vector<PageRef>& refs,
                         std::span<const std::span<uint8_t>> dst) {
    absl::MutexLock lock(&mu_);
    std::vector<std::vector<size_t>> by_region(user_regions_.size());  // page indices
    for (size_t i = 0; i < refs.size(); ++i) {
      if (refs[i].bytes != codec.page_bytes(refs[i].kind)) {
        return absl::DataLossError("daemon's page size does not match the codec");
      }
      if (dst[i].size() < refs[i].bytes) {
        return absl::InvalidArgumentError(absl::StrCat("dst[", i, "] holds ", dst[i].size(),
                                                       " bytes; the page is ", refs[i].bytes));
      }
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
      absl::Status s = ep_->Run(transport::Direction::kGet, *user_regions_[r], *remote_, descs,
                                absl::Milliseconds(options_.transfer_timeout_ms));
      if (!s.ok()) {
        Disconnect();
        return absl::Status(s.code() == absl::StatusCode::kDeadlineExceeded
                                ? absl::StatusCode::kUnavailable
                                : s.code(),
                            absl::StrCat("UCX get from ", options_.connect.address, ": ",
                                         s.message()));
      }
    }
    for (size_t i = 0; i < refs.size(); ++i) {
      std::span<const uint8_t> page(dst[i].data(), refs[i].bytes);
      auto hdr = ParsePageHeader(page, codec.profile, options_.connect.verify_checksums);
      if (!hdr.ok() || hdr->kind != static_cast<uint8_t>(refs[i].kind)) {
        return absl::DataLossError(absl::StrCat(
            "page ", i, " fetched by UCX failed verification: ",
            hdr.ok() ? std::string("wrong kind") : std::string(hdr.status().message())));
      }
    }
    return absl::OkStatus();
  }

  const UcxLoaderOptions options_;
  std::unique_ptr<HandleClient> hc_;
  std::unique_ptr<pb::KvCache::Stub> stub_;
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
  auto loader = std::make_unique<UcxLoaderImpl>(options, std::move(hc));
  OSCARKV_RETURN_IF_ERROR(loader->Init());
  return std::unique_ptr<UcxLoader>(std::move(loader));
}

}  // namespace oscarkv::client
