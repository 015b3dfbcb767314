// Helpers shared by the `oscarkv pd` commands: the daemon handoff (cmd_pd.cc) and the same-node
// GPU->GPU handoff (cmd_pd_gpu.cc). Both need only the engine side of pd/ (engine_codec.h), so
// every includer guards on __has_include("oscarkv/pd/gpu_handoff.h") first.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "command.h"
#include "nlohmann/json.hpp"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/pd/engine_codec.h"
#include "oscarkv/util/args.h"
#include "oscarkv/util/refmodel.h"

// Helpers of both the daemon handoff and the GPU handoff commands.
namespace oscarkv::cli::pdcli {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

inline int Fail(const std::string& cmd, const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "oscarkv %s: %s\n", cmd.c_str(), std::string(s.message()).c_str());
  return code;
}

inline constexpr char kDefaultPrompt[] =
    "PostgreSQL provides three independent approaches to pattern matching: the traditional SQL "
    "LIKE operator, the more recent SIMILAR TO operator, and POSIX-style regular expressions. "
    "Aside from the basic \"does this string match this pattern?\" operators, functions are "
    "available to extract or replace matching substrings and to split a string at matching "
    "locations. The LIKE expression returns true if the string matches the supplied pattern. ";

// --model, else $OSCARKV_REFMODEL, else util's FindRefModel (../shared/refmodel above the working
// directory), else shared/refmodel above the binary's own folder.
inline std::string ResolveModel(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("OSCARKV_REFMODEL")) return env;
  if (std::string found = FindRefModel(); !found.empty()) return found;
  std::vector<std::filesystem::path> candidates;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (auto p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
      candidates.push_back(p / "shared/refmodel");
    }
  }
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c / "config.json")) return std::filesystem::absolute(c).string();
  }
  return "";
}

inline void AddCodecOptions(Args& args, const std::string& page, const std::string& sink,
                     const std::string& recent) {
  args.Option("model", "",
              "HF Qwen3-style checkpoint (default: $OSCARKV_REFMODEL or ../shared/refmodel)")
      .Option("page-tokens", page, "tokens per page")
      .Option("sink", sink, "BF16 sink tokens")
      .Option("recent", recent, "BF16 recent-window tokens")
      .Option("rotation", "hadamard", "hadamard or identity");
}

inline absl::StatusOr<pd::CodecOptions> CodecOptionsFrom(const Args& args) {
  pd::CodecOptions o;
  auto page = args.integer("page-tokens"), sink = args.integer("sink"),
       recent = args.integer("recent");
  for (const auto* s : {&page, &sink, &recent}) {
    if (!s->ok()) return s->status();
  }
  o.page_tokens = *page;
  o.sink_tokens = *sink;
  o.recent_tokens = *recent;
  o.rotation = args.str("rotation");
  return o;
}

struct Loaded {
  std::unique_ptr<engine::Model> model;
  pd::EngineCodec codec;
};

inline absl::StatusOr<Loaded> LoadModelAndCodec(const Args& args) {
  const std::string dir = ResolveModel(args.str("model"));
  if (dir.empty()) {
    return absl::NotFoundError(
        "no model: pass --model DIR or set OSCARKV_REFMODEL (the reference model lives in "
        "../shared/refmodel)");
  }
  auto o = CodecOptionsFrom(args);
  if (!o.ok()) return o.status();
  Loaded l;
  auto m = engine::Model::Load(dir);
  if (!m.ok()) return m.status();
  l.model = std::move(*m);
  auto c = pd::MakeEngineCodec(l.model->config(), *o);
  if (!c.ok()) return c.status();
  l.codec = std::move(*c);
  return l;
}

inline std::string Mib(uint64_t b) {
  if (b < 10 * 1024) return absl::StrCat(b, " B");
  if (b < 1024 * 1024) return absl::StrFormat("%.1f KiB", b / 1024.0);
  return absl::StrFormat("%.2f MiB", b / 1048576.0);
}

}  // namespace oscarkv::cli::pdcli
