// The daemon's UCX data plane: one ucp context and worker, the pool arena registered once, and a
// progress thread that sleeps on the worker's event fd when idle (tcp RMA is emulated with
// active messages, so the target side must progress). Clients learn the worker address and the
// pool's exported rkey through the GetDataPlane RPC and then read leased pages with RMA gets.
//
// Who can reach it. The worker serves software-emulated RMA (tcp; and get/put active messages
// on any transport) at whatever address a peer names, checking no key (ucx_tenant_regions.h):
// a peer that reaches it reads and writes the whole pool. So the daemon (daemon.cc) runs it
// only without tenants (or with ucx.share_pool_key), and where another host could reach it
// (DataPlaneReachableOffHost) only with ucx.allow_unverified_rma; with tenants, each tenant
// loads through a data plane of its own instead (TenantRegions) and none maps the pool.
//
// Fault isolation. UCX 1.13 aborts the whole process on some peer failures it does not route to
// an error callback: a client killed while the daemon is still sending the reply of its emulated
// tcp GET ends in `ucp_request.inl: Fatal: unexpected error: Endpoint timeout` inside UCX's own
// active-message handler. A node cache must not die because one engine did, so when the pool is
// a shared-memory file the data plane runs in a child process (`oscarkvd` re-executed in its
// internal data-plane mode) that maps the same file and registers it; the daemon supervises it
// and restarts it when it dies, and GetDataPlane always describes the live child (a new worker
// address and rkey after a restart; clients reconnect on their next call, as after any
// data-plane failure). Leases and pins live in the daemon, so a child's death loses no page and
// releases no pin early. Without a shared-memory pool file the data plane runs in-process.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "oscarkv/service/config.h"
#include "oscarkv/transport/transport.h"
#include "oscarkv/v1/oscarkv.pb.h"

namespace oscarkv {
class Subprocess;
}  // namespace oscarkv

namespace oscarkv::service {

int RunUcxDataPlaneChild(int argc, char** argv);

// UCX_NET_DEVICES of the data plane. `configured` (config ucx.net_devices) wins when set ("all" =
// every device). Empty: the interfaces the gRPC `listen` address is reachable on, so the data
// plane listens nowhere the control plane does not: the loopback device for a loopback or
// unix-socket address, the interface that holds the address for any other IP, "all" for a
// wildcard (0.0.0.0, ::). NOT_FOUND when no local interface holds the address.
// UCX_NET_DEVICES filters network devices only: shared-memory transports are not affected, and
// an RDMA transport (rc, ud, dc) needs its HCA port named here explicitly (e.g. mlx5_0:1).
absl::StatusOr<std::string> DataPlaneNetDevices(const std::string& configured,
                                                const ListenAddress& listen);

// Whether a data plane of UCX_TLS `tls` on UCX_NET_DEVICES `net_devices` (DataPlaneNetDevices'
// answer) can be reached from another host: false only when every transport named is a
// shared-memory one (shm, sm, posix, sysv, cma, knem, xpmem, self) or every device is a loopback
// interface. Anything else ("all", a negation "^...", an HCA port, a device not found) counts
// as reachable. Which peers ON this host can reach it is not decided here: a loopback tcp port
// is open to every local process, whatever its uid.
bool DataPlaneReachableOffHost(const std::string& tls, const std::string& net_devices);

struct UcxDataPlaneOptions {
  std::string tls;
  std::string net_devices;
  uint8_t* pool_base = nullptr;
  size_t pool_bytes = 0;
  // The pool's shared-memory file; empty: run in-process (no isolation).
  std::string shm_path;
  // Instead of shm_path, for a sealed (isolated) pool: a read-only descriptor of it, inherited
  // by the child, which maps it PROT_READ (RMA gets only read the pool). Owned by the caller and
  // kept open for the data plane's life (a restarted child inherits it again).
  int shm_fd = -1;
  // The oscarkvd binary to re-execute for the child (default /proc/self/exe).
  std::string self_exe = "/proc/self/exe";
};

class UcxDataPlane {
 public:
  static absl::StatusOr<std::unique_ptr<UcxDataPlane>> Start(const UcxDataPlaneOptions& options);
  ~UcxDataPlane();  // stops the child (or the progress thread), then releases everything
  UcxDataPlane(const UcxDataPlane&) = delete;
  UcxDataPlane& operator=(const UcxDataPlane&) = delete;

  // The live data plane's description; UNAVAILABLE while a crashed child is being restarted.
  // Safe from any thread.
  absl::StatusOr<::oscarkv::v1::GetDataPlaneResponse> Info() const;
  bool isolated() const { return isolated_; }
  uint64_t restarts() const { return restarts_.load(); }

 private:
  class Core;
  friend int RunUcxDataPlaneChild(int argc, char** argv);

  UcxDataPlane() = default;
  absl::Status SpawnChild();
  void Supervise();

  UcxDataPlaneOptions options_;
  bool isolated_ = false;
  std::unique_ptr<Core> core_;  // in-process mode

  // Isolated mode: the child; its stdin pipe is its lifeline.
  mutable std::mutex mu_;
  std::shared_ptr<Subprocess> child_;
  bool up_ = false;
  ::oscarkv::v1::GetDataPlaneResponse info_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> restarts_{0};
  std::thread supervisor_;
};

// The child's entry point (`oscarkvd --internal-ucx-data-plane SHM_PATH POOL_BYTES TLS NETDEVS
// PARENT_PID`): maps the pool file, starts the data plane on it, writes its GetDataPlaneResponse
// (8-byte little-endian length, then the bytes) to stdout, and serves until stdin reaches EOF
// (the daemon is gone or stopping it). Returns the process exit code.
int RunUcxDataPlaneChild(int argc, char** argv);


}  // namespace oscarkv::service
