#include "oscarkv/proto/codec_convert.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace oscarkv::proto {

v1::PageKind ToProto(PageKind kind) {
  return kind == PageKind::kInt2 ? v1::PAGE_KIND_INT2 : v1::PAGE_KIND_BF16;
}

absl::StatusOr<PageKind> FromProto(v1::PageKind kind) {
  switch (kind) {
    case v1::PAGE_KIND_INT2: return PageKind::kInt2;
    case v1::PAGE_KIND_BF16: return PageKind::kBf16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "page kind ", static_cast<int>(kind), " is not INT2 (1) or BF16 (2)"));
  }
}

void ToProto(const CodecProfile& p, v1::CodecProfile* out) {
  out->set_model_id(p.model_id);
  out->set_model_revision(p.model_revision);
  out->set_num_layers(p.num_layers);
  out->set_num_kv_heads(p.num_kv_heads);
  out->set_tp_rank(p.tp_rank);
  out->set_tp_size(p.tp_size);
  out->set_head_dim(p.head_dim);
  out->set_page_tokens(p.page_tokens);
  out->set_group_size(p.group_size);
  out->set_scale_dtype(static_cast<uint32_t>(p.scale_dtype));
  out->set_sink_tokens(p.sink_tokens);
  out->set_recent_tokens(p.recent_tokens);
  bool any = false;
  for (uint8_t b : p.rotation_digest) any |= b != 0;
  if (any) {
    out->set_rotation_digest(std::string(reinterpret_cast<const char*>(p.rotation_digest.data()),
                                         p.rotation_digest.size()));
  }
}

absl::StatusOr<CodecProfile> FromProto(const v1::CodecProfile& p) {
  CodecProfile prof;
  if (p.model_id().size() > 1024 || p.model_revision().size() > 1024) {
    return absl::InvalidArgumentError("model_id and model_revision are limited to 1024 bytes");
  }
  prof.model_id = p.model_id();
  prof.model_revision = p.model_revision();
  prof.num_layers = p.num_layers();
  prof.num_kv_heads = p.num_kv_heads();
  prof.tp_rank = p.tp_rank();
  prof.tp_size = p.tp_size();
  prof.head_dim = p.head_dim();
  prof.page_tokens = p.page_tokens();
  prof.group_size = p.group_size();
  // 0 (unset in proto3) means the only dtype there is.
  if (p.scale_dtype() != 0 && p.scale_dtype() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported scale_dtype ", p.scale_dtype(), " (1 = fp16)"));
  }
  prof.scale_dtype = ScaleDtype::kFp16;
  prof.sink_tokens = p.sink_tokens();
  prof.recent_tokens = p.recent_tokens();
  if (!p.rotation_digest().empty()) {
    if (p.rotation_digest().size() != prof.rotation_digest.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rotation_digest must be 32 bytes or empty, got ", p.rotation_digest().size()));
    }
    std::memcpy(prof.rotation_digest.data(), p.rotation_digest().data(),
                prof.rotation_digest.size());
  }
  return prof;
}

}  // namespace oscarkv::proto
