//===- tests/plan/plan_fixtures.h - Plans of hand-built graphs -------------===//
//
// Runs lib/planner's pipeline (enumerate, build, solve, makePlan) on the hand-built graphs of
// tests/ir/test_graphs.h, without the importer, for the unit tests of lib/plan.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../ir/test_graphs.h"
#include "apc/planner/pipeline.h"

namespace apc::plan::testing {

inline spec::Spec specFor(std::vector<int64_t> shape, std::vector<std::string> names) {
  spec::Spec s;
  s.mesh = *mesh::DeviceMesh::create(std::move(shape), std::move(names));
  return s;
}

/// The toy block on 2x4 (dp, tp) with x batch-sharded on dp.
inline spec::Spec toySpec2x4() {
  spec::Spec s = specFor({2, 4}, {"dp", "tp"});
  s.inputs["x"] = {mesh::Placement::shard(0), mesh::Placement::replicate()};
  return s;
}

/// The toy block on a 1-d mesh of 8 with x batch-sharded.
inline spec::Spec toySpec8() {
  spec::Spec s = specFor({8}, {"dp"});
  s.inputs["x"] = {mesh::Placement::shard(0)};
  return s;
}

inline PlanSource toySource(const ir::Graph& g) {
  PlanSource src;
  src.model_path = "toy_block.pt";
  src.model_name = g.name;
  src.model_sha256 = std::string(64, '0');
  src.inputs = inputShapes(g);
  return src;
}

struct Planned {
  BuiltProblem built;
  PlanResult result;
};

/// Plans `g` under `spec`; fails the test on errors.
inline Planned planOf(const ir::Graph& g, const spec::Spec& spec,
                      solver::SolveGraphOptions options = {}) {
  Planned p;
  auto built = buildProblem(g, spec);
  EXPECT_TRUE(built.ok()) << built.error().message();
  if (!built.ok()) return p;
  p.built = std::move(built).value();
  auto r = solveAndPlan(g, p.built, spec, toySource(g), options);
  EXPECT_TRUE(r.ok()) << r.error().message();
  if (r.ok()) p.result = std::move(r).value();
  return p;
}

}  // namespace apc::plan::testing
