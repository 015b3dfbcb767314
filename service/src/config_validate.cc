// DaemonConfig::Validate: the checks across fields (config.h), split from config.cc's parsing.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oscarkv/service/config.h"

namespace oscarkv::service {
namespace {
// 127.0.0.0/8, ::1 or localhost: reachable from this host only.
bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}
}  // namespace

namespace {
// A tenant or namespace name: what a certificate CN or URI SAN can hold, printable, no spaces.
bool GoodName(const std::string& n) {
  if (n.empty() || n.size() > 256) return false;
  return std::all_of(n.begin(), n.end(), [](char ch) { return ch > ' ' && ch < 127; });
}

absl::Status ValidateTenants(const DaemonConfig& c) {
  if (c.tenants.empty()) {
    if (!c.shared_namespaces.empty()) {
      return absl::InvalidArgumentError("shared_namespaces needs tenants: to share between");
    }
    return absl::OkStatus();
  }
  if (c.tenants.size() > kMaxTenants) {
    return absl::InvalidArgumentError(absl::StrCat("tenants: at most ", kMaxTenants));
  }
  if (c.tls_client_ca.empty()) {
    return absl::InvalidArgumentError(
        "tenants: need mTLS (tls.cert, tls.key and tls.client_ca / --tls-client-ca): a gRPC "
        "caller's tenant is the subject CN or URI SAN of its client certificate");
  }
  std::vector<std::string> names;
  uint64_t codecs = 0;
  std::vector<uint32_t> uids, gids;
  for (const TenantConfig& t : c.tenants) {
    if (!GoodName(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenants: name '", t.name.substr(0, 64), "' must be 1..256 printable characters, "
          "no spaces (a certificate CN or URI SAN)"));
    }
    names.push_back(t.name);
    codecs += t.codecs.value_or(kDefaultQuotaCodecs);
    uids.insert(uids.end(), t.uids.begin(), t.uids.end());
    gids.insert(gids.end(), t.gids.begin(), t.gids.end());
  }
  for (const SharedNamespaceConfig& s : c.shared_namespaces) {
    if (!GoodName(s.name)) {
      return absl::InvalidArgumentError(absl::StrCat("shared_namespaces: name '",
                                                     s.name.substr(0, 64), "' is not valid"));
    }
    if (s.tenants.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shared_namespaces: '", s.name, "' lists no tenants"));
    }
    for (const std::string& m : s.tenants) {
      if (std::find(names.begin(), names.end(), m) == names.end()) {
        return absl::InvalidArgumentError(absl::StrCat("shared_namespaces: '", s.name,
                                                       "' names unknown tenant '", m, "'"));
      }
    }
    names.push_back(s.name);
  }
  std::sort(names.begin(), names.end());
  if (auto it = std::adjacent_find(names.begin(), names.end()); it != names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenants/shared_namespaces: the name '", *it, "' is used twice"));
  }
  for (auto* ids : {&uids, &gids}) {
    std::sort(ids->begin(), ids->end());
    if (auto it = std::adjacent_find(ids->begin(), ids->end()); it != ids->end()) {
      return absl::InvalidArgumentError(absl::StrCat("tenants: ", ids == &uids ? "uid " : "gid ",
                                                     *it, " is mapped to two tenants"));
    }
  }
  // Every tenant's codec quota must fit the daemon's codec table at once, so one tenant filling
  // its quota never leaves another without room (registrations in a shared namespace count
  // against the registering tenant's quota).
  if (codecs > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenants: the codec quotas add up to ", codecs,
        "; the daemon holds at most 256 codec registrations"));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status DaemonConfig::Validate() const {
  if (auto a = ParseListenAddress(listen, false, true); !a.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("listen: ", a.status().message()));
  }
  if (auto a = ParseListenAddress(metrics_listen, true, false); !a.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics_listen: ", a.status().message()));
  }
  if (shm_mode != "isolated" && shm_mode != "trusted") {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.shm_mode: '", shm_mode, "' is not isolated or trusted"));
  }
  if (staging_max_mb < 1 || staging_max_mb > 4096) {
    return absl::InvalidArgumentError("pool.staging_max_mb must be 1..4096");
  }
  if (log_level != "debug" && log_level != "info" && log_level != "warn" && log_level != "error") {
    return absl::InvalidArgumentError(
        absl::StrCat("log_level: '", log_level, "' is not debug, info, warn or error"));
  }
  if (default_lease_ms > max_lease_ms) {
    return absl::InvalidArgumentError(absl::StrCat("default lease (", default_lease_ms,
                                                   " ms) exceeds the max lease (", max_lease_ms,
                                                   " ms)"));
  }
  if (default_lease_ms == 0 || reservation_ttl_ms == 0 || reaper_interval_ms == 0 ||
      max_batch == 0) {
    return absl::InvalidArgumentError(
        "lease, reservation ttl, reaper interval and max batch must be positive");
  }
  if (local_slice_us != 0 && local_slice_us < 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_slice_us: ", local_slice_us, " is below 100 (0 = kernel default)"));
  }
  if (!tier_path.empty() && tier_mb == 0) {
    return absl::InvalidArgumentError(
        "tier.capacity_mb (--tier-mb) must be set when tier.path (--tier-path) is");
  }
  if (tier_path.empty() && tier_mb != 0) {
    return absl::InvalidArgumentError(
        "tier.capacity_mb (--tier-mb) is set but tier.path (--tier-path) is not");
  }
  if (!cpus.empty()) {
    if (auto l = ParseCpuList(cpus); !l.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cpus: ", l.status().message()));
    }
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("tls: cert and key go together (--tls-cert, --tls-key)");
  }
  if (!tls_client_ca.empty() && tls_cert.empty()) {
    return absl::InvalidArgumentError("tls: client_ca needs the server's cert and key too");
  }
  if (absl::Status s = ValidateTenants(*this); !s.ok()) return s;
  auto a = ParseListenAddress(listen, false, true);
  const bool off_host = a->unix_path.empty() && !IsLoopbackHost(a->host);
  // TLS without a client CA asks no client for a certificate, so no caller is anyone in
  // particular: every one is the admin tenant "default" (tenants: need client_ca, see above).
  if (off_host && !tls_cert.empty() && tls_client_ca.empty() &&
      !tls_allow_unauthenticated_clients) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing TLS without client certificates on ", listen, ": with no tls.client_ca "
        "(--tls-client-ca) the daemon authenticates no client, so anyone on that network is the "
        "admin and can read, change and delete every client's pages. Configure "
        "--tls-client-ca (mTLS; with tenants: a certificate names its tenant), listen on "
        "loopback, or pass --tls-allow-unauthenticated-clients "
        "(tls.allow_unauthenticated_clients: true) for a network of trusted clients"));
  }
  if (tls_cert.empty() && !allow_plaintext) {
    if (off_host) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing plaintext gRPC on ", listen, ": anyone on that network could read, "
          "change and delete every client's pages. Configure TLS (--tls-cert/--tls-key, and "
          "--tls-client-ca for mTLS), listen on loopback, or pass --allow-plaintext "
          "(tls.allow_plaintext: true) for a trusted network"));
    }
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::service
