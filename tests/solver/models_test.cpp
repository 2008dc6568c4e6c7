//===- tests/solver/models_test.cpp - Reductions on the sample models ------===//
//
// On real sample graphs: the plan found with the exact elimination and with repeated-layer
// clustering has the same objective as the plan of the unreduced problem (1e-6 relative):
// gpt2_tiny, llama_tiny, and llama_small with 4 and 8 layers (one known exception, documented at
// that test).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

#include "apc/frontend/torchscript.h"
#include "apc/solver/graph_problem.h"

namespace apc::solver {
namespace {

const std::string kSamples = std::string(APC_SOURCE_DIR) + "/sample_models/out/";

GraphProblem problemFor(const std::string& model, const std::string& mesh_text,
                        std::optional<double> high = std::nullopt) {
  auto g = frontend::importTorchScript(kSamples + model + ".pt");
  EXPECT_TRUE(g.ok()) << g.error().message();
  mesh::Spec spec;
  spec.mesh = *mesh::DeviceMesh::parse(mesh_text);
  spec.memory_budget.high = high;
  auto gp = buildGraphProblem(*g, strategy::enumerate(*g, spec.mesh), spec);
  EXPECT_TRUE(gp.ok()) << gp.error().message();
  return std::move(gp).value();
}

/// Solves `model` on `mesh` unreduced, with elimination only and with elimination and clustering,
/// and expects the same objective (1e-6 relative); `check_clustered` = false only reports the
/// clustered objective (see SameOptimumOnLlamaSmall4And8Layers).
void expectSameOptimum(const std::string& model, const std::string& mesh,
                       std::optional<double> high = std::nullopt, bool check_clustered = true,
                       bool untie_ends = false) {
  std::string label = model + " " + mesh + (high ? " high " + std::to_string(*high) : "") +
                      (untie_ends ? " untie ends" : "");
  SCOPED_TRACE(label);
  GraphProblem gp = problemFor(model, mesh, high);
  SolveGraphOptions full, eliminated, clustered;
  full.reduce = false;
  eliminated.cluster = false;
  clustered.cluster_untie_ends = untie_ends;
  ReductionStats se, sc;
  auto a = solveGraphProblem(gp, full);
  auto b = solveGraphProblem(gp, eliminated, &se);
  auto c = solveGraphProblem(gp, clustered, &sc);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->status, "optimal");
  EXPECT_NEAR(b->objective, a->objective, 1e-6 * a->objective);
  if (check_clustered) {
    EXPECT_NEAR(c->objective, a->objective, 1e-6 * a->objective);
  }
  EXPECT_GE(c->objective, a->objective * (1 - 1e-9));  // a restriction is never cheaper
  EXPECT_LT(se.nodes_after, se.nodes_before);
  // Clustering shrinks what elimination leaves (elimination alone may leave nothing: gpt2_tiny).
  if (se.nodes_after > 0) {
    EXPECT_LT(sc.nodes_after, se.nodes_after);
  }
  EXPECT_GE(sc.clusters, 1u);
  std::cout << "[ info ] " << label << ": " << se.nodes_before << " nodes -> " << se.nodes_after
            << " eliminated -> " << sc.nodes_after << " clustered; objective " << a->objective
            << " us (eliminated " << b->objective << ", clustered " << c->objective << ")\n";
}

TEST(Reduction, SameOptimumOnGpt2Tiny) {
  expectSameOptimum("gpt2_tiny", "2x4");
}
TEST(Reduction, SameOptimumOnLlamaTiny) {
  expectSameOptimum("llama_tiny", "4");
}
// The exactness test: llama_small with 4 and with 8 layers (the two samples differ only in
// the layer count), planned with and without reduction, on mesh [4] (the unreduced 8-layer problem
// solves in about 20 s there on 2 cores).
// - Elimination (follow-merging) is exact at the default budget (high = 1/4) for both.
// - Elimination + clustering is exact for both when the memory row does not bind (high = 1). At
//   the default budget the clustered plans are 6.98 us dearer for both layer counts (4 layers:
//   2221.76 us against 2214.78, 0.32%; 8 layers: 3767.05 against 3760.08, 0.19%): the unreduced
//   optimum shards the wq weight of layers 0 and 2 on dim 1 (row-parallel-like, Partial query
//   chain) and of the others on dim 0, a plan that is not the same in every layer, which
//   clustering cannot express (SolveGraphOptions::cluster). That case is reported, not asserted.
//   The difference is at the boundary layers: with SolveGraphOptions::cluster_untie_ends (first
//   and last layer untied, off by default) clustering is exact there too.
TEST(Reduction, SameOptimumOnLlamaSmall4And8Layers) {
  expectSameOptimum("llama_small_4l", "4", std::nullopt, /*check_clustered=*/false);
  expectSameOptimum("llama_small", "4", std::nullopt, /*check_clustered=*/false);
  expectSameOptimum("llama_small_4l", "4", std::nullopt, true, /*untie_ends=*/true);
  expectSameOptimum("llama_small", "4", std::nullopt, true, /*untie_ends=*/true);
  expectSameOptimum("llama_small_4l", "4", 1.0);
  expectSameOptimum("llama_small", "4", 1.0);
}

}  // namespace
}  // namespace apc::solver
