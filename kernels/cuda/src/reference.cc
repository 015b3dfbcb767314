#include "oscarkv/cuda/reference.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/kernels/page_set.h"
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

absl::StatusOr<AttentionOutput> ReferenceExtendAttention(
    const CodecProfile& profile, const RotationSet& rotations, const HostPagedKV& kv,
    uint32_t layer, std::span<const int32_t> q_indptr, std::span<const float> q,
    std::span<const uint16_t> k_new, std::span<const uint16_t> v_new, uint32_t num_q_heads,
    bool unrotate_output, float softmax_scale) {
  const size_t d = profile.head_dim, H = profile.num_kv_heads, L = profile.num_layers;
  if (kv.seq_page_indptr.empty() || q_indptr.size() != kv.seq_page_indptr.size()) {
    return absl::InvalidArgumentError("q_indptr and seq_page_indptr must both have num_seqs + 1 entries");
  }
  const size_t num_seqs = q_indptr.size() - 1;
  const size_t total = static_cast<size_t>(q_indptr.back());
  if (q.size() != total * num_q_heads * d || k_new.size() != total * H * d || v_new.size() != total * H * d) {
    return absl::InvalidArgumentError("q / k_new / v_new sizes do not match q_indptr");
  }
  AttentionOutput all;
  all.out.resize(total * num_q_heads * d);
  all.lse.resize(total * num_q_heads);
  for (size_t b = 0; b < num_seqs; ++b) {
    // Rotated rows of `layer`: prefix tokens in page order, then the new tokens.
    std::vector<float> k_rows, v_rows;  // [token][H][d]
    for (int32_t i = kv.seq_page_indptr[b]; i < kv.seq_page_indptr[b + 1]; ++i) {
      const int32_t id = kv.seq_page_ids[i];
      if (id < 0 || static_cast<size_t>(id) >= kv.pages.size()) {
        return absl::InvalidArgumentError(absl::StrCat("page id ", id, " out of range"));
      }
      auto page = DecodePage(profile, kv.pages[id]);
      if (!page.ok()) return page.status();
      const KVSequenceView view = page->view(profile);
      for (uint32_t t = 0; t < page->token_count; ++t) {
        for (uint32_t h = 0; h < H; ++h) {
          const float* kr = view.row(layer, 0, t, h);
          const float* vr = view.row(layer, 1, t, h);
          k_rows.insert(k_rows.end(), kr, kr + d);
          v_rows.insert(v_rows.end(), vr, vr + d);
        }
      }
    }
    const size_t prefix = k_rows.size() / (H * d);
    const size_t q0 = static_cast<size_t>(q_indptr[b]), n_new = static_cast<size_t>(q_indptr[b + 1]) - q0;
    for (size_t j = 0; j < n_new * H * d; ++j) {
      k_rows.push_back(Bf16ToFloat(k_new[q0 * H * d + j]));
      v_rows.push_back(Bf16ToFloat(v_new[q0 * H * d + j]));
    }
    for (size_t i = 0; i < n_new; ++i) {
      // Dense view of all layers (only `layer` filled) over prefix + new tokens 0..i.
      const size_t T = prefix + i + 1;
      std::vector<float> dense(L * 2 * T * H * d, 0.0f);
      KVSequenceView view{dense.data(), static_cast<uint32_t>(L), static_cast<uint32_t>(H),
                          static_cast<uint32_t>(d), static_cast<uint32_t>(T)};
      for (size_t t = 0; t < T; ++t) {
        for (size_t h = 0; h < H; ++h) {
          std::memcpy(const_cast<float*>(view.row(layer, 0, t, h)), k_rows.data() + (t * H + h) * d, d * 4);
          std::memcpy(const_cast<float*>(view.row(layer, 1, t, h)), v_rows.data() + (t * H + h) * d, d * 4);
        }
      }
      const AttentionOutput o = DenseDecodeAttention(
          profile, rotations, view, layer, q.subspan((q0 + i) * num_q_heads * d, num_q_heads * d),
          num_q_heads, unrotate_output, softmax_scale);
      std::memcpy(all.out.data() + (q0 + i) * num_q_heads * d, o.out.data(), o.out.size() * 4);
      std::memcpy(all.lse.data() + (q0 + i) * num_q_heads, o.lse.data(), o.lse.size() * 4);
    }
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
        const RangeMode mode =
            p.range_modes != nullptr
                ? static_cast<RangeMode>(p.range_modes[(size_t{li} * 2 + kv) * p.num_kv_heads + h])
                : p.range_mode;
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
            QuantizeRowInt2(y.data(), d, p.group_size, mode, seg + g2.code_row_offset(slot), sm);
            std::memcpy(seg + g2.scale_offset(slot, 0), sm, g2.groups_per_row() * 4);
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::cuda
