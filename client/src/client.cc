// The gRPC + shared-memory implementation of oscarkv::client::Client.
#include "oscarkv/client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/kernels/page_checksum.h"
#include "oscarkv/util/host_port.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "local_channel.h"
#include "shm_mapping.h"
#include "task_pool.h"

namespace oscarkv::client {

const char* DataPathName(DataPath path) {
  switch (path) {
    case DataPath::kAuto: return "auto";
    case DataPath::kSharedMemory: return "shm";
    case DataPath::kGrpc: return "grpc";
  }
  return "?";
}

const char* LookupPathName(LookupPath path) {
  switch (path) {
    case LookupPath::kAuto: return "auto";
    case LookupPath::kLocal: return "local";
    case LookupPath::kGrpc: return "grpc";
  }
  return "?";
}

namespace {

namespace pb = ::oscarkv::v1;
namespace local = ::oscarkv::v1::local;

// The one adapter from grpc::Status to absl::Status: codes map one-to-one.
absl::Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(std::string(what), ": ", s.error_message()));
}

absl::Status FromItem(const pb::ItemStatus& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()), s.message());
}

std::string KeyBytes(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}
std::string IdBytes(const CodecId& id) {
  return std::string(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
}

absl::StatusOr<BlockKey> KeyFromBytes(const std::string& s) {
  BlockKey k;
  if (s.size() != k.bytes.size()) {
    return absl::InternalError(absl::StrCat("daemon returned a ", s.size(), "-byte key"));
  }
  std::memcpy(k.bytes.data(), s.data(), s.size());
  return k;
}

pb::PageKind ToProto(PageKind k) {
  return k == PageKind::kInt2 ? pb::PAGE_KIND_INT2 : pb::PAGE_KIND_BF16;
}

void ToProto(const CodecProfile& p, pb::CodecProfile* out) {
  out->set_model_id(p.model_id);
  out->set_model_revision(p.model_revision);
  out->set_num_layers(p.num_layers);
  out->set_num_kv_heads(p.num_kv_heads);
  out->set_tp_rank(p.tp_rank);
  out->set_tp_size(p.tp_size);
  out->set_head_dim(p.head_dim);
  out->set_page_tokens(p.page_tokens);
  out->set_group_size(p.group_size);
  out->set_scale_dtype(static_cast<uint32_t>(p.scale_dtype));
  out->set_sink_tokens(p.sink_tokens);
  out->set_recent_tokens(p.recent_tokens);
  bool any = false;
  for (uint8_t b : p.rotation_digest) any |= b != 0;
  if (any) {
    out->set_rotation_digest(
        std::string(reinterpret_cast<const char*>(p.rotation_digest.data()), 32));
  }
}

class GrpcClient final : public Client {
 public:
  GrpcClient(ConnectOptions options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        channel_(std::move(channel)),
        stub_(pb::KvCache::NewStub(channel_)) {}

  ~GrpcClient() override {
    pool_.reset();  // drain async work before unmapping
    // Callbacks in flight use `this`; a callback's last access to it is its decrement.
    while (inflight_.load(std::memory_order_acquire) != 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    absl::MutexLock lock(&calls_mu_);
    for (LookupCall* c : free_calls_) delete c;
  }

  absl::Status Init() {
    pb::HandshakeRequest req;
    req.set_wire_version(pb::WIRE_VERSION_1);
    req.set_client_name(options_.client_name);
    pb::HandshakeResponse resp;
    auto ctx = Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpc(stub_->Handshake(ctx.get(), req, &resp),
                                     absl::StrCat("handshake with oscarkvd at ", options_.address)));
    if (resp.wire_version() != pb::WIRE_VERSION_1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "oscarkvd at ", options_.address, " speaks wire version ", resp.wire_version(),
          ", this client ", int{pb::WIRE_VERSION_1}));
    }
    server_.server_version = resp.server_version();
    server_.node_id = resp.node_id();
    server_.shm_path = resp.shm_path();
    server_.shm_bytes = resp.shm_bytes();
    server_.max_batch = resp.max_batch() ? resp.max_batch() : 1024;
    if (options_.data_path != DataPath::kGrpc) {
      auto m = ShmMapping::Map(server_.shm_path, server_.shm_bytes);
      if (m.ok()) {
        shm_ = std::move(*m);
      } else if (options_.data_path == DataPath::kSharedMemory) {
        return m.status();
      }
    }
    server_.data_path = shm_ ? DataPath::kSharedMemory : DataPath::kGrpc;
    server_.local_socket = resp.local_socket();
    if (options_.lookup_path != LookupPath::kGrpc) {
      if (server_.local_socket.empty()) {
        if (options_.lookup_path == LookupPath::kLocal) {
          return absl::FailedPreconditionError(absl::StrCat(
              "oscarkvd at ", options_.address, " serves no local control socket (--local-socket off?)"));
        }
      } else {
        auto ch = LocalChannel::Open(server_.local_socket, options_.client_name, resp.instance_id(),
                                     options_.rpc_timeout_ms, !options_.dedicated_connection);
        if (ch.ok()) {
          local_ = std::move(*ch);
        } else if (options_.lookup_path == LookupPath::kLocal) {
          return absl::Status(ch.status().code(),
                              absl::StrCat("local control socket of oscarkvd at ", options_.address,
                                           ": ", ch.status().message()));
        }  // kAuto: another host (or no access): gRPC
      }
    }
    server_.lookup_path = local_ ? LookupPath::kLocal : LookupPath::kGrpc;
    pool_ = std::make_unique<TaskPool>(options_.async_threads);
    return absl::OkStatus();
  }

  const ServerInfo& server() const override { return server_; }
  const ConnectOptions& options() const override { return options_; }

  absl::StatusOr<uint64_t> RenewLease(uint64_t lease_id, uint32_t lease_ms) override {
    pb::RenewLeaseRequest req;
    req.set_lease_id(lease_id);
    req.set_lease_ms(lease_ms);
    pb::RenewLeaseResponse resp;
    auto ctx = Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpc(stub_->RenewLease(ctx.get(), req, &resp), "RenewLease"));
    return resp.lease_deadline_unix_ms();
  }

  absl::StatusOr<Codec> RegisterCodec(const CodecProfile& profile) override {
    OSCARKV_RETURN_IF_ERROR(profile.Validate());
    pb::RegisterCodecRequest req;
    ToProto(profile, req.mutable_profile());
    pb::RegisterCodecResponse resp;
    auto ctx = Context();
    OSCARKV_RETURN_IF_ERROR(
        FromGrpc(stub_->RegisterCodec(ctx.get(), req, &resp), "RegisterCodec"));
    Codec c;
    c.profile = profile;
    c.id = profile.Id();
    if (resp.codec_id() != IdBytes(c.id)) {
      return absl::InternalError(
          "daemon computed a different codec id than docs/FORMAT.md §2 (version skew?)");
    }
    c.int2_page_bytes = resp.int2_page_bytes();
    c.bf16_page_bytes = resp.bf16_page_bytes();
    if (c.int2_page_bytes != GeometryFor(profile, PageKind::kInt2).page_bytes() ||
        c.bf16_page_bytes != GeometryFor(profile, PageKind::kBf16).page_bytes()) {
      return absl::InternalError("daemon's page sizes disagree with the page format");
    }
    return c;
  }

  absl::StatusOr<LookupResult> Lookup(const Codec& codec, std::span<const BlockKey> keys,
                                      const LookupOptions& opts) override {
    LookupResult out;
    for (size_t begin = 0; begin < keys.size(); begin += server_.max_batch) {
      const size_t n = std::min<size_t>(server_.max_batch, keys.size() - begin);
      pb::LookupResponse resp;
      absl::Status s = LookupChunk(codec, keys.subspan(begin, n), opts, &resp);
      if (!s.ok()) {
        Release(out).IgnoreError();
        return s;
      }
      out.matched += resp.matched();
      if (resp.lease_id() != 0) {
        out.lease_ids.push_back(resp.lease_id());
        out.lease_deadline_unix_ms = out.lease_deadline_unix_ms == 0
                                         ? resp.lease_deadline_unix_ms()
                                         : std::min(out.lease_deadline_unix_ms,
                                                    resp.lease_deadline_unix_ms());
      }
      for (const pb::PageRef& r : resp.pages()) {
        auto ref = FromProto(r);
        if (!ref.ok()) {
          Release(out).IgnoreError();
          return ref.status();
        }
        out.pages.push_back(*ref);
      }
      if (resp.matched() < n) break;
    }
    return out;
  }

  void LookupAsync(const Codec& codec, std::span<const BlockKey> keys, const LookupOptions& opts,
                   std::function<void(absl::StatusOr<LookupResult>)> done) override {
    if (keys.size() > server_.max_batch ||
        (local_ != nullptr && keys.size() > local::kMaxLookupKeys)) {
      std::vector<BlockKey> copy(keys.begin(), keys.end());
      Submit([this, codec, copy = std::move(copy), opts, done = std::move(done)] {
        done(Lookup(codec, copy, opts));
      });
      return;
    }
    if (keys.empty()) {
      done(LookupResult{});
      return;
    }
    inflight_.fetch_add(1, std::memory_order_relaxed);
    if (local_ != nullptr) {
      LookupAsyncLocal(codec, keys, opts, std::move(done));
      return;
    }
    LookupCall* call = TakeCall();
    call->ctx = Context();
    call->n = keys.size();
    call->pin = opts.pin;
    call->done = std::move(done);
    call->req.set_codec_id(IdBytes(codec.id));
    for (const BlockKey& k : keys) {
      call->req.add_keys()->assign(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
    }
    call->req.set_pin(opts.pin);
    call->req.set_lease_ms(opts.lease_ms);
    stub_->async()->Lookup(call->ctx.get(), &call->req, &call->resp,
                           [this, call](grpc::Status gs) {
                             auto done = std::move(call->done);
                             absl::StatusOr<LookupResult> r =
                                 ToResult(FromGrpc(gs, "Lookup"), call->resp, call->n, call->pin);
                             ReturnCall(call);
                             done(std::move(r));
                             inflight_.fetch_sub(1, std::memory_order_acq_rel);
                           });
  }

  // LookupAsync over the local socket: pipelined on its async connection; `done` runs on its
  // reader thread. The caller counted the call in inflight_.
  void LookupAsyncLocal(const Codec& codec, std::span<const BlockKey> keys,
                        const LookupOptions& opts,
                        std::function<void(absl::StatusOr<LookupResult>)> done) {
    thread_local pb::LookupRequest req;  // reused: keeps its key strings' buffers
    req.Clear();
    req.set_codec_id(IdBytes(codec.id));
    for (const BlockKey& k : keys) {
      req.add_keys()->assign(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
    }
    req.set_pin(opts.pin);
    req.set_lease_ms(opts.lease_ms);
    local_->CallAsync(
        local::Method::kLookup, req, "Lookup",
        [this, n = keys.size(), pin = opts.pin, done = std::move(done)](
            absl::Status s, const char* body, size_t body_bytes) {
          thread_local pb::LookupResponse resp;
          resp.Clear();
          if (s.ok() && !resp.ParseFromArray(body, static_cast<int>(body_bytes))) {
            s = absl::InternalError("Lookup: unparsable local answer");
          }
          absl::StatusOr<LookupResult> r = ToResult(std::move(s), resp, n, pin);
          done(std::move(r));
          inflight_.fetch_sub(1, std::memory_order_acq_rel);
        });
  }

  // LookupResult of one single-chunk Lookup answer.
  absl::StatusOr<LookupResult> ToResult(absl::Status s, const pb::LookupResponse& resp, size_t n,
                                        bool pin) {
    if (s.ok() && (resp.matched() > n || (pin && resp.pages_size() != int(resp.matched())))) {
      s = absl::InternalError("Lookup: daemon's answer is inconsistent with the request");
    }
    if (!s.ok()) {
      if (resp.lease_id() != 0) Release(resp.lease_id()).IgnoreError();
      return s;
    }
    LookupResult out;
    out.matched = resp.matched();
    if (resp.lease_id() != 0) {
      out.lease_ids.push_back(resp.lease_id());
      out.lease_deadline_unix_ms = resp.lease_deadline_unix_ms();
    }
    for (const pb::PageRef& r : resp.pages()) {
      auto ref = FromProto(r);
      if (!ref.ok()) return ref.status();
      out.pages.push_back(*ref);
    }
    return out;
  }

  absl::Status Release(const LookupResult& lookup) override {
    absl::Status first;
    for (uint64_t id : lookup.lease_ids) first.Update(Release(id));
    return first;
  }

  absl::Status Release(uint64_t lease_id) override {
    if (lease_id == 0) return absl::OkStatus();
    pb::ReleaseRequest req;
    req.set_lease_id(lease_id);
    pb::ReleaseResponse resp;
    if (local_ != nullptr) return local_->Call(local::Method::kRelease, req, &resp, "Release");
    auto ctx = Context();
    return FromGrpc(stub_->Release(ctx.get(), req, &resp), "Release");
  }

  absl::StatusOr<StoreResult> Store(const Codec& codec,
                                    std::span<const PageWrite> pages) override {
    StoreResult out;
    out.item_status.assign(pages.size(), absl::OkStatus());
    // Client-side checks first, so a bad page never takes a pool slot.
    std::vector<size_t> valid;
    valid.reserve(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      absl::Status s = CheckPage(codec, pages[i].kind, pages[i].bytes, /*checksum=*/false);
      if (s.ok()) {
        valid.push_back(i);
      } else {
        out.item_status[i] = s;
      }
    }
    // Keys another reservation holds uncommitted (ABORTED: in progress) are asked again with a
    // short backoff until that one commits (then they are deduplicated), fails or the wait
    // runs out (then they are reported as not stored, with the daemon's ABORTED).
    const auto give_up = std::chrono::steady_clock::now() +
                         std::chrono::milliseconds(std::clamp<int64_t>(
                             options_.store_in_progress_wait_ms, 0, options_.rpc_timeout_ms));
    auto backoff = std::chrono::microseconds(500);
    std::vector<size_t> todo = std::move(valid);
    while (true) {
      for (size_t begin = 0; begin < todo.size(); begin += server_.max_batch) {
        const size_t n = std::min<size_t>(server_.max_batch, todo.size() - begin);
        OSCARKV_RETURN_IF_ERROR(StoreChunk(
            codec, pages, std::span<const size_t>(todo).subspan(begin, n), &out.item_status));
      }
      std::vector<size_t> busy;
      for (size_t i : todo) {
        if (absl::IsAborted(out.item_status[i])) busy.push_back(i);
      }
      const auto now = std::chrono::steady_clock::now();
      if (busy.empty() || now >= give_up) break;
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(backoff,
                                                                               give_up - now));
      backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
      todo = std::move(busy);
    }
    for (const absl::Status& s : out.item_status) {
      if (s.ok()) {
        ++out.stored;
      } else if (absl::IsAlreadyExists(s)) {
        ++out.deduplicated;
      } else {
        ++out.failed;
      }
    }
    return out;
  }

  absl::StatusOr<LoadResult> Load(const Codec& codec, std::span<const BlockKey> keys) override {
    LoadResult out;
    OSCARKV_RETURN_IF_ERROR(LoadChunks(codec, keys, nullptr, &out.pages, &out.kinds,
                                       /*sizes=*/nullptr, &out.release_status));
    out.matched = static_cast<uint32_t>(out.pages.size());
    for (const auto& p : out.pages) out.bytes += p.size();
    return out;
  }

  absl::StatusOr<uint32_t> LoadInto(const Codec& codec, std::span<const BlockKey> keys,
                                    std::span<const std::span<uint8_t>> dst,
                                    std::vector<uint64_t>* bytes_out) override {
    if (dst.size() < keys.size()) {
      return absl::InvalidArgumentError(absl::StrCat("LoadInto: ", keys.size(), " keys but ",
                                                     dst.size(), " destination buffers"));
    }
    std::vector<uint64_t> sizes;
    OSCARKV_RETURN_IF_ERROR(LoadChunks(codec, keys, &dst, nullptr, nullptr, &sizes));
    const uint32_t matched = static_cast<uint32_t>(sizes.size());
    if (bytes_out != nullptr) *bytes_out = std::move(sizes);
    return matched;
  }

  absl::StatusOr<Stats> GetStats() override {
    pb::StatsRequest req;
    pb::StatsResponse r;
    auto ctx = Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpc(stub_->Stats(ctx.get(), req, &r), "Stats"));
    Stats s;
    s.pool_bytes = r.pool_bytes();
    s.pool_used_bytes = r.pool_used_bytes();
    s.pages = r.pages();
    s.pinned_pages = r.pinned_pages();
    s.leases = r.leases();
    s.reservations = r.reservations();
    s.lookups = r.lookups();
    s.hits = r.hits();
    s.misses = r.misses();
    s.evictions = r.evictions();
    s.bytes_written = r.bytes_written();
    s.bytes_read = r.bytes_read();
    s.codecs = r.codecs();
    s.node_id = r.node_id();
    s.server_version = r.server_version();
    return s;
  }

  absl::StatusOr<std::vector<absl::Status>> Delete(const Codec& codec,
                                                   std::span<const BlockKey> keys) override {
    std::vector<absl::Status> out;
    for (size_t begin = 0; begin < keys.size(); begin += server_.max_batch) {
      const size_t n = std::min<size_t>(server_.max_batch, keys.size() - begin);
      pb::DeleteRequest req;
      req.set_codec_id(IdBytes(codec.id));
      for (const BlockKey& k : keys.subspan(begin, n)) req.add_keys(KeyBytes(k));
      pb::DeleteResponse resp;
      auto ctx = Context();
      OSCARKV_RETURN_IF_ERROR(FromGrpc(stub_->Delete(ctx.get(), req, &resp), "Delete"));
      if (static_cast<size_t>(resp.results_size()) != n) {
        return absl::InternalError("Delete: daemon returned a result count != key count");
      }
      for (const auto& r : resp.results()) out.push_back(FromItem(r));
    }
    return out;
  }

  absl::StatusOr<uint64_t> Clear(const CodecId* codec_id, bool include_pinned) override {
    pb::ClearRequest req;
    if (codec_id != nullptr) req.set_codec_id(IdBytes(*codec_id));
    req.set_include_pinned(include_pinned);
    pb::ClearResponse resp;
    auto ctx = Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpc(stub_->Clear(ctx.get(), req, &resp), "Clear"));
    return resp.pages_removed();
  }

 protected:
  void Submit(std::function<void()> task) override { pool_->Submit(std::move(task)); }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(options_.rpc_timeout_ms));
    return ctx;
  }

  static absl::StatusOr<PageRef> FromProto(const pb::PageRef& r) {
    PageRef out;
    OSCARKV_ASSIGN_OR_RETURN(out.key, KeyFromBytes(r.key()));
    out.offset = r.offset();
    out.bytes = r.bytes();
    out.kind = r.kind() == pb::PAGE_KIND_BF16 ? PageKind::kBf16 : PageKind::kInt2;
    out.token_count = r.token_count();
    return out;
  }

  // Size, header, codec id, shape and (optionally) checksum of one page of `codec`.
  static absl::Status CheckPage(const Codec& codec, PageKind kind, std::span<const uint8_t> page,
                                bool checksum) {
    const uint64_t want = codec.page_bytes(kind);
    if (page.size() != want) {
      return absl::InvalidArgumentError(absl::StrCat("page is ", page.size(), " bytes; a ",
                                                     PageKindName(kind), " page of codec ",
                                                     codec.id.Hex(), " is ", want));
    }
    OSCARKV_ASSIGN_OR_RETURN(PageHeader h, ParsePageHeader(page, codec.profile, checksum));
    if (h.kind != static_cast<uint8_t>(kind)) {
      return absl::InvalidArgumentError(absl::StrCat("page header says kind ", int{h.kind},
                                                     ", stored as ", PageKindName(kind)));
    }
    return absl::OkStatus();
  }

  absl::Status LookupChunk(const Codec& codec, std::span<const BlockKey> keys,
                           const LookupOptions& opts, pb::LookupResponse* resp) {
    // Reused per thread: a cleared request keeps its key strings' buffers (no malloc per key).
    thread_local pb::LookupRequest req;
    req.Clear();
    req.set_codec_id(IdBytes(codec.id));
    for (const BlockKey& k : keys) {
      req.add_keys()->assign(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
    }
    req.set_pin(opts.pin);
    req.set_lease_ms(opts.lease_ms);
    if (local_ != nullptr && keys.size() <= local::kMaxLookupKeys) {
      OSCARKV_RETURN_IF_ERROR(local_->Call(local::Method::kLookup, req, resp, "Lookup"));
    } else {
      auto ctx = Context();
      OSCARKV_RETURN_IF_ERROR(FromGrpc(stub_->Lookup(ctx.get(), req, resp), "Lookup"));
    }
    if (resp->matched() > keys.size() || (opts.pin && resp->pages_size() != int(resp->matched()))) {
      Release(resp->lease_id()).IgnoreError();
      return absl::InternalError("Lookup: daemon's answer is inconsistent with the request");
    }
    return absl::OkStatus();
  }

  // Reserve + write + commit for the pages `idx` of `pages` (at most max_batch). Every page of
  // `idx` ends with its status set: OK (committed by this call), ALREADY_EXISTS (committed
  // before), ABORTED (reserved by a reservation that has not committed it: in progress), or why
  // it was not stored. Whatever this call reserved and did not commit is aborted before it
  // returns, so a failed page never leaves a reservation behind that a later Store of the key
  // would trip over.
  absl::Status StoreChunk(const Codec& codec, std::span<const PageWrite> pages,
                          std::span<const size_t> idx, std::vector<absl::Status>* status) {
    pb::ReserveRequest req;
    req.set_codec_id(IdBytes(codec.id));
    for (size_t i : idx) {
      auto* item = req.add_items();
      item->set_key(KeyBytes(pages[i].key));
      item->set_kind(ToProto(pages[i].kind));
    }
    pb::ReserveResponse resp;
    {
      auto ctx = Context();
      OSCARKV_RETURN_IF_ERROR(FromGrpc(stub_->Reserve(ctx.get(), req, &resp), "Reserve"));
    }
    const uint64_t reservation = resp.reservation_id();
    if (static_cast<size_t>(resp.results_size()) != idx.size()) {
      if (reservation != 0) AbortReservation(reservation);
      return absl::InternalError("Reserve: daemon returned a result count != item count");
    }
    std::vector<size_t> reserved;  // indexes into `pages`
    std::vector<pb::PageRef> slots;
    for (size_t j = 0; j < idx.size(); ++j) {
      const auto& r = resp.results(static_cast<int>(j));
      if (r.status().code() != 0) {
        (*status)[idx[j]] = FromItem(r.status());
        continue;
      }
      if (r.slot().bytes() != pages[idx[j]].bytes.size()) {
        (*status)[idx[j]] = absl::InternalError(absl::StrCat(
            "daemon reserved a ", r.slot().bytes(), "-byte slot for a ",
            pages[idx[j]].bytes.size(), "-byte page"));
        continue;  // left uncommitted: aborted below
      }
      reserved.push_back(idx[j]);
      slots.push_back(r.slot());
    }
    if (reserved.empty()) {
      if (reservation != 0) AbortReservation(reservation);
      return absl::OkStatus();
    }
    // Over shared memory each page is copied into its slot and hashed in the same pass; a page
    // whose bytes do not match its checksum is not committed (DATA_LOSS to this caller).
    std::vector<size_t> to_commit;
    if (shm_) {
      for (size_t j = 0; j < reserved.size(); ++j) {
        absl::Status w = WriteShmVerified(pages[reserved[j]].bytes, slots[j]);
        if (w.ok()) {
          to_commit.push_back(reserved[j]);
        } else {
          (*status)[reserved[j]] = w;
        }
      }
    } else {
      absl::Status written = WriteStream(reservation, pages, reserved);
      if (written.ok()) {
        to_commit = reserved;
      } else {
        for (size_t i : reserved) (*status)[i] = written;
      }
    }
    if (to_commit.empty()) {
      AbortReservation(reservation);
      return absl::OkStatus();
    }
    pb::CommitRequest commit;
    commit.set_reservation_id(reservation);
    for (size_t i : to_commit) commit.add_keys(KeyBytes(pages[i].key));
    // Shared-memory pages were hashed here over the slot's bytes: the daemon checks their
    // headers without a second pass over the bytes. Streamed pages it verifies itself.
    commit.set_checksums_verified(shm_ != nullptr);
    pb::CommitResponse cresp;
    grpc::Status gs;
    {
      auto ctx = Context();
      gs = stub_->Commit(ctx.get(), commit, &cresp);
    }
    bool all_committed = to_commit.size() == reserved.size();
    if (!gs.ok()) {
      for (size_t i : to_commit) (*status)[i] = FromGrpc(gs, "Commit");
      all_committed = false;
    } else if (static_cast<size_t>(cresp.results_size()) != to_commit.size()) {
      for (size_t i : to_commit) {
        (*status)[i] = absl::InternalError("Commit: daemon returned a result count != key count");
      }
      all_committed = false;
    } else {
      for (size_t j = 0; j < to_commit.size(); ++j) {
        absl::Status s = FromItem(cresp.results(static_cast<int>(j)));
        all_committed &= s.ok();
        (*status)[to_commit[j]] = std::move(s);
      }
    }
    // Aborting releases only what is not committed; committed pages stay.
    if (!all_committed) AbortReservation(reservation);
    return absl::OkStatus();
  }

  void AbortReservation(uint64_t id) {
    pb::AbortRequest req;
    req.set_reservation_id(id);
    pb::AbortResponse resp;
    auto ctx = Context();
    stub_->Abort(ctx.get(), req, &resp);  // best effort: reservations expire anyway
  }

  // Copies one page into its reserved pool slot, hashing it as it goes (one pass); DATA_LOSS
  // when the bytes in the slot do not match the page's checksum.
  absl::Status WriteShmVerified(std::span<const uint8_t> src, const pb::PageRef& slot) {
    if (!shm_->Contains(slot.offset(), src.size())) {
      return absl::InternalError("daemon reserved a slot outside its shared-memory segment");
    }
    return CopyPageVerified(std::span<uint8_t>(shm_->data() + slot.offset(), src.size()), src);
  }

  absl::Status WriteStream(uint64_t reservation_id, std::span<const PageWrite> pages,
                           const std::vector<size_t>& reserved) {
    auto ctx = Context();
    pb::WriteResponse resp;
    auto writer = stub_->WritePages(ctx.get(), &resp);
    const size_t chunk = std::max<uint32_t>(options_.stream_chunk_bytes, 4096);
    pb::WriteChunk msg;
    bool open = true;  // false once the stream broke; Finish() says why
    for (size_t i = 0; open && i < reserved.size(); ++i) {
      const auto& src = pages[reserved[i]].bytes;
      for (size_t off = 0; open && off < src.size(); off += chunk) {
        msg.set_reservation_id(reservation_id);
        msg.set_key(KeyBytes(pages[reserved[i]].key));
        msg.set_offset(off);
        msg.set_data(src.data() + off, std::min(chunk, src.size() - off));
        open = writer->Write(msg);
      }
    }
    if (open) writer->WritesDone();
    return FromGrpc(writer->Finish(), "WritePages");
  }

  // Copies the longest cached prefix of `keys` out of the daemon: into (*dst)[i] when dst is
  // given, else into owned vectors. Leases are held only for the copy of their chunk.
  // `release_status` (optional) receives the first failure to release a lease after a copy.
  absl::Status LoadChunks(const Codec& codec, std::span<const BlockKey> keys,
                          const std::span<const std::span<uint8_t>>* dst,
                          std::vector<std::vector<uint8_t>>* owned, std::vector<PageKind>* kinds,
                          std::vector<uint64_t>* sizes = nullptr,
                          absl::Status* release_status = nullptr) {
    size_t loaded = 0;
    for (size_t begin = 0; begin < keys.size(); begin += server_.max_batch) {
      const size_t n = std::min<size_t>(server_.max_batch, keys.size() - begin);
      pb::LookupResponse resp;
      OSCARKV_RETURN_IF_ERROR(
          LookupChunk(codec, keys.subspan(begin, n), LookupOptions{.pin = true}, &resp));
      const size_t m = resp.matched();
      std::vector<std::span<uint8_t>> out(m);
      for (size_t j = 0; j < m; ++j) {
        const uint64_t bytes = resp.pages(static_cast<int>(j)).bytes();
        if (dst != nullptr) {
          if ((*dst)[loaded + j].size() < bytes) {
            Release(resp.lease_id()).IgnoreError();
            return absl::InvalidArgumentError(absl::StrCat(
                "LoadInto: buffer ", loaded + j, " holds ", (*dst)[loaded + j].size(),
                " bytes, the page is ", bytes));
          }
          out[j] = (*dst)[loaded + j].subspan(0, bytes);
        } else {
          owned->emplace_back(bytes);
          out[j] = std::span<uint8_t>(owned->back());
        }
      }
      // Checksums of the bytes as the copy wrote them (one pass), where the copy hashed them.
      std::vector<std::optional<uint64_t>> digests(m);
      const bool verify = options_.verify_checksums;
      absl::Status s = m == 0 ? absl::OkStatus()
                       : shm_  ? ReadShm(resp, out, verify, &digests)
                               : ReadStream(resp, keys.subspan(begin, m), out, verify, &digests);
      // Synchronous on purpose: when Load returns, the pages are no longer pinned (a Delete or
      // Clear right after it behaves as expected). A failed release only means the lease runs
      // to its deadline; the caller learns of it through `release_status`.
      absl::Status released = Release(resp.lease_id());
      if (release_status != nullptr && release_status->ok()) *release_status = released;
      OSCARKV_RETURN_IF_ERROR(s);
      for (size_t j = 0; j < m; ++j) {
        const PageKind kind = resp.pages(static_cast<int>(j)).kind() == pb::PAGE_KIND_BF16
                                  ? PageKind::kBf16
                                  : PageKind::kInt2;
        absl::Status c = CheckPage(codec, kind, out[j], verify && !digests[j].has_value());
        if (c.ok() && verify && digests[j].has_value() &&
            *digests[j] != StoredPageChecksum(out[j])) {
          c = absl::DataLossError("page checksum mismatch: the page is corrupt");
        }
        if (!c.ok()) {
          return absl::Status(c.code(), absl::StrCat("loaded page ", loaded + j, " (key ",
                                                     keys[begin + j].Hex(), "): ", c.message()));
        }
        if (kinds != nullptr) kinds->push_back(kind);
        if (sizes != nullptr) sizes->push_back(out[j].size());
      }
      loaded += m;
      if (m < n) break;
    }
    return absl::OkStatus();
  }

  // Copies leased pages out of the pool; with `hash`, each page is hashed as it is copied (one
  // pass) and its checksum left in (*digests)[j].
  absl::Status ReadShm(const pb::LookupResponse& resp, std::span<std::span<uint8_t>> out,
                       bool hash, std::vector<std::optional<uint64_t>>* digests) {
    for (size_t j = 0; j < out.size(); ++j) {
      const pb::PageRef& r = resp.pages(static_cast<int>(j));
      if (!shm_->Contains(r.offset(), r.bytes())) {
        return absl::InternalError("daemon leased a page outside its shared-memory segment");
      }
      const std::span<const uint8_t> src(shm_->data() + r.offset(), r.bytes());
      if (hash) {
        (*digests)[j] = CopyPageWithChecksum(out[j], src);
      } else {
        std::memcpy(out[j].data(), src.data(), src.size());
      }
    }
    return absl::OkStatus();
  }

  // ReadPages of a lease's pages; with `hash`, pages whose chunks arrive in order are hashed
  // chunk by chunk right after each is copied (one pass), their checksums left in *digests.
  absl::Status ReadStream(const pb::LookupResponse& resp, std::span<const BlockKey> keys,
                          std::span<std::span<uint8_t>> out, bool hash,
                          std::vector<std::optional<uint64_t>>* digests) {
    std::vector<std::unique_ptr<PageChecksummer>> hashers(out.size());
    std::unordered_map<std::string, size_t> index;
    for (size_t j = 0; j < out.size(); ++j) index.emplace(KeyBytes(keys[j]), j);
    pb::ReadRequest req;
    req.set_lease_id(resp.lease_id());
    for (size_t j = 0; j < out.size(); ++j) req.add_keys(KeyBytes(keys[j]));
    auto ctx = Context();
    auto reader = stub_->ReadPages(ctx.get(), req);
    std::vector<uint64_t> got(out.size(), 0);
    pb::ReadChunk chunk;
    absl::Status bad;
    while (reader->Read(&chunk)) {
      auto it = index.find(chunk.key());
      if (it == index.end() || chunk.page_bytes() != out[it->second].size() ||
          chunk.offset() > out[it->second].size() ||
          chunk.data().size() > out[it->second].size() - chunk.offset()) {
        bad = absl::InternalError("ReadPages: daemon sent a chunk outside the requested pages");
        ctx->TryCancel();
        break;
      }
      const size_t j = it->second;
      std::memcpy(out[j].data() + chunk.offset(), chunk.data().data(), chunk.data().size());
      if (hash && chunk.offset() == 0 && got[j] == 0) {
        hashers[j] = std::make_unique<PageChecksummer>();
      }
      if (hashers[j] != nullptr && hashers[j]->offset() == chunk.offset()) {
        hashers[j]->Update(out[j].subspan(chunk.offset(), chunk.data().size()));
      } else {
        hashers[j].reset();  // out of order: verified by a pass after the copy
      }
      got[j] += chunk.data().size();
    }
    absl::Status s = FromGrpc(reader->Finish(), "ReadPages");
    if (!bad.ok()) return bad;
    OSCARKV_RETURN_IF_ERROR(s);
    for (size_t j = 0; j < out.size(); ++j) {
      if (got[j] != out[j].size()) {
        return absl::DataLossError(absl::StrCat("ReadPages: page ", j, " arrived with ", got[j],
                                                " of ", out[j].size(), " bytes"));
      }
      if (hashers[j] != nullptr && hashers[j]->offset() == out[j].size()) {
        (*digests)[j] = hashers[j]->Digest();
      }
    }
    return absl::OkStatus();
  }

  // One LookupAsync in flight. Recycled: a cleared request keeps its key strings' buffers, so
  // the next call's keys are copied without allocating.
  struct LookupCall {
    std::unique_ptr<grpc::ClientContext> ctx;
    pb::LookupRequest req;
    pb::LookupResponse resp;
    size_t n = 0;
    bool pin = false;
    std::function<void(absl::StatusOr<LookupResult>)> done;
  };
  static constexpr size_t kMaxFreeCalls = 256;

  LookupCall* TakeCall() {
    {
      absl::MutexLock lock(&calls_mu_);
      if (!free_calls_.empty()) {
        LookupCall* c = free_calls_.back();
        free_calls_.pop_back();
        return c;
      }
    }
    return new LookupCall;
  }
  void ReturnCall(LookupCall* c) {
    c->ctx.reset();
    c->req.Clear();
    c->resp.Clear();
    {
      absl::MutexLock lock(&calls_mu_);
      if (free_calls_.size() < kMaxFreeCalls) {
        free_calls_.push_back(c);
        return;
      }
    }
    delete c;
  }

  const ConnectOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KvCache::Stub> stub_;
  ServerInfo server_;
  std::unique_ptr<ShmMapping> shm_;
  std::shared_ptr<LocalChannel> local_;  // set: Lookup/Release go over the local socket
  std::unique_ptr<TaskPool> pool_;
  std::atomic<int> inflight_{0};  // callback-API calls whose callback has not returned
  absl::Mutex calls_mu_;
  std::vector<LookupCall*> free_calls_ ABSL_GUARDED_BY(calls_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("empty daemon address");
  // Refused here, not by gRPC: it wraps ports above 65535 and sends bare words to DNS.
  HostPortRules dial;
  dial.allow_port_zero = false;
  if (auto hp = ParseHostPort(options.address, dial); !hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("daemon address ", hp.status().message()));
  }
  if (options.rpc_timeout_ms <= 0) return absl::InvalidArgumentError("rpc_timeout_ms must be > 0");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // calls are not retried transparently: less work per call
  if (options.dedicated_connection) args.SetInt("grpc.use_local_subchannel_pool", 1);
  auto channel =
      grpc::CreateCustomChannel(options.address, grpc::InsecureChannelCredentials(), args);
  auto client = std::make_unique<GrpcClient>(options, std::move(channel));
  OSCARKV_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<Client>(std::move(client));
}

absl::Status StoreResult::ToStatus() const {
  for (size_t i = 0; i < item_status.size(); ++i) {
    const absl::Status& s = item_status[i];
    if (s.ok() || absl::IsAlreadyExists(s)) continue;
    return absl::Status(s.code(), absl::StrCat(failed, " of ", item_status.size(),
                                               " pages not stored; first: page ", i, ": ",
                                               s.message()));
  }
  return absl::OkStatus();
}

std::vector<BlockKey> Client::BlockKeys(const Codec& codec, std::span<const uint32_t> tokens,
                                        std::string_view tenant_salt) {
  return ComputeBlockKeys(codec.id, tenant_salt, tokens, codec.profile.page_tokens);
}

template <typename T, typename Fn>
static std::future<T> RunAsync(Fn fn, const std::function<void(std::function<void()>)>& submit) {
  auto promise = std::make_shared<std::promise<T>>();
  std::future<T> f = promise->get_future();
  submit([promise, fn = std::move(fn)]() mutable { promise->set_value(fn()); });
  return f;
}

std::future<absl::StatusOr<LookupResult>> Client::LookupAsync(const Codec& codec,
                                                              std::span<const BlockKey> keys,
                                                              const LookupOptions& options) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<LookupResult>>>();
  auto f = promise->get_future();
  LookupAsync(codec, keys, options,
              [promise](absl::StatusOr<LookupResult> r) { promise->set_value(std::move(r)); });
  return f;
}

std::future<absl::StatusOr<StoreResult>> Client::StoreAsync(const Codec& codec,
                                                            std::span<const PageWrite> pages) {
  return RunAsync<absl::StatusOr<StoreResult>>([this, codec, pages] { return Store(codec, pages); },
                                               [this](std::function<void()> t) { Submit(std::move(t)); });
}

std::future<absl::StatusOr<LoadResult>> Client::LoadAsync(const Codec& codec,
                                                          std::span<const BlockKey> keys) {
  return RunAsync<absl::StatusOr<LoadResult>>([this, codec, keys] { return Load(codec, keys); },
                                              [this](std::function<void()> t) { Submit(std::move(t)); });
}

void Client::LoadIntoAsync(const Codec& codec, std::span<const BlockKey> keys,
                           std::span<const std::span<uint8_t>> dst,
                           std::function<void(absl::StatusOr<uint32_t>)> done) {
  Submit([this, codec, keys, dst, done = std::move(done)] { done(LoadInto(codec, keys, dst)); });
}

void Client::StoreAsync(const Codec& codec, std::span<const PageWrite> pages,
                        std::function<void(absl::StatusOr<StoreResult>)> done) {
  Submit([this, codec, pages, done = std::move(done)] { done(Store(codec, pages)); });
}

}  // namespace oscarkv::client
