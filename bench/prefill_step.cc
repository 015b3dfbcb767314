// The prefill-step row of `oscarkv bench kernels` (PrefillStepRow): quantize-on-write beside the
// attention and the projections of the same 32K-token prefill step of one Qwen3-8B layer.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernel_bench.h"
#include "nlohmann/json.hpp"
#include "oscarkv/cuda/device_buffer.h"
#include "oscarkv/cuda/extend_attention.h"

namespace oscarkv::bench {
namespace {

constexpr uint32_t kHidden = 4096, kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kMlp = 12288;

// Median of `samples` timed batches of back-to-back calls (CUDA events).
template <typename F>
absl::StatusOr<double> MedianUs(F&& call, int samples) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> v;
  absl::Status st = call();  // warm-up
  for (int s = 0; st.ok() && s < samples; ++s) {
    cudaEventRecord(a);
    st = call();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    v.push_back(1000.0 * ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (!st.ok()) return st;
  if (absl::Status e = cuda::CudaStatus(cudaDeviceSynchronize(), "prefill step"); !e.ok()) return e;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// GEMM times (us) of MxNxK shapes from the GEMM baseline (same device call), by shape string.
absl::StatusOr<std::vector<double>> GemmUs(const std::string& command,
                                           const std::vector<std::string>& shapes) {
  std::string list;
  for (const std::string& s : shapes) list += (list.empty() ? "" : ",") + s;
  const std::string cmd = absl::StrCat(command, " --shapes ", list);
  std::fprintf(stderr, "[bench] gemm baseline: %s\n", cmd.c_str());
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return absl::UnavailableError("cannot start the GEMM baseline");
  std::vector<double> us(shapes.size(), 0);
  char line[4096];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("us")) continue;
    const std::string key = absl::StrCat(j["M"].get<int>(), "x", j["N"].get<int>(), "x", j["K"].get<int>());
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (shapes[i] == key) us[i] = j["us"].get<double>();
    }
  }
  const int rc = pclose(f);
  for (double x : us) {
    if (x <= 0) return absl::UnavailableError(absl::StrCat("GEMM baseline exited ", rc, " without every shape"));
  }
  return us;
}

}  // namespace

double PrefillStepRow::share() const {
  return attention_us + projections_us > 0 ? quant_us / (attention_us + projections_us) : 0;
}
double PrefillStepRow::share_sdpa() const {
  return attention_sdpa_us + projections_us > 0 ? quant_us / (attention_sdpa_us + projections_us) : 0;
}

absl::Status MeasurePrefillStep(const KernelBenchOptions& o, const uint16_t* k_new,
                                const uint16_t* v_new, const float* rot_k, KernelBenchReport* r) {
  if (o.prefill_tokens <= 0) return absl::OkStatus();
  const int T = o.prefill_tokens;
  PrefillStepRow row;
  row.tokens = T;
  // The write: the default codec row (the first quantize row, over quant_tokens tokens).
  if (!r->quant.empty() && o.quant_tokens == T) {
    row.quant_us = r->quant[0].us;
    row.quant_row = r->quant[0].name;
  } else {
    row.error = "no quantize row of the step's length (quant_tokens must equal prefill_tokens)";
  }
  // Attention: the extend kernel with no prefix, T new tokens, causal (B = 1).
  std::fprintf(stderr, "[bench] prefill step: %d tokens\n", T);
  {
    cuda::DecodeShape shape{static_cast<uint32_t>(o.layers), kKvHeads, kQHeads, kHeadDim, 128, 64, 0};
    auto plan = cuda::PlanExtend(shape, 1, T);
    if (!plan.ok()) return plan.status();
    auto q = cuda::DeviceBuffer::Create(size_t(T) * kQHeads * kHeadDim * 4);
    auto out = cuda::DeviceBuffer::Create(size_t(T) * kQHeads * kHeadDim * 4);
    auto lse = cuda::DeviceBuffer::Create(size_t(T) * kQHeads * 4);
    auto qi = cuda::DeviceBuffer::FromHost(std::vector<int32_t>{0, T});
    auto ip = cuda::DeviceBuffer::FromHost(std::vector<int32_t>{0, 0});
    auto tb = cuda::DeviceBuffer::Create(64);
    if (!q.ok() || !out.ok() || !lse.ok() || !qi.ok() || !ip.ok() || !tb.ok()) {
      return absl::ResourceExhaustedError("prefill step buffers");
    }
    // Queries: pseudo-random values (never zeros), one host block repeated.
    if (absl::Status s = cuda::CudaStatus(cudaMemset(tb->get(), 0, 64), "table"); !s.ok()) return s;
    {
      std::vector<float> block(size_t{1} << 20);
      uint32_t x = 12345;
      for (float& v : block) {
        x = x * 1664525u + 1013904223u;
        v = static_cast<float>(static_cast<int32_t>(x >> 8) - (1 << 23)) / float(1 << 22);
      }
      const size_t n = size_t(T) * kQHeads * kHeadDim;
      for (size_t i = 0; i < n; i += block.size()) {
        const size_t c = std::min(block.size(), n - i);
        if (absl::Status s = cuda::CudaStatus(cudaMemcpy(q->as<float>() + i, block.data(), c * 4, cudaMemcpyHostToDevice), "q");
            !s.ok()) {
          return s;
        }
      }
    }
    cuda::ExtendParams e;
    e.shape = shape;
    e.table.page_ptrs = tb->as<const uint8_t*>();
    e.table.page_kinds = tb->as<uint8_t>();
    e.table.page_token_counts = tb->as<uint16_t>();
    e.table.seq_page_indptr = ip->as<int32_t>();
    e.table.seq_page_ids = tb->as<int32_t>();
    e.table.num_seqs = 1;
    e.q_indptr = qi->as<int32_t>();
    e.max_new_tokens = T;
    e.q = q->as<float>();
    e.k_new = k_new;
    e.v_new = v_new;
    e.rot_k = rot_k;
    e.out = out->as<float>();
    e.lse = lse->as<float>();
    auto us = MedianUs([&] { return cuda::LaunchExtendAttention(*plan, e, nullptr); }, std::max(3, o.samples / 6));
    if (!us.ok()) return us.status();
    row.attention_us = *us;
  }
  // The same attention in PyTorch SDPA (every backend that runs; the fastest counts).
  if (!o.sdpa_command.empty()) {
    KernelBenchOptions so = o;
    so.extend_shapes = {{1, 0, T}};
    so.samples = std::max(3, o.samples / 6);
    std::vector<ExtendRow> rows(1);
    rows[0].batch = 1;
    rows[0].new_tokens = T;
    if (absl::Status s = RunSdpaExtendBaseline(so, &rows); s.ok()) {
      row.attention_sdpa_us = rows[0].best_sdpa_us();
      const double c = rows[0].sdpa_cudnn_us, f = rows[0].sdpa_flash_us;
      row.sdpa_backend = row.attention_sdpa_us == c && c > 0 ? "cudnn" : row.attention_sdpa_us == f && f > 0 ? "flash" : "efficient";
    } else {
      row.error += absl::StrCat(row.error.empty() ? "" : "; ", "SDPA: ", s.message());
    }
  }
  // Projections and MLP: bf16 GEMMs of the step's shapes (C[T][N] = X[T][K] · W[K][N]).
  if (!o.gemm_command.empty()) {
    const std::vector<std::string> shapes = {
        absl::StrCat(T, "x", kHidden + 2 * kKvHeads * kHeadDim, "x", kHidden),  // Q, K, V
        absl::StrCat(T, "x", kHidden, "x", kQHeads * kHeadDim),                 // O
        absl::StrCat(T, "x", 2 * kMlp, "x", kHidden),                           // gate + up
        absl::StrCat(T, "x", kHidden, "x", kMlp)};                              // down
    auto g = GemmUs(o.gemm_command, shapes);
    if (g.ok()) {
      row.projections_us = (*g)[0] + (*g)[1];
      row.mlp_us = (*g)[2] + (*g)[3];
    } else {
      row.error += absl::StrCat(row.error.empty() ? "" : "; ", "GEMM: ", g.status().message());
    }
  }
  r->prefill.push_back(row);
  return absl::OkStatus();
}

}  // namespace oscarkv::bench
