#include "oscarkv/service/config.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "oscarkv/util/args.h"
#include "oscarkv/util/host_port.h"
#include "yaml-cpp/yaml.h"

namespace oscarkv::service {

const std::string& DefaultConfigYaml() {
  static const std::string* yaml = new std::string(R"(# oscarkvd configuration (defaults). `oscarkvd --config FILE` reads a file like this one; a key
# left out keeps the default shown here. Every command-line flag, and the key it overrides:
#   --config FILE            this file             --print-default-config  print it and exit
#   --listen                 listen                --metrics-listen        metrics_listen
#   --node-id                node_id               --log-level             log_level
#   --pool-mb                pool.mb               --shm-name              pool.shm_name
#   --shm-mode               pool.shm_mode
#   --default-lease-ms       leases.default_ms     --max-lease-ms          leases.max_ms
#   --reservation-ttl-ms     leases.reservation_ttl_ms
#   --reaper-interval-ms     leases.reaper_interval_ms
#   --max-batch              limits.max_batch      --drain-timeout-ms      server.drain_timeout_ms
#   --grpc-threads           server.grpc_threads   --cpus                  server.cpus
#   --local-socket           server.local_socket   --local-threads         server.local_threads
#   --local-slice-us         server.local_slice_us
#   --ucx on|off             ucx.enabled           --ucx-tls               ucx.tls
#   --ucx-net-devices        ucx.net_devices
#   --ucx-allow-unverified-rma  ucx.allow_unverified_rma
#   --tier-path              tier.path             --tier-mb               tier.capacity_mb
#   --tier-queue-mb          tier.queue_mb         --version               print the version
#   --tls-cert               tls.cert              --tls-key               tls.key
#   --tls-client-ca          tls.client_ca         --allow-plaintext       tls.allow_plaintext
#   --tls-reload-s           tls.reload_s
#   --tls-allow-unauthenticated-clients  tls.allow_unauthenticated_clients
# Keys without a flag: pool.huge_pages, pool.cuda_register, pool.staging_max_mb,
# limits.max_message_mb,
# limits.max_codecs, server.index_shards, server.max_calls_per_peer, server.max_calls,
# server.max_streams_per_connection, server.local_max_connections_per_uid, tier.sync_writes.
listen: 127.0.0.1:50051         # gRPC: HOST:PORT (port 0 = any free port) or unix:/path
metrics_listen: 127.0.0.1:9464  # Prometheus GET /metrics: HOST:PORT (0 = any free port) or off
node_id: ""                     # reported in Handshake/Stats; "" = the host name
log_level: info                 # debug | info | warn | error (structured lines on stderr)
pool:
  mb: 0                         # page pool size in MiB; 0 = 25% of RAM, at most 64 GiB
  shm_name: ""                  # pool file /dev/shm/<name>; "" = oscarkvd-<port>-<pid>
  huge_pages: true              # ask for transparent huge pages (ignored when unavailable)
  cuda_register: true           # cudaHostRegister the pool when a GPU is present
  shm_mode: isolated            # isolated: clients map the pool read-only and store through a
                                # staging region the daemon copies and hashes; trusted: clients
                                # map it read-write (any process of this uid can rewrite pages)
  staging_max_mb: 64            # largest staging region one local connection may attach
leases:
  default_ms: 30000             # lease of a pinning Lookup when the client asks for 0
  max_ms: 600000                # longest lease a client may ask for
  reservation_ttl_ms: 30000     # uncommitted reservations are reclaimed after this
  reaper_interval_ms: 200       # how often expired leases/reservations are reclaimed
limits:
  max_batch: 4096               # most keys/items in one call (larger: INVALID_ARGUMENT)
  max_message_mb: 64            # gRPC message size limit, both directions
  max_codecs: 32                # distinct codec profiles this daemon accepts
server:
  drain_timeout_ms: 5000        # on SIGTERM, in-flight RPCs get this long to finish
  index_shards: 64              # lock shards of the page index
  grpc_threads: 0               # max gRPC server threads; 0 = gRPC's default
  max_calls_per_peer: 1024      # gRPC calls in flight from one peer IP (open streams count);
                                # more: RESOURCE_EXHAUSTED. 0 = unbounded
  max_calls: 8192               # gRPC calls in flight from all peers together; 0 = unbounded
  max_streams_per_connection: 1024  # HTTP/2 concurrent streams one connection may open
  cpus: ""                      # CPUs for every daemon thread ("1", "2-3,6"); "" = any
  local_socket: ""              # same-host Lookup/Release socket; "" = /dev/shm/<shm_name>.sock, off = none
  local_threads: 1              # epoll threads of the local socket (1..64)
  local_slice_us: 100           # their scheduler time slice (Linux >= 6.12); 0 = kernel default
  local_max_connections_per_uid: 256  # local-socket connections one uid may hold open; more are
                                # refused (RESOURCE_EXHAUSTED) at accept. 0 = unbounded
ucx:
  enabled: true                 # UCX data plane (GetDataPlane); false = off
  tls: tcp                      # UCX_TLS: tcp, shm (posix/sysv/cma), rc,ud, ...
  net_devices: ""               # UCX_NET_DEVICES; "" = the listen address's interface, all = every one
  share_pool_key: false         # hand the whole-pool RMA key to tenants too (default: admins only)
  allow_unverified_rma: false   # whole-pool data plane reachable off this host / with tenants
                                # (any peer that reaches it reads and writes the pool; README Security)
  tenant_region_mb: 64          # per-tenant RMA staging region (own data-plane process), MiB
tier:
  path: ""                      # SSD tier directory; "" = no tier (evicted pages are dropped)
  capacity_mb: 0                # tier file bytes, MiB (oldest segment dropped beyond); required with a path
  queue_mb: 64                  # demotion queue bound (evictions wait for room, then drop)
  sync_writes: false            # fsync every demotion: survives a machine crash, not only kill -9
tls:
  cert: ""                      # gRPC server certificate chain (PEM file); with key: TLS
  key: ""                       # its private key (PEM file)
  client_ca: ""                 # CA bundle (PEM) client certificates must chain to: mTLS
  allow_plaintext: false        # without TLS, serve a non-loopback listen address anyway
  allow_unauthenticated_clients: false  # TLS without client_ca on a non-loopback address
                                # anyway (every client is then the admin: README Security)
  reload_s: 10                  # re-read the files this often (and on SIGHUP); 0 = SIGHUP only
# Tenants (service/README.md "Tenants"). None = one tenant, "default", with the admin role and
# no quotas beyond limits.*: single-user behaviour. With tenants, gRPC needs mTLS (tls.client_ca)
# and a caller is the tenant its client certificate's subject CN or a URI SAN names (others are
# refused); each tenant sees only its own pages, leases, handles and codecs. Quotas left out:
# pool_mb = an even share of the pool (or what the explicit pool_mb quotas leave, split evenly,
# when less; quotas adding up to more than the pool are refused at start), pinned_pages 4096,
# leases 1024, handles 256, codecs 8 (over quota: RESOURCE_EXHAUSTED naming it).
tenants: []
#  - name: tenant-a              # certificate subject CN (or URI SAN, e.g. spiffe://x/tenant-a)
#    quota: {pool_mb: 1024, pinned_pages: 4096, leases: 1024, handles: 256, codecs: 8}
#    uids: [1000]                # local-socket peers that are this tenant (SO_PEERCRED); gids: []
#  - name: admin
#    role: admin                 # may clear every tenant's pages and read everyone's stats
shared_namespaces: []           # e.g. [{name: common, tenants: [tenant-a, tenant-b]}]: keys both
                                # may store and look up (client option shared_namespace)
)");
  return *yaml;
}

namespace {

template <typename T>
absl::Status ReadUint(const YAML::Node& n, const std::string& key, T* out, uint64_t lo,
                      uint64_t hi) {
  uint64_t v = 0;
  const std::string s = n.Scalar();
  if (!n.IsScalar() || !absl::SimpleAtoi(s, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": expected an integer in [", lo, ", ", hi, "], got '", s, "'"));
  }
  *out = static_cast<T>(v);
  return absl::OkStatus();
}

absl::Status ReadBool(const YAML::Node& n, const std::string& key, bool* out) {
  const std::string s = n.Scalar();
  if (s == "true" || s == "yes" || s == "on") {
    *out = true;
  } else if (s == "false" || s == "no" || s == "off") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(key, ": expected true or false, got '", s, "'"));
  }
  return absl::OkStatus();
}

absl::Status ReadString(const YAML::Node& n, const std::string& key, std::string* out) {
  if (!n.IsScalar() && !n.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": expected a string"));
  }
  *out = n.IsNull() ? "" : n.Scalar();
  return absl::OkStatus();
}

constexpr uint64_t kU32 = std::numeric_limits<uint32_t>::max();

// One table drives both YAML keys and their validation.
absl::Status ApplyKey(const std::string& key, const YAML::Node& v, DaemonConfig* c) {
  if (key == "listen") return ReadString(v, key, &c->listen);
  if (key == "ucx.enabled") return ReadBool(v, key, &c->ucx);
  if (key == "ucx.tls") return ReadString(v, key, &c->ucx_tls);
  if (key == "ucx.net_devices") return ReadString(v, key, &c->ucx_net_devices);
  if (key == "ucx.share_pool_key") return ReadBool(v, key, &c->ucx_share_pool_key);
  if (key == "ucx.allow_unverified_rma") return ReadBool(v, key, &c->ucx_allow_unverified_rma);
  if (key == "ucx.tenant_region_mb") return ReadUint(v, key, &c->ucx_tenant_region_mb, 1, 4096);
  if (key == "tls.cert") return ReadString(v, key, &c->tls_cert);
  if (key == "tls.key") return ReadString(v, key, &c->tls_key);
  if (key == "tls.client_ca") return ReadString(v, key, &c->tls_client_ca);
  if (key == "tls.allow_plaintext") return ReadBool(v, key, &c->allow_plaintext);
  if (key == "tls.allow_unauthenticated_clients") {
    return ReadBool(v, key, &c->tls_allow_unauthenticated_clients);
  }
  if (key == "tls.reload_s") return ReadUint(v, key, &c->tls_reload_s, 0, 86400);
  if (key == "metrics_listen") return ReadString(v, key, &c->metrics_listen);
  if (key == "node_id") return ReadString(v, key, &c->node_id);
  if (key == "log_level") return ReadString(v, key, &c->log_level);
  if (key == "pool.mb") return ReadUint(v, key, &c->pool_mb, 0, uint64_t{1} << 30);
  if (key == "pool.shm_name") return ReadString(v, key, &c->shm_name);
  if (key == "pool.huge_pages") return ReadBool(v, key, &c->huge_pages);
  if (key == "pool.cuda_register") return ReadBool(v, key, &c->cuda_register);
  if (key == "pool.shm_mode") return ReadString(v, key, &c->shm_mode);
  if (key == "pool.staging_max_mb") return ReadUint(v, key, &c->staging_max_mb, 1, 4096);
  if (key == "leases.default_ms") return ReadUint(v, key, &c->default_lease_ms, 1, kU32);
  if (key == "leases.max_ms") return ReadUint(v, key, &c->max_lease_ms, 1, kU32);
  if (key == "leases.reservation_ttl_ms") return ReadUint(v, key, &c->reservation_ttl_ms, 1, kU32);
  if (key == "leases.reaper_interval_ms") {
    return ReadUint(v, key, &c->reaper_interval_ms, 1, 3600000);
  }
  if (key == "limits.max_batch") return ReadUint(v, key, &c->max_batch, 1, 1000000);
  if (key == "limits.max_message_mb") return ReadUint(v, key, &c->max_message_mb, 1, 2047);
  if (key == "limits.max_codecs") return ReadUint(v, key, &c->max_codecs, 1, 256);
  if (key == "server.drain_timeout_ms") return ReadUint(v, key, &c->drain_timeout_ms, 0, 3600000);
  if (key == "server.index_shards") return ReadUint(v, key, &c->index_shards, 1, 4096);
  if (key == "server.grpc_threads") return ReadUint(v, key, &c->grpc_threads, 0, 4096);
  if (key == "server.max_calls_per_peer") {
    return ReadUint(v, key, &c->max_calls_per_peer, 0, 1000000);
  }
  if (key == "server.max_calls") return ReadUint(v, key, &c->max_calls, 0, 1000000);
  if (key == "server.max_streams_per_connection") {
    return ReadUint(v, key, &c->max_streams_per_connection, 1, 1000000);
  }
  if (key == "server.cpus") return ReadString(v, key, &c->cpus);
  if (key == "server.local_socket") return ReadString(v, key, &c->local_socket);
  if (key == "server.local_threads") return ReadUint(v, key, &c->local_threads, 1, 64);
  if (key == "server.local_slice_us") return ReadUint(v, key, &c->local_slice_us, 0, 100000);
  if (key == "server.local_max_connections_per_uid") {
    return ReadUint(v, key, &c->local_max_connections_per_uid, 0, 1000000);
  }
  if (key == "tier.path") return ReadString(v, key, &c->tier_path);
  if (key == "tier.capacity_mb") return ReadUint(v, key, &c->tier_mb, 0, uint64_t{1} << 40);
  if (key == "tier.queue_mb") return ReadUint(v, key, &c->tier_queue_mb, 1, 65536);
  if (key == "tier.sync_writes") return ReadBool(v, key, &c->tier_sync_writes);
  return absl::NotFoundError(absl::StrCat("unknown key '", key, "'"));  // see ApplyMap
}

bool IsSection(const std::string& key) {
  return key == "pool" || key == "leases" || key == "limits" || key == "server" || key == "ucx" ||
         key == "tier" || key == "tls";
}

const char* NodeKind(const YAML::Node& n) {
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a list";
  if (n.IsNull()) return "empty";
  return "a single value";
}

absl::Status AtLine(const YAML::Node& n, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat("line ", n.Mark().line + 1, ": ", msg));
}

absl::Status ReadIdList(const YAML::Node& n, const std::string& key, std::vector<uint32_t>* out) {
  if (!n.IsSequence()) return AtLine(n, absl::StrCat(key, " must be a list of numbers"));
  for (const YAML::Node& v : n) {
    uint32_t id = 0;
    if (absl::Status s = ReadUint(v, key, &id, 0, kU32 - 1); !s.ok()) {
      return AtLine(v, std::string(s.message()));
    }
    out->push_back(id);
  }
  return absl::OkStatus();
}

// tenants: [{name, role, quota: {pool_mb, pinned_pages, leases, handles, codecs}, uids, gids}]
absl::Status ApplyTenants(const YAML::Node& list, DaemonConfig* c) {
  if (list.IsNull()) return absl::OkStatus();
  if (!list.IsSequence()) {
    return AtLine(list, "tenants must be a list of {name, role, quota, uids, gids} entries");
  }
  std::vector<TenantConfig> out;
  for (const YAML::Node& item : list) {
    const std::string where = absl::StrCat("tenants[", out.size(), "]");
    if (!item.IsMap()) return AtLine(item, absl::StrCat(where, " must be a map"));
    TenantConfig t;
    bool named = false;
    for (const auto& kv : item) {
      const std::string k = kv.first.as<std::string>();
      const std::string key = absl::StrCat(where, ".", k);
      absl::Status s;
      if (k == "name") {
        s = kv.second.IsScalar() ? ReadString(kv.second, key, &t.name)
                                 : absl::InvalidArgumentError(key + " must be a string");
        named = true;
      } else if (k == "role") {
        const std::string role = kv.second.IsScalar() ? kv.second.Scalar() : "";
        if (role == "admin") {
          t.admin = true;
        } else if (role != "tenant") {
          s = absl::InvalidArgumentError(
              absl::StrCat(key, ": expected admin or tenant, got '", role, "'"));
        }
      } else if (k == "uids" || k == "gids") {
        s = ReadIdList(kv.second, key, k == "uids" ? &t.uids : &t.gids);
        if (!s.ok()) return s;
      } else if (k == "quota") {
        if (kv.second.IsNull()) continue;
        if (!kv.second.IsMap()) return AtLine(kv.second, key + " must be a map");
        for (const auto& q : kv.second) {
          const std::string qk = q.first.as<std::string>();
          const std::string qkey = absl::StrCat(key, ".", qk);
          uint64_t v = 0;
          absl::Status qs;
          if (qk == "pool_mb") {
            qs = ReadUint(q.second, qkey, &v, 1, uint64_t{1} << 30);
            t.pool_mb = v;
          } else if (qk == "pinned_pages" || qk == "leases" || qk == "handles") {
            qs = ReadUint(q.second, qkey, &v, 0, 10000000);
            (qk == "pinned_pages" ? t.pinned_pages : qk == "leases" ? t.leases : t.handles) = v;
          } else if (qk == "codecs") {
            qs = ReadUint(q.second, qkey, &v, 0, 256);
            t.codecs = v;
          } else {
            qs = absl::InvalidArgumentError(absl::StrCat(
                "unknown quota '", qkey, "' (pool_mb, pinned_pages, leases, handles, codecs)"));
          }
          if (!qs.ok()) return AtLine(q.first, std::string(qs.message()));
        }
      } else {
        s = absl::InvalidArgumentError(
            absl::StrCat("unknown key '", key, "' (name, role, quota, uids, gids)"));
      }
      if (!s.ok()) return AtLine(kv.first, std::string(s.message()));
    }
    if (!named) return AtLine(item, absl::StrCat(where, " has no name"));
    out.push_back(std::move(t));
  }
  c->tenants = std::move(out);
  return absl::OkStatus();
}

// shared_namespaces: [{name, tenants: [a, b]}]
absl::Status ApplySharedNamespaces(const YAML::Node& list, DaemonConfig* c) {
  if (list.IsNull()) return absl::OkStatus();
  if (!list.IsSequence()) {
    return AtLine(list, "shared_namespaces must be a list of {name, tenants} entries");
  }
  std::vector<SharedNamespaceConfig> out;
  for (const YAML::Node& item : list) {
    const std::string where = absl::StrCat("shared_namespaces[", out.size(), "]");
    if (!item.IsMap()) return AtLine(item, absl::StrCat(where, " must be a map"));
    SharedNamespaceConfig ns;
    for (const auto& kv : item) {
      const std::string k = kv.first.as<std::string>();
      if (k == "name" && kv.second.IsScalar()) {
        ns.name = kv.second.Scalar();
      } else if (k == "tenants" && kv.second.IsSequence()) {
        for (const YAML::Node& m : kv.second) {
          if (!m.IsScalar()) return AtLine(m, absl::StrCat(where, ".tenants: names only"));
          ns.tenants.push_back(m.Scalar());
        }
      } else {
        return AtLine(kv.first, absl::StrCat("'", where, ".", k, "': expected name (a string) "
                                             "and tenants (a list of tenant names)"));
      }
    }
    out.push_back(std::move(ns));
  }
  c->shared_namespaces = std::move(out);
  return absl::OkStatus();
}

absl::Status ApplyMap(const YAML::Node& map, const std::string& prefix, DaemonConfig* c) {
  for (const auto& kv : map) {
    const std::string key = prefix + kv.first.as<std::string>();
    const YAML::Mark m = kv.first.Mark();
    auto at_line = [&](const std::string& msg) {
      return absl::InvalidArgumentError(absl::StrCat("line ", m.line + 1, ": ", msg));
    };
    if (prefix.empty() && key == "tenants") {
      if (absl::Status s = ApplyTenants(kv.second, c); !s.ok()) return s;
      continue;
    }
    if (prefix.empty() && key == "shared_namespaces") {
      if (absl::Status s = ApplySharedNamespaces(kv.second, c); !s.ok()) return s;
      continue;
    }
    // A known section must hold a map; a key that is not a section must not.
    if (prefix.empty() && IsSection(key)) {
      if (kv.second.IsNull()) continue;  // an empty section changes nothing
      if (!kv.second.IsMap()) {
        return at_line(absl::StrCat(key, " must be a map (a section of '", key,
                                    ".*' keys), not ", NodeKind(kv.second)));
      }
      if (absl::Status s = ApplyMap(kv.second, key + ".", c); !s.ok()) return s;
      continue;
    }
    DaemonConfig scratch;  // ApplyKey answers NOT_FOUND for a key it does not know
    if (ApplyKey(key, YAML::Node(""), &scratch).code() == absl::StatusCode::kNotFound) {
      return at_line(absl::StrCat(kv.second.IsMap() && prefix.empty() ? "unknown section '"
                                                                      : "unknown key '",
                                  key, "'"));
    }
    if (kv.second.IsMap() || kv.second.IsSequence()) {
      return at_line(absl::StrCat(key, " must be a single value, not ", NodeKind(kv.second)));
    }
    if (absl::Status s = ApplyKey(key, kv.second, c); !s.ok()) {
      return at_line(std::string(s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyConfigYaml(const std::string& yaml, const std::string& source,
                             DaemonConfig* config) {
  DaemonConfig c = *config;
  try {
    YAML::Node root = YAML::Load(yaml);
    if (root.IsNull()) return absl::OkStatus();  // empty file: nothing to change
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the configuration must be a YAML mapping of keys to values"));
    }
    if (absl::Status s = ApplyMap(root, "", &c); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid YAML at line ",
                                                   e.mark.line + 1, ", column ",
                                                   e.mark.column + 1, ": ", e.msg));
  }
  *config = c;
  return absl::OkStatus();
}

absl::Status ApplyConfigFile(const std::string& path, DaemonConfig* config) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ApplyConfigYaml(ss.str(), path, config);
}

std::string ListenAddress::ToGrpc() const {
  if (!unix_path.empty()) return absl::StrCat("unix:", unix_path);
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& text, bool allow_off,
                                                 bool allow_unix) {
  ListenAddress a;
  if (allow_off && text == "off") {
    a.off = true;
    return a;
  }
  HostPortRules rules;
  rules.allow_unix = allow_unix;
  auto hp = ParseHostPort(text, rules);
  if (!hp.ok()) {
    if (!allow_off) return hp.status();
    return absl::InvalidArgumentError(absl::StrCat(hp.status().message(), " (or off)"));
  }
  a.host = hp->host;
  a.port = hp->port;
  a.unix_path = hp->unix_path;
  return a;
}

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  constexpr int kMaxCpu = 1023;
  std::vector<int> out;
  if (text.empty()) return absl::InvalidArgumentError("empty CPU list");
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    const size_t dash = part.find('-');
    int lo = 0, hi = 0;
    const bool ok = dash == absl::string_view::npos
                        ? absl::SimpleAtoi(part, &lo) && (hi = lo, true)
                        : absl::SimpleAtoi(part.substr(0, dash), &lo) &&
                              absl::SimpleAtoi(part.substr(dash + 1), &hi);
    if (!ok || lo < 0 || hi < lo || hi > kMaxCpu) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", part, "' in '", text, "' is not a CPU number or range (0..", kMaxCpu, ")"));
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

uint64_t DefaultPoolMb() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t mb = pages > 0 && page > 0 ? (uint64_t(pages) * uint64_t(page) / 4) >> 20 : 1024;
  return std::min<uint64_t>(std::max<uint64_t>(mb, 64), 64 * 1024);
}

namespace {

Args MakeArgs() {
  Args a("oscarkvd",
         "The oscarkv node cache daemon: stores OSCAR-compressed KV-cache pages for inference\n"
         "engines on this host (gRPC API oscarkv.v1, shared-memory fast path).");
  a.Option("config", "", "YAML config file (see --print-default-config); flags override it")
      .Option("listen", "", "gRPC address HOST:PORT (port 0 = any free port) or unix:/path "
                            "(default 127.0.0.1:50051)")
      .Option("metrics-listen", "", "Prometheus /metrics HOST:PORT (0 = free port) or off "
                                    "(default 127.0.0.1:9464)")
      .Option("pool-mb", "", "page pool size in MiB (default 25% of RAM, at most 64 GiB)")
      .Option("shm-name", "", "pool file name under /dev/shm (default oscarkvd-<port>-<pid>)")
      .Option("shm-mode", "", "isolated (default: clients map the pool read-only and store "
                              "through staging the daemon verifies) or trusted (clients map it "
                              "read-write)")
      .Option("default-lease-ms", "", "lease of a pinning Lookup that asks for 0 (default 30000)")
      .Option("max-lease-ms", "", "longest lease a client may ask for (default 600000)")
      .Option("reservation-ttl-ms", "", "uncommitted reservations expire after (default 30000)")
      .Option("reaper-interval-ms", "", "expiry check period (default 200)")
      .Option("max-batch", "", "most keys/items per call (default 4096)")
      .Option("drain-timeout-ms", "", "SIGTERM grace period for in-flight RPCs (default 5000)")
      .Option("grpc-threads", "", "max gRPC server threads (default: gRPC's)")
      .Option("cpus", "", "CPUs every daemon thread runs on, e.g. 1 or 2-3,6 (default: any)")
      .Option("local-socket", "", "same-host control socket for Lookup/Release: a path, or off "
                                  "(default /dev/shm/<shm-name>.sock)")
      .Option("local-threads", "", "epoll threads serving the local socket (default 1)")
      .Option("local-slice-us", "", "scheduler time slice of those threads, 100..100000 us, or 0 "
                                    "for the kernel's default (default 100; Linux >= 6.12)")
      .Option("node-id", "", "node name in Handshake/Stats (default: host name)")
      .Option("ucx", "", "UCX data plane on|off (default on; off: GetDataPlane answers "
                         "FAILED_PRECONDITION)")
      .Option("ucx-tls", "", "UCX_TLS of the data plane: tcp, shm, rc,ud, ... (default tcp)")
      .Option("ucx-net-devices", "", "UCX_NET_DEVICES of the data plane, or all (default: the "
                                     "interface of the --listen address; all for 0.0.0.0)")
      .Flag("ucx-allow-unverified-rma", "run the whole-pool UCX data plane where it is "
                                        "reachable off this host, or with tenants (for admins): "
                                        "any peer that reaches it reads and writes the pool")
      .Option("tier-path", "", "SSD tier directory: evicted pages are demoted there and survive "
                               "restarts (default: no tier)")
      .Option("tier-mb", "", "SSD tier capacity in MiB: its files never exceed it, the oldest segment goes first (required with --tier-path)")
      .Option("tier-queue-mb", "", "demotion queue bound in MiB (default 64)")
      .Option("log-level", "", "debug|info|warn|error (default info)")
      .Option("tls-cert", "", "gRPC over TLS: server certificate chain, PEM file (with --tls-key)")
      .Option("tls-key", "", "private key of --tls-cert, PEM file")
      .Option("tls-client-ca", "", "mTLS: CA bundle (PEM) client certificates must chain to; "
                                   "clients without one are refused")
      .Option("tls-reload-s", "", "re-read the TLS files every N s and on SIGHUP (new "
                                  "connections get them; a bad file keeps the old); 0 = SIGHUP "
                                  "only (default 10)")
      .Flag("tls-allow-unauthenticated-clients",
            "serve TLS without --tls-client-ca on a non-loopback --listen address (by default "
            "refused: no client is authenticated, so every client is the admin)")
      .Flag("allow-plaintext", "serve plaintext gRPC on a non-loopback --listen address (by "
                               "default refused without TLS)")
      .Flag("print-default-config", "print the embedded default YAML config and exit")
      .Flag("version", "print the version and exit")
      .Epilog(
          "When ready, prints one line to stdout:\n"
          "  oscarkvd ready listen=HOST:PORT metrics=HOST:PORT|off shm=/dev/shm/NAME pool_bytes=N "
          "local=PATH|off\n"
          "SIGTERM/SIGINT: stop accepting, drain in-flight RPCs, demote the pool's pages to the "
          "SSD tier (when there is one) until --drain-timeout-ms, remove the pool file, exit 0.\n"
          "Exit codes: 0 clean stop (or --help, --version, --print-default-config), 1 could not\n"
          "start or failed while running (one 'oscarkvd: ...' line on stderr), 2 bad flag or config.\n"
          "Logs are key=value lines on stderr. See service/README.md.");
  return a;
}

}  // namespace

std::string CommandLineHelp() {
  std::string h = MakeArgs().Help();
  const std::string prefix = "usage: oscarkv oscarkvd";
  if (h.rfind(prefix, 0) == 0) h = "usage: oscarkvd" + h.substr(prefix.size());
  return h;
}

absl::StatusOr<CommandLineAction> ParseCommandLine(int argc, char** argv, DaemonConfig* config) {
  Args args = MakeArgs();
  if (absl::Status s = args.Parse(argc, argv); !s.ok()) {
    std::string msg(s.message());
    const std::string prefix = "usage: oscarkv oscarkvd";
    if (auto p = msg.find(prefix); p != std::string::npos) msg.replace(p, prefix.size(), "usage: oscarkvd");
    return absl::InvalidArgumentError(msg);
  }
  if (args.help_requested()) return CommandLineAction::kHelp;
  if (args.flag("print-default-config")) return CommandLineAction::kPrintDefaultConfig;
  if (args.flag("version")) return CommandLineAction::kVersion;
  if (!args.positional().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args.positional()[0], "' (see --help)"));
  }
  DaemonConfig c = *config;
  if (args.given("config")) {
    if (absl::Status s = ApplyConfigFile(args.str("config"), &c); !s.ok()) return s;
  }
  auto str = [&](const char* flag, std::string* out) {
    if (args.given(flag)) *out = args.str(flag);
  };
  auto num = [&](const char* flag, auto* out, uint64_t lo, uint64_t hi) -> absl::Status {
    if (!args.given(flag)) return absl::OkStatus();
    uint64_t v = 0;
    if (!absl::SimpleAtoi(args.str(flag), &v) || v < lo || v > hi) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected an integer in [", lo,
                                                     ", ", hi, "], got '", args.str(flag), "'"));
    }
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(v);
    return absl::OkStatus();
  };
  str("listen", &c.listen);
  str("metrics-listen", &c.metrics_listen);
  str("shm-name", &c.shm_name);
  str("shm-mode", &c.shm_mode);
  str("node-id", &c.node_id);
  str("log-level", &c.log_level);
  str("ucx-tls", &c.ucx_tls);
  str("ucx-net-devices", &c.ucx_net_devices);
  str("cpus", &c.cpus);
  str("local-socket", &c.local_socket);
  str("tier-path", &c.tier_path);
  str("tls-cert", &c.tls_cert);
  str("tls-key", &c.tls_key);
  str("tls-client-ca", &c.tls_client_ca);
  if (args.flag("allow-plaintext")) c.allow_plaintext = true;
  if (args.flag("tls-allow-unauthenticated-clients")) c.tls_allow_unauthenticated_clients = true;
  if (args.flag("ucx-allow-unverified-rma")) c.ucx_allow_unverified_rma = true;
  if (args.given("ucx")) {
    const std::string u = args.str("ucx");
    if (u != "on" && u != "off") {
      return absl::InvalidArgumentError(absl::StrCat("--ucx: expected on or off, got '", u, "'"));
    }
    c.ucx = u == "on";
  }
  for (absl::Status s : {num("pool-mb", &c.pool_mb, 1, uint64_t{1} << 30),
                         num("default-lease-ms", &c.default_lease_ms, 1, kU32),
                         num("max-lease-ms", &c.max_lease_ms, 1, kU32),
                         num("reservation-ttl-ms", &c.reservation_ttl_ms, 1, kU32),
                         num("reaper-interval-ms", &c.reaper_interval_ms, 1, 3600000),
                         num("max-batch", &c.max_batch, 1, 1000000),
                         num("drain-timeout-ms", &c.drain_timeout_ms, 0, 3600000),
                         num("grpc-threads", &c.grpc_threads, 0, 4096),
                         num("local-threads", &c.local_threads, 1, 64),
                         num("local-slice-us", &c.local_slice_us, 0, 100000),
                         num("tier-mb", &c.tier_mb, 1, uint64_t{1} << 40),
                         num("tier-queue-mb", &c.tier_queue_mb, 1, 65536),
                         num("tls-reload-s", &c.tls_reload_s, 0, 86400)}) {
    if (!s.ok()) return s;
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  *config = c;
  return CommandLineAction::kRun;
}

}  // namespace oscarkv::service
