// `oscarkv eval`: what each KV-cache codec costs in quality on a real model, in one run.
#if __has_include("oscarkv/calibrate/artifact.h") && __has_include("oscarkv/engine/eval.h")
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "command.h"
#include "nlohmann/json.hpp"
#include "oscarkv/calibrate/artifact.h"
#include "oscarkv/engine/cuda_attention.h"
#include "oscarkv/engine/eval.h"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/util/args.h"

namespace oscarkv::cli {
namespace {

int Fail(const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "oscarkv eval: %s\n", std::string(s.message()).c_str());
  return code;
}

// A codec spec: NAME[/key=value...]. NAME is bf16, naive, hadamard, oscar-published or oscar;
// modifiers override every (layer, head): ck=/cv= clip ratios, rk=/rv= range modes
// (minmax|search|unbiased|fixed0..fixed7). E.g. "oscar/ck=0.97/cv=1" or
// "hadamard/rk=search/rv=search".
absl::StatusOr<engine::KvCodec> ParseCodecSpec(const std::string& spec, const engine::ModelConfig& c,
                                               const std::shared_ptr<const RotationSet>& artifact,
                                               uint32_t S, uint32_t R, uint32_t G) {
  std::vector<std::string> parts = absl::StrSplit(spec, '/');
  const std::string& name = parts[0];
  if (name == "bf16") {
    if (parts.size() > 1) return absl::InvalidArgumentError("bf16 takes no modifiers");
    return engine::KvCodec::Bf16();
  }
  RotationSet set;
  if (name == "naive") {
    set = RotationSet::Identity(c.num_layers, c.num_kv_heads, c.head_dim);
  } else if (name == "hadamard") {
    set = RotationSet::Hadamard(c.num_layers, c.num_kv_heads, c.head_dim);
  } else if (name == "oscar" || name == "oscar-published") {
    if (!artifact) {
      return absl::InvalidArgumentError(name + " needs --rotations (run `oscarkv calibrate`)");
    }
    set = *artifact;
    if (name == "oscar-published") {  // the paper's fixed clip with min-max ranges
      set = *RotationSet::FromData(c.num_layers, c.num_kv_heads, c.head_dim, artifact->matrices(),
                                   artifact->clips());
      parts.insert(parts.begin() + 1, {"ck=0.96", "cv=0.92"});
    }
  } else {
    return absl::InvalidArgumentError("unknown codec '" + name + "'");
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    for (uint32_t l = 0; l < c.num_layers; ++l) {
      for (uint32_t h = 0; h < c.num_kv_heads; ++h) {
        if (kv.first == "ck" || kv.first == "cv") {
          float v = 0;
          if (!absl::SimpleAtof(kv.second, &v) || !(v > 0 && v <= 1)) {
            return absl::InvalidArgumentError("bad clip in codec spec '" + spec + "'");
          }
          set.set_clip(l, kv.first == "ck" ? KV::kKey : KV::kValue, h, v);
        } else if (kv.first == "rk" || kv.first == "rv") {
          // minmax, search, unbiased, fixed0..fixed7 (RangeModeName of each valid byte).
          int m = 0;
          while (m < 256 && !(IsRangeMode(static_cast<uint8_t>(m)) &&
                              kv.second == RangeModeName(static_cast<RangeMode>(m)))) {
            ++m;
          }
          if (m == 256) {
            return absl::InvalidArgumentError(
                "bad range mode in codec spec '" + spec +
                "' (minmax, search, unbiased or fixed0..fixed7)");
          }
          set.set_range_mode(l, kv.first == "rk" ? KV::kKey : KV::kValue, h,
                             static_cast<RangeMode>(m));
        } else {
          return absl::InvalidArgumentError("unknown modifier '" + kv.first + "' in '" + spec + "'");
        }
      }
    }
  }
  return engine::KvCodec::Int2(spec, std::make_shared<RotationSet>(std::move(set)), S, R, G);
}

int RunEval(int argc, char** argv) {
  Args args("eval",
            "Bits per byte (bpb) of a byte-level model on fixed random windows of a text, and a\n"
            "long-range recall probe (a span followed by its exact repeat; bpb on the repeat),\n"
            "for several KV-cache codecs in one run, each with its gap to BF16.\n\n"
            "codecs: bf16 (K/V rounded to bf16), naive (INT2, no rotation, no clip), hadamard\n"
            "(INT2, Hadamard rotation, no clip), oscar-published (the artifact's rotations with the\n"
            "paper's fixed clip 0.96/0.92, min-max ranges), oscar (the artifact as calibrated:\n"
            "its clips and write-time range modes, by default unbiased-fixed ranges, no clip).\n"
            "INT2 codecs keep the first --sink tokens and, for query position t, keys s >=\n"
            "t+1-recent (the last --recent positions up to and including t) in BF16.\n"
            "A codec may carry modifiers: NAME/ck=C/cv=C/rk=MODE/rv=MODE sets every head's key\n"
            "or value clip ratio C (1 = none) or range mode (minmax|search|unbiased|fixedI),\n"
            "e.g. oscar/ck=0.97/cv=1/rk=minmax/rv=minmax (a global clip grid point) or\n"
            "oscar/rk=fixed6/rv=fixed6 (unbiased restricted to candidate 6 on every head;\n"
            "docs/FORMAT.md 1.3.1; an artifact from `calibrate --range fixed` picks one per head).\n\n"
            "--device cuda runs attention through the CUDA kernels (quantize-on-write into pages,\n"
            "then paged decode attention with one sequence per query position, the same decode\n"
            "semantics); the rest of the forward pass stays on the CPU. On an H200, 16 windows,\n"
            "every codec's bpb was within 0.0004 of --device cpu and recall within 0.002\n"
            "(engine/results/h200_eval_cpu_vs_gpu.txt): K/V enter the write kernel as bf16, so\n"
            "INT2 codes differ on a few elements; tensor-core products.");
  args.Option("model", "", "HF Qwen3-style checkpoint folder")
      .Option("text", "", "evaluation text (for the reference model: its val.txt)")
      .Option("rotations", "", "rotation artifact from `oscarkv calibrate` (needed by oscar*)")
      .Option("codecs", "bf16,naive,hadamard,oscar-published,oscar", "comma-separated codecs")
      .Option("windows", "16", "number of random windows (and recall probes)")
      .Option("window-bytes", "2048", "bytes per window")
      .Option("recall-span", "1000", "bytes of the repeated span (0 disables the probe)")
      .Option("seed", "1", "seed of the window offsets")
      .Option("sink", "64", "BF16 sink tokens of the INT2 codecs")
      .Option("recent", "256", "BF16 recent tokens of the INT2 codecs")
      .Option("group", "128", "INT2 quantization group size (32, 64 or 128)")
      .Option("threads", "0", "worker threads (0 = all cores)")
      .Option("device", "cpu", "where attention runs: cpu (the reference) or cuda (GPU kernels)")
      .Option("shard", "0/1", "K/N: only windows i with i % N == K (combine by windows_evaluated)")
      .Flag("json", "print {\"rows\": [{codec, bpb, gap, recall_bpb, recall_gap}, ...]}");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  auto windows = args.integer("windows"), wbytes = args.integer("window-bytes"),
       span = args.integer("recall-span"), seed = args.integer("seed"), sink = args.integer("sink"),
       recent = args.integer("recent"), group = args.integer("group"),
       threads = args.integer("threads");
  for (const absl::Status& s : {windows.status(), wbytes.status(), span.status(), seed.status(),
                                sink.status(), recent.status(), group.status(), threads.status()}) {
    if (!s.ok()) return Fail(s, 2);
  }
  if (args.str("model").empty() || args.str("text").empty()) {
    return Fail(absl::InvalidArgumentError("--model and --text are required\n\n" + args.Help()), 2);
  }
  if (*group != 32 && *group != 64 && *group != 128) {
    return Fail(absl::InvalidArgumentError("--group must be 32, 64 or 128"), 2);
  }
  const std::string device = args.str("device");
  if (device != "cpu" && device != "cuda") {
    return Fail(absl::InvalidArgumentError("--device must be cpu or cuda"), 2);
  }
  if (device == "cuda" && !engine::CudaAttentionCompiled()) {
    return Fail(absl::UnimplementedError("--device cuda: this oscarkv was built without CUDA "
                                         "(no nvcc at configure time)"), 2);
  }
  uint32_t shard = 0, shards = 1;
  {
    std::pair<std::string, std::string> kn = absl::StrSplit(args.str("shard"), absl::MaxSplits('/', 1));
    if (!absl::SimpleAtoi(kn.first, &shard) || !absl::SimpleAtoi(kn.second, &shards) || shards == 0 ||
        shard >= shards) {
      return Fail(absl::InvalidArgumentError("--shard must be K/N with 0 <= K < N"), 2);
    }
  }
  if (*threads > 0) omp_set_num_threads(static_cast<int>(*threads));
  auto model = engine::Model::Load(args.str("model"));
  if (!model.ok()) return Fail(model.status());
  const engine::ModelConfig& c = (*model)->config();
  auto text = engine::ReadFileBytes(args.str("text"));
  if (!text.ok()) return Fail(text.status());

  std::shared_ptr<const RotationSet> artifact;
  if (!args.str("rotations").empty()) {
    auto a = calibrate::ReadArtifact(args.str("rotations"));
    if (!a.ok()) return Fail(a.status());
    if (a->rotations.layers() != c.num_layers || a->rotations.kv_heads() != c.num_kv_heads ||
        a->rotations.head_dim() != c.head_dim) {
      return Fail(absl::InvalidArgumentError("the rotation artifact's shape does not match the model"));
    }
    artifact = std::make_shared<RotationSet>(std::move(a->rotations));
  }
  const uint32_t S = *sink, R = *recent, G = *group;
  std::vector<engine::KvCodec> codecs;
  for (const std::string& spec :
       std::vector<std::string>(absl::StrSplit(args.str("codecs"), ',', absl::SkipEmpty()))) {
    auto codec = ParseCodecSpec(spec, c, artifact, S, R, G);
    if (!codec.ok()) return Fail(codec.status(), 2);
    codecs.push_back(*std::move(codec));
  }
  if (codecs.empty() || codecs[0].int2) {
    codecs.insert(codecs.begin(), engine::KvCodec::Bf16());  // gaps are relative to BF16
  }
  engine::EvalOptions o;
  o.windows = *windows;
  o.window_bytes = *wbytes;
  o.recall_span = *span;
  o.seed = *seed;
  o.shard = shard;
  o.shards = shards;
  std::fprintf(stderr, "eval: %s, %u windows of %u bytes + %u recall probes of 2x%u bytes, %zu codecs, "
               "sink %u, recent %u, group %u, attention on %s, shard %u/%u\n",
               c.model_id.c_str(), o.windows, o.window_bytes, o.recall_span ? o.windows : 0,
               o.recall_span, codecs.size(), S, R, G, device.c_str(), shard, shards);
  engine::BackendFactory backends;
  if (device == "cuda") {
    backends = [](const engine::KvCodec& k) { return engine::MakeCudaAttention(k); };
  }
  engine::ProgressBar bar("eval");
  auto rows = engine::EvaluateCodecs(**model, std::string(text->begin(), text->end()), codecs, o,
                                     [&](uint64_t d, uint64_t t) { bar.Update(d, t); }, backends);
  bar.Finish();
  if (!rows.ok()) return Fail(rows.status());
  const engine::CodecQuality& base = (*rows)[0];
  if (args.flag("json")) {
    nlohmann::ordered_json j;
    j["rows"] = nlohmann::ordered_json::array();
    for (const auto& r : *rows) {
      nlohmann::ordered_json row = {{"codec", r.codec}, {"bpb", r.bpb}, {"gap", r.bpb - base.bpb}};
      if (!std::isnan(r.recall_bpb)) {
        row["recall_bpb"] = r.recall_bpb;
        row["recall_gap"] = r.recall_bpb - base.recall_bpb;
      } else {
        row["recall_bpb"] = nullptr;
        row["recall_gap"] = nullptr;
      }
      j["rows"].push_back(row);
    }
    j["windows"] = o.windows;
    j["seed"] = o.seed;
    j["sink"] = S;
    j["recent"] = R;
    j["group"] = G;
    j["device"] = device;
    j["shard"] = absl::StrCat(shard, "/", shards);
    j["windows_evaluated"] = base.windows;
    j["recall_windows_evaluated"] = base.recall_windows;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-16s %8s %9s %11s %11s\n", "codec", "bpb", "gap", "recall_bpb", "recall_gap");
  for (const auto& r : *rows) {
    if (std::isnan(r.recall_bpb)) {
      std::printf("%-16s %8.4f %+9.4f %11s %11s\n", r.codec.c_str(), r.bpb, r.bpb - base.bpb, "-",
                  "-");
    } else {
      std::printf("%-16s %8.4f %+9.4f %11.4f %+11.4f\n", r.codec.c_str(), r.bpb, r.bpb - base.bpb,
                  r.recall_bpb, r.recall_bpb - base.recall_bpb);
    }
  }
  return 0;
}

OSCARKV_COMMAND("eval", "bits per byte + recall probe of every KV-cache codec on a real model",
                RunEval);

}  // namespace
}  // namespace oscarkv::cli
#endif  // calibrate and engine modules
