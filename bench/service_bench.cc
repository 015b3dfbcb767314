// `oscarkv bench service`: options, the daemon, the pages, the phases in order (the phases
// themselves are in service_bench_phases.cc, the report in service_bench_report.cc).
#include "service_bench.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/client/client.h"
#include "oscarkv/testing/local_daemon.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/util/args.h"
#include "service_bench_internal.h"
#include "store_load_vs_memcpy.h"

namespace oscarkv::bench {

using client::Client;
using service_bench::ClosedLoop;
using service_bench::ConnectMany;
using service_bench::Env;
using service_bench::LoadVsMemcpy;
using service_bench::OpenLoop;
using service_bench::PathRun;
using service_bench::PrintTable;
using service_bench::Results;
using service_bench::ToJson;
using service_bench::WithCpu;

int ServiceBenchMain(int argc, char** argv) {
  Args a("bench service",
         "Starts its own oscarkvd on 127.0.0.1 and measures, through the client library, lookups "
         "(closed and open loop) over the daemon's local socket and over gRPC side by side, and "
         "batch loads over shared memory and gRPC, each beside memcpy.");
  a.Flag("json", "print the results as JSON (after the table, on stdout)");
  a.Option("duration-s", "3", "seconds per measured phase (11 phases with both lookup paths)");
  a.Option("daemon", "", "oscarkvd binary (default: next to this oscarkv, or $OSCARKVD)");
  a.Option("pool-mb", "512", "daemon pool size");
  a.Option("listen", "127.0.0.1:0", "daemon gRPC address: loopback TCP, or unix:/path for a Unix socket");
  a.Option("batch", "64", "pages per load batch (Qwen3-8B INT2 pages, 1,327,168 bytes each)");
  a.Option("lookup-keys", "32", "block keys per lookup (32 = a 2048-token prompt), all cached");
  a.Option("rate", "10000", "open-loop offered load, lookups per second over all clients");
  a.Option("clients", "1,8,64", "closed-loop client counts; the open loop uses the largest");
  a.Option("lookup-path", "both",
           "both: every lookup phase once over the client library's default path (auto: the "
           "daemon's local control socket when it runs on this host, which it does here) and "
           "once over gRPC, side by side; local or grpc: only that path");
  a.Option("open-loop-senders", "async",
           "async: one thread sends every open-loop lookup at its scheduled time with "
           "LookupAsync, never waiting for answers (a true open loop); threads: each client "
           "thread sends its share with the blocking Lookup, so a client with a lookup still "
           "out sends late (counted) and the offered load sags while the daemon is slow");
  a.Option("daemon-cpus", "",
           "CPUs for the daemon (its --cpus, e.g. 1); default: any. With --client-cpus this "
           "splits the machine, e.g. --client-cpus 0 --daemon-cpus 1");
  a.Option("client-cpus", "", "CPUs for this process (the clients), e.g. 0; default: any");
  a.Flag("dedicated-connections",
         "each client its own connections: a TCP connection for gRPC, a channel for the local "
         "socket (default: the clients of this process share them, as Clients in one engine "
         "process do)");
  a.Flag("tls",
         "also measure gRPC lookups over mutual TLS: a second oscarkvd with --tls-cert, "
         "--tls-key and --tls-client-ca (a CA and certificates made by openssl in a temp dir), "
         "the same pages, its lookup phases alternating with the plaintext ones; the open "
         "loops of gRPC and TLS run in --rounds alternating rounds");
  a.Option("rounds", "5",
           "with --tls: open-loop rounds per path, gRPC and TLS alternating round by round "
           "(grpc, tls, grpc, tls, ...), each --duration-s long with the same schedule; the "
           "p99 of each path is the median of its rounds' p99s, so load that drifts during "
           "the run hits both paths alike");
  a.Epilog(
      "Acceptance targets: shm load >= 70% of memcpy; open-loop p99 <= 1 ms at 10,000/s; "
      "store and verified load (client library defaults) >= 85% of memcpy; with --tls, the "
      "mutual-TLS open-loop p99 <= 1.5x plaintext gRPC's.\n"
      "--json: lookup_p99_ms_at_10k and lookup_peak_per_s are the client library's default "
      "lookup path (lookup_path: \"local\", the daemon's same-host socket, as the daemon runs "
      "on this host); lookup_p99_ms_at_10k_grpc and lookup_peak_per_s_grpc are gRPC's, "
      "measured side by side; with --tls, lookup_p99_ms_at_10k_tls and lookup_peak_per_s_tls "
      "are gRPC with mutual TLS and lookup_p99_tls_vs_grpc their ratio (null without --tls); "
      "with --tls both p99s are medians over --rounds and open_loop_rounds lists every round. "
      "store_vs_memcpy_tenant and load_verified_vs_memcpy_tenant are the same batch stored and "
      "loaded as a tenant of an isolated daemon of their own (this uid and a certificate mapped "
      "to it: stores through staging, loads through the connection's load staging region, no "
      "pool mapping), beside the same memcpy.");
  if (auto rc = a.ParseOrExitCode(argc, argv)) return *rc;
  auto duration = a.real("duration-s");
  auto pool_mb = a.integer("pool-mb");
  auto batch = a.integer("batch");
  auto nkeys = a.integer("lookup-keys");
  auto rate = a.real("rate");
  auto rounds = a.integer("rounds");
  std::vector<int> client_counts;
  for (absl::string_view v : absl::StrSplit(a.str("clients"), ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(v, &n) || n < 1 || n > 1024) {
      std::fprintf(stderr, "oscarkv bench service: --clients must be numbers 1..1024\n");
      return 2;
    }
    client_counts.push_back(n);
  }
  if (!duration.ok() || !pool_mb.ok() || !batch.ok() || !nkeys.ok() || !rate.ok() ||
      !rounds.ok() || *rounds < 1 || *rounds > 101 || *duration <= 0 || *batch < 1 ||
      *nkeys < 1 || *rate <= 0 || client_counts.empty()) {
    std::fprintf(stderr, "oscarkv bench service: bad option value (see --help)\n");
    return 2;
  }
  const std::string lookup_path_opt = a.str("lookup-path");
  if (lookup_path_opt != "both" && lookup_path_opt != "local" && lookup_path_opt != "grpc") {
    std::fprintf(stderr, "oscarkv bench service: --lookup-path is both, local or grpc\n");
    return 2;
  }
  if (a.str("open-loop-senders") != "async" && a.str("open-loop-senders") != "threads") {
    std::fprintf(stderr, "oscarkv bench service: --open-loop-senders is async or threads\n");
    return 2;
  }
  const bool as_json = a.flag("json");
  const bool with_tls = a.flag("tls");
  if (with_tls && a.str("listen").rfind("unix:", 0) == 0) {
    std::fprintf(stderr, "oscarkv bench service: --tls compares gRPC over loopback TCP; drop "
                         "--listen unix:...\n");
    return 2;
  }
  if (!a.str("client-cpus").empty()) {  // before any thread starts: all of them inherit it
    std::vector<int> cpus;
    for (absl::string_view part : absl::StrSplit(a.str("client-cpus"), ',')) {
      std::vector<absl::string_view> r = absl::StrSplit(part, '-');
      int lo = -1, hi = -1;
      if (r.size() > 2 || !absl::SimpleAtoi(r[0], &lo) ||
          !absl::SimpleAtoi(r.back(), &hi) || lo < 0 || hi < lo || hi >= CPU_SETSIZE) {
        std::fprintf(stderr, "oscarkv bench service: --client-cpus: bad CPU list\n");
        return 2;
      }
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    }
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
      std::fprintf(stderr, "oscarkv bench service: --client-cpus %s: %s\n",
                   a.str("client-cpus").c_str(), std::strerror(errno));
      return 2;
    }
  }
  // Debian's Abseil keeps a deadlock graph on every absl::Mutex acquisition (gRPC's locks
  // included); oscarkvd turns it off, and an engine process would too. Same for the clients here.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  auto fail = [](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "oscarkv bench service: %s: %s\n", what.c_str(), s.ToString().c_str());
    return 1;
  };
  auto progress = [](const char* msg) {
    std::fprintf(stderr, "  .. %s\n", msg);
    std::fflush(stderr);
  };

  const CodecProfile profile = *BuiltinProfile("qwen3-8b");
  const uint64_t page_bytes = GeometryFor(profile, PageKind::kInt2).page_bytes();
  const int n_pages = static_cast<int>(std::max<int64_t>(*batch, *nkeys));
  if (uint64_t(n_pages) * page_bytes * 2 > uint64_t(*pool_mb) << 20) {
    std::fprintf(stderr, "oscarkv bench service: --pool-mb %lld is too small for %d pages\n",
                 (long long)*pool_mb, n_pages);
    return 2;
  }

  // 1. Daemon.
  testing::LocalDaemonOptions dopt;
  dopt.binary = a.str("daemon");
  const std::string log_path = absl::StrCat("/tmp/oscarkv-bench-", ::getpid(), ".log");
  dopt.log_path = log_path;
  dopt.flags = {"--listen", a.str("listen"), "--pool-mb", std::to_string(*pool_mb), "--metrics-listen", "off",
                "--shm-name", absl::StrCat("oscarkv-bench-", ::getpid())};
  if (!a.str("daemon-cpus").empty()) {
    dopt.flags.insert(dopt.flags.end(), {"--cpus", a.str("daemon-cpus")});
  }
  progress("starting oscarkvd");
  auto daemon = testing::LocalDaemon::Start(dopt);
  if (!daemon.ok()) return fail("starting oscarkvd", daemon.status());

  // 2. Pages: real INT2 pages of the Qwen3-8B shape, distinct content per page.
  Env env;
  env.addr = (*daemon)->address();
  client::ConnectOptions o;
  o.address = env.addr;
  o.client_name = "bench-setup";
  auto setup = Client::Connect(o);
  if (!setup.ok()) return fail("connecting", setup.status());
  auto codec = (*setup)->RegisterCodec(profile);
  if (!codec.ok()) return fail("registering the codec", codec.status());
  env.codec = *codec;
  progress(absl::StrCat("encoding ", n_pages, " Qwen3-8B INT2 pages").c_str());
  const uint32_t T = profile.page_tokens;
  std::vector<float> kv(size_t{profile.num_layers} * 2 * T * profile.num_kv_heads * profile.head_dim);
  uint64_t x = 88172645463325252ull;
  for (auto& v : kv) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = float(x >> 40) / float(1 << 23) - 1.0f;
  }
  std::vector<uint32_t> tokens(size_t(n_pages) * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 2654435761u) % 151936);
  env.keys = Client::BlockKeys(env.codec, tokens);
  env.lookup_keys.assign(env.keys.begin(), env.keys.begin() + *nkeys);
  std::vector<std::vector<uint8_t>> pages;
  std::vector<client::PageWrite> writes;
  const KVSequenceView view{kv.data(), profile.num_layers, profile.num_kv_heads, profile.head_dim, T};
  for (int i = 0; i < n_pages; ++i) {
    kv[i % kv.size()] += 1.0f;  // each page differs from the previous one
    auto p = EncodePage(profile, nullptr, PageKind::kInt2, view, 0, T);
    if (!p.ok()) return fail("encoding", p.status());
    pages.push_back(*std::move(p));
  }
  for (int i = 0; i < n_pages; ++i) writes.push_back({env.keys[i], PageKind::kInt2, pages[i]});
  auto stored = (*setup)->Store(env.codec, writes);
  if (!stored.ok()) return fail("storing pages", stored.status());
  if (stored->stored != uint32_t(n_pages)) {
    return fail("storing pages", stored->item_status[0].ok() ? absl::InternalError("not all stored")
                                                             : stored->item_status[0]);
  }

  // 2b. --tls: a second daemon, the same but for mutual TLS, holding the looked-up pages.
  std::unique_ptr<service_bench::BenchPki> pki;
  std::unique_ptr<testing::LocalDaemon> tls_daemon;
  const std::string tls_log_path = absl::StrCat("/tmp/oscarkv-bench-", ::getpid(), "-tls.log");
  Env tls_env = env;
  if (with_tls) {
    progress("making a CA and certificates (openssl), starting a mutual-TLS oscarkvd");
    auto p = service_bench::MakeBenchPki();
    if (!p.ok()) return fail("making TLS certificates", p.status());
    pki = *std::move(p);
    testing::LocalDaemonOptions topt = dopt;
    topt.log_path = tls_log_path;
    const uint64_t tls_pool_mb = std::max<uint64_t>(64, ((uint64_t(*nkeys) * page_bytes * 2) >> 20) + 16);
    topt.flags = {"--listen", "127.0.0.1:0", "--pool-mb", std::to_string(tls_pool_mb),
                  "--metrics-listen", "off", "--shm-name",
                  absl::StrCat("oscarkv-bench-tls-", ::getpid()), "--tls-cert", pki->server_cert,
                  "--tls-key", pki->server_key, "--tls-client-ca", pki->ca};
    if (!a.str("daemon-cpus").empty()) topt.flags.insert(topt.flags.end(), {"--cpus", a.str("daemon-cpus")});
    auto td = testing::LocalDaemon::Start(topt);
    if (!td.ok()) return fail("starting the mutual-TLS oscarkvd", td.status());
    tls_daemon = *std::move(td);
    tls_env.addr = tls_daemon->address();
    tls_env.tls_ca = pki->ca;
    tls_env.tls_cert = pki->client_cert;
    tls_env.tls_key = pki->client_key;
    auto tls_setup = ConnectMany(tls_env, 1, client::DataPath::kGrpc, true);
    if (!tls_setup.ok()) return fail("connecting over mutual TLS", tls_setup.status());
    const std::vector<client::PageWrite> lookup_writes(writes.begin(), writes.begin() + *nkeys);
    auto ts = (*tls_setup)[0]->Store(env.codec, lookup_writes);
    if (!ts.ok() || ts->stored != uint32_t(*nkeys)) {
      return fail("storing pages over mutual TLS",
                  ts.ok() ? absl::InternalError("not all stored") : ts.status());
    }
  }

  // 3-4. Lookups per path: closed loop at each client count, then the open loop; the paths
  // alternate phase by phase so all see the same machine state.
  const int max_clients = *std::max_element(client_counts.begin(), client_counts.end());
  std::vector<PathRun> runs;
  for (const char* want : {"auto", "grpc", "tls"}) {
    const bool is_auto = std::string(want) == "auto";
    const bool is_tls = std::string(want) == "tls";
    if (lookup_path_opt == "grpc" && is_auto) continue;
    if (lookup_path_opt == "local" && !is_auto) continue;
    if (is_tls && !with_tls) continue;
    const client::LookupPath lp = lookup_path_opt == "local" ? client::LookupPath::kLocal
                                  : is_auto                  ? client::LookupPath::kAuto
                                                             : client::LookupPath::kGrpc;
    auto cs = ConnectMany(is_tls ? tls_env : env, max_clients, client::DataPath::kGrpc, true,
                          a.flag("dedicated-connections"), lp);
    if (!cs.ok()) return fail("connecting lookup clients", cs.status());
    PathRun run;
    run.name = is_tls ? "tls" : client::LookupPathName((*cs)[0]->server().lookup_path);
    run.is_default = is_auto;
    run.json_suffix = is_auto ? "" : is_tls ? "_tls" : "_grpc";
    run.daemon_pid = is_tls ? tls_daemon->pid() : (*daemon)->pid();
    run.address = is_tls ? tls_env.addr : env.addr;
    run.clients = std::move(*cs);
    runs.push_back(std::move(run));
  }
  for (int n : client_counts) {
    for (PathRun& run : runs) {
      progress(absl::StrCat("closed-loop lookups, ", n, " clients, ", run.name).c_str());
      auto s = WithCpu(run.daemon_pid, [&] { return ClosedLoop(env, run.clients, n, *duration); });
      if (!s.ok()) return fail("closed loop", s.status());
      run.closed.push_back({n, *s});
      if (s->per_s > run.peak.per_s) run.peak = *s;
    }
  }
  // The open loop. With --tls, gRPC and TLS take turns for --rounds rounds (the same schedule
  // and request count each), so drifting load from the rest of the machine lands on both.
  PathRun* grpc_run = nullptr;
  PathRun* tls_run = nullptr;
  for (PathRun& run : runs) {
    if (run.json_suffix == "_grpc") grpc_run = &run;
    if (run.json_suffix == "_tls") tls_run = &run;
  }
  const bool paired = grpc_run != nullptr && tls_run != nullptr;
  auto open_round = [&](PathRun& run, const std::string& what) -> absl::Status {
    progress(absl::StrCat("open-loop lookups, ", *rate, "/s over ", max_clients, " clients, ",
                          run.name, what).c_str());
    double achieved = 0;
    auto open = WithCpu(run.daemon_pid, [&] {
      return OpenLoop(env, run.clients, max_clients, *rate, *duration,
                      a.str("open-loop-senders") == "async", &achieved);
    });
    if (!open.ok()) return open.status();
    run.rounds.push_back({*open, achieved});
    run.connections = service_bench::TcpConnectionsTo(run.address);
    return absl::OkStatus();
  };
  for (PathRun& run : runs) {
    if (paired && (&run == grpc_run || &run == tls_run)) continue;
    if (absl::Status s = open_round(run, ""); !s.ok()) return fail("open loop", s);
  }
  for (int64_t i = 0; paired && i < *rounds; ++i) {
    for (PathRun* run : {grpc_run, tls_run}) {
      const std::string what = absl::StrCat(", round ", i + 1, " of ", *rounds);
      if (absl::Status s = open_round(*run, what); !s.ok()) return fail("open loop", s);
    }
  }
  for (PathRun& run : runs) service_bench::PickMedianRound(run);
  for (PathRun& run : runs) run.clients.clear();
  absl::StatusOr<int> tls_stop = 0;
  if (tls_daemon != nullptr) tls_stop = tls_daemon->Stop();

  // 5. Batch loads beside memcpy.
  auto shm_client = ConnectMany(env, 1, client::DataPath::kSharedMemory, /*verify=*/false);
  if (!shm_client.ok()) return fail("connecting a shared-memory client", shm_client.status());
  auto grpc_client = ConnectMany(env, 1, client::DataPath::kGrpc, /*verify=*/false);
  if (!grpc_client.ok()) return fail("connecting a gRPC client", grpc_client.status());
  const std::span<const BlockKey> batch_keys(env.keys.data(), static_cast<size_t>(*batch));
  auto pin = (*setup)->Lookup(env.codec, batch_keys, {.pin = true});
  if (!pin.ok() || pin->matched != batch_keys.size()) return fail("pinning", pin.status());
  const std::vector<client::PageRef> refs = pin->pages;
  (void)(*setup)->Release(*pin);
  const auto& info = (*setup)->server();
  // The memcpy's source: the pool itself when it has a file to map (trusted mode); an isolated
  // pool is not mappable by path, so the same bytes at the same offsets in private memory.
  const uint8_t* pool = nullptr;
  std::vector<uint8_t> pool_copy;
  if (!info.shm_path.empty()) {
    const int fd = ::open(info.shm_path.c_str(), O_RDONLY);
    if (fd < 0) return fail("opening the pool", absl::NotFoundError(info.shm_path));
    pool = static_cast<const uint8_t*>(::mmap(nullptr, info.shm_bytes, PROT_READ, MAP_SHARED, fd, 0));
    ::close(fd);
    if (pool == MAP_FAILED) return fail("mapping the pool", absl::InternalError(info.shm_path));
  } else {
    uint64_t end = 0;
    for (const auto& ref : refs) end = std::max<uint64_t>(end, ref.offset + ref.bytes);
    pool_copy.resize(end);
    for (size_t i = 0; i < refs.size(); ++i) {
      std::memcpy(pool_copy.data() + refs[i].offset, pages[i].data(), refs[i].bytes);
    }
    pool = pool_copy.data();
  }
  std::vector<std::vector<uint8_t>> bufs(batch_keys.size(), std::vector<uint8_t>(page_bytes, 1));
  std::vector<std::span<uint8_t>> dst(bufs.begin(), bufs.end());
  // Correctness first (outside any timing): both paths return the stored bytes.
  for (auto* c : {(*shm_client)[0].get(), (*grpc_client)[0].get()}) {
    auto n = c->LoadInto(env.codec, batch_keys, dst);
    if (!n.ok()) return fail("loading", n.status());
    for (size_t i = 0; i < batch_keys.size(); ++i) {
      if (!std::equal(bufs[i].begin(), bufs[i].end(), pages[i].begin())) {
        return fail("loading", absl::DataLossError(absl::StrCat("page ", i, " differs")));
      }
    }
  }
  progress(absl::StrCat("batch loads over shared memory (", *batch, " pages) vs memcpy").c_str());
  auto shm = LoadVsMemcpy(env, *(*shm_client)[0], pool, refs, dst, *duration);
  if (!shm.ok()) return fail("shm loads", shm.status());
  progress(absl::StrCat("batch loads over gRPC streaming (", *batch, " pages) vs memcpy").c_str());
  auto grpc = LoadVsMemcpy(env, *(*grpc_client)[0], pool, refs, dst, *duration);
  if (!grpc.ok()) return fail("gRPC loads", grpc.status());
  if (pool_copy.empty()) ::munmap(const_cast<uint8_t*>(pool), info.shm_bytes);
  shm_client->clear();
  grpc_client->clear();

  // 5b. Stores and verified loads of --batch pages through the client library's defaults, each
  // beside a memcpy of the same bytes (bench/store_load_vs_memcpy.h says what is timed).
  progress(absl::StrCat("stores and verified loads (", *batch,
                        " pages, the client library's defaults) vs memcpy").c_str());
  client::ConnectOptions defaults;
  defaults.address = env.addr;
  auto dflt = Client::Connect(defaults);
  if (!dflt.ok()) return fail("connecting with the defaults", dflt.status());
  std::vector<uint32_t> fresh_tokens(size_t(*batch) * T);
  for (size_t i = 0; i < fresh_tokens.size(); ++i) fresh_tokens[i] = tokens[i] ^ 0x15555u;
  const std::vector<BlockKey> fresh_keys = Client::BlockKeys(env.codec, fresh_tokens);
  auto sl = bench::MeasureStoreLoadVsMemcpy(
      **dflt, env.codec, fresh_keys,
      std::span<const std::vector<uint8_t>>(pages).first(static_cast<size_t>(*batch)), *duration);
  if (!sl.ok()) return fail("stores and verified loads", sl.status());
  const std::string shm_mode = (*dflt)->server().shm_path.empty() ? "isolated" : "trusted";
  dflt->reset();
  // What isolation costs: the same measurement in the same run against a trusted-mode daemon.
  progress("stores and verified loads against a --shm-mode trusted daemon (isolation cost)");
  auto sl_trusted = bench::MeasureStoreLoadOnOwnDaemon(
      dopt, "trusted", profile, fresh_keys,
      std::span<const std::vector<uint8_t>>(pages).first(static_cast<size_t>(*batch)), *duration);
  if (!sl_trusted.ok()) return fail("stores and verified loads (trusted)", sl_trusted.status());
  // And as a tenant (this process's uid and a client certificate mapped to tenant "bench"): no
  // pool mapping, stores through staging, loads through its own load staging region.
  progress("stores and verified loads as a tenant of an isolated daemon (load staging)");
  if (pki == nullptr) {
    auto p = service_bench::MakeBenchPki();
    if (!p.ok()) return fail("making TLS certificates for the tenant", p.status());
    pki = *std::move(p);
  }
  const std::string tenant_cfg = pki->dir + "/tenant.yaml";
  std::ofstream(tenant_cfg) << "tls: {cert: " << pki->server_cert << ", key: " << pki->server_key
                            << ", client_ca: " << pki->ca << "}\ntenants:\n  - name: bench\n"
                            << "    uids: [" << ::getuid() << "]\n";
  testing::LocalDaemonOptions tenant_opt = dopt;
  for (size_t i = 0; i + 1 < tenant_opt.flags.size(); ++i) {
    if (tenant_opt.flags[i] == "--listen") tenant_opt.flags[i + 1] = "127.0.0.1:0";  // TLS: TCP
  }
  tenant_opt.flags.insert(tenant_opt.flags.end(), {"--config", tenant_cfg});
  client::ConnectOptions tenant_connect;
  tenant_connect.tls_ca_file = pki->ca;
  tenant_connect.tls_cert_file = pki->client_cert;
  tenant_connect.tls_key_file = pki->client_key;
  auto sl_tenant = bench::MeasureStoreLoadOnOwnDaemon(
      tenant_opt, "isolated", profile, fresh_keys,
      std::span<const std::vector<uint8_t>>(pages).first(static_cast<size_t>(*batch)), *duration,
      tenant_connect);
  if (!sl_tenant.ok()) return fail("stores and verified loads (tenant)", sl_tenant.status());
  setup->reset();
  auto stop = (*daemon)->Stop();

  // 6. Report. With --json stdout carries only the JSON document; the table goes to stderr.
  Results r;
  r.lookup_keys = *nkeys;
  r.batch = *batch;
  r.duration_s = *duration;
  r.rate = *rate;
  r.page_bytes = page_bytes;
  r.client_counts = client_counts;
  r.max_clients = max_clients;
  r.runs = std::move(runs);
  r.shm = *shm;
  r.grpc = *grpc;
  r.store_load = *sl;
  r.store_load_trusted = *sl_trusted;
  r.store_load_tenant = *sl_tenant;
  r.shm_mode = shm_mode;
  r.daemon_stopped_cleanly = stop.ok() && *stop == 0 && tls_stop.ok() && *tls_stop == 0;
  PrintTable(a, r, as_json ? stderr : stdout);
  if (as_json) std::printf("%s\n", ToJson(a, r).dump(2).c_str());

  if (!stop.ok() || *stop != 0) {
    std::fprintf(stderr, "oscarkv bench service: oscarkvd did not stop cleanly (%s; log: %s)\n",
                 stop.ok() ? absl::StrCat("exit status ", *stop).c_str()
                           : std::string(stop.status().message()).c_str(),
                 log_path.c_str());
    return 1;
  }
  if (!tls_stop.ok() || *tls_stop != 0) {
    std::fprintf(stderr, "oscarkv bench service: the mutual-TLS oscarkvd did not stop cleanly "
                         "(log: %s)\n", tls_log_path.c_str());
    return 1;
  }
  ::unlink(log_path.c_str());
  if (with_tls) ::unlink(tls_log_path.c_str());
  return 0;
}

}  // namespace oscarkv::bench
