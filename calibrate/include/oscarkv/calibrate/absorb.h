// V-rotation absorption: rewrites a checkpoint so that v_proj emits rotated values
// (W_v,h <- R_V,h^T W_v,h for each KV head h) and o_proj consumes them (W_o,j <- W_o,j R_V,h
// for each query head j of h's group). Attention is linear in V, so the rewritten model
// computes the same function; a KV cache then stores its values already rotated and never
// applies R_V or R_V^T at run time (use ValueIdentity for the codec of the rewritten model).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::calibrate {

// Reads the checkpoint folder `src`, writes `dst`/model.safetensors (tensors in the source
// dtype; rewritten ones rounded from fp32, bf16 round-to-nearest-even) and copies config.json.
absl::Status AbsorbValueRotations(const std::string& src, const RotationSet& rotations,
                                  const std::string& dst);

// The same set with every V rotation replaced by the identity (clips and K kept).
RotationSet ValueIdentity(const RotationSet& rotations);

}  // namespace oscarkv::calibrate
