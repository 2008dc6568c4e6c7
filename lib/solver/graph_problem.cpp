//===- lib/solver/graph_problem.cpp - From a graph to a solver Problem -----===//
#include "apc/solver/graph_problem.h"

#include <cmath>
#include <map>
#include <unordered_map>

#include "apc/cost/compute.h"
#include "apc/cost/redistribute.h"

namespace apc::solver {

using mesh::Placement;
using mesh::PlacementTuple;

std::vector<PlacementTuple> leafPlacements(const ir::TensorMeta& t, const mesh::DeviceMesh& m) {
  std::vector<Placement> options = {Placement::replicate()};
  for (int d = 0; d < static_cast<int>(t.rank()); ++d) options.push_back(Placement::shard(d));
  std::vector<PlacementTuple> out;
  PlacementTuple cur(m.ndim(), Placement::replicate());
  std::vector<size_t> idx(m.ndim(), 0);
  while (true) {
    for (size_t d = 0; d < m.ndim(); ++d) cur[d] = options[idx[d]];
    bool ok = true;
    for (int d = 0; d < static_cast<int>(t.rank()) && ok; ++d)
      ok = mesh::shardFactor(cur, m.shape(), d) <= t.shape[d].size;
    if (ok) out.push_back(cur);
    size_t k = m.ndim();
    while (k-- > 0) {
      if (++idx[k] < options.size()) break;
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) break;
  }
  return out;
}

PlacementTuple gradientPlacement(const strategy::Strategy& s, size_t input) {
  const PlacementTuple& in = *s.inputs.at(input);
  PlacementTuple g = in;
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d].isPartial()) {
      g[d] = Placement::replicate();
      continue;
    }
    if (!in[d].isReplicate()) continue;
    bool sharded_here = false;
    for (const auto& o : s.outputs)
      if (o && !(*o)[d].isReplicate()) sharded_here = true;
    for (size_t j = 0; j < s.inputs.size(); ++j)
      if (j != input && s.inputs[j] && !(*s.inputs[j])[d].isReplicate()) sharded_here = true;
    if (sharded_here) g[d] = Placement::partial();
  }
  return g;
}

namespace {

PlacementTuple partialAsReplicate(PlacementTuple t) {
  for (auto& p : t)
    if (p.isPartial()) p = Placement::replicate();
  return t;
}

/// Memoized edge pricing: repeated layers ask the same questions.
class EdgePricer {
 public:
  explicit EdgePricer(const mesh::DeviceMesh& m) : mesh_(m) {}

  /// Forward redistribution from -> to, plus the gradient's way back when `grad` is set, plus the
  /// forward redistribution once more when `regather` is set (see buildGraphProblem).
  double price(const ir::TensorMeta& t, const PlacementTuple& from, const PlacementTuple& to,
               const PlacementTuple* grad, bool regather = false) {
    std::string key = ir::toString(t) + (t.requires_grad ? "g" : "") + "|" + mesh::toString(from) +
                      "|" + mesh::toString(to) + "|" + (grad ? mesh::toString(*grad) : "-") +
                      (regather ? "|r" : "");
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    double total = forward(t, from, to);
    if (regather) total *= 2;
    if (grad && std::isfinite(total)) total += forward(t, *grad, partialAsReplicate(from));
    memo_.emplace(std::move(key), total);
    return total;
  }

 private:
  double forward(const ir::TensorMeta& t, const PlacementTuple& from, const PlacementTuple& to) {
    auto c = cost::redistributionCost(t, from, to, mesh_);
    if (!c.ok() || !c->feasible) return kInfinity;
    return c->forward_us;
  }

  const mesh::DeviceMesh& mesh_;
  std::unordered_map<std::string, double> memo_;
};

strategy::Strategy leafStrategy(const PlacementTuple& t) {
  strategy::Strategy s;
  s.outputs = {t};
  return s;
}

}  // namespace

Expected<GraphProblem> buildGraphProblem(const ir::Graph& g,
                                         const std::vector<strategy::NodeStrategies>& strategies,
                                         const mesh::Spec& spec) {
  const mesh::DeviceMesh& m = spec.mesh;
  GraphProblem gp;
  std::map<uint32_t, uint32_t> problem_of;  // graph node -> problem node
  std::map<uint32_t, const strategy::NodeStrategies*> op_strategies;
  for (const auto& ns : strategies) op_strategies[ns.node.v] = &ns;

  // Nodes.
  for (const ir::Node& n : g.nodes()) {
    ProblemNode pn;
    pn.name = n.name.empty() ? n.qualifiedOp() + " #" + std::to_string(n.id.v) : n.name;
    std::vector<strategy::Strategy> strats;
    if (n.kind == ir::NodeKind::kOp) {
      auto it = op_strategies.find(n.id.v);
      if (it == op_strategies.end() || it->second->strategies.empty()) continue;
      strats = it->second->strategies;
      for (const auto& s : strats) pn.costs.push_back(s.compute_us);
    } else {
      const ir::Value& v = g.value(n.outputs.at(0));
      if (!v.tensor) continue;
      for (const PlacementTuple& t : leafPlacements(*v.tensor, m)) {
        strats.push_back(leafStrategy(t));
        pn.costs.push_back(0.0);
        if (n.kind == ir::NodeKind::kParameter)
          pn.memory.push_back(cost::localNumel(*v.tensor, t, m) * ir::dtypeBytes(v.tensor->dtype));
      }
      if (n.kind == ir::NodeKind::kParameter)
        gp.total_param_bytes += static_cast<double>(v.tensor->bytes());
      if (n.kind == ir::NodeKind::kInput) {
        PlacementTuple want = mesh::replicated(m.ndim());
        if (auto it = spec.inputs.find(n.name); it != spec.inputs.end()) want = it->second;
        for (size_t i = 0; i < strats.size(); ++i)
          if (*strats[i].outputs[0] == want) pn.pinned = static_cast<uint32_t>(i);
        if (!pn.pinned)
          return invalidArgument("input '" + n.name + "' cannot be placed " + mesh::toString(want) +
                                 " on mesh " + m.toString() + " (a dim is smaller than the mesh)");
        pn.pin_group = "inputs";
      }
    }
    problem_of[n.id.v] = static_cast<uint32_t>(gp.problem.nodes.size());
    gp.problem.nodes.push_back(std::move(pn));
    gp.graph_nodes.push_back(n.id);
    gp.module_paths.push_back(n.module_path);
    gp.strategies.push_back(std::move(strats));
  }

  // Edges.
  EdgePricer pricer(m);
  for (const ir::Node& n : g.nodes()) {
    auto dst_it = problem_of.find(n.id.v);
    if (dst_it == problem_of.end() || n.kind != ir::NodeKind::kOp) continue;
    uint32_t dst = dst_it->second;
    const auto& dst_strats = gp.strategies[dst];
    for (uint32_t i = 0; i < n.inputs.size(); ++i) {
      const ir::Value& v = g.value(n.inputs[i]);
      if (!v.producer.valid()) continue;
      auto src_it = problem_of.find(v.producer.v);
      if (src_it == problem_of.end()) continue;
      if (!dst_strats[0].inputs.at(i)) continue;  // not a tensor input of the rule
      std::vector<const ir::TensorMeta*> metas;
      if (v.tensor) metas.push_back(&*v.tensor);
      for (const auto& e : v.elements) metas.push_back(&e);
      if (metas.empty()) continue;
      uint32_t src = src_it->second;
      const auto& src_strats = gp.strategies[src];
      // A parameter's redistributed copy is not kept from forward to backward (that would undo the
      // memory saving of sharding it): backward redistributes it again, as FSDP re-gathers.
      bool regather = g.node(v.producer).kind == ir::NodeKind::kParameter;
      ProblemEdge e;
      e.src = src;
      e.dst = dst;
      for (const auto& s : src_strats) {
        const auto& from = s.outputs.at(v.producer_output);
        for (const auto& t : dst_strats) {
          double c = 0;
          if (!from || !t.inputs[i]) {
            c = kInfinity;
          } else {
            PlacementTuple grad = gradientPlacement(t, i);
            for (const ir::TensorMeta* meta : metas)
              c += pricer.price(*meta, *from, *t.inputs[i], meta->requires_grad ? &grad : nullptr,
                                regather && meta->requires_grad);
          }
          e.costs.push_back(c);
        }
      }
      gp.problem.edges.push_back(std::move(e));
      gp.edge_input.push_back(i);
    }
  }

  // Output sinks.
  std::vector<std::pair<ir::ValueId, PlacementTuple>> constrained;
  std::function<Status(const ir::OutputTree&, const mesh::OutputPlacementTree&)> walk =
      [&](const ir::OutputTree& gt, const mesh::OutputPlacementTree& st) -> Status {
    using K = mesh::OutputPlacementTree::Kind;
    if (st.kind == K::kFree) return Status::success();
    if (st.kind == K::kLeaf) {
      if (gt.kind != ir::OutputTree::Kind::kLeaf)
        return invalidArgument("output placement given for a structured output");
      constrained.emplace_back(gt.leaf, st.placements);
      return Status::success();
    }
    if (st.kind == K::kSequence) {
      if (gt.children.size() != st.children.size())
        return invalidArgument("output structure mismatch");
      for (size_t i = 0; i < st.children.size(); ++i)
        APC_RETURN_IF_ERROR(walk(gt.children[i], st.children[i]));
      return Status::success();
    }
    for (size_t i = 0; i < st.keys.size(); ++i) {
      size_t k = 0;
      while (k < gt.keys.size() && gt.keys[k] != st.keys[i]) ++k;
      if (k == gt.keys.size()) return invalidArgument("output has no key '" + st.keys[i] + "'");
      APC_RETURN_IF_ERROR(walk(gt.children[k], st.children[i]));
    }
    return Status::success();
  };
  APC_RETURN_IF_ERROR(walk(g.outputs(), spec.outputs));
  for (const auto& [vid, want] : constrained) {
    const ir::Value& v = g.value(vid);
    auto src_it = problem_of.find(v.producer.v);
    if (!v.tensor || src_it == problem_of.end()) continue;
    ProblemNode sink;
    sink.name = "output %" + v.debug_name;
    sink.costs = {0.0};
    sink.pinned = 0;
    sink.pin_group = "outputs";
    uint32_t dst = static_cast<uint32_t>(gp.problem.nodes.size());
    ProblemEdge e;
    e.src = src_it->second;
    e.dst = dst;
    PlacementTuple grad = partialAsReplicate(want);
    for (const auto& s : gp.strategies[e.src]) {
      const auto& from = s.outputs.at(v.producer_output);
      e.costs.push_back(
          from ? pricer.price(*v.tensor, *from, want, v.tensor->requires_grad ? &grad : nullptr)
               : kInfinity);
    }
    gp.problem.nodes.push_back(std::move(sink));
    gp.graph_nodes.emplace_back();
    gp.module_paths.emplace_back();
    gp.strategies.push_back({leafStrategy(want)});
    gp.problem.edges.push_back(std::move(e));
    gp.edge_input.push_back(0);
  }

  // (e) parameter memory.
  double high = spec.memory_budget.high.value_or(1.0 / static_cast<double>(m.worldSize()));
  if (gp.total_param_bytes > 0)
    gp.problem.memory =
        MemoryBound{spec.memory_budget.low * gp.total_param_bytes, high * gp.total_param_bytes};
  APC_RETURN_IF_ERROR(gp.problem.validate());
  return gp;
}

}  // namespace apc::solver
