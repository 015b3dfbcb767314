// The daemon-free half of the C ABI (oscarkv_c.h): status names, codec profiles and ids, rotation
// sets and the page builder/reader over the codec library (kernels/ page_codec.h).
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "oscarkv/client/oscarkv_c.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/kernels/page_codec.h"
#include "oscarkv/kernels/quantize.h"
#include "oscarkv/kernels/rotation.h"
#include "oscarkv_c_internal.h"

using oscarkv::CodecProfile;
using oscarkv::PageKind;
using oscarkv::RotationSet;
using oscarkv::c_abi::Fail;
using oscarkv::c_abi::Ok;

struct oscarkv_rotation {
  RotationSet set;
  oscarkv::Sha256Digest digest;
};

namespace oscarkv::c_abi {

std::string& LastError() {
  thread_local std::string last_error;
  return last_error;
}

CodecProfile ProfileFromC(const oscarkv_codec_profile& c) {
  CodecProfile p;
  p.model_id = c.model_id ? c.model_id : "";
  p.model_revision = c.model_revision ? c.model_revision : "";
  p.num_layers = c.num_layers;
  p.num_kv_heads = c.num_kv_heads;
  p.tp_rank = c.tp_rank;
  p.tp_size = c.tp_size;
  p.head_dim = c.head_dim;
  p.page_tokens = c.page_tokens;
  p.group_size = c.group_size;
  p.scale_dtype = static_cast<oscarkv::ScaleDtype>(c.scale_dtype);
  p.sink_tokens = c.sink_tokens;
  p.recent_tokens = c.recent_tokens;
  std::memcpy(p.rotation_digest.data(), c.rotation_digest, 32);
  return p;
}

}  // namespace oscarkv::c_abi

namespace {

using oscarkv::c_abi::ProfileFromC;

absl::StatusOr<PageKind> KindFromC(int kind) {
  if (kind == OSCARKV_PAGE_INT2) return PageKind::kInt2;
  if (kind == OSCARKV_PAGE_BF16) return PageKind::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("page kind ", kind, " is neither OSCARKV_PAGE_INT2 (1) nor _BF16 (2)"));
}

// Largest |R R^T - I| entry of a d x d row-major matrix (NaN-propagating: returns NaN).
float OrthogonalityError(const float* r, uint32_t d) {
  float worst = 0.0f;
  for (uint32_t i = 0; i < d; ++i) {
    for (uint32_t j = i; j < d; ++j) {
      double dot = 0.0;
      for (uint32_t k = 0; k < d; ++k) dot += double{r[size_t{i} * d + k]} * r[size_t{j} * d + k];
      const float e = static_cast<float>(std::fabs(dot - (i == j ? 1.0 : 0.0)));
      if (!(e <= worst)) worst = e;  // NaN wins
    }
  }
  return worst;
}

}  // namespace

extern "C" {

const char* oscarkv_last_error(void) { return oscarkv::c_abi::LastError().c_str(); }

const char* oscarkv_status_name(int code) {
  static const char* const kNames[] = {
      "OK",        "CANCELLED",         "UNKNOWN",      "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS",    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",    "INTERNAL",
      "UNAVAILABLE", "DATA_LOSS"};
  if (code < 0 || code >= static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) {
    return "UNKNOWN_CODE";
  }
  return kNames[code];
}

int oscarkv_abi_version(void) { return OSCARKV_ABI_VERSION; }

int oscarkv_builtin_profile(const char* shape, oscarkv_codec_profile* out) {
  if (shape == nullptr || out == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "shape and out must not be NULL");
  }
  // One immutable profile per shape for the life of the process: `out` points at its strings.
  static absl::Mutex mu(absl::kConstInit);
  static auto* profiles = new std::map<std::string, std::unique_ptr<CodecProfile>>;
  const CodecProfile* p = nullptr;
  {
    absl::MutexLock lock(&mu);
    auto it = profiles->find(shape);
    if (it == profiles->end()) {
      auto made = oscarkv::BuiltinProfile(shape);
      if (!made.ok()) return Fail(made.status());
      it = profiles->emplace(shape, std::make_unique<CodecProfile>(*std::move(made))).first;
    }
    p = it->second.get();
  }
  *out = {};
  out->model_id = p->model_id.c_str();
  out->model_revision = p->model_revision.c_str();
  out->num_layers = p->num_layers;
  out->num_kv_heads = p->num_kv_heads;
  out->tp_rank = p->tp_rank;
  out->tp_size = p->tp_size;
  out->head_dim = p->head_dim;
  out->page_tokens = p->page_tokens;
  out->group_size = p->group_size;
  out->scale_dtype = static_cast<uint32_t>(p->scale_dtype);
  out->sink_tokens = p->sink_tokens;
  out->recent_tokens = p->recent_tokens;
  std::memcpy(out->rotation_digest, p->rotation_digest.data(), 32);
  return Ok();
}

int oscarkv_codec_id(const oscarkv_codec_profile* profile, uint8_t id_out[16]) {
  if (profile == nullptr || id_out == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "profile and id_out must not be NULL");
  }
  const CodecProfile p = ProfileFromC(*profile);
  if (absl::Status s = p.Validate(); !s.ok()) return Fail(s);
  std::memcpy(id_out, p.Id().bytes.data(), 16);
  return Ok();
}

int oscarkv_page_size(const oscarkv_codec_profile* profile, int kind, uint64_t* bytes) {
  if (profile == nullptr || bytes == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "profile and bytes must not be NULL");
  }
  auto k = KindFromC(kind);
  if (!k.ok()) return Fail(k.status());
  const CodecProfile p = ProfileFromC(*profile);
  if (absl::Status s = p.Validate(); !s.ok()) return Fail(s);
  *bytes = oscarkv::GeometryFor(p, *k).page_bytes();
  return Ok();
}

int oscarkv_rotation_create(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                            const float* matrices, const float* clips,
                            const uint8_t* range_modes, oscarkv_rotation** out) {
  if (out == nullptr || matrices == nullptr || clips == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "matrices, clips and out must not be NULL");
  }
  *out = nullptr;
  if (layers == 0 || layers > 4096 || kv_heads == 0 || kv_heads > 256 ||
      (head_dim != 64 && head_dim != 128 && head_dim != 256)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT,
                "rotation shape: layers 1..4096, kv_heads 1..256, head_dim 64/128/256");
  }
  const size_t n = size_t{layers} * 2 * kv_heads;
  const size_t dd = size_t{head_dim} * head_dim;
  for (size_t i = 0; i < n; ++i) {
    const float e = OrthogonalityError(matrices + i * dd, head_dim);
    if (!(e < 1e-3f)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "rotation matrix ", i, " (layer ", i / (2 * kv_heads), ", ",
          (i / kv_heads) % 2 == 0 ? "K" : "V", ", head ", i % kv_heads,
          ") is not orthogonal: max |R R^T - I| = ", e, " (limit 1e-3)")));
    }
  }
  auto set = RotationSet::FromData(layers, kv_heads, head_dim,
                                   std::vector<float>(matrices, matrices + n * dd),
                                   std::vector<float>(clips, clips + n));
  if (!set.ok()) return Fail(set.status());
  if (range_modes != nullptr) {
    for (size_t i = 0; i < n; ++i) {
      if (!oscarkv::IsRangeMode(range_modes[i])) {
        return Fail(absl::InvalidArgumentError(absl::StrCat(
            "range mode ", range_modes[i], " at index ", i,
            " is not 0, 1, 3 or 16..23 (docs/FORMAT.md 1.3.1)")));
      }
      set->set_range_mode(static_cast<uint32_t>(i / (2 * kv_heads)),
                          static_cast<oscarkv::KV>((i / kv_heads) % 2),
                          static_cast<uint32_t>(i % kv_heads),
                          static_cast<oscarkv::RangeMode>(range_modes[i]));
    }
  }
  auto* r = new oscarkv_rotation{*std::move(set), {}};
  r->digest = r->set.Digest();
  *out = r;
  return Ok();
}

void oscarkv_rotation_free(oscarkv_rotation* rotation) { delete rotation; }

int oscarkv_rotation_digest(const oscarkv_rotation* rotation, uint8_t digest_out[32]) {
  if (rotation == nullptr || digest_out == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "rotation and digest_out must not be NULL");
  }
  std::memcpy(digest_out, rotation->digest.data(), 32);
  return Ok();
}

int oscarkv_build_page(const oscarkv_codec_profile* profile, const oscarkv_rotation* rotation,
                       int kind, int dtype, const void* rows, uint32_t token_count, void* out,
                       size_t out_bytes) {
  if (profile == nullptr || rows == nullptr || out == nullptr) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "profile, rows and out must not be NULL");
  }
  auto k = KindFromC(kind);
  if (!k.ok()) return Fail(k.status());
  if (dtype != OSCARKV_DTYPE_F32 && dtype != OSCARKV_DTYPE_BF16) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "dtype must be OSCARKV_DTYPE_F32 or _BF16");
  }
  const CodecProfile p = ProfileFromC(*profile);
  if (absl::Status s = p.Validate(); !s.ok()) return Fail(s);
  if (token_count == 0 || token_count > p.page_tokens) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("token_count ", token_count, " must be 1..page_tokens (", p.page_tokens,
                     ")")));
  }
  if (rotation != nullptr && rotation->digest != p.rotation_digest) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT,
                "the rotation's digest differs from profile->rotation_digest: pages built with "
                "it would not be this codec's");
  }
  const size_t n = size_t{p.num_layers} * 2 * token_count * p.num_kv_heads * p.head_dim;
  std::vector<float> converted;
  const float* data = static_cast<const float*>(rows);
  if (dtype == OSCARKV_DTYPE_BF16) {
    converted.resize(n);
    const auto* src = static_cast<const uint16_t*>(rows);
    for (size_t i = 0; i < n; ++i) converted[i] = oscarkv::Bf16ToFloat(src[i]);
    data = converted.data();
  }
  const oscarkv::KVSequenceView view{data, p.num_layers, p.num_kv_heads, p.head_dim, token_count};
  absl::Status s =
      oscarkv::EncodePage(p, rotation ? &rotation->set : nullptr, *k, view, 0, token_count,
                          {static_cast<uint8_t*>(out), out_bytes});
  return s.ok() ? Ok() : Fail(s);
}

int oscarkv_decode_page(const oscarkv_codec_profile* profile, const void* page,
                        size_t page_bytes, float* rows_out, size_t rows_capacity,
                        uint32_t* token_count, int* kind) {
  if (profile == nullptr || page == nullptr || (rows_out == nullptr && rows_capacity > 0)) {
    return Fail(OSCARKV_E_INVALID_ARGUMENT, "profile and page must not be NULL");
  }
  const CodecProfile p = ProfileFromC(*profile);
  if (absl::Status s = p.Validate(); !s.ok()) return Fail(s);
  auto d = oscarkv::DecodePage(p, {static_cast<const uint8_t*>(page), page_bytes});
  if (!d.ok()) return Fail(d.status());
  if (d->rows.size() > rows_capacity) {
    return Fail(absl::OutOfRangeError(absl::StrCat("rows_out holds ", rows_capacity,
                                                   " floats, the page decodes to ",
                                                   d->rows.size())));
  }
  std::memcpy(rows_out, d->rows.data(), d->rows.size() * sizeof(float));
  if (token_count != nullptr) *token_count = d->token_count;
  if (kind != nullptr) *kind = static_cast<int>(d->kind);
  return Ok();
}

}  // extern "C"
