//===- tests/plan/memory_test.cpp - The memory model and --device-memory --===//
//
// predictMemory on the toy block (x -> linear -> relu -> linear) against what autograd keeps
// there, the optimizers' state, the classic plans' parameter shards, and the device-memory loop
// of the pipeline: a roomy device gives the fastest plan, a tight one a plan that fits, a tiny
// one an error naming the smallest peak.
//
//===----------------------------------------------------------------------===//
#include "apc/plan/memory.h"

#include <gtest/gtest.h>

#include "apc/lower/lower.h"
#include "apc/support/strings.h"
#include "plan_fixtures.h"

namespace apc::plan {
namespace {

using testing::Planned;
using testing::planOf;
using testing::specFor;
using testing::toySource;
using testing::toySpec8;

constexpr int64_t kMiB = 1 << 20;

Expected<PlanRun> planWith(const ir::Graph& g, const spec::Spec& spec,
                           std::optional<solver::Baseline> baseline = std::nullopt) {
  PlanRequest request;
  request.baseline = baseline;
  return planGraph(g, spec, toySource(g), request);
}

TEST(Memory, OneDeviceKeepsWhatAutogradSaves) {
  // One rank: relu saves its output r (and the second linear reads the same tensor, saved once);
  // the first linear saves x (an input, persistent) and its output h is freed after relu; the
  // forward's output y is held until backward.
  const ir::Graph g = ir::testing_graphs::toyBlock(8);
  Planned p = planOf(g, specFor({1}, {"d"}));
  const MemoryEstimate* e = p.result.plan.memoryFor("sgd");
  ASSERT_NE(e, nullptr);
  const int64_t r_bytes = 8 * 128 * 4096 * 4, y_bytes = 8 * 128 * 1024 * 4;
  EXPECT_EQ(e->saved_activations, r_bytes + y_bytes);
  EXPECT_EQ(e->at_peak.parameters, 2 * 4096 * 1024 * 4);
  EXPECT_EQ(e->at_peak.inputs, 8 * 128 * 1024 * 4);
  EXPECT_EQ(e->at_peak.optimizer_state, 0);
  EXPECT_EQ(e->peak_bytes, e->at_peak.total());
  // The peak is at least everything saved with the parameters and the input.
  EXPECT_GE(e->peak_bytes, e->at_peak.parameters + e->at_peak.inputs + r_bytes + y_bytes);
}

TEST(Memory, OptimizerStateIsOneOrTwoParameterCopies) {
  const ir::Graph g = ir::testing_graphs::toyBlock(8);
  Planned p = planOf(g, toySpec8());
  const MemoryEstimate* sgd = p.result.plan.memoryFor("sgd");
  const MemoryEstimate* momentum = p.result.plan.memoryFor("momentum");
  const MemoryEstimate* adamw = p.result.plan.memoryFor("adamw");
  ASSERT_TRUE(sgd && momentum && adamw);
  const int64_t params = p.result.plan.totals.param_bytes_per_rank;
  EXPECT_EQ(sgd->at_peak.parameters, params);
  EXPECT_EQ(momentum->peak_bytes - sgd->peak_bytes, params);
  EXPECT_EQ(adamw->peak_bytes - sgd->peak_bytes, 2 * params);
  EXPECT_EQ(adamw->at_peak.optimizer_state, 2 * params);
  EXPECT_EQ(predictMemory(g, p.result.plan, "adamw").value(), *adamw);
  auto bad = predictMemory(g, p.result.plan, "lion");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("'lion'"), std::string::npos);
}

TEST(Memory, DataParallelSplitsActivationsAndFsdpSplitsParameters) {
  const ir::Graph g = ir::testing_graphs::toyBlock(8);
  auto one = planWith(g, specFor({1}, {"d"}));
  auto ddp = planWith(g, toySpec8(), solver::Baseline::kDdp);
  auto fsdp = planWith(g, toySpec8(), solver::Baseline::kFsdp);
  ASSERT_TRUE(one.ok() && ddp.ok() && fsdp.ok());
  const MemoryEstimate* e1 = one->result.plan.memoryFor("adamw");
  const MemoryEstimate* ed = ddp->result.plan.memoryFor("adamw");
  const MemoryEstimate* ef = fsdp->result.plan.memoryFor("adamw");
  ASSERT_TRUE(e1 && ed && ef);
  // DDP: every rank holds all parameters and an eighth of the batch's activations.
  EXPECT_EQ(ed->saved_activations * 8, e1->saved_activations);
  EXPECT_EQ(ed->persistent_bytes - ed->at_peak.inputs, e1->persistent_bytes - e1->at_peak.inputs);
  // FSDP: an eighth of the parameters and state; the gathered weights are transient.
  EXPECT_EQ(ef->at_peak.parameters * 8, ed->at_peak.parameters);
  EXPECT_EQ(ef->at_peak.optimizer_state * 8, ed->at_peak.optimizer_state);
  EXPECT_EQ(ef->saved_activations, ed->saved_activations);
  EXPECT_LT(ef->peak_bytes, ed->peak_bytes);
}

TEST(Memory, GatherGroupsFollowTheRuntimesGroupedCollectives) {
  // FSDP on 8 ranks (not the CPU: no Gloo copies), the batch split: up.weight and down.weight
  // (16 MiB each gathered) as one gather group, re-gathered, their gradients reduced together.
  const ir::Graph g = ir::testing_graphs::toyBlock(8);
  auto fsdp = planWith(g, toySpec8(), solver::Baseline::kFsdp);
  ASSERT_TRUE(fsdp.ok()) << fsdp.error().message();
  const Plan& plan = fsdp->result.plan;
  const int64_t weight = 16 * kMiB, h = 2 * kMiB, y = kMiB / 2;
  GatherGroup group;
  group.params = {"up.weight", "down.weight"};
  group.gather_bytes = 2 * weight;
  group.reduce_bytes = 2 * weight;
  group.regather = true;
  group.ranks = 8;
  auto plain = predictMemory(g, plan, "sgd");
  auto grouped = predictMemory(g, plan, "sgd", {group});
  ASSERT_TRUE(plain.ok() && grouped.ok());
  // Alone, each weight is gathered at its reader: the forward's peak is at down (its weight, the
  // relu's output r saved, y). Grouped, both are gathered at up, beside the gather's flat output
  // (issued and waited there: nothing before it) and up's output h.
  EXPECT_EQ(plain->forward_peak - plain->persistent_bytes, weight + h + y);
  EXPECT_EQ(grouped->forward_peak - grouped->persistent_bytes, 2 * weight + 2 * weight + h);
  EXPECT_EQ(grouped->persistent_bytes, plain->persistent_bytes);
  // Backward: re-gathered together at down's backward (the members and the gather's results),
  // and the group's flat gradient buffer held from up's backward to the end.
  EXPECT_GE(grouped->backward_peak - plain->backward_peak, 2 * weight);
  // A group per weight, gathered from 8 ranks: down's gather is issued at up's wait (the prefetch
  // of one unit), its flat input (an eighth) and output in flight beside up's gather.
  GatherGroup up = group, down = group;
  up.params = {"up.weight"};
  down.params = {"down.weight"};
  for (GatherGroup* one : {&up, &down}) {
    one->gather_bytes = weight;
    one->reduce_bytes = weight;
    one->ranks = 8;
  }
  auto prefetched = predictMemory(g, plan, "sgd", {down, up});
  ASSERT_TRUE(prefetched.ok());
  EXPECT_EQ(prefetched->forward_peak - prefetched->persistent_bytes,
            weight + weight + (weight + weight / 8) + h);
  // A group of parameters the plan does not gather changes nothing; nor do no groups.
  GatherGroup other = group;
  other.params = {"no.such.weight", "nor.this"};
  EXPECT_EQ(predictMemory(g, plan, "sgd", {other}).value(), *plain);
  EXPECT_EQ(predictMemoryAll(g, plan, {}).value().front(), *plain);
}

TEST(Memory, ThePlansEstimateHoldsTheRuntimesGatherGroups) {
  // FSDP on 8 ranks: the runtime gathers up.weight and down.weight (4 MiB each) as one group
  // (read off the lowered program), so the plan's estimate (what --device-memory compares) is the
  // grouped one, which the artifact's prediction records too; without the groups it is below it.
  const ir::Graph g = ir::testing_graphs::toyBlock(8, 1024);
  auto fsdp = planWith(g, toySpec8(), solver::Baseline::kFsdp);
  ASSERT_TRUE(fsdp.ok()) << fsdp.error().message();
  const Plan& plan = fsdp->result.plan;
  auto program = lower::lowerRank(g, plan, 0);
  ASSERT_TRUE(program.ok()) << program.error().message();
  const std::vector<GatherGroup> groups = lower::memoryGatherGroups(*program);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].params, (std::vector<std::string>{"up.weight", "down.weight"}));
  EXPECT_EQ(plan.memory, predictMemoryAll(g, plan, groups).value());
  ASSERT_EQ(program->prediction().peak_memory_size(), static_cast<int>(plan.memory.size()));
  for (const MemoryEstimate& e : plan.memory) {
    SCOPED_TRACE(e.optimizer);
    auto plain = predictMemory(g, plan, e.optimizer);
    ASSERT_TRUE(plain.ok());
    EXPECT_GT(e.peak_bytes, plain->peak_bytes);
    bool recorded = false;
    for (const auto& m : program->prediction().peak_memory())
      if (m.optimizer() == e.optimizer) {
        recorded = true;
        EXPECT_EQ(m.peak_bytes(), e.peak_bytes);
      }
    EXPECT_TRUE(recorded);
  }
  // ddp redistributes no parameter: its estimate has no groups.
  auto ddp = planWith(g, toySpec8(), solver::Baseline::kDdp);
  ASSERT_TRUE(ddp.ok());
  EXPECT_EQ(ddp->result.plan.memory, predictMemoryAll(g, ddp->result.plan).value());
}

TEST(Memory, PlanJsonKeepsTheEstimates) {
  const ir::Graph g = ir::testing_graphs::toyBlock(8);
  Planned p = planOf(g, toySpec8());
  ASSERT_EQ(p.result.plan.memory.size(), memoryOptimizers().size());
  auto back = planFromJson(toJson(p.result.plan));
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->memory, p.result.plan.memory);
  auto j = toJson(p.result.plan);
  j["memory"]["adam"] = j["memory"]["adamw"];
  auto bad = planFromJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("$.memory.adam"), std::string::npos)
      << bad.error().message();
}

TEST(DeviceMemory, ARoomyDeviceGetsTheFastestPlan) {
  const ir::Graph g = ir::testing_graphs::toyBlock(8);
  spec::Spec free_spec = toySpec8();
  free_spec.memory_budget.high = 1.0;  // no parameter bound
  auto fastest = planWith(g, free_spec);
  spec::Spec spec = toySpec8();
  spec.device_memory = int64_t{80} << 30;
  auto roomy = planWith(g, spec);
  ASSERT_TRUE(fastest.ok() && roomy.ok());
  EXPECT_DOUBLE_EQ(roomy->result.plan.solver.objective, fastest->result.plan.solver.objective);
  EXPECT_NE(roomy->result.note.find("fits"), std::string::npos) << roomy->result.note;
  EXPECT_EQ(roomy->result.plan.spec.device_memory, spec.device_memory);
}

TEST(DeviceMemory, ATightDeviceGetsAPlanThatFits) {
  // Between the fastest plan's peak and the peak of the plan with every parameter fully sharded,
  // the device-memory plan fits and costs at least the fastest. Tried on the toy at a few batch
  // sizes and meshes (batch 32 on 8 ranks is one): at least one must have a fastest plan that
  // needs more than the sharded one.
  int tried = 0;
  for (int64_t batch : {8, 16, 32, 64})
    for (int64_t ranks : {2, 4, 8}) {
      const ir::Graph g = ir::testing_graphs::toyBlock(batch);
      spec::Spec base = specFor({ranks}, {"dp"});
      base.inputs["x"] = {mesh::Placement::shard(0)};
      spec::Spec free_spec = base;
      free_spec.memory_budget.high = 1.0;
      spec::Spec sharded_spec = base;  // the default high: 1 / world size
      auto fastest = planWith(g, free_spec);
      auto sharded = planWith(g, sharded_spec);
      ASSERT_TRUE(fastest.ok() && sharded.ok());
      const int64_t big = fastest->result.plan.memoryFor("adamw")->peak_bytes;
      const int64_t small = sharded->result.plan.memoryFor("adamw")->peak_bytes;
      if (small >= big) continue;
      ++tried;
      spec::Spec spec = base;
      spec.device_memory = (big + small) / 2;
      auto tight = planWith(g, spec);
      ASSERT_TRUE(tight.ok()) << tight.error().message();
      const MemoryEstimate* e = tight->result.plan.memoryFor("adamw");
      ASSERT_NE(e, nullptr);
      EXPECT_LE(e->peak_bytes, *spec.device_memory) << "batch " << batch << ", " << ranks;
      EXPECT_GE(tight->result.plan.solver.objective, fastest->result.plan.solver.objective - 1e-9);
      EXPECT_NE(tight->result.note.find("parameters bounded"), std::string::npos)
          << tight->result.note;
    }
  EXPECT_GT(tried, 0) << "no configuration where the fastest plan needs more memory";
}

TEST(DeviceMemory, TooLittleMemoryNamesTheSmallestPeak) {
  const ir::Graph g = ir::testing_graphs::toyBlock(8);
  spec::Spec spec = toySpec8();
  spec.device_memory = kMiB;
  auto r = planWith(g, spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInfeasible);
  EXPECT_NE(r.error().message().find("smallest predicted peak per rank is"), std::string::npos)
      << r.error().message();
  EXPECT_EQ(r.error().message().find('\n'), std::string::npos);
}

TEST(DeviceMemory, SizesParse) {
  EXPECT_EQ(parseByteSize("80GiB").value(), int64_t{80} << 30);
  EXPECT_EQ(parseByteSize("40 GB").value(), int64_t{40'000'000'000});
  EXPECT_EQ(parseByteSize("512mib").value(), int64_t{512} << 20);
  EXPECT_EQ(parseByteSize("1.5e9").value(), int64_t{1'500'000'000});
  for (const char* bad : {"", "GiB", "80 parsecs", "-1GB", "0", "1e30"}) {
    auto r = parseByteSize(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(DeviceMemory, SpecJsonRoundTrips) {
  auto s = spec::parseSpecText(
      R"({"mesh": {"shape": [8]}, "device_memory": "24GiB", "optimizer": "momentum"})");
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->device_memory, int64_t{24} << 30);
  EXPECT_EQ(s->optimizer, "momentum");
  auto back = spec::parseSpec(spec::toJson(*s));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *s);
  auto both = spec::parseSpecText(
      R"({"mesh": {"shape": [8]}, "device_memory": 1000, "memory_budget": {"low": 0}})");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.error().message().find("not both"), std::string::npos);
  auto opt = spec::parseSpecText(R"({"mesh": {"shape": [8]}, "optimizer": "adam"})");
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.error().message().find("$.optimizer"), std::string::npos);
}

}  // namespace
}  // namespace apc::plan
