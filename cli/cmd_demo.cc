// `oscarkv demo`: the main job, end to end on one machine in a few seconds.
//  1. The OSCAR codec on a realistic synthetic workload (keys with outlier channels, as post-RoPE
//     keys of real models have): naive INT2, Hadamard INT2, clipped Hadamard INT2 and Hadamard
//     INT2 with BF16 sink/recent windows, against BF16 pages.
//  2. The service: starts oscarkvd (default config, 127.0.0.1 port 0, small pool) and, through
//     the client library, registers the codec, stores request A's pages under block keys computed
//     from its token ids, looks up the prefix request B shares with A, loads those pages, checks
//     they are byte-identical (and give the same attention), then stops the daemon cleanly.
//  3. The prefill->decode handoff (cmd_pd.cc, `oscarkv pd demo`) on the reference model, or,
//     where none is found, on a small random-weight Qwen3-style checkpoint it writes itself: two
//     daemons on two hosts (network namespaces when possible, else loopback), a prefill process
//     and a decode process that loads the pages by transfer handle over UCX and continues
//     generation, compared with a single-process run; bytes moved vs BF16 pages.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "command.h"
#include "oscarkv/kernels/page_set.h"
#include "oscarkv/util/args.h"
#if __has_include("oscarkv/client/client.h")
#include <unistd.h>

#include "oscarkv/client/client.h"
#include "oscarkv/testing/local_daemon.h"
#define OSCARKV_DEMO_HAS_CLIENT 1
#endif
#if __has_include("oscarkv/pd/workers.h")
#define OSCARKV_DEMO_HAS_PD 1
namespace oscarkv::cli {
// cmd_pd.cc: the P/D handoff with the default codec, on the reference model when found, else
// (or with random_model) on a random-weight checkpoint in a temporary folder.
int RunPdDemoSection(uint32_t prompt_bytes, uint32_t tokens, bool random_model);
}  // namespace oscarkv::cli
#endif

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

#ifdef OSCARKV_DEMO_HAS_CLIENT
using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

int ServiceFail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "oscarkv demo: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

// Part 2: the daemon and the client library on the same workload.
int RunServiceDemo(const Workload& w, const CodecProfile& cp, const RotationSet& rot,
                   const SequencePages& seq, const std::string& daemon_binary,
                   std::span<const float> q, uint32_t qheads) {
  std::printf("\n== oscarkvd + client library ==\n");
  testing::LocalDaemonOptions dopt;
  dopt.binary = daemon_binary;
  const std::string log_path = absl::StrCat("/tmp/oscarkv-demo-", ::getpid(), ".log");
  dopt.log_path = log_path;
  dopt.flags = {"--pool-mb", "64", "--metrics-listen", "off", "--shm-name",
                absl::StrCat("oscarkv-demo-", ::getpid())};
  auto t0 = Clock::now();
  auto daemon = testing::LocalDaemon::Start(dopt);
  if (!daemon.ok()) return ServiceFail("starting oscarkvd", daemon.status());
  std::printf("oscarkvd started in %.0f ms: listen=%s, pool %llu MiB in %s (pid %d)\n",
              Ms(Clock::now() - t0), (*daemon)->address().c_str(),
              (unsigned long long)((*daemon)->pool_bytes() >> 20), (*daemon)->shm_path().c_str(),
              int((*daemon)->pid()));

  client::ConnectOptions o;
  o.address = (*daemon)->address();
  o.client_name = "oscarkv-demo";
  auto c = client::Client::Connect(o);
  if (!c.ok()) return ServiceFail("connecting", c.status());
  auto codec = (*c)->RegisterCodec(cp);
  if (!codec.ok()) return ServiceFail("registering the codec", codec.status());
  std::printf("client connected (data path: %s, lookups: %s); codec %s registered (Hadamard "
              "rotations, 64/256 BF16 windows)\n",
              client::DataPathName((*c)->server().data_path),
              (*c)->server().lookup_path == client::LookupPath::kLocal ? "local socket" : "gRPC",
              codec->id.Hex().c_str());

  // Request A: token ids -> block keys -> one page per full block.
  const uint32_t n = w.view.seq_tokens;
  std::vector<uint32_t> tokens_a(n);
  std::mt19937 rng(11);
  for (auto& t : tokens_a) t = rng() % 151936;
  const auto keys_a = client::Client::BlockKeys(*codec, tokens_a);
  if (keys_a.size() != seq.pages.size()) {
    return ServiceFail("planning", absl::InternalError("one full page per block key expected"));
  }
  std::vector<client::PageWrite> writes;
  uint64_t bytes_a = 0;
  int int2 = 0;
  for (size_t i = 0; i < keys_a.size(); ++i) {
    writes.push_back({keys_a[i], seq.plan[i].kind, seq.pages[i]});
    bytes_a += seq.pages[i].size();
    int2 += seq.plan[i].kind == PageKind::kInt2;
  }
  t0 = Clock::now();
  auto stored = (*c)->Store(*codec, writes);
  if (!stored.ok()) return ServiceFail("storing", stored.status());
  if (stored->failed) return ServiceFail("storing", stored->item_status[0]);
  std::printf("request A: %u tokens -> %zu block keys; stored %u pages (%d INT2, %zu BF16), "
              "%.2f MB in %.2f ms\n",
              n, keys_a.size(), stored->stored, int2, keys_a.size() - int2, bytes_a / 1e6,
              Ms(Clock::now() - t0));

  // Request B: the same system prompt / document prefix, then its own question.
  const uint32_t shared = n * 11 / 16 - 4;  // not block-aligned on purpose
  auto tokens_b = tokens_a;
  for (uint32_t i = shared; i < n; ++i) tokens_b[i] = (tokens_b[i] * 31 + 7) % 151936;
  const auto keys_b = client::Client::BlockKeys(*codec, tokens_b);
  t0 = Clock::now();
  auto hit = (*c)->Lookup(*codec, keys_b);
  const double lookup_ms = Ms(Clock::now() - t0);
  if (!hit.ok()) return ServiceFail("lookup", hit.status());
  std::printf("request B: shares the first %u tokens with A; lookup of %zu keys -> %u blocks "
              "cached (%u tokens) in %.3f ms\n",
              shared, keys_b.size(), hit->matched, hit->matched * cp.page_tokens, lookup_ms);

  t0 = Clock::now();
  auto loaded = (*c)->Load(*codec, std::span(keys_b).first(hit->matched));
  const double load_ms = Ms(Clock::now() - t0);
  if (!loaded.ok()) return ServiceFail("load", loaded.status());
  bool identical = loaded->matched == hit->matched;
  for (uint32_t i = 0; identical && i < loaded->matched; ++i) {
    identical = loaded->pages[i] == seq.pages[i];
  }
  std::printf("load: %u pages, %.2f MB in %.2f ms (%.2f GB/s), checksums verified, "
              "byte-identical to A's pages: %s\n",
              loaded->matched, loaded->bytes / 1e6, load_ms, loaded->bytes / 1e6 / load_ms,
              identical ? "yes" : "NO");
  // Attention over the fetched prefix equals attention over A's own pages for that prefix.
  std::vector<std::span<const uint8_t>> mine(seq.pages.begin(), seq.pages.begin() + loaded->matched);
  std::vector<std::span<const uint8_t>> fetched(loaded->pages.begin(), loaded->pages.end());
  auto att_a = ReferenceDecodeAttention(cp, rot, mine, 0, q, qheads, true);
  auto att_b = ReferenceDecodeAttention(cp, rot, fetched, 0, q, qheads, true);
  const bool same_attention = att_a.ok() && att_b.ok() && att_a->out == att_b->out;
  std::printf("attention of B's query over the fetched pages == over A's pages: %s\n",
              same_attention ? "yes" : "NO");

  auto again = (*c)->Store(*codec, writes);
  if (!again.ok()) return ServiceFail("storing again", again.status());
  std::printf("storing A again: %u stored, %u deduplicated\n", again->stored, again->deduplicated);
  auto stats = (*c)->GetStats();
  if (!stats.ok()) return ServiceFail("stats", stats.status());
  std::printf("daemon: %llu pages, %.2f of %llu MiB used, %llu keys hit, %llu missed, %llu leases\n",
              (unsigned long long)stats->pages, stats->pool_used_bytes / double(1 << 20),
              (unsigned long long)(stats->pool_bytes >> 20), (unsigned long long)stats->hits,
              (unsigned long long)stats->misses, (unsigned long long)stats->leases);
  c->reset();
  auto code = (*daemon)->Stop();
  if (!code.ok() || *code != 0) {
    std::fprintf(stderr, "oscarkv demo: oscarkvd did not stop cleanly (%s); log: %s\n",
                 code.ok() ? absl::StrCat("exit ", *code).c_str() : code.status().ToString().c_str(),
                 log_path.c_str());
    return 1;
  }
  std::printf("oscarkvd stopped cleanly (SIGTERM, exit 0)\n");
  ::unlink(log_path.c_str());
  return identical && same_attention && again->deduplicated == keys_a.size() ? 0 : 1;
}
#endif

int RunDemo(int argc, char** argv) {
  Args args("demo",
            "Runs the OSCAR INT2 page codec on a synthetic outlier-channel workload, then starts "
            "oscarkvd and drives it through the client library: store, shared-prefix lookup, "
            "load, byte-identical check; then a prefill->decode handoff through two daemons on two\n"
            "hosts, checked against a single-process run. The handoff uses the reference model\n"
            "($OSCARKV_REFMODEL, or ../shared/refmodel) when found, else a small random-weight\n"
            "Qwen3-style checkpoint written to a temporary folder (gibberish text, same checks).\n"
            "Exit codes: 0 every check passed, 1 a check or an operation failed, 2 usage.");
  args.Option("tokens", "1024", "sequence length (request A)");
  args.Option("daemon", "", "oscarkvd binary (default: next to this oscarkv, or $OSCARKVD)");
  args.Flag("codec-only", "only the codec part (no daemon)");
#ifdef OSCARKV_DEMO_HAS_PD
  args.Flag("no-pd", "skip the prefill->decode handoff part (oscarkv pd demo runs it alone)");
  args.Flag("random-model", "run the handoff on the random-weight checkpoint even when the "
                            "reference model is found");
#endif
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  auto tokens = args.integer("tokens");
  if (!tokens.ok() || *tokens < 384 || *tokens > 65536) {
    std::fprintf(stderr, "oscarkv demo: --tokens must be 384..65536\n");
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

  std::mt19937 rng(7);
  std::normal_distribution<float> n;
  const uint32_t qheads = 8;
  std::vector<float> q(qheads * d);
  for (auto& v : q) v = n(rng) * 0.3f;
  const auto eye = RotationSet::Identity(L, H, d);
  const AttentionOutput want = DenseDecodeAttention(p, eye, w.view, 0, q, qheads, true);

  std::printf("%-34s %12s %12s %14s %14s\n", "codec", "bytes", "vs BF16", "K rel.err", "attn rel.err");
  CodecProfile service_profile;
  SequencePages service_pages;
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
    if (c.windows) {
      service_profile = cp;
      service_pages = *std::move(sp);
    }
  }
  std::printf("\n(bytes include page headers and the BF16 sink/recent pages where used)\n");
  if (args.flag("codec-only")) return 0;
#ifdef OSCARKV_DEMO_HAS_CLIENT
  // Only full blocks have keys: drop a trailing partial page.
  while (!service_pages.plan.empty() &&
         service_pages.plan.back().token_count < service_profile.page_tokens) {
    service_pages.plan.pop_back();
    service_pages.pages.pop_back();
  }
  const int service_rc = RunServiceDemo(w, service_profile, codecs.back().rot, service_pages,
                                        args.str("daemon"), q, qheads);
#ifdef OSCARKV_DEMO_HAS_PD
  if (service_rc != 0 || args.flag("no-pd")) return service_rc;
  std::printf("\n== prefill -> decode handoff through two daemons ==\n");
  return RunPdDemoSection(768, 24, args.flag("random-model"));
#else
  return service_rc;
#endif
#else
  std::printf("\n(the service part needs the client module; this build has none)\n");
  return 0;
#endif
}

OSCARKV_COMMAND("demo", "the main job: codec report, oscarkvd + client library, P/D handoff",
                RunDemo);

}  // namespace
}  // namespace oscarkv::cli
