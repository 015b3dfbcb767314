#include "bench_pages.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/page_codec.h"

namespace oscarkv::bench {

CodecProfile TinyBenchProfile(const std::string& model_id) {
  CodecProfile p;
  p.model_id = model_id;
  p.model_revision = "r1";
  p.num_layers = 1;
  p.num_kv_heads = 1;
  p.head_dim = 64;
  p.page_tokens = 16;
  p.group_size = 32;
  p.sink_tokens = 16;
  p.recent_tokens = 32;
  return p;
}

absl::Status FillWithPages(const CodecProfile& p, PageKind kind, std::span<uint8_t> dst,
                           size_t count, size_t distinct, uint32_t seed) {
  const size_t bytes = GeometryFor(p, kind).page_bytes();
  if (distinct == 0 || dst.size() / bytes < count) {
    return absl::InvalidArgumentError(absl::StrCat("FillWithPages: ", count, " pages of ", bytes,
                                                   " B do not fit ", dst.size(), " B"));
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> n;
  std::vector<float> kv(size_t{p.num_layers} * 2 * p.page_tokens * p.num_kv_heads * p.head_dim);
  for (size_t i = 0; i < std::min(distinct, count); ++i) {
    for (float& v : kv) v = n(rng);
    const KVSequenceView view{kv.data(), p.num_layers, p.num_kv_heads, p.head_dim, p.page_tokens};
    if (absl::Status s = EncodePage(p, nullptr, kind, view, 0, p.page_tokens,
                                    dst.subspan(i * bytes, bytes));
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = distinct; i < count; ++i) {
    std::memcpy(dst.data() + i * bytes, dst.data() + (i % distinct) * bytes, bytes);
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::bench
