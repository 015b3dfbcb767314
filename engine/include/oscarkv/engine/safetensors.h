// Minimal safetensors reader and writer (https://huggingface.co/docs/safetensors format):
//   u64le header_len || JSON header (name -> {dtype, shape, data_offsets}, optional
//   "__metadata__": {str: str}) || raw little-endian tensor bytes.
// The reader loads the whole file into memory (checkpoints this engine runs are small enough)
// and validates every tensor's extent against the data section. Readers are immutable after
// Open and safe to share across threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace oscarkv::engine {

enum class DType { kF32, kF16, kBF16, kI32, kI64, kU8 };
absl::StatusOr<DType> ParseDType(const std::string& name);
const char* DTypeName(DType t);
size_t DTypeSize(DType t);

struct TensorInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the owning file's buffer
  size_t bytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::vector<uint8_t> bytes,
                                                                    std::string name);

  const std::string& path() const { return path_; }
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  absl::StatusOr<TensorInfo> Get(const std::string& name) const;
  // Converts any float dtype to fp32 (bf16/f16 exactly); checks the shape when `shape` is
  // non-empty.
  absl::StatusOr<std::vector<float>> GetF32(const std::string& name,
                                            const std::vector<int64_t>& shape = {}) const;
  std::vector<std::string> Names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file. Tensors are written in insertion order (so equal inputs give
// equal bytes); the header is padded with spaces to a multiple of 8.
class SafetensorsWriter {
 public:
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
           size_t bytes);
  void AddF32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v);
  void SetMetadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  std::vector<uint8_t> Serialize() const;
  absl::Status WriteTo(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint folder: either one model.safetensors or a sharded set listed by
// model.safetensors.index.json ("weight_map": tensor -> shard file).
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);
  bool Has(const std::string& name) const { return where_.count(name) > 0; }
  absl::StatusOr<TensorInfo> Get(const std::string& name) const;
  absl::StatusOr<std::vector<float>> GetF32(const std::string& name,
                                            const std::vector<int64_t>& shape = {}) const;
  std::vector<std::string> Names() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, size_t> where_;
};

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);
absl::Status WriteFileBytes(const std::string& path, const void* data, size_t size);

}  // namespace oscarkv::engine
