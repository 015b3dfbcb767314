// The codec a prefill and a decode engine agree on, and the single-process reference run a
// handoff is compared against. Shared by the daemon handoff (workers.h) and the same-node GPU
// handoff (gpu_handoff.h); links only engine and codec (no client, no gRPC).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/engine/model.h"
#include "oscarkv/kernels/codec_profile.h"
#include "oscarkv/kernels/rotation.h"

namespace oscarkv::pd {

// The codec both sides must agree on: windows and page size over the model's shape, and a
// rotation ("hadamard" or "identity"; the profile carries its digest).
struct CodecOptions {
  uint32_t page_tokens = 64;
  uint32_t sink_tokens = 64;
  uint32_t recent_tokens = 256;
  uint32_t group_size = 128;
  std::string rotation = "hadamard";
};

struct EngineCodec {
  CodecProfile profile;
  std::shared_ptr<const RotationSet> rotations;
};
absl::StatusOr<EngineCodec> MakeEngineCodec(const engine::ModelConfig& config,
                                            const CodecOptions& options);

std::vector<int32_t> BytesToTokens(const std::string& text);
// Byte tokens back to text; non-printable bytes other than \n and \t shown as '.'.
std::string TokensToText(const std::vector<int32_t>& tokens);

// INVALID_ARGUMENT when `tokens` positions exceed the model's context (`what` names them).
absl::Status CheckContext(const engine::Model& model, size_t tokens, const char* what);

// Single-process reference: prefill + greedy generation of tokens + 1 tokens (the first token
// and `tokens` more, as the handoff produces) with the same codec.
absl::StatusOr<std::vector<int32_t>> ReferenceGenerate(const engine::Model& model,
                                                       const EngineCodec& codec,
                                                       const std::vector<int32_t>& prompt,
                                                       uint32_t tokens);

}  // namespace oscarkv::pd
