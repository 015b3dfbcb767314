// oscarkv_kv_dump: runs the reference engine (CPU) over the start of the reference model's
// val.txt and writes the post-RoPE K/V (bf16) of two layers plus the last position's queries
// (fp32) -- the "real K/V" input of the GPU kernel tests (bench/testdata/refmodel_kv.bin).
//
// File layout (little-endian): "OKVDUMP1", u32 layers, tokens, num_q_heads, num_kv_heads,
// head_dim; then per layer: u32 layer index, K [tokens][kv_heads][d] bf16 bits,
// V likewise, Q of the last position [q_heads][d] fp32.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "oscarkv/engine/attention.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/kernels/numeric.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: oscarkv_kv_dump <refmodel dir> <out.bin> [tokens=700]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int tokens = argc > 3 ? std::atoi(argv[3]) : 700;
  auto model = oscarkv::engine::Model::Load(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "load: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::ifstream val(dir + "/val.txt", std::ios::binary);
  std::vector<int32_t> ids;
  char c;
  while (static_cast<int>(ids.size()) < tokens && val.get(c)) ids.push_back(static_cast<uint8_t>(c));
  const auto& cfg = (*model)->config();
  const uint32_t layers[2] = {0, cfg.num_layers - 1};
  std::vector<std::vector<uint16_t>> k(2), v(2);
  std::vector<std::vector<float>> q(2);
  auto observer = [&](const oscarkv::engine::AttentionInputs& in) {
    for (int i = 0; i < 2; ++i) {
      if (in.layer != layers[i]) continue;
      const size_t n = size_t{in.tokens} * in.num_kv_heads * in.head_dim;
      k[i].resize(n);
      v[i].resize(n);
      for (size_t j = 0; j < n; ++j) {
        k[i][j] = oscarkv::FloatToBf16(in.k[j]);
        v[i][j] = oscarkv::FloatToBf16(in.v[j]);
      }
      const size_t qn = size_t{in.num_q_heads} * in.head_dim;
      q[i].assign(in.q + (in.tokens - 1) * qn, in.q + in.tokens * qn);
    }
  };
  oscarkv::engine::MixedPrecisionAttention backend(oscarkv::engine::KvCodec::Bf16());
  std::vector<float> logits;
  if (auto s = (*model)->Forward(ids, backend, &logits, observer); !s.ok()) {
    std::fprintf(stderr, "forward: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::ofstream out(argv[2], std::ios::binary);
  out.write("OKVDUMP1", 8);
  const uint32_t hdr[5] = {2, static_cast<uint32_t>(ids.size()), cfg.num_q_heads, cfg.num_kv_heads,
                           cfg.head_dim};
  out.write(reinterpret_cast<const char*>(hdr), sizeof hdr);
  for (int i = 0; i < 2; ++i) {
    out.write(reinterpret_cast<const char*>(&layers[i]), 4);
    out.write(reinterpret_cast<const char*>(k[i].data()), k[i].size() * 2);
    out.write(reinterpret_cast<const char*>(v[i].data()), v[i].size() * 2);
    out.write(reinterpret_cast<const char*>(q[i].data()), q[i].size() * 4);
  }
  std::printf("wrote %s: %zu tokens, layers %u and %u\n", argv[2], ids.size(), layers[0], layers[1]);
  return out ? 0 : 1;
}
