// `oscarkv calibrate`: OSCAR rotations and clip ratios from real activations, written as a
// rotation artifact; `oscarkv calibrate absorb`: V-rotation absorption into a checkpoint.
#if __has_include("oscarkv/calibrate/calibrator.h")  // built only with the calibrate module
#include <omp.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_split.h"
#include "command.h"
#include "oscarkv/calibrate/absorb.h"
#include "oscarkv/calibrate/artifact.h"
#include "oscarkv/calibrate/calibrator.h"
#include "oscarkv/engine/eval.h"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/util/args.h"

namespace oscarkv::cli {
namespace {

int Fail(const std::string& cmd, const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "oscarkv %s: %s\n", cmd.c_str(), std::string(s.message()).c_str());
  return code;
}

int RunCalibrate(int argc, char** argv) {
  Args args("calibrate",
            "Calibrates OSCAR KV-cache rotations: runs the reference engine over calibration\n"
            "text (or reads Q/K/V activation dumps), accumulates per layer and KV head the query\n"
            "covariance C_Q and the attention-weighted value covariance C_S in fp64,\n"
            "eigendecomposes them, composes R = U * H * P_br, and searches clip ratios per layer,\n"
            "head and K/V (no clip included) against attention-output error on held-out windows.\n"
            "Writes DIR/rotations.safetensors and DIR/rotations.json; equal inputs give equal bytes.");
  args.Option("model", "", "HF Qwen3-style checkpoint folder (config.json + safetensors)")
      .Option("text", "", "calibration text file (must not be the evaluation text)")
      .Option("dumps", "", "comma-separated activation dumps instead of --model/--text: "
                           "safetensors with layers.{l}.q/k/v [tokens, heads, head_dim]")
      .Option("out", "", "output folder for the rotation artifact")
      .Option("windows", "24", "calibration windows (consecutive chunks of --text)")
      .Option("heldout", "4", "further held-out windows for the clip search and the fixed range candidates")
      .Option("window-bytes", "2048", "bytes (tokens) per window")
      .Option("c-s", "scores", "value covariance: scores (real softmax scores), outputs "
                               "(covariance of attention outputs) or proxy (OSCAR's k^T C_Q k)")
      .Option("clip", "none", "quantile clip ratios: none, search (per layer, head and K|V "
                              "against held-out attention-output error, no clip included) or "
                              "fixed (--clip-k/--clip-v)")
      .Option("clip-k", "0.96", "fixed key clip ratio (with --clip fixed)")
      .Option("clip-v", "0.92", "fixed value clip ratio (with --clip fixed)")
      .Option("range", "fixed", "INT2 write-time range per group (docs/FORMAT.md 1.3.1): "
                                "fixed (unbiased with one candidate per layer, K|V and head, "
                                "chosen here: the smallest total unbiased score over the "
                                "rotated held-out rows; needs --heldout > 0; written by the "
                                "GPU's streaming kernel), unbiased (8 candidate ranges per "
                                "group, each refit so logits stay unbiased, the smallest error "
                                "kept: the same quality on the reference model, ~1.6x the GPU "
                                "write time), minmax or search (least squared error)")
      .Option("sink", "64", "BF16 sink tokens assumed by the clip search")
      .Option("recent", "256", "BF16 recent tokens assumed by the clip search")
      .Option("group", "128", "quantization group size")
      .Option("threads", "0", "worker threads (0 = all cores)")
      .Epilog("example:\n  python3 tools/golden/make_calib_text.py /tmp/calib.txt\n"
              "  oscarkv calibrate --model ../shared/refmodel --text /tmp/calib.txt --out rot/");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  calibrate::CalibrationOptions o;
  auto windows = args.integer("windows"), heldout = args.integer("heldout"),
       wbytes = args.integer("window-bytes"), sink = args.integer("sink"),
       recent = args.integer("recent"), group = args.integer("group"),
       threads = args.integer("threads");
  auto clip_k = args.real("clip-k"), clip_v = args.real("clip-v");
  auto cs = calibrate::ParseValueWeighting(args.str("c-s"));
  for (const absl::Status& s : {windows.status(), heldout.status(), wbytes.status(), sink.status(),
                                recent.status(), group.status(), threads.status(), clip_k.status(),
                                clip_v.status(), cs.status()}) {
    if (!s.ok()) return Fail("calibrate", s, 2);
  }
  if (args.str("out").empty()) {
    return Fail("calibrate", absl::InvalidArgumentError("--out is required\n\n" + args.Help()), 2);
  }
  const std::string clip = args.str("clip");
  if (clip != "search" && clip != "fixed" && clip != "none") {
    return Fail("calibrate", absl::InvalidArgumentError("--clip must be none, search or fixed"), 2);
  }
  const std::string range = args.str("range");
  if (range != "search" && range != "minmax" && range != "unbiased" && range != "fixed") {
    return Fail("calibrate",
                absl::InvalidArgumentError("--range must be minmax, search, unbiased or fixed"), 2);
  }
  if (*threads > 0) omp_set_num_threads(static_cast<int>(*threads));
  o.windows = *windows;
  o.heldout = *heldout;
  o.window_bytes = *wbytes;
  o.value_weighting = *cs;
  o.sink = *sink;
  o.recent = *recent;
  o.group = *group;
  o.range_mode = range == "search"                         ? RangeMode::kSearch
                 : range == "unbiased" || range == "fixed" ? RangeMode::kUnbiased
                                                           : RangeMode::kMinMax;
  o.fixed_range = range == "fixed";
  // The fixed candidates are scored on held-out rows: say so before the covariance pass, not
  // after it.
  const std::vector<std::string> dumps = absl::StrSplit(args.str("dumps"), ',', absl::SkipEmpty());
  if (o.fixed_range && (*heldout <= 0 || dumps.size() == 1)) {
    return Fail("calibrate",
                absl::InvalidArgumentError(
                    "--range fixed (the default) scores its candidates on held-out rows: give --heldout > 0 "
                    "(with --dumps: at least two files, the last is held out), or pick --range unbiased"),
                2);
  }
  if (clip == "fixed") {
    o.clip_candidates.clear();
    o.fixed_clip_k = static_cast<float>(*clip_k);
    o.fixed_clip_v = static_cast<float>(*clip_v);
  } else if (clip == "none") {
    // With the unbiased range mode every group already picks its range at write time; a
    // quantile clip in front of it re-introduces the logit shrinkage the refit removes
    // (measured: recall gap +0.025 with searched clips vs +0.014 without).
    o.clip_candidates.clear();
  }
  engine::ProgressBar bar("calibrate");
  auto progress = [&](uint64_t done, uint64_t total) { bar.Update(done, total); };
  absl::StatusOr<calibrate::RotationArtifact> artifact;
  if (!dumps.empty()) {
    artifact = calibrate::CalibrateFromDumps(dumps, o, progress);
  } else {
    if (args.str("model").empty() || args.str("text").empty()) {
      return Fail("calibrate", absl::InvalidArgumentError(
                                   "give --model and --text (or --dumps)\n\n" + args.Help()), 2);
    }
    auto model = engine::Model::Load(args.str("model"));
    if (!model.ok()) return Fail("calibrate", model.status());
    auto text = engine::ReadFileBytes(args.str("text"));
    if (!text.ok()) return Fail("calibrate", text.status());
    std::fprintf(stderr, "calibrate: %s, %zu bytes of text, %u windows of %u bytes%s\n",
                 (*model)->config().model_id.c_str(), text->size(), o.windows, o.window_bytes,
                 o.clip_candidates.empty() && !o.fixed_range
                     ? ""
                     : (" + " + std::to_string(o.heldout) + " held-out for the " +
                        (o.clip_candidates.empty() ? "" : "clip search") +
                        (!o.clip_candidates.empty() && o.fixed_range ? " and " : "") +
                        (o.fixed_range ? "range candidates" : ""))
                           .c_str());
    artifact = calibrate::CalibrateModel(**model, std::string(text->begin(), text->end()), o,
                                         progress);
    if (artifact.ok()) artifact->metadata["text"] = std::filesystem::path(args.str("text")).filename().string();
  }
  bar.Finish();
  if (!artifact.ok()) return Fail("calibrate", artifact.status());
  if (absl::Status s = calibrate::WriteArtifact(*artifact, args.str("out")); !s.ok()) {
    return Fail("calibrate", s);
  }
  const RotationSet& r = artifact->rotations;
  std::printf("wrote %s/{%s,%s}\n", args.str("out").c_str(), calibrate::kArtifactTensors,
              calibrate::kArtifactJson);
  const Sha256Digest digest = artifact->rotations.Digest();
  std::printf("digest %s\n", HexEncode(digest.data(), digest.size()).c_str());
  // One line per layer: the key heads' values, then the value heads'.
  const auto table = [&r](const char* title, const auto& cell) {
    std::printf("%s (K / V per layer, heads in order):\n", title);
    for (uint32_t l = 0; l < r.layers(); ++l) {
      std::printf("  layer %2u  K", l);
      for (uint32_t h = 0; h < r.kv_heads(); ++h) cell(l, KV::kKey, h);
      std::printf("   V");
      for (uint32_t h = 0; h < r.kv_heads(); ++h) cell(l, KV::kValue, h);
      std::printf("\n");
    }
  };
  table("clip ratios", [&r](uint32_t l, KV kv, uint32_t h) { std::printf(" %.3f", r.clip(l, kv, h)); });
  if (o.fixed_range) {
    table("unbiased-fixed range candidates", [&r](uint32_t l, KV kv, uint32_t h) {
      std::printf(" %d", FixedCandidate(r.range_mode(l, kv, h)));
    });
  }
  return 0;
}

int RunAbsorb(int argc, char** argv) {
  Args args("calibrate absorb",
            "Rewrites a checkpoint so v_proj emits values rotated by the artifact's R_V and\n"
            "o_proj consumes them; writes OUT/model.safetensors, OUT/config.json and\n"
            "OUT/rotations/ (the artifact with identity V rotations, for the rewritten model).");
  args.Option("model", "", "source checkpoint folder")
      .Option("rotations", "", "rotation artifact folder")
      .Option("out", "", "output checkpoint folder");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  if (args.str("model").empty() || args.str("rotations").empty() || args.str("out").empty()) {
    return Fail("calibrate absorb",
                absl::InvalidArgumentError("--model, --rotations and --out are required"), 2);
  }
  auto a = calibrate::ReadArtifact(args.str("rotations"));
  if (!a.ok()) return Fail("calibrate absorb", a.status());
  if (absl::Status s = calibrate::AbsorbValueRotations(args.str("model"), a->rotations, args.str("out"));
      !s.ok()) {
    return Fail("calibrate absorb", s);
  }
  calibrate::RotationArtifact b{calibrate::ValueIdentity(a->rotations), a->eigenvalues, a->metadata};
  b.metadata["absorbed_v_rotation_of"] = a->metadata.value("digest", "");
  if (absl::Status s = calibrate::WriteArtifact(b, args.str("out") + "/rotations"); !s.ok()) {
    return Fail("calibrate absorb", s);
  }
  std::printf("wrote %s (V rotations absorbed) and %s/rotations\n", args.str("out").c_str(),
              args.str("out").c_str());
  return 0;
}

OSCARKV_COMMAND("calibrate", "OSCAR rotations + clip ratios from real activations", RunCalibrate);
OSCARKV_COMMAND("calibrate absorb", "absorb V rotations into a checkpoint's v_proj/o_proj",
                RunAbsorb);

}  // namespace
}  // namespace oscarkv::cli
#endif  // __has_include calibrator.h
