#include "oscarkv/client/handles.h"

#include <chrono>
#include <cstring>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "shm_mapping.h"

namespace oscarkv::client {
namespace {

namespace pb = ::oscarkv::v1;

absl::Status FromGrpcH(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(std::string(what), ": ", s.error_message()));
}

std::string Bytes(const std::array<uint8_t, 16>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

class HandleClientImpl final : public HandleClient {
 public:
  HandleClientImpl(ConnectOptions options, std::unique_ptr<Client> client)
      : options_(std::move(options)), client_(std::move(client)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    // A channel of its own, with short reconnect backoff: a subchannel shared with older
    // channels may still be backing off from a previous incarnation of the daemon at this
    // address and would fail calls to the restarted one.
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub_ = pb::KvCache::NewStub(
        grpc::CreateCustomChannel(options_.address, grpc::InsecureChannelCredentials(), args));
    const ServerInfo& s = client_->server();
    if (s.data_path == DataPath::kSharedMemory) {
      auto m = ShmMapping::Map(s.shm_path, s.shm_bytes);
      if (m.ok()) shm_ = std::move(*m);
    }
  }

  Client& client() override { return *client_; }

  absl::StatusOr<uint64_t> Publish(const Codec& codec, const std::string& handle,
                                   std::span<const PageWrite> pages, const std::string& metadata,
                                   uint32_t ttl_ms) override {
    OSCARKV_ASSIGN_OR_RETURN(StoreResult stored, client_->Store(codec, pages));
    for (size_t i = 0; i < stored.item_status.size(); ++i) {
      const absl::Status& s = stored.item_status[i];
      if (!s.ok() && s.code() != absl::StatusCode::kAlreadyExists) {
        return absl::Status(s.code(), absl::StrCat("handle '", handle, "': page ", i,
                                                   " could not be stored: ", s.message()));
      }
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
    auto ctx = Context();
    OSCARKV_RETURN_IF_ERROR(
        FromGrpcH(stub_->PublishHandle(ctx.get(), req, &resp), "PublishHandle"));
    return resp.deadline_unix_ms();
  }

  absl::StatusOr<HandleInfo> Open(const std::string& handle, uint32_t lease_ms) override {
    pb::OpenHandleRequest req;
    req.set_handle(handle);
    req.set_lease_ms(lease_ms);
    pb::OpenHandleResponse resp;
    auto ctx = Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpcH(stub_->OpenHandle(ctx.get(), req, &resp), "OpenHandle"));
    HandleInfo info;
    info.name = handle;
    info.lease_id = resp.lease_id();
    info.lease_deadline_unix_ms = resp.lease_deadline_unix_ms();
    info.handle_deadline_unix_ms = resp.handle_deadline_unix_ms();
    info.metadata = resp.metadata();
    auto fail = [&](std::string why) {
      client_->Release(resp.lease_id()).IgnoreError();
      return absl::InternalError(absl::StrCat("OpenHandle: ", why));
    };
    if (resp.codec_id().size() != 16) return fail("daemon returned a malformed codec id");
    std::memcpy(info.codec_id.bytes.data(), resp.codec_id().data(), 16);
    for (const pb::PageRef& r : resp.pages()) {
      if (r.key().size() != 16) return fail("daemon returned a malformed key");
      PageRef p;
      std::memcpy(p.key.bytes.data(), r.key().data(), 16);
      p.offset = r.offset();
      p.bytes = r.bytes();
      p.kind = r.kind() == pb::PAGE_KIND_BF16 ? PageKind::kBf16 : PageKind::kInt2;
      p.token_count = r.token_count();
      info.pages.push_back(p);
    }
    return info;
  }

  absl::StatusOr<HandlePages> Load(const Codec& codec, const std::string& handle) override {
    OSCARKV_ASSIGN_OR_RETURN(HandleInfo info, Open(handle, 0));
    HandlePages out;
    absl::Status s = Copy(codec, info, &out);
    absl::Status released = client_->Release(info.lease_id);  // expires by itself if this fails
    info.lease_id = 0;
    if (!s.ok()) return s;
    out.release_status = std::move(released);
    out.info = std::move(info);
    return out;
  }

  absl::Status Close(const std::string& handle) override {
    pb::CloseHandleRequest req;
    req.set_handle(handle);
    pb::CloseHandleResponse resp;
    auto ctx = Context();
    return FromGrpcH(stub_->CloseHandle(ctx.get(), req, &resp), "CloseHandle");
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(options_.rpc_timeout_ms));
    return ctx;
  }

  absl::Status Copy(const Codec& codec, const HandleInfo& info, HandlePages* out) {
    if (!(info.codec_id == codec.id)) {
      return absl::InvalidArgumentError(absl::StrCat("handle '", info.name, "' holds codec ",
                                                     info.codec_id.Hex(), ", not ",
                                                     codec.id.Hex()));
    }
    out->pages.resize(info.pages.size());
    for (size_t i = 0; i < info.pages.size(); ++i) {
      const uint64_t want = codec.page_bytes(info.pages[i].kind);
      if (info.pages[i].bytes != want) {
        return absl::DataLossError(absl::StrCat("handle page ", i, " is ", info.pages[i].bytes,
                                                " bytes; expected ", want));
      }
      out->pages[i].resize(want);
    }
    if (shm_ != nullptr) {
      for (size_t i = 0; i < info.pages.size(); ++i) {
        const PageRef& p = info.pages[i];
        if (!shm_->Contains(p.offset, p.bytes)) {
          return absl::DataLossError("handle page lies outside the shared-memory segment");
        }
        std::memcpy(out->pages[i].data(), shm_->data() + p.offset, p.bytes);
      }
    } else {
      OSCARKV_RETURN_IF_ERROR(ReadAll(info, out));
    }
    for (size_t i = 0; i < info.pages.size(); ++i) {
      auto hdr = ParsePageHeader(out->pages[i], codec.profile, options_.verify_checksums);
      if (!hdr.ok()) {
        out->pages.clear();
        return absl::DataLossError(absl::StrCat("handle '", info.name, "' page ", i,
                                                " failed verification: ", hdr.status().message()));
      }
      if (hdr->kind != static_cast<uint8_t>(info.pages[i].kind)) {
        out->pages.clear();
        return absl::DataLossError(absl::StrCat("handle page ", i, " has the wrong kind"));
      }
      out->bytes += out->pages[i].size();
    }
    return absl::OkStatus();
  }

  // ReadPages of the whole lease: pages arrive in lease (= publish) order, each as chunks with
  // increasing offsets starting at 0.
  absl::Status ReadAll(const HandleInfo& info, HandlePages* out) {
    pb::ReadRequest req;
    req.set_lease_id(info.lease_id);
    auto ctx = Context();
    auto reader = stub_->ReadPages(ctx.get(), req);
    pb::ReadChunk chunk;
    int64_t page = -1;
    std::vector<uint64_t> got(out->pages.size(), 0);
    absl::Status bad;
    while (reader->Read(&chunk)) {
      if (!bad.ok()) continue;
      if (chunk.offset() == 0) ++page;
      if (page < 0 || page >= static_cast<int64_t>(out->pages.size())) {
        bad = absl::DataLossError("ReadPages: more pages than the handle holds");
        continue;
      }
      std::vector<uint8_t>& dst = out->pages[page];
      if (chunk.key() != Bytes(info.pages[page].key.bytes) || chunk.offset() > dst.size() ||
          chunk.data().size() > dst.size() - chunk.offset()) {
        bad = absl::DataLossError("ReadPages: chunk does not match the handle's page");
        continue;
      }
      std::memcpy(dst.data() + chunk.offset(), chunk.data().data(), chunk.data().size());
      got[page] += chunk.data().size();
    }
    absl::Status s = FromGrpcH(reader->Finish(), "ReadPages");
    if (!bad.ok()) return bad;
    OSCARKV_RETURN_IF_ERROR(s);
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != out->pages[i].size()) {
        return absl::DataLossError(absl::StrCat("ReadPages: handle page ", i, " arrived with ",
                                                got[i], " of ", out->pages[i].size(), " bytes"));
      }
    }
    return absl::OkStatus();
  }

  const ConnectOptions options_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<pb::KvCache::Stub> stub_;
  std::unique_ptr<ShmMapping> shm_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HandleClient>> HandleClient::Connect(const ConnectOptions& options) {
  OSCARKV_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Client::Connect(options));
  return std::unique_ptr<HandleClient>(new HandleClientImpl(options, std::move(c)));
}

BlockKey HandleClient::HandleTailKey(const Codec& codec, const std::string& handle,
                                     uint32_t index) {
  const std::string salt = "oscarkv.handle/" + handle;
  const uint32_t token = index;
  return ChainBlockKey(codec.id, salt, nullptr, std::span<const uint32_t>(&token, 1));
}

}  // namespace oscarkv::client
