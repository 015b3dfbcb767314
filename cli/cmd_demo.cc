// `oscarkv demo`: the main job. For now: the OSCAR codec on a realistic synthetic workload
// (keys with outlier channels, as post-RoPE keys of real models have), comparing naive INT2,
// Hadamard-rotated INT2 and clipped Hadamard INT2 against BF16 pages.
#include <cmath>
#include <cstdio>
#include <random>

#include "command.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/util/args.h"

namespace oscarkv::cli {
namespace {

struct Workload {
  CodecProfile profile;
  std::vector<float> kv;
  KVSequenceView view;
};

// Keys: most channels N(0,1), a few per head with 8-20x scale (the "outlier channels" seen in
// real models), plus a per-channel offset; values: N(0,1) with mild per-channel scale spread.
Workload MakeWorkload(uint32_t tokens, uint32_t seed) {
  Workload w;
  w.profile = *BuiltinProfile("refmodel");
  const CodecProfile& p = w.profile;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n;
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  w.kv.resize(size_t{p.num_layers} * 2 * tokens * p.num_kv_heads * p.head_dim);
  w.view = {w.kv.data(), p.num_layers, p.num_kv_heads, p.head_dim, tokens};
  for (uint32_t l = 0; l < p.num_layers; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < p.num_kv_heads; ++h) {
        std::vector<float> scale(p.head_dim), offset(p.head_dim, 0.0f);
        for (auto& s : scale) s = u(rng);
        if (kv == 0) {
          for (int o = 0; o < 4; ++o) scale[rng() % p.head_dim] = 8.0f + 12.0f * (u(rng) - 0.5f);
          for (auto& off : offset) off = 0.5f * n(rng);
        }
        for (uint32_t t = 0; t < tokens; ++t) {
          float* row = const_cast<float*>(w.view.row(l, kv, t, h));
          for (uint32_t i = 0; i < p.head_dim; ++i) row[i] = offset[i] + scale[i] * n(rng);
        }
      }
    }
  }
  return w;
}

double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * (a[i] - b[i]), r += b[i] * b[i];
  return std::sqrt(e / r);
}

int RunDemo(int argc, char** argv) {
  Args args("demo", "Runs the OSCAR INT2 page codec on a synthetic outlier-channel workload.");
  args.Option("tokens", "1024", "sequence length");
  if (absl::Status s = args.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (args.help_requested()) {
    std::printf("%s", args.Help().c_str());
    return 0;
  }
  auto tokens = args.integer("tokens");
  if (!tokens.ok() || *tokens < 1 || *tokens > 65536) {
    std::fprintf(stderr, "oscarkv demo: --tokens must be 1..65536\n");
    return 2;
  }
  Workload w = MakeWorkload(static_cast<uint32_t>(*tokens), 42);
  const CodecProfile& p = w.profile;
  const auto q8 = *BuiltinProfile("qwen3-8b");
  std::printf("== oscarkv demo: OSCAR INT2 pages ==\n");
  std::printf("page bytes at Qwen3-8B shape: INT2 %zu, BF16 %zu (%.2fx smaller)\n",
              GeometryFor(q8, PageKind::kInt2).page_bytes(),
              GeometryFor(q8, PageKind::kBf16).page_bytes(),
              double(GeometryFor(q8, PageKind::kBf16).page_bytes()) /
                  GeometryFor(q8, PageKind::kInt2).page_bytes());
  std::printf("workload: refmodel shape (%u layers, %u KV heads, d=%u), %u tokens, "
              "keys with outlier channels\n\n",
              p.num_layers, p.num_kv_heads, p.head_dim, w.view.seq_tokens);

  struct Codec {
    const char* name;
    RotationSet rot;
    bool windows;
  };
  const uint32_t L = p.num_layers, H = p.num_kv_heads, d = p.head_dim;
  std::vector<Codec> codecs;
  codecs.push_back({"naive INT2, no windows", RotationSet::Identity(L, H, d), false});
  codecs.push_back({"Hadamard INT2, no windows", RotationSet::Hadamard(L, H, d), false});
  codecs.push_back({"Hadamard+clip INT2, no windows", RotationSet::Hadamard(L, H, d, 0.96f, 0.92f), false});
  codecs.push_back({"Hadamard INT2 + 64/256 BF16", RotationSet::Hadamard(L, H, d), true});

  // Attention reference: BF16-free, fp32 K/V in the original space.
  std::mt19937 rng(7);
  std::normal_distribution<float> n;
  const uint32_t qheads = 8;
  std::vector<float> q(qheads * d);
  for (auto& v : q) v = n(rng) * 0.3f;
  const auto eye = RotationSet::Identity(L, H, d);
  const AttentionOutput want = DenseDecodeAttention(p, eye, w.view, 0, q, qheads, true);

  std::printf("%-34s %12s %12s %14s %14s\n", "codec", "bytes", "vs BF16", "K rel.err", "attn rel.err");
  for (const Codec& c : codecs) {
    CodecProfile cp = p;
    cp.sink_tokens = c.windows ? 64 : 0;
    cp.recent_tokens = c.windows ? 256 : 0;
    cp.rotation_digest = c.rot.Digest();
    auto sp = BuildSequencePages(cp, c.rot, w.view);
    if (!sp.ok()) {
      std::fprintf(stderr, "demo: %s\n", std::string(sp.status().message()).c_str());
      return 1;
    }
    size_t bytes = 0;
    std::vector<float> err_k, ref_k;
    for (size_t i = 0; i < sp->pages.size(); ++i) {
      bytes += sp->pages[i].size();
      auto dp = *DecodePage(cp, sp->pages[i]);
      std::vector<float> orig(d);
      for (uint32_t t = 0; t < dp.token_count; ++t) {
        for (uint32_t h = 0; h < H; ++h) {
          UnrotateRow(dp.view(cp).row(0, 0, t, h), c.rot.matrix(0, KV::kKey, h), d, orig.data());
          const float* src = w.view.row(0, 0, sp->plan[i].first_token + t, h);
          err_k.insert(err_k.end(), orig.begin(), orig.end());
          ref_k.insert(ref_k.end(), src, src + d);
        }
      }
    }
    std::vector<std::span<const uint8_t>> spans(sp->pages.begin(), sp->pages.end());
    auto got = ReferenceDecodeAttention(cp, c.rot, spans, 0, q, qheads, true);
    const size_t bf16_bytes = size_t{L} * 2 * H * d * 2 * w.view.seq_tokens;
    std::printf("%-34s %12zu %11.2fx %14.4f %14.4f\n", c.name, bytes, double(bf16_bytes) / bytes,
                RelErr(err_k, ref_k), RelErr(got->out, want.out));
  }
  std::printf("\n(bytes include page headers and the BF16 sink/recent pages where used)\n");
  return 0;
}

OSCARKV_COMMAND("demo", "the main job: run the product end to end on a demo workload", RunDemo);

}  // namespace
}  // namespace oscarkv::cli
