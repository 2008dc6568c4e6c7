//===- tools/apc/export.cpp - `apc export` ---------------------------------===//
//
// `apc export CKPT -o MODEL.safetensors`: the full weights of a sharded training checkpoint
// (apc/runtime/checkpoint.h; CKPT is a checkpoint directory, or a directory of step_<n>
// checkpoints, whose newest complete one is taken) as one safetensors file under the model's own
// parameter and buffer names, for inference or Python (safetensors.torch.load_file). Every file
// read is checked against the checkpoint's manifest (size, SHA-256, header). Prints one line
// "wrote OUT: N tensors, SIZE, from CKPT" and exits 0, else one line on stderr and exit 2.
//
//===----------------------------------------------------------------------===//
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "apc/runtime/checkpoint.h"
#include "apc/support/strings.h"
#include "commands.h"

namespace apc::tool {

namespace {

struct ExportFlags {
  std::string checkpoint;
  std::string output;
};

int runExport(const ExportFlags& f) {
  auto dir = runtime::findCheckpoint(f.checkpoint);
  if (!dir.ok()) return report(dir.error());
  if (Status s = checkNotInput(f.output, "-o", {*dir + "/manifest.json"}); !s.ok())
    return report(s.error());
  if (Status s = runtime::exportCheckpoint(*dir, f.output); !s.ok()) return report(s.error());
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(f.output, ec);
  std::cout << "wrote " << f.output << ": " << humanBytes(static_cast<double>(ec ? 0 : bytes))
            << ", the full parameters and buffers of " << *dir << "\n";
  return 0;
}

}  // namespace

Runner addExportCommand(CLI::App& app) {
  auto f = std::make_shared<ExportFlags>();
  app.add_option("checkpoint", f->checkpoint,
                 "Checkpoint directory (apc-train --save; a directory of step_<n> checkpoints "
                 "means its newest complete one)")
      ->required()
      ->check(nonEmptyPath());
  app.add_option("-o,--output", f->output, "The safetensors file to write")
      ->required()
      ->check(nonEmptyPath());
  return [f] { return runExport(*f); };
}

}  // namespace apc::tool
