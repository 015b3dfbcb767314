// DaemonConfig: oscarkvd's settings. Sources, later ones winning: the embedded default YAML
// (DefaultConfigYaml, printed by `oscarkvd --print-default-config`), a YAML file (--config),
// then command-line flags. Unknown YAML keys and out-of-range values are errors that name the
// key, so a typo never silently falls back to a default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace oscarkv::service {

// One entry of `tenants:` (service/README.md "Tenants"). A quota left out takes its default:
// pool_mb = the pool divided evenly among the tenants, pinned_pages 4096, leases 1024,
// handles 256, codecs 8.
struct TenantConfig {
  std::string name;    // the client certificate's subject CN or a URI SAN
  bool admin = false;  // role: admin -- clear every tenant's pages, everyone's stats
  std::optional<uint64_t> pool_mb;
  std::optional<uint64_t> pinned_pages, leases, handles, codecs;
  std::vector<uint32_t> uids, gids;  // local-socket peers (SO_PEERCRED) that are this tenant
};
inline constexpr uint64_t kDefaultQuotaPinnedPages = 4096;
inline constexpr uint64_t kDefaultQuotaLeases = 1024;
inline constexpr uint64_t kDefaultQuotaHandles = 256;
inline constexpr uint64_t kDefaultQuotaCodecs = 8;
inline constexpr size_t kMaxTenants = 1024;

// One entry of `shared_namespaces:`: keys its member tenants may store and look up together.
struct SharedNamespaceConfig {
  std::string name;
  std::vector<std::string> tenants;
};

struct DaemonConfig {
  std::string listen = "127.0.0.1:50051";       // HOST:PORT (port 0 = any free port) or unix:/path
  std::string metrics_listen = "127.0.0.1:9464";  // HOST:PORT, port 0 = any free port, or "off"
  std::string node_id;                           // "" = host name
  std::string log_level = "info";                // debug | info | warn | error
  uint64_t pool_mb = 0;                          // 0 = 25% of RAM, at most 64 GiB
  std::string shm_name;                          // "" = oscarkvd-<port>-<pid>
  bool huge_pages = true;
  bool cuda_register = true;
  // Same-host shared memory (service/README.md "Shared memory without trust"): "isolated" = the
  // pool is a sealed memfd clients map read-only, and they store through a staging region the
  // daemon copies and hashes; "trusted" = clients map the pool file read-write and the daemon
  // trusts their checksums (faster stores; any process of the daemon's uid can rewrite pages).
  std::string shm_mode = "isolated";
  uint32_t staging_max_mb = 64;  // largest staging region one local connection may attach
  uint32_t default_lease_ms = 30000;
  uint32_t max_lease_ms = 600000;
  uint32_t reservation_ttl_ms = 30000;
  uint32_t reaper_interval_ms = 200;
  uint32_t max_batch = 4096;
  uint32_t max_message_mb = 64;
  uint32_t max_codecs = 32;
  uint32_t drain_timeout_ms = 5000;
  uint32_t index_shards = 64;
  uint32_t grpc_threads = 0;  // 0 = gRPC's default
  // gRPC calls in flight (an open stream counts for as long as it is open) from one peer IP and
  // in all, and HTTP/2 streams per connection; 0 = unbounded. Over a call limit: RESOURCE_EXHAUSTED.
  uint32_t max_calls_per_peer = 1024;
  uint32_t max_calls = 8192;
  uint32_t max_streams_per_connection = 1024;
  // CPUs the daemon's threads may run on ("1", "2-3,6"); "" = any. Set before any thread
  // starts, so every gRPC, reaper and UCX thread inherits it (e.g. one core for the daemon and
  // the rest for the engine on a small node: no cross-core wake-up per request).
  std::string cpus;
  // Same-host control socket (Handshake/Lookup/Release without gRPC; proto/oscarkv/v1/
  // local_control.h): "" = <pool file>.sock (/dev/shm/<shm_name>.sock), "off" = none, or a path.
  std::string local_socket;
  uint32_t local_threads = 1;  // its epoll threads (each serves its connections' calls inline)
  // Time slice those threads ask the scheduler for (Linux >= 6.12 honours it): they run a few
  // microseconds per wake-up, and a short slice lets them run ahead of CPU-bound work on the
  // same cores. 0 = the kernel's default; else 100..100000.
  uint32_t local_slice_us = 100;
  // Local-socket connections one uid may hold open at once (each costs the daemon a descriptor,
  // its buffers and mapped staging); more are refused at accept. 0 = unbounded.
  uint32_t local_max_connections_per_uid = 256;
  // UCX data plane (GetDataPlane): on/off, UCX_TLS ("tcp", "shm", "rc,ud", ...) and
  // UCX_NET_DEVICES ("" = all; "lo" keeps tcp on loopback).
  bool ucx = true;
  std::string ucx_tls = "tcp";
  std::string ucx_net_devices;
  // GetDataPlane's pool key reads the whole pool: false = only admin callers get it (without
  // tenants every caller is one); true = every tenant too (each can then read all pages).
  bool ucx_share_pool_key = false;
  // The whole-pool data plane (ucx_data_plane.h) maps the entire pool, and UCX serves the RMA
  // it emulates in software (tcp; and any peer's get/put active messages) at whatever address
  // the request names, checking no key: whoever reaches its worker reads and writes the pool.
  // So it runs only without tenants (or with share_pool_key), and off this host (a network
  // transport on a non-loopback device) only with this set; with tenants it does not run at
  // all unless this is set (then for admins). false: the daemon refuses such a config.
  bool ucx_allow_unverified_rma = false;
  // A tenant without the pool key loads over UCX through a staging region of its own (a memfd
  // of this many MiB, served by a data-plane process of its own, started on its first
  // GetDataPlane): at most tenants x this much daemon memory (resident once used).
  uint64_t ucx_tenant_region_mb = 64;
  // SSD tier (service/README.md "SSD tier"): off when tier_path is "".
  std::string tier_path;          // directory (RocksDB pages + the codecs file)
  uint64_t tier_mb = 0;           // page capacity in MiB (required with a path)
  uint64_t tier_queue_mb = 64;    // demotion queue bound
  bool tier_sync_writes = false;  // fsync every demotion (survives a machine crash, slower)
  // gRPC over TLS: the server's certificate chain and key (PEM files; both or neither), and the
  // CA bundle client certificates must chain to ("" = no client certificate asked: TLS, not
  // mTLS). Without TLS, a listen address that is not loopback (or a unix socket) is refused
  // unless allow_plaintext says plaintext on that network is intended.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  bool allow_plaintext = false;
  // TLS without tls_client_ca authenticates no client: every caller is the admin tenant. On a
  // listen address that is not loopback (or a unix socket) that is refused unless this says a
  // network of trusted clients is intended.
  bool tls_allow_unauthenticated_clients = false;
  // The files are re-read on SIGHUP and every tls_reload_s seconds (0 = on SIGHUP only); new
  // connections get what changed, a bad new file is logged and the old ones keep serving.
  uint32_t tls_reload_s = 10;
  // Tenants (tenants.h): empty = one default tenant with the admin role (single-user mode).
  // Configured tenants need mTLS (tls.client_ca): a gRPC caller is its client certificate.
  std::vector<TenantConfig> tenants;
  std::vector<SharedNamespaceConfig> shared_namespaces;

  // Range and format checks across fields (listen addresses, log level, lease bounds).
  absl::Status Validate() const;
};

// The embedded default configuration (YAML, with comments).
const std::string& DefaultConfigYaml();

// Applies the keys present in `yaml` on top of *config. `source` names the text in errors
// (e.g. the file path). INVALID_ARGUMENT for malformed YAML, unknown keys or bad values.
absl::Status ApplyConfigYaml(const std::string& yaml, const std::string& source,
                             DaemonConfig* config);
absl::Status ApplyConfigFile(const std::string& path, DaemonConfig* config);

// Parsed listen address. For "unix:/path", unix_path is set and port is 0.
struct ListenAddress {
  std::string host;
  int port = 0;
  std::string unix_path;
  bool off = false;
  // The address gRPC or httplib binds ("unix:/p", "127.0.0.1:50051", "[::1]:5").
  std::string ToGrpc() const;
};
absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& text, bool allow_off,
                                                 bool allow_unix);

// Parses oscarkvd's command line into *config (after defaults and --config). Returns
// kHelp / kPrintDefault actions, or an error naming the bad flag.
enum class CommandLineAction { kRun, kHelp, kPrintDefaultConfig, kVersion };
absl::StatusOr<CommandLineAction> ParseCommandLine(int argc, char** argv, DaemonConfig* config);
std::string CommandLineHelp();

// 25% of physical memory, at most 64 GiB, in MiB.
uint64_t DefaultPoolMb();

// Parses a CPU list ("0", "1-3", "0,2-3"): sorted, unique CPU numbers below 1024.
// INVALID_ARGUMENT naming the bad part; "" is an error (the caller treats "" as "any").
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

}  // namespace oscarkv::service
