// The quality harness: bits per byte of a byte-level model over fixed random windows of a text,
// and a long-range recall probe, for several KV-cache codecs in one run.
//
// Windows: `windows` offsets drawn from a SplitMix64 stream seeded with `seed`, uniform over
// [0, size - window_bytes]; each window is a teacher-forced forward pass and its bpb is the
// mean next-byte NLL (in bits) over the window's bytes 1..n-1.
// Recall probe: `windows` spans of `recall_span` bytes (offsets from the same stream, after the
// windows), each fed as span || span; the figure is the bpb over the second copy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "oscarkv/engine/attention.h"
#include "oscarkv/engine/model.h"

namespace oscarkv::engine {

struct EvalOptions {
  uint32_t windows = 16;
  uint32_t window_bytes = 2048;
  uint32_t recall_span = 1000;  // 0 disables the recall probe
  uint64_t seed = 1;
  // Evaluate only windows (and probes) i with i % shards == shard; offsets are those of the full
  // plan, so shards of one run partition it and their figures combine exactly (weighted by the
  // evaluated counts: every window has the same number of predicted bytes).
  uint32_t shard = 0, shards = 1;
};

struct CodecQuality {
  std::string codec;
  double bpb = 0, recall_bpb = 0;  // recall_bpb is NaN when the probe is disabled
  uint32_t windows = 0, recall_windows = 0;  // how many were evaluated (fewer in a shard)
};

// The window and probe offsets the harness uses (deterministic in seed and text size).
struct EvalPlan {
  std::vector<uint64_t> window_offsets, recall_offsets;
};
absl::StatusOr<EvalPlan> PlanEval(size_t text_size, const EvalOptions& options);

// Progress callback: (done, total) forward passes.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

// Makes the attention backend of one codec; EvaluateCodecs makes one per codec and reuses it for
// every window. Empty: MixedPrecisionAttention (the CPU reference).
using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<AttentionBackend>>(const KvCodec& codec)>;

absl::StatusOr<std::vector<CodecQuality>> EvaluateCodecs(const Model& model,
                                                          const std::string& text,
                                                          const std::vector<KvCodec>& codecs,
                                                          const EvalOptions& options,
                                                          const ProgressFn& progress = {},
                                                          const BackendFactory& backends = {});

// Sum of next-token NLL in nats over predicted positions [from, n) of a teacher-forced pass.
double SumNll(const std::vector<float>& logits, std::span<const int32_t> tokens, uint32_t vocab,
              uint32_t from);

// A one-line progress bar on stderr ("label [=====     ] 12/32 0:41 elapsed").
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  void Update(uint64_t done, uint64_t total);
  void Finish();

 private:
  std::string label_;
  double start_;
  bool tty_;
  int last_percent_ = -1;
};

}  // namespace oscarkv::engine
