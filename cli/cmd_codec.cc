// `oscarkv codec`: page sizes and compression ratio for a model shape, measured from the bytes
// the page writer produces.
#include <cstdio>
#include <random>
#include <string>

#include "command.h"
#include "nlohmann/json.hpp"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/util/args.h"

namespace oscarkv::cli {

#if __has_include("oscarkv/client/client.h")
int RunCodecUnregister(int argc, char** argv);  // cmd_ops.cc
#endif

namespace {

int RunCodec(int argc, char** argv) {
#if __has_include("oscarkv/client/client.h")
  // `oscarkv codec unregister ...`: removes a registration from a running oscarkvd.
  if (argc > 1 && std::string(argv[1]) == "unregister") return RunCodecUnregister(argc - 1, argv + 1);
#endif
  Args args("codec", "Writes one INT2 and one BF16 page for a model shape and reports their sizes. "
                     "`oscarkv codec unregister --help`: remove a codec registration from oscarkvd.");
  args.Option("shape", "qwen3-8b", "model shape: qwen3-8b or refmodel")
      .Option("page-tokens", "64", "tokens per page (16..256, multiple of 16)")
      .Option("group", "128", "quantization group size (32, 64 or 128)")
      .Flag("json", "print JSON (int2_page_bytes, bf16_page_bytes, ratio, ...)");
  if (auto rc = args.ParseOrExitCode(argc, argv)) return *rc;
  auto profile = BuiltinProfile(args.str("shape"));
  auto page_tokens = args.integer("page-tokens");
  auto group = args.integer("group");
  for (const absl::Status& s : {profile.status(), page_tokens.status(), group.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "oscarkv codec: %s\n", std::string(s.message()).c_str());
      return 2;
    }
  }
  profile->page_tokens = static_cast<uint32_t>(*page_tokens);
  profile->group_size = static_cast<uint32_t>(*group);
  if (absl::Status s = profile->Validate(); !s.ok()) {
    std::fprintf(stderr, "oscarkv codec: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const CodecProfile& p = *profile;
  // Real pages from random rows, so the sizes are those of bytes actually written.
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  std::vector<float> kv(size_t{p.num_layers} * 2 * p.page_tokens * p.num_kv_heads * p.head_dim);
  for (auto& v : kv) v = n(rng);
  KVSequenceView view{kv.data(), p.num_layers, p.num_kv_heads, p.head_dim, p.page_tokens};
  auto int2 = EncodePage(p, nullptr, PageKind::kInt2, view, 0, p.page_tokens);
  auto bf16 = EncodePage(p, nullptr, PageKind::kBf16, view, 0, p.page_tokens);
  if (!int2.ok() || !bf16.ok()) {
    std::fprintf(stderr, "oscarkv codec: %s\n",
                 std::string((int2.ok() ? bf16.status() : int2.status()).message()).c_str());
    return 1;
  }
  const double ratio = static_cast<double>(bf16->size()) / static_cast<double>(int2->size());
  const double elems = double(p.num_layers) * 2 * p.num_kv_heads * p.page_tokens * p.head_dim;
  const double bits = 8.0 * (int2->size() - kPageHeaderBytes) / elems;
  if (args.flag("json")) {
    nlohmann::json j = {{"shape", args.str("shape")},
                        {"codec_id", p.Id().Hex()},
                        {"layers", p.num_layers},
                        {"kv_heads", p.num_kv_heads},
                        {"head_dim", p.head_dim},
                        {"page_tokens", p.page_tokens},
                        {"group_size", p.group_size},
                        {"int2_page_bytes", int2->size()},
                        {"bf16_page_bytes", bf16->size()},
                        {"ratio", ratio},
                        {"int2_bits_per_element", bits}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("shape %s: %u layers x K,V x %u KV heads x %u tokens x head_dim %u, group %u\n",
              args.str("shape").c_str(), p.num_layers, p.num_kv_heads, p.page_tokens, p.head_dim,
              p.group_size);
  std::printf("codec id           %s\n", p.Id().Hex().c_str());
  std::printf("INT2 page          %10zu bytes (%.3f bits/element incl. fp16 scale+min)\n",
              int2->size(), bits);
  std::printf("BF16 page          %10zu bytes\n", bf16->size());
  std::printf("ratio              %10.3fx\n", ratio);
  return 0;
}

OSCARKV_COMMAND("codec", "page sizes and compression ratio for a model shape; `codec unregister`: remove a registration from oscarkvd", RunCodec);

}  // namespace
}  // namespace oscarkv::cli
