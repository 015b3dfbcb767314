// PeerCallLimits: bounds the gRPC calls one peer (an IP address; a unix socket is one peer) and
// all peers together may have in flight. Every call holds daemon resources while it runs -- a
// stream a sync-pool thread and its buffers for as long as the client keeps it open -- so without
// a bound one client could hold them all. Enter() admits a call or answers RESOURCE_EXHAUSTED
// naming the limit (nothing held); Leave() ends an admitted call. Thread-safe: a short critical
// section on one of kShards mutexes (by peer hash) plus one atomic for the total.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace oscarkv::service {

// The peer of a gRPC context's peer() string without its port: "ipv4:10.0.0.5:4711" ->
// "ipv4:10.0.0.5", "ipv6:[::1]:80" -> "ipv6:[::1]"; anything else (unix:...) as it is.
absl::string_view PeerHost(absl::string_view peer);

class PeerCallLimits {
 public:
  // 0 = no limit of that kind.
  PeerCallLimits(uint32_t per_peer, uint32_t total) : per_peer_(per_peer), total_(total) {}

  absl::Status Enter(absl::string_view peer_host);
  void Leave(absl::string_view peer_host);
  // Calls in flight now (tests, metrics).
  int64_t total_in_flight() const { return in_flight_.load(std::memory_order_relaxed); }
  uint32_t in_flight(absl::string_view peer_host) const;

 private:
  static constexpr size_t kShards = 16;
  struct Shard {
    mutable absl::Mutex mu;
    // Only peers with a call in flight: at most `total` entries in all shards.
    absl::flat_hash_map<std::string, uint32_t> calls ABSL_GUARDED_BY(mu);
  };
  Shard& ShardOf(absl::string_view peer) const;

  const uint32_t per_peer_, total_;
  std::atomic<int64_t> in_flight_{0};
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace oscarkv::service
