// KvCacheService: the gRPC binding of PageCache. Each handler converts the call's absl::Status
// one-to-one into a grpc::Status and records latency and result code in Metrics. The data-plane
// streams move page bytes in chunks of at most kReadChunkBytes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/message_allocator.h"
#include "control_calls.h"
#include "server_limits.h"
#include "oscarkv/service/metrics.h"
#include "oscarkv/proto/grpc_status.h"
#include "oscarkv/service/page_cache.h"
#include "oscarkv/v1/oscarkv.grpc.pb.h"

namespace oscarkv::service {

inline constexpr size_t kReadChunkBytes = size_t{1} << 20;

// Request/response messages of the Lookup handler, recycled instead of allocated per call: a
// cleared message keeps its repeated strings' buffers, so parsing the next request's 16-byte
// keys into it allocates nothing (a fresh LookupRequest of 32 keys costs 33 mallocs and frees).
// Keeps at most kMaxFree idle pairs.
class LookupMessagePool final
    : public grpc::MessageAllocator<pb::LookupRequest, pb::LookupResponse> {
 public:
  static constexpr size_t kMaxFree = 256;
  ~LookupMessagePool() override;
  grpc::MessageHolder<pb::LookupRequest, pb::LookupResponse>* AllocateMessages() override;
  size_t idle() const;

 private:
  class Holder;
  void Recycle(Holder* h);
  mutable absl::Mutex mu_;
  std::vector<Holder*> free_ ABSL_GUARDED_BY(mu_);
};

// UCX access for tenants that may not hold the pool key (ucx_tenant_regions.h implements it
// when the transport module is built): a data plane of the caller's own, and StageForRma.
class TenantRma {
 public:
  virtual ~TenantRma() = default;
  // The caller's own data plane (GetDataPlaneResponse.staged = true).
  virtual absl::StatusOr<pb::GetDataPlaneResponse> DataPlane(const Caller& caller) = 0;
  // The StageForRma contract of the proto.
  virtual absl::Status Stage(const Caller& caller, const pb::StageForRmaRequest& req,
                             pb::StageForRmaResponse* resp) = 0;
};

// The short, never-blocking unary calls use gRPC's callback API: they finish on the thread that
// read the request, with no hand-off to a worker thread. Calls that can wait or run long --
// Reserve (may evict many pages), Commit (checksums of up to max_batch pages), Abort (waits for
// an in-flight Commit of its reservation), Clear (a full index walk) and the two streams -- run
// on the sync thread pool so they never hold up the callback threads that serve Lookup.
using KvCacheAsyncBase = pb::KvCache::WithCallbackMethod_Handshake<
    pb::KvCache::WithCallbackMethod_RegisterCodec<pb::KvCache::WithCallbackMethod_Lookup<
        pb::KvCache::WithCallbackMethod_Release<pb::KvCache::WithCallbackMethod_RenewLease<
            pb::KvCache::WithCallbackMethod_Delete<pb::KvCache::WithCallbackMethod_Stats<
                pb::KvCache::WithCallbackMethod_OpenHandle<
                    pb::KvCache::WithCallbackMethod_CloseHandle<
                        pb::KvCache::WithCallbackMethod_GetDataPlane<pb::KvCache::Service>>>>>>>>>>;

class KvCacheService final : public KvCacheAsyncBase {
 public:
  KvCacheService(PageCache* cache, Metrics* metrics)
      : cache_(cache), metrics_(metrics), calls_(cache, metrics) {
    SetMessageAllocatorFor_Lookup(&lookup_messages_);
  }
  // Drain (SIGTERM): from now on every call of this service is refused with UNAVAILABLE before
  // it does anything; calls admitted earlier run to their end. in_flight() counts the admitted
  // calls whose handler has not returned yet (a handler counts itself, then checks draining_,
  // both sequentially consistent: after StartDraining(), once in_flight() reads 0 no admitted
  // call is left). A returned handler's answer may still be on its way out in gRPC.
  void StartDraining() { draining_.store(true); }
  int64_t in_flight() const { return in_flight_.load(); }

  // The calls shared with the local socket (local_control.h); set its path here before serving.
  ControlCalls& calls() { return calls_; }
  // The UCX data plane's description, asked per call (it changes when the data-plane process
  // is restarted); empty: none, `why_not` says why. Set before serving.
  using DataPlaneInfoFn = std::function<absl::StatusOr<pb::GetDataPlaneResponse>()>;
  void SetDataPlane(DataPlaneInfoFn info, std::string why_not) {
    data_plane_ = std::move(info);
    no_data_plane_ = std::move(why_not);
  }
  // GetDataPlane's pool_rkey reads every page in the pool, whoever stored it: it goes to admin
  // callers (without tenants every caller is one), and to tenants only when `share` is set
  // (ucx.share_pool_key); a tenant asking otherwise is refused with PERMISSION_DENIED.
  void SharePoolKeyWithTenants(bool share) { share_pool_key_ = share; }
  // Per-tenant UCX staging (owned by the caller, outlives serving): with it, a tenant's
  // GetDataPlane answers its own data plane instead of PERMISSION_DENIED. Set before serving.
  // A tenant's first GetDataPlane starts that process on its callback thread (about a second,
  // once per tenant; bounded by the configured tenants).
  void SetTenantRma(TenantRma* rma) { tenant_rma_ = rma; }
  // No whole-pool data plane (tenants configured, ucx.allow_unverified_rma off): admins, too,
  // get a staged data plane of their own from the per-tenant staging. Set before serving.
  void AdminsUseStaging(bool v) { admins_use_staging_ = v; }
  // Calls in flight per peer and in total (owned by the caller, outlives serving): a call over
  // a limit is RESOURCE_EXHAUSTED before it does anything. Set before serving; none: unbounded.
  void SetCallLimits(PeerCallLimits* limits) { limits_ = limits; }
  grpc::ServerUnaryReactor* GetDataPlane(grpc::CallbackServerContext*,
                                         const pb::GetDataPlaneRequest*,
                                         pb::GetDataPlaneResponse*) override;
  // Copies up to a region's worth of pages: the sync pool.
  grpc::Status StageForRma(grpc::ServerContext*, const pb::StageForRmaRequest*,
                           pb::StageForRmaResponse*) override;

  grpc::ServerUnaryReactor* Handshake(grpc::CallbackServerContext*, const pb::HandshakeRequest*,
                                      pb::HandshakeResponse*) override;
  grpc::ServerUnaryReactor* RegisterCodec(grpc::CallbackServerContext*,
                                          const pb::RegisterCodecRequest*,
                                          pb::RegisterCodecResponse*) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext*, const pb::LookupRequest*,
                                   pb::LookupResponse*) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext*, const pb::ReleaseRequest*,
                                    pb::ReleaseResponse*) override;
  grpc::ServerUnaryReactor* RenewLease(grpc::CallbackServerContext*,
                                       const pb::RenewLeaseRequest*,
                                       pb::RenewLeaseResponse*) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext*, const pb::DeleteRequest*,
                                   pb::DeleteResponse*) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext*, const pb::StatsRequest*,
                                  pb::StatsResponse*) override;

  grpc::ServerUnaryReactor* OpenHandle(grpc::CallbackServerContext*,
                                       const pb::OpenHandleRequest*,
                                       pb::OpenHandleResponse*) override;
  grpc::ServerUnaryReactor* CloseHandle(grpc::CallbackServerContext*,
                                        const pb::CloseHandleRequest*,
                                        pb::CloseHandleResponse*) override;
  // Publish pins up to max_batch pages (one shard lock each): the sync pool.
  grpc::Status PublishHandle(grpc::ServerContext*, const pb::PublishHandleRequest*,
                             pb::PublishHandleResponse*) override;
  grpc::Status Reserve(grpc::ServerContext*, const pb::ReserveRequest*,
                       pb::ReserveResponse*) override;
  grpc::Status Abort(grpc::ServerContext*, const pb::AbortRequest*, pb::AbortResponse*) override;
  grpc::Status Commit(grpc::ServerContext*, const pb::CommitRequest*,
                      pb::CommitResponse*) override;
  grpc::Status Clear(grpc::ServerContext*, const pb::ClearRequest*, pb::ClearResponse*) override;
  // Waits for the calls using the codec to finish: the sync pool.
  grpc::Status UnregisterCodec(grpc::ServerContext*, const pb::UnregisterCodecRequest*,
                               pb::UnregisterCodecResponse*) override;
  grpc::Status WritePages(grpc::ServerContext*, grpc::ServerReader<pb::WriteChunk>*,
                          pb::WriteResponse*) override;
  grpc::Status ReadPages(grpc::ServerContext*, const pb::ReadRequest*,
                         grpc::ServerWriter<pb::ReadChunk>*) override;

 private:
  PageCache* cache_;
  Metrics* metrics_;
  ControlCalls calls_;
  DataPlaneInfoFn data_plane_;
  std::string no_data_plane_ = "the daemon runs without a UCX data plane";
  bool share_pool_key_ = false;
  TenantRma* tenant_rma_ = nullptr;
  bool admins_use_staging_ = false;
  PeerCallLimits* limits_ = nullptr;
  LookupMessagePool lookup_messages_;
  // Own cache lines: in_flight_ is written by every call on every handler thread.
  alignas(64) std::atomic<int64_t> in_flight_{0};
  alignas(64) std::atomic<bool> draining_{false};
  friend class Admission;
};

using ::oscarkv::ToGrpc;  // the one absl::Status -> grpc::Status adapter (proto/)

}  // namespace oscarkv::service
