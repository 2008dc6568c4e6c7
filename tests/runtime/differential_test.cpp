//===- tests/runtime/differential_test.cpp - Sharded == single-process ------===//
//
// The main oracle of the runtime: a sample model planned on a mesh (the optimizer's plan or a
// classic one), lowered to an artifact by the `apc` binary and run on forked ranks over Gloo must
// give, against the unsharded TorchScript model trained in the parent process from the same
// weights, inputs and loss:
//   - every forward output leaf, gathered to full, within 1e-5 relative (fp32);
//   - every parameter gradient of the first backward, gathered to full, within 1e-5 relative;
//   - the losses of 3 SGD steps within 1e-5 of the loss's scale.
// TorchScript samples run at the smallest shapes that still cut every sharded dim; exported
// programs (.pt2 and the core-ATen .core.pt2) at the shapes they were exported with, their batch a
// symbolic dim of the export, the ranks starting from the weights the .pt2 holds.
// Failure tests: a truncated or edited artifact (hash mismatch) and a world size different from the
// artifact's give one-line errors at load.
//
//===----------------------------------------------------------------------===//
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <torch/script.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "../common/run_command.h"
#include "apc/artifact/artifact.h"
#include "apc/cost/calibration.h"
#include "apc/frontend/model.h"
#include "apc/ir/proto_io.h"
#include "apc/plan/plan.h"
#include "apc/runtime/parallel_module.h"
#include "apc/spec/spec.h"
#include "rank_harness.h"

// A namespace of its own: the files of runtime_test are compiled together (unity build).
namespace apc::runtime::differential_test {
namespace {

using testing::ModelCase;
using testing::Reference;

constexpr int kSteps = 3;
constexpr double kLr = 0.5;
constexpr double kRtol = 1e-5;

const std::map<std::string, ModelCase>& models() {
  static const std::map<std::string, ModelCase> m = {
      {"toy_block", {"toy_block", {"x:f32[8,2,1024]"}, 0, ""}},
      {"mlp_stack", {"mlp_stack", {"x:f32[8,4,128]"}, 0, ""}},
      {"gpt2_tiny_loss", {"gpt2_tiny_loss", {"idx:i64[8,8]", "targets:i64[8,8]"}, 50257, ""}},
      {"gpt2_tiny", {"gpt2_tiny", {"idx:i64[8,8]"}, 50257, ""}},
      {"llama_tiny", {"llama_tiny", {"tokens:i64[8,8]"}, 256, ""}},
      // Stub weights (zero-stride views of one element each), short sequences.
      {"llama_small_4l", {"llama_small_4l", {"tokens:i64[2,8]"}, 32000, ""}},
      {"cnn_small", {"cnn_small", {"x:f32[8,3,32,32]"}, 0, ""}},
      // ResNet-50's structure in training mode (batch-statistics BN, in-place ReLU and add).
      {"resnet_bottleneck", {"resnet_bottleneck", {"x:f64[8,3,64,64]"}, 0, ""}},
      // Swin's structure in training mode (shifted windows: pad, roll, table[index] bias, the
      // mask written through slices of new_zeros; PatchMerging's strided slices).
      {"swin_tiny", {"swin_tiny", {"x:f32[8,3,40,40]"}, 0, ""}},
      // Exported programs (.pt2), planned at the shapes they were exported with (the batch is
      // a symbolic dim of the export, priced at its hint), ranks starting from the .pt2's own
      // weights. Hugging Face models are .pt2-first; their .pt is the reference.
      {"toy_block.pt2", {"toy_block", {"x:f32[8,128,1024]"}, 0, "", "pt2"}},
      {"mlp_stack.pt2", {"mlp_stack", {"x:f32[8,64,128]"}, 0, "", "pt2"}},
      {"gpt2_tiny_loss.pt2",
       {"gpt2_tiny_loss", {"idx:i64[8,64]", "targets:i64[8,64]"}, 50257, "", "pt2"}},
      {"multi_output.pt2", {"multi_output", {"x:f32[4,32]"}, 0, "", "pt2"}},
      {"mlp_stack.core.pt2", {"mlp_stack", {"x:f32[8,64,128]"}, 0, "", "core.pt2"}},
      {"llama_tiny.pt2", {"llama_tiny", {"tokens:i64[8,128]"}, 256, "", "pt2"}},
      {"llama_tiny.core.pt2", {"llama_tiny", {"tokens:i64[8,128]"}, 256, "", "core.pt2"}},
      {"cnn_small.pt2", {"cnn_small", {"x:f32[8,3,32,32]"}, 0, "", "pt2"}},
      {"resnet_bottleneck.pt2", {"resnet_bottleneck", {"x:f64[8,3,64,64]"}, 0, "", "pt2"}},
      // Its core-ATen form: training BatchNorm as _native_batch_norm_legit_functional.
      {"resnet_bottleneck.core.pt2",
       {"resnet_bottleneck", {"x:f64[8,3,64,64]"}, 0, "", "core.pt2"}},
      {"swin_tiny.pt2", {"swin_tiny", {"x:f32[8,3,40,40]"}, 0, "", "pt2"}},
      {"hf_llama_tiny.pt2", {"hf_llama_tiny", {"input_ids:i64[8,32]"}, 256, "", "pt2"}},
      // einsum attention, bilinear and nearest upsampling (float64).
      {"einsum_upsample.pt2", {"einsum_upsample", {"x:f64[8,3,16,16]"}, 0, "", "pt2"}},
      {"hf_gpt2_tiny.pt2", {"hf_gpt2_tiny", {"input_ids:i64[8,32]"}, 256, "", "pt2"}},
      // index.Tensor through an optional-tensor list ([None, idx % 6]) with idx batch-split:
      // the list must read the whole positions. aten::mT, aten::numpy_T.
      {"gather_patterns.pt2", {"gather_patterns", {"x:f32[8,6,16]", "idx:i64[8]"}, 100, "", "pt2"}},
  };
  return m;
}

const Reference& referenceFor(const std::string& model) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(model);
  if (it == cache.end())
    it = cache.emplace(model, testing::computeReference(models().at(model), kSteps, kLr)).first;
  return it->second;
}

std::filesystem::path scratchDir(const std::string& name) {
  return testing::scratchDir("rt", name);
}

/// One rank: load, train kSteps SGD steps, compare with the reference. Returns the exit code.
int runRank(int rank, const std::string& dir, const Reference& ref, bool expect_comm) {
  testing::RankLog log(rank);
  std::shared_ptr<ParallelModule> loaded = testing::loadRank(dir, ref.init, log);
  if (!loaded) return 1;
  ParallelModule& pm = *loaded;
  auto fail = [&](const std::string& what) { log.fail(what); };
  std::vector<at::Tensor> params = pm.parameters();
  for (int step = 0; step < kSteps; ++step) {
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    std::vector<c10::IValue> inputs = testing::shardInputs(pm, ref.inputs);
    pm.resetCommStats();
    auto leaves = pm.forwardLeaves(inputs);
    const CommStats forward_comm = pm.commStats();
    if (!leaves.ok()) {
      fail("forward: " + leaves.error().message());
      return 1;
    }
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < leaves->size(); ++i)
      outs.push_back(pm.gatherOutput(i, (*leaves)[i].toTensor()));
    if (outs.size() != ref.outputs.size()) {
      fail("the program has " + std::to_string(outs.size()) + " output leaves, the model " +
           std::to_string(ref.outputs.size()));
      return 1;
    }
    if (step == 0)
      for (size_t i = 0; i < outs.size(); ++i) {
        std::string d = testing::compareTensors(outs[i].detach(), ref.outputs[i], kRtol);
        if (!d.empty()) fail("output " + std::to_string(i) + ": " + d);
      }
    const CommStats gather_comm = pm.commStats();
    at::Tensor loss = testing::lossOf(outs, ref.loss_weights);
    const double l = loss.item<double>();
    if (!(std::abs(l - ref.losses[static_cast<size_t>(step)]) <=
          kRtol * ref.loss_scales[static_cast<size_t>(step)] + 1e-12))
      fail("step " + std::to_string(step) + " loss " + std::to_string(l) + ", single " +
           std::to_string(ref.losses[static_cast<size_t>(step)]));
    loss.backward();
    // Sanity: a sharded program communicates (not counting the test's own output gather).
    const int64_t program_calls = pm.commStats().calls - (gather_comm.calls - forward_comm.calls);
    if (step == 0 && pm.worldSize() > 1 && program_calls == 0 && expect_comm)
      fail("the program ran no collective");
    if (step == 0) testing::expectGradsMatch(pm, ref.grads, kRtol, log);
    at::NoGradGuard no_grad;
    for (at::Tensor& p : params)
      if (p.grad().defined()) p.sub_(p.grad() * ref.lr);
  }
  return log.exitCode();
}

struct DiffCase {
  std::string model;
  std::string mesh;      // "2x2"
  std::string strategy;  // "" optimizer, else ddp | fsdp | tp | fsdp+tp
};

std::string caseName(const DiffCase& c) {
  return testing::paramName(c.model + "_" + c.mesh + "_" +
                            (c.strategy.empty() ? "opt" : c.strategy));
}

class Differential : public ::testing::TestWithParam<DiffCase> {};

TEST_P(Differential, ShardedMatchesSingleProcess) {
  const DiffCase& c = GetParam();
  const ModelCase& m = models().at(c.model);
  if (!std::filesystem::exists(testing::samplePath(m.model)) ||
      !std::filesystem::exists(testing::samplePath(m.model, m.format)))
    GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = scratchDir(caseName(GetParam()));
  std::string err = testing::makeArtifact(m, c.mesh, c.strategy, dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const Reference& ref = referenceFor(c.model);
  std::vector<std::string> failed = testing::runRanks(
      testing::worldOf(c.mesh), [&](int rank) { return runRank(rank, dir.string(), ref, true); });
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
}

// The core-ATen training BatchNorm (_native_batch_norm_legit_functional: resnet_bottleneck's in
// its .core.pt2) batch-sharded on [2] (the optimizer's plan with every BatchNorm module's output
// pinned S(0): left alone it cuts channels): each one synchronizes its statistics (the program
// records an OpCollective on every such node, whose local graph all-reduces the statistics), and
// 3 SGD steps give the single-process model's outputs, gradients and losses.
TEST(CoreBatchNorm, TrainsBatchShardedWithSynchronizedStatistics) {
  ModelCase m = models().at("resnet_bottleneck.core.pt2");
  if (!std::filesystem::exists(testing::samplePath(m.model)) ||
      !std::filesystem::exists(testing::samplePath(m.model, m.format)))
    GTEST_SKIP() << "run sample_models/generate.py";
  Expected<ir::Graph> g = frontend::importModel(testing::samplePath(m.model, m.format));
  ASSERT_TRUE(g.ok()) << g.error().message();
  nlohmann::json pins = nlohmann::json::array();
  for (const ir::Node& n : g->nodes())
    if (n.op == "aten::_native_batch_norm_legit_functional")
      pins.push_back({{"module", n.module_path}, {"placements", {"S(0)"}}});
  ASSERT_FALSE(pins.empty());
  std::filesystem::path spec = scratchDir("core_bn_pins.json");
  {
    std::ofstream f(spec);
    f << nlohmann::json{{"mesh", {{"shape", {2}}}}, {"pins", pins}}.dump();
  }
  m.optimizer_flags = "--spec " + spec.string();
  std::filesystem::path dir = scratchDir("core_bn_2_pinned");
  std::string err = testing::makeArtifact(m, "2", "", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  for (int64_t rank : {0, 1}) {
    Expected<proto::Program> prog = artifact::readProgram(dir.string(), rank);
    ASSERT_TRUE(prog.ok()) << prog.error().message();
    std::set<uint32_t> bn, synced;
    for (int i = 0; i < prog->graph().nodes_size(); ++i)
      if (prog->graph().nodes(i).op() == "aten::_native_batch_norm_legit_functional")
        bn.insert(static_cast<uint32_t>(i));
    for (const proto::OpCollective& oc : prog->op_collectives()) {
      synced.insert(oc.node());
      EXPECT_EQ(std::vector<uint32_t>(oc.mesh_dims().begin(), oc.mesh_dims().end()),
                std::vector<uint32_t>{0});
      // The node's local graph: plain ops around the statistics' two all-reduces.
      int all_reduces = 0;
      for (const proto::Node& n : oc.local().nodes()) all_reduces += n.op() == "apc::op_all_reduce";
      EXPECT_EQ(all_reduces, 2);
    }
    EXPECT_FALSE(bn.empty());
    EXPECT_EQ(synced, bn) << "rank " << rank;
  }
  const Reference& ref = referenceFor("resnet_bottleneck.core.pt2");
  std::vector<std::string> failed =
      testing::runRanks(2, [&](int rank) { return runRank(rank, dir.string(), ref, true); });
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(spec);
}

// A new op with an internal collective, end to end: group_norm with a spatial dim cut (its
// registry entry's OpInfo::collective and collective_local, nothing else). A TorchScript module
// written here (GroupNorm in a submodule, then ReLU), planned on [2] with the norm's output
// pinned S(2) (an uneven cut: 11 rows), lowers to one OpCollective per rank on the group_norm node,
// and 3 SGD steps give the single-process module's outputs, gradients and losses.
TEST(OpCollective, GroupNormTrainsSpatiallyShardedWithSynchronizedStatistics) {
  const std::filesystem::path model = scratchDir("gn_small");
  {
    torch::jit::Module norm("__torch__.GroupNormSub");
    norm.register_parameter("weight", at::randn({8}, at::kFloat).requires_grad_(), false);
    norm.register_parameter("bias", at::randn({8}, at::kFloat).requires_grad_(), false);
    norm.define(R"JIT(
def forward(self, x):
    return torch.group_norm(x, 4, self.weight, self.bias, 1e-05, False)
)JIT");
    torch::jit::Module top("__torch__.GroupNormSmall");
    top.register_module("norm", norm);
    top.define(R"JIT(
def forward(self, x):
    return torch.relu(self.norm.forward(x))
)JIT");
    top.save(model.string() + ".pt");
  }
  const std::filesystem::path spec = scratchDir("gn_pins.json");
  {
    nlohmann::json pins = nlohmann::json::array();
    pins.push_back({{"module", "norm"}, {"placements", {"S(2)"}}});
    std::ofstream f(spec);
    f << nlohmann::json{{"mesh", {{"shape", {2}}}}, {"pins", pins}}.dump();
  }
  testing::ModelCase m{model.string(), {"x:f32[4,8,11,6]"}, 0, "--spec " + spec.string()};
  std::filesystem::path dir = scratchDir("gn_2_pinned");
  std::string err = testing::makeArtifact(m, "2", "", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  for (int64_t rank : {0, 1}) {
    Expected<proto::Program> prog = artifact::readProgram(dir.string(), rank);
    ASSERT_TRUE(prog.ok()) << prog.error().message();
    ASSERT_EQ(prog->op_collectives_size(), 1) << "rank " << rank;
    const proto::OpCollective& oc = prog->op_collectives(0);
    EXPECT_EQ(prog->graph().nodes(static_cast<int>(oc.node())).op(), "aten::group_norm");
    EXPECT_EQ(std::vector<uint32_t>(oc.mesh_dims().begin(), oc.mesh_dims().end()),
              std::vector<uint32_t>{0});
  }
  const Reference ref = testing::computeReference(m, kSteps, kLr);
  std::vector<std::string> failed =
      testing::runRanks(2, [&](int rank) { return runRank(rank, dir.string(), ref, true); });
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(spec);
}

/// The matrix. By default (CI): every sample with the optimizer's plan on [4], [2,2], [2,4] and
/// with every classic plan on [2,2]; gpt2_tiny (logits out) with the optimizer on [2,4]; the
/// exported programs (.pt2, .core.pt2) with the optimizer's plan on [4] and [2,2], and
/// gather_patterns.pt2 with ddp on [2,2].
/// APC_RUNTIME_FULL_MATRIX=1: every sample, mesh [2], [4], [2,2], [2,4] and plan (108 cases).
std::vector<DiffCase> diffCases() {
  const char* full_env = std::getenv("APC_RUNTIME_FULL_MATRIX");
  const bool full = full_env && std::string(full_env) == "1";
  std::vector<DiffCase> cases;
  for (const char* model : {"toy_block", "mlp_stack", "gpt2_tiny_loss", "gpt2_tiny", "llama_tiny",
                            "cnn_small", "resnet_bottleneck", "swin_tiny"}) {
    for (const char* mesh : {"2", "4", "2x2", "2x4"}) {
      const std::string ms = mesh;
      const bool two_d = ms.find('x') != std::string::npos;
      for (const char* strategy : {"", "ddp", "fsdp", "tp", "fsdp+tp"}) {
        const std::string st = strategy;
        if (st == "fsdp+tp" && !two_d) continue;
        bool in_ci = std::string(model) == "gpt2_tiny" ? (ms == "2x4" && st.empty())
                                                       : (ms != "2" && st.empty()) || ms == "2x2";
        if (full || in_ci) cases.push_back({model, mesh, strategy});
      }
    }
  }
  for (const char* model :
       {"toy_block.pt2", "mlp_stack.pt2", "mlp_stack.core.pt2", "gpt2_tiny_loss.pt2",
        "llama_tiny.pt2", "llama_tiny.core.pt2", "cnn_small.pt2", "resnet_bottleneck.pt2",
        "swin_tiny.pt2", "multi_output.pt2", "hf_llama_tiny.pt2", "hf_gpt2_tiny.pt2",
        "einsum_upsample.pt2", "gather_patterns.pt2"})
    for (const char* mesh : {"4", "2x2"}) cases.push_back({model, mesh, ""});
  // Data parallel: idx is batch-split, and the index list reads its positions whole.
  cases.push_back({"gather_patterns.pt2", "2x2", "ddp"});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Samples, Differential, ::testing::ValuesIn(diffCases()),
                         [](const ::testing::TestParamInfo<DiffCase>& info) {
                           return caseName(info.param);
                         });

// --- apc-train under `apc run` ----------------------------------------------------------------

/// The `step <n> loss <x> single <y>` lines of apc-train's output, as (x, y) pairs.
std::vector<std::pair<double, double>> parseLosses(const std::string& out) {
  std::vector<std::pair<double, double>> losses;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int step = 0;
    double x = 0, y = 0;
    if (std::sscanf(line.c_str(), "step %d loss %lf single %lf", &step, &x, &y) == 3)
      losses.emplace_back(x, y);
  }
  return losses;
}

// Plans `m` on `mesh` (`strategy`, "" for the optimizer), trains it 3 steps on `nproc` ranks with
// `flags` and --compare-single `reference`, and checks every step's loss against the single-device
// one's (1e-5) and that it moved. The run's output, or nullopt after recording why.
std::optional<apc::testing::CommandResult> trainComparingSingle(const ModelCase& m,
                                                                const std::string& mesh, int nproc,
                                                                const std::string& strategy,
                                                                const std::string& flags,
                                                                const std::string& reference) {
  std::filesystem::path dir = scratchDir("train_" + caseName({m.model, mesh, strategy}));
  std::string err = testing::makeArtifact(m, mesh, strategy, dir.string());
  if (!err.empty()) {
    ADD_FAILURE() << err;
    return std::nullopt;
  }
  const std::string train = std::string(APC_BINARY_DIR) + "/tools/apc-train";
  apc::testing::CommandResult r = apc::testing::runCommand(
      testing::apcBinary() + " run " + dir.string() + " --nproc " + std::to_string(nproc) +
      " --timeout 300 -- " + train + " " + dir.string() + " --steps 3 --compare-single " +
      reference + " " + flags);
  std::filesystem::remove_all(dir);
  if (r.code != 0) {
    ADD_FAILURE() << r.err;
    return std::nullopt;
  }
  auto losses = parseLosses(r.out);
  if (losses.size() != 3u) {
    ADD_FAILURE() << r.out;
    return std::nullopt;
  }
  for (const auto& [x, y] : losses) EXPECT_NEAR(x, y, 1e-5 * std::max(1.0, std::abs(y))) << r.out;
  EXPECT_NE(losses.front().first, losses.back().first) << "the loss did not move: " << r.out;
  return r;
}

void expectTrainMatchesSingle(const std::string& model, const std::string& mesh, int nproc,
                              std::string flags, const std::string& strategy = "") {
  const ModelCase& m = models().at(model);
  if (!std::filesystem::exists(testing::samplePath(m.model)) ||
      !std::filesystem::exists(testing::samplePath(m.model, m.format)))
    GTEST_SKIP() << "run sample_models/generate.py";
  // An exported program's artifact trains from the weights the .pt2 holds.
  if (m.format != "pt") flags += " --model " + testing::samplePath(m.model, m.format);
  trainComparingSingle(m, mesh, nproc, strategy, flags, testing::samplePath(m.model));
}

TEST(ApcTrain, SgdOnFourRanksMatchesSingle) {
  expectTrainMatchesSingle("mlp_stack", "2x2", 4, "--lr 0.5");
}

TEST(ApcTrain, AdamwWithCrossEntropyMatchesSingle) {
  expectTrainMatchesSingle("llama_tiny", "2", 2, "--optimizer adamw --lr 0.01 --clip 1.0");
}

// A float32 network with convolutions, batch-sharded (ddp) on 2x2: each rank convolves 2 images,
// the reference 8. (At this size oneDNN and ATen's kernels agree; on resnet18 they do not, which
// is why --compare-single runs ATen's on both sides: docs/TOOLCHAIN.md.)
TEST(ApcTrain, Float32ConvNetBatchShardedMatchesSingle) {
  expectTrainMatchesSingle("swin_tiny", "2x2", 4, "--lr 0.05", "ddp");
}

// One rank (a mesh of [1]): the program runs no redistribution node and trains as the model does.
TEST(ApcTrain, OneRankMeshMatchesSingle) {
  expectTrainMatchesSingle("hf_llama_tiny.pt2", "1", 1, "--lr 0.5");
}

// A stub-weight sample: the single-device reference gives its zero-stride weights memory of their
// own before its in-place updates (which would otherwise write many elements through one).
TEST(ApcTrain, StubWeightModelMatchesSingle) {
  expectTrainMatchesSingle("llama_small_4l", "2", 2, "--lr 0.5");
}

TEST(ApcTrain, HuggingFaceExportedProgramTrainsFromItsWeights) {
  expectTrainMatchesSingle("hf_llama_tiny.pt2", "2x2", 4, "--optimizer adamw --lr 0.01");
}

// --compare-single takes the exported program itself (issue 31): it runs through apc's
// interpreter on one device, imported at the run's batch (6 here, the export's hint is 8; 6 rows
// on 4 ranks are uneven pieces). Beside it, the same model in float64: each step line carries its
// loss, and the summary on stderr sets the sharded difference against the float32 run's own
// rounding.
TEST(ApcTrain, CompareSingleTakesAnExportedProgramAtAnotherBatch) {
  if (!std::filesystem::exists(testing::samplePath("hf_gpt2_tiny", "pt2")))
    GTEST_SKIP() << "run sample_models/generate.py";
  const std::optional<apc::testing::CommandResult> run = trainComparingSingle(
      {"hf_gpt2_tiny", {}, 256, "", "pt2"}, "2x2", 4, "", "--batch 6 --optimizer adamw --lr 0.01",
      testing::samplePath("hf_gpt2_tiny", "pt2"));
  ASSERT_TRUE(run);
  const apc::testing::CommandResult& r = *run;
  // The float64 twin's loss on every step line, close to the float32 one (same model, weights
  // and data; only rounding differs).
  std::istringstream in(r.out);
  std::string line;
  int f64_lines = 0;
  while (std::getline(in, line)) {
    int step = 0;
    double x = 0, y = 0, z = 0;
    if (std::sscanf(line.c_str(), "step %d loss %lf single %lf f64 %lf", &step, &x, &y, &z) == 4) {
      ++f64_lines;
      EXPECT_NEAR(y, z, 1e-4 * std::abs(z)) << line;
    }
  }
  EXPECT_EQ(f64_lines, 3) << r.out;
  EXPECT_NE(r.err.find("sharded vs single: largest loss difference"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("within the single-device run's own rounding"), std::string::npos) << r.err;
}

// Mixed precision (bf16 parameters and compute, f32 reductions) on Hugging Face decoders exported
// in f32: their own casts name the export's dtype (LlamaRMSNorm casts back "to the input's dtype",
// GPT-2 casts its position embeddings "to the device" with f32), so a bf16 weight met an f32
// activation and training stopped at step 0 ("expected m1 and m2 to have the same dtype", "mixed
// dtype (CPU): expect parameter to have scalar type of Float"). Contractions and normalizations
// now cast disagreeing floating arguments to the compute dtype (InterpreterOptions::
// mixed_compute): fsdp on 2 ranks trains within bf16's rounding of the float32 single-device
// model (3e-5 of 5.6 measured; 1e-3 relative allowed).
TEST(ApcTrain, MixedPrecisionTrainsHuggingFaceDecoders) {
  const std::filesystem::path spec = scratchDir("mixed_hf.spec.json");
  {
    std::ofstream out(spec);
    out << R"({"mesh": {"shape": [2]}, )"
           R"("mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "f32"}})";
  }
  for (const std::string model : {"hf_llama_tiny", "hf_gpt2_tiny"}) {
    const std::string pt2 = testing::samplePath(model, "pt2");
    if (!std::filesystem::exists(pt2)) GTEST_SKIP() << "run sample_models/generate.py";
    const std::filesystem::path dir = scratchDir("mixed_" + model);
    std::string err = testing::makeArtifact({model, {}, 256, "", "pt2"}, "2", "fsdp", dir.string(),
                                            "--spec " + spec.string());
    ASSERT_TRUE(err.empty()) << err;
    apc::testing::CommandResult r = apc::testing::runCommand(
        testing::apcBinary() + " run " + dir.string() + " --nproc 2 --timeout 300 -- " +
        std::string(APC_BINARY_DIR) + "/tools/apc-train " + dir.string() +
        " --steps 3 --lr 0.1 --compare-single " + pt2);
    ASSERT_EQ(r.code, 0) << model << ": " << r.err;
    auto losses = parseLosses(r.out);
    ASSERT_EQ(losses.size(), 3u) << r.out;
    for (const auto& [x, y] : losses)
      EXPECT_NEAR(x, y, 1e-3 * std::abs(y)) << model << "\n" << r.out;
    // The summary judges the difference by bf16's rounding, not float32's (it said "a sharding
    // bug" of every mixed-precision run).
    EXPECT_NE(r.err.find("(mixed precision), the single-device run in float32: within "
                         "BFloat16's rounding of the loss"),
              std::string::npos)
        << model << ": " << r.err;
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove(spec);
}

// The float64 twin is a yardstick only: where a kernel has no float64 (CPU _grouped_mm, in Hugging
// Face's default grouped_mm experts), --compare-single says so in one line and goes on against the
// float32 single-device model.
TEST(ApcTrain, CompareSingleGoesOnWithoutAFloat64Twin) {
  if (!std::filesystem::exists(testing::samplePath("hf_mixtral_gmm_tiny", "pt2")))
    GTEST_SKIP() << "run sample_models/generate.py";
  const std::optional<apc::testing::CommandResult> run =
      trainComparingSingle({"hf_mixtral_gmm_tiny", {}, 256, "", "pt2"}, "2", 2, "", "--lr 0.1",
                           testing::samplePath("hf_mixtral_gmm_tiny", "pt2"));
  ASSERT_TRUE(run);
  EXPECT_EQ(run->out.find(" f64 "), std::string::npos) << run->out;
  EXPECT_NE(run->err.find("apc-train: note: no float64 reference from step 0 on"),
            std::string::npos)
      << run->err;
}

// --- measured runs: apc-train --profile, apc calibrate, apc plan --cluster
// -------------------------

/// The last line of `out` parsed as JSON (null when it is not JSON).
nlohmann::json lastJsonLine(const std::string& out) {
  std::string last, line;
  std::istringstream in(out);
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last, nullptr, /*allow_exceptions=*/false);
}

/// The lines of `out` that start with `prefix`.
std::vector<std::string> linesStartingWith(const std::string& out, const std::string& prefix) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(out);
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  return lines;
}

// Without --model, apc-train starts from the weights and buffers of the model file the artifact
// was lowered from (its manifest's model_path, checked against its SHA-256). cnn_small's
// BatchNorms are in eval mode: drawn from normal(0, 0.02), half of each running variance is
// negative and the loss is NaN, which is what a run got before the manifest named its model.
TEST(ApcTrain, StartsFromTheLoweredModelsWeightsWithoutModel) {
  const std::string pt2 = testing::samplePath("cnn_small", "pt2");
  if (!std::filesystem::exists(pt2)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path work = scratchDir("train_model_path");
  std::filesystem::create_directories(work);
  const std::filesystem::path model = work / "copy.pt2", dir = work / "art";
  std::filesystem::copy_file(pt2, model);
  apc::testing::CommandResult planned = apc::testing::runCommand(
      testing::apcBinary() + " plan " + model.string() + " --mesh 2 --strategy ddp -o " +
      dir.string() + ".plan.json" + " --artifact " + dir.string());
  ASSERT_EQ(planned.code, 0) << planned.err;
  const std::string train = std::string(APC_BINARY_DIR) + "/tools/apc-train";
  auto runWith = [&](const std::string& flags) {
    return apc::testing::runCommand(testing::apcBinary() + " run " + dir.string() +
                                    " --nproc 2 --timeout 300 -- " + train + " " + dir.string() +
                                    " --steps 2 " + flags);
  };
  apc::testing::CommandResult by_default = runWith(""), given = runWith("--model " + pt2);
  ASSERT_EQ(by_default.code, 0) << by_default.err;
  ASSERT_EQ(given.code, 0) << given.err;
  const std::vector<std::string> losses = linesStartingWith(by_default.out, "step ");
  ASSERT_EQ(losses.size(), 2u) << by_default.out;
  EXPECT_EQ(losses, linesStartingWith(given.out, "step "));
  for (const std::string& line : losses) EXPECT_EQ(line.find("nan"), std::string::npos) << line;
  EXPECT_NE(by_default.err.find("weights from " + model.string()), std::string::npos)
      << by_default.err;
  // Drawn on request, and when the model file changed since lowering (with a note).
  apc::testing::CommandResult drawn = runWith("--random-init");
  ASSERT_EQ(drawn.code, 0) << drawn.err;
  EXPECT_NE(linesStartingWith(drawn.out, "step "), losses);
  std::filesystem::resize_file(model, std::filesystem::file_size(model) - 1);
  apc::testing::CommandResult changed = runWith("");
  ASSERT_EQ(changed.code, 0) << changed.err;
  EXPECT_EQ(linesStartingWith(changed.out, "step "), linesStartingWith(drawn.out, "step "));
  EXPECT_NE(changed.err.find("changed since lowering"), std::string::npos) << changed.err;
  std::filesystem::remove_all(work);
}

TEST(ApcTrain, GradientBucketsReduceInOneCallWithTheSameLossesAndTheirPrediction) {
  const ModelCase& m = models().at("mlp_stack");
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = scratchDir("buckets_ddp");
  std::string err = testing::makeArtifact(m, "2", "ddp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const std::string train = std::string(APC_BINARY_DIR) + "/tools/apc-train";
  // The first bucket as large as the others (DDP's small first bucket, on by default, would make
  // mlp_stack's 2 MiB of gradients two buckets: OverlapLatency.TheFirstBucketIsSmallerAsDdpsIs).
  auto runWith = [&](const std::string& mib, bool json) {
    return apc::testing::runCommand(
        testing::apcBinary() + " run " + dir.string() + " --nproc 2 --timeout 300 -- " + train +
        " " + dir.string() + " --steps 3 --warmup 1 --first-grad-bucket-mib 0" +
        " --grad-bucket-mib " + mib + (json ? " --profile --json" : ""));
  };
  // Losses: bucketed and one by one alike (a 2-rank sum is the same in any order).
  apc::testing::CommandResult bucketed = runWith("25", false), single = runWith("0", false);
  ASSERT_EQ(bucketed.code, 0) << bucketed.err;
  ASSERT_EQ(single.code, 0) << single.err;
  const std::vector<std::string> losses = linesStartingWith(bucketed.out, "step ");
  ASSERT_EQ(losses.size(), 4u) << bucketed.out;
  EXPECT_EQ(losses, linesStartingWith(single.out, "step "));
  // Calls: one all-reduce per step for every parameter gradient, against one per parameter; the
  // same bytes; the prediction takes off what the buckets save.
  apc::testing::CommandResult jb = runWith("25", true), js = runWith("0", true);
  ASSERT_EQ(jb.code, 0) << jb.err;
  ASSERT_EQ(js.code, 0) << js.err;
  nlohmann::json b = lastJsonLine(jb.out), o = lastJsonLine(js.out);
  ASSERT_TRUE(b.is_object() && o.is_object()) << jb.out << js.out;
  auto allReduce = [](const nlohmann::json& j, const char* key) {
    double v = 0;
    for (const auto& c : j["collectives_per_step"])
      if (c["kind"] == "all-reduce") v += c[key].get<double>();
    return v;
  };
  EXPECT_EQ(allReduce(b, "calls"), 1.0) << b.dump();
  EXPECT_GT(allReduce(o, "calls"), 4.0) << o.dump();  // mlp_stack has 13 parameters
  EXPECT_EQ(allReduce(b, "bytes_sent"), allReduce(o, "bytes_sent"));
  EXPECT_EQ(allReduce(b, "bytes_sent"), b["planned_wire_bytes"].get<double>());
  EXPECT_LT(b["predicted_step_ms"].get<double>(), o["predicted_step_ms"].get<double>());
  EXPECT_EQ(b["predicted_ms"]["compute"], o["predicted_ms"]["compute"]);
}

// GPT-2's position embedding (wpe looked up by arange, replicated, added to the batch-sharded
// token embedding) under ddp: its gradient stays partial through the lookup and is all-reduced
// with wpe's in the one bucket, as torch's DDP reduces it (lower::decidePartialGradients), where
// it was one more blocking all-reduce of the activation's gradient mid-backward. The losses are
// the single-device model's; one all-reduce a step carries every gradient, the planned bytes.
TEST(ApcTrain, PositionEmbeddingGradientJoinsTheParametersBucket) {
  const ModelCase& m = models().at("hf_gpt2_tiny.pt2");
  if (!std::filesystem::exists(testing::samplePath(m.model)) ||
      !std::filesystem::exists(testing::samplePath(m.model, m.format)))
    GTEST_SKIP() << "run sample_models/generate.py";
  expectTrainMatchesSingle("hf_gpt2_tiny.pt2", "2", 2, "--lr 0.5", "ddp");
  std::filesystem::path dir = scratchDir("wpe_bucket");
  std::string err = testing::makeArtifact(m, "2", "ddp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const std::string train = std::string(APC_BINARY_DIR) + "/tools/apc-train";
  apc::testing::CommandResult r = apc::testing::runCommand(
      testing::apcBinary() + " run " + dir.string() + " --nproc 2 --timeout 300 -- " + train + " " +
      dir.string() + " --model " + testing::samplePath(m.model, m.format) +
      " --steps 2 --warmup 1 --first-grad-bucket-mib 0 --profile --json");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = lastJsonLine(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  double calls = 0, bytes = 0;
  for (const auto& c : j["collectives_per_step"]) {
    calls += c["calls"].get<double>();
    bytes += c["bytes_sent"].get<double>();
  }
  EXPECT_EQ(calls, 1.0) << j.dump();
  EXPECT_EQ(bytes, j["planned_wire_bytes"].get<double>()) << j.dump();
  std::filesystem::remove_all(dir);
}

// --profile-nodes: every op of the program timed forward and backward, beside the plan's price of
// its nodes; the prices add up to the prediction's compute.
TEST(ApcTrain, ProfileNodesTimesEveryOpBesideItsPrice) {
  const ModelCase& m = models().at("mlp_stack");
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = scratchDir("profile_nodes");
  std::string err = testing::makeArtifact(m, "2", "ddp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const std::string train = std::string(APC_BINARY_DIR) + "/tools/apc-train";
  apc::testing::CommandResult r = apc::testing::runCommand(
      testing::apcBinary() + " run " + dir.string() + " --nproc 2 --timeout 300 -- " + train + " " +
      dir.string() + " --steps 2 --warmup 1 --profile --profile-nodes --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = linesStartingWith(r.out, "{\"nodes\"");
  ASSERT_EQ(lines.size(), 1u) << r.out;
  nlohmann::json nodes = nlohmann::json::parse(lines[0])["nodes"];
  nlohmann::json profile = lastJsonLine(r.out);
  ASSERT_TRUE(profile.is_object()) << r.out;
  double predicted = 0;
  std::map<std::string, nlohmann::json> by_op;
  for (const auto& o : nodes) {
    by_op[o["op"].get<std::string>()] = o;
    EXPECT_GE(o["forward_ms"].get<double>(), 0.0) << o.dump();
    EXPECT_GE(o["backward_ms"].get<double>(), 0.0) << o.dump();
    predicted += o["predicted_ms"].get<double>();
  }
  ASSERT_TRUE(by_op.count("aten::linear")) << nodes.dump();
  EXPECT_EQ(by_op["aten::linear"]["nodes"].get<int>(), 8);  // 4 blocks of up and down
  EXPECT_GT(by_op["aten::linear"]["forward_ms"].get<double>(), 0.0);
  EXPECT_GT(by_op["aten::linear"]["backward_ms"].get<double>(), 0.0);
  const double compute = profile["predicted_ms"]["compute"].get<double>();
  EXPECT_NEAR(predicted, compute, 1e-6 * compute) << nodes.dump();
  // Node by node: the linears' rows add up to their op's row, each with its local input shapes
  // (the batch of 2 ranks' ddp is half the model's).
  nlohmann::json each = nlohmann::json::parse(lines[0])["per_node"];
  double linear_fwd = 0, linear_pred = 0;
  int linears = 0;
  for (const auto& n : each) {
    if (n["op"] != "aten::linear") continue;
    ++linears;
    linear_fwd += n["forward_ms"].get<double>();
    linear_pred += n["predicted_ms"].get<double>();
    EXPECT_EQ(n["inputs"].get<std::string>().rfind("f32[", 0), 0u) << n.dump();
  }
  EXPECT_EQ(linears, 8) << each.dump();
  EXPECT_NEAR(linear_fwd, by_op["aten::linear"]["forward_ms"].get<double>(),
              1e-9 + 1e-6 * linear_fwd);
  EXPECT_NEAR(linear_pred, by_op["aten::linear"]["predicted_ms"].get<double>(),
              1e-9 + 1e-6 * linear_pred);
  // Without --profile it is a usage error.
  r = apc::testing::runCommand(train + " " + dir.string() + " --profile-nodes");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--profile-nodes needs --profile"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(ApcTrain, ProfilePrintsMeasuredBesidePredictedAndThePlannedBytes) {
  const ModelCase& m = models().at("mlp_stack");
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = scratchDir("profile_fsdp");
  std::string err = testing::makeArtifact(m, "2x2", "fsdp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const std::string train = std::string(APC_BINARY_DIR) + "/tools/apc-train";
  apc::testing::CommandResult r = apc::testing::runCommand(
      testing::apcBinary() + " run " + dir.string() + " --nproc 4 --timeout 300 -- " + train + " " +
      dir.string() + " --steps 3 --warmup 1 --optimizer adamw --profile --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("step 0 loss"), std::string::npos) << "--json prints no step lines";
  nlohmann::json j = lastJsonLine(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_GT(j["measured_step_ms"].get<double>(), 0.0);
  EXPECT_EQ(j["steps"].get<int>(), 3);
  EXPECT_EQ(j["warmup"].get<int>(), 1);
  // The prediction is the plan's: its objective, less the communication the runtime's overlap
  // schedule hides (apc/lower/schedule.h; all of it on a datasheet GPU, whose overlap efficiency
  // is 1), plus the optimizer over the local shards.
  EXPECT_EQ(j["overlap_efficiency"].get<double>(), 1.0);
  const double predicted = j["predicted_step_ms"].get<double>();
  const double comm = j["predicted_ms"]["comm"].get<double>();
  const double hidden = j["predicted_ms"]["hidden_comm"].get<double>();
  EXPECT_GT(comm, 0.0) << "fsdp communicates";
  EXPECT_GE(hidden, 0.0);
  EXPECT_LT(hidden, comm);
  EXPECT_NEAR(j["predicted_ms"]["exposed_comm"].get<double>() + hidden, comm, 1e-6 * comm);
  EXPECT_GT(j["predicted_ms"]["optimizer"].get<double>(), 0.0);
  EXPECT_NEAR(predicted,
              j["predicted_ms"]["compute"].get<double>() + comm -
                  j["overlap_efficiency"].get<double>() * hidden +
                  j["predicted_ms"]["optimizer"].get<double>(),
              1e-6 * predicted);
  // The phases add up to the step (medians of each, so not exactly; within the spread).
  const double phases = j["measured_ms"]["forward"].get<double>() +
                        j["measured_ms"]["backward"].get<double>() +
                        j["measured_ms"]["optimizer"].get<double>();
  EXPECT_GT(phases, 0.5 * j["step_ms"]["min"].get<double>());
  EXPECT_LT(phases, 2.0 * j["step_ms"]["max"].get<double>());
  // Measured bytes per step equal the planned bytes (mlp_stack's dims split evenly on 2x2).
  double sent = 0;
  std::set<std::string> kinds;
  for (const auto& c : j["collectives_per_step"]) {
    sent += c["bytes_sent"].get<double>();
    kinds.insert(c["kind"].get<std::string>());
    EXPECT_GE(c["ms"].get<double>(), 0.0);
  }
  EXPECT_GT(sent, 0.0);
  EXPECT_EQ(sent, j["planned_wire_bytes"].get<double>()) << j.dump();
  EXPECT_TRUE(kinds.count("all-gather")) << j.dump();
  EXPECT_GT(j["peak_memory_bytes"].get<double>(), 1e6);
  // The run's peak is its measured steps' (the largest phase): not the loading of the model's
  // weights, not the warm-up step, not the trainer's full-batch synthetic inputs.
  double largest_phase = 0;
  for (const auto& [phase, bytes] : j["peak_memory_by_phase_bytes"].items())
    largest_phase = std::max(largest_phase, bytes.get<double>());
  EXPECT_EQ(j["peak_memory_bytes"].get<double>(), largest_phase) << j.dump();
  // CPU: the tensor bytes of apc's caching allocator (apc-train installs it), else the process's.
  EXPECT_NE(j["peak_memory_kind"].get<std::string>().find("caching allocator"), std::string::npos);

  // Text form on rank 0, and --json alone is a usage error.
  r = apc::testing::runCommand(testing::apcBinary() + " run " + dir.string() +
                               " --nproc 4 --timeout 300 -- " + train + " " + dir.string() +
                               " --steps 1 --warmup 0 --profile --no-host-cache");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step (median, slowest rank)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("peak resident set"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("predicted"), std::string::npos) << r.out;
  // The plan priced an H100 (makeArtifact names no device): the profile says so beside a CPU run.
  EXPECT_TRUE(j["predicted_for_another_device"].get<bool>()) << j["cost_model"];
  EXPECT_NE(r.out.find("note: predicted for h100, the plan's device, not this cpu run"),
            std::string::npos)
      << r.out;
  r = apc::testing::runCommand(train + " " + dir.string() + " --json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--json needs --profile"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(ApcTrain, CalibrateThenPlanWithTheClusterProfile) {
  const ModelCase& m = models().at("mlp_stack");
  const std::string model = testing::samplePath(m.model, "pt2");
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = scratchDir("calibrate");
  std::filesystem::create_directories(dir);
  const std::string profile = (dir / "cluster.json").string();
  // A quick calibration: messages up to 64 KiB, each size timed a few times.
  apc::testing::CommandResult r =
      apc::testing::runCommand(testing::apcBinary() + " calibrate --nproc 2 --max-mib 0.0625 " +
                               "--min-seconds 0.001 --model " + model + " -o " + profile);
  ASSERT_EQ(r.code, 0) << r.err;
  auto p = spec::readClusterProfile(profile);
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->device, "cpu");
  ASSERT_EQ(p->links.size(), 1u);
  EXPECT_GT(p->links[0].bandwidth_gbps, 0.0);
  ASSERT_EQ(p->network.size(), 1u);
  for (size_t k = 0; k < 4; ++k) {
    ASSERT_TRUE(p->network[0].by_kind[k].has_value()) << k;
    ASSERT_TRUE(p->network[0].tables[k].has_value()) << k;
    EXPECT_EQ(p->network[0].tables[k]->group_size, 2);
    EXPECT_EQ(p->network[0].tables[k]->bytes.size(), 3u);  // 4, 16 and 64 KiB
  }
  EXPECT_GT(p->device_overrides.peak_tflops.at(ir::DType::kF32), 0.0);
  ASSERT_TRUE(p->device_overrides.kernel_floor_us.has_value());
  // The products with a dim of one and the row gather were timed.
  EXPECT_GT(p->device_overrides.matvec_gbps.value_or(0), 0.0);
  EXPECT_GT(p->device_overrides.outer_product_gbps.value_or(0), 0.0);
  EXPECT_EQ(p->device_overrides.op_us.count("aten::index"), 1u);
  const nlohmann::json raw = nlohmann::json::parse(std::ifstream(profile));
  // The memory-bound kernels were timed on operands rotated through 16 MiB (or 256 sets), out of
  // the core's own caches as a step finds them.
  int rotated = 0;
  for (const nlohmann::json& row : raw.at("calibration").at("compute")) {
    if (!row.contains("operand_sets")) continue;
    ++rotated;
    const double sets = row.at("operand_sets").get<double>();
    EXPECT_TRUE(sets * row.at("bytes").get<double>() >= 16.0 * 1024 * 1024 || sets == 256)
        << row.dump();
  }
  EXPECT_GE(rotated, 5) << "the elementwise curve's rows";
  // The weight-bound convolutions (3x3 on 2x2 maps of 64-512 channels) were timed forward and
  // backward, the 512-channel ones slower than the 64-channel ones; batch_norm has its curve.
  std::vector<double> conv_backward_us;
  for (const nlohmann::json& row : raw.at("calibration").at("compute")) {
    if (row.at("op").get<std::string>().find("on 2x2 maps") == std::string::npos) continue;
    EXPECT_GT(row.at("forward_us").get<double>(), 0.0) << row.dump();
    conv_backward_us.push_back(row.at("backward_us").get<double>());
  }
  ASSERT_EQ(conv_backward_us.size(), 4u);
  EXPECT_GT(conv_backward_us.back(), conv_backward_us.front());
  EXPECT_EQ(p->device_overrides.op_us.count("aten::batch_norm"), 1u);
  // The compute lost after a blocking wait was timed (a chain back to back and after a wait) and
  // is what the profile's device carries.
  const nlohmann::json& wait = raw.at("calibration").at("wait_resume");
  EXPECT_GT(wait.at("back_to_back_us").get<double>(), 0.0);
  EXPECT_GT(wait.at("after_wait_us").get<double>(), 0.0);
  ASSERT_TRUE(p->device_overrides.wait_resume_us.has_value());
  EXPECT_GE(*p->device_overrides.wait_resume_us, 0.0);
  EXPECT_EQ(*p->device_overrides.wait_resume_us, wait.at("wait_resume_us").get<double>());
  // The raw collective rows: every kind at every size from 15 calls or more, each median within
  // its 10th and 90th percentiles (the slowest rank's of each); a case is priced at its mean, and
  // the profile's table per kind holds the means (cost::monotoneUs of them).
  const nlohmann::json& rows = raw.at("calibration").at("collectives");
  ASSERT_EQ(rows.size(), 12u);                       // 4 kinds x 3 sizes
  std::map<std::string, std::vector<double>> means;  // per kind, in the order of the sizes
  for (const nlohmann::json& row : rows) {
    EXPECT_GE(row.at("calls").get<int>(), 15) << row.dump();
    EXPECT_LE(row.at("p10_us").get<double>(), row.at("median_us").get<double>()) << row.dump();
    EXPECT_LE(row.at("median_us").get<double>(), row.at("p90_us").get<double>()) << row.dump();
    EXPECT_EQ(row.at("us").get<double>(), row.at("mean_us").get<double>()) << row.dump();
    means[row.at("kind").get<std::string>()].push_back(row.at("mean_us").get<double>());
  }
  for (size_t k = 0; k < 4; ++k)
    EXPECT_EQ(p->network[0].tables[k]->us, cost::monotoneUs(means[spec::kNetworkKindKeys[k]]))
        << spec::kNetworkKindKeys[k];

  // The plan is priced with it, records it, and its artifact carries the measured cost model.
  const std::string plan = (dir / "plan.json").string(), art = (dir / "art").string();
  r = apc::testing::runCommand(testing::apcBinary() + " plan " + model + " --mesh 2 --cluster " +
                               profile + " -o " + plan + " --artifact " + art + " --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  auto planned = plan::readPlanFile(plan);
  ASSERT_TRUE(planned.ok()) << planned.error().message();
  EXPECT_EQ(planned->spec.device, "cpu");
  // Calibration measured the memory per rank (the host's over its 2 ranks), and the plan fits
  // it by default (issue 29).
  ASSERT_TRUE(p->device_memory.has_value());
  EXPECT_GT(*p->device_memory, int64_t{1} << 20);
  EXPECT_EQ(planned->spec.device_memory, p->device_memory);
  ASSERT_EQ(planned->spec.network.size(), 1u);
  EXPECT_EQ(planned->spec.network[0], p->network[0]);
  // --model timed the model's op nodes at their strategies' local shapes (the linears replicated
  // and cut), and the plan prices every linear at one of the linears' measured forward+backward.
  const auto& nodes = p->device_overrides.node_us;
  std::vector<double> linear_us;
  std::set<std::string> linear_batches;
  for (const auto& [key, t] : nodes) {
    EXPECT_EQ(key.rfind("aten::", 0), 0u) << key;
    EXPECT_GT(t[0], 0.0) << key;
    if (key.rfind("aten::linear(", 0) != 0) continue;
    EXPECT_GT(t[1], 0.0) << key;
    linear_us.push_back(t[0] + t[1]);
    linear_batches.insert(key.substr(0, key.find(',')));
  }
  EXPECT_GE(linear_batches.size(), 2u) << "the linears' inputs replicated and batch-cut";
  int linears = 0;
  for (const plan::PlanNode& n : planned->nodes) {
    if (n.op != "aten::linear") continue;
    ++linears;
    EXPECT_TRUE(std::any_of(linear_us.begin(), linear_us.end(),
                            [&](double us) { return std::abs(us - n.compute_us) < 1e-6 * us; }))
        << n.name << " priced " << n.compute_us << " us";
  }
  EXPECT_EQ(linears, 8);
  EXPECT_EQ(raw.at("calibration").at("nodes").at("timed").get<size_t>(), nodes.size());
  // The seam: a profile holding today's numbers (the default device and link, given once for
  // the mesh dim and once per collective kind) prices every node and edge as the plan without it
  // (under one budget: a profile names its device, which would make the device memory the default).
  const std::string today = (dir / "today.json").string();
  std::ofstream(today) << R"({"apc_cluster_profile": 1, "device": "h100",
      "links": [{"bandwidth_gbps": 450, "latency_us": 2}],
      "network": [{"all-gather": {"bandwidth_gbps": 450, "latency_us": 2},
                   "reduce-scatter": {"bandwidth_gbps": 450, "latency_us": 2},
                   "all-reduce": {"bandwidth_gbps": 450, "latency_us": 2},
                   "all-to-all": {"bandwidth_gbps": 450, "latency_us": 2}}]})";
  const std::string plain = (dir / "plain.json").string(), seam = (dir / "seam.json").string();
  for (const auto& [out, extra] :
       {std::pair{plain, std::string()}, std::pair{seam, " --cluster " + today}}) {
    r = apc::testing::runCommand(testing::apcBinary() + " plan " + model +
                                 " --mesh 2 --memory-budget 0, -o " + out + " --quiet" + extra);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  auto a = plan::readPlanFile(plain), b = plan::readPlanFile(seam);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->nodes, b->nodes);
  EXPECT_EQ(a->totals, b->totals);
  EXPECT_EQ(b->spec.network.size(), 1u);
  // A profile that is not one: one line, exit 2.
  std::ofstream(dir / "bad.json") << R"({"mesh": {"shape": [2]}})";
  r = apc::testing::runCommand(testing::apcBinary() + " plan " + model + " --mesh 2 --cluster " +
                               (dir / "bad.json").string() + " -o " + plan);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("apc_cluster_profile"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // Without --nproc and outside torchrun: a usage error.
  r = apc::testing::runCommand(testing::apcBinary() + " calibrate -o " + profile);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--nproc"), std::string::npos) << r.err;
  // A model that is not there: one line naming it, before any rank starts.
  r = apc::testing::runCommand(testing::apcBinary() + " calibrate --nproc 2 --model " +
                               (dir / "missing.pt2").string() + " -o " + profile);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("missing.pt2"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // One that does not import: one line naming it, before any rank starts.
  std::ofstream(dir / "broken.pt2") << "not a model";
  r = apc::testing::runCommand(testing::apcBinary() + " calibrate --nproc 2 --model " +
                               (dir / "broken.pt2").string() + " -o " + profile);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("broken.pt2"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  std::filesystem::remove_all(dir);
}

// --- a rank dies mid-step ----------------------------------------------------------------------

TEST(RankFailure, PeersOfADeadRankFailWithinTheTimeout) {
  const ModelCase& m = models().at("mlp_stack");
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = scratchDir("dead_rank");
  std::string err = testing::makeArtifact(m, "2x2", "fsdp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const Reference& ref = referenceFor("mlp_stack");
  std::vector<std::string> failed = testing::runRanks(
      4,
      [&](int rank) {
        ParallelModuleOptions options;
        options.world.timeout = std::chrono::milliseconds(5000);
        auto pm = ParallelModule::load(dir.string(), options);
        if (!pm.ok()) return 10;
        // Every rank has its process groups before rank 3 goes (a peer still connecting would
        // fail at load instead). A barrier that its exit cuts short is a failure as expected.
        auto t0 = std::chrono::steady_clock::now();
        std::string error;
        try {
          (*pm)->world().all().barrier();
        } catch (const std::exception& e) {
          error = e.what();
        }
        if (rank == 3) ::_exit(0);  // dies before its first collective of the step
        if (!(*pm)->load_full_state_dict(ref.init).ok()) return 11;
        std::vector<c10::IValue> inputs = {(*pm)->shardInput(0, ref.inputs[0])};
        try {
          if (!error.empty()) throw std::runtime_error(error);
          auto out = (*pm)->forwardLeaves(inputs);
          if (!out.ok())
            error = out.error().message();
          else
            testing::lossOf({(*pm)->gatherOutput(0, (*out)[0].toTensor())}, ref.loss_weights)
                .backward();
        } catch (const std::exception& e) {
          error = e.what();
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        // Ranks of groups without rank 3 may finish the forward; the step must fail somewhere.
        if (error.empty()) {
          std::fprintf(stderr, "rank %d: no error after a peer died\n", rank);
          return 12;
        }
        std::fprintf(stderr, "rank %d: failed after %.1f s as expected: %s\n", rank, s,
                     error.substr(0, error.find('\n')).c_str());
        return s < 60 ? 0 : 13;
      },
      120);
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
}

// --- failures at load ------------------------------------------------------------------------

class ArtifactErrors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = scratchDir("errors").string();
    err_ = testing::makeArtifact(models().at("mlp_stack"), "2", "", dir_);
  }
  static std::string copyOf(const std::string& name) {
    std::filesystem::path d = scratchDir(name);
    std::filesystem::copy(dir_, d, std::filesystem::copy_options::recursive);
    return d.string();
  }
  static std::string loadError(const std::string& dir, int rank, int world) {
    LaunchEnv env;
    env.rank = rank;
    env.world_size = world;
    auto pm = ParallelModule::load(dir, env, ParallelModuleOptions{});
    return pm.ok() ? std::string() : pm.error().message();
  }
  /// The artifact's two programs, to edit; empty (a failure added) when one does not read.
  static std::vector<proto::Program> readPrograms() {
    std::vector<proto::Program> out;
    for (int64_t r : {0, 1}) {
      Expected<proto::Program> p = artifact::readProgram(dir_, r);
      if (!p.ok()) {
        ADD_FAILURE() << p.error().message();
        return {};
      }
      out.push_back(std::move(p).value());
    }
    return out;
  }
  static inline std::string dir_, err_;
};

TEST_F(ArtifactErrors, TruncatedProgramIsAHashMismatch) {
  ASSERT_TRUE(err_.empty()) << err_;
  std::string d = copyOf("truncated");
  std::filesystem::path f = std::filesystem::path(d) / "rank_1.apcp";
  std::filesystem::resize_file(f, std::filesystem::file_size(f) / 2);
  std::string e = loadError(d, 1, 2);
  EXPECT_NE(e.find("rank_1.apcp"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST_F(ArtifactErrors, EditedProgramIsAHashMismatch) {
  ASSERT_TRUE(err_.empty()) << err_;
  std::string d = copyOf("edited");
  std::filesystem::path f = std::filesystem::path(d) / "rank_0.apcp";
  std::fstream s(f, std::ios::in | std::ios::out | std::ios::binary);
  s.seekg(40);
  char ch = 0;
  s.get(ch);
  s.seekp(40);
  s.put(static_cast<char>(ch ^ 0x5a));
  s.close();
  std::string e = loadError(d, 0, 2);
  EXPECT_NE(e.find("rank_0.apcp"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST_F(ArtifactErrors, WorldSizeDifferentFromTheArtifact) {
  ASSERT_TRUE(err_.empty()) << err_;
  std::string e = loadError(dir_, 0, 4);
  EXPECT_NE(e.find("world size 2"), std::string::npos) << e;
  EXPECT_NE(e.find("WORLD_SIZE=4"), std::string::npos) << e;
}

TEST_F(ArtifactErrors, MissingDirectory) {
  std::string e = loadError(dir_ + "_nope", 0, 2);
  EXPECT_FALSE(e.empty());
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

// A malformed op collective (proto::OpCollective) fails the load in one line that names the node:
// one on a node that is not an op node, one whose local graph does not fit its node (a batch_norm
// graph on a linear), one whose local graph runs an op the registry does not have.
TEST_F(ArtifactErrors, MalformedOpCollectiveNamesItsNode) {
  ASSERT_TRUE(err_.empty()) << err_;
  const std::vector<proto::Program> programs = readPrograms();
  ASSERT_EQ(programs.size(), 2u);
  int linear = -1;
  for (int i = 0; i < programs[0].graph().nodes_size() && linear < 0; ++i)
    if (programs[0].graph().nodes(i).op() == "aten::linear") linear = i;
  ASSERT_GE(linear, 0);
  auto localGraph = [](size_t inputs, const std::string& op) {
    ir::Graph g;
    g.name = "test (local)";
    std::vector<ir::ValueId> args;
    for (size_t i = 0; i < inputs; ++i) {
      ir::Value v;
      v.type = ir::ValueType::kOther;
      v.debug_name = "a" + std::to_string(i);
      args.push_back(g.addValue(v));
      ir::Node in;
      in.kind = ir::NodeKind::kInput;
      in.op = "input";
      in.name = "arg" + std::to_string(i);
      in.outputs = {args.back()};
      g.addNode(in);
    }
    ir::Value out;
    out.type = ir::ValueType::kOther;
    out.debug_name = "y";
    ir::ValueId y = g.addValue(out);
    ir::Node n;
    n.op = op;
    n.inputs = {args[0]};
    n.outputs = {y};
    g.addNode(n);
    ir::OutputTree tree;
    tree.kind = ir::OutputTree::Kind::kTuple;
    tree.children.push_back(ir::OutputTree::makeLeaf(y));
    g.setOutputs(tree);
    proto::Graph pg;
    pg.ParseFromString(ir::serializeGraph(g));
    return pg;
  };
  const int linear_inputs = programs[0].graph().nodes(linear).inputs_size();
  struct Case {
    std::string name;
    uint32_t node;
    proto::Graph local;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"not_op", 0, localGraph(1, "aten::relu"), "not an op node"},
      {"wrong_arity", static_cast<uint32_t>(linear), localGraph(9, "aten::relu"), "9 inputs"},
      {"unknown_op", static_cast<uint32_t>(linear),
       localGraph(static_cast<size_t>(linear_inputs), "test::no_such_op"), "test::no_such_op"}};
  for (const Case& c : cases) {
    std::vector<proto::Program> edited = programs;
    for (proto::Program& p : edited) {
      proto::OpCollective* oc = p.add_op_collectives();
      oc->set_node(c.node);
      oc->add_mesh_dims(0);
      *oc->mutable_local() = c.local;
    }
    std::string d = scratchDir("op_collective_" + c.name).string();
    Status s = artifact::writeArtifact(d, edited);
    ASSERT_TRUE(s.ok()) << s.error().message();
    std::string e = loadError(d, 0, 2);
    EXPECT_NE(e.find("op collective of node " + std::to_string(c.node)), std::string::npos)
        << c.name << ": " << e;
    EXPECT_NE(e.find(c.says), std::string::npos) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.name << ": " << e;
    std::filesystem::remove_all(d);
  }
}

// Malformed random nodes (proto::Program::random_nodes, random_pieces) fail the load in one line:
// a node past the program's end, and pieces that do not pair with the nodes.
TEST_F(ArtifactErrors, MalformedRandomNodesAreOneLineErrors) {
  ASSERT_TRUE(err_.empty()) << err_;
  const std::vector<proto::Program> programs = readPrograms();
  ASSERT_EQ(programs.size(), 2u);
  struct Case {
    std::string name;
    std::function<void(proto::Program&)> edit;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"past_the_end",
       [](proto::Program& p) {
         p.add_random_nodes(static_cast<uint32_t>(p.graph().nodes_size()) + 3);
         p.add_random_pieces(0);
       },
       "is not a node of the model's graph"},
      {"unpaired",
       [](proto::Program& p) {
         p.add_random_nodes(0);
         p.add_random_pieces(0);
         p.add_random_pieces(1);
       },
       "random pieces for"}};
  for (const Case& c : cases) {
    std::vector<proto::Program> edited = programs;
    for (proto::Program& p : edited) c.edit(p);
    std::string d = scratchDir("random_" + c.name).string();
    Status s = artifact::writeArtifact(d, edited);
    ASSERT_TRUE(s.ok()) << s.error().message();
    std::string e = loadError(d, 0, 2);
    EXPECT_NE(e.find(c.says), std::string::npos) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << c.name << ": " << e;
    std::filesystem::remove_all(d);
  }
}

}  // namespace
}  // namespace apc::runtime::differential_test
