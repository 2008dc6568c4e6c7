//===- lib/frontend/model.cpp - Import a model file of either kind ---------===//
#include "apc/frontend/model.h"

#include <filesystem>

#include "pt2_archive.h"

namespace apc::frontend {

const char* modelFormatName(ModelFormat f) {
  return f == ModelFormat::kExportedProgram ? "exported program" : "TorchScript";
}

Expected<ModelFormat> detectModelFormat(const std::string& path) {
  APC_RETURN_IF_ERROR(checkModelPath(path));
  auto archive = Pt2Archive::open(path);
  if (!archive.ok()) {
    // Not a readable zip: let the importer its name suggests report it.
    return std::filesystem::path(path).extension() == ".pt2" ? ModelFormat::kExportedProgram
                                                             : ModelFormat::kTorchScript;
  }
  return archive->isExportedProgram() ? ModelFormat::kExportedProgram : ModelFormat::kTorchScript;
}

Expected<ir::Graph> importModel(const std::string& path, const ImportOptions& options,
                                ImportTimings* timings, ImportNotes* notes) {
  APC_ASSIGN_OR_RETURN(ModelFormat f, detectModelFormat(path));
  if (f == ModelFormat::kExportedProgram)
    return importExportedProgram(path, options, timings, notes);
  return importTorchScript(path, options, timings);
}

Expected<std::vector<InputSpec>> recordedModelInputs(const std::string& path) {
  APC_ASSIGN_OR_RETURN(ModelFormat f, detectModelFormat(path));
  if (f == ModelFormat::kExportedProgram) return recordedExportedInputs(path);
  return recordedInputs(path);
}

}  // namespace apc::frontend
