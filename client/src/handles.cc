#include "oscarkv/client/handles.h"

#include <chrono>
#include <cstring>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "client_internal.h"
#include "page_fetch.h"
#include "rpc_core.h"

namespace oscarkv::client {
namespace {

namespace pb = ::oscarkv::v1;

std::string Bytes(const std::array<uint8_t, 16>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

class HandleClientImpl final : public HandleClient {
 public:
  HandleClientImpl(ConnectOptions options, std::unique_ptr<Client> client, ClientCore core)
      : options_(std::move(options)),
        client_(std::move(client)),
        core_(std::move(core)),
        // A handle's lease is read whole, in publish order (its keys may repeat).
        stream_(*core_.rpc, /*by_key=*/false) {}

  Client& client() override { return *client_; }

  absl::StatusOr<uint64_t> Publish(const Codec& codec, const std::string& handle,
                                   std::span<const PageWrite> pages, const std::string& metadata,
                                   uint32_t ttl_ms) override {
    OSCARKV_ASSIGN_OR_RETURN(StoreResult stored, client_->Store(codec, pages));
    if (absl::Status s = stored.ToStatus(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("handle '", handle, "': ", s.message()));
    }
    std::vector<BlockKey> keys;
    keys.reserve(pages.size());
    for (const PageWrite& p : pages) keys.push_back(p.key);
    return PublishKeys(codec, handle, keys, metadata, ttl_ms);
  }

  absl::StatusOr<uint64_t> PublishKeys(const Codec& codec, const std::string& handle,
                                       std::span<const BlockKey> keys, const std::string& metadata,
                                       uint32_t ttl_ms) override {
    pb::PublishHandleRequest req;
    req.set_codec_id(Bytes(codec.id.bytes));
    req.set_handle(handle);
    for (const BlockKey& k : keys) req.add_keys(Bytes(k.bytes));
    req.set_metadata(metadata);
    req.set_ttl_ms(ttl_ms);
    pb::PublishHandleResponse resp;
    auto ctx = core_.rpc->Context();
    OSCARKV_RETURN_IF_ERROR(
        FromGrpc(core_.rpc->stub().PublishHandle(ctx.get(), req, &resp), "PublishHandle"));
    return resp.deadline_unix_ms();
  }

  absl::StatusOr<HandleInfo> Open(const std::string& handle, uint32_t lease_ms) override {
    pb::OpenHandleRequest req;
    req.set_handle(handle);
    req.set_lease_ms(lease_ms);
    pb::OpenHandleResponse resp;
    auto ctx = core_.rpc->Context();
    OSCARKV_RETURN_IF_ERROR(
        FromGrpc(core_.rpc->stub().OpenHandle(ctx.get(), req, &resp), "OpenHandle"));
    HandleInfo info;
    info.name = handle;
    info.lease_id = resp.lease_id();
    info.lease_deadline_unix_ms = resp.lease_deadline_unix_ms();
    info.handle_deadline_unix_ms = resp.handle_deadline_unix_ms();
    info.metadata = resp.metadata();
    auto fail = [&](absl::string_view why) {
      client_->Release(resp.lease_id()).IgnoreError();
      return absl::InternalError(absl::StrCat("OpenHandle: ", why));
    };
    if (resp.codec_id().size() != 16) return fail("daemon returned a malformed codec id");
    std::memcpy(info.codec_id.bytes.data(), resp.codec_id().data(), 16);
    for (const pb::PageRef& r : resp.pages()) {
      auto p = PageRefFromProto(r);
      if (!p.ok()) return fail(p.status().message());
      info.pages.push_back(*p);
    }
    return info;
  }

  absl::StatusOr<HandlePages> Load(const Codec& codec, const std::string& handle) override {
    OSCARKV_ASSIGN_OR_RETURN(HandleInfo info, Open(handle, 0));
    HandlePages out;
    absl::Status s;
    if (!(info.codec_id == codec.id)) {
      s = absl::InvalidArgumentError(absl::StrCat("handle '", info.name, "' holds codec ",
                                                  info.codec_id.Hex(), ", not ", codec.id.Hex()));
    } else {
      PageSource& source = core_.shm != nullptr ? *core_.source : stream_;
      s = FetchVerified(codec, info.lease_id, info.pages, OwnedBuffers(info.pages, &out.pages),
                        source, options_.verify_checksums);
    }
    absl::Status released = client_->Release(info.lease_id);  // expires by itself if this fails
    info.lease_id = 0;
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("handle '", info.name, "': ", s.message()));
    }
    for (const auto& p : out.pages) out.bytes += p.size();
    out.release_status = std::move(released);
    out.info = std::move(info);
    return out;
  }

  absl::Status Close(const std::string& handle) override {
    pb::CloseHandleRequest req;
    req.set_handle(handle);
    pb::CloseHandleResponse resp;
    auto ctx = core_.rpc->Context();
    return FromGrpc(core_.rpc->stub().CloseHandle(ctx.get(), req, &resp), "CloseHandle");
  }

 private:
  const ConnectOptions options_;
  std::unique_ptr<Client> client_;
  const ClientCore core_;
  StreamPageSource stream_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HandleClient>> HandleClient::Connect(const ConnectOptions& options) {
  // A connection of its own: handle RPCs right after a daemon restart must not wait out a
  // subchannel that other Clients share and that is still backing off from the old daemon.
  ConnectOptions own = options;
  own.dedicated_connection = true;
  OSCARKV_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(own));
  OSCARKV_ASSIGN_OR_RETURN(ClientCore core, CoreOf(*c));
  return std::unique_ptr<HandleClient>(new HandleClientImpl(own, std::move(c), std::move(core)));
}

BlockKey HandleClient::HandleTailKey(const Codec& codec, const std::string& handle,
                                     uint32_t index) {
  const std::string salt = "oscarkv.handle/" + handle;
  const uint32_t token = index;
  return ChainBlockKey(codec.id, salt, nullptr, std::span<const uint32_t>(&token, 1));
}

}  // namespace oscarkv::client
