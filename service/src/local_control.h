// LocalControlServer: oscarkvd's same-host control socket (frames: proto/oscarkv/v1/
// local_control.h). Serves Handshake, Lookup and Release through the same ControlCalls as the
// gRPC service (and Reserve through the same wire translation), on `threads` epoll threads that run each call inline on the thread that read
// it: one wake-up per batch of ready connections, no hand-off to another thread. A connection
// belongs to one thread for its life (assigned round robin at accept).
//
// Access: the socket file is created with mode 0600 (like the pool segment) and each accepted
// peer's SO_PEERCRED uid must be root or the daemon's own, so whoever may map the pool may use
// the socket and nobody else. With tenants that map uids/gids (tenants.h) the file is mode 0666
// and each peer is the tenant its uid (else gid) maps to; an unmapped peer is refused. A refused
// peer reads one PERMISSION_DENIED frame saying why before the connection is closed.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "control_calls.h"
#include "local_load_staging.h"
#include "oscarkv/allocator/arena.h"

namespace oscarkv::service {

struct LocalControlOptions {
  std::string path;  // filesystem path of the socket (at most 107 bytes)
  int threads = 1;   // epoll threads, 1..64
  // Time slice each epoll thread asks the scheduler for (sched_setattr sched_runtime, honoured
  // by Linux >= 6.12), 100..100000 us; 0 = the kernel's default.
  uint32_t slice_us = 100;
  // Isolated shared memory: the sealed pool whose read-only descriptor AttachStaging hands out
  // (to admins; tenants get none and load through AttachLoadStaging/StageRead), and the largest
  // staging or load staging region a connection may attach. Null: AttachStaging, StageWrite,
  // AttachLoadStaging and StageRead are refused (FAILED_PRECONDITION).
  const Arena* isolated_pool = nullptr;
  uint64_t staging_max_bytes = uint64_t{64} << 20;
  // Connections one uid (SO_PEERCRED) may hold open; the next is answered RESOURCE_EXHAUSTED
  // and closed at accept. 0 = unbounded.
  uint32_t max_connections_per_uid = 256;
};

class LocalControlServer {
 public:
  // Binds and starts serving. UNAVAILABLE when another live process serves `path`; a stale
  // socket file (a killed daemon's) is replaced; any other file there is an error.
  static absl::StatusOr<std::unique_ptr<LocalControlServer>> Start(const LocalControlOptions& o,
                                                                   ControlCalls* calls);
  ~LocalControlServer();
  LocalControlServer(const LocalControlServer&) = delete;
  LocalControlServer& operator=(const LocalControlServer&) = delete;

  // Stops accepting, lets each thread finish the frames it is serving, closes every connection
  // and removes the socket file. Idempotent.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  struct Conn;
  struct Worker;
  LocalControlServer() = default;
  void Run(Worker* w);
  void Accept();
  // Serves every frame readable on `c` (at most a batch); false when `c` must be closed.
  bool ServeReadable(Worker* w, Conn* c);
  // false when `c` must be closed.
  bool Send(Worker* w, Conn* c, const char* data, size_t n);
  bool Flush(Worker* w, Conn* c);
  void Close(Worker* w, Conn* c);
  // `fd` >= 0: sent with the frame (SCM_RIGHTS); the caller keeps owning it.
  bool Reply(Worker* w, Conn* c, uint16_t method, uint64_t id, const absl::Status& s,
             const google::protobuf::MessageLite* msg, int fd = -1);
  // AttachStaging (isolated shared memory); false when `c` must be closed.
  bool AttachStaging(Worker* w, Conn* c, uint64_t id, const char* body, int body_bytes,
                     int passed_fd);
  // Reserve for `caller`: wire::Reserve, as over gRPC, within the frame limits.
  absl::Status Reserve(const Caller& caller, const pb::ReserveRequest& req,
                       pb::ReserveResponse* resp);
  // AttachLoadStaging (local_load_staging.h); false when `c` must be closed.
  bool AttachLoadStaging(Worker* w, Conn* c, uint64_t id, const char* body, int body_bytes);

  std::string path_;
  ControlCalls* calls_ = nullptr;
  uint32_t slice_us_ = 0;
  const Arena* isolated_pool_ = nullptr;
  uint64_t staging_max_bytes_ = 0;
  // Load staging regions are daemon memory a tenant asks for (and makes the daemon write): at
  // most this many bytes of them per tenant, 64 regions of the client library's 8 MiB.
  static constexpr uint64_t kLoadRegionBytesPerTenant = uint64_t{512} << 20;
  LoadRegionLimiter load_limiter_{kLoadRegionBytesPerTenant};
  // Open connections per peer uid (taken at accept, given back at close), at most
  // max_per_uid_ each (0 = unbounded).
  uint32_t max_per_uid_ = 0;
  absl::Mutex uid_mu_;
  absl::flat_hash_map<uint32_t, uint32_t> conns_per_uid_ ABSL_GUARDED_BY(uid_mu_);
  int listen_fd_ = -1;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint64_t> next_worker_{0};
  std::atomic<bool> stopped_{false};
};

}  // namespace oscarkv::service
