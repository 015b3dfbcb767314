#include "grpc_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "tenant_identity.h"

namespace oscarkv::service {

class LookupMessagePool::Holder final
    : public grpc::MessageHolder<pb::LookupRequest, pb::LookupResponse> {
 public:
  explicit Holder(LookupMessagePool* pool) : pool_(pool) {
    set_request(&request_);
    set_response(&response_);
  }
  void Release() override { pool_->Recycle(this); }
  void Clear() {
    request_.Clear();
    response_.Clear();
  }

 private:
  LookupMessagePool* pool_;
  pb::LookupRequest request_;
  pb::LookupResponse response_;
};

LookupMessagePool::~LookupMessagePool() {
  absl::MutexLock lock(&mu_);
  for (Holder* h : free_) delete h;
}

grpc::MessageHolder<pb::LookupRequest, pb::LookupResponse>*
LookupMessagePool::AllocateMessages() {
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      Holder* h = free_.back();
      free_.pop_back();
      return h;
    }
  }
  return new Holder(this);
}

void LookupMessagePool::Recycle(Holder* h) {
  h->Clear();  // outside the lock
  {
    absl::MutexLock lock(&mu_);
    if (free_.size() < kMaxFree) {
      free_.push_back(h);
      return;
    }
  }
  delete h;
}

size_t LookupMessagePool::idle() const {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

namespace {

const grpc::Status kDraining(grpc::StatusCode::UNAVAILABLE,
                             "oscarkvd is shutting down (draining); retry on another daemon");

}  // namespace

// Counts a call in KvCacheService::in_flight_ (and in the per-peer call limits, when set) for
// its handler's lifetime; false when the call is refused -- the service drains (UNAVAILABLE) or
// the caller's peer, or the daemon, is at its call limit (RESOURCE_EXHAUSTED) -- and the call is
// then not counted; refusal() is its answer.
class Admission {
 public:
  Admission(KvCacheService* s, const grpc::ServerContextBase* ctx) : n_(&s->in_flight_) {
    n_->fetch_add(1);
    if (s->draining_.load()) {
      n_->fetch_sub(1);
      n_ = nullptr;
      refusal_ = kDraining;
      return;
    }
    if (s->limits_ == nullptr) return;
    peer_ = std::string(PeerHost(ctx->peer()));
    if (absl::Status st = s->limits_->Enter(peer_); !st.ok()) {
      n_->fetch_sub(1);
      n_ = nullptr;
      refusal_ = ToGrpc(st);
      return;
    }
    limits_ = s->limits_;
  }
  ~Admission() {
    if (n_ != nullptr) n_->fetch_sub(1);
    LeaveLimits();
  }
  // Frees the call's place in the call limits before a callback handler's Finish() (its client
  // may send the next call as soon as the answer arrives; the drain count stays until return).
  void LeaveLimits() {
    if (limits_ != nullptr) limits_->Leave(peer_);
    limits_ = nullptr;
  }
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;
  explicit operator bool() const { return n_ != nullptr; }
  const grpc::Status& refusal() const { return refusal_; }

 private:
  std::atomic<int64_t>* n_;
  PeerCallLimits* limits_ = nullptr;
  std::string peer_;
  grpc::Status refusal_;
};

namespace {

// Who a gRPC call acts for: the tenant its verified client certificate names, in the shared
// namespace its `oscarkv-namespace` metadata selects (tenants.h). Without configured tenants
// and without that metadata: the default Caller, at no cost per call.
absl::StatusOr<Caller> CallerOf(const ControlCalls& calls, const grpc::ServerContextBase* ctx) {
  const auto& md = ctx->client_metadata();
  const auto ns = md.find(kNamespaceMetadata);
  const absl::string_view shared =
      ns == md.end() ? absl::string_view() : absl::string_view(ns->second.data(), ns->second.size());
  if (!calls.cache()->tenants().configured() && shared.empty()) return Caller{};
  std::vector<std::string> names;
  if (calls.cache()->tenants().configured()) names = CertificateNames(ctx->auth_context().get());
  return calls.CallerFor(names, shared);
}

// A call refused before it reached the cache (its caller is no tenant), counted like the others.
grpc::Status Refused(Metrics* m, Rpc rpc, const absl::Status& s) {
  return ToGrpc(RpcTimer(m, rpc).Done(s));
}

// gRPC's view of a call timed by RpcTimer.
class CallTimer {
 public:
  CallTimer(Metrics* m, Rpc rpc) : t_(m, rpc) {}
  grpc::Status Done(const absl::Status& s) { return ToGrpc(t_.Done(s)); }

 private:
  RpcTimer t_;
};

}  // namespace

#define OSCARKV_CALLBACK(Name, Req, Resp)                                              \
  grpc::ServerUnaryReactor* KvCacheService::Name(grpc::CallbackServerContext* ctx,       \
                                                 const pb::Req* req, pb::Resp* resp) {   \
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();                         \
    Admission admitted(this, ctx);                                                     \
    if (!admitted) {                                                                   \
      reactor->Finish(admitted.refusal());                                             \
      return reactor;                                                                  \
    }                                                                                  \
    CallTimer t(metrics_, Rpc::k##Name);                                               \
    const absl::StatusOr<Caller> caller = CallerOf(calls_, ctx);                       \
    const grpc::Status done = t.Done(caller.ok() ? wire::Name(*cache_, *caller, *req, resp) \
                                                 : caller.status());                   \
    admitted.LeaveLimits();                                                            \
    reactor->Finish(done);                                                             \
    return reactor;                                                                    \
  }
#define OSCARKV_UNARY(Name, Req, Resp)                                                       \
  grpc::Status KvCacheService::Name(grpc::ServerContext* ctx, const pb::Req* req,          \
                                    pb::Resp* resp) {                                      \
    Admission admitted(this, ctx);                                                         \
    if (!admitted) return admitted.refusal();                                              \
    CallTimer t(metrics_, Rpc::k##Name);                                                     \
    const absl::StatusOr<Caller> caller = CallerOf(calls_, ctx);                             \
    return t.Done(caller.ok() ? wire::Name(*cache_, *caller, *req, resp) : caller.status()); \
  }

grpc::ServerUnaryReactor* KvCacheService::Handshake(grpc::CallbackServerContext* ctx,
                                                    const pb::HandshakeRequest* req,
                                                    pb::HandshakeResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Admission admitted(this, ctx);
  if (!admitted) {
    reactor->Finish(admitted.refusal());
    return reactor;
  }
  const absl::StatusOr<Caller> caller = CallerOf(calls_, ctx);
  const grpc::Status done =
      caller.ok() ? ToGrpc(calls_.Handshake(*caller, *req, resp, ctx->peer(), "grpc"))
                  : Refused(metrics_, Rpc::kHandshake, caller.status());
  admitted.LeaveLimits();
  reactor->Finish(done);
  return reactor;
}
// Lookup and Release: the calls the local socket serves too, through the same ControlCalls.
grpc::ServerUnaryReactor* KvCacheService::Lookup(grpc::CallbackServerContext* ctx,
                                                 const pb::LookupRequest* req,
                                                 pb::LookupResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Admission admitted(this, ctx);
  if (!admitted) {
    reactor->Finish(admitted.refusal());
    return reactor;
  }
  const absl::StatusOr<Caller> caller = CallerOf(calls_, ctx);
  const grpc::Status done = caller.ok() ? ToGrpc(calls_.Lookup(*caller, *req, resp))
                                        : Refused(metrics_, Rpc::kLookup, caller.status());
  admitted.LeaveLimits();
  reactor->Finish(done);
  return reactor;
}
grpc::ServerUnaryReactor* KvCacheService::Release(grpc::CallbackServerContext* ctx,
                                                  const pb::ReleaseRequest* req,
                                                  pb::ReleaseResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  Admission admitted(this, ctx);
  if (!admitted) {
    reactor->Finish(admitted.refusal());
    return reactor;
  }
  const absl::StatusOr<Caller> caller = CallerOf(calls_, ctx);
  const grpc::Status done = caller.ok() ? ToGrpc(calls_.Release(*caller, *req, resp))
                                        : Refused(metrics_, Rpc::kRelease, caller.status());
  admitted.LeaveLimits();
  reactor->Finish(done);
  return reactor;
}
OSCARKV_CALLBACK(RegisterCodec, RegisterCodecRequest, RegisterCodecResponse)
OSCARKV_CALLBACK(RenewLease, RenewLeaseRequest, RenewLeaseResponse)
OSCARKV_CALLBACK(Delete, DeleteRequest, DeleteResponse)
OSCARKV_CALLBACK(Stats, StatsRequest, StatsResponse)
OSCARKV_CALLBACK(OpenHandle, OpenHandleRequest, OpenHandleResponse)
OSCARKV_CALLBACK(CloseHandle, CloseHandleRequest, CloseHandleResponse)
OSCARKV_UNARY(PublishHandle, PublishHandleRequest, PublishHandleResponse)
OSCARKV_UNARY(Reserve, ReserveRequest, ReserveResponse)
OSCARKV_UNARY(Abort, AbortRequest, AbortResponse)
OSCARKV_UNARY(Commit, CommitRequest, CommitResponse)
OSCARKV_UNARY(Clear, ClearRequest, ClearResponse)
OSCARKV_UNARY(UnregisterCodec, UnregisterCodecRequest, UnregisterCodecResponse)
#undef OSCARKV_CALLBACK
#undef OSCARKV_UNARY

grpc::ServerUnaryReactor* KvCacheService::GetDataPlane(grpc::CallbackServerContext* ctx,
                                                       const pb::GetDataPlaneRequest*,
                                                       pb::GetDataPlaneResponse* resp) {
  Admission admitted(this, ctx);
  if (!admitted) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(admitted.refusal());
    return reactor;
  }
  CallTimer t(metrics_, Rpc::kGetDataPlane);
  absl::Status s;
  const absl::StatusOr<Caller> caller_or = CallerOf(calls_, ctx);
  if (!caller_or.ok()) {
    s = caller_or.status();
  } else if (!data_plane_) {
    s = absl::FailedPreconditionError(no_data_plane_);
  } else if (const Caller& caller = *caller_or;
             (!caller.admin || admins_use_staging_) && !share_pool_key_) {
    // The pool key reads every tenant's pages, so a tenant (who may read only its own) gets
    // the data plane of its own staging region instead (ucx_tenant_regions.h says why a key
    // over just its pages would isolate nothing on emulated RMA).
    if (tenant_rma_ != nullptr) {
      if (auto own = tenant_rma_->DataPlane(caller); own.ok()) {
        *resp = *std::move(own);
      } else {
        s = own.status();
      }
    } else {
      s = absl::PermissionDeniedError(absl::StrCat(
          "tenant '", caller.tenant, "': the UCX pool key reads every tenant's pages, so only "
          "an admin gets it (ucx.share_pool_key: true hands it to every tenant); load over "
          "gRPC or shared memory instead"));
    }
  } else if (auto info = data_plane_(); info.ok()) {
    *resp = *std::move(info);
  } else {
    s = info.status();
  }
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const grpc::Status done = t.Done(s);
  admitted.LeaveLimits();
  reactor->Finish(done);
  return reactor;
}

grpc::Status KvCacheService::StageForRma(grpc::ServerContext* ctx,
                                         const pb::StageForRmaRequest* req,
                                         pb::StageForRmaResponse* resp) {
  Admission admitted(this, ctx);
  if (!admitted) return admitted.refusal();
  CallTimer t(metrics_, Rpc::kStageForRma);
  const absl::StatusOr<Caller> caller = CallerOf(calls_, ctx);
  if (!caller.ok()) return t.Done(caller.status());
  if (!data_plane_) return t.Done(absl::FailedPreconditionError(no_data_plane_));
  if ((caller->admin && !admins_use_staging_) || share_pool_key_) {
    return t.Done(absl::FailedPreconditionError(
        "this caller gets the pool key from GetDataPlane: RMA-read leased pages from the pool "
        "directly (StageForRma serves tenants without it)"));
  }
  if (tenant_rma_ == nullptr) {
    return t.Done(absl::FailedPreconditionError("this daemon has no per-tenant UCX staging"));
  }
  return t.Done(tenant_rma_->Stage(*caller, *req, resp));
}

grpc::Status KvCacheService::WritePages(grpc::ServerContext* ctx,
                                        grpc::ServerReader<pb::WriteChunk>* reader,
                                        pb::WriteResponse* resp) {
  Admission admitted(this, ctx);
  if (!admitted) return admitted.refusal();
  CallTimer t(metrics_, Rpc::kWritePages);
  const absl::StatusOr<Caller> caller_or = CallerOf(calls_, ctx);
  if (!caller_or.ok()) return t.Done(caller_or.status());
  const Caller& caller = *caller_or;
  pb::WriteChunk chunk;
  uint64_t total = 0;
  while (reader->Read(&chunk)) {
    absl::StatusOr<uint64_t> n = wire::WriteChunk(*cache_, caller, chunk);
    if (!n.ok()) return t.Done(n.status());
    total += *n;
  }
  if (ctx->IsCancelled()) return t.Done(absl::CancelledError("client cancelled the stream"));
  resp->set_bytes_written(total);
  return t.Done(absl::OkStatus());
}

grpc::Status KvCacheService::ReadPages(grpc::ServerContext* ctx, const pb::ReadRequest* req,
                                       grpc::ServerWriter<pb::ReadChunk>* writer) {
  Admission admitted(this, ctx);
  if (!admitted) return admitted.refusal();
  CallTimer t(metrics_, Rpc::kReadPages);
  const absl::StatusOr<Caller> caller = CallerOf(calls_, ctx);
  if (!caller.ok()) return t.Done(caller.status());
  auto plan = wire::PrepareRead(*cache_, *caller, *req);
  if (!plan.ok()) return t.Done(plan.status());
  pb::ReadChunk chunk;
  for (const ReadPlan::Page& page : (*plan)->pages()) {
    chunk.set_key(std::string(reinterpret_cast<const char*>(page.key.bytes.data()), 16));
    chunk.set_page_bytes(page.bytes);
    for (uint64_t off = 0; off < page.bytes; off += kReadChunkBytes) {
      const uint64_t n = std::min<uint64_t>(kReadChunkBytes, page.bytes - off);
      chunk.set_offset(off);
      chunk.set_data(reinterpret_cast<const char*>(page.data) + off, n);
      if (!writer->Write(chunk)) {
        return t.Done(absl::CancelledError("client went away during ReadPages"));
      }
      cache_->mutable_counters().bytes_read.fetch_add(n, std::memory_order_relaxed);
    }
  }
  (void)ctx;
  return t.Done(absl::OkStatus());
}

}  // namespace oscarkv::service
