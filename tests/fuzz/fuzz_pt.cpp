//===- tests/fuzz/fuzz_pt.cpp - libFuzzer target: the TorchScript (.pt) loader ===//
//
// The outer layers of the TorchScript loader: format detection, torch::jit::load's error paths
// as our loader reports them, the archive's extra/apc_inputs.json (written by our sample
// generator) as the importer applies it, the importer and the weight loader (loadModelState).
// The first byte picks what the rest of the input is:
//  - even: the text of extra/apc_inputs.json, written into a copy of a small valid archive
//    (APC_FUZZ_PT_BASE, multi_output.pt of the seeds), imported with the shapes it records;
//  - odd: the bytes of a whole .pt file.
// One torch::jit::load per input where one suffices (it is most of the time per input): the
// importer reads the recorded inputs itself, the weights do not depend on apc_inputs.json, and
// an archive that LibTorch cannot read fails the same way in the weight loader. The JSON reader
// alone (parseRecordedInputs) is fuzzed at full speed by fuzz_inputs.
// LibTorch's own readers (zip, unpickler, TorchScript compiler) are not instrumented: what they
// do with a damaged archive is theirs; what is ours is that every input ends in a one-line error
// or a graph. Files live in a per-process directory under APC_FUZZ_TMPDIR.
//
//===----------------------------------------------------------------------===//

#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apc/frontend/model.h"
#include "apc/frontend/weights.h"

#include "scratch_dir.h"

namespace {

constexpr const char* kInputsRecord = "extra/apc_inputs.json";

// The records of the base archive except extra/apc_inputs.json, read once.
const std::vector<std::pair<std::string, std::string>>& baseRecords() {
  static const auto records = [] {
    std::vector<std::pair<std::string, std::string>> out;
    caffe2::serialize::PyTorchStreamReader r(std::string(APC_FUZZ_PT_BASE));
    for (const std::string& name : r.getAllRecords()) {
      if (name == kInputsRecord) continue;
      auto [data, size] = r.getRecord(name);
      out.emplace_back(name, std::string(static_cast<const char*>(data.get()), size));
    }
    return out;
  }();
  return records;
}

void writeWithInputs(const std::string& path, std::string_view inputs_json) {
  caffe2::serialize::PyTorchStreamWriter w(path, /*compute_crc32=*/false);
  for (const auto& [name, bytes] : baseRecords()) {
    // PyTorchStreamWriter writes these itself.
    if (name == "version" || name == ".data/version" || name == ".data/serialization_id") continue;
    w.writeRecord(name, bytes.data(), bytes.size());
  }
  w.writeRecord(kInputsRecord, inputs_json.data(), inputs_json.size());
  w.writeEndOfFile();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string path = apc::fuzz::scratchDir("pt") + "/m.pt";
  if (data[0] % 2 == 0) {
    writeWithInputs(path, rest);
  } else {
    apc::fuzz::writeFile(path, rest);
  }
  auto format = apc::frontend::detectModelFormat(path);
  // Archives with the exported program's records go to fuzz_pt2.
  if (!format.ok() || *format != apc::frontend::ModelFormat::kTorchScript) return 0;
  auto graph = apc::frontend::importTorchScript(path);
  if (data[0] % 2 == 1 && (graph.ok() || graph.error().code() != apc::ErrorCode::kParse))
    (void)apc::frontend::loadModelState(path);
  return 0;
}
