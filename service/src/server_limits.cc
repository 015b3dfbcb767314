#include "server_limits.h"

#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace oscarkv::service {

absl::string_view PeerHost(absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return peer;
  const size_t colon = peer.rfind(':');
  return colon <= 4 ? peer : peer.substr(0, colon);
}

PeerCallLimits::Shard& PeerCallLimits::ShardOf(absl::string_view peer) const {
  return shards_[absl::HashOf(peer) % kShards];
}

absl::Status PeerCallLimits::Enter(absl::string_view peer) {
  if (per_peer_ == 0 && total_ == 0) return absl::OkStatus();
  const int64_t now = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (total_ != 0 && now > total_) {
    in_flight_.fetch_sub(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "oscarkvd has ", total_, " gRPC calls in flight, its limit (server.max_calls); retry "
        "shortly"));
  }
  if (per_peer_ == 0) return absl::OkStatus();
  Shard& s = ShardOf(peer);
  absl::MutexLock lock(&s.mu);
  uint32_t& n = s.calls[peer];
  if (n >= per_peer_) {
    in_flight_.fetch_sub(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "peer ", peer.substr(0, 128), " has ", per_peer_, " gRPC calls in flight, the limit "
        "per peer (server.max_calls_per_peer); finish or cancel some (open streams count)"));
  }
  ++n;
  return absl::OkStatus();
}

void PeerCallLimits::Leave(absl::string_view peer) {
  if (per_peer_ == 0 && total_ == 0) return;
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (per_peer_ == 0) return;
  Shard& s = ShardOf(peer);
  absl::MutexLock lock(&s.mu);
  auto it = s.calls.find(peer);
  if (it == s.calls.end()) return;
  if (--it->second == 0) s.calls.erase(it);
}

uint32_t PeerCallLimits::in_flight(absl::string_view peer) const {
  Shard& s = ShardOf(peer);
  absl::MutexLock lock(&s.mu);
  auto it = s.calls.find(peer);
  return it == s.calls.end() ? 0 : it->second;
}

}  // namespace oscarkv::service
