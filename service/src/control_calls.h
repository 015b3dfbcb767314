// ControlCalls: the unary control calls exactly as both of oscarkvd's front ends serve them --
// gRPC (grpc_service.cc) and the same-host local socket (local_control.cc). Each call runs the
// PageCache method through the wire translation (cache_wire.h), records its latency and result
// code in Metrics under the same method name whichever front end carried it, and logs failures
// at debug level. The front ends only move bytes and say who the Caller is; request validation,
// leases and every other rule live in PageCache.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "cache_wire.h"
#include "oscarkv/service/caller.h"
#include "oscarkv/service/metrics.h"
#include "oscarkv/service/page_cache.h"

namespace oscarkv::service {

// Times one call from construction to Done() and records it.
class RpcTimer {
 public:
  RpcTimer(Metrics* m, Rpc rpc) : m_(m), rpc_(rpc), start_(std::chrono::steady_clock::now()) {}
  // Records the call's latency and code; returns `s`.
  absl::Status Done(absl::Status s);

 private:
  Metrics* m_;
  Rpc rpc_;
  std::chrono::steady_clock::time_point start_;
};

// The gRPC metadata key that selects a shared namespace (client: ConnectOptions::shared_namespace).
inline constexpr const char* kNamespaceMetadata = "oscarkv-namespace";

class ControlCalls {
 public:
  // `cache` and `metrics` must outlive this object.
  ControlCalls(PageCache* cache, Metrics* metrics);

  // The local socket's path, announced in every Handshake answer ("" = none). Set before serving.
  void set_local_socket(std::string path) { local_socket_ = std::move(path); }
  const std::string& local_socket() const { return local_socket_; }
  uint64_t instance_id() const { return instance_id_; }

  // `peer` and `front_end` ("grpc" / "local") only go into the log line.
  absl::Status Handshake(const Caller& caller, const pb::HandshakeRequest& req,
                         pb::HandshakeResponse* resp, const std::string& peer,
                         const char* front_end);
  absl::Status Lookup(const Caller& caller, const pb::LookupRequest& req,
                      pb::LookupResponse* resp) {
    RpcTimer t(metrics_, Rpc::kLookup);
    return t.Done(wire::Lookup(*cache_, caller, req, resp));
  }
  absl::Status Release(const Caller& caller, const pb::ReleaseRequest& req,
                       pb::ReleaseResponse* resp) {
    RpcTimer t(metrics_, Rpc::kRelease);
    return t.Done(wire::Release(*cache_, caller, req, resp));
  }

  // The Caller of a gRPC call whose verified certificate offers `cert_names` (subject CN, URI
  // SANs) and that selects shared namespace `shared` ("" = its own): UNAUTHENTICATED /
  // PERMISSION_DENIED when it is no tenant or no member (tenants.h).
  absl::StatusOr<Caller> CallerFor(const std::vector<std::string>& cert_names,
                                   absl::string_view shared) const;
  // The Caller of a local-socket peer with these credentials (SO_PEERCRED).
  absl::StatusOr<Caller> LocalCallerFor(uint32_t uid, uint32_t gid) const;

  PageCache* cache() const { return cache_; }
  Metrics* metrics() const { return metrics_; }

 private:
  PageCache* const cache_;
  Metrics* const metrics_;
  const uint64_t instance_id_;
  std::string local_socket_;
};

}  // namespace oscarkv::service
