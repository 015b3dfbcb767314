// Which network devices the UCX data plane may listen on (ucx_data_plane.h).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "ucx_data_plane.h"

namespace oscarkv::service {

namespace {

bool IsLoopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr);
    return (ip >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&ip) ||
           (IN6_IS_ADDR_V4MAPPED(&ip) && ip.s6_addr[12] == 127);
  }
  return false;
}

bool IsWildcard(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  if (a->sa_family == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  }
  return false;
}

bool SameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  }
  if (a->sa_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> DataPlaneNetDevices(const std::string& configured,
                                                const ListenAddress& listen) {
  if (!configured.empty()) return configured;
  const bool unix_socket = !listen.unix_path.empty();
  if (!unix_socket && (listen.host.empty() || listen.host == "*")) return std::string("all");

  // The listen host as addresses (a name such as localhost may stand for several).
  std::set<std::string> names;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) {
    return absl::InternalError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  addrinfo* res = nullptr;
  if (!unix_socket) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (const int rc = ::getaddrinfo(listen.host.c_str(), nullptr, &hints, &res); rc != 0) {
      ::freeifaddrs(ifs);
      return absl::InvalidArgumentError(absl::StrCat(
          "UCX net devices: cannot resolve the listen host '", listen.host, "': ",
          ::gai_strerror(rc), "; set ucx.net_devices"));
    }
  }
  bool wildcard = false;
  for (addrinfo* r = res; r != nullptr; r = r->ai_next) wildcard |= IsWildcard(r->ai_addr);
  for (ifaddrs* i = ifs; i != nullptr && !wildcard; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || !(i->ifa_flags & IFF_UP)) continue;
    // A unix-socket control plane serves this host only: the loopback device.
    if (unix_socket) {
      if (i->ifa_flags & IFF_LOOPBACK) names.insert(i->ifa_name);
      continue;
    }
    for (addrinfo* r = res; r != nullptr; r = r->ai_next) {
      // 127.0.0.0/8 is served by the loopback device whichever address of it was named.
      if (SameAddress(i->ifa_addr, r->ai_addr) ||
          (IsLoopback(r->ai_addr) && (i->ifa_flags & IFF_LOOPBACK))) {
        names.insert(i->ifa_name);
      }
    }
  }
  if (res != nullptr) ::freeaddrinfo(res);
  ::freeifaddrs(ifs);
  if (wildcard) return std::string("all");
  if (names.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "UCX net devices: no local interface holds the listen address ",
        unix_socket ? std::string("(no loopback device)") : listen.host,
        "; set ucx.net_devices (--ucx-net-devices)"));
  }
  return absl::StrJoin(names, ",");
}

bool DataPlaneReachableOffHost(const std::string& tls, const std::string& net_devices) {
  static const std::set<std::string> kSameHost = {"shm",  "sm",   "posix", "sysv",
                                                   "cma",  "knem", "xpmem", "self"};
  int named = 0;
  bool same_host_only = true;
  for (absl::string_view t : absl::StrSplit(tls, ',')) {
    t = absl::StripAsciiWhitespace(t);
    if (t.empty()) continue;
    ++named;
    if (t.front() == '^' || !kSameHost.contains(std::string(t))) same_host_only = false;
  }
  if (named > 0 && same_host_only) return false;  // "" = UCX's default: every transport
  std::set<std::string> loopback;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return true;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_flags & IFF_LOOPBACK) loopback.insert(i->ifa_name);
  }
  ::freeifaddrs(ifs);
  int devices = 0;
  for (absl::string_view d : absl::StrSplit(net_devices, ',')) {
    d = absl::StripAsciiWhitespace(d);
    if (d.empty()) continue;
    ++devices;
    if (!loopback.contains(std::string(d))) return true;  // "all", mlx5_0:1, eth0, ...
  }
  return devices == 0;
}

}  // namespace oscarkv::service
