// CudaAttention: the engine's GPU attention backend over kernels/cuda (see cuda_attention.h).
#include "oscarkv/engine/cuda_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oscarkv/cuda/decode_attention.h"
#include "oscarkv/cuda/decode_runner.h"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/quantize_write.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/util/status_macros.h"
#include "cuda_window.h"
#include "window_pages.h"

namespace oscarkv::engine {
namespace {

using cuda::DeviceBuffer;

constexpr uint32_t kHeadDim = 128;
constexpr size_t kPageAlign = 256;

template <typename T>
absl::Status Upload(DeviceBuffer& dst, const std::vector<T>& v) {
  if (dst.bytes() < v.size() * sizeof(T)) {
    OSCARKV_ASSIGN_OR_RETURN(dst, DeviceBuffer::Create(v.size() * sizeof(T)));
  }
  if (v.empty()) return absl::OkStatus();
  return CudaStatus(cudaMemcpy(dst.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                "cudaMemcpy H2D");
}

class CudaAttention final : public AttentionBackend {
 public:
  explicit CudaAttention(KvCodec codec) : codec_(std::move(codec)) {}
  absl::Status Attend(const AttentionInputs& in, float* out) override;

 private:
  absl::Status PrepareCodec(const AttentionInputs& in);
  absl::Status PrepareWindow(const AttentionInputs& in);

  KvCodec codec_;
  int num_sms_ = 0;
  // Codec state (INT2 codecs): rotations [L][2][Hkv][d][d], their write-kernel fragments, clip
  // ratios and range modes [L][2][Hkv].
  bool codec_ready_ = false;
  uint32_t layers_ = 0;
  DeviceBuffer mats_, fragments_, clips_, modes_;
  bool clips_active_ = false;  // some clip ratio < 1
  bool modes_fixed_only_ = false;  // every range mode min-max or unbiased-fixed
  // Window state, rebuilt when the window length or head counts change.
  uint32_t tokens_ = 0, q_heads_ = 0, kv_heads_ = 0;
  WindowPageLayout layout_;
  DeviceBuffer pages_, page_ptrs_, page_kinds_, dst_page_, dst_slot_;
  DeviceBuffer entry_ptrs_, entry_kinds_, entry_counts_, seq_indptr_, seq_entries_;
  std::optional<cuda::PagedDecoder> decoder_;
  DeviceBuffer q_, k_, v_, out_;
  std::vector<uint16_t> k_host_, v_host_;
};

absl::Status CudaAttention::PrepareCodec(const AttentionInputs& in) {
  if (in.head_dim != kHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA attention needs head_dim 128, got ", in.head_dim));
  }
  if (in.num_kv_heads == 0 || in.num_q_heads % in.num_kv_heads != 0 ||
      in.num_q_heads / in.num_kv_heads > 8) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA attention needs 1..8 query heads per KV head, got ",
                                                   in.num_q_heads, "/", in.num_kv_heads));
  }
  if (codec_ready_) return absl::OkStatus();
  OSCARKV_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, 0),
                                 "cudaDeviceGetAttribute"));
  if (codec_.int2) {
    const RotationSet* rot = codec_.rotations.get();
    if (rot == nullptr) return absl::InvalidArgumentError("INT2 codec without rotations");
    if (rot->head_dim() != in.head_dim || rot->kv_heads() != in.num_kv_heads) {
      return absl::InvalidArgumentError("rotation set shape does not match the model");
    }
    if (codec_.group != 64 && codec_.group != 128) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA attention supports group 64 or 128, got ", codec_.group));
    }
    layers_ = rot->layers();
    const uint32_t H = rot->kv_heads();
    OSCARKV_RETURN_IF_ERROR(Upload(mats_, rot->matrices()));
    OSCARKV_RETURN_IF_ERROR(Upload(clips_, rot->clips()));
    clips_active_ = false;
    for (float c : rot->clips()) clips_active_ = clips_active_ || c < 1.0f;
    const std::vector<uint8_t> modes = RangeModeBytes(*rot);
    modes_fixed_only_ = std::all_of(modes.begin(), modes.end(), [](uint8_t m) {
      return m == static_cast<uint8_t>(RangeMode::kMinMax) || IsUnbiasedFixed(static_cast<RangeMode>(m));
    });
    OSCARKV_RETURN_IF_ERROR(Upload(modes_, modes));
    const int count = static_cast<int>(layers_ * 2 * H);
    OSCARKV_ASSIGN_OR_RETURN(fragments_, DeviceBuffer::Create(count * cuda::kRotationFragmentBytes));
    OSCARKV_RETURN_IF_ERROR(
        cuda::PrepareRotationFragments(mats_.as<float>(), count, fragments_.get(), nullptr));
  }
  codec_ready_ = true;
  return absl::OkStatus();
}

absl::Status CudaAttention::PrepareWindow(const AttentionInputs& in) {
  const uint32_t T = in.tokens, H = in.num_kv_heads, d = in.head_dim;
  if (T == tokens_ && in.num_q_heads == q_heads_ && H == kv_heads_) return absl::OkStatus();
  tokens_ = 0;  // invalid until complete
  decoder_.reset();
  layout_ = BuildWindowPageLayout(T, codec_.int2, codec_.sink, codec_.recent);
  const WindowPageLayout& L = layout_;

  // Physical pages (one layer each), 256-byte aligned, in one allocation.
  std::vector<size_t> offsets(L.page_kinds.size());
  size_t total = 0;
  for (size_t i = 0; i < L.page_kinds.size(); ++i) {
    const PageGeometry g{1, H, d, codec_.group, kWindowPageTokens, static_cast<PageKind>(L.page_kinds[i])};
    offsets[i] = total;
    total += (g.page_bytes() + kPageAlign - 1) / kPageAlign * kPageAlign;
  }
  OSCARKV_ASSIGN_OR_RETURN(pages_, DeviceBuffer::Create(total));
  OSCARKV_RETURN_IF_ERROR(CudaStatus(cudaMemset(pages_.get(), 0, total), "cudaMemset"));
  std::vector<uint8_t*> page_ptrs(offsets.size());
  for (size_t i = 0; i < offsets.size(); ++i) page_ptrs[i] = pages_.as<uint8_t>() + offsets[i];
  OSCARKV_RETURN_IF_ERROR(Upload(page_ptrs_, page_ptrs));
  OSCARKV_RETURN_IF_ERROR(Upload(page_kinds_, L.page_kinds));

  OSCARKV_RETURN_IF_ERROR(Upload(dst_page_, L.dst_page));
  OSCARKV_RETURN_IF_ERROR(Upload(dst_slot_, L.dst_slot));

  // Decode page table: entries (page pointer, kind, count) and one sequence per query position.
  std::vector<const uint8_t*> entry_ptrs(L.entry_page.size());
  for (size_t e = 0; e < entry_ptrs.size(); ++e) entry_ptrs[e] = page_ptrs[L.entry_page[e]];
  OSCARKV_RETURN_IF_ERROR(Upload(entry_ptrs_, entry_ptrs));
  OSCARKV_RETURN_IF_ERROR(Upload(entry_kinds_, L.entry_kinds));
  OSCARKV_RETURN_IF_ERROR(Upload(entry_counts_, L.entry_count));
  OSCARKV_RETURN_IF_ERROR(Upload(seq_indptr_, L.seq_indptr));
  OSCARKV_RETURN_IF_ERROR(Upload(seq_entries_, L.seq_entries));
  const cuda::DecodeShape shape = WindowDecodeShape(codec_, in.num_q_heads, H, d);
  OSCARKV_RETURN_IF_ERROR(cuda::ValidateDecodeShape(shape));
  OSCARKV_ASSIGN_OR_RETURN(auto decoder, cuda::PagedDecoder::Create(shape, L.seq_indptr, L.seq_entries,
                                                                    L.entry_kinds, num_sms_));
  decoder_.emplace(std::move(decoder));

  const size_t q_elems = size_t{T} * in.num_q_heads * d, kv_elems = size_t{T} * H * d;
  OSCARKV_ASSIGN_OR_RETURN(q_, DeviceBuffer::Create(q_elems * sizeof(float)));
  OSCARKV_ASSIGN_OR_RETURN(out_, DeviceBuffer::Create(q_elems * sizeof(float)));
  OSCARKV_ASSIGN_OR_RETURN(k_, DeviceBuffer::Create(kv_elems * sizeof(uint16_t)));
  OSCARKV_ASSIGN_OR_RETURN(v_, DeviceBuffer::Create(kv_elems * sizeof(uint16_t)));
  k_host_.resize(kv_elems);
  v_host_.resize(kv_elems);
  tokens_ = T;
  q_heads_ = in.num_q_heads;
  kv_heads_ = H;
  return absl::OkStatus();
}

absl::Status CudaAttention::Attend(const AttentionInputs& in, float* out) {
  OSCARKV_RETURN_IF_ERROR(PrepareCodec(in));
  if (codec_.int2 && in.layer >= layers_) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", in.layer, " but the rotation set has ", layers_));
  }
  if (in.tokens == 0) return absl::OkStatus();
  OSCARKV_RETURN_IF_ERROR(PrepareWindow(in));
  const uint32_t T = in.tokens, H = in.num_kv_heads, d = in.head_dim;
  const size_t kv_elems = size_t{T} * H * d, q_elems = size_t{T} * in.num_q_heads * d;

  // Upload: K/V as bf16 (the write kernel's input), queries as fp32 (rotated by the kernel).
  for (size_t i = 0; i < kv_elems; ++i) {
    k_host_[i] = FloatToBf16(in.k[i]);
    v_host_[i] = FloatToBf16(in.v[i]);
  }
  OSCARKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(k_.get(), k_host_.data(), kv_elems * 2, cudaMemcpyHostToDevice), "K upload"));
  OSCARKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(v_.get(), v_host_.data(), kv_elems * 2, cudaMemcpyHostToDevice), "V upload"));
  OSCARKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(q_.get(), in.q, q_elems * 4, cudaMemcpyHostToDevice), "Q upload"));

  // Quantize-on-write: every page set receives its tokens (BF16 or INT2 by page kind).
  WindowBuffers b;
  b.k = k_.as<uint16_t>();
  b.v = v_.as<uint16_t>();
  b.page_ptrs = page_ptrs_.as<uint8_t* const>();
  b.page_kinds = page_kinds_.as<uint8_t>();
  b.dst_page = dst_page_.as<int32_t>();
  b.dst_slot = dst_slot_.as<int32_t>();
  if (codec_.int2) {
    b.rot_fragments = fragments_.as<uint8_t>();
    // No clip table when no ratio clips (< 1; ratios >= 1 leave rows as they are, in the write
    // kernel and the CPU codec alike): the write kernel then runs its variant compiled without
    // the clip code (169 vs 174 us for the default codec write on an H200, NOTES session 13).
    b.clips = clips_active_ ? clips_.as<float>() : nullptr;
    b.range_modes = modes_.as<uint8_t>();
    b.range_modes_fixed_only = modes_fixed_only_;
  }
  for (size_t s = 0; s < layout_.sets.size(); ++s) {
    OSCARKV_RETURN_IF_ERROR(
        cuda::LaunchQuantizeWrite(WindowWriteParams(layout_, s, codec_, in.layer, H, d, b), nullptr));
  }

  // Decode attention: one sequence per query position over its own view of the pages.
  cuda::DecodeInputs p;
  p.table.page_ptrs = entry_ptrs_.as<const uint8_t* const>();
  p.table.page_kinds = entry_kinds_.as<uint8_t>();
  p.table.page_token_counts = entry_counts_.as<uint16_t>();
  p.table.seq_page_indptr = seq_indptr_.as<int32_t>();
  p.table.seq_page_ids = seq_entries_.as<int32_t>();
  p.q = q_.as<float>();
  if (codec_.int2) {
    p.rot_k = mats_.as<float>() + size_t{in.layer} * 2 * H * d * d;
    p.rot_v = p.rot_k + size_t{H} * d * d;
    p.unrotate_output = true;
  }
  p.out = out_.as<float>();
  OSCARKV_RETURN_IF_ERROR(decoder_->Run(p, nullptr));
  OSCARKV_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(out, out_.get(), q_elems * 4, cudaMemcpyDeviceToHost), "output download"));
  return CudaStatus(cudaGetLastError(), "CUDA attention");
}

}  // namespace

bool CudaAttentionCompiled() { return true; }

absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeCudaAttention(KvCodec codec,
                                                                    const CudaAttentionOptions&) {
  if (!cuda::HaveCudaDevice()) {
    return absl::FailedPreconditionError("no CUDA device is visible (cudaGetDeviceCount found none)");
  }
  if (codec.int2 && codec.rotations == nullptr) {
    return absl::InvalidArgumentError("INT2 codec without rotations");
  }
  return std::unique_ptr<AttentionBackend>(new CudaAttention(std::move(codec)));
}

}  // namespace oscarkv::engine
