#include "oscarkv/cluster/membership.h"

#include <netdb.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace oscarkv::cluster {

uint64_t RendezvousScore(std::string_view member, const BlockKey& key) {
  // Hash address || key in one buffer (addresses are short).
  char buf[256 + 16];
  const size_t n = std::min<size_t>(member.size(), 256);
  std::memcpy(buf, member.data(), n);
  std::memcpy(buf + n, key.bytes.data(), key.bytes.size());
  return XXH3_64bits(buf, n + key.bytes.size());
}

size_t OwnerIndex(std::span<const std::string> members, const BlockKey& key) {
  size_t best = 0;
  uint64_t best_score = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const uint64_t s = RendezvousScore(members[i], key);
    // Ties (astronomically rare) break toward the smaller address for determinism.
    if (i == 0 || s > best_score || (s == best_score && members[i] < members[best])) {
      best = i;
      best_score = s;
    }
  }
  return best;
}

std::vector<std::vector<size_t>> GroupByOwner(std::span<const std::string> members,
                                              std::span<const BlockKey> keys) {
  std::vector<std::vector<size_t>> groups(members.size());
  if (members.empty()) return groups;
  for (size_t i = 0; i < keys.size(); ++i) groups[OwnerIndex(members, keys[i])].push_back(i);
  return groups;
}

absl::StatusOr<std::vector<std::string>> ResolveAll(const std::string& name_and_port) {
  const size_t colon = name_and_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == name_and_port.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name_and_port, "' is not name:port"));
  }
  const std::string host = name_and_port.substr(0, colon), port = name_and_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve ", name_and_port, ": ", gai_strerror(rc)));
  }
  std::vector<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      out.push_back(absl::StrCat(buf, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf,
                sizeof(buf));
      out.push_back(absl::StrCat("[", buf, "]:", port));
    }
  }
  freeaddrinfo(res);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

class MembershipImpl final : public Membership {
 public:
  MembershipImpl(MembershipOptions o, std::unique_ptr<Prober> p, Resolver r)
      : opts_(std::move(o)), prober_(std::move(p)), resolver_(std::move(r)) {}

  ~MembershipImpl() override {
    stop_.Notify();
    if (thread_.joinable()) thread_.join();
  }

  void StartThread() {
    thread_ = std::thread([this] {
      while (!stop_.WaitForNotificationWithTimeout(opts_.probe_interval)) ProbeNow();
    });
  }

  std::vector<std::string> Live() const override {
    absl::MutexLock l(&mu_);
    return live_;
  }

  std::vector<MemberState> All() const override {
    absl::MutexLock l(&mu_);
    std::vector<MemberState> out;
    for (const auto& [addr, st] : members_) out.push_back({addr, st.live, st.failures});
    return out;
  }

  absl::StatusOr<std::string> OwnerOf(const BlockKey& key) const override {
    absl::MutexLock l(&mu_);
    if (live_.empty()) return absl::UnavailableError("no live cache daemon in the cluster");
    return live_[OwnerIndex(live_, key)];
  }

  void MarkDown(const std::string& address) override {
    absl::MutexLock l(&mu_);
    auto it = members_.find(address);
    if (it == members_.end()) return;
    // Even when it is already down: a probe round that started before this failure must not
    // bring it back (see ProbeNow).
    ++it->second.down_epoch;
    if (!it->second.live) return;
    it->second.live = false;
    it->second.failures = std::max(it->second.failures, opts_.failures_to_dead);
    RebuildLiveLocked();
  }

  void ProbeNow() override {
    std::vector<std::string> addrs;
    if (!opts_.dns_name.empty()) {
      auto r = resolver_(opts_.dns_name);
      if (r.ok()) {
        addrs = *r;
      } else {
        // Keep the last known members: a DNS hiccup must not empty the cluster.
        absl::MutexLock l(&mu_);
        for (const auto& [a, st] : members_) addrs.push_back(a);
      }
    } else {
      addrs = opts_.static_members;
    }
    // Each member's down epoch when the round starts. A probe answer is only as fresh as the
    // moment it was obtained: a member that answered and then hung may be marked down by a
    // failing call before this round applies its answers, and that newer verdict wins.
    std::vector<std::optional<uint64_t>> epoch(addrs.size());
    {
      absl::MutexLock l(&mu_);
      for (size_t i = 0; i < addrs.size(); ++i) {
        auto it = members_.find(addrs[i]);
        if (it != members_.end()) epoch[i] = it->second.down_epoch;
      }
    }
    // Probe without holding the lock (network I/O); probes run in parallel.
    std::vector<char> ok(addrs.size(), 0);
    std::vector<std::thread> probes;
    for (size_t i = 0; i < addrs.size(); ++i) {
      probes.emplace_back([&, i] { ok[i] = prober_->Probe(addrs[i], opts_.probe_timeout); });
    }
    for (auto& t : probes) t.join();
    absl::MutexLock l(&mu_);
    std::map<std::string, State> next;
    for (size_t i = 0; i < addrs.size(); ++i) {
      auto it = members_.find(addrs[i]);
      State st = it != members_.end() ? it->second : State{};
      if (it != members_.end() && epoch[i] != st.down_epoch) {
        next[addrs[i]] = st;  // marked down while this round probed: its answer is stale
        continue;
      }
      if (ok[i]) {
        st.failures = 0;
        st.live = true;
      } else {
        st.failures++;
        if (st.failures >= opts_.failures_to_dead) st.live = false;
      }
      next[addrs[i]] = st;
    }
    members_ = std::move(next);
    RebuildLiveLocked();
  }

 private:
  struct State {
    bool live = false;
    int failures = 0;
    uint64_t down_epoch = 0;  // MarkDown calls so far; a probe answer applies only if unchanged
  };
  void RebuildLiveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    live_.clear();
    for (const auto& [a, st] : members_) {
      if (st.live) live_.push_back(a);
    }
  }

  const MembershipOptions opts_;
  std::unique_ptr<Prober> prober_;
  Resolver resolver_;
  mutable absl::Mutex mu_;
  std::map<std::string, State> members_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> live_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Membership>> Membership::Start(MembershipOptions options,
                                                              std::unique_ptr<Prober> prober,
                                                              Resolver resolver) {
  if (options.static_members.empty() && options.dns_name.empty()) {
    return absl::InvalidArgumentError("cluster needs static members or a DNS name");
  }
  if (options.probe_interval <= absl::ZeroDuration() || options.failures_to_dead < 1) {
    return absl::InvalidArgumentError("probe_interval must be > 0 and failures_to_dead >= 1");
  }
  if (!prober) return absl::InvalidArgumentError("no prober");
  auto m = std::make_unique<MembershipImpl>(std::move(options), std::move(prober),
                                            std::move(resolver));
  m->ProbeNow();
  m->StartThread();
  return std::unique_ptr<Membership>(std::move(m));
}

}  // namespace oscarkv::cluster
