// Command line of `oscarkv bench kernels` (also the standalone bench/kernel_bench binary).
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "kernel_bench.h"
#include "oscarkv/util/args.h"

namespace oscarkv::bench {

namespace {
// "l2pfN" with N in 0..64 (DecodeParams::l2_prefetch_slices).
bool IsL2Prefetch(absl::string_view f) {
  int n = 0;
  return absl::ConsumePrefix(&f, "l2pf") && absl::SimpleAtoi(f, &n) && n >= 0 && n <= 64;
}
}  // namespace

int KernelBenchMain(int argc, char** argv) {
  Args args("bench kernels",
            "Decode attention (SDPA BF16 vs oscarkv BF16 pages vs OSCAR INT2 pages) and "
            "quantize-on-write on the local GPU, medians of many runs.");
  args.Option("shapes", "1x32768,1x100000,8x32768,32x32768", "BxL list")
      .Option("samples", "30", "timed batches per measurement")
      .Option("layers", "4", "layers per page (one is read)")
      .Option("sdpa", "python3 bench/sdpa_baseline.py", "baseline command ('' to skip)")
      .Option("quant-tokens", "32768", "tokens written by the quantize-on-write bench")
      .Option("prefill-tokens", "32768",
              "the prefill-step row: quantize-on-write of this many tokens beside the step's "
              "attention and projections (0 skips; needs --quant-tokens of the same value)")
      .Option("gemm", "python3 bench/gemm_baseline.py",
              "GEMM baseline command for the prefill step's projections ('' to skip)")
      .Option("quant-rows", "",
              "'|'-separated substrings: only the quantize-on-write rows whose names contain one "
              "(profiling, quick A/B; the JSON's quant_variant names the row quant_bw_fraction comes from)")
      .Option("target-ctas", "0",
              "decode plan CTA targets, comma list; the first is reported (0 = default; s5 = the "
              "default target on the session-5 planner, tailN = the default target with the "
              "last N INT2 items as split halves dispatched last, wideN = where the decoder picks "
              "8-warp CTAs, their plan aimed at N CTAs instead of one per SM; all three not as the first)")
      .Option("extend", "1x32768x512,1x100000x2048,8x8192x1024,4x0x8192",
              "extend (chunked-prefill) attention shapes BxPREFIXxNEW, each beside SDPA (cuDNN, flash, "
              "memory-efficient) on dense BF16 K/V in the same call ('' to skip)")
      .Option("rounds", "1",
              "time the INT2 configurations this many times in turn (A B .. A B ..) and report "
              "each one's median over its rounds")
      .Option("timeline", "",
              "diagnostics: time the INT2 launch without merge / rotation too, and write per-CTA "
              "phase timestamps to this CSV")
      .Option("ab", "",
              "comma list of INT2 launch option sets (shared_rotation, early_copies, rotation_kernel, "
              "cta_rotation, cta_fragments, two_per_sm, no_cap, early_rotation, late_rotation, bulk_merge, "
              "copy_merge, frags_first, frags_after, l2pfN = prefetch N slices per warp into L2 in the "
              "prologue, l2pf0 = off, warpsN = N warps per INT2 CTA (4, 8), evict_first / evict_normal = "
              "8-warp CTAs' K/V copies with an L2 evict_first / evict_normal policy, earlyN = 8-warp CTAs issue "
              "their first N slices' copies (0..2) before the wait for the rotation kernel; joined by +) "
              "timed beside the default launch (use --rounds to alternate)")
      .Option("csv", "", "write the CSV here")
      .Option("plot", "", "write an SVG plot here")
      .Flag("fast-query", "single fp16 query part for INT2 scores (default: hi+lo)")
      .Flag("json", "print the JSON summary after the table")

      .Flag("eager-only", "decode rows timed as back-to-back launches only (not also under CUDA-graph replay)")
      .Flag("warm-l2", "decode rows re-read one copy of their K/V (may stay in L2 between launches); "
            "default: each side cycles over copies reading >= 4x the L2 per cycle")
      .Flag("no-capture-row", "skip the INT2 launch through the torch op's capture decoder")
      .Flag("baseline-only", "measure only the default INT2 decode launch (not its alternatives)")
      .Flag("int2-only", "decode on OSCAR INT2 pages only (no BF16 pages, no quantize bench)")
      .Flag("extend-only", "only the extend (chunked-prefill) rows and their SDPA baselines");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  KernelBenchOptions o;
  o.shapes.clear();
  for (absl::string_view spec : absl::StrSplit(args.str("shapes"), ',', absl::SkipEmpty())) {
    std::vector<std::string> bl = absl::StrSplit(spec, 'x');
    int b = 0, l = 0;
    if (bl.size() != 2 || !absl::SimpleAtoi(bl[0], &b) || !absl::SimpleAtoi(bl[1], &l) || b <= 0 ||
        l <= 0) {
      std::fprintf(stderr, "bad shape '%s' (want BxL)\n", std::string(spec).c_str());
      return 2;
    }
    o.shapes.push_back({b, l});
  }
  auto samples = args.integer("samples");
  auto layers = args.integer("layers");
  auto qt = args.integer("quant-tokens");
  auto pt = args.integer("prefill-tokens");
  auto rounds = args.integer("rounds");
  if (!samples.ok() || !layers.ok() || !qt.ok() || !pt.ok() || *pt < 0 || *pt > (1 << 20) ||
      !rounds.ok() || *rounds < 1) {
    std::fprintf(stderr, "bad numeric option\n");
    return 2;
  }
  o.samples = static_cast<int>(*samples);
  o.layers = static_cast<int>(*layers);
  o.quant_tokens = static_cast<int>(*qt);
  o.rounds = static_cast<int>(*rounds);
  o.sdpa_command = args.str("sdpa");
  o.prefill_tokens = static_cast<int>(*pt);
  o.gemm_command = args.str("gemm");
  for (absl::string_view q : absl::StrSplit(args.str("quant-rows"), '|', absl::SkipEmpty())) {
    o.quant_rows.emplace_back(q);
  }
  o.target_ctas.clear();
  for (absl::string_view t : absl::StrSplit(args.str("target-ctas"), ',', absl::SkipEmpty())) {
    int v = 0;
    if (t == "s5" && !o.target_ctas.empty()) {
      o.target_ctas.push_back(-1);
      continue;
    }
    if (absl::StartsWith(t, "wide")) {
      if (o.target_ctas.empty() || !absl::SimpleAtoi(t.substr(4), &v) || v < 8 || v > 100000) {
        std::fprintf(stderr, "bad --target-ctas entry '%s' (wideN: 8 <= N <= 100000, not first)\n",
                     std::string(t).c_str());
        return 2;
      }
      o.target_ctas.push_back(kWideTarget + v);
      continue;
    }
    if (absl::StartsWith(t, "tail")) {
      if (o.target_ctas.empty() || !absl::SimpleAtoi(t.substr(4), &v) || v < 2 || v > 100000) {
        std::fprintf(stderr, "bad --target-ctas entry '%s' (tailN: 2 <= N <= 100000, not first)\n",
                     std::string(t).c_str());
        return 2;
      }
      o.target_ctas.push_back(kTailTarget - v);
      continue;
    }
    if (!absl::SimpleAtoi(t, &v) || v < 0) {
      std::fprintf(stderr, "bad --target-ctas\n");
      return 2;
    }
    o.target_ctas.push_back(v);
  }
  if (o.target_ctas.empty()) o.target_ctas.push_back(0);
  o.precise_query = !args.flag("fast-query");
  o.all_variants = !args.flag("baseline-only");
  o.extend_shapes.clear();
  for (absl::string_view spec : absl::StrSplit(args.str("extend"), ',', absl::SkipEmpty())) {
    std::vector<std::string> bpc = absl::StrSplit(spec, 'x');
    ExtendShape e;
    if (bpc.size() != 3 || !absl::SimpleAtoi(bpc[0], &e.batch) || !absl::SimpleAtoi(bpc[1], &e.prefix) ||
        !absl::SimpleAtoi(bpc[2], &e.new_tokens) || e.batch <= 0 || e.batch > 256 || e.prefix < 0 ||
        e.prefix > 1000000 || e.new_tokens <= 0 || e.new_tokens > 65536) {
      std::fprintf(stderr, "bad --extend entry '%s' (want BxPREFIXxNEW)\n", std::string(spec).c_str());
      return 2;
    }
    o.extend_shapes.push_back(e);
  }
  for (absl::string_view t : absl::StrSplit(args.str("ab"), ',', absl::SkipEmpty())) {
    for (absl::string_view f : absl::StrSplit(t, '+')) {
      if (f != "shared_rotation" && f != "early_copies" && f != "rotation_kernel" && f != "cta_rotation" &&
          f != "cta_fragments" && f != "two_per_sm" && f != "no_cap" &&
          f != "early_rotation" && f != "late_rotation" && f != "bulk_merge" && f != "copy_merge" &&
          f != "frags_first" && f != "frags_after" && !IsL2Prefetch(f) && f != "warps4" &&
          f != "warps8" && f != "evict_first" && f != "evict_normal" &&
          f != "early0" && f != "early1" && f != "early2") {
        std::fprintf(stderr, "bad --ab entry '%s'\n", std::string(t).c_str());
        return 2;
      }
    }
    o.ab_configs.emplace_back(t);
  }
  o.graph_timing = !args.flag("eager-only");
  o.warm_l2 = args.flag("warm-l2");
  o.capture_timing = !args.flag("no-capture-row");
  o.timeline_csv = args.str("timeline");
  o.diagnostics = !o.timeline_csv.empty();
  if (args.flag("int2-only")) {
    o.bf16_pages = o.quantize = false;
    o.extend_shapes.clear();
  }
  if (args.flag("extend-only")) {
    o.shapes.clear();
    o.bf16_pages = o.quantize = false;
  }
  auto report = RunKernelBench(o);
  if (!report.ok()) {
    std::fprintf(stderr, "bench kernels: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  if (!args.str("csv").empty()) std::ofstream(args.str("csv")) << FormatCsv(*report);
  if (!args.str("plot").empty()) std::ofstream(args.str("plot")) << FormatSvg(*report);
  std::printf("%s", FormatTable(*report).c_str());
  if (args.flag("json")) std::printf("%s\n", FormatJson(*report).c_str());
  return 0;
}

}  // namespace oscarkv::bench
