// Internal to `oscarkv bench service` (bench/service_bench.h): the measured phases -- closed-
// and open-loop lookups, batch loads beside memcpy -- and the results the report prints.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cstdio>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "oscarkv/client/client.h"
#include "oscarkv/util/args.h"
#include "store_load_vs_memcpy.h"

namespace oscarkv::bench::service_bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

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
double CpuSeconds(pid_t pid);

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

// Count, rate and latency quantiles of `lat_s` (seconds; sorted in place).
LatencyStats Summarize(std::vector<double>& lat_s, double seconds);

struct Env {
  std::string addr;
  client::Codec codec;
  std::vector<BlockKey> keys;       // the stored sequence
  std::vector<BlockKey> lookup_keys;  // prefix asked by each lookup
  // The mutual-TLS daemon of --tls: CA, client certificate and key (PEM files); "" = plaintext.
  std::string tls_ca, tls_cert, tls_key;
};

// --tls: a throwaway CA, a server certificate for 127.0.0.1 and a client certificate, made by
// the openssl tool in a private temp dir (removed with this object).
struct BenchPki {
  std::string dir, ca, server_cert, server_key, client_cert, client_key;
  ~BenchPki();
};
absl::StatusOr<std::unique_ptr<BenchPki>> MakeBenchPki();

// `n` clients of `env`'s daemon, each with the codec registered.
absl::StatusOr<std::vector<std::unique_ptr<client::Client>>> ConnectMany(
    const Env& env, int n, client::DataPath path, bool verify, bool dedicated = false,
    client::LookupPath lookup_path = client::LookupPath::kAuto);

// Closed loop: each of the first `n` clients sends its next lookup as soon as the previous one
// returned, for duration_s after a 0.2 s warm-up.
absl::StatusOr<LatencyStats> ClosedLoop(const Env& env,
                                        std::vector<std::unique_ptr<client::Client>>& cs, int n,
                                        double duration_s);

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
absl::StatusOr<LatencyStats> OpenLoop(const Env& env,
                                      std::vector<std::unique_ptr<client::Client>>& cs, int n,
                                      double rate, double duration_s, bool async_senders,
                                      double* achieved);

struct LoadStats {
  double path_gbps = 0, memcpy_gbps = 0;
  int iterations = 0;
  double load_ms_p50 = 0, copy_ms_p50 = 0, lease_rtt_ms_p50 = 0;  // per batch
};

double Median(std::vector<double> v);

// Alternates one batch load through `c` and one plain memcpy of the same pool bytes into the
// same destination buffers, for duration_s; each side's GB/s is its bytes over its own time.
absl::StatusOr<LoadStats> LoadVsMemcpy(const Env& env, client::Client& c, const uint8_t* pool,
                                       const std::vector<client::PageRef>& refs,
                                       std::vector<std::span<uint8_t>>& dst, double duration_s);

// The "model name" of /proc/cpuinfo.
std::string CpuModel();

// One lookup path's phases: closed loop at each client count, then the open loop.
struct PathRun {
  std::string name;         // "local" / "grpc" / "tls": the path the clients actually use
  bool is_default = false;  // the client library's default (kAuto)
  std::string json_suffix;  // of its --json keys: "" (the default path), "_grpc", "_tls"
  pid_t daemon_pid = 0;     // the daemon it measures (--tls: its own, mutual-TLS daemon)
  std::vector<std::unique_ptr<client::Client>> clients;
  std::string address;      // its daemon's gRPC address
  std::vector<std::pair<int, LatencyStats>> closed;
  // Open loop: every round (one without --tls) with its achieved rate; `open` and `achieved`
  // are the round whose p99 is the median (PickMedianRound).
  std::vector<std::pair<LatencyStats, double>> rounds;
  LatencyStats peak, open;
  double achieved = 0;
  int connections = -1;  // TCP connections to its daemon after its open loop (-1: not TCP)
};

// Sets run.open/achieved to the round whose p99 is the median of run.rounds (the upper one of
// an even count).
void PickMedianRound(PathRun& run);

// ESTABLISHED TCP connections (/proc/net/tcp and tcp6) whose remote end is `address`'s port on
// 127.0.0.1: the connections the clients hold to that daemon. -1 when `address` is not
// 127.0.0.1:port.
int TcpConnectionsTo(const std::string& address);

// Everything the report prints (the flags it echoes come from the Args).
struct Results {
  int64_t lookup_keys = 0, batch = 0;
  double duration_s = 0, rate = 0;
  uint64_t page_bytes = 0;
  std::vector<int> client_counts;
  int max_clients = 0;
  std::vector<PathRun> runs;
  LoadStats shm, grpc;
  StoreLoadVsMemcpy store_load;  // the default daemon (isolated shared memory)
  StoreLoadVsMemcpy store_load_trusted;  // a daemon of its own with --shm-mode trusted
  StoreLoadVsMemcpy store_load_tenant;   // isolated, as a tenant: staging + load staging
  std::string shm_mode;                  // the default daemon's: "isolated" or "trusted"
  bool daemon_stopped_cleanly = false;
};

// The human-readable table (stdout, or stderr when --json has stdout).
void PrintTable(const Args& a, const Results& r, FILE* out);
// The --json document; its keys are checked by bench_cli_keys_test.
nlohmann::json ToJson(const Args& a, const Results& r);

}  // namespace oscarkv::bench::service_bench
