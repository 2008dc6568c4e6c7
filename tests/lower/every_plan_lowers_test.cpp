//===- tests/lower/every_plan_lowers_test.cpp - Every returned plan lowers ---===//
//
// A property of the planner and lowering together (issue 31): a plan the solver or a classic
// baseline returns is one lowering accepts. The two share the rules that once disagreed (a
// Tensor[] edge read at its producer's placement; batch pieces that must not be empty), and this
// test holds them together: every importable sample (its TorchScript file at the recorded shapes,
// and its exported program, whose batch is symbolic), on the meshes [2,2] and [2,4], with the
// optimizer's plan and every baseline the mesh allows, is planned in-process as `apc plan` plans
// it (plan::planGraph) and lowered for every rank (lower::lowerEachRank). The LLaMA-3 shapes are
// left out (the same structure as llama_small, and minutes to lower 64 ranks of them).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../common/samples.h"
#include "apc/frontend/model.h"
#include "apc/lower/lower.h"
#include "apc/planner/pipeline.h"
#include "apc/solver/baselines.h"

namespace apc::lower {
namespace {

/// (sample name, model file) of every importable sample: its .pt and, where written, its .pt2.
std::vector<std::pair<std::string, std::string>> modelFiles() {
  std::vector<std::pair<std::string, std::string>> out;
  const auto& m = apc::testing::manifest();
  if (!m.contains("samples")) return out;
  for (const auto& s : m["samples"]) {
    const std::string name = s["name"];
    if (!s.value("importable", true) || name.rfind("llama3_", 0) == 0) continue;
    out.emplace_back(name, s["file"].get<std::string>());
    if (s.contains("exported") && s["exported"].is_object() &&
        s["exported"].value("file", nlohmann::json()).is_string())
      out.emplace_back(name, s["exported"]["file"].get<std::string>());
  }
  return out;
}

TEST(EveryPlanLowers, OptimizerAndBaselinesOnEverySample) {
  auto files = modelFiles();
  if (files.empty()) GTEST_SKIP() << "run sample_models/generate.py";
  int lowered = 0, not_planned = 0;
  for (const auto& [name, file] : files) {
    const std::string path = (apc::testing::samplesDir() / file).string();
    SCOPED_TRACE(file);
    auto g = frontend::importModel(path);
    ASSERT_TRUE(g.ok()) << g.error().message();
    plan::PlanSource source;
    source.model_path = path;
    source.model_name = g->name;
    source.model_sha256 = std::string(64, '0');
    source.inputs = plan::inputShapes(*g);
    for (const char* mesh_text : {"2x2", "2x4"}) {
      SCOPED_TRACE(mesh_text);
      std::vector<std::optional<solver::Baseline>> plans = {std::nullopt};
      for (solver::Baseline b : solver::allBaselines()) plans.emplace_back(b);
      for (const std::optional<solver::Baseline>& b : plans) {
        const std::string what = b ? solver::baselineName(*b) : "optimizer";
        SCOPED_TRACE(what);
        spec::Spec spec;
        spec.mesh = *mesh::DeviceMesh::parse(mesh_text);
        plan::PlanRequest request;
        request.baseline = b;
        request.options.solver.time_limit_s = 60;
        auto run = plan::planGraph(*g, spec, source, request);
        // A plan that cannot be made (a budget the mesh cannot meet) is not this test's subject;
        // one that is returned must lower.
        if (!run.ok()) {
          std::fprintf(stderr, "[every plan lowers] %s %s %s: not planned: %s\n", file.c_str(),
                       mesh_text, what.c_str(), run.error().message().c_str());
          ++not_planned;
          continue;
        }
        Status st = lowerEachRank(*g, run->result.plan,
                                  [](const proto::Program&) { return Status::success(); });
        EXPECT_TRUE(st.ok()) << file << " " << mesh_text << " " << what << ": "
                             << st.error().message();
        ++lowered;
      }
    }
  }
  std::fprintf(stderr, "[every plan lowers] %d plans lowered, %d not planned\n", lowered,
               not_planned);
  EXPECT_GT(lowered, 100);  // the property must not hold vacuously
  EXPECT_LT(not_planned, lowered / 10);
}

}  // namespace
}  // namespace apc::lower
