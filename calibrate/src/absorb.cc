#include "oscarkv/calibrate/absorb.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/engine/safetensors.h"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::calibrate {

using engine::Checkpoint;
using engine::DType;
using engine::TensorInfo;

namespace {

void AddLike(engine::SafetensorsWriter& w, const std::string& name, const TensorInfo& like,
             const std::vector<float>& values) {
  if (like.dtype == DType::kBF16) {
    std::vector<uint16_t> b(values.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = FloatToBf16(values[i]);
    w.Add(name, DType::kBF16, like.shape, b.data(), b.size() * 2);
  } else if (like.dtype == DType::kF16) {
    std::vector<uint16_t> b(values.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = FloatToHalf(values[i]);
    w.Add(name, DType::kF16, like.shape, b.data(), b.size() * 2);
  } else {
    w.AddF32(name, like.shape, values);
  }
}

}  // namespace

absl::Status AbsorbValueRotations(const std::string& src, const RotationSet& rot,
                                  const std::string& dst) {
  namespace fs = std::filesystem;
  OSCARKV_ASSIGN_OR_RETURN(engine::ModelConfig c,
                           engine::ModelConfig::FromJsonFile((fs::path(src) / "config.json").string()));
  if (rot.layers() != c.num_layers || rot.kv_heads() != c.num_kv_heads || rot.head_dim() != c.head_dim) {
    return absl::InvalidArgumentError("rotation set shape does not match the checkpoint");
  }
  OSCARKV_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(src));
  const uint32_t d = c.head_dim, H = c.hidden_size, group = c.num_q_heads / c.num_kv_heads;
  engine::SafetensorsWriter w;
  for (const std::string& name : ckpt->Names()) {
    OSCARKV_ASSIGN_OR_RETURN(TensorInfo info, ckpt->Get(name));
    const bool is_v = absl::EndsWith(name, ".self_attn.v_proj.weight");
    const bool is_o = absl::EndsWith(name, ".self_attn.o_proj.weight");
    if (!is_v && !is_o) {
      w.Add(name, info.dtype, info.shape, info.data, info.bytes);
      continue;
    }
    uint32_t l = 0;
    if (std::sscanf(name.c_str(), "model.layers.%u.", &l) != 1 || l >= c.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected tensor name ", name));
    }
    OSCARKV_ASSIGN_OR_RETURN(std::vector<float> m, ckpt->GetF32(name));
    std::vector<float> out(m.size(), 0.0f);
    if (is_v) {  // [kv_heads*d, H]: rows i of head h -> sum_k R[k][i] * W[h*d+k]
      for (uint32_t h = 0; h < c.num_kv_heads; ++h) {
        const float* r = rot.matrix(l, KV::kValue, h);
        for (uint32_t i = 0; i < d; ++i) {
          float* dst_row = out.data() + (size_t{h} * d + i) * H;
          for (uint32_t k = 0; k < d; ++k) {
            const float a = r[size_t{k} * d + i];
            const float* src_row = m.data() + (size_t{h} * d + k) * H;
            for (uint32_t x = 0; x < H; ++x) dst_row[x] += a * src_row[x];
          }
        }
      }
    } else {  // [H, q_heads*d]: block j columns -> W_o,j R
      const uint32_t cols = c.num_q_heads * d;
      for (uint32_t row = 0; row < H; ++row) {
        for (uint32_t j = 0; j < c.num_q_heads; ++j) {
          const float* r = rot.matrix(l, KV::kValue, j / group);
          const float* in = m.data() + size_t{row} * cols + size_t{j} * d;
          float* o = out.data() + size_t{row} * cols + size_t{j} * d;
          for (uint32_t k = 0; k < d; ++k) {
            for (uint32_t i = 0; i < d; ++i) o[i] += in[k] * r[size_t{k} * d + i];
          }
        }
      }
    }
    AddLike(w, name, info, out);
  }
  std::error_code ec;
  fs::create_directories(dst, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dst));
  w.SetMetadata("format", "pt");
  w.SetMetadata("oscarkv_absorbed_v_rotation", HexEncode(rot.Digest().data(), 32));
  OSCARKV_RETURN_IF_ERROR(w.WriteTo((fs::path(dst) / "model.safetensors").string()));
  fs::copy_file(fs::path(src) / "config.json", fs::path(dst) / "config.json",
                fs::copy_options::overwrite_existing, ec);
  if (ec) return absl::InternalError(absl::StrCat("copying config.json: ", ec.message()));
  return absl::OkStatus();
}

RotationSet ValueIdentity(const RotationSet& rot) {
  const uint32_t L = rot.layers(), H = rot.kv_heads(), d = rot.head_dim();
  std::vector<float> m = rot.matrices();
  const size_t dd = size_t{d} * d;
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t h = 0; h < H; ++h) {
      float* v = m.data() + ((size_t{l} * 2 + 1) * H + h) * dd;
      std::fill(v, v + dd, 0.0f);
      for (uint32_t i = 0; i < d; ++i) v[size_t{i} * d + i] = 1.0f;
    }
  }
  RotationSet out = *RotationSet::FromData(L, H, d, std::move(m), rot.clips());
  for (uint32_t l = 0; l < L; ++l) {
    for (uint32_t h = 0; h < H; ++h) {
      for (KV kv : {KV::kKey, KV::kValue}) out.set_range_mode(l, kv, h, rot.range_mode(l, kv, h));
    }
  }
  return out;
}

}  // namespace oscarkv::calibrate
