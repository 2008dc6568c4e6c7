//===- tests/runtime/moe_test.cpp - Mixture of experts sharded == single ----===//
//
// The mixture-of-experts sample (moe_tiny: DeepSeek-V3-shaped routing with topk, gather, sort,
// repeat_interleave, index.Tensor of the expert weights, bmm, index_add / scatter_add combines and
// a histc balance term) planned by the optimizer on [2], [4] and [2,2] (and batch-sharded by the
// classic DDP plan on [2,2], which cuts the routing ops by tokens), lowered by the `apc` binary and
// run on forked ranks over Gloo, against the unsharded TorchScript model trained in this process
// from the same weights, inputs and loss (tests/runtime/rank_harness.h):
//   - every forward output leaf, gathered to full, within 1e-5 relative (fp32);
//   - every parameter gradient of the first backward, gathered to full, within 1e-5 relative;
//   - the losses of 3 SGD steps within 1e-5 of the loss's scale.
// The exported program (moe_tiny.pt2) runs the same way on [4] and [2,2], and so do Hugging
// Face's MixtralForCausalLM and Qwen3MoeForCausalLM exported with
// experts_implementation="batched_mm" (hf_mixtral_tiny.pt2, hf_qwen3_moe_tiny.pt2) on [2], [4]
// and [2,2], and exported in transformers' default "grouped_mm" implementation
// (hf_mixtral_gmm_tiny.pt2, hf_qwen3_moe_gmm_tiny.pt2: sort, histc, and
// transformers::grouped_mm_fallback imported as aten::_grouped_mm), whose reference is the
// batched_mm trace of the same weights; so is DeepseekV3ForCausalLM (hf_deepseek_v3_gmm_tiny.pt2:
// latent attention written with slice assignments, group-limited routing with scatter); under ddp
// and fsdp their plans run the experts on each rank's own tokens (a token-local region, whose
// strategy every sort of theirs must take). Besides,
// the plans must use the routing rules: no routing op of the samples is left to the Replicate-only
// fallback.
//
// deepseek_tiny (a DeepSeek-V3-shaped decoder whose experts take a static capacity per sequence,
// dispatched and combined by one-hot einsums; capacity factor 1 drops some (token, expert) pairs)
// is planned with its tokens batch-sharded, on [2], [4] and [2,2] with the optimizer's plan (expert
// weights cut by expert), and on [4] and [2,2] under a network where all-gathers, reduce-scatters
// and all-reduces are slow: there the plan moves tokens to their experts by all-to-all (the ranks
// count their all-to-all calls), and training still equals the single-process model, dropped
// pairs included (the capacity is the model's own, per sequence, so cutting sequences keeps it).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "apc/frontend/model.h"
#include "apc/mesh/device_mesh.h"
#include "apc/runtime/parallel_module.h"
#include "apc/strategy/strategy.h"
#include "rank_harness.h"

// A namespace of its own: the files of runtime_test are compiled together (unity build).
namespace apc::runtime::moe_test {
namespace {

using testing::ModelCase;
using testing::Reference;

constexpr int kSteps = 3;
constexpr double kLr = 0.5;
constexpr double kRtol = 1e-5;

/// moe_tiny at a batch of 8 sequences of 6 tokens (48 tokens, 96 routed slots); hf_mixtral_tiny at
/// 8 sequences of 32 token ids (its export's shapes).
ModelCase moeCase(const std::string& model, const std::string& format) {
  if (model.rfind("hf_", 0) == 0) return {model, {"input_ids:i64[8,32]"}, 256, "", format};
  if (model == "deepseek_tiny") return {model, {"tokens:i64[8,8]"}, 96, "", format};
  return {model, {"x:f32[8,6,32]"}, 0, "", format};
}

/// The single-process reference of `model` (its TorchScript module), computed once.
const Reference& reference(const std::string& model) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(model);
  if (it == cache.end())
    it = cache.emplace(model, testing::computeReference(moeCase(model, "pt"), kSteps, kLr)).first;
  return it->second;
}

/// One rank: load, train kSteps SGD steps, compare with the reference. Returns the exit code.
/// `all_to_all`: the plan must have exchanged tokens by all-to-all on this rank.
int runRank(int rank, const std::string& dir, const Reference& ref, bool all_to_all) {
  testing::RankLog log(rank);
  std::shared_ptr<ParallelModule> loaded = testing::loadRank(dir, ref.init, log);
  if (!loaded) return 1;
  ParallelModule& pm = *loaded;
  std::vector<at::Tensor> params = pm.parameters();
  for (int step = 0; step < kSteps; ++step) {
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    std::vector<c10::IValue> inputs = testing::shardInputs(pm, ref.inputs);
    auto leaves = pm.forwardLeaves(inputs);
    if (!leaves.ok()) {
      log.fail("forward: " + leaves.error().message());
      return 1;
    }
    at::Tensor loss = testing::checkedStepLoss(pm, *leaves, ref, step, kRtol, log);
    if (!loss.defined()) return 1;
    loss.backward();
    if (step == 0) testing::expectGradsMatch(pm, ref.grads, kRtol, log);
    at::NoGradGuard no_grad;
    for (at::Tensor& p : params)
      if (p.grad().defined()) p.sub_(p.grad() * ref.lr);
  }
  if (all_to_all && pm.commStats().of(CommKind::kAllToAll).calls == 0)
    log.fail("the plan exchanged no tokens by all-to-all");
  return log.exitCode();
}

struct MoeCase {
  std::string model;     // moe_tiny | hf_mixtral_tiny
  std::string format;    // "pt" or "pt2"
  std::string mesh;      // "2x2"
  std::string strategy;  // "" optimizer, else a classic plan
  // deepseek_tiny: "dp" tokens batch-sharded; "a2a" the same under a network whose all-gathers,
  // reduce-scatters and all-reduces are slow (the plan must move tokens by all-to-all). The
  // grouped_mm samples: "ep" every grouped matmul's output pinned Partial on the last mesh dim
  // (and cut by tokens on the others): the region's expert cut, each rank its own experts.
  std::string setting = "";
};

/// The chosen strategies (plan JSON "strategy") of the plan nodes whose op starts with `op`.
std::vector<std::string> chosenStrategies(const std::string& plan_path, const std::string& op) {
  std::ifstream in(plan_path);
  const nlohmann::json plan = nlohmann::json::parse(in);
  std::vector<std::string> out;
  for (const nlohmann::json& n : plan.at("nodes"))
    if (n.at("op").get<std::string>().rfind(op, 0) == 0)
      out.push_back(n.at("strategy").get<std::string>());
  return out;
}

/// Writes a spec of mesh `mesh` ("2x2") with the JSON members `rest` (after the mesh) to
/// `<dir>.spec.json` and returns its path.
std::string writeSpec(const std::filesystem::path& dir, const std::string& mesh,
                      const std::string& rest) {
  std::string shape = mesh;
  std::replace(shape.begin(), shape.end(), 'x', ',');
  const std::string spec = dir.string() + ".spec.json";
  std::ofstream(spec) << R"({"mesh": {"shape": [)" << shape << "]}, " << rest << "}";
  return spec;
}

std::string caseName(const MoeCase& c) {
  return testing::paramName(c.model + "_" + c.format + "_" + c.mesh + "_" +
                            (c.strategy.empty() ? "opt" : c.strategy) +
                            (c.setting.empty() ? "" : "_" + c.setting));
}

class MoeDifferential : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeDifferential, ShardedMatchesSingleProcess) {
  const MoeCase& c = GetParam();
  ModelCase m = moeCase(c.model, c.format);
  if (!std::filesystem::exists(testing::samplePath(m.model)) ||
      !std::filesystem::exists(testing::samplePath(m.model, m.format)))
    GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = testing::scratchDir("moe", caseName(c));
  if (c.setting == "ep") {
    // Pins on every grouped matmul (named by its output, as plan nodes are): Partial on the last
    // mesh dim, which only the token-local region's expert cut offers with the expert weights cut
    // by experts (apc/strategy/token_local.h), S(0) on the others.
    Expected<ir::Graph> g = frontend::importModel(testing::samplePath(m.model, m.format));
    ASSERT_TRUE(g.ok()) << g.error().message();
    const auto dims = static_cast<size_t>(1 + std::count(c.mesh.begin(), c.mesh.end(), 'x'));
    std::string placements = "[";
    for (size_t d = 0; d + 1 < dims; ++d) placements += "\"S(0)\", ";
    placements += "\"P\"]";
    std::string pins;
    for (const ir::Node& n : g->nodes())
      if (n.op == "aten::_grouped_mm")
        pins += std::string(pins.empty() ? "" : ", ") + R"({"node": ")" +
                g->value(n.outputs.at(0)).debug_name + R"(", "placements": )" + placements + "}";
    ASSERT_FALSE(pins.empty());
    m.optimizer_flags =
        "--spec " +
        writeSpec(dir, c.mesh, R"("memory_budget": {"low": 0, "high": 1}, "pins": [)" + pins + "]");
  } else if (!c.setting.empty()) {
    // The tokens batch-sharded on every mesh dim, as a data-parallel trainer feeds them.
    const auto dims = static_cast<size_t>(1 + std::count(c.mesh.begin(), c.mesh.end(), 'x'));
    std::string placement = "[";
    for (size_t d = 0; d < dims; ++d) placement += std::string(d ? "," : "") + "\"S(0)\"";
    m.optimizer_flags = "--in-shardings '{\"tokens\": " + placement + "]}'";
    if (c.setting == "a2a") {
      std::string network;
      for (size_t d = 0; d < dims; ++d)
        network += std::string(d ? "," : "") +
                   R"({"all-gather": {"bandwidth_gbps": 1, "latency_us": 200},
                       "reduce-scatter": {"bandwidth_gbps": 1, "latency_us": 200},
                       "all-reduce": {"bandwidth_gbps": 1, "latency_us": 200}})";
      m.optimizer_flags += " --spec " + writeSpec(dir, c.mesh, R"("network": [)" + network + "]");
    }
  }
  std::string err = testing::makeArtifact(m, c.mesh, c.strategy, dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const std::string plan = dir.string() + ".plan.json";
  if (c.setting == "ep") {
    // Each grouped matmul in its region's expert cut: weights S(0), output Partial.
    const std::vector<std::string> gmms = chosenStrategies(plan, "aten::_grouped_mm");
    EXPECT_FALSE(gmms.empty());
    for (const std::string& st : gmms) {
      EXPECT_NE(st.find("(token-local #"), std::string::npos) << st;
      EXPECT_NE(st.find("S(0)"), std::string::npos) << st;
    }
  }
  if (c.model.find("_gmm_") != std::string::npos && !c.strategy.empty()) {
    // Batch-sharded plans run the grouped experts on each rank's own tokens: every sort of the
    // (token, choice) pairs takes its token-local region's strategy (apc/strategy/token_local.h),
    // instead of gathering every token to every rank.
    const std::vector<std::string> sorts = chosenStrategies(plan, "aten::sort");
    EXPECT_FALSE(sorts.empty());
    for (const std::string& st : sorts)
      EXPECT_NE(st.find("(token-local #"), std::string::npos) << st;
  }
  const Reference& ref = reference(c.model);
  std::vector<std::string> failed = testing::runRanks(testing::worldOf(c.mesh), [&](int rank) {
    return runRank(rank, dir.string(), ref, c.setting == "a2a");
  });
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
}

// Hugging Face's Mixtral is .pt2-first (its .pt, traced, is the reference): on [2], [4], [2,2]
// with the optimizer's plan and batch-sharded by DDP on [2,2]. The grouped_mm samples under ddp
// and fsdp run their experts in token-local regions on [2], [4] and [2,2].
INSTANTIATE_TEST_SUITE_P(
    MoeTiny, MoeDifferential,
    ::testing::Values(MoeCase{"moe_tiny", "pt", "2", ""}, MoeCase{"moe_tiny", "pt", "4", ""},
                      MoeCase{"moe_tiny", "pt", "2x2", ""}, MoeCase{"moe_tiny", "pt", "2x2", "ddp"},
                      MoeCase{"moe_tiny", "pt2", "4", ""}, MoeCase{"moe_tiny", "pt2", "2x2", ""},
                      MoeCase{"hf_mixtral_tiny", "pt2", "2", ""},
                      MoeCase{"hf_mixtral_tiny", "pt2", "4", ""},
                      MoeCase{"hf_mixtral_tiny", "pt2", "2x2", ""},
                      MoeCase{"hf_mixtral_tiny", "pt2", "2x2", "ddp"},
                      MoeCase{"hf_qwen3_moe_tiny", "pt2", "2", ""},
                      MoeCase{"hf_qwen3_moe_tiny", "pt2", "4", ""},
                      MoeCase{"hf_qwen3_moe_tiny", "pt2", "2x2", ""},
                      MoeCase{"hf_qwen3_moe_tiny", "pt2", "2x2", "ddp"},
                      MoeCase{"hf_mixtral_gmm_tiny", "pt2", "2", ""},
                      MoeCase{"hf_mixtral_gmm_tiny", "pt2", "4", ""},
                      MoeCase{"hf_mixtral_gmm_tiny", "pt2", "2x2", "fsdp"},
                      MoeCase{"hf_mixtral_gmm_tiny", "pt2", "2x2", "ddp"},
                      MoeCase{"hf_qwen3_moe_gmm_tiny", "pt2", "2x2", ""},
                      MoeCase{"hf_qwen3_moe_gmm_tiny", "pt2", "4", "ddp"},
                      MoeCase{"hf_deepseek_v3_gmm_tiny", "pt2", "2", ""},
                      MoeCase{"hf_deepseek_v3_gmm_tiny", "pt2", "2", "ddp"},
                      MoeCase{"hf_deepseek_v3_gmm_tiny", "pt2", "4", "fsdp"},
                      MoeCase{"hf_deepseek_v3_gmm_tiny", "pt2", "2x2", ""},
                      MoeCase{"hf_mixtral_gmm_tiny", "pt2", "2", "", "ep"},
                      MoeCase{"hf_mixtral_gmm_tiny", "pt2", "4", "", "ep"},
                      MoeCase{"hf_mixtral_gmm_tiny", "pt2", "2x2", "", "ep"},
                      MoeCase{"hf_qwen3_moe_gmm_tiny", "pt2", "2x2", "", "ep"},
                      MoeCase{"hf_deepseek_v3_gmm_tiny", "pt2", "4", "", "ep"},
                      MoeCase{"deepseek_tiny", "pt", "2", "", "dp"},
                      MoeCase{"deepseek_tiny", "pt", "4", "", "dp"},
                      MoeCase{"deepseek_tiny", "pt2", "2x2", "", "dp"},
                      MoeCase{"deepseek_tiny", "pt", "4", "", "a2a"},
                      MoeCase{"deepseek_tiny", "pt2", "2x2", "", "a2a"}),
    [](const ::testing::TestParamInfo<MoeCase>& info) { return caseName(info.param); });

// The routing and expert ops of the sample have rules (no Replicate-only fallback) and offer
// sharded strategies on [4]: the planner can cut them instead of computing every expert on every
// rank (all but the sort, which orders the flat slot list along its only dim).
TEST(MoeRules, RoutingOpsOfTheSampleHaveShardedStrategies) {
  for (const char* format : {"pt", "pt2"}) {
    SCOPED_TRACE(format);
    const std::string path = testing::samplePath("moe_tiny", format);
    if (!std::filesystem::exists(path)) GTEST_SKIP() << "run sample_models/generate.py";
    Expected<ir::Graph> g = frontend::importModel(path);
    ASSERT_TRUE(g.ok()) << g.error().message();
    const mesh::DeviceMesh mesh = *mesh::DeviceMesh::create({4});
    std::vector<strategy::NodeStrategies> all = strategy::enumerate(*g, mesh);
    EXPECT_EQ(strategy::fallbackOps(*g, all), std::vector<std::string>{});
    std::map<std::string, size_t> most;  // op -> the most strategies of one of its nodes
    for (const strategy::NodeStrategies& ns : all) {
      const std::string op = g->node(ns.node).op;
      most[op] = std::max(most[op], ns.strategies.size());
    }
    for (const char* op : {"aten::topk", "aten::gather", "aten::index_add", "aten::scatter_add",
                           "aten::histc", "aten::repeat_interleave"}) {
      ASSERT_TRUE(most.count(op)) << op << " is not in the sample";
      EXPECT_GT(most[op], 1u) << op << " has only the all-Replicate strategy";
    }
    // The sample sorts the flat slot list along its only dim: nothing but Replicate fits.
    ASSERT_TRUE(most.count("aten::sort"));
    EXPECT_EQ(most["aten::sort"], 1u);
  }
  // Mixtral's batched_mm experts: topk, repeat_interleave, the expert weights gathered by index.
  const std::string path = testing::samplePath("hf_mixtral_tiny", "pt2");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "run sample_models/generate.py";
  Expected<ir::Graph> g = frontend::importModel(path);
  ASSERT_TRUE(g.ok()) << g.error().message();
  std::vector<strategy::NodeStrategies> all =
      strategy::enumerate(*g, *mesh::DeviceMesh::create({4}));
  EXPECT_EQ(strategy::fallbackOps(*g, all), std::vector<std::string>{});
  std::map<std::string, size_t> most;
  for (const strategy::NodeStrategies& ns : all) {
    const std::string op = g->node(ns.node).op;
    most[op] = std::max(most[op], ns.strategies.size());
  }
  for (const char* op : {"aten::topk", "aten::repeat_interleave", "aten::index"}) {
    ASSERT_TRUE(most.count(op)) << op << " is not in hf_mixtral_tiny";
    EXPECT_GT(most[op], 1u) << op << " has only the all-Replicate strategy";
  }
  // Its default grouped_mm experts: the custom op imported as aten::_grouped_mm (whose expert
  // weights can be cut by N or K), the inverse permutation written by index_put, both with rules.
  const std::string gmm = testing::samplePath("hf_mixtral_gmm_tiny", "pt2");
  if (!std::filesystem::exists(gmm)) GTEST_SKIP() << "run sample_models/generate.py";
  Expected<ir::Graph> gg = frontend::importModel(gmm);
  ASSERT_TRUE(gg.ok()) << gg.error().message();
  all = strategy::enumerate(*gg, *mesh::DeviceMesh::create({4}));
  EXPECT_EQ(strategy::fallbackOps(*gg, all), std::vector<std::string>{});
  most.clear();
  for (const strategy::NodeStrategies& ns : all) {
    const std::string op = gg->node(ns.node).op;
    most[op] = std::max(most[op], ns.strategies.size());
  }
  ASSERT_TRUE(most.count("aten::_grouped_mm")) << "no aten::_grouped_mm in hf_mixtral_gmm_tiny";
  EXPECT_GT(most["aten::_grouped_mm"], 1u);
  ASSERT_TRUE(most.count("aten::index_put"));
}

}  // namespace
}  // namespace apc::runtime::moe_test
