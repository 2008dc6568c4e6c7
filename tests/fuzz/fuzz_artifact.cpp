//===- tests/fuzz/fuzz_artifact.cpp - libFuzzer target: the artifact loader ===//
//
// The first byte picks what the rest of the input is: a manifest.json (read by readManifest), or
// the bytes of rank 0's program beside a manifest whose checksum matches them (so that parsing
// and the program checks run, not only the checksum). Files live in a per-process directory under
// APC_FUZZ_TMPDIR.
//
//===----------------------------------------------------------------------===//
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "apc/artifact/artifact.h"
#include "apc/support/hash.h"

namespace {

const std::string& dir() {
  static const std::string d = [] {
    // APC_FUZZ_TMPDIR (scripts/fuzz.sh makes one under /dev/shm and removes it: a file system
    // round trip per input is the cost here), else the temporary directory.
    const char* given = std::getenv("APC_FUZZ_TMPDIR");
    std::filesystem::path base =
        given && *given ? std::filesystem::path(given) : std::filesystem::temp_directory_path();
    auto p = base / ("apc_fuzz_artifact_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p.string();
  }();
  return d;
}

void put(const std::string& name, const std::string& bytes) {
  std::ofstream(dir() + "/" + name, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    put("manifest.json", rest);
    auto m = apc::artifact::readManifest(dir());
    if (m.ok()) (void)apc::artifact::readProgram(dir(), *m, 0);
    return 0;
  }
  put("rank_0.apcp", rest);
  put("manifest.json",
      R"j({"files": {"rank_0.apcp": ")j" + apc::sha256Hex(rest) +
          R"j("}, "format_version": 1, "mesh": {"names": ["d0"], "shape": [1]}, "model_hash": "",
           "model_name": "m", "plan_hash": "", "world_size": 1})j");
  (void)apc::artifact::readProgram(dir(), 0);
  return 0;
}
