//===- tests/common/samples.h - Where the tests find the sample models ----===//
//
// sample_models/out of the source tree, or the directory in APC_SAMPLES_DIR (to run the tests
// against samples generated elsewhere).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace apc::testing {

inline std::filesystem::path samplesDir() {
  const char* env = std::getenv("APC_SAMPLES_DIR");
  return env && *env ? std::filesystem::path(env)
                     : std::filesystem::path(APC_SOURCE_DIR) / "sample_models" / "out";
}

/// The samples' manifest.json (sample_models/generate.py), read once; {} when there is none.
inline const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream f(samplesDir() / "manifest.json");
    if (!f) return nlohmann::json::object();
    return nlohmann::json::parse(f);
  }();
  return m;
}

}  // namespace apc::testing
