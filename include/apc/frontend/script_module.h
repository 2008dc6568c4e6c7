//===- apc/frontend/script_module.h - Loading TorchScript archives ---------===//
//
// torch::jit::load for apc: the same module, without the backward-compatibility pass that makes
// LibTorch's load grow with the number of submodule instances (see loadScriptModule). Includes
// LibTorch: the importer, the weight loader and tests use it; the planner never does.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>

#include <torch/csrc/jit/api/module.h>

namespace apc::frontend {

/// Loads the TorchScript archive (torch.jit.save) at `path` as torch::jit::load(path, nullopt,
/// extra_files) does, less its rewrite of pre-1.6 quantized convolutions: that pass parses its
/// eight IR patterns anew for every method of every submodule instance, 0.14 of the 0.18 s that
/// torch::jit::load takes on a 126-layer LLaMA (1,500 module instances), and apc plans no
/// quantized op. Everything else is LibTorch's own deserializer rebuilt from its exported parts
/// (the zip reader, the operator upgraders, a SourceImporter over the archive's code/, and
/// readArchiveAndTensors with ObjLoaderFunc), so parameters, buffers, types and graphs are the
/// same, and tests/frontend checks that they are on every sample. The .debug_pkl maps back to the
/// user's Python are not read (as with torch::jit::load's load_debug_files = false); node source
/// ranges point into the archive's code/*.py, as they do after torch::jit::load.
/// A legacy archive (model.json), a flatbuffer module or anything this path cannot read goes to
/// torch::jit::load itself, so errors are LibTorch's, thrown as it throws them.
/// `extra_files`: names in, contents out (as torch::jit::load's ExtraFilesMap).
torch::jit::Module loadScriptModule(const std::string& path,
                                    std::unordered_map<std::string, std::string>& extra_files);
torch::jit::Module loadScriptModule(const std::string& path);

}  // namespace apc::frontend
