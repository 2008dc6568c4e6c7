//===- tests/runtime/activation_checkpoint_test.cpp - Checkpoint segments --===//
//
// Activation checkpointing at run time (proto::CheckpointSegment, issue 29 item 3):
// - the interpreter on a hand-built graph with a dropout inside a segment: outputs and gradients
//   equal the run without the segment under the same seed although the random-number state moves
//   between forward and backward (the recomputation replays the forward's dropout mask), and the
//   state after backward is the one backward found; the same with the dropout on a random stream
//   of its own, whose mask follows the run's seed and stream only;
// - one-line errors for bad segments, from Interpreter::create and from ParallelModule::load (an
//   artifact whose program holds an overlapping or out-of-range segment);
// - differential: llama_tiny planned with ddp, fsdp and tp on [2] (fsdp also without overlap),
//   fsdp+tp and the optimizer's plan on [2,2], its repeated layers checkpointed (the plan's
//   `checkpoint` set before lowering), trained 3 SGD steps on Gloo ranks: outputs, losses and
//   gradients equal the single-process model, the losses equal those of the same plan without
//   checkpointing, and the loss's graph holds one checkpoint function per layer; the same for
//   resnet_bottleneck (BatchNorm in training mode: ddp and the optimizer's plan on [2]), whose
//   buffers (running statistics, num_batches_tracked) also equal the run without checkpointing
//   (the recomputation updates copies);
// - BatchNorm state: resnet_bottleneck under ddp, fsdp and the optimizer's plan (which shards
//   BatchNorms by channel) on [2]: the running statistics after training equal ddp's;
// - memory: the host allocator's live bytes after forward and its peak over the step are lower
//   with the layers checkpointed (a batch whose activations dominate).
//
//===----------------------------------------------------------------------===//
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/script.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../common/run_command.h"
#include "../ir/test_graphs.h"
#include "apc/artifact/artifact.h"
#include "apc/frontend/input_spec.h"
#include "apc/frontend/model.h"
#include "apc/ir/graph.h"
#include "apc/lower/lower.h"
#include "apc/plan/plan.h"
#include "apc/runtime/host_allocator.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/parallel_module.h"
#include "rank_harness.h"

// A namespace of its own: the files of runtime_test are compiled together (unity build).
namespace apc::runtime::activation_checkpoint_test {
namespace {

using testing::ModelCase;
using testing::Reference;

constexpr int kSteps = 3;
constexpr double kLr = 0.5;
constexpr double kRtol = 1e-5;  // differential_test's

// --- The interpreter -----------------------------------------------------------------------

/// x:[4,8], w:[8,8]; block: h = mm(x, w), d = dropout(h, 0.5, train), t = tanh(d); y = sin(t) * x.
/// Nodes 2..4 are the block.
std::shared_ptr<const ir::Graph> dropoutGraph() {
  using namespace ir::testing_graphs;
  ir::Graph g;
  auto value = [&](const char* name) {
    return tensorValue(g, name, {4, 8}, ir::DType::kF32, /*grad=*/true);
  };
  const ir::ValueId x = value("x");
  const ir::ValueId w = tensorValue(g, "w", {8, 8}, ir::DType::kF32, /*grad=*/true);
  leafNode(g, ir::NodeKind::kInput, "x", x);
  leafNode(g, ir::NodeKind::kParameter, "w", w);
  const ir::ValueId h = value("h"), d = value("d"), t = value("t"), s = value("s"), y = value("y");
  const ir::ValueId p = g.addConstant(ir::ValueType::kFloat, ir::Constant(0.5));
  const ir::ValueId train = g.addConstant(ir::ValueType::kBool, ir::Constant(true));
  opNode(g, "aten::mm", "", {x, w}, {h}, "block");
  opNode(g, "aten::dropout", "", {h, p, train}, {d}, "block");
  opNode(g, "aten::tanh", "", {d}, {t}, "block");
  opNode(g, "aten::sin", "", {t}, {s}, "");
  opNode(g, "aten::mul", "Tensor", {s, x}, {y}, "");
  g.setOutputs(ir::OutputTree::makeLeaf(y));
  return std::make_shared<const ir::Graph>(std::move(g));
}

struct DropoutRun {
  at::Tensor out, grad_x, grad_w, after;  // after: a draw once backward is done
  int64_t zeros = 0;                      // dropped elements of the block's output
};

/// `stream`: the dropout (node 3) draws from a random stream of its own
/// (InterpreterOptions::random_streams), in a run seeded `run_seed`; `generator_seed`: the default
/// generator's seed before the run.
DropoutRun runDropout(std::vector<CheckpointSpec> segments,
                      std::optional<uint64_t> stream = std::nullopt, uint64_t run_seed = 0,
                      uint64_t generator_seed = 42) {
  auto g = dropoutGraph();
  InterpreterOptions options;
  if (stream) options.random_streams[3] = *stream;
  auto interp = Interpreter::create(g, options, {}, {}, std::move(segments));
  EXPECT_TRUE(interp.ok()) << interp.error().message();
  if (!interp.ok()) return {};
  at::manual_seed(5);
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  at::Tensor w = at::randn({8, 8}).requires_grad_(true);
  at::Tensor gy = at::randn({4, 8});
  at::manual_seed(generator_seed);
  auto out = interp->run(
      [&](const ir::Node& n, std::vector<c10::IValue>&) {
        return std::vector<c10::IValue>{n.kind == ir::NodeKind::kParameter ? w : x};
      },
      nullptr, {}, nullptr, run_seed);
  EXPECT_TRUE(out.ok()) << out.error().message();
  if (!out.ok()) return {};
  DropoutRun r;
  r.out = (*out)[0].toTensor();
  // The state moves between forward and backward (other layers' dropouts, data loading): the
  // recomputation must replay the forward's mask all the same.
  (void)at::rand({1000});
  (r.out * gy).sum().backward();
  r.after = at::rand({4});
  r.grad_x = x.grad();
  r.grad_w = w.grad();
  // sin(tanh(0)) * x = 0 exactly where the dropout dropped.
  r.zeros = (r.out.detach() == 0).sum().item<int64_t>();
  return r;
}

TEST(ActivationCheckpoint, DropoutInsideASegmentReplaysItsMaskInBackward) {
  DropoutRun plain = runDropout({});
  DropoutRun ckpt = runDropout({{"block", 2, 4}});
  ASSERT_TRUE(plain.out.defined() && ckpt.out.defined());
  EXPECT_GT(plain.zeros, 0) << "the dropout dropped nothing: the test shows nothing";
  EXPECT_TRUE(at::equal(plain.out.detach(), ckpt.out.detach()));
  ASSERT_TRUE(ckpt.grad_x.defined() && ckpt.grad_w.defined());
  EXPECT_TRUE(at::allclose(plain.grad_x, ckpt.grad_x, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(plain.grad_w, ckpt.grad_w, 1e-6, 1e-7));
  // Backward put the random-number state back as it found it.
  EXPECT_TRUE(at::equal(plain.after, ckpt.after));
}

// A dropout with a random stream of its own (a ParallelModule program's random nodes): its mask
// depends on the run's seed and the stream, not on the default generator, which it leaves as it
// found it; a checkpoint segment's recomputation redraws it.
TEST(ActivationCheckpoint, DropoutWithItsOwnStreamReplaysItAndLeavesTheGeneratorAlone) {
  const DropoutRun plain = runDropout({}, 7, 9);
  const DropoutRun ckpt = runDropout({{"block", 2, 4}}, 7, 9);
  const DropoutRun other_generator = runDropout({}, 7, 9, 1234);
  const DropoutRun other_seed = runDropout({}, 7, 10);
  const DropoutRun other_stream = runDropout({}, 8, 9);
  ASSERT_TRUE(plain.out.defined() && ckpt.out.defined() && other_generator.out.defined() &&
              other_seed.out.defined() && other_stream.out.defined());
  EXPECT_GT(plain.zeros, 0) << "the dropout dropped nothing: the test shows nothing";
  EXPECT_TRUE(at::equal(plain.out.detach(), ckpt.out.detach()));
  EXPECT_TRUE(at::allclose(plain.grad_x, ckpt.grad_x, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(plain.grad_w, ckpt.grad_w, 1e-6, 1e-7));
  EXPECT_TRUE(at::equal(plain.out.detach(), other_generator.out.detach()))
      << "the stream's mask followed the default generator";
  EXPECT_FALSE(at::equal(plain.out.detach(), other_seed.out.detach()))
      << "another run seed drew the same mask";
  EXPECT_FALSE(at::equal(plain.out.detach(), other_stream.out.detach()))
      << "another stream drew the same mask";
  // The default generator is where the run found it: the draw after backward is the one after
  // manual_seed(42) and the 1000 numbers runDropout draws between forward and backward.
  at::manual_seed(42);
  (void)at::rand({1000});
  EXPECT_TRUE(at::equal(plain.after, at::rand({4})));
  EXPECT_TRUE(at::equal(ckpt.after, plain.after));
}

TEST(ActivationCheckpoint, SegmentKeepsNoActivationsAndRunsPlainWithoutGradMode) {
  auto g = dropoutGraph();
  auto interp = Interpreter::create(g, {}, {}, {}, {{"block", 2, 4}});
  ASSERT_TRUE(interp.ok()) << interp.error().message();
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  at::Tensor w = at::randn({8, 8}).requires_grad_(true);
  auto external = [&](const ir::Node& n, std::vector<c10::IValue>&) {
    return std::vector<c10::IValue>{n.kind == ir::NodeKind::kParameter ? w : x};
  };
  {
    at::NoGradGuard no_grad;
    auto out = interp->run(external);
    ASSERT_TRUE(out.ok()) << out.error().message();
    EXPECT_FALSE((*out)[0].toTensor().requires_grad());
  }
  auto out = interp->run(external);
  ASSERT_TRUE(out.ok()) << out.error().message();
  // The block's output comes from the segment's function, whose inputs are x and w only: the
  // graph between them holds no node of the block's ops.
  std::vector<torch::autograd::Node*> stack{(*out)[0].toTensor().grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  bool found = false;
  while (!stack.empty()) {
    torch::autograd::Node* fn = stack.back();
    stack.pop_back();
    if (!fn || !seen.insert(fn).second) continue;
    const std::string name = fn->name();
    EXPECT_EQ(name.find("Tanh"), std::string::npos) << name;
    EXPECT_EQ(name.find("Mm"), std::string::npos) << name;
    if (name.find("CheckpointFunction") != std::string::npos) {
      found = true;
      EXPECT_EQ(fn->next_edges().size(), 2u);  // x, w
      continue;
    }
    for (const auto& e : fn->next_edges()) stack.push_back(e.function.get());
  }
  EXPECT_TRUE(found);
}

void expectOneLineError(const Status& s, const std::string& needle) {
  ASSERT_FALSE(s.ok());
  const std::string m = s.error().message();
  EXPECT_NE(m.find(needle), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

Status createWith(std::vector<CheckpointSpec> segments) {
  auto interp = Interpreter::create(dropoutGraph(), {}, {}, {}, std::move(segments));
  if (!interp.ok()) return interp.error();
  return Status::success();
}

TEST(ActivationCheckpoint, BadSegmentsAreOneLineErrors) {
  expectOneLineError(createWith({{"block", 2, 9}}), "checkpoint segment 0 ('block', nodes 2..9)");
  expectOneLineError(createWith({{"a", 2, 3}, {"b", 3, 4}}), "checkpoint segment 1 ('b'");
  expectOneLineError(createWith({{"a", 3, 4}, {"b", 2, 2}}), "overlaps or precedes");
  expectOneLineError(createWith({{"a", 4, 2}}), "is not a node range");
  expectOneLineError(createWith({{"a", 1, 3}}), "not an op node");
  EXPECT_TRUE(createWith({{"a", 2, 3}, {"b", 4, 4}}).ok());
}

// --- ParallelModule ------------------------------------------------------------------------

const ModelCase& llamaTiny() {
  static const ModelCase m{"llama_tiny", {"tokens:i64[8,8]"}, 256, ""};
  return m;
}

/// A CNN of BatchNorm blocks in training mode (running statistics and num_batches_tracked
/// updated in place): checkpointed, its recomputation must not update them a second time.
const ModelCase& resnetBottleneck() {
  static const ModelCase m{"resnet_bottleneck", {"x:f64[4,3,32,32]"}, 0, ""};
  return m;
}

const ModelCase& modelCase(const std::string& name) {
  return name == "resnet_bottleneck" ? resnetBottleneck() : llamaTiny();
}

const Reference& reference(const std::string& model = "llama_tiny") {
  static std::map<std::string, Reference> refs;
  auto it = refs.find(model);
  if (it == refs.end())
    it = refs.emplace(model, testing::computeReference(modelCase(model), kSteps, kLr)).first;
  return it->second;
}

std::filesystem::path scratch(const std::string& name) {
  return testing::scratchDir("ackpt", name);
}

/// The modules "<prefix>.<i>" of the graph that checkpointRange accepts, in node order: the
/// repeated layers.
std::vector<std::string> repeatedLayers(const ir::Graph& g) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const ir::Node& n : g.nodes()) {
    const std::string& p = n.module_path;
    // "layers.3.attn" -> "layers.3"
    size_t dot = p.find('.');
    if (dot == std::string::npos) continue;
    size_t end = p.find('.', dot + 1);
    std::string m = p.substr(0, end);
    if (m.size() <= dot + 1 || !std::isdigit(static_cast<unsigned char>(m[dot + 1]))) continue;
    if (!seen.insert(m).second) continue;
    if (ir::checkpointRange(g, m)) out.push_back(m);
  }
  return out;
}

/// Re-lowers the plan `artifact`.plan.json with `modules` checkpointed into `out`. "" or an error.
std::string checkpointedArtifact(const std::string& artifact, const std::string& out,
                                 std::vector<std::string>* modules) {
  auto p = plan::readPlanFile(artifact + ".plan.json");
  if (!p.ok()) return p.error().message();
  Expected<ir::Graph> g = plan::plannedGraph(*p);
  if (!g.ok()) {
    frontend::ImportOptions options;
    for (const std::string& text : p->model.inputs) {
      auto s = frontend::parseInputSpec(text);
      if (!s.ok()) return s.error().message();
      options.inputs.push_back(*s);
    }
    g = frontend::importModel(p->model.model_path, options);
  }
  if (!g.ok()) return g.error().message();
  *modules = repeatedLayers(*g);
  if (modules->size() < 2) return "fewer than 2 checkpointable layers";
  p->checkpoint = *modules;
  auto programs = lower::lowerPlan(*g, *p);
  if (!programs.ok()) return programs.error().message();
  for (const proto::Program& prog : *programs)
    if (prog.checkpoints_size() != static_cast<int>(modules->size()))
      return "rank " + std::to_string(prog.rank()) + " has " +
             std::to_string(prog.checkpoints_size()) + " checkpoint segments";
  Status s = artifact::writeArtifact(out, *programs);
  return s.ok() ? "" : s.error().message();
}

/// The checkpoint segments' autograd functions in the graph behind `t`.
int checkpointFunctions(const at::Tensor& t) {
  std::vector<torch::autograd::Node*> stack{t.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    torch::autograd::Node* fn = stack.back();
    stack.pop_back();
    if (!fn || !seen.insert(fn).second) continue;
    if (fn->name().find("CheckpointFunction") != std::string::npos) ++count;
    for (const auto& e : fn->next_edges()) stack.push_back(e.function.get());
  }
  return count;
}

/// One rank: kSteps SGD steps against the reference; rank 0 writes its losses to `losses`. The
/// loss's graph holds `segments` checkpoint functions.
int trainRank(int rank, const std::string& dir, const std::string& losses, int segments,
              const ParallelModuleOptions& options, const std::string& model = "llama_tiny") {
  const Reference& ref = reference(model);
  testing::RankLog log(rank);
  std::shared_ptr<ParallelModule> pm = testing::loadRank(dir, ref.init, log, options);
  if (!pm) return 1;
  std::vector<at::Tensor> params = pm->parameters();
  std::ofstream out;
  if (rank == 0) out.open(losses);
  out.precision(17);
  for (int step = 0; step < kSteps; ++step) {
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    auto leaves = pm->forwardLeaves(testing::shardInputs(*pm, ref.inputs));
    if (!leaves.ok()) {
      log.fail("forward: " + leaves.error().message());
      return 1;
    }
    at::Tensor loss = testing::checkedStepLoss(*pm, *leaves, ref, step, kRtol, log);
    if (!loss.defined()) return 1;
    const double l = loss.item<double>();
    if (rank == 0) out << l << "\n";
    if (const int n = checkpointFunctions(loss); n != segments)
      log.fail("step " + std::to_string(step) + ": the loss's graph holds " + std::to_string(n) +
               " checkpoint functions, expected " + std::to_string(segments));
    loss.backward();
    if (step == 0) testing::expectGradsMatch(*pm, ref.grads, kRtol, log);
    at::NoGradGuard no_grad;
    for (at::Tensor& p : params)
      if (p.grad().defined()) p.sub_(p.grad() * ref.lr);
  }
  // The buffers after the steps (running statistics, num_batches_tracked): rank 0 writes each
  // one's sum.
  std::map<std::string, at::Tensor> state = pm->full_state_dict();
  if (rank == 0) {
    std::ofstream b(losses + ".buffers");
    b.precision(17);
    for (const PlacedTensor& spec : pm->bufferSpecs())
      if (state.count(spec.name))
        b << spec.name << " " << state.at(spec.name).to(at::kDouble).sum().item<double>() << "\n";
  }
  return log.exitCode();
}

std::vector<double> readLosses(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> v;
  double x = 0;
  while (in >> x) v.push_back(x);
  return v;
}

struct PlanCase {
  std::string mesh;      // "2", "2x2"
  std::string strategy;  // "" optimizer, else ddp | fsdp | tp | fsdp+tp
  bool overlap = true;  // ParallelModuleOptions::overlap (buckets, async reduce-scatters, prefetch)
  std::string model = "llama_tiny";
};

std::string planCaseName(const ::testing::TestParamInfo<PlanCase>& info) {
  return testing::paramName((info.param.model == "llama_tiny" ? "" : info.param.model + "_") +
                            info.param.mesh + "_" +
                            (info.param.strategy.empty() ? "opt" : info.param.strategy) +
                            (info.param.overlap ? "" : "_sync"));
}

std::map<std::string, double> readBuffers(const std::string& path) {
  std::ifstream in(path);
  std::map<std::string, double> out;
  std::string name;
  double sum = 0;
  while (in >> name >> sum) out[name] = sum;
  return out;
}

class ActivationCheckpointPlans : public ::testing::TestWithParam<PlanCase> {};

TEST_P(ActivationCheckpointPlans, CheckpointedLayersTrainAsTheSingleProcessModel) {
  const PlanCase& c = GetParam();
  const ModelCase& m = modelCase(c.model);
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  const std::string name = planCaseName(::testing::TestParamInfo<PlanCase>(c, 0));
  const std::string plain = scratch(name + "_plain").string();
  const std::string ckpt = scratch(name + "_ckpt").string();
  std::string err = testing::makeArtifact(m, c.mesh, c.strategy, plain);
  ASSERT_TRUE(err.empty()) << err;
  std::vector<std::string> modules;
  err = checkpointedArtifact(plain, ckpt, &modules);
  ASSERT_TRUE(err.empty()) << err;
  (void)reference(c.model);  // computed once, before forking
  ParallelModuleOptions options;
  options.overlap = c.overlap;
  const int world = testing::worldOf(c.mesh);
  const std::string plain_losses = plain + ".losses", ckpt_losses = ckpt + ".losses";
  for (const auto& f : testing::runRanks(world, [&](int rank) {
         return trainRank(rank, plain, plain_losses, 0, options, c.model);
       }))
    ADD_FAILURE() << "without checkpointing: " << f;
  const int segments = static_cast<int>(modules.size());
  for (const auto& f : testing::runRanks(world, [&](int rank) {
         return trainRank(rank, ckpt, ckpt_losses, segments, options, c.model);
       }))
    ADD_FAILURE() << "checkpointed " << ::testing::PrintToString(modules) << ": " << f;
  const std::vector<double> a = readLosses(plain_losses), b = readLosses(ckpt_losses);
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(a[s], b[s], kRtol * reference(c.model).loss_scales[static_cast<size_t>(s)] + 1e-12)
        << "step " << s;
  // The buffers equal those of the run without checkpointing: updated once per step.
  const auto buffers_plain = readBuffers(plain_losses + ".buffers"),
             buffers_ckpt = readBuffers(ckpt_losses + ".buffers");
  EXPECT_EQ(buffers_plain.size(), buffers_ckpt.size());
  for (const auto& [name, sum] : buffers_plain) {
    ASSERT_TRUE(buffers_ckpt.count(name)) << name;
    EXPECT_NEAR(buffers_ckpt.at(name), sum, 1e-9 * (1 + std::abs(sum))) << name;
  }
  if (c.model == "resnet_bottleneck") {
    EXPECT_GT(buffers_plain.size(), 10u);
  }
  std::filesystem::remove_all(plain);
  std::filesystem::remove_all(ckpt);
  for (const std::string& f : {plain_losses, ckpt_losses}) {
    std::filesystem::remove(f);
    std::filesystem::remove(f + ".buffers");
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaTiny, ActivationCheckpointPlans,
                         ::testing::Values(PlanCase{"2", "ddp"}, PlanCase{"2", "fsdp"},
                                           PlanCase{"2", "tp"}, PlanCase{"2", "fsdp", false},
                                           PlanCase{"2x2", "fsdp+tp"}, PlanCase{"2x2", ""}),
                         planCaseName);
INSTANTIATE_TEST_SUITE_P(ResNetBatchNorm, ActivationCheckpointPlans,
                         ::testing::Values(PlanCase{"2", "ddp", true, "resnet_bottleneck"},
                                           PlanCase{"2", "", true, "resnet_bottleneck"}),
                         planCaseName);

// A BatchNorm the optimizer's plan shards by channel (input S(1)) writes its running statistics
// where it reads them. Before, a replicated buffer was sliced locally (R -> S(0), no collective)
// and each rank updated its own channels of its replica: the replicas diverged and the gathered
// state (rank 0's replica) held stale statistics for half of the channels, silently. Now the
// buffers are placed as their writer reads them, and every plan's buffers after training equal
// ddp's (the batch statistics all-reduced: the single-device ones).
TEST(BatchNormState, EveryPlanUpdatesTheRunningStatisticsAsDdpDoes) {
  const ModelCase& m = resnetBottleneck();
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  (void)reference(m.model);  // computed once, before forking
  std::map<std::string, std::map<std::string, double>> buffers;
  for (const std::string strategy : {"ddp", "", "fsdp"}) {
    const std::string dir = scratch("bn_state_" + (strategy.empty() ? "opt" : strategy)).string();
    std::string err = testing::makeArtifact(m, "2", strategy, dir);
    ASSERT_TRUE(err.empty()) << err;
    const std::string losses = dir + ".losses";
    for (const auto& f : testing::runRanks(2, [&](int rank) {
           return trainRank(rank, dir, losses, 0, ParallelModuleOptions{}, m.model);
         }))
      ADD_FAILURE() << (strategy.empty() ? "opt" : strategy) << ": " << f;
    buffers[strategy] = readBuffers(losses + ".buffers");
    std::filesystem::remove_all(dir);
    std::filesystem::remove(losses);
    std::filesystem::remove(losses + ".buffers");
  }
  const auto& ddp = buffers.at("ddp");
  ASSERT_GT(ddp.size(), 10u);
  for (const auto& [strategy, b] : buffers) {
    EXPECT_EQ(b.size(), ddp.size()) << strategy;
    for (const auto& [name, sum] : ddp) {
      ASSERT_TRUE(b.count(name)) << strategy << ": " << name;
      // Within the differential tests' tolerance: plans sum the statistics in other orders.
      EXPECT_NEAR(b.at(name), sum, kRtol * (1 + std::abs(sum))) << strategy << ": " << name;
    }
  }
}

/// One rank of BatchNormState.MixedPrecisionUpdatesTheStoredRunningStatistics: three training
/// forwards of the bf16 ddp plan; then this rank's running statistics (the whole batch's: the
/// plan all-reduces a BatchNorm's batch statistics) against those of the TorchScript module cast
/// whole to bf16 (`module.to(bf16)`, from the same initial state) after three training forwards
/// of the batch. (With f32 plans and an f64 module the same comparison is exact.)
int mixedBufferRank(int rank, const std::string& dir) {
  const Reference& ref = reference("resnet_bottleneck");
  testing::RankLog log(rank);
  std::shared_ptr<ParallelModule> pm = testing::loadRank(dir, ref.init, log);
  if (!pm) return 1;
  const std::vector<c10::IValue> local = testing::shardInputs(*pm, ref.inputs);
  for (int step = 0; step < 3; ++step) {
    auto leaves = pm->forwardLeaves(local);
    if (!leaves.ok()) {
      log.fail("forward: " + leaves.error().message());
      return 1;
    }
  }
  torch::jit::Module module = torch::jit::load(testing::samplePath("resnet_bottleneck"));
  {
    at::NoGradGuard no_grad;
    for (const auto& t : module.named_parameters())
      if (ref.init.count(t.name)) t.value.copy_(ref.init.at(t.name));
    for (const auto& t : module.named_buffers())
      if (ref.init.count(t.name)) t.value.copy_(ref.init.at(t.name));
    module.to(at::kBFloat16);
    module.train();
    for (int step = 0; step < 3; ++step) module.forward({ref.inputs.at(0).to(at::kBFloat16)});
  }
  std::map<std::string, at::Tensor> mine;
  for (const auto& [name, t] : pm->state_dict()) mine[name] = t;  // ddp: whole buffers
  // Two bf16 computations of the same statistics, rounded in other orders (the program sums the
  // ranks' moments): per statistic, this rank's update is about the module's, and over all of
  // them the distance is a fraction of the updates (0.23 on this project's machines). A
  // statistic that is not written back has not moved at all: the distance is all of the update.
  int checked = 0;
  double off2 = 0, moved2 = 0;
  for (const auto& t : module.named_buffers()) {
    if (t.name.find("running_") == std::string::npos) continue;
    if (!mine.count(t.name)) {
      log.fail("no buffer " + t.name);
      continue;
    }
    const at::Tensor init = ref.init.at(t.name).to(at::kDouble);
    const at::Tensor want = t.value.to(at::kDouble) - init;
    const at::Tensor got = mine.at(t.name).to(at::kDouble) - init;
    const double moved = want.norm().item<double>(), mine_moved = got.norm().item<double>();
    if (!(moved > 0) || !(mine_moved > 0.25 * moved))
      log.fail(t.name + ": updated by " + std::to_string(mine_moved) + ", the bf16 module's by " +
               std::to_string(moved));
    off2 += (got - want).pow(2).sum().item<double>();
    moved2 += moved * moved;
    ++checked;
  }
  const double off = std::sqrt(off2 / std::max(moved2, 1e-300));
  std::fprintf(stderr,
               "rank %d: %d running statistics, %.3f of their updates from the bf16 module's\n",
               rank, checked, off);
  if (!(off < 0.5))
    log.fail("the running statistics are " + std::to_string(off) +
             " of their updates from the bf16 module's");
  if (checked < 10) log.fail("checked " + std::to_string(checked) + " running statistics");
  return log.exitCode();
}

// Mixed precision (bf16 parameters; buffers computed in bf16 too, stored in the model's dtype):
// a BatchNorm in training mode updates its running statistics in place, on lowering's cast of
// the buffer to bf16, a copy. The stored buffers never moved (until 2026-12-06: every BatchNorm
// model planned with a mixed_precision spec kept its initial statistics, silently, through
// training and into its checkpoints). Now the runtime writes a written copy back after the
// forward: after three training forwards, each rank's running statistics under a bf16 ddp plan of
// resnet_bottleneck are those of the module cast to bf16 (within bf16's rounding).
TEST(BatchNormState, MixedPrecisionUpdatesTheStoredRunningStatistics) {
  const ModelCase& m = resnetBottleneck();
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  (void)reference(m.model);  // computed once, before forking
  const std::string spec = scratch("bn_mixed.spec.json").string();
  {
    std::ofstream out(spec);
    out << R"({"mesh": {"shape": [2]}, )"
           R"("mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "f32"}})";
  }
  const std::string dir = scratch("bn_mixed").string();
  std::string err = testing::makeArtifact(m, "2", "ddp", dir, "--spec " + spec);
  ASSERT_TRUE(err.empty()) << err;
  for (const auto& f : testing::runRanks(2, [&](int rank) { return mixedBufferRank(rank, dir); }))
    ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(spec);
}

/// Live bytes after forward and the peak over one step, on rank 0, written to `out`.
int memoryRank(int rank, const std::string& dir, const std::vector<at::Tensor>& inputs,
               const std::map<std::string, at::Tensor>& init, const std::string& out) {
  useCachingHostAllocator();
  testing::RankLog log(rank);
  std::shared_ptr<ParallelModule> pm = testing::loadRank(dir, init, log);
  if (!pm) return 1;
  int64_t after_forward = 0, peak = 0;
  for (int step = 0; step < 2; ++step) {  // the second step is measured
    for (at::Tensor p : pm->parameters()) p.mutable_grad() = at::Tensor();
    std::vector<c10::IValue> local = testing::shardInputs(*pm, inputs);
    releaseCachedHostMemory();
    resetHostAllocatorPeak();
    auto leaves = pm->forwardLeaves(local);
    if (!leaves.ok()) {
      log.fail("forward: " + leaves.error().message());
      return 1;
    }
    after_forward = hostAllocatorStats().allocated_bytes;
    at::Tensor loss;
    for (const c10::IValue& v : *leaves) {
      at::Tensor l = v.toTensor().to(at::kFloat).pow(2).mean();
      loss = loss.defined() ? loss + l : l;
    }
    loss.backward();
    peak = hostAllocatorStats().peak_allocated_bytes;
  }
  if (rank == 0) {
    std::ofstream f(out);
    f << after_forward << " " << peak << "\n";
  }
  return log.exitCode();
}

TEST(ActivationCheckpointMemory, CheckpointedLayersHoldLessAfterForwardAndPeakLower) {
  // A long sequence and a large batch: activations dominate llama_tiny's parameters.
  ModelCase m{"llama_tiny", {"tokens:i64[16,128]"}, 256, ""};
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  const std::string plain = scratch("mem_plain").string();
  const std::string ckpt = scratch("mem_ckpt").string();
  std::string err = testing::makeArtifact(m, "2", "ddp", plain);
  ASSERT_TRUE(err.empty()) << err;
  std::vector<std::string> modules;
  err = checkpointedArtifact(plain, ckpt, &modules);
  ASSERT_TRUE(err.empty()) << err;
  const Reference ref = testing::computeReference(m, 0, 0.0);
  auto measure = [&](const std::string& dir) -> std::pair<int64_t, int64_t> {
    const std::string out = dir + ".mem";
    for (const auto& f : testing::runRanks(
             2, [&](int rank) { return memoryRank(rank, dir, ref.inputs, ref.init, out); }))
      ADD_FAILURE() << dir << ": " << f;
    std::ifstream in(out);
    int64_t a = -1, b = -1;
    in >> a >> b;
    return {a, b};
  };
  const auto [plain_live, plain_peak] = measure(plain);
  const auto [ckpt_live, ckpt_peak] = measure(ckpt);
  ASSERT_GT(plain_live, 0);
  ASSERT_GT(ckpt_live, 0);
  EXPECT_LT(ckpt_live, plain_live) << "live bytes after forward";
  EXPECT_LT(ckpt_peak, plain_peak) << "peak bytes over the step";
  std::cerr << "after forward: " << plain_live << " -> " << ckpt_live << " bytes; step peak "
            << plain_peak << " -> " << ckpt_peak << " bytes\n";
  std::filesystem::remove_all(plain);
  std::filesystem::remove_all(ckpt);
  std::filesystem::remove(plain + ".mem");
  std::filesystem::remove(ckpt + ".mem");
}

/// The losses apc-train prints on rank 0 for `steps` SGD steps of artifact `dir` on 2 ranks, or
/// the run's error output.
std::vector<std::string> trainedLosses(const std::string& dir, int steps, std::string* err) {
  apc::testing::CommandResult r = apc::testing::runCommand(
      testing::apcBinary() + " run " + dir + " --nproc 2 --timeout 300 -- " +
      std::string(APC_BINARY_DIR) + "/tools/apc-train " + dir + " --steps " +
      std::to_string(steps) + " --lr 0.1 --threads 1");
  std::vector<std::string> losses;
  if (r.code != 0) {
    *err = r.err;
    return losses;
  }
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0) losses.push_back(line);
  return losses;
}

// Mixed precision (bf16 parameters, f32 reductions) with every repeated layer checkpointed:
// lowering failed on every model ("cannot be recomputed in this rank's program"), because its
// casts of the parameters to bf16 carried their layers' module paths and sat among the leaves at
// the top of the program, so no layer was one contiguous range of ops; a TorchScript BatchNorm's
// buffer cast inside its layer was outside every module. Now the checkpointed plans train to the
// same losses, digit for digit, as the plans without checkpointing (ddp and fsdp, a decoder and a
// BatchNorm CNN).
TEST(ActivationCheckpoint, MixedPrecisionLayersCheckpointAndTrainAsWithout) {
  const std::string spec = scratch("mixed.spec.json").string();
  {
    std::ofstream out(spec);
    out << R"({"mesh": {"shape": [2]}, )"
           R"("mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "f32"}})";
  }
  for (const ModelCase* m : {&llamaTiny(), &resnetBottleneck()}) {
    if (!std::filesystem::exists(testing::samplePath(m->model)))
      GTEST_SKIP() << "run sample_models/generate.py";
    for (const std::string strategy : {"ddp", "fsdp"}) {
      std::map<std::string, std::vector<std::string>> losses;
      for (const std::string checkpoint : {"none", "all"}) {
        const std::string dir = scratch("mixed_" + m->model + "_" + strategy + "_" + checkpoint);
        std::string err = testing::makeArtifact(*m, "2", strategy, dir,
                                                "--spec " + spec + " --checkpoint " + checkpoint);
        ASSERT_TRUE(err.empty()) << m->model << " " << strategy << " " << checkpoint << ": " << err;
        auto prog = artifact::readProgram(dir, 0);
        ASSERT_TRUE(prog.ok()) << prog.error().message();
        EXPECT_EQ(prog->checkpoints_size() > 0, checkpoint == "all") << m->model;
        losses[checkpoint] = trainedLosses(dir, 3, &err);
        EXPECT_EQ(losses[checkpoint].size(), 3u)
            << m->model << " " << strategy << " " << checkpoint << ": " << err;
        std::filesystem::remove_all(dir);
      }
      EXPECT_EQ(losses["all"], losses["none"]) << m->model << " " << strategy;
    }
  }
  std::filesystem::remove(spec);
}

/// An artifact whose program holds `segment` (appended to its checkpoints) on every rank.
std::string artifactWithSegment(const std::string& from, const std::string& to,
                                const std::vector<std::pair<uint32_t, uint32_t>>& segments) {
  std::vector<proto::Program> programs;
  for (int64_t r = 0; r < 2; ++r) {
    auto prog = artifact::readProgram(from, r);
    if (!prog.ok()) return prog.error().message();
    for (const auto& [first, last] : segments) {
      proto::CheckpointSegment* c = prog->add_checkpoints();
      c->set_module("layers.x");
      c->set_first(first);
      c->set_last(last);
    }
    programs.push_back(std::move(prog).value());
  }
  Status s = artifact::writeArtifact(to, programs);
  return s.ok() ? "" : s.error().message();
}

TEST(ActivationCheckpointErrors, BadSegmentsInAnArtifactAreOneLineLoadErrors) {
  const ModelCase& m = llamaTiny();
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  const std::string plain = scratch("bad_plain").string();
  std::string err = testing::makeArtifact(m, "2", "ddp", plain);
  ASSERT_TRUE(err.empty()) << err;
  auto prog = artifact::readProgram(plain, 0);
  ASSERT_TRUE(prog.ok()) << prog.error().message();
  const auto nodes = static_cast<uint32_t>(prog->graph().nodes_size());
  // The first aten op node (after inputs and parameters).
  uint32_t first_op = 0;
  while (first_op < nodes &&
         prog->graph().nodes(static_cast<int>(first_op)).op().rfind("aten::", 0) != 0)
    ++first_op;
  ASSERT_LT(first_op + 6, nodes);
  struct Bad {
    std::vector<std::pair<uint32_t, uint32_t>> segments;
    std::string needle;
  };
  const std::vector<Bad> cases = {
      {{{first_op, nodes + 3}}, "is not a node range"},
      {{{first_op, first_op + 4}, {first_op + 2, first_op + 6}}, "overlaps"},
      {{{0, first_op}}, "not an op node"},
  };
  LaunchEnv env;
  env.rank = 0;
  env.world_size = 2;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string dir = scratch("bad_" + std::to_string(i)).string();
    err = artifactWithSegment(plain, dir, cases[i].segments);
    ASSERT_TRUE(err.empty()) << err;
    auto pm = ParallelModule::load(dir, env, ParallelModuleOptions{});
    ASSERT_FALSE(pm.ok()) << "case " << i;
    const std::string msg = pm.error().message();
    EXPECT_NE(msg.find("checkpoint segment"), std::string::npos) << msg;
    EXPECT_NE(msg.find(cases[i].needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(plain);
}

}  // namespace
}  // namespace apc::runtime::activation_checkpoint_test
