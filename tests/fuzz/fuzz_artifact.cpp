//===- tests/fuzz/fuzz_artifact.cpp - libFuzzer target: the artifact loader ===//
//
// The first byte picks what the rest of the input is: a manifest.json (read by readManifest), or
// the bytes of rank 0's program beside a manifest whose checksum matches them (so that parsing
// and the program checks run, not only the checksum). Files live in a per-process directory under
// APC_FUZZ_TMPDIR.
//
//===----------------------------------------------------------------------===//

#include <cstddef>
#include <cstdint>
#include <string>

#include "apc/artifact/artifact.h"
#include "apc/support/hash.h"

#include "scratch_dir.h"

namespace {

const std::string& dir() {
  return apc::fuzz::scratchDir("artifact");
}

void put(const std::string& name, const std::string& bytes) {
  apc::fuzz::writeFile(dir() + "/" + name, bytes);
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
