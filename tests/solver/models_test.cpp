//===- tests/solver/models_test.cpp - Reductions on the sample models ------===//
//
// On real sample graphs: the plan found with the exact elimination and with repeated-layer
// clustering has the same objective as the plan of the unreduced problem (1e-6 relative).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <filesystem>

#include "apc/frontend/torchscript.h"
#include "apc/solver/graph_problem.h"

namespace apc::solver {
namespace {

const std::string kSamples = std::string(APC_SOURCE_DIR) + "/sample_models/out/";

GraphProblem problemFor(const std::string& model, const std::string& mesh_text) {
  auto g = frontend::importTorchScript(kSamples + model + ".pt");
  EXPECT_TRUE(g.ok()) << g.error().message();
  mesh::Spec spec;
  spec.mesh = *mesh::DeviceMesh::parse(mesh_text);
  auto gp = buildGraphProblem(*g, strategy::enumerate(*g, spec.mesh), spec);
  EXPECT_TRUE(gp.ok()) << gp.error().message();
  return std::move(gp).value();
}

void expectSameOptimum(const std::string& model, const std::string& mesh) {
  SCOPED_TRACE(model + " on " + mesh);
  GraphProblem gp = problemFor(model, mesh);
  SolveGraphOptions full, eliminated, clustered;
  full.reduce = false;
  eliminated.cluster = false;
  ReductionStats se, sc;
  auto a = solveGraphProblem(gp, full);
  auto b = solveGraphProblem(gp, eliminated, &se);
  auto c = solveGraphProblem(gp, clustered, &sc);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->status, "optimal");
  EXPECT_NEAR(b->objective, a->objective, 1e-6 * a->objective);
  EXPECT_NEAR(c->objective, a->objective, 1e-6 * a->objective);
  EXPECT_LT(se.nodes_after, se.nodes_before);
  EXPECT_LT(sc.nodes_after, se.nodes_after);
  EXPECT_GE(sc.clusters, 1u);
  std::cout << "[ info ] " << model << " " << mesh << ": " << se.nodes_before << " nodes -> "
            << se.nodes_after << " eliminated -> " << sc.nodes_after << " clustered; objective "
            << a->objective << " us\n";
}

TEST(Reduction, SameOptimumOnGpt2Tiny) {
  expectSameOptimum("gpt2_tiny", "2x4");
}
TEST(Reduction, SameOptimumOnLlamaTiny) {
  expectSameOptimum("llama_tiny", "4");
}

}  // namespace
}  // namespace apc::solver
