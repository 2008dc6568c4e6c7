//===- lib/cost/redistribute.cpp - Redistribution planning and pricing ----===//
//
// The search of apc/cost/redistribute.h. A state is one placement per mesh dim, each chosen among
// that mesh dim's options; states are numbered in mixed radix (at most kMaxSearchStates; 4 to 36
// for 2-d meshes and tensors of rank 2 to 4). Dijkstra over them, with the step costs as edge
// weights and an indexed binary heap, runs on fixed-size arrays: the cost-only path allocates
// nothing. The plan path replays the best path to build the step list.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/redistribute.h"

#include <cstdio>
#include <limits>
#include <optional>

#include "apc/support/strings.h"

namespace apc::cost {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool RedistributionStep::operator==(const RedistributionStep&) const = default;

namespace {

using mesh::Placement;
using mesh::PlacementTuple;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr size_t kMaxDims = kMaxRedistributionMeshDims;

// Checks the arguments; allocates only to build an error.
Status checkArgs(const ir::TensorMeta& global, const PlacementTuple& from, const PlacementTuple& to,
                 const mesh::DeviceMesh& mesh) {
  if (mesh.ndim() == 0) return invalidArgument("redistribution on an empty device mesh");
  if (mesh.ndim() > kMaxDims)
    return unsupported("redistribution on a " + std::to_string(mesh.ndim()) + "-d mesh (at most " +
                       std::to_string(kMaxDims) + " mesh dims)");
  if (ir::dtypeBytes(global.dtype) <= 0)
    return invalidArgument("redistribution of a tensor of unknown dtype " + ir::toString(global));
  for (const ir::Dim& d : global.shape)
    if (d.size < 0) return invalidArgument("negative size in " + ir::toString(global));
  APC_RETURN_IF_ERROR(mesh::checkPlacementTuple(from, global.rank(), mesh.ndim()));
  APC_RETURN_IF_ERROR(mesh::checkPlacementTuple(to, global.rank(), mesh.ndim()));
  return Status::success();
}

// Two Partial mesh dims can be reduced one after the other only if the order does not matter: the
// same op, or sum and avg (both linear). max of sums is not a sum of maxes.
bool commute(mesh::ReduceOp a, mesh::ReduceOp b) {
  auto linear = [](mesh::ReduceOp op) {
    return op == mesh::ReduceOp::kSum || op == mesh::ReduceOp::kAvg;
  };
  return a == b || (linear(a) && linear(b));
}

// Whether from -> to is impossible; the reason goes to `reason` when given (only then allocates).
//  - a Partial target must already be that Partial: nothing turns data into summands;
//  - two Partial mesh dims whose ops do not commute cannot be reduced (either one) at all.
bool impossible(const PlacementTuple& from, const PlacementTuple& to, std::string* reason) {
  for (size_t m = 0; m < to.size(); ++m) {
    if (!to[m].isPartial() || from[m] == to[m]) continue;
    if (reason) {
      *reason = "mesh dim " + std::to_string(m) + ": ";
      if (from[m].isPartial())
        *reason += std::string("a partial ") + reduceOpName(from[m].reduceOp()) +
                   " cannot become a partial " + reduceOpName(to[m].reduceOp());
      else
        *reason += "a " + from[m].toString() + " value cannot become partial";
    }
    return true;
  }
  for (size_t a = 0; a < from.size(); ++a) {
    if (!from[a].isPartial()) continue;
    for (size_t b = a + 1; b < from.size(); ++b) {
      if (!from[b].isPartial() || commute(from[a].reduceOp(), from[b].reduceOp())) continue;
      if (from[a] == to[a] && from[b] == to[b]) continue;  // neither is reduced
      if (reason)
        *reason = "mesh dims " + std::to_string(a) + " and " + std::to_string(b) + " hold a " +
                  from[a].toString() + " and a " + from[b].toString() +
                  " value, which cannot be reduced in either order";
      return true;
    }
  }
  return false;
}

// One step between two placements of a mesh dim, before the nesting check.
/// The model prices this mesh: one set of links per mesh dim.
Status checkModel(const mesh::DeviceMesh& mesh, const CostModel& model) {
  if (model.ndim() != mesh.ndim())
    return invalidArgument("the cost model has " + std::to_string(model.ndim()) +
                           " mesh dims but the mesh " + mesh.toString() + " has " +
                           std::to_string(mesh.ndim()));
  return Status::success();
}

struct Move {
  bool possible = false;
  StepKind kind = StepKind::kAllGather;
  int gather_dim = -1;
  int shard_dim = -1;
  mesh::ReduceOp op = mesh::ReduceOp::kSum;
};

Move classify(const Placement& cur, const Placement& next) {
  Move mv;
  if (cur == next || next.isPartial()) return mv;
  mv.possible = true;
  if (cur.isShard()) {
    mv.gather_dim = cur.dim();
    if (next.isReplicate()) {
      mv.kind = StepKind::kAllGather;
    } else {
      mv.kind = StepKind::kAllToAll;
      mv.shard_dim = next.dim();
    }
  } else if (cur.isReplicate()) {  // next is a shard
    mv.kind = StepKind::kLocalSlice;
    mv.shard_dim = next.dim();
  } else {  // partial
    mv.op = cur.reduceOp();
    if (next.isReplicate()) {
      mv.kind = StepKind::kAllReduce;
    } else {
      mv.kind = StepKind::kReduceScatter;
      mv.shard_dim = next.dim();
    }
  }
  return mv;
}

struct StepPrice {
  double full_bytes = 0;
  double forward_us = 0;
  double backward_us = 0;
};

// The search state space and Dijkstra over it. Fixed-size arrays only.
//
// Options of mesh dim m: from[m] first, then to[m], R and S(d) for every tensor dim d (a Partial
// target admits only from[m], which equals it). The extra shards let a plan move a split out of
// the way with a cheap all-to-all instead of gathering it: [R, S(0)] -> [S(0), S(0)] on [2, 4] is
// all-to-all(mesh 1, 0->1), local-slice(mesh 0, 0), all-to-all(mesh 1, 1->0). When the product of
// the option counts exceeds kMaxStates, the options shrink to {from[m], to[m], R}: at most
// 3^6 = 729 states.
class Search {
 public:
  Search(const ir::TensorMeta& global, const PlacementTuple& from, const PlacementTuple& to,
         const mesh::DeviceMesh& mesh, const CostModel& model)
      : global_(global), mesh_(mesh), model_(model), ndim_(mesh.ndim()) {
    grad_ = global.requires_grad;
    elem_bytes_ = ir::dtypeBytes(global.dtype);
    int rank = static_cast<int>(global.shape.size());
    full_options_ = rank + 3 <= kMaxOptions && build(from, to, rank);
    if (!full_options_) build(from, to, -1);
  }

  // Whether every shard option is in the space (see build()).
  bool fullOptions() const { return full_options_; }

  // Dijkstra from state 0 to every state (no goal): then costTo() reads any target in the space.
  void runAll() {
    goal_ = -1;
    run();
  }

  // The cost to `to` after runAll(); false when `to` is not a state of this space or unreachable.
  bool costTo(const PlacementTuple& to, RedistCost* out) const {
    int s = 0;
    for (size_t m = 0; m < ndim_; ++m) {
      int k = -1;
      for (int i = 0; i < nopt_[m] && k < 0; ++i)
        if (*opts_[m][i] == to[m]) k = i;
      if (k < 0) return false;
      s += k * stride_[m];
    }
    if (!(dist_[s] < kInf)) return false;
    out->forward_us = fwd_[s];
    out->backward_us = bwd_[s];
    out->num_steps = steps_[s];
    return true;
  }

  // Runs Dijkstra from state 0 (= from) to the goal (= to). False if the goal is unreachable.
  bool run() {
    for (int s = 0; s < nstates_; ++s) {
      dist_[s] = kInf;
      done_[s] = false;
      heap_pos_[s] = -1;
    }
    dist_[0] = 0;
    fwd_[0] = bwd_[0] = 0;
    steps_[0] = 0;
    prev_[0] = -1;
    heap_size_ = 0;
    push(0);
    const Placement* pl[kMaxDims];
    int k[kMaxDims];
    while (heap_size_ > 0) {
      int best = pop();
      if (best == goal_) return true;
      done_[best] = true;
      decode(best, k, pl);
      // Inner mesh dims first; on equal cost and steps the first path found stays.
      for (size_t m = ndim_; m-- > 0;) {
        for (int k2 = 0; k2 < nopt_[m]; ++k2) {
          if (k2 == k[m]) continue;
          int s2 = best + (k2 - k[m]) * stride_[m];
          if (done_[s2]) continue;
          Move mv = classify(*pl[m], *opts_[m][k2]);
          if (!mv.possible || !innermost(pl, m, mv)) continue;
          StepPrice price = priceStep(pl, m, mv);
          double cand = dist_[best] + price.forward_us + price.backward_us;
          int cand_steps = steps_[best] + 1;
          if (cand < dist_[s2] || (cand == dist_[s2] && cand_steps < steps_[s2])) {
            dist_[s2] = cand;
            fwd_[s2] = fwd_[best] + price.forward_us;
            bwd_[s2] = bwd_[best] + price.backward_us;
            steps_[s2] = cand_steps;
            prev_[s2] = static_cast<int16_t>(best);
            prev_dim_[s2] = static_cast<uint8_t>(m);
            push(s2);
          }
        }
      }
    }
    return false;
  }

  RedistCost cost() const {
    RedistCost c;
    c.forward_us = fwd_[goal_];
    c.backward_us = bwd_[goal_];
    c.num_steps = steps_[goal_];
    return c;
  }

  // Replays the best path into steps (after a successful run()).
  std::vector<RedistributionStep> steps() const {
    int n = steps_[goal_];
    std::vector<int> path(static_cast<size_t>(n) + 1);
    int s = goal_;
    for (int i = n; i >= 0; --i) {
      path[static_cast<size_t>(i)] = s;
      s = prev_[s];
    }
    std::vector<RedistributionStep> out;
    out.reserve(static_cast<size_t>(n));
    const Placement* pl[kMaxDims];
    const Placement* pl2[kMaxDims];
    int k[kMaxDims];
    int k2[kMaxDims];
    for (int i = 0; i < n; ++i) {
      int a = path[static_cast<size_t>(i)];
      int b = path[static_cast<size_t>(i) + 1];
      decode(a, k, pl);
      decode(b, k2, pl2);
      size_t m = prev_dim_[b];
      Move mv = classify(*pl[m], *pl2[m]);
      StepPrice price = priceStep(pl, m, mv);
      RedistributionStep st;
      st.kind = mv.kind;
      st.mesh_dim = m;
      st.group_size = mesh_.size(m);
      st.gather_dim = mv.gather_dim;
      st.shard_dim = mv.shard_dim;
      st.reduce_op = mv.op;
      for (size_t j = 0; j < ndim_; ++j) {
        st.before.push_back(*pl[j]);
        st.after.push_back(*pl2[j]);
      }
      st.full_bytes = static_cast<int64_t>(price.full_bytes);
      st.forward_us = price.forward_us;
      st.backward_us = price.backward_us;
      out.push_back(std::move(st));
    }
    return out;
  }

 private:
  static constexpr int kMaxStates = kMaxSearchStates;
  static constexpr int kMaxOptions = 16;

  // Fills the options (all shard dims below `shard_dims`; none when negative) and the mixed-radix
  // numbering. False when the state count would exceed kMaxStates.
  bool build(const PlacementTuple& from, const PlacementTuple& to, int shard_dims) {
    int stride = 1;
    goal_ = 0;
    for (size_t m = 0; m < ndim_; ++m) {
      int n = 0;
      auto add = [&](const Placement& p) {
        for (int i = 0; i < n; ++i)
          if (*opts_[m][i] == p) return;
        opts_[m][n++] = p;
      };
      // from[m], R, the shards, then to[m] when it is none of those (a Partial target, or a shard
      // beyond the options): every target without such entries sees the same numbered space, so
      // one search from `from` prices them all (redistributionCosts).
      add(from[m]);
      if (!to[m].isPartial()) {
        add(Placement::replicate());
        for (int d = 0; d < shard_dims; ++d) add(Placement::shard(d));
      }
      add(to[m]);
      nopt_[m] = n;
      stride_[m] = stride;
      for (int i = 0; i < n; ++i)
        if (*opts_[m][i] == to[m]) goal_ += i * stride;
      if (stride > kMaxStates / n) return false;
      stride *= n;
    }
    nstates_ = stride;
    return true;
  }

  void decode(int s, int* k, const Placement** pl) const {
    for (size_t m = 0; m < ndim_; ++m) {
      k[m] = (s / stride_[m]) % nopt_[m];
      pl[m] = &*opts_[m][k[m]];
    }
  }

  // The nesting rule: no mesh dim after m may shard a tensor dim the move splits or unsplits.
  bool innermost(const Placement* const* pl, size_t m, const Move& mv) const {
    for (size_t j = m + 1; j < ndim_; ++j) {
      if (!pl[j]->isShard()) continue;
      int d = pl[j]->dim();
      if (d == mv.gather_dim || d == mv.shard_dim) return false;
    }
    return true;
  }

  // Bytes of the state with mesh dim m's split undone, and the step's forward/backward cost.
  StepPrice priceStep(const Placement* const* pl, size_t m, const Move& mv) const {
    double n = elem_bytes_;
    for (size_t d = 0; d < global_.shape.size(); ++d) {
      int64_t f = 1;
      for (size_t j = 0; j < ndim_; ++j)
        if (j != m && pl[j]->isShard(static_cast<int>(d))) f *= mesh_.size(j);
      n *= static_cast<double>((global_.shape[d].size + f - 1) / f);
    }
    int64_t p = mesh_.size(m);
    StepPrice out;
    out.full_bytes = n;
    out.forward_us = model_.collectiveUs(forwardCollective(mv.kind), m, p, n) +
                     localWorkUs(mv.kind, mv.gather_dim, mv.shard_dim, n, p);
    if (grad_) {
      // The backward step: a gather's is a reduce-scatter along its dim, a slice's and a
      // reduce-scatter's an all-gather along theirs (an all-reduce's passes the gradient on).
      double local = 0;
      if (mv.kind == StepKind::kAllGather)
        local = localWorkUs(StepKind::kReduceScatter, -1, mv.gather_dim, n, p);
      else if (mv.kind == StepKind::kLocalSlice || mv.kind == StepKind::kReduceScatter)
        local = localWorkUs(StepKind::kAllGather, mv.shard_dim, -1, n, p);
      out.backward_us = model_.collectiveUs(backwardCollective(mv.kind), m, p, n) + local;
    }
    return out;
  }

  // The local copies a step of `kind` makes on a state of `n` bytes (the tensor with the step's
  // mesh dim unsplit) beyond those of the collective calls apc calibrate times, which gather and
  // scatter along dim 0 (lib/runtime's runStep and C10dCommunicator):
  //  - an all-reduce reduces a clone of its input (n);
  //  - a local slice makes its piece contiguous (n/p);
  //  - an all-gather along another dim moves that dim to the front (n/p), then back (n);
  //  - a reduce-scatter along another dim moves its piece's dim back into place (n/p);
  //  - an all-to-all's packing is in its calibrated time.
  double localWorkUs(StepKind kind, int gather_dim, int shard_dim, double n, int64_t p) const {
    const double piece = n / static_cast<double>(p);
    switch (kind) {
      case StepKind::kAllReduce:
        return model_.localCopyUs(n);
      case StepKind::kLocalSlice:
        return model_.localCopyUs(piece);
      case StepKind::kAllGather:
        return gather_dim == 0 ? 0.0 : model_.localCopyUs(piece) + model_.localCopyUs(n);
      case StepKind::kReduceScatter:
        return shard_dim == 0 ? 0.0 : model_.localCopyUs(piece);
      case StepKind::kAllToAll:
        return 0.0;
    }
    return 0.0;
  }

  // Indexed binary min-heap of states keyed by (dist, steps, state): deterministic order.
  bool less(int a, int b) const {
    if (dist_[a] != dist_[b]) return dist_[a] < dist_[b];
    if (steps_[a] != steps_[b]) return steps_[a] < steps_[b];
    return a < b;
  }
  void place(int i, int s) {
    heap_[i] = s;
    heap_pos_[s] = i;
  }
  void siftUp(int i) {
    int s = heap_[i];
    while (i > 0 && less(s, heap_[(i - 1) / 2])) {
      place(i, heap_[(i - 1) / 2]);
      i = (i - 1) / 2;
    }
    place(i, s);
  }
  void siftDown(int i) {
    int s = heap_[i];
    for (;;) {
      int c = 2 * i + 1;
      if (c >= heap_size_) break;
      if (c + 1 < heap_size_ && less(heap_[c + 1], heap_[c])) ++c;
      if (!less(heap_[c], s)) break;
      place(i, heap_[c]);
      i = c;
    }
    place(i, s);
  }
  // Inserts s, or moves it up after its key decreased.
  void push(int s) {
    if (heap_pos_[s] < 0) {
      place(heap_size_++, s);
    }
    siftUp(heap_pos_[s]);
  }
  int pop() {
    int top = heap_[0];
    heap_pos_[top] = -1;
    if (--heap_size_ > 0) {
      place(0, heap_[heap_size_]);
      siftDown(0);
    }
    return top;
  }

  const ir::TensorMeta& global_;
  const mesh::DeviceMesh& mesh_;
  const CostModel& model_;
  size_t ndim_;
  bool grad_ = false;
  int elem_bytes_ = 0;
  std::optional<Placement> opts_[kMaxDims][kMaxOptions];
  int nopt_[kMaxDims] = {};
  int stride_[kMaxDims] = {};
  int nstates_ = 1;
  int goal_ = 0;
  bool full_options_ = false;
  int heap_size_ = 0;
  double dist_[kMaxStates];
  double fwd_[kMaxStates];
  double bwd_[kMaxStates];
  int steps_[kMaxStates];
  int16_t prev_[kMaxStates];
  uint8_t prev_dim_[kMaxStates];
  bool done_[kMaxStates];
  int heap_[kMaxStates];
  int heap_pos_[kMaxStates];
};

std::string fmtUs(double us) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g us", us);
  return buf;
}

}  // namespace

CollectiveKind forwardCollective(StepKind kind) {
  switch (kind) {
    case StepKind::kAllGather:
      return CollectiveKind::kAllGather;
    case StepKind::kAllReduce:
      return CollectiveKind::kAllReduce;
    case StepKind::kReduceScatter:
      return CollectiveKind::kReduceScatter;
    case StepKind::kLocalSlice:
      return CollectiveKind::kNone;
    case StepKind::kAllToAll:
      return CollectiveKind::kAllToAll;
  }
  return CollectiveKind::kNone;
}

CollectiveKind backwardCollective(StepKind kind) {
  switch (kind) {
    case StepKind::kAllGather:
      return CollectiveKind::kReduceScatter;
    case StepKind::kAllReduce:
      return CollectiveKind::kNone;
    case StepKind::kReduceScatter:
      return CollectiveKind::kAllGather;
    case StepKind::kLocalSlice:
      return CollectiveKind::kAllGather;
    case StepKind::kAllToAll:
      return CollectiveKind::kAllToAll;
  }
  return CollectiveKind::kNone;
}

double RedistributionPlan::totalUs() const {
  return feasible ? forward_us + backward_us : kInf;
}

double RedistCost::totalUs() const {
  return feasible ? forward_us + backward_us : kInf;
}

Expected<RedistributionPlan> planRedistribution(const ir::TensorMeta& global,
                                                const PlacementTuple& from,
                                                const PlacementTuple& to,
                                                const mesh::DeviceMesh& mesh) {
  return planRedistribution(global, from, to, mesh, CostModel(DeviceSpec{}, mesh));
}

Expected<RedistributionPlan> planRedistribution(const ir::TensorMeta& global,
                                                const PlacementTuple& from,
                                                const PlacementTuple& to,
                                                const mesh::DeviceMesh& mesh,
                                                const CostModel& model) {
  APC_RETURN_IF_ERROR(checkArgs(global, from, to, mesh));
  RedistributionPlan plan;
  plan.from = from;
  plan.to = to;
  plan.prices_backward = global.requires_grad;
  if (impossible(from, to, &plan.infeasible_reason)) {
    plan.feasible = false;
    return plan;
  }
  if (from == to) return plan;
  APC_RETURN_IF_ERROR(checkModel(mesh, model));
  Search search(global, from, to, mesh, model);
  if (!search.run())
    return internalError("no redistribution found from " + mesh::toString(from) + " to " +
                         mesh::toString(to));
  plan.steps = search.steps();
  RedistCost c = search.cost();
  plan.forward_us = c.forward_us;
  plan.backward_us = c.backward_us;
  return plan;
}

Expected<RedistCost> redistributionCost(const ir::TensorMeta& global, const PlacementTuple& from,
                                        const PlacementTuple& to, const mesh::DeviceMesh& mesh) {
  return redistributionCost(global, from, to, mesh, CostModel(DeviceSpec{}, mesh));
}

Expected<RedistCost> redistributionCost(const ir::TensorMeta& global, const PlacementTuple& from,
                                        const PlacementTuple& to, const mesh::DeviceMesh& mesh,
                                        const CostModel& model) {
  APC_RETURN_IF_ERROR(checkArgs(global, from, to, mesh));
  RedistCost c;
  if (impossible(from, to, nullptr)) {
    c.feasible = false;
    return c;
  }
  if (from == to) return c;
  APC_RETURN_IF_ERROR(checkModel(mesh, model));
  Search search(global, from, to, mesh, model);
  if (!search.run())
    return internalError("no redistribution found from " + mesh::toString(from) + " to " +
                         mesh::toString(to));
  return search.cost();
}

Expected<std::vector<RedistCost>> redistributionCosts(const ir::TensorMeta& global,
                                                      const PlacementTuple& from,
                                                      const std::vector<PlacementTuple>& tos,
                                                      const mesh::DeviceMesh& mesh) {
  return redistributionCosts(global, from, tos, mesh, CostModel(DeviceSpec{}, mesh));
}

Expected<std::vector<RedistCost>> redistributionCosts(const ir::TensorMeta& global,
                                                      const PlacementTuple& from,
                                                      const std::vector<PlacementTuple>& tos,
                                                      const mesh::DeviceMesh& mesh,
                                                      const CostModel& model) {
  APC_RETURN_IF_ERROR(checkModel(mesh, model));
  std::vector<RedistCost> out(tos.size());
  std::optional<Search> all;  // one search from `from` over the shared space, made on first use
  for (size_t i = 0; i < tos.size(); ++i) {
    const PlacementTuple& to = tos[i];
    APC_RETURN_IF_ERROR(checkArgs(global, from, to, mesh));
    if (impossible(from, to, nullptr)) {
      out[i].feasible = false;
      continue;
    }
    if (from == to) continue;
    bool partial = false;
    for (const Placement& p : to) partial = partial || p.isPartial();
    if (!partial) {
      if (!all) {
        all.emplace(global, from, mesh::replicated(mesh.ndim()), mesh, model);
        if (all->fullOptions()) all->runAll();
      }
      // The target's own search would see this very space, numbered alike (Search::build), and
      // stop where runAll() finalized the target: the same costs, bit for bit.
      if (all->fullOptions() && all->costTo(to, &out[i])) continue;
    }
    APC_ASSIGN_OR_RETURN(out[i], redistributionCost(global, from, to, mesh, model));
  }
  return out;
}

double redistributionCostUs(const ir::TensorMeta& global, const PlacementTuple& from,
                            const PlacementTuple& to, const mesh::DeviceMesh& mesh) {
  Expected<RedistCost> c = redistributionCost(global, from, to, mesh);
  return c.ok() ? c->totalUs() : kInf;
}

std::string describe(const RedistributionStep& step) {
  std::string s = std::string(stepKindName(step.kind)) + "(mesh " + std::to_string(step.mesh_dim);
  switch (step.kind) {
    case StepKind::kAllGather:
      s += ", dim " + std::to_string(step.gather_dim);
      break;
    case StepKind::kLocalSlice:
      s += ", dim " + std::to_string(step.shard_dim);
      break;
    case StepKind::kAllReduce:
      s += std::string(", ") + mesh::reduceOpName(step.reduce_op);
      break;
    case StepKind::kReduceScatter:
      s += ", dim " + std::to_string(step.shard_dim) + ", " + mesh::reduceOpName(step.reduce_op);
      break;
    case StepKind::kAllToAll:
      s += ", dim " + std::to_string(step.gather_dim) + "->" + std::to_string(step.shard_dim);
      break;
  }
  return s + ", " + humanBytes(static_cast<double>(step.full_bytes)) + ")";
}

std::string describe(const RedistributionPlan& plan, bool with_cost) {
  std::string s = mesh::toCompactString(plan.from) + " -> " + mesh::toCompactString(plan.to) + ": ";
  if (!plan.feasible) return s + "impossible (" + plan.infeasible_reason + ")";
  if (plan.steps.empty())
    s += "no-op";
  else
    s += joinMap(plan.steps, "; ", [](const RedistributionStep& st) { return describe(st); });
  if (with_cost) s += " [fwd " + fmtUs(plan.forward_us) + ", bwd " + fmtUs(plan.backward_us) + "]";
  return s;
}

}  // namespace apc::cost
