//===- tests/lower/lower_alone.cpp - Lowering with the plan library alone --===//
//
// `lower_alone PLAN [RANK]`: reads a plan file and lowers rank RANK's program (default 0) from the
// graph the plan carries, printing the number of nodes and redistributions. It links apc_lower
// and nothing of the planner, so that `lower_links_no_planner` can check that lowering carries no
// solver, planner or CBC code (lowering is what a deployment without the planner runs).
//
//===----------------------------------------------------------------------===//
#include <cstdlib>
#include <iostream>
#include <string>

#include "apc.pb.h"
#include "apc/lower/lower.h"
#include "apc/plan/plan.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::cerr << "usage: lower_alone PLAN [RANK]\n";
    return 2;
  }
  auto p = apc::plan::readPlanFile(argv[1]);
  if (!p.ok()) {
    std::cerr << p.error().message() << "\n";
    return 1;
  }
  auto g = apc::plan::plannedGraph(*p);
  if (!g.ok()) {
    std::cerr << g.error().message() << "\n";
    return 1;
  }
  const int64_t rank = argc == 3 ? std::atoll(argv[2]) : 0;
  auto prog = apc::lower::lowerRank(*g, *p, rank);
  if (!prog.ok()) {
    std::cerr << prog.error().message() << "\n";
    return 1;
  }
  std::cout << "rank " << rank << ": " << prog->parameters_size() << " parameters, "
            << prog->redistributions_size() << " redistributions\n";
  return 0;
}
