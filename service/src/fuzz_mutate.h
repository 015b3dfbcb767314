// The byte mutator of the gcc replay drivers (request_fuzz_test, local_frame_fuzz_test), which
// run a seed corpus plus random mutations of it in CI; libFuzzer mutates on its own under clang.
#pragma once

#include <random>
#include <string>
#include <vector>

namespace oscarkv::service {

// 1-4 edits of `s`: flip a bit, truncate, insert a byte, overwrite a byte, repeat a prefix,
// and, when `splices` is not empty, append one of them (another input's records after these).
inline std::string MutateBytes(std::string s, std::mt19937& rng,
                               const std::vector<std::string>& splices = {}) {
  const int edits = 1 + rng() % 4;
  const unsigned kinds = splices.empty() ? 5 : 6;
  for (int e = 0; e < edits; ++e) {
    const unsigned kind = rng() % kinds;
    switch (kind) {
      case 0:
        if (!s.empty()) s[rng() % s.size()] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1:
        if (!s.empty()) s.resize(rng() % s.size());
        break;
      case 2:
        s.insert(s.begin() + (s.empty() ? 0 : rng() % s.size()), static_cast<char>(rng()));
        break;
      case 3:
        if (!s.empty()) s[rng() % s.size()] = static_cast<char>(rng());
        break;
      default:
        if (kind == 4 && !splices.empty()) {
          s += splices[rng() % splices.size()];
        } else {
          s += s.substr(0, rng() % (s.size() + 1));
        }
        break;
    }
  }
  return s;
}

}  // namespace oscarkv::service
