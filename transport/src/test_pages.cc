#include "test_pages.h"

#include <vector>

#include "oscarkv/kernels/page_codec.h"

namespace oscarkv::transport::testing {

absl::Status FillPage(const CodecProfile& p, PageKind kind, uint32_t seed, uint32_t index,
                      std::span<uint8_t> out) {
  std::vector<float> kv(size_t{p.num_layers} * 2 * p.page_tokens * p.num_kv_heads * p.head_dim);
  uint64_t x = (uint64_t{seed} << 32 | index) * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : kv) {  // xorshift64*: fast and identical in every process
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t r = x * 0x2545F4914F6CDD1Dull;
    v = static_cast<float>(static_cast<int64_t>(r >> 40) - (1 << 23)) / float(1 << 22);
  }
  KVSequenceView view{kv.data(), p.num_layers, p.num_kv_heads, p.head_dim, p.page_tokens};
  return EncodePage(p, nullptr, kind, view, 0, p.page_tokens, out);
}

size_t CountValidPages(const uint8_t* pool, size_t page_bytes, size_t n) {
  size_t ok = 0;
  for (size_t i = 0; i < n; ++i) {
    ok += ParsePageHeaderStandalone({pool + i * page_bytes, page_bytes}).ok() ? 1 : 0;
  }
  return ok;
}

}  // namespace oscarkv::transport::testing
