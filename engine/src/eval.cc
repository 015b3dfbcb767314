#include "oscarkv/engine/eval.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "oscarkv/util/status_macros.h"

namespace oscarkv::engine {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<EvalPlan> PlanEval(size_t text_size, const EvalOptions& o) {
  if (o.windows == 0 || o.window_bytes < 2) {
    return absl::InvalidArgumentError("need at least one window of at least 2 bytes");
  }
  if (text_size < o.window_bytes || text_size < 2 * size_t{o.recall_span}) {
    return absl::InvalidArgumentError(absl::StrCat("text of ", text_size,
                                                   " bytes is shorter than one window"));
  }
  EvalPlan plan;
  uint64_t state = o.seed;
  for (uint32_t i = 0; i < o.windows; ++i) {
    plan.window_offsets.push_back(SplitMix64(state) % (text_size - o.window_bytes + 1));
  }
  if (o.recall_span > 0) {
    for (uint32_t i = 0; i < o.windows; ++i) {
      plan.recall_offsets.push_back(SplitMix64(state) % (text_size - o.recall_span + 1));
    }
  }
  return plan;
}

double SumNll(const std::vector<float>& logits, std::span<const int32_t> tokens, uint32_t vocab,
              uint32_t from) {
  double total = 0;
  for (uint32_t i = std::max(from, 1u); i < tokens.size(); ++i) {
    const float* row = logits.data() + size_t{i - 1} * vocab;
    double mx = row[0];
    for (uint32_t v = 1; v < vocab; ++v) mx = std::max(mx, double{row[v]});
    double sum = 0;
    for (uint32_t v = 0; v < vocab; ++v) sum += std::exp(double{row[v]} - mx);
    total += mx + std::log(sum) - double{row[tokens[i]]};
  }
  return total;
}

absl::StatusOr<std::vector<CodecQuality>> EvaluateCodecs(const Model& model,
                                                          const std::string& text,
                                                          const std::vector<KvCodec>& codecs,
                                                          const EvalOptions& o,
                                                          const ProgressFn& progress,
                                                          const BackendFactory& backends) {
  OSCARKV_ASSIGN_OR_RETURN(EvalPlan plan, PlanEval(text.size(), o));
  if (o.shards == 0 || o.shard >= o.shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", o.shard, " of ", o.shards));
  }
  std::vector<std::unique_ptr<AttentionBackend>> backend(codecs.size());
  for (size_t c = 0; c < codecs.size(); ++c) {
    if (backends) {
      OSCARKV_ASSIGN_OR_RETURN(backend[c], backends(codecs[c]));
    } else {
      backend[c] = std::make_unique<MixedPrecisionAttention>(codecs[c]);
    }
  }
  const uint32_t vocab = model.config().vocab_size;
  if (vocab < 256) return absl::InvalidArgumentError("the harness needs a byte-level model");
  std::vector<CodecQuality> out(codecs.size());
  std::vector<double> nll(codecs.size(), 0), recall(codecs.size(), 0);
  uint64_t total = 0, done = 0;
  std::vector<float> logits;
  auto run = [&](const std::vector<int32_t>& tokens, uint32_t from, std::vector<double>& acc) -> absl::Status {
    for (size_t c = 0; c < codecs.size(); ++c) {
      OSCARKV_RETURN_IF_ERROR(model.Forward(tokens, *backend[c], &logits));
      acc[c] += SumNll(logits, tokens, vocab, from);
      if (progress) progress(++done, total);
    }
    return absl::OkStatus();
  };
  auto mine = [&](size_t i) { return i % o.shards == o.shard; };
  uint32_t windows = 0, probes = 0;
  for (size_t i = 0; i < plan.window_offsets.size(); ++i) windows += mine(i);
  for (size_t i = 0; i < plan.recall_offsets.size(); ++i) probes += mine(i);
  total = uint64_t{windows + probes} * codecs.size();
  for (size_t w = 0; w < plan.window_offsets.size(); ++w) {
    if (!mine(w)) continue;
    const uint64_t off = plan.window_offsets[w];
    std::vector<int32_t> tokens(o.window_bytes);
    for (uint32_t i = 0; i < o.window_bytes; ++i) tokens[i] = static_cast<uint8_t>(text[off + i]);
    OSCARKV_RETURN_IF_ERROR(run(tokens, 1, nll));
  }
  for (size_t w = 0; w < plan.recall_offsets.size(); ++w) {
    if (!mine(w)) continue;
    const uint64_t off = plan.recall_offsets[w];
    std::vector<int32_t> tokens(2 * o.recall_span);
    for (uint32_t i = 0; i < o.recall_span; ++i) {
      tokens[i] = tokens[i + o.recall_span] = static_cast<uint8_t>(text[off + i]);
    }
    OSCARKV_RETURN_IF_ERROR(run(tokens, o.recall_span, recall));
  }
  const double ln2 = std::log(2.0);
  for (size_t c = 0; c < codecs.size(); ++c) {
    out[c].codec = codecs[c].name;
    out[c].windows = windows;
    out[c].recall_windows = probes;
    out[c].bpb = windows == 0 ? std::numeric_limits<double>::quiet_NaN()
                              : nll[c] / ln2 / (double(windows) * (o.window_bytes - 1));
    out[c].recall_bpb = probes == 0 ? std::numeric_limits<double>::quiet_NaN()
                                    : recall[c] / ln2 / (double(probes) * o.recall_span);
  }
  return out;
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), start_(Now()), tty_(isatty(2)) {}

void ProgressBar::Update(uint64_t done, uint64_t total) {
  const int percent = total ? static_cast<int>(100 * done / total) : 100;
  if (!tty_ && percent / 10 == last_percent_ / 10 && done != total) return;
  last_percent_ = percent;
  const int width = 30, fill = width * percent / 100;
  const double el = Now() - start_;
  const double eta = done ? el * (double(total) / done - 1) : 0;
  std::fprintf(stderr, "%s%s [%s%s] %llu/%llu %3.0fs elapsed, ~%3.0fs left%s", tty_ ? "\r" : "",
               label_.c_str(), std::string(fill, '=').c_str(),
               std::string(width - fill, ' ').c_str(), static_cast<unsigned long long>(done),
               static_cast<unsigned long long>(total), el, eta, tty_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace oscarkv::engine
