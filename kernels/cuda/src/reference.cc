#include "oscarkv/cuda/reference.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/quantize.h"

namespace oscarkv::cuda {

absl::StatusOr<AttentionOutput> ReferencePagedDecode(const CodecProfile& profile,
                                                     const RotationSet& rotations,
                                                     const HostPagedKV& kv, uint32_t layer,
                                                     std::span<const float> q,
                                                     uint32_t num_q_heads, bool unrotate_output,
                                                     float softmax_scale) {
  if (kv.seq_page_indptr.empty()) return absl::InvalidArgumentError("empty seq_page_indptr");
  const size_t num_seqs = kv.seq_page_indptr.size() - 1;
  const size_t d = profile.head_dim;
  if (q.size() != num_seqs * num_q_heads * d) {
    return absl::InvalidArgumentError("query size does not match num_seqs * num_q_heads * d");
  }
  AttentionOutput all;
  all.out.resize(num_seqs * num_q_heads * d);
  all.lse.resize(num_seqs * num_q_heads);
  for (size_t b = 0; b < num_seqs; ++b) {
    std::vector<std::span<const uint8_t>> pages;
    for (int32_t i = kv.seq_page_indptr[b]; i < kv.seq_page_indptr[b + 1]; ++i) {
      const int32_t id = kv.seq_page_ids[i];
      if (id < 0 || static_cast<size_t>(id) >= kv.pages.size()) {
        return absl::InvalidArgumentError(absl::StrCat("page id ", id, " out of range"));
      }
      pages.push_back(kv.pages[id]);
    }
    auto res = ReferenceDecodeAttention(profile, rotations, pages, layer,
                                        q.subspan(b * num_q_heads * d, num_q_heads * d),
                                        num_q_heads, unrotate_output, softmax_scale);
    if (!res.ok()) return res.status();
    std::memcpy(all.out.data() + b * num_q_heads * d, res->out.data(), res->out.size() * 4);
    std::memcpy(all.lse.data() + b * num_q_heads, res->lse.data(), res->lse.size() * 4);
  }
  return all;
}

absl::Status ReferenceQuantizeWrite(const QuantizeWriteParams& p, const RotationSet* rotations) {
  if (p.head_dim != 128 || (p.group_size != 128 && p.group_size != 64)) {
    return absl::InvalidArgumentError("head_dim 128 and group 128 or 64 supported");
  }
  const uint32_t d = p.head_dim;
  const PageGeometry g2{p.num_layers, p.num_kv_heads, d, p.group_size, p.page_tokens, PageKind::kInt2};
  const PageGeometry gb{p.num_layers, p.num_kv_heads, d, p.group_size, p.page_tokens, PageKind::kBf16};
  std::vector<float> x(d), y(d);
  for (uint32_t li = 0; li < p.layer_count; ++li) {
    const uint32_t layer = p.first_layer + li;
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t h = 0; h < p.num_kv_heads; ++h) {
        const float clip =
            p.clips != nullptr ? p.clips[(size_t{li} * 2 + kv) * p.num_kv_heads + h] : 1.0f;
        const float* r = rotations ? rotations->matrix(layer, static_cast<KV>(kv), h) : nullptr;
        for (int32_t t = 0; t < p.num_tokens; ++t) {
          const uint16_t* src = (kv ? p.v_src : p.k_src) + li * p.src_layer_stride +
                                t * p.src_token_stride + h * p.src_head_stride;
          for (uint32_t c = 0; c < d; ++c) x[c] = Bf16ToFloat(src[c]);
          if (r != nullptr) {
            RotateRow(x.data(), r, d, y.data());
          } else {
            y = x;
          }
          uint8_t* page = p.page_ptrs[p.dst_page[t]];
          const uint32_t slot = static_cast<uint32_t>(p.dst_slot[t]);
          if (p.page_kinds[p.dst_page[t]] == static_cast<uint8_t>(PageKind::kBf16)) {
            uint8_t* row = page + gb.segment_offset(layer, kv, h) + gb.bf16_row_offset(slot);
            for (uint32_t c = 0; c < d; ++c) {
              const uint16_t b = FloatToBf16(y[c]);
              std::memcpy(row + 2 * c, &b, 2);
            }
          } else {
            ClipRowAtQuantile(y, clip);
            uint8_t* seg = page + g2.segment_offset(layer, kv, h);
            uint16_t sm[2 * 8];
            QuantizeRowInt2(y.data(), d, p.group_size, p.range_mode, seg + g2.code_row_offset(slot), sm);
            std::memcpy(seg + g2.scale_offset(slot, 0), sm, g2.groups_per_row() * 4);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::cuda
