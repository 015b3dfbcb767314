#include "oscarkv/engine/safetensors.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "oscarkv/kernels/numeric.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::engine {

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  return absl::UnimplementedError(absl::StrCat("unsupported safetensors dtype ", name));
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
  }
  return "?";
}

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<uint8_t> bytes(size > 0 ? static_cast<size_t>(size) : 0);
  const size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (got != bytes.size()) return absl::DataLossError(absl::StrCat("short read of ", path));
  return bytes;
}

absl::Status WriteFileBytes(const std::string& path, const void* data, size_t size) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
  const bool ok = std::fwrite(data, 1, size, f) == size;
  if (std::fclose(f) != 0 || !ok) return absl::DataLossError(absl::StrCat("write failed: ", tmp));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  OSCARKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(path));
  return FromBytes(std::move(bytes), path);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(
    std::vector<uint8_t> bytes, std::string name) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(name, ": not a valid safetensors file: ", why));
  };
  if (bytes.size() < 8) return bad("shorter than 8 bytes");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t{bytes[i]} << (8 * i);
  if (header_len > bytes.size() - 8) return bad("header length past end of file");
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_len,
                                                nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return bad("header is not a JSON object");
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile);
  file->path_ = std::move(name);
  const size_t data_start = 8 + header_len;
  const size_t data_size = bytes.size() - data_start;
  std::map<std::string, size_t> offsets;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return bad("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (m.value().is_string()) file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const nlohmann::json& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("data_offsets") || !t["dtype"].is_string() || !t["shape"].is_array() ||
        !t["data_offsets"].is_array() || t["data_offsets"].size() != 2) {
      return bad(absl::StrCat("malformed entry for tensor ", it.key()));
    }
    TensorInfo info;
    OSCARKV_ASSIGN_OR_RETURN(info.dtype, ParseDType(t["dtype"].get<std::string>()));
    for (const auto& s : t["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) return bad("bad shape");
      info.shape.push_back(s.get<int64_t>());
    }
    if (!t["data_offsets"][0].is_number_unsigned() || !t["data_offsets"][1].is_number_unsigned()) {
      return bad("bad data_offsets");
    }
    const uint64_t begin = t["data_offsets"][0].get<uint64_t>();
    const uint64_t end = t["data_offsets"][1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(absl::StrCat("tensor ", it.key(), " extends past the data section"));
    }
    info.bytes = end - begin;
    if (static_cast<uint64_t>(info.numel()) * DTypeSize(info.dtype) != info.bytes) {
      return bad(absl::StrCat("tensor ", it.key(), " size disagrees with its shape"));
    }
    file->tensors_[it.key()] = info;
    offsets[it.key()] = data_start + begin;
  }
  // Pointers are set once the buffer has its final home.
  file->bytes_ = std::move(bytes);
  for (auto& [n, info] : file->tensors_) info.data = file->bytes_.data() + offsets[n];
  return file;
}

absl::StatusOr<TensorInfo> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", name));
  }
  return it->second;
}

namespace {

absl::StatusOr<std::vector<float>> ToF32(const TensorInfo& t, const std::string& name,
                                         const std::vector<int64_t>& shape) {
  if (!shape.empty() && shape != t.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": expected shape [", absl::StrJoin(shape, ","),
                     "], found [", absl::StrJoin(t.shape, ","), "]"));
  }
  std::vector<float> out(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(out.data(), t.data, t.bytes);
      break;
    case DType::kBF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, t.data + 2 * i, 2);
        out[i] = Bf16ToFloat(b);
      }
      break;
    case DType::kF16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", name, " has dtype ", DTypeName(t.dtype), ", expected a float"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<float>> SafetensorsFile::GetF32(const std::string& name,
                                                           const std::vector<int64_t>& shape) const {
  OSCARKV_ASSIGN_OR_RETURN(TensorInfo t, Get(name));
  return ToF32(t, name, shape);
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, _] : tensors_) names.push_back(n);
  return names;
}

void SafetensorsWriter::Add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            const void* data, size_t bytes) {
  Entry e{name, dtype, std::move(shape), {}};
  e.data.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::AddF32(const std::string& name, std::vector<int64_t> shape,
                               const std::vector<float>& v) {
  Add(name, DType::kF32, std::move(shape), v.data(), v.size() * sizeof(float));
}

std::vector<uint8_t> SafetensorsWriter::Serialize() const {
  // nlohmann::ordered_json keeps insertion order, so the bytes are deterministic.
  nlohmann::ordered_json header;
  if (!metadata_.empty()) {
    nlohmann::ordered_json m;
    for (const auto& [k, v] : metadata_) m[k] = v;
    header["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", DTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.data.size()}}};
    offset += e.data.size();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>((uint64_t{h.size()} >> (8 * i)) & 0xff);
  out.insert(out.end(), h.begin(), h.end());
  for (const Entry& e : entries_) out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

absl::Status SafetensorsWriter::WriteTo(const std::string& path) const {
  const std::vector<uint8_t> bytes = Serialize();
  return WriteFileBytes(path, bytes.data(), bytes.size());
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto ckpt = std::unique_ptr<Checkpoint>(new Checkpoint);
  ckpt->dir_ = dir;
  std::vector<std::string> files;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    OSCARKV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadFileBytes(index.string()));
    nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return absl::DataLossError(absl::StrCat(index.string(), ": no weight_map"));
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string f = it.value().get<std::string>();
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
    std::sort(files.begin(), files.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": neither model.safetensors.index.json nor model.safetensors found"));
  }
  for (const std::string& f : files) {
    OSCARKV_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::Open((fs::path(dir) / f).string()));
    for (const std::string& n : shard->Names()) ckpt->where_[n] = ckpt->shards_.size();
    ckpt->shards_.push_back(std::move(shard));
  }
  return ckpt;
}

absl::StatusOr<TensorInfo> Checkpoint::Get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return absl::NotFoundError(absl::StrCat(dir_, ": no tensor ", name));
  return shards_[it->second]->Get(name);
}

absl::StatusOr<std::vector<float>> Checkpoint::GetF32(const std::string& name,
                                                      const std::vector<int64_t>& shape) const {
  OSCARKV_ASSIGN_OR_RETURN(TensorInfo t, Get(name));
  return ToF32(t, name, shape);
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, _] : where_) names.push_back(n);
  return names;
}

}  // namespace oscarkv::engine
