//===- tests/strategy_validator/redistribution_test.cpp - Executed redistributions ===//
//
// Property test of cost::planRedistribution: for seeded random pairs of placement tuples (S(d), R,
// P(sum), P(avg), P(max)) on meshes [4], [2,2], [2,4], [2,2,2] and tensors with uneven dims, the
// plan's steps are EXECUTED on simulated ranks with torch tensors by the collectives of
// sim_ranks.h, and every rank must end with exactly its piece of the target layout (for Partial
// targets: the reduction over the group equals the piece); each intermediate tuple is checked the
// same way. Impossible transitions (a non-partial value becoming partial, a partial op changing,
// reducing two partial ops that do not commute) must come back as feasible == false. Also checks
// that layout::localPiece agrees with torch.chunk applied in mesh-dim order, and that
// cost::redistributionCost (what the solver prices) equals the executed plan's cost.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <random>

#include "../common/placements.h"
#include "apc/cost/redistribute.h"
#include "apc/layout/layout.h"
#include "sim_ranks.h"

namespace apc::validator {
namespace {

using mesh::DeviceMesh;
using mesh::Placement;
using mesh::PlacementTuple;
using mesh::ReduceOp;

DeviceMesh makeMesh(std::vector<int64_t> shape) {
  return *DeviceMesh::create(std::move(shape));
}

const std::vector<std::vector<int64_t>> kMeshes = {{4}, {2, 2}, {2, 4}, {2, 2, 2}};
const std::vector<std::vector<int64_t>> kShapes = {{5, 6, 3}, {7, 4}, {11}, {3, 2, 9}};

ir::TensorMeta metaOf(const std::vector<int64_t>& sizes, bool requires_grad) {
  ir::TensorMeta t;
  t.shape = ir::makeShape(sizes);
  t.dtype = ir::DType::kF32;
  t.requires_grad = requires_grad;
  return t;
}

using testing::tuple;

/// A random tuple: R, S(d) for any tensor dim, or (when `partial_ops` is non-empty) P(op) with op
/// drawn from partial_ops.
PlacementTuple randomTuple(std::mt19937_64& rng, int64_t rank, size_t ndim,
                           const std::vector<ReduceOp>& partial_ops) {
  PlacementTuple t;
  for (size_t m = 0; m < ndim; ++m) {
    int r = static_cast<int>(rng() % 10);
    if (r < 3) {
      t.push_back(Placement::replicate());
    } else if (r < 8 || partial_ops.empty()) {
      t.push_back(Placement::shard(static_cast<int>(rng() % static_cast<uint64_t>(rank))));
    } else {
      t.push_back(Placement::partial(partial_ops[rng() % partial_ops.size()]));
    }
  }
  return t;
}

/// The partial ops one tuple may mix so that they commute: {sum, avg} or {max}.
std::vector<ReduceOp> randomPartialFamily(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      return {ReduceOp::kMax};
    case 1:
      return {ReduceOp::kSum, ReduceOp::kAvg};
    default:
      return {ReduceOp::kSum};
  }
}

/// Impossible per apc/cost/redistribute.h, decided here from the rule text: a Partial target must
/// already be that Partial; two Partial mesh dims of `from` whose ops do not commute make the pair
/// impossible unless both stay as they are.
bool expectImpossible(const PlacementTuple& from, const PlacementTuple& to) {
  for (size_t m = 0; m < to.size(); ++m)
    if (to[m].isPartial() && !(from[m] == to[m])) return true;
  for (size_t a = 0; a < from.size(); ++a)
    for (size_t b = a + 1; b < from.size(); ++b) {
      if (!from[a].isPartial() || !from[b].isPartial()) continue;
      if (partialsCommute({from[a], from[b]})) continue;
      if (!(from[a] == to[a] && from[b] == to[b])) return true;
    }
  return false;
}

struct PairStats {
  int pairs = 0;
  int feasible = 0;
  int infeasible = 0;
  std::map<cost::StepKind, int> steps;
};

/// Plans and executes one pair; nullopt when everything holds, else a one-line failure.
std::optional<std::string> checkPair(const std::vector<int64_t>& sizes, const PlacementTuple& from,
                                     const PlacementTuple& to, const DeviceMesh& mesh,
                                     bool requires_grad, at::Generator& gen, PairStats& stats) {
  ++stats.pairs;
  Expected<cost::RedistributionPlan> plan =
      cost::planRedistribution(metaOf(sizes, requires_grad), from, to, mesh);
  if (!plan.ok()) return "planRedistribution error: " + plan.error().message();
  // The solver prices edges with redistributionCost, which must be the plan's cost exactly (the
  // priced collectives are the executed ones).
  Expected<cost::RedistCost> priced =
      cost::redistributionCost(metaOf(sizes, requires_grad), from, to, mesh);
  if (!priced.ok()) return "redistributionCost error: " + priced.error().message();
  if (priced->feasible != plan->feasible ||
      (plan->feasible &&
       (priced->num_steps != static_cast<int>(plan->steps.size()) ||
        std::abs(priced->forward_us - plan->forward_us) > 1e-9 * (1 + plan->forward_us) ||
        std::abs(priced->backward_us - plan->backward_us) > 1e-9 * (1 + plan->backward_us))))
    return "redistributionCost (feasible " + std::to_string(priced->feasible) + ", " +
           std::to_string(priced->num_steps) + " steps, fwd " + std::to_string(priced->forward_us) +
           ", bwd " + std::to_string(priced->backward_us) +
           ") differs from the plan: " + cost::describe(*plan, true);
  const bool impossible = expectImpossible(from, to);
  if (plan->feasible == impossible)
    return std::string(impossible ? "feasible" : "infeasible") +
           " plan, expected the opposite: " + cost::describe(*plan);
  if (!plan->feasible) {
    ++stats.infeasible;
    if (plan->infeasible_reason.empty()) return "infeasible plan without a reason";
    return std::nullopt;
  }
  ++stats.feasible;
  if (!partialsCommute(from)) return std::nullopt;  // both kept: nothing to execute exactly

  at::Tensor full = at::randn(sizes, gen, at::kDouble);
  Expected<RankTensors> locals = distribute(full, from, mesh, gen);
  if (!locals.ok()) return "distribute: " + locals.error().message();
  if (auto bad = checkLayout(*locals, full, from, mesh))
    return "initial layout (validator bug): " + *bad;
  PlacementTuple current = from;
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    const cost::RedistributionStep& step = plan->steps[i];
    std::string where = "step " + std::to_string(i) + " " + cost::describe(step);
    if (!(step.before == current))
      return where + ": starts from " + mesh::toString(step.before) + ", the state is " +
             mesh::toString(current);
    if (step.group_size != mesh.size(step.mesh_dim)) return where + ": wrong group size";
    Status st = executeStep(*locals, step, mesh);
    if (!st.ok()) return where + ": " + st.error().message();
    ++stats.steps[step.kind];
    if (auto bad = checkLayout(*locals, full, step.after, mesh))
      return where + " -> " + mesh::toString(step.after) + ": " + *bad;
    current = step.after;
  }
  if (!(current == to)) return "the steps end at " + mesh::toString(current);
  return std::nullopt;
}

std::string pairText(const std::vector<int64_t>& sizes, const PlacementTuple& from,
                     const PlacementTuple& to, const DeviceMesh& mesh) {
  std::string s = "mesh " + mesh.toString() + ", tensor [";
  for (size_t d = 0; d < sizes.size(); ++d) s += (d ? "," : "") + std::to_string(sizes[d]);
  return s + "], " + mesh::toString(from) + " -> " + mesh::toString(to);
}

// --- tests
// ----------------------------------------------------------------------------------------

// layout::localPiece is the layout everything else is checked against: it must be torch.chunk
// applied in mesh-dim order (the earlier mesh dim the outer split), here computed with at::chunk
// itself on a tensor of element indices.
TEST(LocalPiece, MatchesTorchChunkInMeshDimOrder) {
  std::mt19937_64 rng(7);
  int checked = 0;
  for (const auto& mshape : kMeshes) {
    DeviceMesh mesh = makeMesh(mshape);
    for (const auto& sizes : kShapes) {
      int64_t n = 1;
      for (int64_t s : sizes) n *= s;
      at::Tensor full = at::arange(n, at::kLong).view(sizes);
      for (int i = 0; i < 30; ++i) {
        PlacementTuple t = randomTuple(rng, static_cast<int64_t>(sizes.size()), mesh.ndim(), {});
        for (int64_t r = 0; r < mesh.worldSize(); ++r) {
          std::vector<int64_t> c = mesh.coordinate(r);
          at::Tensor expect = full;
          for (size_t m = 0; m < t.size(); ++m) {
            if (!t[m].isShard()) continue;
            std::vector<at::Tensor> chunks = at::chunk(expect, mesh.size(m), t[m].dim());
            if (c[m] < static_cast<int64_t>(chunks.size())) {
              expect = chunks[static_cast<size_t>(c[m])];
            } else {  // torch.chunk drops empty trailing pieces: the piece is empty at the end
              expect = expect.narrow(t[m].dim(), expect.size(t[m].dim()), 0);
            }
          }
          at::Tensor got = localOf(full, t, mesh, c);
          ASSERT_TRUE(got.sizes() == expect.sizes() && at::equal(got, expect))
              << pairText(sizes, t, t, mesh) << " rank " << r << ": localPiece gives "
              << shapeText(got) << ", torch.chunk " << shapeText(expect);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// Hand-picked pairs whose answer is known: impossible ones and ones that need every step kind.
TEST(Redistribution, ImpossibleTransitionsAreReportedInfeasible) {
  DeviceMesh m22 = makeMesh({2, 2});
  DeviceMesh m4 = makeMesh({4});
  struct Case {
    const DeviceMesh* mesh;
    const char* from;
    const char* to;
  };
  const Case cases[] = {
      {&m4, "S(0)", "P"},
      {&m4, "R", "P"},
      {&m4, "P", "P(max)"},
      {&m4, "P(max)", "P"},
      {&m22, "S(0),R", "S(0),P"},
      {&m22, "R,R", "P,R"},
      {&m22, "P(max),P", "R,R"},
      {&m22, "P(max),P", "P(max),R"},
      {&m22, "P,P(min)", "S(0),P(min)"},
  };
  for (const Case& c : cases) {
    auto plan = cost::planRedistribution(metaOf({5, 6}, true), tuple(c.from), tuple(c.to), *c.mesh);
    ASSERT_TRUE(plan.ok()) << plan.error().message();
    EXPECT_FALSE(plan->feasible) << c.from << " -> " << c.to << ": " << cost::describe(*plan);
    EXPECT_FALSE(plan->infeasible_reason.empty()) << c.from << " -> " << c.to;
  }
  // Two non-commuting partials that both stay partial need no reduction: feasible, no steps.
  auto keep =
      cost::planRedistribution(metaOf({5, 6}, true), tuple("P(max),P"), tuple("P(max),P"), m22);
  ASSERT_TRUE(keep.ok());
  EXPECT_TRUE(keep->feasible);
  EXPECT_TRUE(keep->steps.empty());
}

// Every pair of {R, S(0), S(1), P} tuples on [2,2] for an uneven 2-d tensor: 256 pairs.
TEST(Redistribution, ExhaustivePairsOnTwoByTwoExecuteExactly) {
  DeviceMesh mesh = makeMesh({2, 2});
  const std::vector<int64_t> sizes = {5, 3};
  const Placement options[] = {Placement::replicate(), Placement::shard(0), Placement::shard(1),
                               Placement::partial()};
  std::vector<PlacementTuple> tuples;
  for (const Placement& a : options)
    for (const Placement& b : options) tuples.push_back({a, b});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
  PairStats stats;
  int failures = 0;
  for (const PlacementTuple& from : tuples)
    for (const PlacementTuple& to : tuples) {
      auto bad = checkPair(sizes, from, to, mesh, true, gen, stats);
      if (bad && ++failures <= 20) ADD_FAILURE() << pairText(sizes, from, to, mesh) << ": " << *bad;
    }
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(stats.pairs, 256);
  // Per mesh dim 13 of the 16 (from, to) placement pairs are possible (not R/S -> P): 13^2.
  EXPECT_EQ(stats.feasible, 169);
  EXPECT_EQ(stats.infeasible, 256 - 169);
}

// The main property: seeded random pairs on every mesh and uneven shape, executed.
TEST(Redistribution, RandomPairsExecuteExactly) {
  auto start = std::chrono::steady_clock::now();
  std::mt19937_64 rng(2024);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2024);
  PairStats stats;
  int failures = 0;
  const int kPairsPerCase = 50;
  for (const auto& mshape : kMeshes) {
    DeviceMesh mesh = makeMesh(mshape);
    for (const auto& sizes : kShapes) {
      const int64_t rank = static_cast<int64_t>(sizes.size());
      for (int i = 0; i < kPairsPerCase; ++i) {
        std::vector<ReduceOp> family = randomPartialFamily(rng);
        PlacementTuple from = randomTuple(rng, rank, mesh.ndim(), family);
        PlacementTuple to;
        if (rng() % 5 != 0) {  // mostly feasible: keep from's partials or drop them
          to = randomTuple(rng, rank, mesh.ndim(), {});
          for (size_t m = 0; m < from.size(); ++m)
            if (from[m].isPartial() && rng() % 3 == 0) to[m] = from[m];
        } else {  // anything, often impossible
          to = randomTuple(rng, rank, mesh.ndim(), {ReduceOp::kSum, ReduceOp::kMax});
        }
        auto bad = checkPair(sizes, from, to, mesh, rng() % 2 == 0, gen, stats);
        if (bad && ++failures <= 20)
          ADD_FAILURE() << pairText(sizes, from, to, mesh) << ": " << *bad;
      }
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[redistribution] " << stats.pairs << " pairs (" << stats.feasible << " feasible, "
            << stats.infeasible << " infeasible); steps executed:";
  for (const auto& [kind, n] : stats.steps)
    std::cout << " " << cost::stepKindName(kind) << " " << n;
  std::cout << "; " << secs << " s\n";
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(stats.pairs, static_cast<int>(kMeshes.size() * kShapes.size()) * kPairsPerCase);
  EXPECT_GT(stats.infeasible, 0);
  // Every step kind must have been exercised, or the property says little.
  for (cost::StepKind k :
       {cost::StepKind::kAllGather, cost::StepKind::kAllReduce, cost::StepKind::kReduceScatter,
        cost::StepKind::kLocalSlice, cost::StepKind::kAllToAll})
    EXPECT_GT(stats.steps[k], 0) << cost::stepKindName(k);
}

}  // namespace
}  // namespace apc::validator
