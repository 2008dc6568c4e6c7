//===- apc/frontend/model.h - Import a model file of either kind -----------===//
//
// The front door the tools and the C++ API use: a model file is a TorchScript archive
// (torch.jit.save, `.pt`) or an exported program (torch.export.save, `.pt2`). The kind is decided
// by the archive's content, not its name: a zip whose `archive_format` record reads "pt2" (or
// that holds `models/model.json`) is an exported program, any other file goes to the TorchScript
// importer (which reports files that are not archives at all). A file that is not a readable zip
// and is named `*.pt2` is reported by the exported-program importer.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "apc/frontend/exported_program.h"
#include "apc/frontend/import.h"
#include "apc/frontend/torchscript.h"

namespace apc::frontend {

enum class ModelFormat { kTorchScript, kExportedProgram };

/// "TorchScript" or "exported program".
const char* modelFormatName(ModelFormat f);

/// The kind of model at `path`. Errors: missing file (kNotFound), a directory (kInvalidArgument).
Expected<ModelFormat> detectModelFormat(const std::string& path);

/// importTorchScript or importExportedProgram, by detectModelFormat. `notes` is filled for
/// exported programs only.
Expected<ir::Graph> importModel(const std::string& path, const ImportOptions& options = {},
                                ImportTimings* timings = nullptr, ImportNotes* notes = nullptr);

/// recordedInputs or recordedExportedInputs, by detectModelFormat.
Expected<std::vector<InputSpec>> recordedModelInputs(const std::string& path);

}  // namespace apc::frontend
