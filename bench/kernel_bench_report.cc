#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernel_bench.h"
#include "nlohmann/json.hpp"

namespace oscarkv::bench {

absl::StatusOr<std::vector<DecodeRow>> RunSdpaBaseline(const KernelBenchOptions& o) {
  std::string shapes;
  for (auto [b, l] : o.shapes) shapes += absl::StrCat(shapes.empty() ? "" : ",", b, "x", l);
  const std::string cmd = absl::StrCat(o.sdpa_command, " --shapes ", shapes, " --samples ", o.samples,
                                       o.graph_timing ? " --graph" : "", o.warm_l2 ? " --warm-l2" : "");
  std::fprintf(stderr, "[bench] baseline: %s\n", cmd.c_str());
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return absl::UnavailableError("cannot start the SDPA baseline");
  std::vector<nlohmann::json> rows;
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("sdpa_us")) rows.push_back(j);
  }
  const int rc = pclose(f);
  if (rc != 0 && rows.empty()) return absl::UnavailableError(absl::StrCat("SDPA baseline exited ", rc));
  std::vector<DecodeRow> out;
  for (auto [b, l] : o.shapes) {
    DecodeRow d;
    d.batch = b;
    d.length = l;
    for (const auto& j : rows) {
      if (j["B"] == b && j["L"] == l) {
        d.sdpa_us = j["sdpa_us"];
        d.sdpa_bytes = j["bytes"];
        if (j.contains("sdpa_graph_us")) d.sdpa_graph_us = j["sdpa_graph_us"];
      }
    }
    out.push_back(d);
  }
  return out;
}

namespace {
double Ratio(double a, double b) { return (a > 0 && b > 0) ? a / b : 0; }
double Gbps(double bytes, double us) { return us > 0 ? bytes / (us * 1e-6) / 1e9 : 0; }
const DecodeRow* Find(const KernelBenchReport& r, int b, int l) {
  for (const auto& d : r.decode)
    if (d.batch == b && d.length == l) return &d;
  return nullptr;
}
// The SDPA time a configuration is compared with: the graph-replay row with SDPA's graph replay.
double VsSdpa(const DecodeRow& d, const VariantTime& v) {
  return v.name.find("+graph_replay") != std::string::npos ? d.sdpa_graph_us : d.sdpa_us;
}
}  // namespace

std::string FormatTable(const KernelBenchReport& r) {
  std::string s = absl::StrFormat(
      "device %s, %d SMs, decode CTAs/SM %d; copy kernel %.0f GB/s (read+write)\n", r.device, r.sms,
      r.decode_ctas_per_sm, r.copy_gbps);
  if (!r.sdpa_error.empty()) s += "SDPA baseline missing: " + r.sdpa_error + "\n";
  s += "decode attention, Qwen3-8B shape (32 q heads, 8 KV heads, d=128), one layer, medians\n";
  s += r.warm_l2 ? "L2: WARM (--warm-l2): every launch re-reads the same K/V, which may stay in L2\n"
                 : absl::StrFormat("L2: cold: every side cycles over K/V copies reading >= 4x the %.0f MB L2 "
                                   "per cycle\n", r.l2_bytes / 1e6);
  s += absl::StrFormat("%-4s %-7s | %10s %8s | %10s %8s %6s | %10s %8s %6s %8s | %7s %7s\n", "B",
                       "L", "SDPA us", "GB/s", "BF16pg us", "GB/s", "xSDPA", "INT2 us", "GB/s",
                       "%copy", "xSDPA", "items2", "itemsB");
  for (const auto& d : r.decode) {
    s += absl::StrFormat(
        "%-4d %-7d | %10.1f %8.0f | %10.1f %8.0f %6.2f | %10.1f %8.0f %5.0f%% %7.2fx | %7d %7d\n",
        d.batch, d.length, d.sdpa_us, Gbps(d.sdpa_bytes, d.sdpa_us), d.bf16_us,
        Gbps(d.bf16_bytes, d.bf16_us), Ratio(d.sdpa_us, d.bf16_us), d.int2_us,
        Gbps(d.int2_bytes, d.int2_us), 100 * Ratio(Gbps(d.int2_bytes, d.int2_us), r.copy_gbps),
        Ratio(d.sdpa_us, d.int2_us), d.int2_items, d.bf16_items);
  }
  if (std::any_of(r.decode.begin(), r.decode.end(), [](const DecodeRow& d) { return d.int2_graph_us > 0; })) {
    s += "decode under CUDA-graph replay (both sides: a captured graph of the same back-to-back calls)\n";
    s += absl::StrFormat("%-4s %-7s | %10s | %10s %6s | %10s %8s\n", "B", "L", "SDPA us", "BF16pg us", "xSDPA",
                         "INT2 us", "xSDPA");
    for (const auto& d : r.decode) {
      s += absl::StrFormat("%-4d %-7d | %10.1f | %10.1f %6.2f | %10.1f %7.2fx\n", d.batch, d.length,
                           d.sdpa_graph_us, d.bf16_graph_us, Ratio(d.sdpa_graph_us, d.bf16_graph_us),
                           d.int2_graph_us, Ratio(d.sdpa_graph_us, d.int2_graph_us));
    }
  }
  for (const auto& d : r.decode) {
    if (d.int2_variants.size() > 1) {
      s += absl::StrFormat("  INT2 configurations B=%d L=%d (the first is the default launch; * the fastest, "
                           "default/fastest %.3f):",
                           d.batch, d.length, Ratio(d.int2_us, d.int2_best_us));
      for (const auto& v : d.int2_variants) {
        s += absl::StrFormat(" %s %.1f us (%.2fx)%s%s%s;", v.name, v.us, Ratio(VsSdpa(d, v), v.us),
                             v.approximate ? " approx" : "", v.check_ok ? "" : " MISMATCH",
                             v.name == d.int2_best ? " *" : "");
      }
      s += "\n";
    }
  }
  if (std::any_of(r.decode.begin(), r.decode.end(), [](const DecodeRow& d) { return d.int2_capture_us > 0; })) {
    s += "INT2 default launch via the torch op's capture decoder (capacity 2B sequences; eager)\n";
    for (const auto& d : r.decode) {
      if (d.int2_capture_us <= 0) continue;
      s += absl::StrFormat("  B=%d L=%d: %.1f us, %.1f us with unrotate_output (grid %d CTAs, %d planned items) vs "
                           "the bench's default %.1f us (%d items): %.2fx / %.2fx; INT2 copies cycled %d\n",
                           d.batch, d.length, d.int2_capture_us, d.int2_capture_unrotate_us, d.int2_capture_grid,
                           d.int2_capture_items, d.int2_us, d.int2_items, Ratio(d.int2_capture_us, d.int2_us),
                           Ratio(d.int2_capture_unrotate_us, d.int2_us), d.copies);
      if (d.bf16_capture_unrotate_us > 0)
        s += absl::StrFormat("    BF16 pages: %.1f us (torch op's launch) vs %.1f us: %.2fx\n", d.bf16_capture_unrotate_us,
                             d.bf16_us, Ratio(d.bf16_capture_unrotate_us, d.bf16_us));
    }
  }
  for (const auto& d : r.decode) {
    if (d.bf16_merge_kernel_us > 0) {
      s += absl::StrFormat("  BF16 pages B=%d L=%d: %.1f us fused merge (reported), %.1f us separate merge kernel\n",
                           d.batch, d.length, d.bf16_us, d.bf16_merge_kernel_us);
    }
  }
  for (const auto& d : r.decode) {
    for (auto [target, us] : d.int2_by_target) {
      const std::string how =
          target == -2 ? std::string("session-5 default (its planner, merge kernel, rotation in every CTA)")
          : target <= kTailTarget ? absl::StrCat("with tail_items=", kTailTarget - target)
          : target >= kWideTarget ? absl::StrCat("with the 8-warp plan aimed at ", target - kWideTarget, " CTAs")
          : target < 0 ? std::string("on the session-5 planner")
                       : absl::StrCat("with target_ctas=", target);
      s += absl::StrFormat("  INT2 B=%d L=%d (reported variant) %s: %.1f us (%.2fx SDPA)\n", d.batch,
                           d.length, how, us, Ratio(d.sdpa_us, us));
    }
  }
  if (!r.extend.empty()) {
    s += "extend (chunked prefill) attention: OSCAR prefix pages + causal new tokens, GQA 32/8, d=128, one layer;\n"
         "SDPA on dense BF16 K/V of the same shape and mask (TFLOP/s = 4*B*C*(P+C/2)*d*Hq / time)\n";
    s += absl::StrFormat("%-3s %-7s %-6s | %10s %7s | %10s %7s | %10s %7s | %10s | %8s %8s\n", "B", "prefix",
                         "new", "oscarkv us", "TFLOP/s", "cuDNN us", "TFLOP/s", "flash us", "TFLOP/s",
                         "effic. us", "xbest", "xflash");
    auto tf = [](double flops, double us) { return us > 0 ? flops / (us * 1e-6) / 1e12 : 0.0; };
    for (const auto& e : r.extend) {
      s += absl::StrFormat("%-3d %-7d %-6d | %10.1f %7.1f | %10.1f %7.1f | %10.1f %7.1f | %10.1f | %7.2fx %7.2fx%s\n",
                           e.batch, e.prefix, e.new_tokens, e.us, tf(e.flops, e.us), e.sdpa_cudnn_us,
                           tf(e.flops, e.sdpa_cudnn_us), e.sdpa_flash_us, tf(e.flops, e.sdpa_flash_us),
                           e.sdpa_efficient_us, Ratio(e.best_sdpa_us(), e.us), Ratio(e.sdpa_flash_us, e.us),
                           e.tensor_cores ? "" : "  (mma.sync kernel)");
    }
    for (const auto& e : r.extend) {
      if (e.diag_no_dequant_us > 0)
        s += absl::StrFormat("  diagnostics B=%d P=%d C=%d (wrong outputs): producer without dequantization %.1f us, "
                             "without raw copies %.1f us\n", e.batch, e.prefix, e.new_tokens, e.diag_no_dequant_us,
                             e.diag_no_copies_us);
      if (e.diag_dense_per_item_us > 0)
        s += absl::StrFormat("  diagnostics B=%d P=%d C=%d: the plain-prefill kernel alone, one CTA per work item %.1f us, "
                             "persistent CTAs %.1f us, persistent without tile loads (wrong outputs) %.1f us\n",
                             e.batch, e.prefix, e.new_tokens, e.diag_dense_per_item_us, e.diag_dense_persistent_us,
                             e.diag_dense_no_copies_us);
      if (!e.sdpa_how.empty()) s += absl::StrFormat("  SDPA B=%d P=%d C=%d: %s\n", e.batch, e.prefix, e.new_tokens, e.sdpa_how);
    }
  }
  s += "quantize-on-write (bf16 rows in -> page rows out, one layer, 8 KV heads, K and V)\n";
  for (const auto& q : r.quant) {
    s += absl::StrFormat("  %-66s %9.1f us %8.0f GB/s %5.0f%% of copy\n", q.name, q.us,
                         Gbps(q.bytes, q.us), 100 * Ratio(Gbps(q.bytes, q.us), r.copy_gbps));
  }
  for (const auto& p : r.prefill) {
    s += absl::StrFormat(
        "quantize-on-write in a %d-token prefill step of one Qwen3-8B layer: %.1f us; attention %.1f us "
        "(ours; SDPA %s %.1f us), projections Q/K/V/O %.1f us (bf16 GEMMs, torch.matmul), MLP %.1f us: "
        "%.2f%% of attention + projections (%.2f%% with SDPA's attention), %.2f%% of the layer\n",
        p.tokens, p.quant_us, p.attention_us, p.sdpa_backend.empty() ? "-" : p.sdpa_backend,
        p.attention_sdpa_us, p.projections_us, p.mlp_us, 100 * p.share(), 100 * p.share_sdpa(),
        100 * Ratio(p.quant_us, p.attention_us + p.projections_us + p.mlp_us));
    if (!p.error.empty()) s += "  (prefill step: " + p.error + ")\n";
  }
  return s;
}

std::string FormatCsv(const KernelBenchReport& r) {
  std::string s =
      "kind,name,batch,length,us,bytes,gbps,copy_gbps,fraction_of_copy,speedup_vs_sdpa\n";
  for (const auto& d : r.decode) {
    // (graph-replay rows are compared with SDPA's graph replay)
    auto row = [&](const char* name, double us, double bytes, bool graph = false) {
      s += absl::StrFormat("decode,%s,%d,%d,%.3f,%.0f,%.1f,%.1f,%.4f,%.4f\n", name, d.batch,
                           d.length, us, bytes, Gbps(bytes, us), r.copy_gbps,
                           Ratio(Gbps(bytes, us), r.copy_gbps), Ratio(graph ? d.sdpa_graph_us : d.sdpa_us, us));
    };
    row("sdpa_bf16", d.sdpa_us, d.sdpa_bytes);
    row("oscarkv_bf16_pages", d.bf16_us, d.bf16_bytes);
    row("oscarkv_int2_pages", d.int2_us, d.int2_bytes);
    for (const auto& v : d.int2_variants) {
      row(("oscarkv_int2_pages:" + v.name).c_str(), v.us, d.int2_bytes,
          v.name.find("+graph_replay") != std::string::npos);
    }
    if (d.sdpa_graph_us > 0) row("sdpa_bf16:graph_replay", d.sdpa_graph_us, d.sdpa_bytes, true);
    if (d.bf16_graph_us > 0) row("oscarkv_bf16_pages:graph_replay", d.bf16_graph_us, d.bf16_bytes, true);
  }
  for (const auto& e : r.extend) {
    auto row = [&](const char* name, double us) {
      s += absl::StrFormat("extend,%s,%d,%d+%d,%.3f,0,0,%.1f,0,%.4f\n", name, e.batch, e.prefix, e.new_tokens,
                           us, r.copy_gbps, Ratio(e.best_sdpa_us(), us));
    };
    row("oscarkv_int2_prefix", e.us);
    row("sdpa_bf16_cudnn", e.sdpa_cudnn_us);
    row("sdpa_bf16_flash", e.sdpa_flash_us);
    row("sdpa_bf16_efficient", e.sdpa_efficient_us);
  }
  for (const auto& q : r.quant) {
    s += absl::StrFormat("quantize,%s,1,0,%.3f,%.0f,%.1f,%.1f,%.4f,0\n", q.name, q.us, q.bytes,
                         Gbps(q.bytes, q.us), r.copy_gbps, Ratio(Gbps(q.bytes, q.us), r.copy_gbps));
  }
  return s;
}

std::string FormatJson(const KernelBenchReport& r) {
  nlohmann::json j;
  j["device"] = r.device;
  j["copy_gbps"] = r.copy_gbps;
  j["l2_bytes"] = r.l2_bytes;
  j["warm_l2"] = r.warm_l2;
  const DecodeRow* b32 = Find(r, 32, 32768);
  const DecodeRow* b1 = Find(r, 1, 100000);
  if (b32 != nullptr) {
    j["int2_vs_sdpa_b32_32k"] = Ratio(b32->sdpa_us, b32->int2_us);
    j["bf16pages_vs_sdpa_b32_32k"] = Ratio(b32->sdpa_us, b32->bf16_us);
    j["int2_bw_fraction_b32"] = Ratio(Gbps(b32->int2_bytes, b32->int2_us), r.copy_gbps);
    j["int2_us_b32_32k"] = b32->int2_us;
    j["int2_best_variant_b32_32k"] = b32->int2_best;
    j["sdpa_us_b32_32k"] = b32->sdpa_us;
  }
  if (b1 != nullptr) {
    j["int2_vs_sdpa_b1_100k"] = Ratio(b1->sdpa_us, b1->int2_us);
    j["int2_best_variant_b1_100k"] = b1->int2_best;
  }
  if (const DecodeRow* b1s = Find(r, 1, 32768); b1s != nullptr) {
    j["int2_vs_sdpa_b1_32k"] = Ratio(b1s->sdpa_us, b1s->int2_us);
  }
  // The acceptance ratios with both sides under CUDA-graph replay (0 where not measured).
  for (const auto& [key, b, l] : {std::tuple<const char*, int, int>{"b1_32k", 1, 32768}, {"b1_100k", 1, 100000},
                                  {"b8_32k", 8, 32768}, {"b32_32k", 32, 32768}}) {
    const DecodeRow* d = Find(r, b, l);
    if (d == nullptr || d->int2_graph_us <= 0) continue;
    j[absl::StrCat("int2_vs_sdpa_", key, "_graph")] = Ratio(d->sdpa_graph_us, d->int2_graph_us);
    j[absl::StrCat("bf16pages_vs_sdpa_", key, "_graph")] = Ratio(d->sdpa_graph_us, d->bf16_graph_us);
  }
  // The default launch against the fastest configuration measured beside it, at every shape
  // (the issue: within 3%).
  double worst = 0;
  bool all_ok = true;
  for (const auto& d : r.decode) {
    if (d.int2_best_us > 0) worst = std::max(worst, d.int2_us / d.int2_best_us);
    all_ok = all_ok && d.int2_default_ok;
  }
  if (worst > 0) j["int2_default_vs_fastest_worst"] = worst;
  j["int2_default_check_ok"] = all_ok;
  if (!r.quant.empty()) {
    // The default codec write (the first row, see kernel_bench.cu): the figure.
    j["quant_bw_fraction"] = Ratio(Gbps(r.quant[0].bytes, r.quant[0].us), r.copy_gbps);
    j["quant_variant"] = r.quant[0].name;
    // The fastest INT2 write configuration measured (may skip rotation or clipping; never a
    // "(diagnostic)" row, whose bytes are not the codec's).
    const QuantRow* best = nullptr;
    for (const auto& q : r.quant) {
      if (q.name.rfind("int2", 0) == 0 && q.name.find("(diagnostic)") == std::string::npos &&
          (best == nullptr || q.us < best->us)) {
        best = &q;
      }
    }
    if (best != nullptr) {
      j["quant_bw_fraction_best"] = Ratio(Gbps(best->bytes, best->us), r.copy_gbps);
      j["quant_best_variant"] = best->name;
    }
  }
  for (const auto& d : r.decode) {
    nlohmann::json variants = nlohmann::json::array();
    for (const auto& v : d.int2_variants) {
      variants.push_back({{"name", v.name}, {"us", v.us}, {"approximate", v.approximate},
                          {"check_ok", v.check_ok}, {"check_error_vs_cpu_seq0", v.check_error},
                          {"vs_sdpa", Ratio(VsSdpa(d, v), v.us)},
                          {"bw_fraction", Ratio(Gbps(d.int2_bytes, v.us), r.copy_gbps)},
                          {"round_us", v.round_us}});
    }
    j["decode"].push_back({{"B", d.batch}, {"L", d.length}, {"sdpa_us", d.sdpa_us},
                           {"bf16_pages_us", d.bf16_us}, {"bf16_pages_merge_kernel_us", d.bf16_merge_kernel_us},
                           {"int2_us", d.int2_us}, {"int2_default_check_ok", d.int2_default_ok},
                           {"int2_best", d.int2_best}, {"int2_best_us", d.int2_best_us},
                           {"int2_default_vs_fastest", Ratio(d.int2_us, d.int2_best_us)},
                           {"int2_variants", variants},
                           {"int2_bytes", d.int2_bytes}, {"bf16_bytes", d.bf16_bytes},
                           {"sdpa_graph_us", d.sdpa_graph_us}, {"bf16_pages_graph_us", d.bf16_graph_us},
                           {"int2_graph_us", d.int2_graph_us}, {"int2_capture_us", d.int2_capture_us},
                           {"int2_capture_unrotate_us", d.int2_capture_unrotate_us},
                           {"bf16_pages_capture_unrotate_us", d.bf16_capture_unrotate_us},
                           {"int2_capture_grid", d.int2_capture_grid},
                           {"int2_capture_items", d.int2_capture_items}, {"copies", d.copies}});
  }
  for (const auto& q : r.quant) {
    j["quantize"].push_back({{"name", q.name}, {"us", q.us}, {"bytes", q.bytes},
                             {"fraction_of_copy", Ratio(Gbps(q.bytes, q.us), r.copy_gbps)}});
  }
  for (const auto& e : r.extend) {
    auto tf = [&](double us) { return us > 0 ? e.flops / (us * 1e-6) / 1e12 : 0.0; };
    j["extend"].push_back({{"B", e.batch}, {"prefix", e.prefix}, {"new_tokens", e.new_tokens}, {"us", e.us},
                           {"tflops", tf(e.us)}, {"tensor_cores", e.tensor_cores},
                           {"sdpa_cudnn_us", e.sdpa_cudnn_us}, {"sdpa_flash_us", e.sdpa_flash_us},
                           {"sdpa_efficient_us", e.sdpa_efficient_us}, {"sdpa_best_us", e.best_sdpa_us()},
                           {"vs_best_sdpa", Ratio(e.best_sdpa_us(), e.us)}, {"vs_sdpa_flash", Ratio(e.sdpa_flash_us, e.us)},
                           {"sdpa_how", e.sdpa_how}});
    if (e.batch == 1 && e.prefix == 32768 && e.new_tokens == 512) {
      j["extend_vs_best_sdpa_32k_512"] = Ratio(e.best_sdpa_us(), e.us);
      j["extend_vs_sdpa_flash_32k_512"] = Ratio(e.sdpa_flash_us, e.us);
      j["extend_tflops_32k_512"] = tf(e.us);
    }
  }
  for (const auto& p : r.prefill) {
    // Quantize-on-write in a prefill step of one layer (Qwen3-8B, PrefillStepRow).
    j["quant_prefill_step_tokens"] = p.tokens;
    j["quant_prefill_step_us"] = p.quant_us;
    j["prefill_step_attention_us"] = p.attention_us;
    j["prefill_step_attention_sdpa_us"] = p.attention_sdpa_us;
    j["prefill_step_attention_sdpa_backend"] = p.sdpa_backend;
    j["prefill_step_projections_us"] = p.projections_us;
    j["prefill_step_mlp_us"] = p.mlp_us;
    j["quant_share_of_attention_projections"] = p.share();
    j["quant_share_of_attention_projections_sdpa"] = p.share_sdpa();
    const double layer = p.attention_us + p.projections_us + p.mlp_us;
    j["quant_share_of_layer"] = layer > 0 ? p.quant_us / layer : 0.0;
    if (!p.error.empty()) j["prefill_step_error"] = p.error;
  }
  if (!r.sdpa_error.empty()) j["sdpa_error"] = r.sdpa_error;
  return j.dump(2);
}

// Grouped bar chart of decode time (log-free, µs) per shape: SDPA, BF16 pages, INT2 pages.
std::string FormatSvg(const KernelBenchReport& r) {
  const int W = 760, Hh = 360, left = 60, bottom = 300, top = 40;
  double mx = 1;
  for (const auto& d : r.decode) mx = std::max({mx, d.sdpa_us, d.bf16_us, d.int2_us});
  std::string s = absl::StrFormat(
      "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' font-family='sans-serif' "
      "font-size='12'>\n<text x='%d' y='20'>decode attention time, %s (lower is better)</text>\n",
      W, Hh, left, r.device);
  const char* colors[3] = {"#888888", "#4472c4", "#ed7d31"};
  const char* names[3] = {"SDPA BF16", "oscarkv BF16 pages", "oscarkv INT2 pages"};
  const int n = static_cast<int>(r.decode.size());
  const double slot = n > 0 ? double(W - left - 20) / n : 1;
  for (int i = 0; i < n; ++i) {
    const auto& d = r.decode[i];
    const double v[3] = {d.sdpa_us, d.bf16_us, d.int2_us};
    for (int k = 0; k < 3; ++k) {
      const double h = (bottom - top) * v[k] / mx;
      const double x = left + i * slot + 10 + k * (slot - 20) / 3;
      s += absl::StrFormat(
          "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'/>"
          "<text x='%.1f' y='%.1f' font-size='10'>%.0f</text>\n",
          x, bottom - h, (slot - 20) / 3 - 2, h, colors[k], x, bottom - h - 3, v[k]);
    }
    s += absl::StrFormat("<text x='%.1f' y='%d'>B=%d L=%d</text>\n", left + i * slot + 10,
                         bottom + 18, d.batch, d.length);
  }
  for (int k = 0; k < 3; ++k) {
    s += absl::StrFormat("<rect x='%d' y='%d' width='12' height='12' fill='%s'/><text x='%d' y='%d'>%s</text>\n",
                         left + k * 200, Hh - 30, colors[k], left + k * 200 + 16, Hh - 20, names[k]);
  }
  s += absl::StrFormat("<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='black'/>\n", left, bottom,
                       W - 10, bottom);
  s += absl::StrFormat("<text x='5' y='%d'>us</text></svg>\n", top);
  return s;
}

}  // namespace oscarkv::bench
