// `oscarkv bench service`: starts its own oscarkvd (127.0.0.1, port 0), stores Qwen3-8B-shaped
// INT2 pages made by the real page writer, and measures through the client library:
//   * lookups/s and p50/p99 latency with 1, 8 and 64 closed-loop clients;
//   * open loop: a fixed schedule of lookups at --rate per second spread over 64 clients,
//     latency measured from each request's SCHEDULED send time (so queueing counts);
//   * both lookup phases once per lookup path, phase by phase side by side: the client
//     library's default (kAuto: the daemon's local control socket, as the daemon runs on this
//     host) and gRPC (--lookup-path picks one);
//   * load GB/s of --batch-page batches over shared memory and over gRPC streaming, each
//     interleaved with a plain memcpy of the same pool bytes into the same buffers;
//   * store and verified-load GB/s of --batch pages through the client library's defaults,
//     each beside a memcpy of the same bytes between two buffers of its own
//     (bench/store_load_vs_memcpy.h).
#if __has_include("oscarkv/client/client.h")  // built only with the client module
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "command.h"
#include "nlohmann/json.hpp"
#include "oscarkv/client/client.h"
#include "oscarkv/client/local_daemon.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/util/args.h"
#include "oscarkv/util/status_macros.h"
#include "absl/strings/numbers.h"
#include "store_load_vs_memcpy.h"

namespace oscarkv::cli {
namespace {

using client::Client;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct LatencyStats {
  uint64_t count = 0;
  double seconds = 0, per_s = 0, p50_ms = 0, p99_ms = 0, p999_ms = 0, max_ms = 0;
  // CPU time per lookup over the phase: this process (the clients) and the daemon.
  double client_cpu_us = 0, daemon_cpu_us = 0;
  // Open loop only: how late the sender issued requests (send start minus due time). Part of
  // every latency above; a diagnostic of the load generator's own scheduling.
  double send_late_p99_ms = 0, send_late_max_ms = 0;
};

// CPU seconds (user + system) used so far by process `pid` (0 = this process).
double CpuSeconds(pid_t pid) {
  std::ifstream f(pid ? absl::StrCat("/proc/", pid, "/stat") : std::string("/proc/self/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
  // After "pid (comm) ": field 3 is state, so utime (14) and stime (15) are indexes 11, 12.
  double ut = 0, st = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &ut) || !absl::SimpleAtod(fields[12], &st)) {
    return 0;
  }
  return (ut + st) / double(::sysconf(_SC_CLK_TCK));
}

// Runs `phase` and fills the CPU-per-lookup fields of its result.
template <typename Fn>
absl::StatusOr<LatencyStats> WithCpu(pid_t daemon, Fn phase) {
  const double c0 = CpuSeconds(0), d0 = CpuSeconds(daemon);
  absl::StatusOr<LatencyStats> s = phase();
  if (s.ok() && s->count > 0) {
    s->client_cpu_us = 1e6 * (CpuSeconds(0) - c0) / double(s->count);
    s->daemon_cpu_us = 1e6 * (CpuSeconds(daemon) - d0) / double(s->count);
  }
  return s;
}

LatencyStats Summarize(std::vector<double>& lat_s, double seconds) {
  LatencyStats s;
  s.count = lat_s.size();
  s.seconds = seconds;
  s.per_s = seconds > 0 ? double(s.count) / seconds : 0;
  if (lat_s.empty()) return s;
  std::sort(lat_s.begin(), lat_s.end());
  auto q = [&](double p) {
    return 1e3 * lat_s[std::min(lat_s.size() - 1, static_cast<size_t>(p * double(lat_s.size())))];
  };
  s.p50_ms = q(0.50);
  s.p99_ms = q(0.99);
  s.p999_ms = q(0.999);
  s.max_ms = 1e3 * lat_s.back();
  return s;
}

struct Env {
  std::string addr;
  client::Codec codec;
  std::vector<BlockKey> keys;       // the stored sequence
  std::vector<BlockKey> lookup_keys;  // prefix asked by each lookup
};

absl::StatusOr<std::vector<std::unique_ptr<Client>>> ConnectMany(
    const Env& env, int n, client::DataPath path, bool verify, bool dedicated = false,
    client::LookupPath lookup_path = client::LookupPath::kAuto) {
  std::vector<std::unique_ptr<Client>> out;
  for (int i = 0; i < n; ++i) {
    client::ConnectOptions o;
    o.address = env.addr;
    o.client_name = absl::StrCat("bench-", i);
    o.data_path = path;
    o.verify_checksums = verify;
    o.async_threads = 1;
    o.dedicated_connection = dedicated;
    o.lookup_path = lookup_path;
    OSCARKV_ASSIGN_OR_RETURN(auto c, Client::Connect(o));
    OSCARKV_RETURN_IF_ERROR(c->RegisterCodec(env.codec.profile).status());
    out.push_back(std::move(c));
  }
  return out;
}

// Closed loop: each client sends its next lookup as soon as the previous one returned.
absl::StatusOr<LatencyStats> ClosedLoop(const Env& env, std::vector<std::unique_ptr<Client>>& cs,
                                        int n, double duration_s) {
  std::vector<std::vector<double>> lat(n);
  std::atomic<bool> failed{false};
  std::atomic<int> ready{0};
  absl::Status first_error;
  std::atomic<bool> go{false};
  const auto warm = std::chrono::duration<double>(0.2);
  Clock::time_point start, end;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready++;
      while (!go.load()) std::this_thread::yield();
      lat[i].reserve(1 << 16);
      for (;;) {
        const auto t0 = Clock::now();
        if (t0 >= end) break;
        auto r = cs[i]->Lookup(env.codec, env.lookup_keys);
        const auto t1 = Clock::now();
        if (!r.ok() || r->matched != env.lookup_keys.size()) {
          failed = true;
          break;
        }
        if (t0 >= start) lat[i].push_back(Seconds(t1 - t0));
      }
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  start = Clock::now() + std::chrono::duration_cast<Clock::duration>(warm);
  end = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(duration_s));
  go = true;
  for (auto& t : threads) t.join();
  if (failed) return absl::InternalError("a lookup failed or missed during the closed-loop run");
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  // Requests that started in the window; the last ones may finish just after `end`.
  return Summarize(all, duration_s);
}

// Open loop: request k is due at T0 + k/rate and goes out through client k % n, and each
// latency is completion time minus DUE time, so a backlog shows up as latency instead of
// vanishing (no coordinated omission in either sender). Senders:
//  * `async_senders` (the default): one scheduler thread sends every request at its due time
//    with the non-blocking LookupAsync and never waits for an answer, so the offered load follows
//    the schedule whatever the daemon does -- the open loop of the acceptance criterion
//    ("requests sent on a schedule"). A sender that falls behind sends late, and that lateness
//    is in the latency.
//  * else one thread per client sends its share with the blocking Lookup: a client whose
//    previous lookup is still out cannot send on time, so while the daemon is slow these clients
//    throttle themselves (the lateness is counted, but the daemon sees less load than
//    scheduled), and the 64 sleeping threads add their own wake-ups to the 2 cores.
absl::StatusOr<LatencyStats> OpenLoop(const Env& env, std::vector<std::unique_ptr<Client>>& cs,
                                      int n, double rate, double duration_s, bool async_senders,
                                      double* achieved) {
  const uint64_t total = static_cast<uint64_t>(rate * duration_s);
  const double interval = 1.0 / rate;
  std::vector<double> lat(total, -1), late(total, 0);
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> completed{0};
  std::atomic<int64_t> last_done_ns{0};
  ::prctl(PR_SET_TIMERSLACK, 1000UL);  // wake within ~1 us of each due time, not 50 us
  const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(50);
  if (!async_senders) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        ::prctl(PR_SET_TIMERSLACK, 1000UL);
        for (uint64_t k = static_cast<uint64_t>(i); k < total && !failed; k += n) {
          const auto due = t0 + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(double(k) * interval));
          if (Clock::now() < due) std::this_thread::sleep_until(due);
          late[k] = Seconds(Clock::now() - due);
          auto r = cs[i]->Lookup(env.codec, env.lookup_keys);
          const auto done = Clock::now();
          if (!r.ok() || r->matched != env.lookup_keys.size()) failed = true;
          lat[k] = Seconds(done - due);
          const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(done - t0).count();
          int64_t prev = last_done_ns.load();
          while (ns > prev && !last_done_ns.compare_exchange_weak(prev, ns)) {
          }
          completed.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (uint64_t k = 0; async_senders && k < total && !failed.load(std::memory_order_relaxed); ++k) {
    const auto due = t0 + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(double(k) * interval));
    if (Clock::now() < due) std::this_thread::sleep_until(due);
    late[k] = Seconds(Clock::now() - due);
    cs[k % n]->LookupAsync(
        env.codec, env.lookup_keys, {},
        [&, k, due](absl::StatusOr<client::LookupResult> r) {
          const auto done = Clock::now();
          if (!r.ok() || r->matched != env.lookup_keys.size()) failed = true;
          lat[k] = Seconds(done - due);
          const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(done - t0).count();
          int64_t prev = last_done_ns.load();
          while (ns > prev && !last_done_ns.compare_exchange_weak(prev, ns)) {
          }
          completed.fetch_add(1);
        });
  }
  // Every sent request completes (or fails) within the RPC deadline; wait for all of them.
  const uint64_t sent = failed ? 0 : total;
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (completed.load() < sent && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (failed) return absl::InternalError("a lookup failed or missed during the open-loop run");
  if (completed.load() < total) return absl::InternalError("open-loop lookups never completed");
  std::vector<double> all(lat.begin(), lat.end());
  const double span = double(last_done_ns.load()) / 1e9;
  *achieved = span > 0 ? double(all.size()) / span : 0;
  LatencyStats st = Summarize(all, duration_s);
  const LatencyStats lateness = Summarize(late, duration_s);
  st.send_late_p99_ms = lateness.p99_ms;
  st.send_late_max_ms = lateness.max_ms;
  return st;
}

struct LoadStats {
  double path_gbps = 0, memcpy_gbps = 0;
  int iterations = 0;
  double load_ms_p50 = 0, copy_ms_p50 = 0, lease_rtt_ms_p50 = 0;  // per batch
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Alternates one batch load through `c` and one plain memcpy of the same pool bytes into the
// same destination buffers, for duration_s; each side's GB/s is its bytes over its own time.
absl::StatusOr<LoadStats> LoadVsMemcpy(const Env& env, Client& c, const uint8_t* pool,
                                       const std::vector<client::PageRef>& refs,
                                       std::vector<std::span<uint8_t>>& dst, double duration_s) {
  const std::span<const BlockKey> keys(env.keys.data(), refs.size());
  uint64_t batch_bytes = 0;
  for (const auto& r : refs) batch_bytes += r.bytes;
  auto load = [&]() -> absl::Status {
    auto n = c.LoadInto(env.codec, keys, dst);
    if (!n.ok()) return n.status();
    if (*n != keys.size()) return absl::InternalError("batch load missed pages");
    return absl::OkStatus();
  };
  auto copy = [&] {
    for (size_t i = 0; i < refs.size(); ++i) std::memcpy(dst[i].data(), pool + refs[i].offset, refs[i].bytes);
  };
  for (int w = 0; w < 2; ++w) {  // warm: fault in both mappings and the buffers
    OSCARKV_RETURN_IF_ERROR(load());
    copy();
  }
  Clock::duration t_load{}, t_copy{};
  std::vector<double> load_ms, copy_ms, rtt_ms;
  LoadStats s;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(duration_s));
  while (Clock::now() < end || s.iterations < 4) {
    // Alternate which goes first, so neither side always runs right after the other.
    Clock::duration dl{}, dc{};
    for (int side = 0; side < 2; ++side) {
      const bool do_load = (side == 0) == (s.iterations % 2 == 0);
      const auto a = Clock::now();
      if (do_load) {
        OSCARKV_RETURN_IF_ERROR(load());
        dl = Clock::now() - a;
      } else {
        copy();
        dc = Clock::now() - a;
      }
    }
    t_load += dl;
    t_copy += dc;
    load_ms.push_back(1e3 * Seconds(dl));
    copy_ms.push_back(1e3 * Seconds(dc));
    ++s.iterations;
  }
  // The control-plane share of a load: pin the batch and release it, no copy.
  for (int i = 0; i < 20; ++i) {
    auto a = Clock::now();
    auto pin = c.Lookup(env.codec, keys, {.pin = true});
    if (!pin.ok()) return pin.status();
    OSCARKV_RETURN_IF_ERROR(c.Release(*pin));
    rtt_ms.push_back(1e3 * Seconds(Clock::now() - a));
  }
  s.load_ms_p50 = Median(load_ms);
  s.copy_ms_p50 = Median(copy_ms);
  s.lease_rtt_ms_p50 = Median(rtt_ms);
  s.path_gbps = double(batch_bytes) * s.iterations / Seconds(t_load) / 1e9;
  s.memcpy_gbps = double(batch_bytes) * s.iterations / Seconds(t_copy) / 1e9;
  return s;
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

int RunBenchService(int argc, char** argv) {
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
  a.Epilog(
      "Acceptance targets: shm load >= 70% of memcpy; open-loop p99 <= 1 ms at 10,000/s; "
      "store and verified load (client library defaults) >= 85% of memcpy.\n"
      "--json: lookup_p99_ms_at_10k and lookup_peak_per_s are the client library's default "
      "lookup path (lookup_path: \"local\", the daemon's same-host socket, as the daemon runs "
      "on this host); lookup_p99_ms_at_10k_grpc and lookup_peak_per_s_grpc are gRPC's, "
      "measured side by side.");
  if (auto rc = a.ParseOrExitCode(argc, argv)) return *rc;
  auto duration = a.real("duration-s");
  auto pool_mb = a.integer("pool-mb");
  auto batch = a.integer("batch");
  auto nkeys = a.integer("lookup-keys");
  auto rate = a.real("rate");
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
      *duration <= 0 || *batch < 1 || *nkeys < 1 || *rate <= 0 || client_counts.empty()) {
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
  client::LocalDaemonOptions dopt;
  dopt.binary = a.str("daemon");
  const std::string log_path = absl::StrCat("/tmp/oscarkv-bench-", ::getpid(), ".log");
  dopt.log_path = log_path;
  dopt.flags = {"--listen", a.str("listen"), "--pool-mb", std::to_string(*pool_mb), "--metrics-listen", "off",
                "--shm-name", absl::StrCat("oscarkv-bench-", ::getpid())};
  if (!a.str("daemon-cpus").empty()) {
    dopt.flags.insert(dopt.flags.end(), {"--cpus", a.str("daemon-cpus")});
  }
  progress("starting oscarkvd");
  auto daemon = client::LocalDaemon::Start(dopt);
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

  // 3-4. Lookups per path: closed loop at each client count, then the open loop; the paths
  // alternate phase by phase so both see the same machine state.
  struct PathRun {
    std::string name;           // "local" / "grpc": the path the clients actually use
    bool is_default = false;    // the client library's default (kAuto)
    std::vector<std::unique_ptr<Client>> clients;
    std::vector<std::pair<int, LatencyStats>> closed;
    LatencyStats peak, open;
    double achieved = 0;
  };
  const int max_clients = *std::max_element(client_counts.begin(), client_counts.end());
  std::vector<PathRun> runs;
  for (const char* want : {"auto", "grpc"}) {
    const bool is_auto = std::string(want) == "auto";
    if (lookup_path_opt == "grpc" && is_auto) continue;
    if (lookup_path_opt == "local" && !is_auto) continue;
    const client::LookupPath lp = lookup_path_opt == "local" ? client::LookupPath::kLocal
                                  : is_auto                  ? client::LookupPath::kAuto
                                                             : client::LookupPath::kGrpc;
    auto cs = ConnectMany(env, max_clients, client::DataPath::kGrpc, true,
                          a.flag("dedicated-connections"), lp);
    if (!cs.ok()) return fail("connecting lookup clients", cs.status());
    PathRun run;
    run.name = client::LookupPathName((*cs)[0]->server().lookup_path);
    run.is_default = is_auto;
    run.clients = std::move(*cs);
    runs.push_back(std::move(run));
  }
  for (int n : client_counts) {
    for (PathRun& run : runs) {
      progress(absl::StrCat("closed-loop lookups, ", n, " clients, ", run.name).c_str());
      auto s = WithCpu((*daemon)->pid(), [&] { return ClosedLoop(env, run.clients, n, *duration); });
      if (!s.ok()) return fail("closed loop", s.status());
      run.closed.push_back({n, *s});
      if (s->per_s > run.peak.per_s) run.peak = *s;
    }
  }
  for (PathRun& run : runs) {
    progress(absl::StrCat("open-loop lookups, ", *rate, "/s over ", max_clients, " clients, ",
                          run.name).c_str());
    auto open = WithCpu((*daemon)->pid(), [&] {
      return OpenLoop(env, run.clients, max_clients, *rate, *duration,
                      a.str("open-loop-senders") == "async", &run.achieved);
    });
    if (!open.ok()) return fail("open loop", open.status());
    run.open = *open;
  }
  for (PathRun& run : runs) run.clients.clear();

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
  const int fd = ::open(info.shm_path.c_str(), O_RDONLY);
  if (fd < 0) return fail("opening the pool", absl::NotFoundError(info.shm_path));
  auto* pool = static_cast<const uint8_t*>(::mmap(nullptr, info.shm_bytes, PROT_READ, MAP_SHARED, fd, 0));
  ::close(fd);
  if (pool == MAP_FAILED) return fail("mapping the pool", absl::InternalError(info.shm_path));
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
  ::munmap(const_cast<uint8_t*>(pool), info.shm_bytes);
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
  dflt->reset();
  setup->reset();
  auto stop = (*daemon)->Stop();

  // 6. Report.
  const double batch_mb = double(page_bytes) * double(*batch) / 1e6;
  const double shm_ratio = shm->path_gbps / shm->memcpy_gbps;
  const double grpc_ratio = grpc->path_gbps / grpc->memcpy_gbps;
  // With --json stdout carries only the JSON document; the table goes to stderr.
  FILE* out = as_json ? stderr : stdout;
  std::fprintf(out, "== oscarkv bench service ==\n");
  std::fprintf(out, "machine: %u CPUs (%s); daemon and clients on the same machine, 127.0.0.1\n",
              std::thread::hardware_concurrency(), CpuModel().c_str());
  std::fprintf(out, "lookups: %lld cached keys each (probe, no pin); %.1f s per phase; clients "
              "are Client objects in this process on %s\n",
              (long long)*nkeys, *duration,
              a.flag("dedicated-connections")
                  ? "their own connections each (gRPC: a TCP connection; local: a channel)"
                  : "shared connections (gRPC: one HTTP/2 connection; local: one channel)");
  std::fprintf(out, "cpus: clients %s, daemon %s\n\n",
               a.str("client-cpus").empty() ? "any" : a.str("client-cpus").c_str(),
               a.str("daemon-cpus").empty() ? "any" : a.str("daemon-cpus").c_str());
  std::fprintf(out, "%-32s %-6s %11s %9s %9s %9s %11s %11s\n", "lookups", "path", "per second",
               "p50 ms", "p99 ms", "max ms", "client cpu", "daemon cpu");
  for (size_t i = 0; i < client_counts.size(); ++i) {
    for (const PathRun& run : runs) {
      const auto& [n, s] = run.closed[i];
      std::fprintf(out, "%-32s %-6s %11.0f %9.3f %9.3f %9.3f %8.0f us %8.0f us\n",
                   absl::StrCat("closed loop, ", n, n == 1 ? " client" : " clients").c_str(),
                   run.name.c_str(), s.per_s, s.p50_ms, s.p99_ms, s.max_ms, s.client_cpu_us,
                   s.daemon_cpu_us);
    }
  }
  for (const PathRun& run : runs) {
    const LatencyStats& o = run.open;
    std::fprintf(out, "%-32s %-6s %11.0f %9.3f %9.3f %9.3f %8.0f us %8.0f us  %s%s\n",
                 absl::StrCat("open loop ", *rate, "/s, ", max_clients, " clients").c_str(),
                 run.name.c_str(), run.achieved, o.p50_ms, o.p99_ms, o.max_ms, o.client_cpu_us,
                 o.daemon_cpu_us, o.p99_ms <= 1.0 ? "PASS" : "FAIL",
                 run.is_default ? " (target p99 <= 1 ms; the default path)" : "");
  }
  for (const PathRun& run : runs) {
    std::fprintf(out, "open loop, %s: the sender itself was late by p99 %.3f ms, max %.3f ms "
                 "(included above)\n", run.name.c_str(), run.open.send_late_p99_ms,
                 run.open.send_late_max_ms);
  }
  std::fprintf(out, "(path: local = the daemon's same-host control socket, the client library's "
               "default here; grpc = gRPC over %s)\n",
               a.str("listen").rfind("unix:", 0) == 0 ? "a unix socket" : "loopback TCP");
  std::fprintf(out, "(cpu = CPU time per lookup, user + system, over the phase; open-loop senders: %s)\n",
               a.str("open-loop-senders") == "async"
                   ? "async, one thread sending each lookup at its scheduled time"
                   : "threads, one per client, blocking Lookup");
  std::fprintf(out, "\n%-34s %12s %14s %10s\n", "loads", "GB/s", "memcpy GB/s", "ratio");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%   %s (target >= 70%%)\n",
              absl::StrCat("shared memory, ", *batch, " pages (", int(batch_mb), " MB)").c_str(),
              shm->path_gbps, shm->memcpy_gbps, 100 * shm_ratio, shm_ratio >= 0.7 ? "PASS" : "FAIL");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%\n",
              absl::StrCat("gRPC streaming, ", *batch, " pages").c_str(), grpc->path_gbps,
              grpc->memcpy_gbps, 100 * grpc_ratio);
  std::fprintf(out, "per batch (median): shm load %.2f ms, memcpy %.2f ms, pin+release of the "
               "batch alone %.2f ms\n",
               shm->load_ms_p50, shm->copy_ms_p50, shm->lease_rtt_ms_p50);
  std::fprintf(out, "\n%-34s %12s %14s %10s   (client library defaults: shared memory, "
               "checksums verified)\n", "stores / verified loads", "GB/s", "memcpy GB/s", "ratio");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%   %s (target >= 85%%)\n",
               absl::StrCat("store, ", *batch, " pages").c_str(), sl->store_gbps,
               sl->store_memcpy_gbps, 100 * sl->store_vs_memcpy(),
               sl->store_vs_memcpy() >= 0.85 ? "PASS" : "FAIL");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%   %s (target >= 85%%)\n",
               absl::StrCat("verified load, ", *batch, " pages").c_str(), sl->load_gbps,
               sl->load_memcpy_gbps, 100 * sl->load_verified_vs_memcpy(),
               sl->load_verified_vs_memcpy() >= 0.85 ? "PASS" : "FAIL");
  std::fprintf(out, "per batch (median): store %.2f ms, verified load %.2f ms, memcpy %.2f ms "
               "(%d iterations)\n", sl->store_ms_p50, sl->load_ms_p50, sl->memcpy_ms_p50,
               sl->iterations);
  std::string peaks;
  for (const PathRun& run : runs) {
    absl::StrAppend(&peaks, peaks.empty() ? "" : ", ", run.name, " ",
                    absl::StrFormat("%.0f", run.peak.per_s));
  }
  std::fprintf(out, "\npeak lookups/s (closed loop): %s; daemon stopped %s\n", peaks.c_str(),
               stop.ok() && *stop == 0 ? "cleanly" : "with an error");
  if (as_json) {
    auto closed_json = [](const PathRun& run) {
      json cl = json::array();
      for (auto& [n, s] : run.closed) {
        cl.push_back({{"clients", n}, {"per_s", s.per_s}, {"p50_ms", s.p50_ms},
                      {"p99_ms", s.p99_ms}, {"p999_ms", s.p999_ms}, {"max_ms", s.max_ms},
                      {"count", s.count}, {"client_cpu_us", s.client_cpu_us},
                      {"daemon_cpu_us", s.daemon_cpu_us}});
      }
      return cl;
    };
    auto open_json = [&](const PathRun& run) {
      const LatencyStats& o = run.open;
      return json{{"offered_per_s", *rate}, {"achieved_per_s", run.achieved},
                  {"senders", a.str("open-loop-senders")}, {"clients", max_clients},
                  {"p50_ms", o.p50_ms}, {"p99_ms", o.p99_ms}, {"p999_ms", o.p999_ms},
                  {"max_ms", o.max_ms}, {"count", o.count}, {"client_cpu_us", o.client_cpu_us},
                  {"daemon_cpu_us", o.daemon_cpu_us}, {"send_late_p99_ms", o.send_late_p99_ms},
                  {"send_late_max_ms", o.send_late_max_ms}};
    };
    json j = {
        {"machine", {{"cpus", std::thread::hardware_concurrency()}, {"cpu", CpuModel()}}},
        {"lookup_keys", *nkeys},
        {"dedicated_connections", a.flag("dedicated-connections")},
        {"client_cpus", a.str("client-cpus").empty() ? "any" : a.str("client-cpus")},
        {"daemon_cpus", a.str("daemon-cpus").empty() ? "any" : a.str("daemon-cpus")},
        {"duration_s", *duration},
        {"shm_load_vs_memcpy", shm_ratio},
        {"grpc_load_vs_memcpy", grpc_ratio},
        {"store_vs_memcpy", sl->store_vs_memcpy()},
        {"load_verified_vs_memcpy", sl->load_verified_vs_memcpy()},
        {"store_load", {{"batch_pages", *batch}, {"page_bytes", page_bytes},
                        {"iterations", sl->iterations},
                        {"store_gbps", sl->store_gbps},
                        {"store_memcpy_gbps", sl->store_memcpy_gbps},
                        {"load_verified_gbps", sl->load_gbps},
                        {"load_memcpy_gbps", sl->load_memcpy_gbps},
                        {"store_ms_p50", sl->store_ms_p50},
                        {"load_verified_ms_p50", sl->load_ms_p50},
                        {"memcpy_ms_p50", sl->memcpy_ms_p50}}},
        {"load", {{"batch_pages", *batch}, {"page_bytes", page_bytes},
                  {"shm_gbps", shm->path_gbps}, {"shm_memcpy_gbps", shm->memcpy_gbps},
                  {"grpc_gbps", grpc->path_gbps}, {"grpc_memcpy_gbps", grpc->memcpy_gbps},
                  {"shm_iterations", shm->iterations}, {"grpc_iterations", grpc->iterations},
                  {"shm_load_ms_p50", shm->load_ms_p50}, {"memcpy_ms_p50", shm->copy_ms_p50},
                  {"pin_release_ms_p50", shm->lease_rtt_ms_p50}}},
    };
    // Per path: "closed_loop"/"open_loop" and the headline fields are the default path's
    // (kAuto), the *_grpc ones gRPC's; a path not measured (--lookup-path) is null.
    for (const PathRun& run : runs) {
      const std::string sfx = run.is_default ? "" : "_grpc";
      j["closed_loop" + sfx] = closed_json(run);
      j["open_loop" + sfx] = open_json(run);
      j["lookup_p99_ms_at_10k" + sfx] = run.open.p99_ms;
      j["lookup_peak_per_s" + sfx] = run.peak.per_s;
      j["lookup_p99_ms_at_peak_clients" + sfx] = run.closed.back().second.p99_ms;
      if (run.is_default) j["lookup_path"] = run.name;
    }
    for (const char* k : {"lookup_p99_ms_at_10k", "lookup_peak_per_s", "lookup_p99_ms_at_10k_grpc",
                          "lookup_peak_per_s_grpc", "lookup_path"}) {
      if (!j.contains(k)) j[k] = nullptr;
    }
    if (*rate != 10000) {  // not measured at 10k
      j["lookup_p99_ms_at_10k"] = nullptr;
      j["lookup_p99_ms_at_10k_grpc"] = nullptr;
    }
    std::printf("%s\n", j.dump(2).c_str());
  }
  if (!stop.ok() || *stop != 0) {
    std::fprintf(stderr, "oscarkv bench service: oscarkvd did not stop cleanly (%s; log: %s)\n",
                 stop.ok() ? absl::StrCat("exit status ", *stop).c_str()
                           : std::string(stop.status().message()).c_str(),
                 log_path.c_str());
    return 1;
  }
  ::unlink(log_path.c_str());
  return 0;
}

OSCARKV_COMMAND("bench service",
                "lookups/s and p50/p99 (local socket and gRPC side by side) and load GB/s (shm, "
                "gRPC) vs memcpy, of a local oscarkvd",
                RunBenchService);

}  // namespace
}  // namespace oscarkv::cli
#endif  // __has_include client.h
