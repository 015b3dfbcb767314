// Locating ../shared/refmodel, the project's reference model, from tests and tools.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace oscarkv {

// The first directory holding config.json among: $OSCARKV_REFMODEL; <root>/shared/refmodel;
// <root>/../shared/refmodel — where <root> is $OSCARKV_SOURCE_DIR (set by ctest) or, failing
// that, the current directory and its parents. Empty when none exists (callers skip or explain).
inline std::string FindRefModel() {
  std::vector<std::filesystem::path> candidates;
  if (const char* env = std::getenv("OSCARKV_REFMODEL")) candidates.emplace_back(env);
  std::vector<std::filesystem::path> roots;
  if (const char* src = std::getenv("OSCARKV_SOURCE_DIR")) roots.emplace_back(src);
  std::error_code ec;
  for (auto p = std::filesystem::current_path(ec); !ec && !p.empty(); p = p.parent_path()) {
    roots.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (const auto& r : roots) {
    candidates.push_back(r / "shared" / "refmodel");
    candidates.push_back(r / ".." / "shared" / "refmodel");
  }
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c / "config.json", ec)) return c.lexically_normal().string();
  }
  return "";
}

}  // namespace oscarkv
