// Test helpers: locating the reference model and test data.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace oscarkv::engine::testing {

inline std::string SourceDir() {
  const char* s = std::getenv("OSCARKV_SOURCE_DIR");
  return s ? s : ".";
}

// $OSCARKV_REFMODEL, else <source>/../shared/refmodel; empty when absent.
inline std::string RefModelDir() {
  const char* env = std::getenv("OSCARKV_REFMODEL");
  std::string dir = env ? env : SourceDir() + "/../shared/refmodel";
  return std::filesystem::exists(dir + "/config.json") ? dir : "";
}

}  // namespace oscarkv::engine::testing
