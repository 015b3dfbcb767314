// Test helpers: locating the reference model and test data.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "oscarkv/util/refmodel.h"

namespace oscarkv::engine::testing {

inline std::string SourceDir() {
  const char* s = std::getenv("OSCARKV_SOURCE_DIR");
  return s ? s : ".";
}

// See oscarkv::FindRefModel; empty when absent.
inline std::string RefModelDir() { return FindRefModel(); }

}  // namespace oscarkv::engine::testing
