// A small random-weight Qwen3-style checkpoint, written as a Hugging Face folder (config.json +
// model.safetensors, BF16 weights) that Model::Load reads like any other.
//
// What it is for: running the engine, the prefill->decode handoff and the demo on a machine that
// has no trained model. The weights are random, so generations are gibberish, but every code
// path (projections, RoPE, the paged INT2/BF16 cache, the handoff) is exercised and a handoff
// can still be compared token for token against a single-process run.
//
// Deterministic: the same options give the same bytes on every machine (the generator is
// std::mt19937_64 with a fixed seed, mapped to uniform values by integer arithmetic, not
// std::*_distribution, whose output the standard leaves to the library). The tokenizer is
// bytes (vocab 256), like the reference model; the output head favours printable ASCII so a
// generation prints as text.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace oscarkv::engine {

struct RandomCheckpointOptions {
  uint64_t seed = 20260101;
  uint32_t num_layers = 4;
  uint32_t hidden_size = 256;
  uint32_t intermediate_size = 512;
  uint32_t num_q_heads = 4;
  uint32_t num_kv_heads = 2;
  uint32_t head_dim = 128;  // the codec takes 64, 128 or 256
  uint32_t max_positions = 4096;
  std::string model_id = "oscarkv-random-qwen3";
};

// Writes the checkpoint into `dir` (created if missing; existing config.json and
// model.safetensors are replaced). About 2 * (parameters) bytes: ~6.6 MB with the defaults.
absl::Status WriteRandomCheckpoint(const std::string& dir,
                                   const RandomCheckpointOptions& options = {});

}  // namespace oscarkv::engine
