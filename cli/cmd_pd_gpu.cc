// `oscarkv pd gpu-handoff`: the same-node GPU->GPU handoff (CUDA IPC, NCCL) between a prefill
// process on GPU 0 and a decode process on GPU 1 of this host (both this binary, `pd
// gpu-handoff-worker`), joined by a socketpair (pd/gpu/include/oscarkv/pd/gpu_handoff.h). It
// needs only the engine (no client), so a slim build without gRPC/UCX has it.
#if __has_include("oscarkv/pd/gpu_handoff.h")
#include <sys/socket.h>
#include <unistd.h>

#include <map>

#include "absl/strings/str_split.h"
#include "oscarkv/engine/decode.h"
#include "oscarkv/pd/gpu_handoff.h"
#include "oscarkv/testing/stage_hooks.h"
#include "oscarkv/util/subprocess.h"
#include "pd_common.h"

namespace oscarkv::cli {
namespace {

using namespace pdcli;  // NOLINT(build/namespaces): the shared pd command helpers

void AddGpuHandoffOptions(Args& args) {
  args.Option("synthetic", "",
              "synthetic pages of this shape (qwen3-8b, refmodel) instead of a real model's")
      .Option("context", "32768", "tokens of the synthetic request")
      .Option("prompt-bytes", "1024", "model mode: prompt length, from the model's val.txt")
      .Option("tokens", "32", "model mode: tokens the decode side generates after the handoff")
      .Option("mechanisms", "ipc,nccl", "comma list of ipc, nccl")
      .Option("reps", "20", "timed repetitions per request and mechanism")
      .Option("warmup", "3", "untimed repetitions first")
      .Option("prefill-device", "0", "GPU of the prefill process")
      .Option("decode-device", "1", "GPU of the decode process")
      .Option("timeout-ms", "30000", "bound of every step; a dead peer is noticed at once")
      .Option("die", "",
              "failure injection: prefill:hello|ipc-offer|nccl-send or "
              "decode:ipc-copy|nccl-recv (that process kills itself there)")
      .Flag("json", "print one JSON object last");
  AddCodecOptions(args, "64", "64", "256");
}

struct GpuSetup {
  CodecProfile profile;
  std::unique_ptr<engine::Model> model;  // model mode
  pd::EngineCodec codec;
  std::string model_dir;
};

absl::StatusOr<GpuSetup> SetupGpuHandoff(const Args& args) {
  GpuSetup s;
  if (!args.str("synthetic").empty()) {
    auto p = BuiltinProfile(args.str("synthetic"));
    if (!p.ok()) return p.status();
    s.profile = *p;
    return s;
  }
  s.model_dir = ResolveModel(args.str("model"));
  auto l = LoadModelAndCodec(args);
  if (!l.ok()) return l.status();
  s.model = std::move(l->model);
  s.codec = std::move(l->codec);
  s.profile = s.codec.profile;
  return s;
}

std::vector<int32_t> GpuPrompt(const GpuSetup& s, uint32_t bytes) {
  std::string text;
  std::ifstream f(s.model_dir + "/val.txt", std::ios::binary);
  if (f) {
    text.resize(bytes);
    f.read(text.data(), bytes);
    text.resize(f.gcount());
  }
  while (text.size() < bytes) text += kDefaultPrompt;
  text.resize(bytes);
  return pd::BytesToTokens(text);
}

void WriteResult(const std::string& path, const Json& j) {
  std::ofstream(path) << j.dump() << "\n";
}

// The worker: `--role prefill|decode --fd N --result FILE` plus the driver's options.
int RunGpuHandoffWorker(int argc, char** argv) {
  Args args("pd gpu-handoff-worker", "One side of `oscarkv pd gpu-handoff` (started by it).");
  AddGpuHandoffOptions(args);
  args.Option("role", "", "prefill or decode")
      .Option("fd", "", "control socket")
      .Option("result", "", "write the JSON result here");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  ::signal(SIGPIPE, SIG_IGN);  // a dead peer is an error status, not a signal
  const std::string role = args.str("role"), cmd = "pd gpu-handoff " + role;
  auto fd = args.integer("fd"), timeout = args.integer("timeout-ms"), reps = args.integer("reps"),
       warmup = args.integer("warmup"), context = args.integer("context"),
       pbytes = args.integer("prompt-bytes"), ntok = args.integer("tokens"),
       pdev = args.integer("prefill-device"), ddev = args.integer("decode-device");
  for (const auto* v : {&fd, &timeout, &reps, &warmup, &context, &pbytes, &ntok, &pdev, &ddev}) {
    if (!v->ok()) return Fail(cmd, v->status(), 2);
  }
  std::string die_side, die_stage;
  if (const std::string d = args.str("die"); !d.empty()) {
    std::pair<std::string, std::string> p = absl::StrSplit(d, absl::MaxSplits(':', 1));
    die_side = p.first;
    die_stage = p.second;
  }
  const std::string die = die_side == role ? die_stage : "";
  Json result = {{"role", role}, {"ok", false}};
  auto setup = SetupGpuHandoff(args);
  if (!setup.ok()) return WriteResult(args.str("result"), result), Fail(cmd, setup.status());
  const CodecProfile& profile = setup->profile;

  if (role == "prefill") {
    std::vector<pd::gpu::HostRequest> requests;
    const auto t0 = Clock::now();
    if (setup->model) {
      const std::vector<int32_t> prompt = GpuPrompt(*setup, *pbytes);
      auto dec = engine::Decoder::Create(*setup->model, profile, setup->codec.rotations,
                                         prompt.size() + 1);
      if (!dec.ok()) return Fail(cmd, dec.status());
      if (auto s = (*dec)->Prefill(prompt); !s.ok()) return Fail(cmd, s);
      const SequencePages pages = (*dec)->pages();
      auto first = (*dec)->Step();
      if (!first.ok()) return Fail(cmd, first.status());
      pd::gpu::HostRequest r;
      r.layout = pd::gpu::PlanLayout(profile, pages.plan, "model");
      r.layout.tokens = prompt;
      r.layout.tokens.push_back(*first);
      r.layout.prompt_tokens = prompt.size();
      r.bytes.resize(r.layout.total_bytes);
      if (auto s = pd::gpu::PackPages(pages, r.layout, r.bytes); !s.ok()) return Fail(cmd, s);
      requests.push_back(std::move(r));
    } else {
      const uint32_t n = *context;
      const std::vector<std::vector<PlannedPage>> plans = {PlanSequencePages(profile, n),
                                                           pd::gpu::AllBf16Plan(profile, n)};
      const char* names[] = {"int2", "bf16"};
      for (int i = 0; i < 2; ++i) {
        pd::gpu::HostRequest r;
        r.layout = pd::gpu::PlanLayout(profile, plans[i], names[i]);
        r.bytes.resize(r.layout.total_bytes);
        if (auto s = pd::gpu::FillSynthetic(profile, r.layout, r.bytes, 42 + i); !s.ok()) {
          return Fail(cmd, s);
        }
        requests.push_back(std::move(r));
      }
    }
    result["prepare_ms"] = MsSince(t0);
    pd::gpu::ServeOptions o;
    o.device = *pdev;
    o.timeout_ms = *timeout;
    o.nccl = args.str("mechanisms").find("nccl") != std::string::npos;
    o.on_stage = testing::KillAtStage(die, "gpu-handoff prefill");
    auto st = pd::gpu::ServePrefill(*fd, std::move(requests), o);
    if (!st.ok()) {
      result["error"] = st.status().ToString();
      WriteResult(args.str("result"), result);
      return Fail(cmd, st.status());
    }
    result["ok"] = true;
    result["uploaded_bytes"] = st->uploaded_bytes;
    result["upload_ms"] = st->upload_ms;
    result["nccl_init_ms"] = st->nccl_init_ms;
    result["served_ipc"] = st->served_ipc;
    result["served_nccl"] = st->served_nccl;
    WriteResult(args.str("result"), result);
    return 0;
  }
  if (role != "decode") return Fail(cmd, absl::InvalidArgumentError("--role prefill|decode"), 2);
  pd::gpu::DecodeOptions o;
  o.device = *ddev;
  o.source_device = *pdev;
  o.timeout_ms = *timeout;
  o.mechanisms = absl::StrSplit(args.str("mechanisms"), ',', absl::SkipEmpty());
  o.reps = *reps;
  o.warmup = *warmup;
  o.on_stage = testing::KillAtStage(die, "gpu-handoff decode");
  Json generated = Json::object();
  auto on_verified = [&](const pd::gpu::RequestLayout& layout, const std::string& mech,
                         std::span<const uint8_t> host) -> absl::Status {
    if (!setup->model) return absl::OkStatus();
    // The engine is CPU: resume from the received pages (copied back to host) and generate.
    const SequencePages pages = pd::gpu::UnpackPages(layout, host);
    auto dec = engine::Decoder::Create(*setup->model, profile, setup->codec.rotations,
                                       layout.tokens.size() + *ntok + 1);
    if (!dec.ok()) return dec.status();
    if (auto s = (*dec)->Resume(layout.tokens, pages); !s.ok()) return s;
    auto more = (*dec)->Generate(*ntok);
    if (!more.ok()) return more.status();
    std::vector<int32_t> g = {layout.tokens.back()};
    g.insert(g.end(), more->begin(), more->end());
    generated[mech] = g;
    return absl::OkStatus();
  };
  auto st = pd::gpu::RunDecode(*fd, profile, o, on_verified);
  if (!st.ok()) {
    result["error"] = st.status().ToString();
    WriteResult(args.str("result"), result);
    return Fail(cmd, st.status());
  }
  result["ok"] = true;
  result["ipc_open_ms"] = st->ipc_open_ms;
  result["nccl_init_ms"] = st->nccl_init_ms;
  result["generated"] = generated;
  Json samples = Json::array();
  for (const auto& s : st->samples) {
    samples.push_back({{"request", s.request},
                       {"mechanism", s.mechanism},
                       {"bytes", s.bytes},
                       {"wall_ms", s.wall_ms},
                       {"gpu_ms", s.gpu_ms},
                       {"verified", s.verified}});
  }
  result["samples"] = samples;
  WriteResult(args.str("result"), result);
  return 0;
}

struct Child {
  std::unique_ptr<Subprocess> process;
  bool done = false;
  double ms = 0;
  std::string DescribeExit() const {
    return done ? process->DescribeExit() : "still running (killed)";
  }
  bool Succeeded() const { return done && process->exit_code() == 0; }
};

int RunGpuHandoff(int argc, char** argv) {
  Args args(
      "pd gpu-handoff",
      "Same-node GPU->GPU prefill->decode handoff: a prefill process holds a request's pages\n"
      "(BF16 sink, INT2 history, BF16 tail) in GPU memory, a decode process on another GPU\n"
      "pulls them by CUDA IPC (peer copy from the prefill's buffer) and by NCCL send/recv,\n"
      "verifies every page's XXH3 checksum, and (model mode) resumes and generates on the\n"
      "reference engine; the driver compares that with a single-process run. With\n"
      "--synthetic, times INT2 pages vs all-BF16 pages of the same tokens per mechanism\n"
      "beside cudaMemcpyPeerAsync of the same bytes (medians of --reps).");
  AddGpuHandoffOptions(args);
  args.Epilog(
      "examples:\n  oscarkv pd gpu-handoff --synthetic qwen3-8b --context 32768 --reps 30\n"
      "  oscarkv pd gpu-handoff --model refmodel --prompt-bytes 1024 --tokens 32\n"
      "needs two CUDA devices; NCCL_NVLS_ENABLE is set to 0 unless given.");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  auto timeout = args.integer("timeout-ms"), ntok = args.integer("tokens"),
       pbytes = args.integer("prompt-bytes");
  if (!timeout.ok() || !ntok.ok() || !pbytes.ok() || *timeout < 100) {
    return Fail("pd gpu-handoff", absl::InvalidArgumentError("bad --timeout-ms/--tokens"), 2);
  }
  const pd::gpu::Capabilities caps = pd::gpu::Probe();
  if (!caps.cuda || caps.devices < 2) {
    return Fail("pd gpu-handoff",
                absl::FailedPreconditionError(
                    absl::StrCat("needs two CUDA devices; found ", caps.devices,
                                 caps.cuda ? "" : " (built without the CUDA runtime)",
                                 caps.note.empty() ? "" : absl::StrCat(" (", caps.note, ")"))));
  }
  if (!std::getenv("NCCL_NVLS_ENABLE")) ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  const bool json = args.flag("json");
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Fail("pd gpu-handoff", absl::InternalError("socketpair failed"));
  }
  const std::string base = absl::StrCat(std::filesystem::temp_directory_path().string(),
                                        "/oscarkv-gpu-handoff-", ::getpid());
  const char* roles[] = {"prefill", "decode"};
  Child child[2];
  const auto t0 = Clock::now();
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> wargv = {"oscarkv", "pd", "gpu-handoff-worker"};
    for (int a = 1; a < argc; ++a) {
      if (std::string(argv[a]) != "--json") wargv.push_back(argv[a]);
    }
    for (std::string x :
         {std::string("--role"), std::string(roles[i]), std::string("--fd"), std::to_string(sv[i]),
          std::string("--result"), absl::StrCat(base, "-", roles[i], ".json")}) {
      wargv.push_back(x);
    }
    // The child keeps its end of the socketpair across exec; the other end is close-on-exec.
    SpawnOptions so(wargv);
    so.program = "/proc/self/exe";
    so.inherit_fds = {sv[i]};
    auto p = Subprocess::Spawn(so);
    if (!p.ok()) return Fail("pd gpu-handoff", p.status());
    child[i].process = std::move(*p);
  }
  ::close(sv[0]);
  ::close(sv[1]);
  // Each side bounds its own steps; the driver only guards against a hang of the whole thing.
  const int64_t limit_ms = 3 * *timeout + 60000;
  bool hung = false;
  while (!(child[0].done && child[1].done)) {
    for (Child& c : child) {
      if (!c.done && !c.process->Running()) {
        c.done = true;
        c.ms = MsSince(t0);
      }
    }
    if (MsSince(t0) > limit_ms) {
      hung = true;
      for (Child& c : child) {
        if (!c.done) c.process->Kill();
      }
      break;
    }
    ::usleep(2000);
  }
  Json side[2];
  for (int i = 0; i < 2; ++i) {
    std::ifstream f(absl::StrCat(base, "-", roles[i], ".json"));
    std::stringstream ss;
    ss << f.rdbuf();
    side[i] = Json::parse(ss.str(), nullptr, false);
    if (side[i].is_discarded()) side[i] = Json::object();
    std::filesystem::remove(absl::StrCat(base, "-", roles[i], ".json"));
    side[i]["exit"] = child[i].DescribeExit();
    side[i]["exit_ms"] = child[i].ms;
  }
  bool ok = !hung && child[0].Succeeded() && child[1].Succeeded();
  Json out = {{"ok", ok},
              {"hung", hung},
              {"prefill", side[0]},
              {"decode", side[1]},
              {"nccl_version", caps.nccl_version}};
  std::printf(
      "pd gpu-handoff: prefill on GPU %s (%s after %.0f ms), decode on GPU %s (%s after "
      "%.0f ms)%s\n",
      args.str("prefill-device").c_str(), child[0].DescribeExit().c_str(), child[0].ms,
      args.str("decode-device").c_str(), child[1].DescribeExit().c_str(), child[1].ms,
      hung ? " -- HUNG, killed" : "");
  for (int i = 0; i < 2; ++i) {
    if (side[i].contains("error")) {
      std::printf("  %s error: %s\n", roles[i], side[i]["error"].get<std::string>().c_str());
    }
  }
  if (ok) {
    const Json& d = side[1];
    std::printf(
        "  setup: upload %.1f ms, IPC open %.2f ms, NCCL init %.0f ms (prefill) / %.0f ms "
        "(decode)\n",
        side[0].value("upload_ms", 0.0), d.value("ipc_open_ms", 0.0),
        side[0].value("nccl_init_ms", 0.0), d.value("nccl_init_ms", 0.0));
    std::printf("  %-8s %-5s %12s %9s %12s %12s %9s %9s\n", "request", "mech", "MiB", "verified",
                "wall ms", "gpu ms", "GB/s", "vs peer");
    std::map<std::string, double> peer_gpu;
    struct Med {
      uint64_t bytes;
      double wall, gpu;
    };
    std::map<std::pair<std::string, std::string>, Med> med;
    Json summary = Json::array();
    for (const Json& s : d["samples"]) {
      const std::string req = s["request"], mech = s["mechanism"];
      const double wall = pd::gpu::Median(s["wall_ms"].get<std::vector<double>>());
      const double gpu = pd::gpu::Median(s["gpu_ms"].get<std::vector<double>>());
      const uint64_t bytes = s["bytes"];
      if (mech == "peer") peer_gpu[req] = gpu;
      med[{req, mech}] = {bytes, wall, gpu};
      const double bound = peer_gpu.count(req) ? peer_gpu[req] : 0;
      std::printf("  %-8s %-5s %12s %9s %12.3f %12.3f %9.1f %8.2fx\n", req.c_str(), mech.c_str(),
                  Mib(bytes).c_str(),
                  mech == "peer" ? "-" : (s["verified"].get<bool>() ? "yes" : "NO"), wall, gpu,
                  gpu > 0 ? bytes / gpu / 1e6 : 0.0, bound > 0 ? gpu / bound : 0.0);
      summary.push_back({{"request", req},
                         {"mechanism", mech},
                         {"bytes", bytes},
                         {"median_wall_ms", wall},
                         {"median_gpu_ms", gpu},
                         {"reps", s["wall_ms"].size()},
                         {"verified", s["verified"]}});
      if (mech != "peer" && !s["verified"].get<bool>()) ok = false;
    }
    out["summary"] = summary;
    if (med.count({"int2", "peer"}) && med.count({"bf16", "peer"})) {
      const double ratio = double(med[{"bf16", "peer"}].bytes) / med[{"int2", "peer"}].bytes;
      out["handoff_bytes_ratio"] = ratio;
      std::printf("  INT2 request moves %.2fx fewer bytes than all-BF16 pages\n", ratio);
      for (const char* m : {"peer", "ipc", "nccl"}) {
        if (!med.count({"int2", m}) || !med.count({"bf16", m})) continue;
        const Med &i2 = med[{"int2", m}], &bf = med[{"bf16", m}];
        const double sp = bf.wall / i2.wall, spg = bf.gpu / i2.gpu;
        out[absl::StrCat("handoff_speedup_int2_vs_bf16_", m)] = sp;
        out[absl::StrCat("handoff_speedup_int2_vs_bf16_", m, "_gpu")] = spg;
        std::printf("  %-5s INT2 vs BF16: %.2fx less wall time, %.2fx less GPU time\n", m, sp, spg);
      }
    }
    if (d.contains("generated") && !d["generated"].empty()) {
      auto setup = SetupGpuHandoff(args);
      if (!setup.ok()) return Fail("pd gpu-handoff", setup.status());
      const std::vector<int32_t> prompt = GpuPrompt(*setup, *pbytes);
      auto ref = pd::ReferenceGenerate(*setup->model, setup->codec, prompt, *ntok);
      if (!ref.ok()) return Fail("pd gpu-handoff", ref.status());
      std::printf("  reference (1 process): \"%s\"\n", pd::TokensToText(*ref).c_str());
      for (const auto& [mech, toks] : d["generated"].items()) {
        const bool eq = toks.get<std::vector<int32_t>>() == *ref;
        out["equal_" + mech] = eq;
        ok = ok && eq;
        std::printf("  decode after %-4s    : \"%s\" -> %s\n", mech.c_str(),
                    pd::TokensToText(toks.get<std::vector<int32_t>>()).c_str(),
                    eq ? "equal" : "MISMATCH");
      }
    }
  }
  out["ok"] = ok;
  if (json) std::printf("%s\n", out.dump().c_str());
  return ok ? 0 : 1;
}

OSCARKV_COMMAND("pd gpu-handoff",
                "P/D: same-node GPU->GPU handoff by CUDA IPC and NCCL (2 GPUs), vs peer copy",
                RunGpuHandoff);
OSCARKV_COMMAND("pd gpu-handoff-worker", "P/D: one side of pd gpu-handoff (internal)",
                RunGpuHandoffWorker);

}  // namespace
}  // namespace oscarkv::cli
#endif
