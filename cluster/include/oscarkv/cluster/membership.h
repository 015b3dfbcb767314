// Cluster membership and key ownership, used by both the daemon and the client library.
//
// Members come from a static list of "host:port" addresses, or from a DNS name that resolves to
// every member (the Kubernetes headless-service pattern: "oscarkv.ns.svc.cluster.local:50051"),
// re-resolved on every probe round so members that appear join and members that vanish leave.
// A prober checks each member every `probe_interval`; a member that fails `failures_to_dead`
// probes in a row (or that a caller reports with MarkDown) stops owning keys at once, so its
// keys become misses within probe_interval + probe_timeout (< 2 s with the defaults) and never
// hang a lookup. A member that answers again rejoins.
//
// Ownership is rendezvous (highest-random-weight) hashing over the live members: each key goes
// to the member with the highest XXH3-64(address || key) score, so a member's death moves only
// its own keys and its return moves them back.
//
// Thread-safety: all methods of Membership are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "oscarkv/kernels/block_key.h"

namespace oscarkv::cluster {

// The rendezvous score of `member` for `key`; the owner is the highest.
uint64_t RendezvousScore(std::string_view member, const BlockKey& key);
// Index into `members` of the owner of `key`; members must be non-empty.
size_t OwnerIndex(std::span<const std::string> members, const BlockKey& key);
// For each member index, the positions of `keys` it owns (in input order).
std::vector<std::vector<size_t>> GroupByOwner(std::span<const std::string> members,
                                              std::span<const BlockKey> keys);

// Checks whether a member is serving. The real one does an oscarkv Handshake over gRPC (see
// NewGrpcProber in grpc_prober.h); tests pass fakes.
class Prober {
 public:
  virtual ~Prober() = default;
  virtual bool Probe(const std::string& address, absl::Duration timeout) = 0;
};

// Resolves "name:port" to every address it names ("ip:port"); the seam for DNS.
using Resolver = std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)>;
// getaddrinfo-based resolver (IPv4 and IPv6; IPv6 printed as [addr]:port).
absl::StatusOr<std::vector<std::string>> ResolveAll(const std::string& name_and_port);

struct MembershipOptions {
  std::vector<std::string> static_members;  // "host:port"
  std::string dns_name;                     // "name:port"; used when non-empty
  absl::Duration probe_interval = absl::Milliseconds(500);
  absl::Duration probe_timeout = absl::Milliseconds(400);
  int failures_to_dead = 1;
};

class Membership {
 public:
  // Starts the probe thread after one synchronous round, so Live() is meaningful on return.
  static absl::StatusOr<std::unique_ptr<Membership>> Start(MembershipOptions options,
                                                           std::unique_ptr<Prober> prober,
                                                           Resolver resolver = ResolveAll);
  virtual ~Membership() = default;

  // Live members, sorted (stable input to ownership).
  virtual std::vector<std::string> Live() const = 0;
  // Every known member with its state.
  struct MemberState {
    std::string address;
    bool live;
    int consecutive_failures;
  };
  virtual std::vector<MemberState> All() const = 0;
  // Owner of `key` among live members; UNAVAILABLE if none is live.
  virtual absl::StatusOr<std::string> OwnerOf(const BlockKey& key) const = 0;
  // A caller saw `address` fail (RPC error or timeout): mark it down now instead of waiting
  // for the next probe round. The prober brings it back when it answers in a probe round that
  // starts after this call; the answers of a round already under way (one may have been
  // obtained just before the member hung) are discarded for it, so they cannot undo this.
  virtual void MarkDown(const std::string& address) = 0;
  // Runs one probe round now (tests; normally the background thread does this).
  virtual void ProbeNow() = 0;
};

}  // namespace oscarkv::cluster
