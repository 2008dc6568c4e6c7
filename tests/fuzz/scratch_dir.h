//===- tests/fuzz/scratch_dir.h - A per-process scratch directory for fuzzers ===//
//
// Fuzz targets whose code under test reads files write each input to a file here first:
// APC_FUZZ_TMPDIR (scripts/fuzz.sh makes one under /dev/shm and removes it: a file system round
// trip per input is the cost), else the temporary directory; one subdirectory per target and
// process.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace apc::fuzz {

/// `<base>/apc_fuzz_<target>_<pid>`, created on first use. Call with one `target` per process.
inline const std::string& scratchDir(const char* target) {
  static const std::string d = [target] {
    const char* given = std::getenv("APC_FUZZ_TMPDIR");
    std::filesystem::path base =
        given && *given ? std::filesystem::path(given) : std::filesystem::temp_directory_path();
    auto p = base / ("apc_fuzz_" + std::string(target) + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p.string();
  }();
  return d;
}

/// Writes `bytes` to `path`, replacing it.
inline void writeFile(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace apc::fuzz
