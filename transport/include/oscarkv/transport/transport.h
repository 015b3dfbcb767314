// oscarkv's UCX (ucp) data plane: RMA get/put of page batches between a daemon's registered
// pool and a client's (engine's) registered buffers.
//
// Lifecycle (explicit, NIXL-style):
//   1. Context::Create(options)         one per process; picks transports (UCX_TLS) and reports
//                                       what it got through capabilities().
//   2. Context::Register(addr, len)     pins and registers memory -> MemoryRegion; Export() gives
//                                       an opaque blob (base, length, packed rkey) for the peer.
//   3. Worker::Create(context)          progress engine; address() is an opaque blob for the peer.
//   4. Blobs travel out of band (gRPC fields in the service; bootstrap.h for tests and benches).
//   5. Worker::Connect(peer_address)    -> Endpoint (peer-failure handling on).
//      Endpoint::ImportRemote(blob)     -> RemoteMemory (unpacked rkey, bounds known).
//   6. Endpoint::Post(kGet|kPut, local region, remote, descs) -> Transfer; Transfer::Wait(timeout)
//      or Transfer::Test(). Every descriptor is bounds-checked against both regions first.
//   7. Release in reverse: Transfers, RemoteMemory, Endpoints, Workers, MemoryRegions, Context.
//      Everything is RAII; destroying an object releases its UCX handles.
//
// Error model: absl::Status everywhere. A peer that dies or stops progressing makes its endpoint
// fail with UNAVAILABLE within EndpointOptions::peer_timeout (default 1.5 s): UCX's error callback
// (tcp reset, keepalive), or this library's no-progress watchdog, whichever is first. Outstanding
// requests are then cancelled (the endpoint is force-closed), Wait() returns UNAVAILABLE only
// after every request has returned, and each op's own status says which ops really completed --
// so no buffer is still being written after Wait() returns and a failed op is never reported OK.
// A failed endpoint stays failed; connect a new one. Bad arguments: INVALID_ARGUMENT.
//
// Threads: Context (Register, Export, capabilities) is safe from any thread. A Worker and the
// Endpoints, RemoteMemory and Transfers made from it belong to one thread at a time (the
// daemon's data-plane thread, or the client's calling thread) unless the context was created with
// multi_threaded = true, which lets UCX lock the worker (slower).
//
// Transports come from UCX_TLS (ContextOptions::tls overrides the environment for this context):
// "tcp" anywhere; "shm" (posix/sysv shared memory + cma) within a host; "rc,ud" (or "rc_x,dc_x")
// with RDMA NICs; "cuda_copy,cuda_ipc" when UCX is built with CUDA. Debian's UCX has tcp, posix,
// sysv, cma, ib -- no CUDA: capabilities().cuda_memory is then false and GPU buffers must be
// staged through registered (pinned) host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <ucp/api/ucp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "oscarkv/transport/ucx_handles.h"

namespace oscarkv::transport {

struct ContextOptions {
  // UCX_TLS for this context ("tcp", "shm", "posix,cma", "rc,ud", ...). Empty: the environment's
  // UCX_TLS, else UCX's default (all).
  std::string tls;
  // UCX_NET_DEVICES ("lo" keeps tcp on loopback). Empty: environment, else all.
  std::string net_devices;
  // UCX_KEEPALIVE_INTERVAL: how often UCX probes idle peers (shm peers are only found dead by it).
  absl::Duration keepalive_interval = absl::Milliseconds(500);
  // Let workers be driven from several threads (UCS_THREAD_MODE_MULTI).
  bool multi_threaded = false;
  std::string name = "oscarkv";
};

enum class MemoryType { kHost, kCuda };

// What the context actually got (not what was asked for).
struct Capabilities {
  std::string tls_requested;            // "" if UCX's default
  std::vector<std::string> transports;  // "tcp/lo", "posix/memory", "cma/memory", ... (deduped)
  bool cuda_memory = false;  // UCX can register and move cudaMalloc'd memory itself
  // Some transport can report a dead peer (tcp, ib rc/ud/dc), so endpoints can use
  // EndpointOptions::ErrorHandling::kPeer. Not with posix/sysv shared memory alone.
  bool peer_failure_detection = false;
  bool HasTransport(absl::string_view name) const;  // name before the '/': "tcp", "posix", ...
  // GPU buffers must go through pinned host memory (UCX lacks CUDA).
  bool needs_gpu_staging() const { return !cuda_memory; }
  std::string ToString() const;
};

class MemoryRegion;
class Worker;
class Endpoint;
class RemoteMemory;
class Transfer;

class Context {
 public:
  static absl::StatusOr<std::unique_ptr<Context>> Create(const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Capabilities& capabilities() const { return caps_; }
  const ContextOptions& options() const { return options_; }

  // Registers [addr, addr + length) for RMA. Host memory must be mapped (checked: INVALID_ARGUMENT
  // otherwise); CUDA memory needs capabilities().cuda_memory (FAILED_PRECONDITION otherwise).
  // The region must outlive every Transfer that uses it and must not be freed before it.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t length,
                                                         MemoryType type = MemoryType::kHost);

  // Allocates and registers `length` bytes through UCX (UCP_MEM_MAP_ALLOCATE), so the memory
  // comes from the best memory domain of the context -- with shm, a posix/sysv segment that peers
  // on the host map directly: zero-copy RMA that needs no progress on this side. User memory
  // passed to Register() is reachable over shm only through UCX's active-message emulation (or
  // cma), which is much slower. This is how a daemon should get its pool. Freed with the region.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Allocate(size_t length);

  ucp_context_h raw() const { return context_.get(); }

 private:
  Context() = default;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Map(void* addr, size_t length, MemoryType type,
                                                    bool allocate);
  ContextOptions options_;
  Capabilities caps_;
  UcpContextPtr context_;
};

class MemoryRegion {
 public:
  ~MemoryRegion() = default;  // unregisters (unpins)
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  uint8_t* base() const { return base_; }
  size_t length() const { return length_; }
  bool Contains(const void* p, size_t n) const;
  // Opaque blob for a peer's Endpoint::ImportRemote: base address, length and packed rkey.
  const std::string& exported() const { return export_blob_; }
  ucp_mem_h raw() const { return mem_.get(); }

 private:
  friend class Context;
  MemoryRegion(uint8_t* base, size_t length, UcpMemPtr mem, std::string blob)
      : base_(base), length_(length), mem_(std::move(mem)), export_blob_(std::move(blob)) {}
  uint8_t* base_;
  size_t length_;
  UcpMemPtr mem_;
  std::string export_blob_;
};

struct EndpointOptions {
  // A peer that completes nothing for this long while ops are outstanding is declared gone.
  absl::Duration peer_timeout = absl::Milliseconds(1500);
  // kPeer: UCX itself reports a dead peer (tcp reset, keepalive, cma ESRCH) and then only uses
  // transports able to do so -- tcp, ib, but not posix/sysv shared memory in UCX 1.13, so with
  // UCX_TLS=shm alone Connect fails (FAILED_PRECONDITION; Capabilities::peer_failure_detection
  // says so up front). UCX_TLS=shm,tcp connects, but then moves everything over tcp.
  // kNone: any transport (posix/sysv mapped segments included); a dead peer is then found only
  // by the peer_timeout watchdog when requests stop completing, and RMA on a dead peer's
  // still-mapped segment may keep succeeding (with the bytes it held).
  enum class ErrorHandling { kPeer, kNone };
  ErrorHandling error_handling = ErrorHandling::kPeer;
  std::string name = "oscarkv-ep";
};

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(Context& context);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Opaque blob for a peer's Connect.
  const std::string& address() const { return address_; }
  // Connects to a peer worker. Fails with INVALID_ARGUMENT on a malformed address; an unreachable
  // peer shows up as UNAVAILABLE on the first transfer.
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(absl::string_view peer_address,
                                                    const EndpointOptions& options = {});

  // One progress pass; returns the number of events processed.
  unsigned Progress();
  // Progresses while there is work, then sleeps on the worker's event fd for at most `timeout`
  // (no busy spinning when idle). For server loops and progress threads; a peer doing RMA over a
  // transport without native RMA (tcp) needs this side to progress.
  void WaitForEvents(absl::Duration timeout);

  Context& context() const { return *context_; }
  ucp_worker_h raw() const { return worker_.get(); }
  int event_fd() const { return efd_; }

 private:
  Worker() = default;
  Context* context_ = nullptr;
  UcpWorkerPtr worker_;
  std::string address_;
  int efd_ = -1;  // owned by UCX
};

// An unpacked remote key bound to one endpoint, with the remote region's bounds.
class RemoteMemory {
 public:
  ~RemoteMemory() = default;
  RemoteMemory(const RemoteMemory&) = delete;
  RemoteMemory& operator=(const RemoteMemory&) = delete;
  uint64_t base() const { return base_; }
  size_t length() const { return length_; }
  bool Contains(uint64_t addr, size_t n) const;
  ucp_rkey_h raw() const { return rkey_.get(); }

 private:
  friend class Endpoint;
  RemoteMemory(uint64_t base, size_t length, UcpRkeyPtr rkey)
      : base_(base), length_(length), rkey_(std::move(rkey)) {}
  uint64_t base_;
  size_t length_;
  UcpRkeyPtr rkey_;
};

enum class Direction { kGet, kPut };  // get: remote -> local; put: local -> remote
const char* DirectionName(Direction d);

// One contiguous copy. `local` must lie in the local MemoryRegion, [remote, remote + length) in
// the RemoteMemory.
struct TransferDesc {
  void* local;
  uint64_t remote;
  size_t length;
};

class Endpoint {
 public:
  // Flushes and closes gracefully (bounded by peer_timeout), or force-closes a failed endpoint.
  // All Transfers and RemoteMemory of this endpoint must be destroyed first.
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Parses a MemoryRegion::exported() blob. INVALID_ARGUMENT for anything malformed.
  absl::StatusOr<std::unique_ptr<RemoteMemory>> ImportRemote(absl::string_view blob);

  // Posts every descriptor as one RMA op. Fails up front (nothing posted) on an empty batch, an
  // out-of-bounds descriptor or a failed endpoint. A put batch completes only once its data is
  // visible at the peer (a flush follows the puts).
  absl::StatusOr<std::unique_ptr<Transfer>> Post(Direction direction, const MemoryRegion& local,
                                                 const RemoteMemory& remote,
                                                 std::span<const TransferDesc> descs);
  // Post + Wait.
  absl::Status Run(Direction direction, const MemoryRegion& local, const RemoteMemory& remote,
                   std::span<const TransferDesc> descs,
                   absl::Duration timeout = absl::InfiniteDuration());

  // OK until the peer failed or Abort() was called; then the reason (UNAVAILABLE).
  absl::Status status() const { return status_; }
  bool failed() const { return !status_.ok(); }
  // Force-closes the endpoint: outstanding requests complete with an error (after progress).
  void Abort(absl::Status reason);

  Worker& worker() const { return *worker_; }
  const EndpointOptions& options() const { return options_; }
  // Transports of this endpoint's lanes, from UCX's own description (e.g. "tcp/lo", "cma/memory").
  std::vector<std::string> Transports() const;
  // UCX's full description of the endpoint's configuration (lanes, protocols, thresholds).
  std::string Describe() const;

 private:
  friend class Worker;
  friend class Transfer;
  Endpoint() = default;
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  void Close(bool force);

  Worker* worker_ = nullptr;
  EndpointOptions options_;
  ucp_ep_h ep_ = nullptr;  // closed by Close(); an ep close is a request, not a plain deleter
  absl::Status status_;
};

// A posted batch. Wait() or Test() until done; the destructor of an unfinished Transfer aborts
// its endpoint (so no request can still write into buffers the caller is about to free).
class Transfer {
 public:
  ~Transfer();
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  // Progresses once. true: every op completed OK; false: still in flight; error: the batch
  // failed and every request has returned (per-op results in op_status()).
  absl::StatusOr<bool> Test();
  // Waits until done, failed, or `timeout` (then DEADLINE_EXCEEDED, the batch stays posted).
  // Sleeps on the worker's event fd between progress passes. A peer that completes nothing for
  // peer_timeout fails the endpoint (UNAVAILABLE).
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration());

  // Per-op result; meaningful once Test()/Wait() returned something other than "in flight".
  // For puts an op is OK only once the closing flush succeeded.
  size_t size() const;
  const absl::Status& op_status(size_t i) const;
  size_t num_ok() const;
  uint64_t bytes() const;

 private:
  friend class Endpoint;
  struct State;  // what the UCX callbacks write; outlives the Transfer if a request never returns
  Transfer(Endpoint* ep, Direction d, size_t n);
  void Progressed();  // after a progress pass: watchdog, put flush, final status
  void DrainAfterAbort();

  Endpoint* ep_;
  std::unique_ptr<State> state_;
};

}  // namespace oscarkv::transport
