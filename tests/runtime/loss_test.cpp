//===- tests/runtime/loss_test.cpp - The loss on this rank's rows ---------------===//
//
// shardedLoss (apc/runtime/loss.h) against the loss of the whole output gathered on every rank
// (what apc-train computed before): on 2 and 4 ranks with llama_tiny's logits placed by ddp
// (rows split), tp (the vocab dim split: the vocab-parallel cross entropy, no gather) and fsdp+tp,
// and mlp_stack's floating output, the loss value and every parameter's gradient agree:
// cross-entropy with drawn targets and with given class ids, and the mean square against given
// floating targets. A dynamic batch's row count takes no collective where the caller gives the
// batch's sizes.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "apc/runtime/loss.h"
#include "apc/runtime/parallel_module.h"
#include "rank_harness.h"

namespace apc::runtime::loss_test {  // its own: the runtime tests are one unity build
namespace {

namespace fs = std::filesystem;
using testing::ModelCase;

const ModelCase kLlama{"llama_tiny", {"tokens:i64[8,8]"}, 256, ""};
const ModelCase kMlp{"mlp_stack", {"x:f32[8,4,128]"}, 0, ""};
// GPT-2's tensor-parallel head leaves the logits split by vocab (S(2)); llama_tiny's casts them to
// f32 replicated.
const ModelCase kGpt2{"gpt2_tiny", {"idx:i64[8,8]"}, 50257, ""};

struct LossCase {
  const ModelCase* model;
  std::string mesh;
  std::string strategy;
  bool given_targets;
};

std::string caseName(const ::testing::TestParamInfo<LossCase>& info) {
  return testing::paramName(info.param.model->model + "_" + info.param.mesh + "_" +
                            info.param.strategy + (info.param.given_targets ? "_given" : "_drawn"));
}

class ShardedLossRanks : public ::testing::TestWithParam<LossCase> {};

TEST_P(ShardedLossRanks, EqualsTheGatheredLossAndItsGradients) {
  const LossCase& lc = GetParam();
  if (!fs::exists(testing::samplePath(lc.model->model)))
    GTEST_SKIP() << "sample " << lc.model->model << " missing (run scripts/setup.sh)";
  const fs::path dir = testing::scratchDir("loss", caseName({lc, 0}));
  const std::string err = testing::makeArtifact(*lc.model, lc.mesh, lc.strategy, dir.string());
  ASSERT_EQ(err, "") << err;
  const testing::Reference ref = testing::computeReference(*lc.model, 1, 0.0);
  const int world = lc.mesh == "2" ? 2 : 4;
  auto failures = testing::runRanks(world, [&](int rank) {
    testing::RankLog log(rank);
    auto pm = testing::loadRank(dir.string(), ref.init, log);
    if (!pm) return 1;
    const std::vector<c10::IValue> inputs = testing::shardInputs(*pm, ref.inputs);
    const std::vector<int64_t> full_shape = pm->outputSpecs().at(0).global_shape;
    at::Tensor targets;
    if (lc.given_targets) {
      at::Generator tg = at::detail::createCPUGenerator(11);
      std::vector<int64_t> rows(full_shape.begin(), full_shape.end() - 1);
      targets = lc.model != &kMlp ? at::randint(0, full_shape.back(), rows, tg, at::kLong)
                                  : at::randn(full_shape, tg);
    }
    // The gathered loss (the whole output on every rank) and its gradients.
    auto leaves = pm->forwardLeaves(inputs);
    if (!leaves.ok()) {
      log.fail(leaves.error().message());
      return log.exitCode();
    }
    at::Tensor full = pm->gatherOutput(0, leaves->at(0).toTensor());
    // Cross-entropy over the last dim unless the targets are floating (then the mean square).
    at::Tensor want_loss;
    if (!(lc.given_targets && lc.model == &kMlp)) {
      const int64_t c = full.size(-1);
      at::Generator g = at::detail::createCPUGenerator(5);
      at::Tensor t = lc.given_targets ? targets.reshape({-1})
                                      : at::randint(0, c, {full.numel() / c}, g, at::kLong);
      want_loss = at::cross_entropy_loss(full.reshape({-1, c}), t);
    } else {
      want_loss = (full - targets).pow(2).mean();
    }
    want_loss.backward();
    std::vector<at::Tensor> want;
    for (size_t i = 0; i < pm->parameters().size(); ++i) want.push_back(pm->fullGrad(i).clone());
    for (at::Tensor p : pm->parameters()) p.mutable_grad() = at::Tensor();
    // The sharded loss.
    auto again = pm->forwardLeaves(inputs);
    if (!again.ok()) {
      log.fail(again.error().message());
      return log.exitCode();
    }
    at::Generator g = at::detail::createCPUGenerator(5);
    pm->resetCommStats();
    auto got = shardedLoss(*pm, again->at(0).toTensor(), lc.given_targets ? &targets : nullptr,
                           lc.given_targets ? nullptr : &g);
    if (!got.ok()) {
      log.fail(got.error().message());
      return log.exitCode();
    }
    // The rows stay where they are and a class dim split by vocab (tp's head) is not gathered
    // either: the cross entropy of the split logits takes all-reduces of a number per row. No case
    // here has a Partial output, so none gathers.
    bool class_split = false;
    for (const mesh::Placement& pl : pm->outputSpecs().at(0).placement)
      class_split = class_split || (lc.model != &kMlp && pl.isShard() &&
                                    pl.dim() == static_cast<int64_t>(full_shape.size()) - 1);
    int64_t gathers = 0;
    for (const CommStats& st : pm->commStatsByMeshDim())
      gathers += st.of(CommKind::kAllGather).calls;
    if (gathers != 0)
      log.fail("the loss gathered the output (" + std::to_string(gathers) + " all-gathers)");
    // (The ranks are forked processes: each checks that its case is the one meant.)
    if (lc.model == &kGpt2 && !class_split)
      log.fail("gpt2_tiny's logits are not split by vocab here: the case tests nothing new");
    got->share.backward();
    const double w = want_loss.item<double>();
    const double value = got->value();
    if (std::abs(value - w) > 1e-5 * std::max(1.0, std::abs(w)))
      log.fail("loss " + std::to_string(value) + ", gathered " + std::to_string(w));
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string d = testing::compareTensors(pm->fullGrad(i), want[i], 1e-4);
      if (!d.empty()) log.fail("gradient of parameter " + std::to_string(i) + ": " + d);
    }
    return log.exitCode();
  });
  EXPECT_TRUE(failures.empty()) << ::testing::PrintToString(failures);
}

INSTANTIATE_TEST_SUITE_P(
    Placements, ShardedLossRanks,
    ::testing::Values(LossCase{&kLlama, "2", "ddp", false}, LossCase{&kLlama, "2", "tp", false},
                      LossCase{&kLlama, "2x2", "fsdp+tp", false},
                      LossCase{&kLlama, "2x2", "ddp", true}, LossCase{&kLlama, "2", "tp", true},
                      LossCase{&kMlp, "2", "ddp", false}, LossCase{&kMlp, "2", "ddp", true},
                      LossCase{&kMlp, "2x2", "tp", true}, LossCase{&kGpt2, "2", "tp", true},
                      LossCase{&kGpt2, "2x2", "tp", false}),
    caseName);

// A dynamic batch (mlp_stack planned at B = 8, run at 7 rows: 4 + 3 on 2 ranks): the whole batch's
// row count is summed over the ranks (a blocking all-reduce) unless the caller passes the batch's
// symbol sizes (inputSymbolSizes of the full inputs), which give the same loss and gradients with
// one collective fewer; a size below this rank's rows is an error.
TEST(ShardedLossDynamic, SymbolSizesSpareTheRowCountsCollective) {
  const ModelCase dyn{"mlp_stack", {"x:f32[B=8,4,128]"}, 0, ""};
  if (!fs::exists(testing::samplePath(dyn.model)))
    GTEST_SKIP() << "sample " << dyn.model << " missing (run scripts/setup.sh)";
  const fs::path dir = testing::scratchDir("loss", "mlp_stack_dynamic");
  const std::string err = testing::makeArtifact(dyn, "2", "ddp", dir.string());
  ASSERT_EQ(err, "") << err;
  const testing::Reference ref = testing::computeReference(dyn, 1, 0.0);
  auto failures = testing::runRanks(2, [&](int rank) {
    testing::RankLog log(rank);
    auto pm = testing::loadRank(dir.string(), ref.init, log);
    if (!pm) return 1;
    const std::vector<at::Tensor> full = {ref.inputs.at(0).narrow(0, 0, 7)};
    const std::vector<c10::IValue> inputs = testing::shardInputs(*pm, {full[0]});
    const std::map<std::string, int64_t> sizes = inputSymbolSizes(*pm, full);
    if (sizes.size() != 1 || sizes.begin()->second != 7) {
      log.fail("inputSymbolSizes gave " + std::to_string(sizes.size()) + " symbols");
      return log.exitCode();
    }
    auto allReduces = [&] {
      int64_t n = 0;
      for (const CommStats& st : pm->commStatsByMeshDim()) n += st.of(CommKind::kAllReduce).calls;
      return n;
    };
    double values[2] = {0, 0};
    int64_t calls[2] = {0, 0};
    std::vector<at::Tensor> grads[2];
    for (int hinted = 0; hinted < 2; ++hinted) {
      auto leaves = pm->forwardLeaves(inputs);
      if (!leaves.ok()) {
        log.fail(leaves.error().message());
        return log.exitCode();
      }
      pm->resetCommStats();
      at::Generator g = at::detail::createCPUGenerator(5);
      auto loss =
          shardedLoss(*pm, leaves->at(0).toTensor(), nullptr, &g, hinted ? &sizes : nullptr);
      if (!loss.ok()) {
        log.fail(loss.error().message());
        return log.exitCode();
      }
      calls[hinted] = allReduces();
      loss->share.backward();
      values[hinted] = loss->value();
      for (size_t i = 0; i < pm->parameters().size(); ++i) {
        grads[hinted].push_back(pm->fullGrad(i).clone());
        pm->parameters()[i].mutable_grad() = at::Tensor();
      }
    }
    if (calls[1] != calls[0] - 1)
      log.fail("all-reduces in the loss: " + std::to_string(calls[0]) + " without the sizes, " +
               std::to_string(calls[1]) + " with them");
    if (std::abs(values[0] - values[1]) > 1e-6 * std::max(1.0, std::abs(values[0])))
      log.fail("loss " + std::to_string(values[1]) + " with the sizes, " +
               std::to_string(values[0]) + " without");
    for (size_t i = 0; i < grads[0].size(); ++i) {
      const std::string d = testing::compareTensors(grads[1][i], grads[0][i], 1e-6);
      if (!d.empty()) log.fail("gradient of parameter " + std::to_string(i) + ": " + d);
    }
    auto leaves = pm->forwardLeaves(inputs);
    if (!leaves.ok()) {
      log.fail(leaves.error().message());
      return log.exitCode();
    }
    // Below both ranks' rows (4 and 3): both fail alike, before any collective.
    const std::map<std::string, int64_t> small = {{sizes.begin()->first, 2}};
    at::Generator g = at::detail::createCPUGenerator(5);
    auto bad = shardedLoss(*pm, leaves->at(0).toTensor(), nullptr, &g, &small);
    const std::string rows = rank == 0 ? "4" : "3";
    if (bad.ok() ||
        bad.error().message().find("is below this rank's " + rows + " rows") == std::string::npos)
      log.fail("a batch size below the rank's rows: " +
               (bad.ok() ? std::string("accepted") : bad.error().message()));
    return log.exitCode();
  });
  EXPECT_TRUE(failures.empty()) << ::testing::PrintToString(failures);
}

}  // namespace
}  // namespace apc::runtime::loss_test
