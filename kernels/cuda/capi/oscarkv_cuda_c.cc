// liboscarkv_cuda_c.so: the C ABI of oscarkv_cuda_c.h over kernels/cuda. Converts the C structs
// to the kernels' POD params and absl::Status to (code, thread-local message) at this boundary.
#include "oscarkv/cuda/oscarkv_cuda_c.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "oscarkv/cuda/decode_runner.h"
#include "oscarkv/cuda/extend_attention.h"
#include "oscarkv/cuda/internal/decode_launch.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/cuda/reference.h"
#include "oscarkv/kernels/page_format.h"
#include "oscarkv/kernels/rotation.h"

struct oscarkv_cuda_decoder {
  oscarkv::cuda::PagedDecoder decoder;
};
struct oscarkv_cuda_extend_plan {
  oscarkv::cuda::ExtendPlan plan;
};

namespace {

using oscarkv::CodecProfile;
using oscarkv::PageKind;
using oscarkv::RotationSet;
namespace kc = oscarkv::cuda;

thread_local std::string g_last_error;

int Report(const absl::Status& s) {
  if (s.ok()) return 0;
  g_last_error = std::string(s.message());
  return static_cast<int>(s.code());
}

int Invalid(const std::string& msg) { return Report(absl::InvalidArgumentError(msg)); }

absl::StatusOr<CodecProfile> ToProfile(const oscarkv_cuda_profile* p) {
  if (p == nullptr) return absl::InvalidArgumentError("profile is NULL");
  CodecProfile c;
  c.model_id.assign(p->model_id, strnlen(p->model_id, sizeof(p->model_id)));
  c.model_revision.assign(p->model_revision, strnlen(p->model_revision, sizeof(p->model_revision)));
  c.num_layers = p->num_layers;
  c.num_kv_heads = p->num_kv_heads;
  c.tp_rank = p->tp_rank;
  c.tp_size = p->tp_size;
  c.head_dim = p->head_dim;
  c.page_tokens = p->page_tokens;
  c.group_size = p->group_size;
  c.sink_tokens = p->sink_tokens;
  c.recent_tokens = p->recent_tokens;
  std::memcpy(c.rotation_digest.data(), p->rotation_digest, 32);
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

absl::StatusOr<PageKind> ToKind(int kind) {
  if (kind == static_cast<int>(PageKind::kInt2)) return PageKind::kInt2;
  if (kind == static_cast<int>(PageKind::kBf16)) return PageKind::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("page kind ", kind, " (1 INT2, 2 BF16)"));
}

kc::DecodeShape ToShape(const oscarkv_cuda_shape& s, uint32_t layer) {
  kc::DecodeShape d;
  d.num_layers = s.num_layers;
  d.num_kv_heads = s.num_kv_heads;
  d.num_q_heads = s.num_q_heads;
  d.head_dim = s.head_dim;
  d.group_size = s.group_size;
  d.page_tokens = s.page_tokens;
  d.layer = layer;
  return d;
}

kc::PagedKVTable ToTable(const oscarkv_cuda_table& t) {
  kc::PagedKVTable k;
  k.page_ptrs = t.page_ptrs;
  k.page_kinds = t.page_kinds;
  k.page_token_counts = t.page_token_counts;
  k.seq_page_indptr = t.seq_page_indptr;
  k.seq_page_ids = t.seq_page_ids;
  k.num_seqs = t.num_seqs;
  return k;
}

kc::QuantizeWriteParams ToWrite(const oscarkv_cuda_write& w) {
  kc::QuantizeWriteParams p;
  p.num_layers = w.num_layers;
  p.num_kv_heads = w.num_kv_heads;
  p.head_dim = w.head_dim;
  p.group_size = w.group_size;
  p.page_tokens = w.page_tokens;
  p.first_layer = w.first_layer;
  p.layer_count = w.layer_count;
  p.k_src = w.k_src;
  p.v_src = w.v_src;
  p.src_layer_stride = w.src_layer_stride;
  p.src_token_stride = w.src_token_stride;
  p.src_head_stride = w.src_head_stride;
  p.num_tokens = w.num_tokens;
  p.page_ptrs = w.page_ptrs;
  p.page_kinds = w.page_kinds;
  p.dst_page = w.dst_page;
  p.dst_slot = w.dst_slot;
  p.rot_fragments = w.rot_fragments;
  p.clips = w.clips;
  p.range_mode = static_cast<oscarkv::RangeMode>(w.range_mode);
  p.range_modes = w.range_modes;
  p.range_modes_fixed_only = w.range_modes_fixed_only != 0;
  return p;
}

// The references' RotationSet: `layers` layers of matrices (identity when NULL), clips, modes.
absl::StatusOr<RotationSet> ToRotations(uint32_t layers, uint32_t kv_heads, uint32_t d,
                                        const oscarkv_cuda_ref_rotations* r) {
  const size_t n = size_t{layers} * 2 * kv_heads;
  RotationSet base = RotationSet::Identity(layers, kv_heads, d);
  std::vector<float> m = (r != nullptr && r->matrices != nullptr)
                             ? std::vector<float>(r->matrices, r->matrices + n * d * d)
                             : base.matrices();
  std::vector<float> c = (r != nullptr && r->clips != nullptr)
                             ? std::vector<float>(r->clips, r->clips + n)
                             : std::vector<float>(n, 1.0f);
  auto set = RotationSet::FromData(layers, kv_heads, d, std::move(m), std::move(c));
  if (!set.ok()) return set.status();
  if (r != nullptr && r->range_modes != nullptr) {
    for (uint32_t l = 0; l < layers; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t h = 0; h < kv_heads; ++h) {
          const uint8_t mode = r->range_modes[(size_t{l} * 2 + kv) * kv_heads + h];
          if (!oscarkv::IsRangeMode(mode)) {
            return absl::InvalidArgumentError(absl::StrCat("range mode byte ", int{mode}));
          }
          set->set_range_mode(l, static_cast<oscarkv::KV>(kv), h,
                              static_cast<oscarkv::RangeMode>(mode));
        }
      }
    }
  }
  return set;
}

absl::StatusOr<kc::HostPagedKV> ToHostKV(const uint8_t* const* pages, const uint64_t* bytes,
                                         int32_t num_pages, const int32_t* indptr,
                                         int32_t num_seqs, const int32_t* ids) {
  if (num_pages < 0 || num_seqs < 0 || (num_pages > 0 && (pages == nullptr || bytes == nullptr)) ||
      indptr == nullptr) {
    return absl::InvalidArgumentError("reference: missing page table");
  }
  kc::HostPagedKV kv;
  for (int32_t i = 0; i < num_pages; ++i) kv.pages.emplace_back(pages[i], bytes[i]);
  kv.seq_page_indptr.assign(indptr, indptr + num_seqs + 1);
  const int32_t entries = kv.seq_page_indptr.back();
  if (entries < 0 || (entries > 0 && ids == nullptr)) {
    return absl::InvalidArgumentError("reference: bad seq_page_indptr / ids");
  }
  kv.seq_page_ids.assign(ids, ids + entries);
  return kv;
}

}  // namespace

extern "C" {

int oscarkv_cuda_abi_version(void) { return OSCARKV_CUDA_C_ABI_VERSION; }
const char* oscarkv_cuda_last_error(void) { return g_last_error.c_str(); }

int oscarkv_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int oscarkv_cuda_page_bytes(const oscarkv_cuda_profile* profile, int kind, uint64_t* out) {
  auto p = ToProfile(profile);
  if (!p.ok()) return Report(p.status());
  auto k = ToKind(kind);
  if (!k.ok()) return Report(k.status());
  if (out == nullptr) return Invalid("out is NULL");
  *out = oscarkv::GeometryFor(*p, *k).page_bytes();
  return 0;
}

int oscarkv_cuda_codec_id(const oscarkv_cuda_profile* profile, uint8_t out[16]) {
  auto p = ToProfile(profile);
  if (!p.ok()) return Report(p.status());
  if (out == nullptr) return Invalid("out is NULL");
  std::memcpy(out, p->Id().bytes.data(), 16);
  return 0;
}

int oscarkv_cuda_finish_page(const oscarkv_cuda_profile* profile, int kind, uint32_t token_count,
                             uint8_t* host_page, uint64_t page_bytes) {
  auto p = ToProfile(profile);
  if (!p.ok()) return Report(p.status());
  auto k = ToKind(kind);
  if (!k.ok()) return Report(k.status());
  const oscarkv::PageGeometry g = oscarkv::GeometryFor(*p, *k);
  if (host_page == nullptr || page_bytes != g.page_bytes()) {
    return Invalid(absl::StrCat("page must be ", g.page_bytes(), " bytes, got ", page_bytes));
  }
  if (token_count == 0 || token_count > p->page_tokens) {
    return Invalid(absl::StrCat("token_count ", token_count, " not in 1..", p->page_tokens));
  }
  oscarkv::PageHeader hdr{};
  hdr.magic = oscarkv::kPageMagic;
  hdr.format_version = oscarkv::kPageFormatVersion;
  hdr.kind = static_cast<uint8_t>(*k);
  hdr.scale_dtype = static_cast<uint8_t>(p->scale_dtype);
  std::memcpy(hdr.codec_id, p->Id().bytes.data(), 16);
  hdr.num_layers = static_cast<uint16_t>(p->num_layers);
  hdr.num_kv_heads = static_cast<uint16_t>(p->num_kv_heads);
  hdr.head_dim = static_cast<uint16_t>(p->head_dim);
  hdr.group_size = static_cast<uint16_t>(p->group_size);
  hdr.page_tokens = static_cast<uint16_t>(p->page_tokens);
  hdr.token_count = static_cast<uint16_t>(token_count);
  hdr.payload_bytes = g.payload_bytes();
  std::memcpy(host_page, &hdr, sizeof(hdr));
  hdr.checksum = oscarkv::ComputePageChecksum(std::span<const uint8_t>(host_page, page_bytes));
  std::memcpy(host_page, &hdr, sizeof(hdr));
  return 0;
}

int oscarkv_cuda_builtin_rotations(int which, uint32_t layers, uint32_t kv_heads, uint32_t d,
                                   float* host_matrices) {
  if (host_matrices == nullptr) return Invalid("host_matrices is NULL");
  if (layers == 0 || layers > 4096 || kv_heads == 0 || kv_heads > 256 ||
      (d != 64 && d != 128 && d != 256)) {
    return Invalid("builtin rotations: layers 1..4096, kv_heads 1..256, d 64/128/256");
  }
  RotationSet set;
  if (which == 0) {
    set = RotationSet::Identity(layers, kv_heads, d);
  } else if (which == 1) {
    set = RotationSet::Hadamard(layers, kv_heads, d);
  } else {
    return Invalid(absl::StrCat("builtin rotations: unknown set ", which, " (0 identity, 1 hadamard)"));
  }
  std::memcpy(host_matrices, set.matrices().data(), set.matrices().size() * sizeof(float));
  return 0;
}

int oscarkv_cuda_rotation_digest(uint32_t layers, uint32_t kv_heads, uint32_t d,
                                 const float* host_matrices, const float* host_clips,
                                 const uint8_t* host_range_modes, uint8_t out[32]) {
  if (host_matrices == nullptr || host_clips == nullptr || out == nullptr) {
    return Invalid("rotation digest: matrices, clips and out are required");
  }
  oscarkv_cuda_ref_rotations r{host_matrices, host_clips, host_range_modes};
  auto set = ToRotations(layers, kv_heads, d, &r);
  if (!set.ok()) return Report(set.status());
  const oscarkv::Sha256Digest dg = set->Digest();
  std::memcpy(out, dg.data(), 32);
  return 0;
}

size_t oscarkv_cuda_rotation_fragment_bytes(void) { return kc::kRotationFragmentBytes; }

int oscarkv_cuda_prepare_rotations(const float* matrices, int count, void* fragments, void* stream) {
  return Report(kc::PrepareRotationFragments(matrices, count, fragments,
                                             static_cast<cudaStream_t>(stream)));
}

int oscarkv_cuda_quantize_write(const oscarkv_cuda_write* w, void* stream) {
  if (w == nullptr) return Invalid("write params are NULL");
  return Report(kc::LaunchQuantizeWrite(ToWrite(*w), static_cast<cudaStream_t>(stream)));
}

int oscarkv_cuda_decoder_create(const oscarkv_cuda_shape* shape, int32_t max_seqs,
                                int32_t max_pages_per_seq, oscarkv_cuda_decoder** out) {
  if (shape == nullptr || out == nullptr) return Invalid("shape and out are required");
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return Report(absl::FailedPreconditionError("no CUDA device"));
  }
  auto d = kc::PagedDecoder::CreateForCapture(ToShape(*shape, 0), {max_seqs, max_pages_per_seq}, sms);
  if (!d.ok()) return Report(d.status());
  *out = new (std::nothrow) oscarkv_cuda_decoder{*std::move(d)};
  if (*out == nullptr) return Report(absl::ResourceExhaustedError("out of host memory"));
  return 0;
}

int oscarkv_cuda_decoder_update(oscarkv_cuda_decoder* dec, const int32_t* host_indptr,
                                int32_t num_seqs, const int32_t* host_ids, int32_t num_entries,
                                const uint8_t* host_kinds, int32_t num_pages, void* stream) {
  if (dec == nullptr || host_indptr == nullptr || num_seqs < 0 || num_entries < 0 ||
      num_pages < 0 || (num_entries > 0 && host_ids == nullptr) ||
      (num_pages > 0 && host_kinds == nullptr)) {
    return Invalid("decoder update: missing arrays");
  }
  std::vector<int32_t> indptr(host_indptr, host_indptr + num_seqs + 1);
  if (indptr.back() != num_entries) {
    return Invalid(absl::StrCat("decoder update: indptr ends at ", indptr.back(), ", ",
                                num_entries, " ids given"));
  }
  std::vector<int32_t> ids(host_ids, host_ids + num_entries);
  for (int32_t id : ids) {
    if (id < 0 || id >= num_pages) return Invalid(absl::StrCat("decoder update: page id ", id));
  }
  std::vector<uint8_t> kinds(host_kinds, host_kinds + num_pages);
  return Report(dec->decoder.Update(indptr, ids, kinds, static_cast<cudaStream_t>(stream)));
}

int oscarkv_cuda_decoder_run(const oscarkv_cuda_decoder* dec, uint32_t layer,
                             const oscarkv_cuda_table* table, const oscarkv_cuda_attn_io* io,
                             void* stream) {
  if (dec == nullptr || table == nullptr || io == nullptr) return Invalid("decoder run: NULL argument");
  if (layer >= dec->decoder.shape().num_layers) {
    return Invalid(absl::StrCat("decoder run: layer ", layer, " of ", dec->decoder.shape().num_layers));
  }
  if (io->q == nullptr || io->out == nullptr || table->page_ptrs == nullptr ||
      table->page_kinds == nullptr || table->page_token_counts == nullptr ||
      table->seq_page_indptr == nullptr || table->seq_page_ids == nullptr) {
    return Invalid("decoder run: missing q, out or page table");
  }
  kc::DecodeInputs in;
  in.table = ToTable(*table);
  in.table.num_seqs = 0;  // as planned
  in.q = io->q;
  in.rot_k = io->rot_k;
  in.rot_v = io->rot_v;
  in.unrotate_output = io->unrotate_output != 0;
  in.softmax_scale = io->softmax_scale;
  in.out = io->out;
  in.lse = io->lse;
  // The plan does not depend on the layer (work items are (sequence, KV head, slices)); one
  // decoder serves every layer of the pages, launched one layer at a time on one stream.
  kc::DecodeParams p = kc::DecoderParams(dec->decoder, in);
  p.shape.layer = layer;
  return Report(kc::LaunchDecodeAttention(p, static_cast<cudaStream_t>(stream)));
}

void oscarkv_cuda_decoder_destroy(oscarkv_cuda_decoder* dec) { delete dec; }

int oscarkv_cuda_extend_plan_create(const oscarkv_cuda_shape* shape, int32_t max_seqs,
                                    int32_t max_new_tokens, oscarkv_cuda_extend_plan** out) {
  if (shape == nullptr || out == nullptr) return Invalid("shape and out are required");
  auto plan = kc::PlanExtend(ToShape(*shape, 0), max_seqs, max_new_tokens);
  if (!plan.ok()) return Report(plan.status());
  *out = new (std::nothrow) oscarkv_cuda_extend_plan{*plan};
  if (*out == nullptr) return Report(absl::ResourceExhaustedError("out of host memory"));
  return 0;
}

int oscarkv_cuda_extend_run(const oscarkv_cuda_extend_plan* plan, uint32_t layer,
                            const oscarkv_cuda_table* table, const int32_t* q_indptr,
                            int32_t max_new_tokens, const uint16_t* k_new, const uint16_t* v_new,
                            const oscarkv_cuda_attn_io* io, void* stream) {
  if (plan == nullptr || table == nullptr || io == nullptr) return Invalid("extend run: NULL argument");
  if (layer >= plan->plan.shape.num_layers) {
    return Invalid(absl::StrCat("extend run: layer ", layer, " of ", plan->plan.shape.num_layers));
  }
  kc::ExtendParams p;
  p.shape = plan->plan.shape;
  p.shape.layer = layer;
  p.table = ToTable(*table);
  p.q_indptr = q_indptr;
  p.max_new_tokens = max_new_tokens;
  p.q = io->q;
  p.k_new = k_new;
  p.v_new = v_new;
  p.rot_k = io->rot_k;
  p.rot_v = io->rot_v;
  p.unrotate_output = io->unrotate_output != 0;
  p.softmax_scale = io->softmax_scale;
  p.out = io->out;
  p.lse = io->lse;
  kc::ExtendPlan pl = plan->plan;
  pl.shape.layer = layer;
  return Report(kc::LaunchExtendAttention(pl, p, static_cast<cudaStream_t>(stream)));
}

void oscarkv_cuda_extend_plan_destroy(oscarkv_cuda_extend_plan* plan) { delete plan; }

int oscarkv_cuda_reference_quantize_write(const oscarkv_cuda_write* host_w,
                                          const oscarkv_cuda_ref_rotations* rot) {
  if (host_w == nullptr) return Invalid("write params are NULL");
  const kc::QuantizeWriteParams p = ToWrite(*host_w);
  if (p.num_layers == 0 || p.num_kv_heads == 0 || p.first_layer + p.layer_count > p.num_layers) {
    return Invalid("reference write: bad layers");
  }
  if (rot == nullptr || rot->matrices == nullptr) return Report(kc::ReferenceQuantizeWrite(p, nullptr));
  auto set = ToRotations(p.num_layers, p.num_kv_heads, p.head_dim, rot);
  if (!set.ok()) return Report(set.status());
  return Report(kc::ReferenceQuantizeWrite(p, &*set));
}

namespace {

int ReferenceAttention(const oscarkv_cuda_profile* profile, const oscarkv_cuda_ref_rotations* rot,
                       const uint8_t* const* pages, const uint64_t* bytes, int32_t num_pages,
                       const int32_t* indptr, int32_t num_seqs, const int32_t* ids,
                       uint32_t layer, const int32_t* q_indptr, const float* q,
                       const uint16_t* k_new, const uint16_t* v_new, uint32_t num_q_heads,
                       int unrotate, float scale, float* out, float* lse) {
  auto p = ToProfile(profile);
  if (!p.ok()) return Report(p.status());
  if (q == nullptr || out == nullptr || num_q_heads == 0 || layer >= p->num_layers) {
    return Invalid("reference: q, out, num_q_heads and a layer of the profile are required");
  }
  auto set = ToRotations(p->num_layers, p->num_kv_heads, p->head_dim, rot);
  if (!set.ok()) return Report(set.status());
  auto kv = ToHostKV(pages, bytes, num_pages, indptr, num_seqs, ids);
  if (!kv.ok()) return Report(kv.status());
  const size_t d = p->head_dim, H = p->num_kv_heads;
  absl::StatusOr<oscarkv::AttentionOutput> res;
  size_t rows = static_cast<size_t>(num_seqs);
  if (q_indptr == nullptr) {
    res = kc::ReferencePagedDecode(*p, *set, *kv, layer,
                                   std::span<const float>(q, rows * num_q_heads * d), num_q_heads,
                                   unrotate != 0, scale);
  } else {
    rows = static_cast<size_t>(q_indptr[num_seqs]);
    if (k_new == nullptr || v_new == nullptr) return Invalid("reference extend: k_new/v_new required");
    res = kc::ReferenceExtendAttention(
        *p, *set, *kv, layer, std::span<const int32_t>(q_indptr, num_seqs + 1),
        std::span<const float>(q, rows * num_q_heads * d),
        std::span<const uint16_t>(k_new, rows * H * d), std::span<const uint16_t>(v_new, rows * H * d),
        num_q_heads, unrotate != 0, scale);
  }
  if (!res.ok()) return Report(res.status());
  std::memcpy(out, res->out.data(), res->out.size() * sizeof(float));
  if (lse != nullptr) std::memcpy(lse, res->lse.data(), res->lse.size() * sizeof(float));
  return 0;
}

}  // namespace

int oscarkv_cuda_reference_decode(const oscarkv_cuda_profile* profile,
                                  const oscarkv_cuda_ref_rotations* rot,
                                  const uint8_t* const* host_pages, const uint64_t* page_bytes,
                                  int32_t num_pages, const int32_t* host_indptr, int32_t num_seqs,
                                  const int32_t* host_ids, uint32_t layer, const float* host_q,
                                  uint32_t num_q_heads, int unrotate_output, float softmax_scale,
                                  float* host_out, float* host_lse) {
  return ReferenceAttention(profile, rot, host_pages, page_bytes, num_pages, host_indptr, num_seqs,
                            host_ids, layer, nullptr, host_q, nullptr, nullptr, num_q_heads,
                            unrotate_output, softmax_scale, host_out, host_lse);
}

int oscarkv_cuda_reference_extend(const oscarkv_cuda_profile* profile,
                                  const oscarkv_cuda_ref_rotations* rot,
                                  const uint8_t* const* host_pages, const uint64_t* page_bytes,
                                  int32_t num_pages, const int32_t* host_indptr, int32_t num_seqs,
                                  const int32_t* host_ids, uint32_t layer,
                                  const int32_t* host_q_indptr, const float* host_q,
                                  const uint16_t* host_k_new, const uint16_t* host_v_new,
                                  uint32_t num_q_heads, int unrotate_output, float softmax_scale,
                                  float* host_out, float* host_lse) {
  if (host_q_indptr == nullptr) return Invalid("reference extend: q_indptr is required");
  return ReferenceAttention(profile, rot, host_pages, page_bytes, num_pages, host_indptr, num_seqs,
                            host_ids, layer, host_q_indptr, host_q, host_k_new, host_v_new,
                            num_q_heads, unrotate_output, softmax_scale, host_out, host_lse);
}

}  // extern "C"
