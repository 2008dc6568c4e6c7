//===- tests/lower/schedule_test.cpp - The runtime's overlap schedule -------===//
//
// apc/lower/schedule.h replayed on lowered programs of a stack of blocks (tests/ir/test_graphs.h)
// planned FSDP-like and DDP-like on 2 ranks: the schedule's length is the compute plus the time
// the rank waits; without compute nothing hides on one mesh dim (collectives only queue behind
// each other); with compute the asynchronous collectives hide behind it, the forward's gathers
// only with prefetch; the artifact's prediction records what the schedule gives. And the planner's
// discount from that schedule (spec "prefetch_discount": "schedule", plan::refineForOverlap): its
// plan is never longer in the replayed step than the plan without a discount, and its costs are
// the cost model's own prices.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <numeric>
#include <optional>

#include "../plan/plan_fixtures.h"
#include "apc/cost/cost_model.h"
#include "apc/lower/lower.h"
#include "apc/lower/schedule.h"
#include "apc/planner/pipeline.h"
#include "apc/solver/baselines.h"
#include "apc/spec/spec.h"

namespace apc::lower {
namespace {

namespace schedule_test {

using plan::testing::specFor;

constexpr int64_t kLayers = 4;

/// The block stack on [2], batch-sharded, its parameters under `high` of their bytes per rank.
spec::Spec stackSpec(double high) {
  spec::Spec spec = specFor({2}, {"dp"});
  spec.inputs["x"] = {mesh::Placement::shard(0)};
  spec.memory_budget.high = high;
  return spec;
}

struct Lowered {
  plan::Plan plan;
  proto::Program program;  // rank 0's
};

/// The stack planned with `spec` (as a classic plan when `baseline` is set), rank 0 lowered.
Lowered lowerStack(const spec::Spec& spec, std::optional<solver::Baseline> baseline = {}) {
  const ir::Graph g = ir::testing_graphs::blockStack(kLayers);
  Lowered out;
  plan::PlanRequest request;
  request.baseline = baseline;
  auto run = plan::planGraph(g, spec, plan::testing::toySource(g), request);
  EXPECT_TRUE(run.ok()) << run.error().message();
  if (!run.ok()) return out;
  out.plan = run->result.plan;
  auto prog = lowerRank(g, out.plan, 0);
  EXPECT_TRUE(prog.ok()) << prog.error().message();
  if (prog.ok()) out.program = std::move(prog).value();
  return out;
}

/// `p` with every node's compute scaled by `scale`.
proto::Program scaledCompute(proto::Program p, double scale) {
  for (double& us : *p.mutable_prediction()->mutable_node_compute_us()) us *= scale;
  return p;
}

double computeOf(const proto::Program& p) {
  const auto& c = p.prediction().node_compute_us();
  return std::accumulate(c.begin(), c.end(), 0.0);
}

}  // namespace schedule_test

TEST(Schedule, ComputeHidesTheAsynchronousCollectivesOfFsdp) {
  using namespace schedule_test;
  const Lowered l = lowerStack(stackSpec(1.0), solver::Baseline::kFsdp);
  int gathers = 0;
  for (const proto::Redistribution& r : l.program.redistributions()) gathers += r.regather();
  ASSERT_GE(gathers, 2 * kLayers) << "every block's two weights are gathered";
  auto model = cost::costModelFor(l.plan.spec);
  ASSERT_TRUE(model.ok()) << model.error().message();
  const mesh::DeviceMesh& mesh = l.plan.spec.mesh;
  auto replay = [&](const proto::Program& p, int prefetch) {
    auto s = simulateProgram(p, *model, mesh, prefetch);
    EXPECT_TRUE(s.ok()) << s.error().message();
    return s.ok() ? *s : StepSchedule{};
  };
  const StepSchedule none = replay(scaledCompute(l.program, 0), 1);
  const double comm = none.serial_us;  // every collective, nothing else
  ASSERT_GT(comm, 0);
  EXPECT_NEAR(none.hidden_us, 0, 1e-6 * comm) << "one mesh dim: collectives only queue";
  EXPECT_NEAR(none.exposed_comm_us, comm, 1e-6 * comm);
  double previous_hidden = 0;
  for (double scale : {1.0, 30.0, 1e3}) {
    const proto::Program p = scaledCompute(l.program, scale);
    const StepSchedule s = replay(p, 1);
    const double compute = computeOf(p);
    SCOPED_TRACE("compute x" + std::to_string(scale));
    EXPECT_NEAR(s.serial_us, compute + comm, 1e-9 * s.serial_us);
    EXPECT_NEAR(s.overlapped_us, compute + s.exposed_comm_us, 1e-9 * s.serial_us);
    EXPECT_NEAR(s.hidden_us, s.serial_us - s.overlapped_us, 1e-9 * s.serial_us);
    EXPECT_GE(s.hidden_us, previous_hidden * (1 - 1e-9)) << "more compute hides no less";
    EXPECT_LT(s.hidden_us, comm) << "the first gather waits with nothing before it";
    previous_hidden = s.hidden_us;
  }
  // With compute to spare, prefetch hides the forward's gathers and backward's re-gathers too;
  // without it only the gradients' reduce-scatters run behind backward.
  const proto::Program slow = scaledCompute(l.program, 1e3);
  const StepSchedule prefetched = replay(slow, 1), unprefetched = replay(slow, 0);
  EXPECT_GT(prefetched.hidden_us, unprefetched.hidden_us);
  EXPECT_GT(unprefetched.hidden_us, 0);
  EXPECT_GT(prefetched.hidden_us, 0.5 * comm);
  // The artifact's prediction is the schedule of the program as lowered, whose items one after
  // another are the prediction without overlap.
  const StepSchedule as_lowered = replay(l.program, 1);
  const proto::Prediction& pr = l.program.prediction();
  EXPECT_NEAR(as_lowered.serial_us, pr.step_us() - pr.grad_bucket_saving_us(),
              1e-9 * as_lowered.serial_us);
  EXPECT_DOUBLE_EQ(l.program.prediction().hidden_comm_us(), as_lowered.hidden_us);
  EXPECT_DOUBLE_EQ(l.program.prediction().exposed_comm_us(), as_lowered.exposed_comm_us);
}

TEST(Schedule, DdpsBucketsRunBehindTheRestOfBackward) {
  using namespace schedule_test;
  const Lowered l = lowerStack(stackSpec(1.0), solver::Baseline::kDdp);
  int bucketed = 0;
  for (const proto::Redistribution& r : l.program.redistributions())
    bucketed += r.bucketed_gradient();
  ASSERT_GE(bucketed, 2 * kLayers) << "every weight's gradient is all-reduced in buckets";
  auto model = cost::costModelFor(l.plan.spec);
  ASSERT_TRUE(model.ok()) << model.error().message();
  auto slow = simulateProgram(scaledCompute(l.program, 1e3), *model, l.plan.spec.mesh);
  auto none = simulateProgram(scaledCompute(l.program, 0), *model, l.plan.spec.mesh);
  ASSERT_TRUE(slow.ok() && none.ok());
  // The first bucket (1 MiB, DDP's) holds the last block's down weight alone and is issued as
  // soon as backward produces its gradient; only the last bucket, issued at the end of
  // backward, is waited for with nothing left to hide it.
  EXPECT_GT(slow->hidden_us, 0);
  EXPECT_LT(slow->hidden_us, none->serial_us);
  EXPECT_NEAR(none->hidden_us, 0, 1e-6 * none->serial_us);
  auto as_lowered = simulateProgram(l.program, *model, l.plan.spec.mesh);
  ASSERT_TRUE(as_lowered.ok());
  const proto::Prediction& pr = l.program.prediction();
  EXPECT_NEAR(as_lowered->serial_us, pr.step_us() - pr.grad_bucket_saving_us(),
              1e-9 * as_lowered->serial_us);
}

TEST(Schedule, TheScheduleDiscountNeverLengthensTheReplayedStep) {
  using namespace schedule_test;
  for (double high : {0.5, 1.0}) {
    SCOPED_TRACE("high " + std::to_string(high));
    spec::Spec plain = stackSpec(high);
    spec::Spec scheduled = plain;
    scheduled.schedule_discount = true;
    const Lowered a = lowerStack(plain), b = lowerStack(scheduled);
    auto stepOf = [](const proto::Program& p) {
      const proto::Prediction& pr = p.prediction();
      return pr.step_us() - pr.grad_bucket_saving_us() -
             pr.overlap_efficiency() * pr.hidden_comm_us();
    };
    EXPECT_LE(stepOf(b.program), stepOf(a.program) * (1 + 1e-9));
    // Its costs are the cost model's prices (the discount only steered the solve): never below
    // the optimum of those prices.
    EXPECT_GE(b.plan.totals.total_us, a.plan.totals.total_us * (1 - 1e-9));
    const ir::Graph g = ir::testing_graphs::blockStack(kLayers);
    auto rebuilt = plan::rebuildProblem(g, b.plan);
    EXPECT_TRUE(rebuilt.ok()) << rebuilt.error().message();
    EXPECT_TRUE(b.plan.spec.schedule_discount);
    EXPECT_EQ(b.plan.spec.prefetch_discount, 1.0);
  }
}

// A device whose collectives run on the cores that compute (CPU ranks: overlap efficiency 0)
// takes nothing off the step for the hidden communication, and the schedule discount, which
// steers the solve by what the step saves, leaves the plan as it was.
TEST(Schedule, HiddenCommunicationIsFreeOnlyByTheDevicesOverlapEfficiency) {
  using namespace schedule_test;
  spec::Spec plain = stackSpec(0.5);
  plain.device_overrides.overlap_efficiency = 0.0;
  spec::Spec scheduled = plain;
  scheduled.schedule_discount = true;
  const Lowered a = lowerStack(plain), b = lowerStack(scheduled);
  const Lowered fsdp = lowerStack(plain, solver::Baseline::kFsdp);
  EXPECT_EQ(fsdp.program.prediction().overlap_efficiency(), 0.0);
  EXPECT_GT(fsdp.program.prediction().hidden_comm_us(), 0.0) << "the schedule still hides some";
  std::vector<std::string> pa, pb;
  for (const auto& n : a.plan.nodes) pa.push_back(n.strategy);
  for (const auto& n : b.plan.nodes) pb.push_back(n.strategy);
  EXPECT_EQ(pa, pb);
  // The datasheet device: all of it.
  const Lowered c = lowerStack(stackSpec(0.5));
  EXPECT_EQ(c.program.prediction().overlap_efficiency(), 1.0);
}

TEST(Schedule, TheSpecSaysScheduleOrANumber) {
  auto s = spec::parseSpecText(R"({"mesh": {"shape": [2]}, "prefetch_discount": "schedule"})");
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_TRUE(s->schedule_discount);
  EXPECT_EQ(spec::toJson(*s).at("prefetch_discount"), "schedule");
  auto back = spec::parseSpec(spec::toJson(*s));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *s);
  auto bad = spec::parseSpecText(R"({"mesh": {"shape": [2]}, "prefetch_discount": "later"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("$.prefetch_discount"), std::string::npos)
      << bad.error().message();
  EXPECT_EQ(bad.error().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace apc::lower
