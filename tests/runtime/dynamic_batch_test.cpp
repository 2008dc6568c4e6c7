//===- tests/runtime/dynamic_batch_test.cpp - Plan at batch 8, run at others ===//
//
// Dynamic batch end to end: a sample model is planned (classic ddp: the batch of the input, and of
// every activation, sharded on the data-parallel mesh dim) with `--input x:f32[B=8,...]`, so that
// the importer marks every dim that follows B as symbolic and lowering writes -1 for it in view /
// reshape size lists. The artifact then runs on forked ranks at other batch sizes; at each, the
// forward output (this rank's piece, compared with the same piece of the single-process output)
// and every parameter gradient (gathered to full) must equal the unsharded model's at that batch
// within 1e-5 relative. The loss of a rank is sum_i sum(out_i * w_i) / numel(full out_i) over its
// pieces (what gatherOutput + the full loss give: a sharded leaf's gradient is its slice of the
// full one, a replicated leaf's the full one).
//
// Output pieces are compared locally because ParallelModule::gatherOutput sizes the gather of a
// sharded dim from the recorded hint. All-gathers inside the program exchange the members' sizes
// when a piece differs from its recorded size (lib/runtime/redistribute.cpp). Batches are multiples
// of the data-parallel size (6 and 10 on 2 ranks): an uneven batch (7 on 2 ranks) does not run yet
// (a rank aborts in the forward of mlp_stack).
//
//===----------------------------------------------------------------------===//
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "apc/runtime/parallel_module.h"
#include "apc/runtime/redistribute.h"
#include "rank_harness.h"

namespace apc::runtime {
namespace {

using testing::ModelCase;
using testing::Reference;

constexpr double kRtol = 1e-5;

std::filesystem::path scratchDir(const std::string& name) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("apc_dyn_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d.parent_path());
  return d;
}

int runRank(int rank, const std::string& dir, const Reference& ref) {
  at::set_num_threads(1);
  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
    ++failures;
  };
  auto loaded = ParallelModule::load(dir);
  if (!loaded.ok()) {
    fail("load: " + loaded.error().message());
    return 1;
  }
  ParallelModule& pm = **loaded;
  Status st = pm.load_full_state_dict(ref.init);
  if (!st.ok()) {
    fail("load_full_state_dict: " + st.error().message());
    return 1;
  }
  std::vector<c10::IValue> inputs;
  for (size_t i = 0; i < ref.inputs.size(); ++i)
    inputs.emplace_back(pm.shardInput(i, ref.inputs[i]));
  auto leaves = pm.forwardLeaves(inputs);
  if (!leaves.ok()) {
    fail("forward: " + leaves.error().message());
    return 1;
  }
  if (leaves->size() != ref.outputs.size()) {
    fail("output leaf count differs");
    return 1;
  }
  const std::vector<int64_t> coord = pm.mesh().coordinate(pm.rank());
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (size_t i = 0; i < leaves->size(); ++i) {
    at::Tensor out = (*leaves)[i].toTensor();
    const mesh::PlacementTuple& pl = pm.outputSpecs()[i].placement;
    for (const mesh::Placement& p : pl)
      if (p.isPartial()) {
        fail("output " + std::to_string(i) + " is partial");
        return 1;
      }
    at::Tensor want = localPieceOf(ref.outputs[i], pl, pm.mesh(), coord);
    std::string d = testing::compareTensors(out.detach(), want, kRtol);
    if (!d.empty()) fail("output " + std::to_string(i) + ": " + d);
    at::Tensor w = localPieceOf(ref.loss_weights[i], pl, pm.mesh(), coord);
    loss = loss + (out * w).sum().to(at::kDouble) / static_cast<double>(ref.outputs[i].numel());
  }
  loss.backward();
  std::vector<at::Tensor> params = pm.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = pm.parameterSpecs()[i].name;
    at::Tensor full = pm.fullGrad(i);
    auto it = ref.grads.find(name);
    if (it == ref.grads.end()) {
      fail("parameter " + name + " is not in the model");
      continue;
    }
    std::string d = testing::compareTensors(full, it->second, kRtol);
    if (!d.empty()) fail("grad " + name + ": " + d);
  }
  return failures == 0 ? 0 : 1;
}

struct DynCase {
  std::string model;
  std::string planned;  // "x:f32[B=8,4,128]"
  std::string dims;     // the static dims after the batch: ",4,128]"
  int64_t index_bound;
};

void planAndRun(const DynCase& c, const std::string& mesh, int world,
                const std::vector<int64_t>& batches) {
  ModelCase plan{c.model, {c.planned}, c.index_bound, ""};
  if (!std::filesystem::exists(testing::samplePath(c.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = scratchDir(c.model + "_" + mesh);
  std::string err = testing::makeArtifact(plan, mesh, "ddp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const std::string prefix = c.planned.substr(0, c.planned.find('[') + 1);
  for (int64_t b : batches) {
    SCOPED_TRACE("batch " + std::to_string(b));
    ModelCase at_b{c.model, {prefix + std::to_string(b) + c.dims}, c.index_bound, ""};
    Reference ref = testing::computeReference(at_b, 1, 0.0);
    std::vector<std::string> failed =
        testing::runRanks(world, [&](int rank) { return runRank(rank, dir.string(), ref); });
    for (const std::string& f : failed) ADD_FAILURE() << f;
  }
  std::filesystem::remove_all(dir);
}

TEST(DynamicBatch, MlpStackPlannedAt8RunsAt6And10) {
  planAndRun({"mlp_stack", "x:f32[B=8,4,128]", ",4,128]", 0}, "2", 2, {6, 8, 10});
}

TEST(DynamicBatch, ToyBlockPlannedAt8RunsAt6And10) {
  planAndRun({"toy_block", "x:f32[B=8,2,1024]", ",2,1024]", 0}, "2", 2, {6, 10});
}

}  // namespace
}  // namespace apc::runtime
