#include "oscarkv/service/daemon.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpc_service.h"
#include "local_control.h"
#include "tls.h"
#ifdef OSCARKV_HAVE_UCX
#include "ucx_data_plane.h"
#include "ucx_tenant_regions.h"
#endif
#include "grpc/grpc.h"
#include "grpc/support/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "httplib.h"
#include "oscarkv/service/log.h"
#include "oscarkv/service/metrics.h"
#include "oscarkv/service/tier.h"

namespace oscarkv::service {

void BlockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);  // RunDaemon's sigwait: reload the TLS files
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

namespace {

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "oscarkvd";
  return buf;
}

uint64_t ShmFreeBytes() {
  struct statvfs vfs;
  if (statvfs("/dev/shm", &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

// True when something accepts connections on the unix socket `path` (gRPC would otherwise
// unlink a live daemon's socket and take it over).
bool UnixSocketLive(const std::string& path) {
  if (access(path.c_str(), F_OK) != 0) return false;
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  const bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return live;
}

// Removes pool files (and their local sockets) of default-named daemons that died without
// cleaning up (kill -9): names oscarkvd-<tag>-<pid> whose pid is gone and whose owner lock
// (allocator/arena.h) is free. Files of live processes are never touched.
void RemoveDeadDefaultPools() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  std::vector<std::string> dead;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind("oscarkvd-", 0) != 0 || name.find('/') != std::string::npos) continue;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".sock") == 0) continue;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tls") == 0) continue;
    const size_t dash = name.rfind('-');
    int pid = 0;
    if (dash == std::string::npos || !absl::SimpleAtoi(name.substr(dash + 1), &pid) || pid <= 0 ||
        pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) {
      continue;
    }
    const std::string path = "/dev/shm/" + name;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct flock l{};
    l.l_type = F_RDLCK;
    l.l_whence = SEEK_SET;
    const bool unowned = fcntl(fd, F_OFD_GETLK, &l) == 0 && l.l_type == F_UNLCK;
    close(fd);
    if (unowned) dead.push_back(path);
  }
  closedir(dir);
  for (const std::string& path : dead) {
    if (unlink(path.c_str()) == 0) {
      unlink((path + ".sock").c_str());
      std::error_code ec;
      std::filesystem::remove_all(path + ".tls", ec);  // its staged TLS key and certificates
      LogEvent(LogLevel::kWarn, "removed_dead_pool", {{"path", path}});
    }
  }
}

// OK when `host:port` can be bound now; otherwise one clear reason. Tried before gRPC or
// httplib bind, whose own failure is a core log line and a vague error. Port 0 always binds.
// `what` prefixes the message (e.g. "metrics: ") so both listeners read as the metrics server does.
absl::Status CheckTcpListenable(const ListenAddress& a, const std::string& flag,
                                 const std::string& what = "") {
  if (a.off || !a.unix_path.empty() || a.port == 0) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = absl::StrCat(a.port);
  if (int rc = getaddrinfo(a.host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot listen on ", a.ToGrpc(), ": host '",
                                                   a.host, "': ", gai_strerror(rc)));
  }
  int err = 0;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;  // as gRPC and httplib bind: a port in TIME_WAIT is not "in use"
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    err = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    close(fd);
    if (err == 0 || err == EADDRINUSE) break;
  }
  freeaddrinfo(res);
  if (err == EADDRINUSE) {
    return absl::UnavailableError(absl::StrCat(what, "cannot listen on ", a.ToGrpc(), ": port ",
                                               a.port, " is already in use (another oscarkvd? "
                                               "choose another with ", flag, ")"));
  }
  if (err != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, "cannot listen on ", a.ToGrpc(), ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

// gRPC core's own log lines (e.g. "Failed to add :50051") become structured lines like ours.
void LogGrpcCore(gpr_log_func_args* args) {
  const LogLevel level = args->severity == GPR_LOG_SEVERITY_ERROR  ? LogLevel::kError
                         : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                                   : LogLevel::kDebug;
  LogEvent(level, "grpc_core",
           {{"message", args->message}, {"at", absl::StrCat(args->file, ":", args->line)}});
}

class MetricsServer {
 public:
  absl::StatusOr<int> Start(const ListenAddress& addr, const Metrics* metrics,
                            const PageCache* cache) {
    server_.Get("/metrics", [metrics, cache](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics->Render(*cache), "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    // cpp-httplib sets SO_REUSEPORT by default, so a second daemon would share a taken port and
    // scrapes would alternate between the two: bind exclusively (SO_REUSEADDR only lets a
    // restarted daemon reuse the port while old connections sit in TIME_WAIT).
    server_.set_socket_options([](socket_t fd) {
      int yes = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    int port = addr.port;
    errno = 0;
    if (port == 0) {
      port = server_.bind_to_any_port(addr.host);
      if (port <= 0) {
        return absl::UnavailableError(absl::StrCat("metrics: cannot bind ", addr.host, ": ",
                                                   std::strerror(errno)));
      }
    } else if (!server_.bind_to_port(addr.host, port)) {
      const int err = errno;
      return absl::UnavailableError(absl::StrCat(
          "metrics: cannot listen on ", addr.ToGrpc(), ": ",
          err == EADDRINUSE ? absl::StrCat("port ", port, " is already in use (another oscarkvd?)")
                            : std::string(err != 0 ? std::strerror(err) : "bind failed"),
          "; choose another with --metrics-listen HOST:PORT, or --metrics-listen off"));
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    return port;
  }
  void Stop() {
    if (thread_.joinable()) {
      server_.stop();
      thread_.join();
    }
  }
  ~MetricsServer() { Stop(); }

 private:
  httplib::Server server_;
  std::thread thread_;
};

}  // namespace

absl::Status RunDaemon(const DaemonConfig& config) {
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles (a graph update per
  // lock, several microseconds on the Lookup path). Tests keep the check; the daemon skips it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (absl::Status s = SetLogLevel(config.log_level); !s.ok()) return s;
  // CPU affinity first: every thread started from here on (gRPC, reaper, UCX) inherits it.
  if (!config.cpus.empty()) {
    auto cpus = ParseCpuList(config.cpus);
    if (!cpus.ok()) return cpus.status();
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : *cpus) CPU_SET(c, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cpus ", config.cpus, ": ",
                                                     std::strerror(errno)));
    }
  }
  auto listen = ParseListenAddress(config.listen, false, true);
  if (!listen.ok()) return listen.status();
  auto metrics_addr = ParseListenAddress(config.metrics_listen, true, false);
  if (!metrics_addr.ok()) return metrics_addr.status();

  if (!listen->unix_path.empty() && UnixSocketLive(listen->unix_path)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config.listen,
                                               ": another process is serving on it"));
  }
#ifdef OSCARKV_HAVE_UCX
  // The whole-pool UCX data plane (config.h ucx_allow_unverified_rma says why it is guarded):
  // with tenants it does not run unless asked for (tenants load through data planes of their
  // own, ucx_tenant_regions.h), and where a peer on another host could reach it the daemon
  // refuses to start unless told the network is trusted, as for plaintext gRPC.
  const bool pool_data_plane = config.ucx && (config.tenants.empty() ||
                                              config.ucx_share_pool_key ||
                                              config.ucx_allow_unverified_rma);
  // Only the interfaces the control plane listens on, unless configured otherwise.
  const absl::StatusOr<std::string> ucx_devices =
      DataPlaneNetDevices(config.ucx_net_devices, *listen);
  if (pool_data_plane && !config.ucx_allow_unverified_rma && ucx_devices.ok() &&
      DataPlaneReachableOffHost(config.ucx_tls, *ucx_devices)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing the whole-pool UCX data plane on ", *ucx_devices, " (UCX_TLS ",
        config.ucx_tls.empty() ? std::string("all") : config.ucx_tls,
        "): any peer that reaches it can read and write the entire pool, with no certificate "
        "and whatever its tenant -- UCX serves software-emulated RMA (tcp, and any peer's get/put "
        "active messages) at whatever address a request names, checking no key. Configure "
        "tenants (each loads through a data plane of its own that maps only what it staged), "
        "keep it on this host (ucx.net_devices: lo, or a loopback --listen), turn it off "
        "(--ucx off), or accept the risk on a trusted network with --ucx-allow-unverified-rma "
        "(ucx.allow_unverified_rma: true)"));
  }
#endif
  gpr_set_log_function(LogGrpcCore);
  if (absl::Status s = CheckTcpListenable(*listen, "--listen"); !s.ok()) return s;
  if (absl::Status s = CheckTcpListenable(*metrics_addr, "--metrics-listen", "metrics: "); !s.ok()) return s;
  // Pool size: explicit, or 25% of RAM but no more than /dev/shm can hold.
  uint64_t pool_mb = config.pool_mb;
  if (pool_mb == 0) {
    pool_mb = DefaultPoolMb();
    const uint64_t shm_mb = ShmFreeBytes() / 10 * 9 >> 20;
    if (shm_mb > 0 && shm_mb < pool_mb) {
      LogEvent(LogLevel::kWarn, "pool_capped_by_dev_shm",
               {{"wanted_mb", absl::StrCat(pool_mb)}, {"dev_shm_free_mb", absl::StrCat(shm_mb)}});
      pool_mb = shm_mb;
    }
  }
  ShmArenaOptions ao;
  ao.bytes = pool_mb << 20;
  ao.try_huge_pages = config.huge_pages;
  ao.try_cuda_register = config.cuda_register;
  ao.name = config.shm_name;
  ao.sealed = config.shm_mode == "isolated";
  if (ao.name.empty()) {
    ao.name = absl::StrCat("oscarkvd-", listen->unix_path.empty() ? absl::StrCat(listen->port)
                                                                   : std::string("unix"),
                           "-", getpid());
    ao.replace_existing = true;  // a stale file of a dead process with our pid
    RemoveDeadDefaultPools();
  }
  auto arena = CreateShmArena(ao);
  if (!arena.ok()) return arena.status();
  if ((*arena)->took_over_stale()) {
    // kill -9 / OOM kill of the previous daemon on this name: its file had no live owner.
    LogEvent(LogLevel::kWarn, "stale_pool_taken_over", {{"path", (*arena)->owner_path()}});
  }
  if (ao.sealed) {
    // A sealed pool keeps clients from writing it; a process of the same uid could still write
    // the daemon's memory through ptrace or /proc/<pid>/mem unless the daemon is not dumpable.
    if (::prctl(PR_SET_DUMPABLE, 0) != 0) {
      return absl::InternalError(absl::StrCat("prctl(PR_SET_DUMPABLE): ", std::strerror(errno)));
    }
  }
  const bool huge = (*arena)->huge_pages(), cuda = (*arena)->cuda_registered();
  auto pool = PagePool::Create(std::move(*arena));
  if (!pool.ok()) return pool.status();

  CacheOptions co;
  co.max_batch = config.max_batch;
  co.default_lease_ms = config.default_lease_ms;
  co.max_lease_ms = config.max_lease_ms;
  co.reservation_ttl_ms = config.reservation_ttl_ms;
  co.max_reservation_ttl_ms = std::max(config.max_lease_ms, config.reservation_ttl_ms);
  co.index_shards = config.index_shards;
  co.max_codecs = config.max_codecs;
  co.node_id = config.node_id.empty() ? HostName() : config.node_id;
  auto tenants = TenantRegistry::Create(config, pool->get()->capacity_bytes());
  if (!tenants.ok()) return tenants.status();
  co.tenants = tenants->get();  // outlives the cache
  std::unique_ptr<PageTier> tier;  // outlives the cache
  PageCache cache(pool->get(), SystemClock::Default(), co);
  std::string tier_str = "off";
  if (!config.tier_path.empty()) {
    TierOptions to;
    to.path = config.tier_path;
    to.capacity_bytes = config.tier_mb << 20;
    to.queue_bytes = config.tier_queue_mb << 20;
    to.sync_writes = config.tier_sync_writes;
    const auto open_start = std::chrono::steady_clock::now();
    auto t = PageTier::Open(to);
    if (!t.ok()) return t.status();
    tier = std::move(*t);
    if (absl::Status s = cache.AttachTier(tier.get()); !s.ok()) return s;
    const tiering::TierStats ts = tier->store_stats();
    LogEvent(LogLevel::kInfo, "tier_open",
             {{"path", config.tier_path},
              {"pages", absl::StrCat(ts.pages)},
              {"bytes", absl::StrCat(ts.used_bytes)},
              {"capacity_bytes", absl::StrCat(ts.capacity_bytes)},
              {"codecs", absl::StrCat(cache.codecs())},
              {"open_ms", absl::StrCat(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - open_start)
                                           .count())}});
    tier_str = config.tier_path;
  }
  Metrics metrics;
  KvCacheService service(&cache, &metrics);
  service.SharePoolKeyWithTenants(config.ucx_share_pool_key);
  bool ucx_tenants_only = false;  // UCX for tenants' own data planes only (no pool worker)
#ifdef OSCARKV_HAVE_UCX
  // The sealed pool's read-only descriptor the data-plane child inherits (closed at exit).
  int data_plane_pool_fd = -1;
  struct FdCloser {
    int* fd;
    ~FdCloser() {
      if (*fd >= 0) ::close(*fd);
    }
  } data_plane_pool_fd_closer{&data_plane_pool_fd};
  std::unique_ptr<UcxDataPlane> data_plane;
  std::unique_ptr<TenantRegions> tenant_rma;  // tenants' own data planes (ucx_tenant_regions.h)
  auto start_tenant_rma = [&](const std::string& devices) {
    if (!tenants->get()->configured() || config.ucx_share_pool_key) return;
    TenantRegionOptions tro;
    tro.tls = config.ucx_tls;
    tro.net_devices = devices;
    tro.region_bytes = config.ucx_tenant_region_mb << 20;
    tro.max_regions = tenants->get()->size();
    tenant_rma = std::make_unique<TenantRegions>(&cache, tro);
    service.SetTenantRma(tenant_rma.get());
  };
  if (config.ucx && !pool_data_plane && ucx_devices.ok()) {
    // Tenants only: no process maps the pool for UCX. Admins stage through data planes of
    // their own, like tenants; the message below answers only if that staging is missing.
    service.SetDataPlane(
        [] {
          return absl::StatusOr<pb::GetDataPlaneResponse>(absl::FailedPreconditionError(
              "this daemon runs no whole-pool UCX data plane: with tenants configured, a peer "
              "that reached one could read every tenant's pages without a certificate "
              "(software-emulated RMA checks no key), so tenants load through data planes of "
              "their own and an admin over gRPC or shared memory "
              "(ucx.allow_unverified_rma: true starts one for admins, on a trusted network)"));
        },
        "");
    start_tenant_rma(*ucx_devices);
    service.AdminsUseStaging(tenant_rma != nullptr);
    ucx_tenants_only = true;
  } else if (config.ucx) {
    UcxDataPlaneOptions dpo;
    dpo.tls = config.ucx_tls;
    const absl::StatusOr<std::string>& devices = ucx_devices;
    if (devices.ok()) dpo.net_devices = *devices;
    dpo.pool_base = pool->get()->arena().base();
    dpo.pool_bytes = pool->get()->arena().size();
    dpo.shm_path = pool->get()->arena().shm_path();  // shared file: isolated data-plane process
    if (pool->get()->arena().sealed()) {  // sealed pool: the child maps a read-only descriptor
      auto ro = pool->get()->arena().OpenReadOnly();
      if (ro.ok()) data_plane_pool_fd = *ro;
      dpo.shm_fd = data_plane_pool_fd;
    }
    auto dp = devices.ok() ? UcxDataPlane::Start(dpo)
                           : absl::StatusOr<std::unique_ptr<UcxDataPlane>>(devices.status());
    if (dp.ok()) {
      data_plane = std::move(*dp);
      // Where it runs, every process of this host reaches it, whatever its uid (UCX accepts
      // any peer; a tcp listener on lo is open to all local users): the pool's pages are then
      // readable by users the local socket refuses. Not gated (issue 24); said at start.
      if (DataPlaneReachableOffHost(config.ucx_tls, "all") && !config.ucx_allow_unverified_rma) {
        LogEvent(LogLevel::kWarn, "ucx_pool_plane_open_to_local_users",
                 {{"devices", dpo.net_devices},
                  {"ucx_tls", config.ucx_tls},
                  {"risk", "any local process of any uid that reaches the UCX data plane's port "
                           "can read every page in the pool (UCX checks no key or peer)"},
                  {"fix", "configure tenants: (no whole-pool data plane), --ucx off, or keep "
                          "untrusted users off this host"}});
      }
      UcxDataPlane* d = data_plane.get();
      service.SetDataPlane([d] { return d->Info(); }, "");
      start_tenant_rma(dpo.net_devices);
    } else {
      // The control plane and the shm/gRPC data paths still work; say why UCX does not.
      LogEvent(LogLevel::kWarn, "ucx_unavailable", {{"error", std::string(dp.status().message())}});
      service.SetDataPlane({}, absl::StrCat("UCX data plane failed to start: ",
                                                 dp.status().message()));
    }
  } else {
    service.SetDataPlane({}, "UCX data plane disabled (--ucx off)");
  }
#else
  struct NoDataPlane {
    absl::StatusOr<pb::GetDataPlaneResponse> Info() const { return pb::GetDataPlaneResponse(); }
    bool isolated() const { return false; }
  };
  std::unique_ptr<NoDataPlane> data_plane;
  service.SetDataPlane({}, "this oscarkvd was built without the transport module (UCX)");
#endif

  // The same-host control socket, before gRPC serves: its path is in every Handshake answer.
  std::unique_ptr<LocalControlServer> local_server;
  std::string local_str = "off";
  if (config.local_socket != "off") {
    LocalControlOptions lo;
    lo.path = config.local_socket.empty() ? pool->get()->arena().owner_path() + ".sock"
                                          : config.local_socket;
    lo.threads = static_cast<int>(config.local_threads);
    lo.slice_us = config.local_slice_us;
    lo.max_connections_per_uid = config.local_max_connections_per_uid;
    if (pool->get()->arena().sealed()) lo.isolated_pool = &pool->get()->arena();
    lo.staging_max_bytes = uint64_t{config.staging_max_mb} << 20;
    auto ls = LocalControlServer::Start(lo, &service.calls());
    if (!ls.ok()) {
      if (!config.local_socket.empty()) return ls.status();  // asked for explicitly: an error
      // The default path: clients use gRPC for everything; say why.
      LogEvent(LogLevel::kWarn, "local_socket_unavailable",
               {{"path", lo.path}, {"error", std::string(ls.status().message())}});
    } else {
      local_server = std::move(*ls);
      local_str = local_server->path();
      service.calls().set_local_socket(local_str);
    }
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  // The checked copies of the TLS files gRPC watches sit beside the pool file (its lock makes
  // the name this daemon's; a killed daemon's copies are replaced).
  const std::string pool_file = pool->get()->arena().owner_path();
  auto tls_or = ServerTls::Create(config, pool_file.empty() ? "" : pool_file + ".tls");
  if (!tls_or.ok()) return tls_or.status();
  std::unique_ptr<ServerTls> tls = *std::move(tls_or);
  builder.AddListeningPort(listen->ToGrpc(), tls->credentials(),
                           listen->unix_path.empty() ? &bound_port : nullptr);
  // gRPC sets SO_REUSEPORT by default, which would let a second daemon share our port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // What one client may hold: HTTP/2 streams per connection, and calls in flight per peer IP and
  // in all (each open stream holds a sync-pool thread; server_limits.h).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(config.max_streams_per_connection));
  PeerCallLimits call_limits(config.max_calls_per_peer, config.max_calls);  // outlives serving
  service.SetCallLimits(&call_limits);
  builder.RegisterService(&service);
  const int max_msg = static_cast<int>(std::min<uint64_t>(uint64_t{config.max_message_mb} << 20,
                                                          INT32_MAX));
  builder.SetMaxReceiveMessageSize(max_msg);
  builder.SetMaxSendMessageSize(max_msg);
  if (config.grpc_threads > 0) {
    grpc::ResourceQuota quota("oscarkvd");
    quota.SetMaxThreads(static_cast<int>(config.grpc_threads));
    builder.SetResourceQuota(quota);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (listen->unix_path.empty() && bound_port == 0)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config.listen,
                                               " (address in use or not local?)"));
  }
  std::string listen_str = listen->unix_path.empty()
                               ? ListenAddress{listen->host, bound_port, "", false}.ToGrpc()
                               : listen->ToGrpc();

  MetricsServer metrics_server;
  std::string metrics_str = "off";
  if (!metrics_addr->off) {
    auto port = metrics_server.Start(*metrics_addr, &metrics, &cache);
    if (!port.ok()) {
      server->Shutdown();
      return port.status();
    }
    metrics_str = ListenAddress{metrics_addr->host, *port, "", false}.ToGrpc();
  }

  absl::Notification stop_reaper;
  std::thread reaper([&] {
    while (!stop_reaper.WaitForNotificationWithTimeout(
        absl::Milliseconds(config.reaper_interval_ms))) {
      cache.Reap();
    }
  });

  // The pool's file under /dev/shm: the mappable pool (trusted mode) or its owner lock.
  const std::string shm_path = pool->get()->arena().owner_path();
  std::printf("oscarkvd ready listen=%s metrics=%s shm=%s pool_bytes=%zu local=%s\n",
              listen_str.c_str(), metrics_str.c_str(), shm_path.c_str(),
              pool->get()->capacity_bytes(), local_str.c_str());
  std::fflush(stdout);
  LogEvent(LogLevel::kInfo, "ready",
           {{"listen", listen_str},
            {"metrics", metrics_str},
            {"tls", tls->mode()},
            {"tls_cert", tls->Describe()},
            {"shm", shm_path},
            {"shm_mode", config.shm_mode},
            {"local_socket", local_str},
            {"local_threads", absl::StrCat(config.local_threads)},
            {"local_slice_us", absl::StrCat(config.local_slice_us)},
            {"pool_bytes", absl::StrCat(pool->get()->capacity_bytes())},
            {"huge_pages", huge ? "yes" : "no"},
            {"cuda_registered", cuda ? "yes" : "no"},
            {"node_id", co.node_id},
            {"tier", tier_str},
            {"tenants", (*tenants)->configured() ? absl::StrCat((*tenants)->size())
                                                 : std::string("off")},
            {"max_batch", absl::StrCat(co.max_batch)},
            {"cpus", config.cpus.empty() ? std::string("any") : config.cpus},
            {"ucx", data_plane && data_plane->Info().ok()
                        ? absl::StrCat(absl::StrJoin(data_plane->Info()->transports(), ","),
                                       data_plane->isolated() ? " (own process)" : "")
                        : std::string(ucx_tenants_only ? "tenants-only" : "off")},
            {"pid", absl::StrCat(getpid())}});

  if (config.tls_reload_s > 0) tls->WatchFiles(absl::Seconds(config.tls_reload_s));
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  int sig = 0;
  while (sigwait(&set, &sig) == 0 && sig == SIGHUP) tls->ReloadAndLog("SIGHUP");
  LogEvent(LogLevel::kInfo, "draining",
           {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"},
            {"timeout_ms", absl::StrCat(config.drain_timeout_ms)}});
  if (auto* health = server->GetHealthCheckService()) health->SetServingStatus(false);
  const auto t0 = std::chrono::steady_clock::now();
  // From here on new calls are refused (UNAVAILABLE) before they do anything.
  service.StartDraining();
  // Local calls finish inline on their epoll threads: stopping waits for those in progress.
  if (local_server) local_server->Stop();
  // gRPC's Shutdown(deadline) waits for every connection to go away, and a client that keeps an
  // idle channel open (an inference engine always does) held it ~5 s. So while it runs: once no
  // admitted call has been in flight for 100 ms (the service counts them; calls that arrive now
  // are refused before they do anything; the 100 ms let the last answers leave gRPC), close the
  // remaining connections -- what Shutdown itself does at its deadline. Repeated every 100 ms
  // in case a client connected in between.
  absl::Notification shut;
  std::thread shutter([&] {
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(config.drain_timeout_ms));
    shut.Notify();
  });
  bool idle_closed = false;
  auto quiet_since = std::chrono::steady_clock::now();
  while (!shut.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
    const auto now = std::chrono::steady_clock::now();
    if (service.in_flight() != 0) {
      quiet_since = now;
    } else if (now - quiet_since >= std::chrono::milliseconds(100)) {
      grpc_server_cancel_all_calls(server->c_server());
      idle_closed = true;
      quiet_since = now;
    }
  }
  shutter.join();
  server->Wait();
  // The server is fully shut down. Destroying it would run gRPC's global shutdown, which can sit
  // ~10 s in an idle executor's epoll timeout (gRPC 1.51); the process exits right after this
  // function, so the object is deliberately left to the OS.
  (void)server.release();
  // No call runs any more: what is only in the DRAM pool goes to the SSD tier, as much as fits
  // before the drain deadline (what does not is lost with the pool, as after kill -9).
  uint64_t demoted = 0;
  bool tier_flushed = true;
  if (tier != nullptr) {
    const absl::Time deadline =
        absl::Now() + absl::Milliseconds(config.drain_timeout_ms) -
        absl::FromChrono(std::chrono::steady_clock::now() - t0);
    demoted = cache.DemoteAll(deadline);
    tier_flushed = tier->Flush(deadline);
  }
  metrics_server.Stop();
#ifdef OSCARKV_HAVE_UCX
  tenant_rma.reset();
#endif
  data_plane.reset();
  stop_reaper.Notify();
  reaper.join();
  const auto drain_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
  if (!listen->unix_path.empty()) unlink(listen->unix_path.c_str());
  const CacheStats st = cache.Stats(Caller{}).value_or(CacheStats{});
  LogEvent(LogLevel::kInfo, "stopped",
           {{"drain_ms", absl::StrCat(drain_ms)},
            {"idle_connections_closed", idle_closed ? "yes" : "no"},
            {"pages", absl::StrCat(st.pages)},
            {"lookups", absl::StrCat(st.lookups)},
            {"hits", absl::StrCat(st.hits)},
            {"evictions", absl::StrCat(st.evictions)},
            {"tier_pages", absl::StrCat(st.tier_pages)},
            {"demoted_at_stop", absl::StrCat(demoted)},
            {"tier_flushed", tier_flushed ? "yes" : "no"},
            {"shm_removed", shm_path}});
  return absl::OkStatus();  // the pool (and its /dev/shm file) goes with `pool`
}

}  // namespace oscarkv::service
