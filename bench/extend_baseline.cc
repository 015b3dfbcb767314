// The extend rows' baseline: PyTorch SDPA on dense BF16 K/V (bench/sdpa_baseline.py --extend),
// run as a subprocess in the same device call as the kernels.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernel_bench.h"
#include "nlohmann/json.hpp"

namespace oscarkv::bench {

double ExtendRow::best_sdpa_us() const {
  double best = 0;
  for (double us : {sdpa_cudnn_us, sdpa_flash_us, sdpa_efficient_us}) {
    if (us > 0 && (best == 0 || us < best)) best = us;
  }
  return best;
}

absl::Status RunSdpaExtendBaseline(const KernelBenchOptions& o, std::vector<ExtendRow>* rows) {
  std::string specs;
  for (const ExtendShape& e : o.extend_shapes) {
    specs += absl::StrCat(specs.empty() ? "" : ",", e.batch, "x", e.prefix, "x", e.new_tokens);
  }
  const std::string cmd = absl::StrCat(o.sdpa_command, " --extend ", specs, " --samples ", o.samples);
  std::fprintf(stderr, "[bench] extend baseline: %s\n", cmd.c_str());
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return absl::UnavailableError("cannot start the SDPA extend baseline");
  std::vector<nlohmann::json> lines;
  char line[8192];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("extend") && j.contains("backend")) lines.push_back(j);
  }
  const int rc = pclose(f);
  if (rc != 0 && lines.empty()) return absl::UnavailableError(absl::StrCat("SDPA extend baseline exited ", rc));
  for (ExtendRow& row : *rows) {
    for (const auto& j : lines) {
      const auto& s = j["extend"];
      if (!s.is_array() || s.size() != 3 || s[0] != row.batch || s[1] != row.prefix || s[2] != row.new_tokens) continue;
      const std::string backend = j["backend"].get<std::string>();
      if (j.contains("us")) {
        const double us = j["us"].get<double>();
        if (backend == "cudnn") row.sdpa_cudnn_us = us;
        if (backend == "flash") row.sdpa_flash_us = us;
        if (backend == "efficient") row.sdpa_efficient_us = us;
        row.sdpa_how += absl::StrCat(row.sdpa_how.empty() ? "" : "; ", backend, ": ", j["how"].get<std::string>(),
                                     " (max diff vs flash ", j.value("max_diff", 0.0), ")");
      } else if (j.contains("error")) {
        row.sdpa_how += absl::StrCat(row.sdpa_how.empty() ? "" : "; ", backend, " did not run (",
                                     j["error"].get<std::string>(), ")");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace oscarkv::bench
