// `oscarkv bench kernels`: decode attention at Qwen3-8B shape (32 query heads, 8 KV heads,
// head_dim 128) for several (batch, length) points -- PyTorch SDPA in BF16 (enable_gqa=True,
// run as a Python subprocess in the same process/device call), this project's kernel on
// all-BF16 pages, and on OSCAR pages (BF16 sink + INT2 history + BF16 recent tail) -- plus a
// copy kernel for the machine's bandwidth and quantize-on-write throughput. Medians of many
// timed batches. Decode rows time reads from HBM by default: each side cycles over enough copies
// of its K/V (page pools and tables; SDPA's dense K/V) that one cycle reads at least 4x the L2
// size, so no timed launch finds its pages in L2 (KernelBenchOptions::warm_l2 for the contrast).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace oscarkv::bench {

// One extend (chunked-prefill) shape: `batch` sequences of `prefix` cached tokens (OSCAR pages:
// BF16 sink + INT2 history + BF16 tail) and `new_tokens` new tokens each.
struct ExtendShape {
  int batch = 1, prefix = 0, new_tokens = 0;
};

struct KernelBenchOptions {
  std::vector<std::pair<int, int>> shapes = {{1, 32768}, {1, 100000}, {8, 32768}, {32, 32768}};
  int samples = 30;        // timed batches per measurement (median reported)
  int layers = 4;          // layers per page (the kernel reads one layer's segments)
  std::string sdpa_command = "python3 bench/sdpa_baseline.py";  // empty: skip the baseline
  bool precise_query = true;
  // Measure the default INT2 launch's alternatives beside it (the separate merge kernel, the
  // other query rotation); false: the default launch only.
  bool all_variants = true;
  int quant_tokens = 32768;  // quantize-on-write: tokens of one layer (all 8 KV heads, K and V)
  // The prefill-step row (PrefillStepRow) for this many tokens (0: skip; it uses the first
  // quantize row, so quant_tokens must equal it), and the GEMM baseline it runs.
  int prefill_tokens = 32768;
  std::string gemm_command = "python3 bench/gemm_baseline.py";
  std::vector<std::string> quant_rows;  // non-empty: only rows whose names contain one of these
  // Decode plan CTA targets to measure (0 = default; -1, not first: the default target on the
  // session-5 planner, PlanDecode's session5_slots; kTailTarget - N, not first: the default
  // target with PlanDecode's tail_items = N).
  std::vector<int> target_ctas = {0};
  bool bf16_pages = true;    // measure the kernel on all-BF16 pages
  bool quantize = true;      // measure quantize-on-write
  // Extend attention shapes, each beside PyTorch SDPA (every backend that runs) on dense BF16
  // K/V of the same total length and causal mask (sdpa_command with --extend; empty: skip).
  std::vector<ExtendShape> extend_shapes = {{1, 32768, 512}, {1, 100000, 2048}, {8, 8192, 1024}, {4, 0, 8192}};
  // INT2 configurations: the whole list is timed `rounds` times in turn (A B C .. A B C ..), and
  // each reports the median of its rounds, so drift during the call hits every configuration
  // alike.
  int rounds = 1;
  // Also time the decode rows under CUDA-graph replay (how engines run a decode step): the SDPA
  // baseline (sdpa_baseline.py --graph), the BF16-pages launch and the default INT2 launch, each
  // as a captured graph of the same back-to-back calls the eager batches make, in the same
  // call (DecodeRow::*_graph_us; the INT2 graph figure interleaved with the eager rounds).
  bool graph_timing = true;
  // Decode rows: false (default) cycles every side over copies of its K/V whose total read per
  // cycle is >= 4x the device's L2 (cudaDevAttrL2CacheSize), as in a model step where the other
  // layers' weights and pages pass through L2 between two reads of a layer; true re-reads one
  // copy (its pages may stay in L2 between launches) -- the table header says which.
  bool warm_l2 = false;
  // Also time the default INT2 launch through a capture decoder as the torch op gets it
  // (python/oscarkv/torch/cache.py: PagedDecoder::CreateForCapture for 2B sequences of
  // ceil(L / 64) + 1 pages, then Update for the batch): DecodeRow::int2_capture_us; and that
  // launch also unrotating the output with R_V, as the torch op asks (int2_capture_unrotate_us).
  // Both timed in the rounds with the other configurations, never the INT2 figure. On BF16 pages
  // the torch op's launch once (bf16_capture_unrotate_us).
  bool capture_timing = true;
  // Diagnostics: also time the default INT2 launch without its fused merge and without the
  // query rotation (outputs differ: never reported), and write per-CTA phase timestamps of
  // the default launch (and of the rotation kernel launch and every other plan target) to
  // `timeline_csv` (cuda::DecodeParams::debug_timeline).
  bool diagnostics = false;
  std::string timeline_csv;
  // The default INT2 launch also with each of these '+'-joined option sets ("shared_rotation":
  // DecodeParams::share_rotation on, "early_copies": copies_after_queries off,
  // "rotation_kernel" / "cta_rotation": rotate_in_cta false / true, "cta_fragments":
  // prepared_fragments off, "two_per_sm" / "no_cap": int2_ctas_per_sm 2 / 0,
  // "early_rotation" / "late_rotation": early_rotation on / off, "bulk_merge" / "copy_merge":
  // bulk_merge on / off, "frags_first" / "frags_after": fragments_before_copies on / off; with
  // diagnostics, each also records a timeline), timed in the
  // rounds like every configuration, never reported as the INT2 figure.
  std::vector<std::string> ab_configs;
};

// One INT2 kernel configuration measured on the same pages.
struct VariantTime {
  std::string name;
  bool approximate = false;  // looser tolerance than the default (e.g. single fp16 query)
  double us = 0;
  std::vector<double> round_us;  // each round's median (KernelBenchOptions::rounds)
  // Output cross-check of sequence 0 against the same attention in double on the CPU
  // (max |a-b|/(1+|b|)); check_ok: within 4e-3 (2e-2 if approximate).
  double check_error = 0;
  bool check_ok = true;
};

struct DecodeRow {
  int batch = 0, length = 0;
  double sdpa_us = 0, bf16_us = 0, int2_us = 0;       // medians, 0 = not measured
  double sdpa_bytes = 0, bf16_bytes = 0, int2_bytes = 0;  // bytes of K/V read per call
  int int2_items = 0, bf16_items = 0;
  // BF16 pages with the separate merge kernel (bf16_us: the default, the fused merge).
  double bf16_merge_kernel_us = 0;
  // The same launches timed under CUDA-graph replay (KernelBenchOptions::graph_timing; 0 = not
  // measured): SDPA, BF16 pages, the default INT2 launch (median of its rounds).
  double sdpa_graph_us = 0, bf16_graph_us = 0, int2_graph_us = 0;
  // The default INT2 launch through the torch op's capture decoder (capture_timing; 0 = not
  // measured), eager, median of its rounds; items: its grid (capacity) and the planned items.
  double int2_capture_us = 0;
  double int2_capture_unrotate_us = 0;  // the same also unrotating the output (the torch op's launch)
  double bf16_capture_unrotate_us = 0;  // BF16 pages: the torch op's launch (capture decoder, unrotated)
  int int2_capture_grid = 0, int2_capture_items = 0;
  int copies = 1;  // K/V copies the INT2 rows cycled over (1: warm_l2)
  // (target_ctas, µs) when several; -1: the session-5 planner, -2: the session-5 default
  // (packed_int8 with the merge kernel and in-CTA rotation on that planner), kTailTarget - N:
  // tail_items N.
  std::vector<std::pair<int, double>> int2_by_target;
  // Every INT2 configuration measured, the default launch first (int2_us is its time; whether its
  // output passed the CPU check: int2_default_ok); int2_best names the fastest one within the
  // tolerance (int2_best_us), so int2_us / int2_best_us says how far the default is from it.
  std::vector<VariantTime> int2_variants;
  std::string int2_best;
  double int2_best_us = 0;
  bool int2_default_ok = true;
};

// target_ctas entry for the default target with PlanDecode's tail_items = N: kTailTarget - N.
inline constexpr int kTailTarget = -1000;
// target_ctas entry for the 8-warp plan (where PagedDecoder picks it) aimed at N CTAs instead of
// one per SM: kWideTarget + N.
inline constexpr int kWideTarget = 1000000;

struct QuantRow {
  std::string name;
  double us = 0, bytes = 0;  // bytes moved: bf16 rows read + page bytes written
};

struct ExtendRow {
  int batch = 1, prefix = 0, new_tokens = 0;
  double us = 0;
  // 4·B·C·(prefix + C/2)·d·Hq (scores and values, causal half of the new block)
  double flops = 0;
  // PyTorch SDPA on dense BF16 K/V of the same shape and mask, per backend (0: did not run);
  // sdpa_how: the mask formulation each backend ran with, or why it did not.
  double sdpa_cudnn_us = 0, sdpa_flash_us = 0, sdpa_efficient_us = 0;
  std::string sdpa_how;
  bool tensor_cores = false;  // ours ran the wgmma kernel
  // Diagnostics of the wgmma kernel (wrong outputs, never the reported figure): its time with the
  // producer skipping the dequantization / the raw copies.
  double diag_no_dequant_us = 0, diag_no_copies_us = 0;
  // Plain prefill (P = 0): the dense kernel alone, one CTA per work item / persistent CTAs.
  double diag_dense_per_item_us = 0, diag_dense_persistent_us = 0, diag_dense_no_copies_us = 0;
  double best_sdpa_us() const;  // the fastest backend that ran (0: none)
};

// Quantize-on-write in a prefill step of one Qwen3-8B layer (hidden 4096, 32 query heads, 8 KV
// heads, d 128, MLP 12288): `tokens` new tokens of one sequence (no prefix). All times measured in
// the same call: the default codec write of the step's K and V (the first quantize row), the
// step's attention (this project's extend kernel, and the fastest PyTorch SDPA backend on dense
// BF16 K/V with the causal mask), its projections (Q, K, V and O: bf16 GEMMs through
// torch.matmul, bench/gemm_baseline.py) and the MLP's GEMMs (gate + up, down).
struct PrefillStepRow {
  int tokens = 0;
  double quant_us = 0, attention_us = 0, attention_sdpa_us = 0, projections_us = 0, mlp_us = 0;
  std::string sdpa_backend, quant_row, error;
  // quant_us / (attention_us + projections_us): the write's share of the step's attention and
  // projections (ours; with the SDPA attention: share_sdpa).
  double share() const;
  double share_sdpa() const;
};

struct KernelBenchReport {
  std::string device;
  int sms = 0, decode_ctas_per_sm = 0;
  int l2_bytes = 0;      // cudaDevAttrL2CacheSize
  bool warm_l2 = false;  // KernelBenchOptions::warm_l2 of the decode rows
  double copy_gbps = 0;  // read + write bytes per second of a plain copy kernel
  std::vector<DecodeRow> decode;
  std::vector<QuantRow> quant;
  std::vector<ExtendRow> extend;
  std::vector<PrefillStepRow> prefill;
  std::string sdpa_error;  // why the baseline is missing, if it is
};

absl::StatusOr<KernelBenchReport> RunKernelBench(const KernelBenchOptions& options);

// Runs options.sdpa_command (a Python process) and parses its JSON lines into rows with
// sdpa_us/sdpa_bytes filled. Unavailable when it cannot run.
absl::StatusOr<std::vector<DecodeRow>> RunSdpaBaseline(const KernelBenchOptions& options);

// Runs options.sdpa_command --extend for options.extend_shapes and fills the rows' SDPA figures
// (rows[i] is extend_shapes[i]). Unavailable when it cannot run.
absl::Status RunSdpaExtendBaseline(const KernelBenchOptions& options, std::vector<ExtendRow>* rows);

// Fills r->prefill (one row for options.prefill_tokens > 0, after r->quant is measured): k_new /
// v_new are at least prefill_tokens bf16 rows of [8][128], rot_k the layer's R_K (device).
absl::Status MeasurePrefillStep(const KernelBenchOptions& options, const uint16_t* k_new,
                                const uint16_t* v_new, const float* rot_k, KernelBenchReport* r);

// The `bench kernels` command line (shared by `oscarkv bench kernels` and bench/kernel_bench).
int KernelBenchMain(int argc, char** argv);

// Text table, CSV, JSON summary and SVG plot of a report.
std::string FormatTable(const KernelBenchReport& r);
std::string FormatCsv(const KernelBenchReport& r);
std::string FormatJson(const KernelBenchReport& r);
std::string FormatSvg(const KernelBenchReport& r);

}  // namespace oscarkv::bench
