//===- tests/api/readme_example.cpp - The README's C++ API example ---------===//
//
// The example of README.md's "C++ API" section, verbatim between the markers, built and run as a
// test (from the source root, where sample_models/out/ lives) so that it cannot rot.
//
//===----------------------------------------------------------------------===//
// README-EXAMPLE-BEGIN
#include <iostream>

#include "apc/api/auto_parallel.h"

int main() {
  auto mesh = apc::mesh::DeviceMesh::create({2, 4}, {"dp", "tp"});
  if (!mesh.ok()) return 1;
  apc::AutoParallel ap("sample_models/out/toy_block.pt", {"x:f32[16,128,1024]"}, *mesh);
  apc::Status s = ap.add_input_constraints({"S(0),R"});  // x batch-sharded on dp
  if (s.ok()) s = ap.add_output_constraints({"S(0),R"});
  if (s.ok()) s = ap.add_parameter_memory_constraint(0, 0.25);  // low, high
  if (!s.ok()) {
    std::cerr << "error: " << s.error().message() << "\n";
    return 2;
  }
  apc::Expected<apc::plan::Plan> plan = ap.optimize_placement(/*verbose=*/false);
  if (!plan.ok()) {
    std::cerr << "error: " << plan.error().message() << "\n";
    return 2;
  }
  for (const apc::plan::PlanParameter& p : plan->parameters)
    std::cout << p.name << " " << apc::mesh::toString(p.placement) << "\n";
  std::cout << "step " << plan->totals.total_us << " us\n";
  auto why = ap.sharding_optimizer().print_costs_for_node("up.weight");
  if (why.ok()) std::cout << *why;
  // Lower to one program per rank (applied->write_artifact(dir) writes them for the runtime).
  apc::Expected<apc::AppliedPlacement> applied = ap.apply_placement(*plan);
  if (!applied.ok()) return 2;
  std::cout << applied->num_ranks() << " rank programs\n";
  return 0;
}
// README-EXAMPLE-END
