//===- tests/fuzz/fuzz_pt2.cpp - libFuzzer target: the .pt2 (torch.export) loader ===//
//
// The outer layers of the exported-program loader: LibTorch's zip reader (PyTorchStreamReader),
// the JSON serde parse of models/model.json and the weights/constants configs, the importer (with
// the recorded inputs given back as overrides) and the weight loader (loadModelState). The first
// byte picks what the rest of the input is:
//  - even: the records, separated by a line "----": models/model.json, then (optional)
//    data/weights/model_weights_config.json and data/constants/model_constants_config.json. The
//    target writes them into a well-formed archive (PyTorchStreamWriter, the layout
//    torch.export.save writes) with archive_format "pt2", byteorder "little" and four weight
//    records weight_0..weight_3 of 4096 bytes each, so that mutations reach the JSON readers and
//    the importer instead of breaking the zip.
//  - odd: the bytes of a whole .pt2 file (the zip container itself).
// Every input must end in a one-line error or a graph: a crash, a sanitizer report, an uncaught
// exception or a hang is a finding. Files live in a per-process directory under APC_FUZZ_TMPDIR.
//
//===----------------------------------------------------------------------===//

#include <caffe2/serialize/inline_container.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "apc/frontend/model.h"
#include "apc/frontend/weights.h"

#include "scratch_dir.h"

namespace {

std::vector<std::string_view> splitRecords(std::string_view s) {
  static constexpr std::string_view kSep = "\n----\n";
  std::vector<std::string_view> parts;
  while (parts.size() < 2) {
    size_t at = s.find(kSep);
    if (at == std::string_view::npos) break;
    parts.push_back(s.substr(0, at));
    s.remove_prefix(at + kSep.size());
  }
  parts.push_back(s);
  return parts;
}

void writeArchive(const std::string& path, std::string_view records) {
  static const std::string weight(4096, '\0');
  auto parts = splitRecords(records);
  caffe2::serialize::PyTorchStreamWriter w(path, /*compute_crc32=*/false);
  auto put = [&](const std::string& name, std::string_view bytes) {
    w.writeRecord(name, bytes.data(), bytes.size());
  };
  put("archive_format", "pt2");
  put("byteorder", "little");
  put("models/model.json", parts[0]);
  if (parts.size() > 1) put("data/weights/model_weights_config.json", parts[1]);
  if (parts.size() > 2) put("data/constants/model_constants_config.json", parts[2]);
  for (int i = 0; i < 4; ++i) put("data/weights/weight_" + std::to_string(i), weight);
  w.writeEndOfFile();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string path = apc::fuzz::scratchDir("pt2") + "/m.pt2";
  if (data[0] % 2 == 0) {
    writeArchive(path, rest);
  } else {
    apc::fuzz::writeFile(path, rest);
  }
  auto format = apc::frontend::detectModelFormat(path);
  // A zip without the exported program's records goes to the TorchScript importer (fuzz_pt).
  if (!format.ok() || *format != apc::frontend::ModelFormat::kExportedProgram) return 0;
  auto recorded = apc::frontend::recordedExportedInputs(path);
  // With the recorded inputs given back as --input overrides (the override checks run too).
  apc::frontend::ImportOptions options;
  if (recorded.ok()) options.inputs = *recorded;
  (void)apc::frontend::importExportedProgram(path, options);
  (void)apc::frontend::loadModelState(path);
  return 0;
}
