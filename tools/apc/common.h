//===- tools/apc/common.h - Flags shared by the apc subcommands ------------===//
//
// Model flags (MODEL, --input) and mesh flags (--mesh, --mesh-names, --spec, --world-size), with
// the code that turns them into a Graph and a Spec. Shared so that every subcommand accepts and
// checks them the same way.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "apc/frontend/model.h"
#include "apc/mesh/spec.h"

namespace apc::tool {

struct ModelFlags {
  std::string model;
  std::vector<std::string> inputs;

  void add(CLI::App& app);
  Expected<ir::Graph> load(frontend::ImportTimings* timings = nullptr) const;
};

struct MeshFlags {
  std::string mesh;        // "2x4"
  std::string mesh_names;  // "dp,tp"
  std::string spec;        // spec.json
  int64_t world_size = 0;  // 0: not given

  /// Registers the flags (none is required here; resolve() reports a missing mesh).
  void add(CLI::App& app);
  bool given() const { return !mesh.empty() || !spec.empty(); }
  /// The spec from --spec, with --mesh / --mesh-names overriding its mesh; checked against
  /// --world-size and, when given, the graph.
  Expected<mesh::Spec> resolve(const ir::Graph* graph) const;
};

}  // namespace apc::tool
