// The gRPC + shared-memory implementation of oscarkv::client::Client.
#include "oscarkv/client/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/util/host_port.h"
#include "oscarkv/util/status_macros.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"
#include "client_internal.h"
#include "client_session.h"
#include "credentials.h"
#include "local_channel.h"
#include "oscarkv/proto/codec_convert.h"
#include "page_fetch.h"
#include "rpc_core.h"
#include "shm_mapping.h"
#include "shm_load_staging.h"
#include "shm_staging.h"
#include "store_path.h"
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

absl::Status FromItem(const pb::ItemStatus& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()), s.message());
}

std::string KeyBytes(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}
std::string IdBytes(const CodecId& id) {
  return std::string(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
}

class GrpcClient final : public Client {
 public:
  explicit GrpcClient(ConnectOptions options)
      : options_(std::move(options)), rpc_(RpcCore::Dial(options_)) {}

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
    OSCARKV_ASSIGN_OR_RETURN(std::shared_ptr<Session> first, OpenSession(*rpc_, options_));
    {
      absl::MutexLock lock(&session_mu_);
      session_ = std::move(first);
    }
    pool_ = std::make_unique<TaskPool>(options_.async_threads);
    return absl::OkStatus();
  }

  // The session of the daemon instance behind the address. When the current one is stale (its
  // daemon was restarted: see Session::Stale; `probe` also polls the staging and load
  // connections, one system call each) a new one is opened first -- handshake, local socket,
  // staging and load regions attached again -- and replaces it; calls still running on the old
  // one finish on it. When the daemon does not answer yet, the old session is returned and the
  // call fails on it as it would have (the next call tries again).
  std::shared_ptr<Session> Current(bool probe) {
    std::shared_ptr<Session> s;
    {
      absl::MutexLock lock(&session_mu_);
      s = session_;
    }
    if (!s->Stale(probe)) return s;
    absl::MutexLock one(&reconnect_mu_);  // one reconnect at a time
    {
      absl::MutexLock lock(&session_mu_);
      if (session_ != s) return session_;  // another call reconnected meanwhile
    }
    auto fresh = OpenSession(*rpc_, options_);
    if (!fresh.ok()) return s;
    absl::MutexLock lock(&session_mu_);
    session_ = *fresh;
    return session_;
  }

  ServerInfo server() const override {
    absl::MutexLock lock(&session_mu_);
    return session_->server;
  }
  ClientCore core() {
    std::shared_ptr<Session> s = Current(/*probe=*/true);
    return ClientCore{rpc_, s->source.get(), s->pool(), s};
  }
  const ConnectOptions& options() const override { return options_; }

  absl::StatusOr<uint64_t> RenewLease(uint64_t lease_id, uint32_t lease_ms) override {
    pb::RenewLeaseRequest req;
    req.set_lease_id(lease_id);
    req.set_lease_ms(lease_ms);
    pb::RenewLeaseResponse resp;
    auto ctx = rpc_->Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpc(rpc_->stub().RenewLease(ctx.get(), req, &resp), "RenewLease"));
    return resp.lease_deadline_unix_ms();
  }

  absl::StatusOr<Codec> RegisterCodec(const CodecProfile& profile) override {
    OSCARKV_RETURN_IF_ERROR(profile.Validate());
    pb::RegisterCodecRequest req;
    proto::ToProto(profile, req.mutable_profile());
    pb::RegisterCodecResponse resp;
    auto ctx = rpc_->Context();
    OSCARKV_RETURN_IF_ERROR(
        FromGrpc(rpc_->stub().RegisterCodec(ctx.get(), req, &resp), "RegisterCodec"));
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
    std::shared_ptr<Session> session = Current(/*probe=*/false);
    const uint32_t max_batch = session->server.max_batch;
    for (size_t begin = 0; begin < keys.size(); begin += max_batch) {
      const size_t n = std::min<size_t>(max_batch, keys.size() - begin);
      pb::LookupResponse resp;
      absl::Status s = LookupChunk(*session, codec, keys.subspan(begin, n), opts, &resp);
      if (!s.ok() && begin == 0 && session->Stale(/*probe=*/false)) {
        // The daemon was restarted under this call: once more, on the new instance.
        session = Current(/*probe=*/false);
        resp.Clear();
        s = LookupChunk(*session, codec, keys.subspan(begin, n), opts, &resp);
      }
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
        auto ref = PageRefFromProto(r);
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
    const std::shared_ptr<Session> session = Current(/*probe=*/false);
    LocalChannel* const local = session->local.get();
    if (keys.size() > session->server.max_batch ||
        (local != nullptr && keys.size() > local::kMaxLookupKeys)) {
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
    if (local != nullptr) {
      // The channel outlives the answer: its destructor fails what is still pending.
      LookupAsyncLocal(*local, codec, keys, opts, std::move(done));
      return;
    }
    LookupCall* call = TakeCall();
    call->ctx = rpc_->Context();
    call->n = keys.size();
    call->pin = opts.pin;
    call->done = std::move(done);
    call->req.set_codec_id(IdBytes(codec.id));
    for (const BlockKey& k : keys) {
      call->req.add_keys()->assign(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
    }
    call->req.set_pin(opts.pin);
    call->req.set_lease_ms(opts.lease_ms);
    rpc_->stub().async()->Lookup(call->ctx.get(), &call->req, &call->resp,
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
  void LookupAsyncLocal(LocalChannel& channel, const Codec& codec, std::span<const BlockKey> keys,
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
    channel.CallAsync(
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
      auto ref = PageRefFromProto(r);
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
    const std::shared_ptr<Session> session = Current(/*probe=*/false);
    if (session->local != nullptr) {
      absl::Status s = session->local->Call(local::Method::kRelease, req, &resp, "Release");
      // A lease of the instance that is gone is gone with it; the new one does not know it.
      if (!s.ok() && session->local->Stale()) return absl::OkStatus();
      return s;
    }
    auto ctx = rpc_->Context();
    return FromGrpc(rpc_->stub().Release(ctx.get(), req, &resp), "Release");
  }

  absl::StatusOr<StoreResult> Store(const Codec& codec,
                                    std::span<const PageWrite> pages) override {
    // A shared-namespace client reserves over gRPC: the socket acts for its own namespace.
    const std::shared_ptr<Session> session = Current(/*probe=*/true);
    ShmStaging* const staging = session->staging.get();
    const bool local_reserve =
        staging != nullptr && staging->reserve_frames() && options_.shared_namespace.empty();
    return StorePages(StoreTarget{*rpc_, session->pool(), staging, local_reserve,
                                  session->server.max_batch, options_},
                      codec, pages);
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
    auto ctx = rpc_->Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpc(rpc_->stub().Stats(ctx.get(), req, &r), "Stats"));
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
    const uint32_t max_batch = Current(/*probe=*/false)->server.max_batch;
    for (size_t begin = 0; begin < keys.size(); begin += max_batch) {
      const size_t n = std::min<size_t>(max_batch, keys.size() - begin);
      pb::DeleteRequest req;
      req.set_codec_id(IdBytes(codec.id));
      for (const BlockKey& k : keys.subspan(begin, n)) req.add_keys(KeyBytes(k));
      pb::DeleteResponse resp;
      auto ctx = rpc_->Context();
      OSCARKV_RETURN_IF_ERROR(FromGrpc(rpc_->stub().Delete(ctx.get(), req, &resp), "Delete"));
      if (static_cast<size_t>(resp.results_size()) != n) {
        return absl::InternalError("Delete: daemon returned a result count != key count");
      }
      for (const auto& r : resp.results()) out.push_back(FromItem(r));
    }
    return out;
  }

  absl::StatusOr<uint64_t> Clear(const CodecId* codec_id, bool include_pinned) override {
    return Clear(codec_id, include_pinned, /*free_codecs=*/false, nullptr);
  }

  absl::StatusOr<uint64_t> Clear(const CodecId* codec_id, bool include_pinned, bool free_codecs,
                                 uint32_t* codecs_freed) override {
    pb::ClearRequest req;
    if (codec_id != nullptr) req.set_codec_id(IdBytes(*codec_id));
    req.set_include_pinned(include_pinned);
    req.set_free_codecs(free_codecs);
    pb::ClearResponse resp;
    auto ctx = rpc_->Context();
    OSCARKV_RETURN_IF_ERROR(FromGrpc(rpc_->stub().Clear(ctx.get(), req, &resp), "Clear"));
    if (codecs_freed != nullptr) *codecs_freed = resp.codecs_freed();
    return resp.pages_removed();
  }

  absl::StatusOr<uint64_t> UnregisterCodec(const CodecId& codec_id, bool drop_pages) override {
    pb::UnregisterCodecRequest req;
    req.set_codec_id(IdBytes(codec_id));
    req.set_drop_pages(drop_pages);
    pb::UnregisterCodecResponse resp;
    auto ctx = rpc_->Context();
    OSCARKV_RETURN_IF_ERROR(
        FromGrpc(rpc_->stub().UnregisterCodec(ctx.get(), req, &resp), "UnregisterCodec"));
    return resp.pages_removed();
  }

 protected:
  void Submit(std::function<void()> task) override { pool_->Submit(std::move(task)); }

 private:
  absl::Status LookupChunk(const Session& session, const Codec& codec,
                           std::span<const BlockKey> keys,
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
    if (session.local != nullptr && keys.size() <= local::kMaxLookupKeys) {
      OSCARKV_RETURN_IF_ERROR(session.local->Call(local::Method::kLookup, req, resp, "Lookup"));
    } else {
      auto ctx = rpc_->Context();
      OSCARKV_RETURN_IF_ERROR(FromGrpc(rpc_->stub().Lookup(ctx.get(), req, resp), "Lookup"));
    }
    if (resp->matched() > keys.size() || (opts.pin && resp->pages_size() != int(resp->matched()))) {
      Release(resp->lease_id()).IgnoreError();
      return absl::InternalError("Lookup: daemon's answer is inconsistent with the request");
    }
    return absl::OkStatus();
  }

  // Copies the longest cached prefix of `keys` out of the daemon: into (*dst)[i] when dst is
  // given, else into owned vectors; every page verified (page_fetch.h). Leases are held only for
  // the copy of their chunk. `release_status` (optional) receives the first failure to release
  // a lease after a copy.
  absl::Status LoadChunks(const Codec& codec, std::span<const BlockKey> keys,
                          const std::span<const std::span<uint8_t>>* dst,
                          std::vector<std::vector<uint8_t>>* owned, std::vector<PageKind>* kinds,
                          std::vector<uint64_t>* sizes = nullptr,
                          absl::Status* release_status = nullptr) {
    size_t loaded = 0;
    // One session for the whole load: the pages are pinned in, and copied out of, one instance.
    std::shared_ptr<Session> session = Current(/*probe=*/true);
    const uint32_t max_batch = session->server.max_batch;
    for (size_t begin = 0; begin < keys.size(); begin += max_batch) {
      const size_t n = std::min<size_t>(max_batch, keys.size() - begin);
      pb::LookupResponse resp;
      absl::Status looked = LookupChunk(*session, codec, keys.subspan(begin, n),
                                        LookupOptions{.pin = true}, &resp);
      if (!looked.ok() && begin == 0 && session->Stale(/*probe=*/false)) {
        session = Current(/*probe=*/true);  // restarted under this call: on the new instance
        resp.Clear();
        looked = LookupChunk(*session, codec, keys.subspan(begin, n), LookupOptions{.pin = true},
                             &resp);
      }
      OSCARKV_RETURN_IF_ERROR(looked);
      const size_t m = resp.matched();
      std::vector<PageRef> refs;
      absl::Status s;
      std::optional<size_t> corrupt;  // a page whose bytes failed verification
      for (size_t j = 0; j < m && s.ok(); ++j) {
        auto ref = PageRefFromProto(resp.pages(static_cast<int>(j)));
        if (ref.ok() && !(ref->key == keys[begin + j])) {
          ref = absl::InternalError("Lookup: daemon pinned other keys than asked");
        }
        if (ref.ok()) {
          refs.push_back(*ref);
        } else {
          s = ref.status();
        }
      }
      if (s.ok()) {
        std::vector<std::span<uint8_t>> out =
            dst != nullptr ? std::vector<std::span<uint8_t>>(dst->begin() + loaded, dst->end())
                           : OwnedBuffers(refs, owned);
        s = FetchVerified(codec, resp.lease_id(), refs, out, *session->source,
                          options_.verify_checksums,
                          loaded, &corrupt);
      }
      // Synchronous on purpose: when Load returns, the pages are no longer pinned (a Delete or
      // Clear right after it behaves as expected). A failed release only means the lease runs
      // to its deadline; the caller learns of it through `release_status`.
      absl::Status released = Release(resp.lease_id());
      if (release_status != nullptr && release_status->ok()) *release_status = released;
      if (!s.ok() && owned != nullptr) owned->clear();
      if (corrupt.has_value()) {
        // The daemon's copy is unreadable: drop it, so that the key is not a page the cache
        // claims to have (a later Store would count it as deduplicated) and can be stored again.
        const BlockKey bad = refs[*corrupt].key;
        const bool dropped = Delete(codec, std::span<const BlockKey>(&bad, 1)).ok();
        s = absl::Status(s.code(), absl::StrCat(s.message(), dropped
                                                                 ? " (the daemon's copy was "
                                                                   "deleted: store it again)"
                                                                 : ""));
      }
      OSCARKV_RETURN_IF_ERROR(s);
      for (const PageRef& r : refs) {
        if (kinds != nullptr) kinds->push_back(r.kind);
        if (sizes != nullptr) sizes->push_back(r.bytes);
      }
      loaded += m;
      if (m < n) break;
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
  const std::shared_ptr<RpcCore> rpc_;
  // What the last (re)connect said; the daemon's current session below.
  absl::Mutex reconnect_mu_;  // held while a new session is opened (Current)
  mutable absl::Mutex session_mu_;
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(session_mu_);
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
  {  // the TLS files, checked here so a bad one is an error that names it
    grpc::ChannelArguments unused;
    if (auto creds = MakeChannelCredentials(options, &unused); !creds.ok()) return creds.status();
  }
  auto client = std::make_unique<GrpcClient>(options);
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

absl::StatusOr<ClientCore> CoreOf(Client& c) {
  auto* g = dynamic_cast<GrpcClient*>(&c);
  if (g == nullptr) return absl::InternalError("not a Client made by Client::Connect");
  return g->core();
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
