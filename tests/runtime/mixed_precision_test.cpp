//===- tests/runtime/mixed_precision_test.cpp - bf16 params, f32 reduce ----===//
//
// Mixed precision at run time (issue 5): a sample model planned with the spec
//   {"mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "f32"}}
// (the optimizer's plan and the fsdp baseline, on [2,2] and [4]) is lowered by the `apc` binary
// and run on forked ranks over Gloo. Its parameters are stored in f32 and cast to bf16 before any
// redistribute, the inputs and buffers too; outputs are cast back to f32; backward reductions of
// parameters' gradients run in f32 (activations' gradients are reduced in bf16). It is compared
// with a single-process reference that applies the same casts:
//   - the TorchScript module is cast whole to bf16 (parameters and floating buffers), its
//     parameters set to require grad; the f32 inputs (same seed as the differential test) are cast
//     to bf16; the forward runs entirely in bf16 (LibTorch's CPU kernels; matmuls accumulate in
//     f32 internally and round the result to bf16); every output leaf is cast back to f32;
//   - the loss is the differential test's, sum_i mean(out_i * w_i), in f32 on those f32 outputs;
//     its backward runs through the casts, so the model's backward runs in bf16 and each parameter
//     gradient is the bf16 gradient of the bf16 computation, read back as f32 (what the
//     runtime's `aten::to` node gives its f32 storage: autograd casts the bf16 gradient up).
// Checked on every rank, for mlp_stack and toy_block, optimizer plan and fsdp, on [2,2] and [4]
// (llama_tiny, gpt2_tiny: [2,2]):
//   - every forward output leaf gathered to full is f32 and within kRtol * max |expected| of the
//     reference's, and NOT within 1e-4 of the f32 model's (so the bf16 casts really ran);
//   - every parameter gradient gathered to full (f32, the storage dtype) is within
//     max(kRtol * max|expected|, 2 * max|bf16 ref - f32 ref|, 2^-9 * the model's largest
//     gradient entry): half a bf16 ulp of the largest gradient bounds a tiny one (a LayerNorm
//     bias behind bf16 attention) that bf16 cannot resolve.
//
// Tolerance. bf16 keeps 8 significant bits (one ulp ~ 4e-3 relative). The sharded and single
// programs round at different points: a Partial sum is rounded to bf16 per rank and again after
// the all-reduce, parameters' gradients are reduced in f32 instead of bf16, sliced matmuls round
// shorter dot products. Each rounding is <= 1 ulp; through the few layers of these models that
// stays within a few ulps of the largest entry: kRtol = 2e-2 (~5 ulps), while a wrong shard is
// O(1). Some gradients are ill-conditioned in bf16 (mlp_stack's up.weight after LayerNorm: the bf16
// reference itself is ~40% of max away from the f32 gradient), where rounding order alone moves the
// result by that much; there the bound is twice the reference's own bf16 error (still far below
// O(1)).
//
// llama_tiny and gpt2_tiny run on [2,2] (optimizer plan and fsdp). llama_tiny's rope tables are
// f32 buffers: the program casts floating buffers to param_dtype like parameters (as module.to
// does in the reference); its f32 causal mask (torch.full without a dtype) and the `.float()`
// softmax stay f32 in both, as the model's code asks.
//
// MixedPrecisionComm: the bytes each collective moves, against what the program prices, with and
// without the policy on one plan (see there).
//
//===----------------------------------------------------------------------===//
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "../common/run_command.h"
#include "apc/plan/plan.h"
#include "apc/runtime/output_leaves.h"
#include "apc/runtime/parallel_module.h"
#include "rank_harness.h"

// A namespace of its own: the files of runtime_test are compiled together (unity build).
namespace apc::runtime::mixed_precision_test {
namespace {

using testing::ModelCase;
using testing::Reference;

constexpr double kRtol = 2e-2;

const std::map<std::string, ModelCase>& models() {
  static const std::map<std::string, ModelCase> m = {
      {"toy_block", {"toy_block", {"x:f32[8,2,1024]"}, 0, ""}},
      {"mlp_stack", {"mlp_stack", {"x:f32[8,4,128]"}, 0, ""}},
      {"llama_tiny", {"llama_tiny", {"tokens:i64[8,8]"}, 256, ""}},
      {"gpt2_tiny", {"gpt2_tiny", {"idx:i64[8,8]"}, 50257, ""}},
  };
  return m;
}

/// The reference with the runtime's casts (see the file comment); `f32` keeps the plain one
/// (the harness's) to show that the casts change the result.
struct MpReference {
  Reference f32;                            // inputs, init, loss weights, f32 outputs
  std::vector<at::Tensor> outputs;          // bf16 computation, cast to f32
  std::map<std::string, at::Tensor> grads;  // f32
};

/// `key`: a key of models().
const MpReference& referenceFor(const std::string& key) {
  static std::map<std::string, MpReference> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  MpReference r;
  r.f32 = testing::computeReference(models().at(key), 1, 0.0);
  torch::jit::Module module = torch::jit::load(testing::samplePath(models().at(key).model));
  module.to(at::kBFloat16);
  for (const auto& p : module.parameters()) p.set_requires_grad(true);
  std::vector<c10::IValue> args;
  for (const at::Tensor& in : r.f32.inputs)
    args.emplace_back(at::isFloatingType(in.scalar_type()) ? in.to(at::kBFloat16) : in);
  std::vector<at::Tensor> outs;
  for (const at::Tensor& o : outputLeaves(module.forward(args))) outs.push_back(o.to(at::kFloat));
  testing::lossOf(outs, r.f32.loss_weights).backward();
  for (const at::Tensor& o : outs) r.outputs.push_back(o.detach().clone());
  for (const auto& p : module.named_parameters())
    r.grads[p.name] = p.value.grad().defined() ? p.value.grad().to(at::kFloat)
                                               : at::zeros(p.value.sizes(), at::kFloat);
  return cache.emplace(key, std::move(r)).first->second;
}

std::filesystem::path scratchDir(const std::string& name) {
  return testing::scratchDir("mp", name);
}

/// `apc plan --artifact` with a spec file carrying the mesh, (when `mixed`) the policy, and `pins`
/// (a JSON list of the spec's pins, or empty).
std::string makeArtifact(const ModelCase& c, const std::vector<int>& mesh,
                         const std::string& strategy, bool mixed, const std::string& dir,
                         const std::string& pins = "") {
  std::string shape;
  for (int d : mesh) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  const std::string spec = dir + ".spec.json";
  {
    std::ofstream s(spec);
    s << "{\"mesh\": {\"shape\": [" << shape << "]}";
    if (mixed) s << ", \"mixed_precision\": {\"param_dtype\": \"bf16\", \"reduce_dtype\": \"f32\"}";
    if (!pins.empty()) s << ", \"pins\": " << pins;
    s << "}\n";
  }
  std::string cmd =
      testing::apcBinary() + " plan " + testing::samplePath(c.model) + " --spec " + spec;
  for (const std::string& in : c.inputs) cmd += " --input '" + in + "'";
  if (!strategy.empty()) cmd += " --strategy " + strategy;
  cmd += " -o " + dir + ".plan.json --artifact " + dir;
  apc::testing::CommandResult r = apc::testing::runCommand(cmd);
  if (r.code != 0) return cmd + ": exit " + std::to_string(r.code) + ": " + r.err;
  return "";
}

/// One rank: one forward + backward; compares with `ref` when `compare`. With `bytes_file`, every
/// rank checks that its communicators moved, forward and backward (the test's own output gathers
/// excluded), exactly the bytes the program prices (ParallelModule::pricedComm: each step's n in
/// the dtype it moves, by the ring formulas), and rank 0 writes "forward backward" to the file.
int runRank(int rank, const std::string& dir, const MpReference& ref, bool compare,
            const std::string& bytes_file) {
  testing::RankLog log(rank);
  std::shared_ptr<ParallelModule> loaded = testing::loadRank(dir, ref.f32.init, log);
  if (!loaded) return 1;
  ParallelModule& pm = *loaded;
  auto fail = [&](const std::string& what) { log.fail(what); };
  std::vector<c10::IValue> inputs = testing::shardInputs(pm, ref.f32.inputs);
  pm.resetCommStats();
  auto leaves = pm.forwardLeaves(inputs);
  const CommStats fwd = pm.commStats();
  if (!leaves.ok()) {
    fail("forward: " + leaves.error().message());
    return 1;
  }
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < leaves->size(); ++i)
    outs.push_back(pm.gatherOutput(i, (*leaves)[i].toTensor()));
  const CommStats gathered = pm.commStats();
  if (outs.size() != ref.outputs.size()) {
    fail("the program has " + std::to_string(outs.size()) + " output leaves, the model " +
         std::to_string(ref.outputs.size()));
    return 1;
  }
  if (compare)
    for (size_t i = 0; i < outs.size(); ++i) {
      if (outs[i].scalar_type() != at::kFloat)
        fail("output " + std::to_string(i) + " is " +
             std::string(c10::toString(outs[i].scalar_type())) + ", not cast back to f32");
      std::string d = testing::compareTensors(outs[i].detach(), ref.outputs[i], kRtol);
      if (!d.empty()) fail("output " + std::to_string(i) + " vs bf16 reference: " + d);
      if (testing::compareTensors(outs[i].detach(), ref.f32.outputs[i], 1e-4).empty())
        fail("output " + std::to_string(i) + " is within 1e-4 of the f32 model: no bf16 compute");
    }
  testing::lossOf(outs, ref.f32.loss_weights).backward();
  const CommStats all = pm.commStats();
  if (!bytes_file.empty()) {
    const int64_t bwd = all.bytes_sent - gathered.bytes_sent;
    const PricedComm priced = pm.pricedComm();
    if (fwd.bytes_sent != priced.forward_wire_bytes)
      fail("forward moved " + std::to_string(fwd.bytes_sent) + " bytes, the program prices " +
           std::to_string(priced.forward_wire_bytes));
    if (bwd != priced.backward_wire_bytes)
      fail("backward moved " + std::to_string(bwd) + " bytes, the program prices " +
           std::to_string(priced.backward_wire_bytes));
    if (rank == 0) {
      std::ofstream b(bytes_file);
      b << fwd.bytes_sent << " " << bwd << "\n";
    }
  }
  if (compare)
    for (size_t i = 0; i < pm.parameterSpecs().size(); ++i) {
      const std::string& name = pm.parameterSpecs()[i].name;
      at::Tensor full = pm.fullGrad(i);
      auto it = ref.grads.find(name);
      if (it == ref.grads.end()) {
        fail("parameter " + name + " is not in the model");
        continue;
      }
      if (full.scalar_type() != at::kFloat)
        fail("grad " + name + " is " + std::string(c10::toString(full.scalar_type())));
      const double scale = it->second.abs().max().item<double>();
      const double noise =
          (it->second - ref.f32.grads.at(name)).abs().max().item<double>();  // bf16 vs exact
      // A gradient far below the model's largest (gpt2_tiny's last ln_1: 1.7e-5 behind bf16
      // attention) is under bf16's resolution of the backward that made it: it may also be off
      // by half a bf16 ulp of the largest gradient of the model.
      double model_scale = 0;
      for (const auto& [other, g] : ref.grads)
        model_scale = std::max(model_scale, g.abs().max().item<double>());
      const double bound = std::max({kRtol * scale, 2 * noise, model_scale / 512});
      const double rtol = scale > 0 ? bound / scale : kRtol;
      std::string d = testing::compareTensors(full, it->second, rtol);
      if (!d.empty())
        fail("grad " + name + ": " + d + " (bf16 noise " + std::to_string(noise) +
             ", model's largest gradient " + std::to_string(model_scale) + ")");
    }
  return log.exitCode();
}

std::pair<double, double> readBytes(const std::string& file) {
  std::ifstream in(file);
  double f = -1, b = -1;
  in >> f >> b;
  return {f, b};
}

struct MpCase {
  std::string model;
  std::vector<int> mesh;
  std::string strategy;  // "" optimizer, or fsdp
};

std::string caseName(const MpCase& c) {
  std::string s = c.model + "_";
  for (size_t i = 0; i < c.mesh.size(); ++i) s += (i ? "x" : "") + std::to_string(c.mesh[i]);
  return s + "_" + (c.strategy.empty() ? "opt" : c.strategy);
}

class MixedPrecision : public ::testing::TestWithParam<MpCase> {};

TEST_P(MixedPrecision, MatchesSingleProcessWithTheSameCasts) {
  const MpCase& c = GetParam();
  const ModelCase& m = models().at(c.model);
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  int world = 1;
  for (int d : c.mesh) world *= d;
  std::filesystem::path dir = scratchDir(caseName(c));
  std::string err = makeArtifact(m, c.mesh, c.strategy, true, dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const MpReference& ref = referenceFor(c.model);
  std::vector<std::string> failed = testing::runRanks(
      world, [&](int rank) { return runRank(rank, dir.string(), ref, true, ""); });
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
}

std::vector<MpCase> mpCases() {
  std::vector<MpCase> cases;
  for (const char* model : {"mlp_stack", "toy_block"})
    for (const std::vector<int>& mesh : {std::vector<int>{2, 2}, std::vector<int>{4}})
      for (const char* strategy : {"", "fsdp"}) cases.push_back({model, mesh, strategy});
  for (const char* model : {"llama_tiny", "gpt2_tiny"})
    for (const char* strategy : {"", "fsdp"}) cases.push_back({model, {2, 2}, strategy});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Samples, MixedPrecision, ::testing::ValuesIn(mpCases()),
                         [](const ::testing::TestParamInfo<MpCase>& info) {
                           return caseName(info.param);
                         });

// The bytes one plan moves with and without the policy. `apc plan` makes the mixed-precision
// plan and its artifact; the same plan with the policy removed from its spec is lowered again by
// `apc lower` (the same redistributions in f32). On every rank the bytes measured equal the bytes
// priced (see runRank), and between the two programs (rank 0):
//   - forward: every step moves param_dtype instead of f32: exactly half the bytes (the
//     parameters' all-gathers, and the activations', all in bf16);
//   - backward: a parameter's gradient is reduced in reduce_dtype (f32: the same bytes as the
//     f32 program), everything else moves bf16 (half): so f32/2 <= mixed <= f32, and mixed equals
//     f32 when the backward communicates only to reduce parameters' gradients (ddp).
struct CommCase {
  std::string strategy;
  bool only_param_reductions;  // the plan's backward communicates only parameters' gradients
};

class MixedPrecisionComm : public ::testing::TestWithParam<CommCase> {};

TEST_P(MixedPrecisionComm, MovesThePricedBytesInParamAndReduceDtypes) {
  const CommCase& cc = GetParam();
  const ModelCase& m = models().at("mlp_stack");
  if (!std::filesystem::exists(testing::samplePath(m.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  const MpReference& ref = referenceFor("mlp_stack");
  const std::filesystem::path mixed_dir = scratchDir("comm_mixed_" + cc.strategy);
  const std::filesystem::path f32_dir = scratchDir("comm_f32_" + cc.strategy);
  // Every layer norm and linear output pinned batch-sharded (S(0) on both mesh dims): at batch 8
  // the planner would rather gather the batch and compute replicated (no gradient to reduce).
  std::string pins;
  for (int b = 0; b < 4; ++b)
    for (const char* mod : {"ln", "up", "down"})
      pins += std::string(pins.empty() ? "[" : ", ") + "{\"module\": \"blocks." +
              std::to_string(b) + "." + mod + "\", \"placements\": [\"S(0)\", \"S(0)\"]}";
  pins += "]";
  std::string err = makeArtifact(m, {2, 2}, cc.strategy, true, mixed_dir.string(), pins);
  ASSERT_TRUE(err.empty()) << err;
  {
    // The same plan without mixed precision: an edited plan, so it is hashed again (the readers
    // refuse a plan whose content does not hash to its content_hash).
    auto plan = plan::readPlanFile(mixed_dir.string() + ".plan.json");
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    ASSERT_TRUE(plan->spec.mixed_precision.param_dtype);
    plan->spec.mixed_precision = {};
    plan->content_hash = plan::planContentHash(*plan);
    Status written = plan::writePlanFile(*plan, f32_dir.string() + ".plan.json");
    ASSERT_TRUE(written.ok()) << written.error().message();
  }
  apc::testing::CommandResult r =
      apc::testing::runCommand(testing::apcBinary() + " lower " + f32_dir.string() + ".plan.json " +
                               testing::samplePath(m.model) + " -o " + f32_dir.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::pair<double, double> bytes[2];
  for (int mixed = 0; mixed < 2; ++mixed) {
    const std::string dir = (mixed ? mixed_dir : f32_dir).string();
    const std::string file = dir + ".bytes";
    std::vector<std::string> failed =
        testing::runRanks(4, [&](int rank) { return runRank(rank, dir, ref, false, file); });
    for (const std::string& f : failed) ADD_FAILURE() << f;
    bytes[mixed] = readBytes(file);
  }
  for (const std::filesystem::path& d : {mixed_dir, f32_dir}) {
    std::filesystem::remove_all(d);
    for (const char* ext : {".spec.json", ".plan.json", ".bytes"})
      std::filesystem::remove(d.string() + ext);
  }
  auto [fwd_32, bwd_32] = bytes[0];
  auto [fwd_mp, bwd_mp] = bytes[1];
  std::printf("%s: forward %.0f bytes (bf16 params) vs %.0f (f32), backward %.0f vs %.0f\n",
              cc.strategy.c_str(), fwd_mp, fwd_32, bwd_mp, bwd_32);
  ASSERT_GT(fwd_32 + bwd_32, 0) << "the plan moves nothing";
  EXPECT_EQ(2 * fwd_mp, fwd_32) << "forward bytes " << fwd_mp << " (bf16) vs " << fwd_32;
  EXPECT_GE(bwd_mp, bwd_32 / 2);
  EXPECT_LE(bwd_mp, bwd_32);
  if (cc.only_param_reductions) {
    EXPECT_GT(bwd_32, 0) << "no gradient reduced";
    // Parameters' gradients are reduced in f32 in both programs; what backward saves under
    // mixed precision is the re-gathers of sharded parameters (reshard after forward), which move
    // param_dtype like the forward's gathers.
    EXPECT_EQ(bwd_32 - bwd_mp, fwd_32 - fwd_mp)
        << "backward " << bwd_mp << " (bf16 params) vs " << bwd_32 << " (f32)";
  }
}

INSTANTIATE_TEST_SUITE_P(MlpStackBatchSharded2x2, MixedPrecisionComm,
                         ::testing::Values(CommCase{"fsdp", true}, CommCase{"ddp", true}),
                         [](const ::testing::TestParamInfo<CommCase>& info) {
                           return info.param.strategy;
                         });

}  // namespace
}  // namespace apc::runtime::mixed_precision_test
