//===- lib/frontend/script_module.cpp - Loading TorchScript archives -------===//
//
// See apc/frontend/script_module.h.
//
//===----------------------------------------------------------------------===//
#include "apc/frontend/script_module.h"

#include <algorithm>
#include <optional>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/operator_upgraders/upgraders_entry.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/import_source.h>

#include "apc/support/activity.h"

namespace apc::frontend {

namespace tj = torch::jit;

namespace {

/// The module, or nullopt where torch::jit::load must take over (see the header).
std::optional<tj::Module> loadZipArchive(const std::string& path, tj::ExtraFilesMap& extra) {
  try {
    auto reader = std::make_shared<caffe2::serialize::PyTorchStreamReader>(path);
    reader->setShouldLoadDebugSymbol(false);
    if (reader->hasRecord("model.json")) return std::nullopt;  // the legacy format
    tj::populate_upgraders_graph_map();
    tj::ExtraFilesMap found = extra;
    for (auto& [name, text] : found) {
      const std::string key = "extra/" + name;
      if (!reader->hasRecord(key)) continue;
      auto [data, size] = reader->getRecord(key);
      text.assign(static_cast<const char*>(data.get()), size);
    }
    // Class `a.b.C` is defined in code/a/b.py; its source ranges count lines from 1.
    auto source_of = [&reader](const std::string& qualifier) -> std::shared_ptr<tj::Source> {
      const std::string prefix = "code/";
      std::string file = prefix + qualifier;
      std::replace(file.begin() + static_cast<long>(prefix.size()), file.end(), '.', '/');
      file += ".py";
      if (!reader->hasRecord(file)) return nullptr;
      auto [data, size] = reader->getRecord(file);
      return std::make_shared<tj::Source>(
          std::string_view(static_cast<const char*>(data.get()), size), file, 1);
    };
    auto cu = std::make_shared<tj::CompilationUnit>();
    std::vector<c10::IValue> constants;  // the code's CONSTANTS.cN, read before any class
    tj::SourceImporter importer(cu, &constants, source_of, reader->version());
    auto read = [&](const std::string& archive) {
      auto resolve = [&](const c10::QualifiedName& name) {
        return c10::StrongTypePtr(cu, importer.loadType(name));
      };
      return tj::readArchiveAndTensors(archive, /*pickle_prefix=*/"", /*tensor_prefix=*/"", resolve,
                                       tj::ObjLoaderFunc, /*device=*/std::nullopt, *reader);
    };
    const c10::IValue table = read("constants");  // held: the loop reads its elements
    for (const c10::IValue& c : table.toTupleRef().elements()) constants.push_back(c);
    tj::Module module(read("data").toObject());
    extra = std::move(found);
    return module;
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return std::nullopt;
  }
}

}  // namespace

tj::Module loadScriptModule(const std::string& path, tj::ExtraFilesMap& extra_files) {
  if (auto module = loadZipArchive(path, extra_files)) return std::move(*module);
  return tj::load(path, std::nullopt, extra_files);
}

tj::Module loadScriptModule(const std::string& path) {
  tj::ExtraFilesMap none;
  return loadScriptModule(path, none);
}

}  // namespace apc::frontend
