// `oscarkv bench transfer` (bench/transfer_bench.h): options, one BenchOne per transport, the
// report (a table, or --json).
#include "transfer_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/util/args.h"
#include "transfer_bench_internal.h"

namespace oscarkv::bench {

using transfer_bench::BenchConfig;
using transfer_bench::BenchOne;
using transfer_bench::LoadAverage;
using transfer_bench::Msg;
using transfer_bench::Serve;
using transfer_bench::TransportReport;

int TransferBenchMain(int argc, char** argv) {
  Args args("bench transfer",
            "Page-batch RMA bandwidth over UCX per transport beside ucx_perftest (same transport,\n"
            "same message size), and the 32K-token P/D handoff at Qwen3-8B shape: INT2 page set\n"
            "(sink + recent BF16, history INT2) vs all-BF16 pages over the same path.");
  args.Flag("json", "print JSON (ucx_vs_perftest, handoff_bytes_ratio, "
                    "handoff_speedup_int2_vs_bf16, per-transport details)")
      .Option("transports", "tcp,shm",
              "UCX_TLS values to measure, comma-separated ('+' joins transports inside one "
              "value: posix+cma)")
      .Option("shape", "qwen3-8b", "model shape (page geometry)")
      .Option("batch-pages", "64", "INT2 pages per RMA batch in the bandwidth test")
      .Option("bw-pages", "512",
              "minimum INT2 pages per bandwidth measurement (each also runs >= 0.25 s)")
      .Option("reps", "3", "repetitions; each figure is the best of them")
      .Option("handoff-tokens", "32768", "tokens of the handed-off request")
      .Option("bf16-distinct", "64",
              "distinct BF16 pages held at each end (memory cap; the handoff still moves every "
              "page's bytes, cycling over these slots)")
      .Option("perftest", "ucx_perftest", "ucx_perftest binary")
      .Option("perftest-outstanding", "0", "ucx_perftest -O (0 = its default)")
      .Option("port", "13370", "first TCP port for ucx_perftest's bootstrap on 127.0.0.1")
      .Flag("serve", "internal: run as the peer")
      .Option("tls", "tcp", "internal (--serve): UCX_TLS")
      .Option("int2-pages", "512", "internal (--serve): INT2 pool pages")
      .Option("bf16-pages", "64", "internal (--serve): BF16 pool pages")
      .Option("control-fd", "", "internal (--serve): control socket")
      .Epilog(
          "Traffic stays on this host: UCX_NET_DEVICES=lo for tcp, shared memory for shm.\n"
          "Example: oscarkv bench transfer --transports tcp,shm --json");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  if (args.flag("serve")) return Serve(args);

  auto profile = BuiltinProfile(args.str("shape"));
  BenchConfig cfg;
  cfg.perftest = args.str("perftest");
  auto ints = {std::make_pair("batch-pages", &cfg.batch_pages),
               std::make_pair("bw-pages", &cfg.bw_pages), std::make_pair("reps", &cfg.reps),
               std::make_pair("handoff-tokens", &cfg.handoff_tokens),
               std::make_pair("bf16-distinct", &cfg.bf16_distinct),
               std::make_pair("perftest-outstanding", &cfg.perftest_outstanding)};
  if (!profile.ok()) {
    std::fprintf(stderr, "oscarkv bench transfer: %s\n", Msg(profile.status()).c_str());
    return 2;
  }
  for (auto [name, dst] : ints) {
    auto v = args.integer(name);
    if (!v.ok() || *v < 0 || (*v == 0 && std::string(name) != "perftest-outstanding")) {
      std::fprintf(stderr, "oscarkv bench transfer: --%s must be a positive integer\n", name);
      return 2;
    }
    *dst = *v;
  }
  auto port = args.integer("port");
  if (!port.ok() || *port <= 1024 || *port > 65000) {
    std::fprintf(stderr, "oscarkv bench transfer: bad --port\n");
    return 2;
  }
  cfg.port = static_cast<int>(*port);

  const std::string load_before = LoadAverage();
  std::vector<TransportReport> reports;
  int index = 0;
  for (absl::string_view t : absl::StrSplit(args.str("transports"), ',', absl::SkipEmpty())) {
    BenchConfig c = cfg;
    c.port = cfg.port + 16 * index++;
    auto r = BenchOne(std::string(t), c, *profile);
    if (!r.ok()) {
      std::fprintf(stderr, "oscarkv bench transfer [%s]: %s\n", std::string(t).c_str(),
                   r.status().ToString().c_str());
      return 1;
    }
    reports.push_back(*r);
  }
  if (reports.empty()) {
    std::fprintf(stderr, "oscarkv bench transfer: no transports given\n");
    return 2;
  }

  // Headline figures: the worst transport decides.
  double vs_perftest = 1e9, bytes_ratio = 1e9, speedup = 1e9;
  for (const auto& r : reports) {
    vs_perftest = std::min(vs_perftest, r.get1_gbps / r.perftest_get_gbps);
    bytes_ratio = std::min(bytes_ratio, double(r.bf16_handoff_bytes) / r.int2_handoff_bytes);
    speedup = std::min(speedup, r.bf16_handoff_s / r.int2_handoff_s);
  }
  const size_t int2_bytes = GeometryFor(*profile, PageKind::kInt2).page_bytes();
  const size_t bf16_bytes = GeometryFor(*profile, PageKind::kBf16).page_bytes();
  const std::string note = absl::StrCat(
      "bandwidth: RMA get/put of batches of ", cfg.batch_pages, " INT2 pages (", int2_bytes,
      " B each), at least ", cfg.bw_pages, " pages and 0.25 s per measurement, best of ",
      cfg.reps,
      "; 'distinct pages' moves real batches DRAM to DRAM; 'one reused buffer' repeats one page "
      "buffer per end like ucx_perftest (cache-resident) and is what ucx_vs_perftest compares"
      "; ucx_perftest ucp_get/ucp_put_bw -s ", int2_bytes,
      " -n <the page count of our same-buffer run> on 127.0.0.1 with the same UCX_TLS. handoff: one ", cfg.handoff_tokens,
      "-token request, every page fetched by RMA get; all-BF16 moves every page's full bytes "
      "but cycles over ", cfg.bf16_distinct, " distinct ", bf16_bytes,
      "-byte slots at each end to cap memory.");
  if (args.flag("json")) {
    nlohmann::json j;
    j["ucx_vs_perftest"] = vs_perftest;
    j["handoff_bytes_ratio"] = bytes_ratio;
    j["handoff_speedup_int2_vs_bf16"] = speedup;
    j["shape"] = args.str("shape");
    j["int2_page_bytes"] = int2_bytes;
    j["bf16_page_bytes"] = bf16_bytes;
    j["note"] = note;
    j["load_average_1m_before"] = load_before;
    j["load_average_1m_after"] = LoadAverage();
    j["cpus"] = sysconf(_SC_NPROCESSORS_ONLN);
    for (const auto& r : reports) {
      j["transports"][r.name] = {
          {"ucx_tls", r.tls},
          {"endpoint_lanes", r.lanes},
          {"error_handling", r.error_handling},
          {"batch_get_gbps", r.get_gbps},
          {"batch_put_gbps", r.put_gbps},
          {"memcpy_batch_gbps", r.memcpy_gbps},
          {"memcpy_same_buffer_gbps", r.memcpy1_gbps},
          {"same_buffer_get_gbps", r.get1_gbps},
          {"same_buffer_put_gbps", r.put1_gbps},
          {"perftest_get_gbps", r.perftest_get_gbps},
          {"perftest_put_gbps", r.perftest_put_gbps},
          {"get_vs_perftest", r.get1_gbps / r.perftest_get_gbps},
          {"put_vs_perftest", r.put1_gbps / r.perftest_put_gbps},
          {"batch_get_vs_memcpy", r.get_gbps / r.memcpy_gbps},
          {"perftest_get_command", r.perftest_get_cmd},
          {"perftest_put_command", r.perftest_put_cmd},
          {"batch_get_ms", r.batch_get_ms},
          {"handoff_int2_bytes", r.int2_handoff_bytes},
          {"handoff_bf16_bytes", r.bf16_handoff_bytes},
          {"handoff_int2_pages", r.int2_handoff_pages},
          {"handoff_int2_set_bf16_pages", r.int2_handoff_bf16_pages},
          {"handoff_int2_seconds", r.int2_handoff_s},
          {"handoff_bf16_seconds", r.bf16_handoff_s},
          {"handoff_bytes_ratio", double(r.bf16_handoff_bytes) / r.int2_handoff_bytes},
          {"handoff_speedup_int2_vs_bf16", r.bf16_handoff_s / r.int2_handoff_s},
          {"pages_verified", r.verified_pages},
          {"pages_checked", r.checked_pages}};
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("\nUCX page transfer, %s shape (INT2 page %zu B, BF16 page %zu B)\n",
              args.str("shape").c_str(), int2_bytes, bf16_bytes);
  std::printf("%-5s %-24s | %-32s | %-36s | %s\n", "", "", "batch of distinct pages (GB/s)",
              "one reused buffer, like perftest (GB/s)", "ucx_perftest (GB/s)");
  std::printf("%-5s %-24s | %9s %9s %12s | %9s %9s %16s | %8s %8s | %6s %6s\n", "tls",
              "endpoint lanes", "get", "put", "memcpy bound", "get", "put", "memcpy (cached)",
              "get", "put", "get %", "put %");
  for (const auto& r : reports) {
    std::printf("%-5s %-24s | %9.3f %9.3f %12.3f | %9.3f %9.3f %16.3f | %8.3f %8.3f | %5.0f%% "
                "%5.0f%%\n",
                r.name.c_str(), r.lanes.c_str(), r.get_gbps, r.put_gbps, r.memcpy_gbps,
                r.get1_gbps, r.put1_gbps, r.memcpy1_gbps, r.perftest_get_gbps,
                r.perftest_put_gbps, 100 * r.get1_gbps / r.perftest_get_gbps,
                100 * r.put1_gbps / r.perftest_put_gbps);
  }
  std::printf("\n%lld-token handoff (plan: %zu INT2 + %zu BF16 pages vs %zu BF16 pages)\n",
              static_cast<long long>(cfg.handoff_tokens), reports[0].int2_handoff_pages,
              reports[0].int2_handoff_bf16_pages,
              reports[0].int2_handoff_pages + reports[0].int2_handoff_bf16_pages);
  std::printf("%-6s %12s %12s %8s %10s %10s %8s\n", "tls", "INT2 MB", "BF16 MB", "bytes x",
              "INT2 s", "BF16 s", "speedup");
  for (const auto& r : reports) {
    std::printf("%-6s %12.1f %12.1f %7.2fx %10.3f %10.3f %7.2fx\n", r.name.c_str(),
                r.int2_handoff_bytes / 1e6, r.bf16_handoff_bytes / 1e6,
                double(r.bf16_handoff_bytes) / r.int2_handoff_bytes, r.int2_handoff_s,
                r.bf16_handoff_s, r.bf16_handoff_s / r.int2_handoff_s);
  }
  std::printf("\nucx_vs_perftest %.3f   handoff_bytes_ratio %.2f   "
              "handoff_speedup_int2_vs_bf16 %.2f   (worst transport)\n",
              vs_perftest, bytes_ratio, speedup);
  std::printf("note: %s\n", note.c_str());
  std::printf("machine: %ld CPUs, 1-minute load average %s before, %s after\n",
              sysconf(_SC_NPROCESSORS_ONLN), load_before.c_str(), LoadAverage().c_str());
  return 0;
}

}  // namespace oscarkv::bench
