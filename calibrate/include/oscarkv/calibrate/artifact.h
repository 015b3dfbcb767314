// The rotation artifact: what `oscarkv calibrate` writes and every INT2 OSCAR codec loads.
//
// A folder holding
//   rotations.safetensors  tensors, per layer l:
//                            layers.{l}.k_rotation, layers.{l}.v_rotation  f32 [kv_heads, d, d]
//                            layers.{l}.k_eigenvalues, layers.{l}.v_eigenvalues  f32 [kv_heads, d]
//                          and k_clip, v_clip f32 [layers, kv_heads] (1 = no clip);
//                          k_range_mode, v_range_mode u8 [layers, kv_heads] (quantize.h
//                          RangeMode: 0, 1, 3 or 16..23; other bytes are rejected on read)
//                          only when some mode is not min-max;
//                          __metadata__["oscarkv"] = the JSON below, serialised
//   rotations.json         JSON metadata: format, model, layers, kv_heads, head_dim, objective,
//                          c_s, calibration tokens/windows, text sha256, clip search table,
//                          and "digest" = RotationSet::Digest() in hex (enters the codec id).
// Writing is deterministic: equal inputs give equal bytes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::calibrate {

struct RotationArtifact {
  RotationSet rotations;
  // [layers][2][kv_heads][d], descending per head; zeros when unknown.
  std::vector<float> eigenvalues;
  nlohmann::ordered_json metadata;  // free-form; "digest" and shapes are filled in on Write
};

inline constexpr char kArtifactTensors[] = "rotations.safetensors";
inline constexpr char kArtifactJson[] = "rotations.json";

// Creates `dir` if needed and writes both files.
absl::Status WriteArtifact(const RotationArtifact& artifact, const std::string& dir);
// Reads a folder (or a rotations.safetensors path) and checks shapes, orthogonality of every
// matrix (|R R^T - I| < 1e-3) and the recorded digest.
absl::StatusOr<RotationArtifact> ReadArtifact(const std::string& dir_or_file);

}  // namespace oscarkv::calibrate
