// The report of `oscarkv bench service`: the table and the --json document.
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service_bench_internal.h"

namespace oscarkv::bench::service_bench {

void PrintTable(const Args& a, const Results& r, FILE* out) {
  const double batch_mb = double(r.page_bytes) * double(r.batch) / 1e6;
  const double shm_ratio = r.shm.path_gbps / r.shm.memcpy_gbps;
  const double grpc_ratio = r.grpc.path_gbps / r.grpc.memcpy_gbps;
  std::fprintf(out, "== oscarkv bench service ==\n");
  std::fprintf(out, "machine: %u CPUs (%s); daemon and clients on the same machine, 127.0.0.1\n",
              std::thread::hardware_concurrency(), CpuModel().c_str());
  std::fprintf(out, "lookups: %lld cached keys each (probe, no pin); %.1f s per phase; clients "
              "are Client objects in this process on %s\n",
              (long long)r.lookup_keys, r.duration_s,
              a.flag("dedicated-connections")
                  ? "their own connections each (gRPC: a TCP connection; local: a channel)"
                  : "shared connections (gRPC: one HTTP/2 connection; local: one channel)");
  std::fprintf(out, "cpus: clients %s, daemon %s\n\n",
               a.str("client-cpus").empty() ? "any" : a.str("client-cpus").c_str(),
               a.str("daemon-cpus").empty() ? "any" : a.str("daemon-cpus").c_str());
  std::fprintf(out, "%-32s %-6s %11s %9s %9s %9s %11s %11s\n", "lookups", "path", "per second",
               "p50 ms", "p99 ms", "max ms", "client cpu", "daemon cpu");
  for (size_t i = 0; i < r.client_counts.size(); ++i) {
    for (const PathRun& run : r.runs) {
      const auto& [n, s] = run.closed[i];
      std::fprintf(out, "%-32s %-6s %11.0f %9.3f %9.3f %9.3f %8.0f us %8.0f us\n",
                   absl::StrCat("closed loop, ", n, n == 1 ? " client" : " clients").c_str(),
                   run.name.c_str(), s.per_s, s.p50_ms, s.p99_ms, s.max_ms, s.client_cpu_us,
                   s.daemon_cpu_us);
    }
  }
  for (const PathRun& run : r.runs) {
    const LatencyStats& o = run.open;
    std::fprintf(out, "%-32s %-6s %11.0f %9.3f %9.3f %9.3f %8.0f us %8.0f us  %s%s\n",
                 absl::StrCat("open loop ", r.rate, "/s, ", r.max_clients, " clients").c_str(),
                 run.name.c_str(), run.achieved, o.p50_ms, o.p99_ms, o.max_ms, o.client_cpu_us,
                 o.daemon_cpu_us, o.p99_ms <= 1.0 ? "PASS" : "FAIL",
                 run.is_default ? " (target p99 <= 1 ms; the default path)" : "");
  }
  for (const PathRun& run : r.runs) {
    std::fprintf(out, "open loop, %s: the sender itself was late by p99 %.3f ms, max %.3f ms "
                 "(included above)\n", run.name.c_str(), run.open.send_late_p99_ms,
                 run.open.send_late_max_ms);
  }
  std::fprintf(out, "(path: local = the daemon's same-host control socket, the client library's "
               "default here; grpc = gRPC over %s%s)\n",
               a.str("listen").rfind("unix:", 0) == 0 ? "a unix socket" : "loopback TCP",
               a.flag("tls") ? "; tls = gRPC with mutual TLS over loopback TCP, to a second "
                               "daemon started with --tls-client-ca"
                             : "");
  const PathRun* grpc_run = nullptr;
  const PathRun* tls_run = nullptr;
  for (const PathRun& run : r.runs) {
    if (run.json_suffix == "_grpc") grpc_run = &run;
    if (run.json_suffix == "_tls") tls_run = &run;
  }
  if (grpc_run != nullptr && tls_run != nullptr && grpc_run->open.p99_ms > 0) {
    for (size_t i = 0; i < grpc_run->rounds.size() && i < tls_run->rounds.size(); ++i) {
      const double g = grpc_run->rounds[i].first.p99_ms, t = tls_run->rounds[i].first.p99_ms;
      std::fprintf(out, "  open-loop round %zu: grpc p99 %.3f ms, tls p99 %.3f ms (%.2fx)\n",
                   i + 1, g, t, g > 0 ? t / g : 0.0);
    }
    const double ratio = tls_run->open.p99_ms / grpc_run->open.p99_ms;
    std::fprintf(out, "mutual TLS vs plaintext gRPC, open-loop p99 (median of %zu alternating "
                 "rounds each): %.3f / %.3f ms = %.2fx   %s (target <= 1.5x); TCP connections "
                 "held: tls %d, grpc %d\n", tls_run->rounds.size(), tls_run->open.p99_ms,
                 grpc_run->open.p99_ms, ratio, ratio <= 1.5 ? "PASS" : "FAIL",
                 tls_run->connections, grpc_run->connections);
  }
  std::fprintf(out, "(cpu = CPU time per lookup, user + system, over the phase; open-loop senders: %s)\n",
               a.str("open-loop-senders") == "async"
                   ? "async, one thread sending each lookup at its scheduled time"
                   : "threads, one per client, blocking Lookup");
  std::fprintf(out, "\n%-34s %12s %14s %10s\n", "loads", "GB/s", "memcpy GB/s", "ratio");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%   %s (target >= 70%%)\n",
              absl::StrCat("shared memory, ", r.batch, " pages (", int(batch_mb), " MB)").c_str(),
              r.shm.path_gbps, r.shm.memcpy_gbps, 100 * shm_ratio, shm_ratio >= 0.7 ? "PASS" : "FAIL");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%\n",
              absl::StrCat("gRPC streaming, ", r.batch, " pages").c_str(), r.grpc.path_gbps,
              r.grpc.memcpy_gbps, 100 * grpc_ratio);
  std::fprintf(out, "per batch (median): shm load %.2f ms, memcpy %.2f ms, pin+release of the "
               "batch alone %.2f ms\n",
               r.shm.load_ms_p50, r.shm.copy_ms_p50, r.shm.lease_rtt_ms_p50);
  std::fprintf(out, "\n%-34s %12s %14s %10s   (client library defaults: shared memory, "
               "checksums verified)\n", "stores / verified loads", "GB/s", "memcpy GB/s", "ratio");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%   %s (target >= 85%%)\n",
               absl::StrCat("store, ", r.batch, " pages").c_str(), r.store_load.store_gbps,
               r.store_load.store_memcpy_gbps, 100 * r.store_load.store_vs_memcpy(),
               r.store_load.store_vs_memcpy() >= 0.85 ? "PASS" : "FAIL");
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%   %s (target >= 85%%)\n",
               absl::StrCat("verified load, ", r.batch, " pages").c_str(), r.store_load.load_gbps,
               r.store_load.load_memcpy_gbps, 100 * r.store_load.load_verified_vs_memcpy(),
               r.store_load.load_verified_vs_memcpy() >= 0.85 ? "PASS" : "FAIL");
  std::fprintf(out, "per batch (median): store %.2f ms, verified load %.2f ms, memcpy %.2f ms "
               "(%d iterations)\n", r.store_load.store_ms_p50, r.store_load.load_ms_p50, r.store_load.memcpy_ms_p50,
               r.store_load.iterations);
  // Isolation's cost: the default daemon's shared memory mode beside trusted, same run.
  const StoreLoadVsMemcpy& t = r.store_load_trusted;
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%   (%s: the figures above)\n",
               "store, trusted shared memory", t.store_gbps, t.store_memcpy_gbps,
               100 * t.store_vs_memcpy(), r.shm_mode.c_str());
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%\n", "verified load, trusted shared memory",
               t.load_gbps, t.load_memcpy_gbps, 100 * t.load_verified_vs_memcpy());
  const StoreLoadVsMemcpy& tn = r.store_load_tenant;
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%\n", "store, tenant (staging)", tn.store_gbps,
               tn.store_memcpy_gbps, 100 * tn.store_vs_memcpy());
  std::fprintf(out, "%-34s %12.2f %14.2f %9.0f%%\n", "verified load, tenant (load staging)",
               tn.load_gbps, tn.load_memcpy_gbps, 100 * tn.load_verified_vs_memcpy());
  if (r.shm_mode == "isolated") {
    std::fprintf(out, "isolated vs trusted: store %.0f%%, verified load %.0f%% (targets: isolated "
                 ">= 80%% of memcpy: store %s, load %s)\n",
                 100 * r.store_load.store_gbps / t.store_gbps,
                 100 * r.store_load.load_gbps / t.load_gbps,
                 r.store_load.store_vs_memcpy() >= 0.8 ? "PASS" : "FAIL",
                 r.store_load.load_verified_vs_memcpy() >= 0.8 ? "PASS" : "FAIL");
  }
  std::string peaks;
  for (const PathRun& run : r.runs) {
    absl::StrAppend(&peaks, peaks.empty() ? "" : ", ", run.name, " ",
                    absl::StrFormat("%.0f", run.peak.per_s));
  }
  std::fprintf(out, "\npeak lookups/s (closed loop): %s; daemon stopped %s\n", peaks.c_str(),
               r.daemon_stopped_cleanly ? "cleanly" : "with an error");
}

nlohmann::json ToJson(const Args& a, const Results& r) {
  using json = nlohmann::json;
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
    return json{{"offered_per_s", r.rate}, {"achieved_per_s", run.achieved},
                {"senders", a.str("open-loop-senders")}, {"clients", r.max_clients},
                {"p50_ms", o.p50_ms}, {"p99_ms", o.p99_ms}, {"p999_ms", o.p999_ms},
                {"max_ms", o.max_ms}, {"count", o.count}, {"client_cpu_us", o.client_cpu_us},
                {"daemon_cpu_us", o.daemon_cpu_us}, {"send_late_p99_ms", o.send_late_p99_ms},
                {"send_late_max_ms", o.send_late_max_ms}};
  };
  json j = {
      {"machine", {{"cpus", std::thread::hardware_concurrency()}, {"cpu", CpuModel()}}},
      {"lookup_keys", r.lookup_keys},
      {"dedicated_connections", a.flag("dedicated-connections")},
      {"client_cpus", a.str("client-cpus").empty() ? "any" : a.str("client-cpus")},
      {"daemon_cpus", a.str("daemon-cpus").empty() ? "any" : a.str("daemon-cpus")},
      {"duration_s", r.duration_s},
      {"shm_load_vs_memcpy", r.shm.path_gbps / r.shm.memcpy_gbps},
      {"grpc_load_vs_memcpy", r.grpc.path_gbps / r.grpc.memcpy_gbps},
      {"store_vs_memcpy", r.store_load.store_vs_memcpy()},
      {"load_verified_vs_memcpy", r.store_load.load_verified_vs_memcpy()},
      // The default daemon is isolated: its figures are the *_isolated ones.
      {"store_vs_memcpy_isolated",
       r.shm_mode == "isolated" ? json(r.store_load.store_vs_memcpy()) : json(nullptr)},
      {"load_verified_vs_memcpy_isolated",
       r.shm_mode == "isolated" ? json(r.store_load.load_verified_vs_memcpy()) : json(nullptr)},
      {"store_vs_memcpy_trusted", r.store_load_trusted.store_vs_memcpy()},
      {"load_verified_vs_memcpy_trusted", r.store_load_trusted.load_verified_vs_memcpy()},
      {"store_vs_memcpy_tenant", r.store_load_tenant.store_vs_memcpy()},
      {"load_verified_vs_memcpy_tenant", r.store_load_tenant.load_verified_vs_memcpy()},
      {"store_load_tenant", {{"store_gbps", r.store_load_tenant.store_gbps},
                             {"store_memcpy_gbps", r.store_load_tenant.store_memcpy_gbps},
                             {"load_verified_gbps", r.store_load_tenant.load_gbps},
                             {"load_memcpy_gbps", r.store_load_tenant.load_memcpy_gbps},
                             {"iterations", r.store_load_tenant.iterations}}},
      {"store_load_trusted", {{"store_gbps", r.store_load_trusted.store_gbps},
                              {"store_memcpy_gbps", r.store_load_trusted.store_memcpy_gbps},
                              {"load_verified_gbps", r.store_load_trusted.load_gbps},
                              {"load_memcpy_gbps", r.store_load_trusted.load_memcpy_gbps},
                              {"iterations", r.store_load_trusted.iterations}}},
      {"store_load", {{"batch_pages", r.batch}, {"page_bytes", r.page_bytes},
                      {"shm_mode", r.shm_mode},
                      {"iterations", r.store_load.iterations},
                      {"store_gbps", r.store_load.store_gbps},
                      {"store_memcpy_gbps", r.store_load.store_memcpy_gbps},
                      {"load_verified_gbps", r.store_load.load_gbps},
                      {"load_memcpy_gbps", r.store_load.load_memcpy_gbps},
                      {"store_ms_p50", r.store_load.store_ms_p50},
                      {"load_verified_ms_p50", r.store_load.load_ms_p50},
                      {"memcpy_ms_p50", r.store_load.memcpy_ms_p50}}},
      {"load", {{"batch_pages", r.batch}, {"page_bytes", r.page_bytes},
                {"shm_gbps", r.shm.path_gbps}, {"shm_memcpy_gbps", r.shm.memcpy_gbps},
                {"grpc_gbps", r.grpc.path_gbps}, {"grpc_memcpy_gbps", r.grpc.memcpy_gbps},
                {"shm_iterations", r.shm.iterations}, {"grpc_iterations", r.grpc.iterations},
                {"shm_load_ms_p50", r.shm.load_ms_p50}, {"memcpy_ms_p50", r.shm.copy_ms_p50},
                {"pin_release_ms_p50", r.shm.lease_rtt_ms_p50}}},
  };
  // Per path: "closed_loop"/"open_loop" and the headline fields are the default path's
  // (kAuto), the *_grpc ones gRPC's; a path not measured (--lookup-path) is null.
  for (const PathRun& run : r.runs) {
    const std::string& sfx = run.json_suffix;
    j["closed_loop" + sfx] = closed_json(run);
    j["open_loop" + sfx] = open_json(run);
    j["lookup_p99_ms_at_10k" + sfx] = run.open.p99_ms;
    j["lookup_peak_per_s" + sfx] = run.peak.per_s;
    j["lookup_p99_ms_at_peak_clients" + sfx] = run.closed.back().second.p99_ms;
    if (run.is_default) j["lookup_path"] = run.name;
  }
  // --tls: mutual TLS over plaintext gRPC, open-loop p99 of the same run (target <= 1.5).
  if (j.contains("lookup_p99_ms_at_10k_tls") && j.contains("lookup_p99_ms_at_10k_grpc") &&
      j["lookup_p99_ms_at_10k_grpc"].get<double>() > 0) {
    j["lookup_p99_tls_vs_grpc"] = j["lookup_p99_ms_at_10k_tls"].get<double>() /
                                  j["lookup_p99_ms_at_10k_grpc"].get<double>();
  }
  // --tls: the alternating open-loop rounds of gRPC and TLS (the headline p99s are medians).
  const PathRun* grpc_run = nullptr;
  const PathRun* tls_run = nullptr;
  for (const PathRun& run : r.runs) {
    if (run.json_suffix == "_grpc") grpc_run = &run;
    if (run.json_suffix == "_tls") tls_run = &run;
  }
  if (grpc_run != nullptr && tls_run != nullptr) {
    json rounds = json::array();
    for (size_t i = 0; i < grpc_run->rounds.size() && i < tls_run->rounds.size(); ++i) {
      const auto& [g, g_achieved] = grpc_run->rounds[i];
      const auto& [t, t_achieved] = tls_run->rounds[i];
      rounds.push_back({{"round", i + 1}, {"grpc_p99_ms", g.p99_ms}, {"tls_p99_ms", t.p99_ms},
                        {"tls_vs_grpc", g.p99_ms > 0 ? json(t.p99_ms / g.p99_ms) : json(nullptr)},
                        {"grpc_p50_ms", g.p50_ms}, {"tls_p50_ms", t.p50_ms},
                        {"grpc_count", g.count}, {"tls_count", t.count},
                        {"grpc_achieved_per_s", g_achieved}, {"tls_achieved_per_s", t_achieved},
                        {"grpc_send_late_p99_ms", g.send_late_p99_ms},
                        {"tls_send_late_p99_ms", t.send_late_p99_ms}});
    }
    j["open_loop_rounds"] = rounds;
    j["lookup_connections_grpc"] = grpc_run->connections;
    j["lookup_connections_tls"] = tls_run->connections;
  }
  for (const char* k : {"lookup_p99_ms_at_10k", "lookup_peak_per_s", "lookup_p99_ms_at_10k_grpc",
                        "lookup_peak_per_s_grpc", "lookup_path", "lookup_p99_ms_at_10k_tls",
                        "lookup_peak_per_s_tls", "lookup_p99_tls_vs_grpc", "open_loop_rounds",
                        "lookup_connections_grpc", "lookup_connections_tls"}) {
    if (!j.contains(k)) j[k] = nullptr;
  }
  if (r.rate != 10000) {  // not measured at 10k
    j["lookup_p99_ms_at_10k"] = nullptr;
    j["lookup_p99_ms_at_10k_grpc"] = nullptr;
    j["lookup_p99_ms_at_10k_tls"] = nullptr;
  }
  return j;
}

}  // namespace oscarkv::bench::service_bench
