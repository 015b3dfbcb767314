#include "oscarkv/calibrate/artifact.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::calibrate {

using engine::SafetensorsFile;
using engine::SafetensorsWriter;

absl::Status WriteArtifact(const RotationArtifact& a, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const RotationSet& r = a.rotations;
  const uint32_t L = r.layers(), H = r.kv_heads(), d = r.head_dim();
  nlohmann::ordered_json meta = a.metadata;
  meta["format"] = "oscarkv-rotations-v1";
  meta["layers"] = L;
  meta["kv_heads"] = H;
  meta["head_dim"] = d;
  const Sha256Digest digest = r.Digest();
  meta["digest"] = HexEncode(digest.data(), digest.size());

  SafetensorsWriter w;
  const size_t dd = size_t{d} * d;
  for (uint32_t l = 0; l < L; ++l) {
    for (KV kv : {KV::kKey, KV::kValue}) {
      const char* tag = kv == KV::kKey ? "k" : "v";
      std::vector<float> m(H * dd), ev(size_t{H} * d, 0.0f);
      for (uint32_t h = 0; h < H; ++h) {
        std::copy_n(r.matrix(l, kv, h), dd, m.data() + h * dd);
        if (!a.eigenvalues.empty()) {
          const size_t off = ((size_t{l} * 2 + static_cast<uint32_t>(kv)) * H + h) * d;
          std::copy_n(a.eigenvalues.data() + off, d, ev.data() + size_t{h} * d);
        }
      }
      w.AddF32(absl::StrCat("layers.", l, ".", tag, "_rotation"), {H, d, d}, m);
      w.AddF32(absl::StrCat("layers.", l, ".", tag, "_eigenvalues"), {H, d}, ev);
    }
  }
  std::vector<float> kc(size_t{L} * H), vc(size_t{L} * H);
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t h = 0; h < H; ++h) {
      kc[l * H + h] = r.clip(l, KV::kKey, h);
      vc[l * H + h] = r.clip(l, KV::kValue, h);
    }
  }
  w.AddF32("k_clip", {L, H}, kc);
  w.AddF32("v_clip", {L, H}, vc);
  if (r.has_range_modes()) {
    std::vector<uint8_t> km(size_t{L} * H), vm(size_t{L} * H);
    for (uint32_t l = 0; l < L; ++l) {
      for (uint32_t h = 0; h < H; ++h) {
        km[l * H + h] = static_cast<uint8_t>(r.range_mode(l, KV::kKey, h));
        vm[l * H + h] = static_cast<uint8_t>(r.range_mode(l, KV::kValue, h));
      }
    }
    w.Add("k_range_mode", engine::DType::kU8, {L, H}, km.data(), km.size());
    w.Add("v_range_mode", engine::DType::kU8, {L, H}, vm.data(), vm.size());
  }
  w.SetMetadata("oscarkv", meta.dump());
  OSCARKV_RETURN_IF_ERROR(w.WriteTo((fs::path(dir) / kArtifactTensors).string()));
  const std::string js = meta.dump(2) + "\n";
  return engine::WriteFileBytes((fs::path(dir) / kArtifactJson).string(), js.data(), js.size());
}

absl::StatusOr<RotationArtifact> ReadArtifact(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  std::string path = dir_or_file;
  if (fs::is_directory(path)) path = (fs::path(path) / kArtifactTensors).string();
  OSCARKV_ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(path));
  auto it = f->metadata().find("oscarkv");
  if (it == f->metadata().end()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an oscarkv rotation artifact"));
  }
  RotationArtifact a;
  a.metadata = nlohmann::ordered_json::parse(it->second, nullptr, false);
  if (!a.metadata.is_object() || a.metadata.value("format", "") != "oscarkv-rotations-v1") {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unknown artifact format"));
  }
  const uint32_t L = a.metadata.value("layers", 0u), H = a.metadata.value("kv_heads", 0u),
                 d = a.metadata.value("head_dim", 0u);
  if (L == 0 || H == 0 || d == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": bad shape"));
  const size_t dd = size_t{d} * d;
  std::vector<float> matrices(size_t{L} * 2 * H * dd), eig(size_t{L} * 2 * H * d);
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const char* tag = kv == 0 ? "k" : "v";
      OSCARKV_ASSIGN_OR_RETURN(std::vector<float> m,
                               f->GetF32(absl::StrCat("layers.", l, ".", tag, "_rotation"),
                                         {int64_t{H}, int64_t{d}, int64_t{d}}));
      std::copy(m.begin(), m.end(), matrices.begin() + (size_t{l} * 2 + kv) * H * dd);
      OSCARKV_ASSIGN_OR_RETURN(std::vector<float> ev,
                               f->GetF32(absl::StrCat("layers.", l, ".", tag, "_eigenvalues"),
                                         {int64_t{H}, int64_t{d}}));
      std::copy(ev.begin(), ev.end(), eig.begin() + (size_t{l} * 2 + kv) * H * d);
    }
  }
  OSCARKV_ASSIGN_OR_RETURN(std::vector<float> kc, f->GetF32("k_clip", {int64_t{L}, int64_t{H}}));
  OSCARKV_ASSIGN_OR_RETURN(std::vector<float> vc, f->GetF32("v_clip", {int64_t{L}, int64_t{H}}));
  std::vector<float> clips(size_t{L} * 2 * H);
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t h = 0; h < H; ++h) {
      clips[(size_t{l} * 2) * H + h] = kc[l * H + h];
      clips[(size_t{l} * 2 + 1) * H + h] = vc[l * H + h];
    }
  }
  // Orthogonality: a damaged matrix would silently corrupt every score.
  for (size_t m = 0; m < size_t{L} * 2 * H; ++m) {
    const float* r = matrices.data() + m * dd;
    for (uint32_t i = 0; i < d; ++i) {
      for (uint32_t j = i; j < d; ++j) {
        double dot = 0;
        for (uint32_t k = 0; k < d; ++k) dot += double{r[i * d + k]} * r[j * d + k];
        if (std::fabs(dot - (i == j ? 1.0 : 0.0)) > 1e-3) {
          return absl::DataLossError(absl::StrCat(path, ": rotation ", m, " is not orthogonal"));
        }
      }
    }
  }
  OSCARKV_ASSIGN_OR_RETURN(a.rotations,
                           RotationSet::FromData(L, H, d, std::move(matrices), std::move(clips)));
  for (const char* tag : {"k", "v"}) {
    const std::string name = absl::StrCat(tag, "_range_mode");
    if (!f->Has(name)) continue;
    OSCARKV_ASSIGN_OR_RETURN(engine::TensorInfo t, f->Get(name));
    if (t.dtype != engine::DType::kU8 || t.numel() != int64_t{L} * H) {
      return absl::DataLossError(absl::StrCat(path, ": bad ", name));
    }
    for (uint32_t l = 0; l < L; ++l) {
      for (uint32_t h = 0; h < H; ++h) {
        const uint8_t m = t.data[l * H + h];
        if (m == 2) {
          return absl::FailedPreconditionError(absl::StrCat(
              path, ": range mode 2 (unbiased v1) was replaced by mode 3 (unbiased v2, "
                    "docs/FORMAT.md 1.3.1); re-run `oscarkv calibrate` to write a current artifact"));
        }
        if (!IsRangeMode(m)) {
          return absl::DataLossError(absl::StrCat(
              path, ": ", name, " of layer ", l, " head ", h, " is ", m,
              ", not a known range mode (0 minmax, 1 search, 3 unbiased, 16..23 unbiased-fixed "
              "0..7; docs/FORMAT.md 1.3.1)"));
        }
        a.rotations.set_range_mode(l, tag[0] == 'k' ? KV::kKey : KV::kValue, h,
                                   static_cast<RangeMode>(m));
      }
    }
  }
  a.eigenvalues = std::move(eig);
  const Sha256Digest digest = a.rotations.Digest();
  if (a.metadata.value("digest", "") != HexEncode(digest.data(), digest.size())) {
    return absl::DataLossError(absl::StrCat(path, ": digest does not match the tensors"));
  }
  return a;
}

}  // namespace oscarkv::calibrate
