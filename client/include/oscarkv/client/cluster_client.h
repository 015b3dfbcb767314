// ClusterClient: one client over N oscarkvd daemons (docs/ARCHITECTURE.md §4, flow 4).
//
// Contract
// * Membership comes from a static "host:port" list or a DNS name resolving to every member
//   (cluster/membership.h), health-checked by a background gRPC prober. Each block key is owned
//   by the rendezvous-hash owner among the LIVE members; Store/Lookup/Load group keys per owner
//   and call the owners in parallel.
// * Bounded failure: every per-owner call runs under `owner_timeout_ms`. An owner that fails
//   (UNAVAILABLE, DEADLINE_EXCEEDED, a broken stream) is marked down at once: its keys count as
//   misses for that call and route elsewhere afterwards; the prober brings it back when it
//   answers again (rejoin). An owner that fails only after answering -- a Load's or a
//   LoadHandle's pages arrived and verified, then the lease release timed out -- is marked down
//   the same way; that call still returns its pages. A Lookup or Load therefore returns within about owner_timeout_ms
//   (+ connect time), never hangs, and never returns a page that did not verify (checksums on).
// * Prefix semantics: keys are a chained prefix; the matched prefix across owners is the longest
//   run keys[0..m) of which every key was found on its owner.
// * Page bytes move over gRPC (ReadPages/WritePages) by default: a member's shared-memory segment
//   is only valid for the daemon incarnation that created it, and a member restarted between two
//   probes would otherwise be read through a stale mapping. Set `member_data_path` to kAuto to
//   allow shm when members share this host and never restart under a live client.
// * Codecs are registered on a member lazily, the first time a call routes there, and again when
//   a member answers NOT_FOUND for the codec (a restarted member forgot it).
// * Transfer handles are owned like keys: the owner of HandleOwnerKey(codec, name) stores all
//   the handle's pages and pins them.
// * Thread-safety: every method may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/client/client.h"
#include "oscarkv/client/handles.h"
#include "oscarkv/cluster/membership.h"

namespace oscarkv::client {

struct ClusterOptions {
  cluster::MembershipOptions membership;  // static_members or dns_name, probe settings
  int64_t owner_timeout_ms = 1000;        // deadline of each per-owner call
  DataPath member_data_path = DataPath::kGrpc;
  std::string client_name = "oscarkv-cluster-client";
  bool verify_checksums = true;
  // Load / LoadHandle pages by UCX RMA from each member's pool (ucx_loader.h) instead of gRPC;
  // needs the library built with the transport module (else Connect fails UNIMPLEMENTED).
  bool ucx = false;
  std::string ucx_tls = "tcp";
  std::string ucx_net_devices;  // "lo" keeps tcp on loopback
  uint64_t ucx_buffer_bytes = 16 << 20;  // registered once per member connection
};

struct ClusterLookupResult {
  uint32_t matched = 0;
  uint32_t owners_failed = 0;  // owners that did not answer (their keys counted as misses)
};

struct ClusterLoadResult {
  uint32_t matched = 0;  // pages loaded (longest prefix found and verified)
  std::vector<std::vector<uint8_t>> pages;
  std::vector<std::string> owners;  // member each page came from
  uint32_t owners_failed = 0;
  uint64_t bytes = 0;
};

class ClusterClient {
 public:
  // prober = nullptr: the real gRPC prober. resolver: the DNS seam (tests).
  static absl::StatusOr<std::unique_ptr<ClusterClient>> Connect(
      ClusterOptions options, std::unique_ptr<cluster::Prober> prober = nullptr,
      cluster::Resolver resolver = cluster::ResolveAll);
  virtual ~ClusterClient() = default;

  virtual cluster::Membership& membership() = 0;

  // Registers on every live member (and lazily on members that join later). UNAVAILABLE when
  // no member is live.
  virtual absl::StatusOr<Codec> RegisterCodec(const CodecProfile& profile) = 0;

  // Each page goes to its key's owner. item_status per page; a dead owner's pages fail with
  // UNAVAILABLE (the call itself succeeds).
  virtual absl::StatusOr<StoreResult> Store(const Codec& codec,
                                            std::span<const PageWrite> pages) = 0;
  virtual absl::StatusOr<ClusterLookupResult> Lookup(const Codec& codec,
                                                     std::span<const BlockKey> keys) = 0;
  virtual absl::StatusOr<ClusterLoadResult> Load(const Codec& codec,
                                                 std::span<const BlockKey> keys) = 0;

  // Transfer handles routed to the handle's owner.
  static BlockKey HandleOwnerKey(const Codec& codec, const std::string& handle);
  virtual absl::StatusOr<uint64_t> PublishHandle(const Codec& codec, const std::string& handle,
                                                 std::span<const PageWrite> pages,
                                                 const std::string& metadata,
                                                 uint32_t ttl_ms = 0) = 0;
  virtual absl::StatusOr<HandlePages> LoadHandle(const Codec& codec,
                                                 const std::string& handle) = 0;
  virtual absl::Status CloseHandle(const Codec& codec, const std::string& handle) = 0;
};

}  // namespace oscarkv::client
