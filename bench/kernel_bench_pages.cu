// Batches of pages for the kernel bench (kernel_bench_internal.h): the input fills and
// BuildBatch.
#include <cmath>
#include <numeric>
#include <random>

#include "kernel_bench_internal.h"
#include "oscarkv/cuda/internal/decode_launch.h"
#include "oscarkv/cuda/internal/quantize_launch.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/kernels/page_set.h"

namespace oscarkv::bench {
namespace {

__device__ uint32_t Hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// Roughly normal bf16 values (sum of four uniforms), std ~ `scale`.
__global__ void FillBf16(uint16_t* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = Hash(static_cast<uint32_t>(i) * 2654435761u ^ seed);
    const float u = ((h & 0xff) + ((h >> 8) & 0xff) + ((h >> 16) & 0xff) + (h >> 24)) / 255.0f - 2.0f;
    const float v = u * 1.7320508f * scale;
    const uint32_t bits = __float_as_uint(v);
    p[i] = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
}

__global__ void FillFloat(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    p[i] = (Hash(static_cast<uint32_t>(i) ^ seed) & 0xffff) / 32768.0f - 1.0f;
  }
}

// K/V copies a decode side cycles over so that one cycle reads >= 4x the L2 (no launch finds
// its pages there), 1 with warm_l2; at most 64 copies and ~8 GB of pool.
int DecodeCopies(const KernelBenchOptions& o, double bytes_read, double pool_bytes_per_copy) {
  if (o.warm_l2) return 1;
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0) != cudaSuccess || l2 <= 0) l2 = 64 << 20;
  const int want = static_cast<int>(std::ceil(4.0 * l2 / std::max(bytes_read, 1.0)));
  const int room = static_cast<int>(8e9 / std::max(pool_bytes_per_copy, 1.0));
  return std::clamp(std::min(want, std::max(room, 1)), 1, 64);
}

}  // namespace

void LaunchFillBf16(int blocks, uint16_t* p, size_t n, uint32_t seed, float scale) {
  FillBf16<<<blocks, 256>>>(p, n, seed, scale);
}
void LaunchFillFloat(int blocks, float* p, size_t n, uint32_t seed) { FillFloat<<<blocks, 256>>>(p, n, seed); }

CodecProfile BenchProfile(int layers) {
  CodecProfile p;
  p.model_id = "bench/qwen3-8b-shape";
  p.model_revision = "1";
  p.num_layers = layers;
  p.num_kv_heads = kKvHeads;
  p.head_dim = kHeadDim;
  p.page_tokens = kPageTokens;
  p.group_size = 128;
  return p;
}


absl::Status BuildBatch(const KernelBenchOptions& o, int B, int L, bool all_bf16, int sms, int target,
                        const DeviceBuffer& ksrc, const DeviceBuffer& vsrc, const void* rot_frag,
                        const float* clips, PagedBatch* out) {
  const CodecProfile prof = BenchProfile(o.layers);
  std::vector<PlannedPage> plan = PlanSequencePages(prof, L);
  if (all_bf16) {
    for (auto& pp : plan) pp.kind = PageKind::kBf16;
  }
  std::vector<int32_t> indptr = {0}, ids;
  std::vector<uint8_t> kinds;
  std::vector<uint16_t> counts;
  for (int b = 0; b < B; ++b) {
    for (const auto& pp : plan) {
      ids.push_back(static_cast<int32_t>(kinds.size()));
      kinds.push_back(static_cast<uint8_t>(pp.kind));
      counts.push_back(static_cast<uint16_t>(pp.token_count));
    }
    indptr.push_back(static_cast<int32_t>(ids.size()));
  }
  cuda::DecodeShape shape{static_cast<uint32_t>(o.layers), kKvHeads, kQHeads, kHeadDim, 128, kPageTokens, 0};
  auto dec = cuda::CreatePagedDecoder(shape, indptr, ids, kinds, sms, {target});
  if (!dec.ok()) return dec.status();
  out->decoder = std::make_unique<cuda::PagedDecoder>(*std::move(dec));
  const double bytes = cuda::DecoderPlan(*out->decoder).page_bytes_read;
  const PageGeometry g2 = GeometryFor(prof, PageKind::kInt2), gb = GeometryFor(prof, PageKind::kBf16);
  size_t n2 = 0, nb = 0;
  for (uint8_t k : kinds) (k == 1 ? n2 : nb)++;
  out->copies = DecodeCopies(o, bytes, double(n2) * g2.page_bytes() + double(nb) * gb.page_bytes());
  if (o.capture_timing) {
    // As python/oscarkv/torch/cache.py makes it: capacity 2B sequences of ceil((L + 64) / 64)
    // pages (max_seq_tokens = context + 64 in `bench model`), re-planned by Update.
    const int pages = (L + 64 + kPageTokens - 1) / kPageTokens;
    // (a diagnostic row: a decoder that cannot be made is reported and skipped, not fatal)
    auto cap = cuda::PagedDecoder::CreateForCapture(shape, {2 * B, pages}, sms);
    absl::Status st = cap.ok() ? cap->Update(indptr, ids, kinds, nullptr) : cap.status();
    std::vector<int32_t> padded = indptr;
    padded.resize(size_t(2 * B) + 1, indptr.back());
    auto pi = DeviceBuffer::FromHost(padded);
    if (st.ok() && !pi.ok()) st = pi.status();
    if (st.ok()) {
      out->capture = std::make_unique<cuda::PagedDecoder>(*std::move(cap));
      out->capture_indptr = *std::move(pi);
    } else {
      std::fprintf(stderr, "[bench] capture decoder B=%d L=%d skipped: %s\n", B, L, std::string(st.message()).c_str());
    }
  }
  const int C = out->copies;
  auto p2 = DeviceBuffer::Create(n2 * C * g2.page_bytes());
  auto pb = DeviceBuffer::Create(nb * C * gb.page_bytes());
  if (!p2.ok()) return p2.status();
  if (!pb.ok()) return pb.status();
  out->int2_pool = *std::move(p2);
  out->bf16_pool = *std::move(pb);
  // Pages placed in shuffled pool slots, as after allocator churn.
  std::mt19937 rng(B * 7919 + L);
  std::vector<size_t> slot2(n2 * C), slotb(nb * C);
  std::iota(slot2.begin(), slot2.end(), 0);
  std::iota(slotb.begin(), slotb.end(), 0);
  std::shuffle(slot2.begin(), slot2.end(), rng);
  std::shuffle(slotb.begin(), slotb.end(), rng);
  size_t i2 = 0, ib = 0;
  std::vector<int32_t> dst_page(L), dst_slot(L);
  for (int t = 0; t < L; ++t) dst_slot[t] = t % kPageTokens;
  DeviceBuffer d_kinds_seq;
  {
    auto k = DeviceBuffer::FromHost(kinds);
    if (!k.ok()) return k.status();
    d_kinds_seq = *std::move(k);
  }
  for (int c = 0; c < C; ++c) {
    std::vector<uint8_t*> ptrs(kinds.size());
    for (size_t e = 0; e < kinds.size(); ++e) {
      ptrs[e] = kinds[e] == 1 ? out->int2_pool.as<uint8_t>() + slot2[i2++] * g2.page_bytes()
                              : out->bf16_pool.as<uint8_t>() + slotb[ib++] * gb.page_bytes();
    }
    auto t = DeviceBuffer::FromHost(ptrs);
    if (!t.ok()) return t.status();
    // Fill every sequence's pages (layer 0) through quantize-on-write from the shared source.
    for (int b = 0; b < B; ++b) {
      for (int tk = 0; tk < L; ++tk) dst_page[tk] = indptr[b] + tk / kPageTokens;
      auto dp = DeviceBuffer::FromHost(dst_page);
      auto ds = DeviceBuffer::FromHost(dst_slot);
      if (!dp.ok() || !ds.ok()) return absl::InternalError("upload");
      cuda::QuantizeWriteParams q;
      q.num_layers = o.layers;
      q.num_kv_heads = kKvHeads;
      q.page_tokens = kPageTokens;
      q.k_src = ksrc.as<uint16_t>();
      q.v_src = vsrc.as<uint16_t>();
      q.src_token_stride = kKvHeads * kHeadDim;
      q.src_head_stride = kHeadDim;
      q.num_tokens = L;
      q.page_ptrs = t->as<uint8_t*>();
      q.page_kinds = d_kinds_seq.as<uint8_t>();
      q.dst_page = dp->as<int32_t>();
      q.dst_slot = ds->as<int32_t>();
      q.rot_fragments = rot_frag;
      q.clips = clips;
      BENCH_RETURN_IF_ERROR(cuda::LaunchQuantizeWrite(q, nullptr));
      BENCH_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "fill pages"));
    }
    out->ptr_tables.push_back(*std::move(t));
  }
  auto k = DeviceBuffer::FromHost(kinds);
  auto cn = DeviceBuffer::FromHost(counts);
  auto ip = DeviceBuffer::FromHost(indptr);
  auto id = DeviceBuffer::FromHost(ids);
  if (!k.ok() || !cn.ok() || !ip.ok() || !id.ok()) return absl::InternalError("upload table");
  out->kinds = *std::move(k);
  out->counts = *std::move(cn);
  out->indptr = *std::move(ip);
  out->ids = *std::move(id);
  return absl::OkStatus();
}

}  // namespace oscarkv::bench
