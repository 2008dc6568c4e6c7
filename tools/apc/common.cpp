//===- tools/apc/common.cpp - Flags shared by the apc subcommands ----------===//
#include "common.h"

#include <iostream>

#include "apc/support/file_io.h"
#include "apc/support/strings.h"

namespace apc::tool {

void ModelFlags::add(CLI::App& app) {
  app.add_option("model", model,
                 "Model file: a TorchScript archive (.pt, torch.jit.save) or an exported program "
                 "(.pt2, torch.export.save)")
      ->required();
  app.add_option(
      "--input", inputs,
      "Input shape override, name:dtype[d0,d1,...] (e.g. tokens:i64[8,128]; a symbolic dim "
      "as B=8); repeatable. Defaults to the shapes recorded in the archive. For a .pt2 only "
      "the values of its dynamic dims may change (B=8 also renames the dim's symbol)");
}

Expected<ir::Graph> ModelFlags::load(frontend::ImportTimings* timings) const {
  frontend::ImportOptions options;
  for (const std::string& text : inputs) {
    APC_ASSIGN_OR_RETURN(frontend::InputSpec spec, frontend::parseInputSpec(text));
    for (const frontend::InputSpec& prev : options.inputs)
      if (!spec.name.empty() && prev.name == spec.name)
        return invalidArgument("--input: input '" + printable(spec.name) + "' is given twice (" +
                               printable(frontend::toString(prev)) + " and " +
                               printable(frontend::toString(spec)) + ")");
    options.inputs.push_back(spec);
  }
  frontend::ImportNotes notes;
  auto g = frontend::importModel(model, options, timings, &notes);
  if (g.ok() && !notes.buffer_mutations.empty()) {
    std::cerr << "apc: warning: the forward updates buffer"
              << (notes.buffer_mutations.size() > 1 ? "s " : " ")
              << joinMap(notes.buffer_mutations, ", ", [](const auto& m) { return m.first; })
              << " (training-mode statistics); apc plans the forward and does not write them "
                 "back\n";
  }
  return g;
}

void MeshFlags::add(CLI::App& app) {
  app.add_option("--mesh", mesh,
                 "Device mesh shape, like 8, 2x4 or 2x2x2 (overrides the spec's mesh)");
  app.add_option("--mesh-names", mesh_names,
                 "Names of the mesh dims, comma separated (e.g. dp,tp)");
  app.add_option("--spec", spec,
                 "Mesh/constraint spec file (JSON; schema in schemas/spec.schema.json)");
  app.add_option("--world-size", world_size,
                 "Expected number of ranks; must equal the mesh's product")
      ->check(CLI::Range(int64_t{1}, mesh::kMaxWorldSize));
}

Expected<mesh::Spec> MeshFlags::resolve(const ir::Graph* graph) const {
  mesh::Spec s;
  if (!spec.empty()) {
    APC_ASSIGN_OR_RETURN(s, mesh::parseSpecFile(spec));
  }
  if (!mesh.empty()) {
    APC_ASSIGN_OR_RETURN(mesh::DeviceMesh m, mesh::DeviceMesh::parse(mesh, mesh_names));
    // Keep link parameters from the spec when the shape is unchanged.
    if (!spec.empty() && s.mesh.shape() == m.shape())
      for (size_t d = 0; d < m.ndim(); ++d) m.setLink(d, s.mesh.link(d));
    s.mesh = m;
  } else if (spec.empty()) {
    return invalidArgument("no mesh given: use --mesh (like --mesh 2x4) or --spec");
  } else if (!mesh_names.empty()) {
    APC_ASSIGN_OR_RETURN(mesh::DeviceMesh m,
                         mesh::DeviceMesh::create(s.mesh.shape(), split(mesh_names, ',')));
    for (size_t d = 0; d < m.ndim(); ++d) m.setLink(d, s.mesh.link(d));
    s.mesh = m;
  }
  int64_t world = world_size > 0 ? world_size : s.world_size.value_or(0);
  if (world > 0 && world != s.mesh.worldSize())
    return invalidArgument("mesh " + s.mesh.toString() + " has " +
                           std::to_string(s.mesh.worldSize()) + " ranks but the world size is " +
                           std::to_string(world));
  if (graph) APC_RETURN_IF_ERROR(mesh::validateSpecAgainstGraph(s, *graph));
  return s;
}

}  // namespace apc::tool
