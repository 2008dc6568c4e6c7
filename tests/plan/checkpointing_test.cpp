//===- tests/plan/checkpointing_test.cpp - Activation checkpointing as a choice -===//
//
// On a stack of residual blocks (tests/ir/test_graphs.h, blockStack): the candidates are the
// blocks; checkpointing keeps only each block's input (the memory model, counted by hand); the
// recompute is priced; the plan JSON carries it and its hash covers it; --device-memory chooses
// checkpointing only when nothing fits without it, and then the cheapest set that fits (against
// every subset); "none" turns it off.
//
//===----------------------------------------------------------------------===//
#include "apc/planner/checkpointing.h"

#include <gtest/gtest.h>

#include "apc/plan/memory.h"
#include "plan_fixtures.h"

namespace apc::plan {
namespace {

using testing::Planned;
using testing::planOf;
using testing::specFor;
using testing::toySource;

constexpr int64_t kLayers = 4, kBatch = 32;
constexpr int64_t kX = kBatch * 128 * 1024 * 4;  // one block's input or output

Expected<PlanRun> planCk(const ir::Graph& g, const spec::Spec& spec,
                         std::optional<std::string> checkpoint = std::nullopt) {
  PlanRequest request;
  request.checkpoint = std::move(checkpoint);
  return planGraph(g, spec, toySource(g), request);
}

TEST(Checkpointing, CandidatesAreTheRepeatedBlocks) {
  const ir::Graph g = ir::testing_graphs::blockStack(kLayers);
  EXPECT_EQ(checkpointCandidates(g),
            (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2", "blocks.3"}));
  // The toy block's modules are single ops, not repeated blocks.
  EXPECT_TRUE(checkpointCandidates(ir::testing_graphs::toyBlock()).empty());
  auto all = parseCheckpointModules(g, "all");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 4u);
  EXPECT_TRUE(parseCheckpointModules(g, "none")->empty());
  EXPECT_EQ(*parseCheckpointModules(g, " blocks.2 ,blocks.0"),
            (std::vector<std::string>{"blocks.2", "blocks.0"}));
  auto bad = parseCheckpointModules(g, "blocks.0,blocks.9");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("'blocks.9'"), std::string::npos);
  EXPECT_NE(bad.error().message().find("blocks.0 ... blocks.3"), std::string::npos)
      << bad.error().message();
}

TEST(Checkpointing, KeepsOnlyEachBlocksInputAndPricesTheRecompute) {
  // One rank. Without checkpointing a block saves its input (the up linear's, for its weight's
  // gradient; the first block's is the forward's input, persistent) and relu's output (read by
  // the down linear too): x + 4x; the forward's output is held: 5 x per layer. Checkpointed, a
  // block keeps only its input: x per layer with the output.
  const ir::Graph g = ir::testing_graphs::blockStack(kLayers, kBatch);
  Planned p = planOf(g, specFor({1}, {"d"}));
  Plan plain = p.result.plan;
  EXPECT_EQ(plain.memoryFor("sgd")->saved_activations, 5 * kLayers * kX);
  Plan ck = plain;
  ASSERT_TRUE(applyCheckpointing(g, ck, checkpointCandidates(g)).ok());
  const MemoryEstimate* e = ck.memoryFor("sgd");
  EXPECT_EQ(e->saved_activations, kLayers * kX);
  EXPECT_LT(e->peak_bytes, plain.memoryFor("sgd")->peak_bytes);
  // The recompute's term: the backward peaks at block 1's relu, where block 1's input and the
  // forward's output are held (kept) and block 1's relu output, saved again by its recompute
  // (4 x, read by relu's and down's backward): 6 x, of which 2 x without the recompute. The
  // gradients made by then: blocks 3 and 2 (2 x each) and block 1's down weight (1 x).
  EXPECT_EQ(e->phase, "backward");
  EXPECT_EQ(e->at, "blocks.1_r");
  EXPECT_EQ(e->at_peak.activations, 6 * kX);
  EXPECT_EQ(e->at_peak.gradients, 5 * kX);
  EXPECT_EQ(e->backward_peak, e->peak_bytes);
  EXPECT_GT(e->backward_peak, e->forward_peak + 4 * kX);
  // The recompute: each block's forward once more (a third of its linears' compute, half of its
  // relu's and add's): more than nothing, less than half the step.
  EXPECT_GT(ck.totals.recompute_us, 0);
  EXPECT_LT(ck.totals.recompute_us, 0.5 * plain.totals.total_us);
  EXPECT_NEAR(ck.totals.total_us, plain.totals.total_us + ck.totals.recompute_us,
              1e-6 * ck.totals.total_us);
  EXPECT_NE(ck.content_hash, plain.content_hash);
  // Two blocks cost half of four.
  Plan two = plain;
  ASSERT_TRUE(applyCheckpointing(g, two, {"blocks.3", "blocks.1"}).ok());
  EXPECT_EQ(two.checkpoint, (std::vector<std::string>{"blocks.1", "blocks.3"}));  // node order
  EXPECT_NEAR(two.totals.recompute_us * 2, ck.totals.recompute_us, 1e-6);
  EXPECT_EQ(two.memoryFor("sgd")->saved_activations, 3 * kLayers * kX);
  // Overlapping or unknown modules are refused.
  Plan bad = plain;
  EXPECT_FALSE(applyCheckpointing(g, bad, {"blocks.1", "blocks.1.up"}).ok());
  EXPECT_FALSE(applyCheckpointing(g, bad, {"nothing"}).ok());
}

TEST(Checkpointing, PlanJsonCarriesItAndTheHashCoversIt) {
  const ir::Graph g = ir::testing_graphs::blockStack(kLayers);
  Planned p = planOf(g, specFor({2}, {"dp"}));
  Plan ck = p.result.plan;
  ASSERT_TRUE(applyCheckpointing(g, ck, {"blocks.0", "blocks.2"}).ok());
  auto back = planFromJson(toJson(ck));
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->checkpoint, ck.checkpoint);
  EXPECT_EQ(back->totals, ck.totals);
  EXPECT_EQ(back->memory, ck.memory);
  EXPECT_EQ(toJsonText(*back), toJsonText(ck));
  // A plan without checkpointing writes neither key.
  EXPECT_FALSE(toJson(p.result.plan).contains("checkpoint"));
  EXPECT_FALSE(toJson(p.result.plan)["totals"].contains("recompute_us"));
  // An edited list no longer hashes to the plan's hash.
  auto j = toJson(ck);
  j["checkpoint"] = {"blocks.0"};
  auto edited = planFromJson(j);
  ASSERT_FALSE(edited.ok());
  EXPECT_NE(edited.error().message().find("content_hash"), std::string::npos);
}

TEST(Checkpointing, DeviceMemoryChoosesItOnlyWhenNeededAndTheCheapestThatFits) {
  // Two ranks, data parallel: the parameters can be sharded (FSDP) but the activations stay. A
  // device between the all-checkpointed plan's peak and the least peak without checkpointing
  // needs checkpointing; the result fits, and no subset of the blocks that fits (brute force
  // on the same placements) recomputes less.
  const ir::Graph g = ir::testing_graphs::blockStack(kLayers, 32);
  spec::Spec base = specFor({2}, {"dp"});
  base.inputs["x"] = {mesh::Placement::shard(0)};
  spec::Spec least_spec = base;
  least_spec.memory_budget.high = 0.5;  // every parameter sharded
  auto least = planCk(g, least_spec);
  ASSERT_TRUE(least.ok()) << least.error().message();
  Plan least_all = least->result.plan;
  ASSERT_TRUE(applyCheckpointing(g, least_all, checkpointCandidates(g)).ok());
  const int64_t without = least->result.plan.memoryFor("adamw")->peak_bytes;
  const int64_t with_all = least_all.memoryFor("adamw")->peak_bytes;
  ASSERT_LT(with_all, without);
  spec::Spec spec = base;
  spec.device_memory = (with_all + without) / 2;
  auto tight = planCk(g, spec);
  ASSERT_TRUE(tight.ok()) << tight.error().message();
  const Plan& chosen = tight->result.plan;
  ASSERT_FALSE(chosen.checkpoint.empty());
  EXPECT_LE(chosen.memoryFor("adamw")->peak_bytes, *spec.device_memory);
  EXPECT_NE(tight->result.note.find("checkpointed"), std::string::npos) << tight->result.note;
  Plan bare = chosen;
  ASSERT_TRUE(applyCheckpointing(g, bare, {}).ok());
  const std::vector<std::string> candidates = checkpointCandidates(g);
  for (uint32_t mask = 0; mask < (1u << candidates.size()); ++mask) {
    std::vector<std::string> subset;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (mask & (1u << i)) subset.push_back(candidates[i]);
    }
    Plan q = bare;
    ASSERT_TRUE(applyCheckpointing(g, q, subset).ok());
    if (q.memoryFor("adamw")->peak_bytes <= *spec.device_memory) {
      EXPECT_GE(q.totals.recompute_us, chosen.totals.recompute_us - 1e-9) << "subset " << mask;
    }
  }
  // Without checkpointing the same device has no plan; a roomy one needs none.
  auto off = planCk(g, spec, "none");
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.error().code(), ErrorCode::kInfeasible);
  spec::Spec roomy = base;
  roomy.device_memory = int64_t{80} << 30;
  auto r = planCk(g, roomy);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->result.plan.checkpoint.empty());
  // An explicit list is applied as asked.
  auto forced = planCk(g, base, "blocks.1");
  ASSERT_TRUE(forced.ok()) << forced.error().message();
  EXPECT_EQ(forced->result.plan.checkpoint, std::vector<std::string>{"blocks.1"});
}

}  // namespace
}  // namespace apc::plan
