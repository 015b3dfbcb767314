// UcxLoader: loads leased pages from a daemon's pool with UCX RMA gets (the remote data path of
// docs/ARCHITECTURE.md §4, flows 2 and 3), instead of gRPC ReadPages or a shared-memory mapping.
//
// Contract
// * Connect() dials the daemon (HandleClient), asks GetDataPlane for its worker address and the
//   pool's exported rkey, creates this loader's ucp context and worker, registers ONE receive
//   buffer of `buffer_bytes` (the engine-facing staging buffer; batches larger than it are moved
//   in several rounds), connects an endpoint and imports the rkey.
// * A tenant without the pool key (the daemon's tenants and ucx.share_pool_key: false) gets a
//   data plane of its own instead (UcxDataPlaneInfo::staged): before each round of gets the
//   loader asks StageForRma to copy the round's leased pages into the tenant's staging region,
//   reads them there, and frees the stage on its next call. A round then holds at most half a
//   region (GetDataPlaneResponse.pool_bytes), or one page; a region full of other loaders'
//   stages of the same tenant is retried for transfer_timeout_ms, then the call fails with
//   RESOURCE_EXHAUSTED.
// * Load/LoadHandle: pin (Lookup with a lease / OpenHandle) → RMA get of every page into the
//   registered buffer → verify each page (size, header, codec, kind, XXH3 checksum when
//   verify_checksums) → copy out → release the lease. No page that failed verification is ever
//   returned: the whole call fails with DATA_LOSS.
// * A daemon that vanishes mid-transfer: the endpoint fails (UCX error callback or the transport's
//   no-progress watchdog, `peer_timeout_ms`), every in-flight request returns, the call returns
//   UNAVAILABLE, the lease is released (or expires on a dead daemon), the endpoint and worker are
//   dropped; the next call reconnects (fresh GetDataPlane, fresh worker).
// * Transports: `tls` is this side's UCX_TLS ("tcp", "shm", ...). With transports that cannot
//   report a dead peer (posix/sysv shm in UCX 1.13) the endpoint runs without UCX peer-failure
//   handling and the loader re-checks GetDataPlane before every batch, so a restarted daemon is
//   never read through an old endpoint.
// * Thread-safety: methods may be called from any thread; transfers are serialized (one worker).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "oscarkv/client/handles.h"

namespace oscarkv::client {

struct UcxLoaderOptions {
  ConnectOptions connect;           // daemon address, checksums, rpc deadline
  std::string tls = "tcp";          // UCX_TLS of this side
  std::string net_devices;          // UCX_NET_DEVICES ("lo" keeps tcp on loopback); "" = all
  uint64_t buffer_bytes = 64 << 20; // the registered receive buffer
  int64_t peer_timeout_ms = 1500;   // a peer completing nothing this long is declared gone
  int64_t transfer_timeout_ms = 2000;  // bound of one RMA round
};

struct UcxDataPlaneInfo {
  std::vector<std::string> daemon_transports;    // what the daemon's context got
  std::vector<std::string> endpoint_transports;  // lanes of this loader's endpoint
  bool peer_failure_detection = false;
  bool staged = false;  // reads the tenant's own staging region, not the pool (StageForRma)
};

class UcxLoader {
 public:
  static absl::StatusOr<std::unique_ptr<UcxLoader>> Connect(const UcxLoaderOptions& options);
  virtual ~UcxLoader() = default;

  virtual HandleClient& handles() = 0;
  virtual absl::StatusOr<UcxDataPlaneInfo> Info() = 0;

  // The longest cached prefix of `keys`, fetched by RMA.
  virtual absl::StatusOr<LoadResult> Load(const Codec& codec, std::span<const BlockKey> keys) = 0;
  // Engine buffers: registers [base, base + bytes) with UCX once (pinned until the loader is
  // destroyed), so LoadInto can fetch pages straight into it with no extra copy. The memory must
  // outlive the loader. INVALID_ARGUMENT for unmapped memory.
  virtual absl::Status RegisterBuffer(void* base, size_t bytes) = 0;
  // The longest cached prefix of `keys` fetched by RMA directly into dst[i] (each span inside one
  // registered buffer and at least the page's size), verified in place. Returns the pages loaded;
  // `bytes_out` (optional) each page's size. On any error the contents of dst are unspecified
  // (never a page that passed as verified) and the lease is released.
  virtual absl::StatusOr<uint32_t> LoadInto(const Codec& codec, std::span<const BlockKey> keys,
                                            std::span<const std::span<uint8_t>> dst,
                                            std::vector<uint64_t>* bytes_out = nullptr) = 0;
  // Every page of a transfer handle, fetched by RMA.
  virtual absl::StatusOr<HandlePages> LoadHandle(const Codec& codec,
                                                 const std::string& handle) = 0;
};

}  // namespace oscarkv::client
