//===- lib/solver/graph_problem.cpp - From a graph to a solver Problem -----===//
#include "apc/solver/graph_problem.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "apc/cost/compute.h"
#include "apc/cost/cost_model.h"
#include "apc/cost/edge.h"
#include "apc/cost/redistribute.h"
#include "apc/support/hash.h"
#include "apc/support/parallel.h"

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
    for (int d = 0; d < static_cast<int>(t.rank()) && ok; ++d) {
      // An uncut dim always fits, even one of size 0 (an empty buffer: transformers' empty
      // key/value caches); a cut one needs a piece per rank.
      const int64_t factor = mesh::shardFactor(cur, m.shape(), d);
      ok = factor == 1 || factor <= t.shape[d].size;
    }
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
  return cost::gradientPlacement(in, cost::opSplit(s.inputs, s.outputs, in.size()));
}

namespace {

/// Hash of a vector of ids (keys of the class-cost memo in buildGraphProblem).
struct IdsHash {
  size_t operator()(const std::vector<uint32_t>& ids) const {
    uint64_t h = ids.size();
    for (uint32_t id : ids) h = (h ^ id) * 0x100000001b3ULL;  // FNV-1a over 32-bit words
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

/// Memoized edge pricing: repeated layers ask the same questions. The memo is keyed by interned
/// ids of the tensor metadata and placement tuples in a hash map: building a string key per call
/// (the first version) cost more than the pricing it saved.
class EdgePricer {
 public:
  EdgePricer(const mesh::DeviceMesh& m, const cost::CostModel& model) : mesh_(m), model_(model) {}

  const cost::CostModel& model() const { return model_; }

  /// Forward redistribution from -> to, plus the gradient's way back when `grad` is set, plus the
  /// forward redistribution once more when `regather` is set (see buildGraphProblem).
  double price(const ir::TensorMeta& t, const PlacementTuple& from, const PlacementTuple& to,
               const PlacementTuple* grad, bool regather = false) {
    Key key{metaId(t), tupleId(from), tupleId(to), grad ? tupleId(*grad) + 1 : 0, regather};
    auto it = memo_.find(key);
    if (it != memo_.end()) return it->second;
    double total = forward(key.meta, t, key.from, from, key.to, to);
    if (regather) total *= 2;
    if (grad && std::isfinite(total)) {
      PlacementTuple back = cost::partialAsReplicate(from);
      total += forward(key.meta, t, key.grad - 1, *grad, tupleId(back), back);
    }
    memo_.emplace(key, total);
    return total;
  }

  /// The forward costs from `from` to each of `tos` (`to_ids`: their tupleId), memoized per
  /// (tensor, source, target list), priced with one search (cost::redistributionCosts): the values
  /// forward() gives, bit for bit.
  const std::vector<double>& row(const ir::TensorMeta& t, const PlacementTuple& from,
                                 const std::vector<PlacementTuple>& tos,
                                 const std::vector<uint32_t>& to_ids) {
    auto [it, fresh] = rows_.try_emplace(rowKey(t, from, to_ids));
    if (fresh)
      fill(it->second, cost::redistributionCosts(t, from, tos, mesh_, model_), t, from, tos,
           to_ids);
    return it->second;
  }

  /// One row() question.
  struct RowRequest {
    const ir::TensorMeta* t;
    const PlacementTuple* from;
    const std::vector<PlacementTuple>* tos;
    const std::vector<uint32_t>* to_ids;
  };
  /// Prices the rows of `requests` that are not memoized yet, on threads (parallelFor)
  /// (each row is one cost::redistributionCosts search, a pure function: on meshes of 4 dims a
  /// search covers thousands of states, and construction is nearly all of them). The results
  /// enter the memo in request order, so the problem does not depend on the thread count.
  /// False when `deadline` passed first (rows not started by then are left unpriced, the others
  /// kept).
  bool prefetch(const std::vector<RowRequest>& requests, const Deadline& deadline) {
    std::vector<std::vector<uint32_t>> keys;
    std::vector<const RowRequest*> missing;
    std::unordered_map<std::vector<uint32_t>, bool, IdsHash> asked;
    for (const RowRequest& r : requests) {
      std::vector<uint32_t> key = rowKey(*r.t, *r.from, *r.to_ids);
      if (rows_.count(key) || !asked.emplace(key, true).second) continue;
      keys.push_back(std::move(key));
      missing.push_back(&r);
    }
    if (missing.size() < 2) return true;  // row() prices a single one itself
    std::vector<std::optional<Expected<std::vector<cost::RedistCost>>>> priced(missing.size());
    parallelFor(missing.size(), [&](size_t j) {
      if (deadline.passed()) return;
      priced[j].emplace(cost::redistributionCosts(*missing[j]->t, *missing[j]->from,
                                                  *missing[j]->tos, mesh_, model_));
    });
    bool complete = true;
    for (size_t j = 0; j < missing.size(); ++j) {
      if (!priced[j]) {
        complete = false;
        continue;
      }
      fill(rows_[std::move(keys[j])], *priced[j], *missing[j]->t, *missing[j]->from,
           *missing[j]->tos, *missing[j]->to_ids);
    }
    return complete;
  }

  /// Dense ids of tensor metadata and placement tuples (equal values, equal ids).
  uint32_t metaId(const ir::TensorMeta& t) { return intern(metas_, t); }
  uint32_t tupleId(const PlacementTuple& t) { return intern(tuples_, t); }

 private:
  struct Key {
    uint32_t meta, from, to, grad;  // grad: interned id + 1, 0 = no gradient
    bool regather;
    bool operator==(const Key&) const = default;
  };
  static size_t mix(uint64_t x) { return static_cast<size_t>(splitmix64(x)); }
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t a = (static_cast<uint64_t>(k.meta) << 32) | k.from;
      uint64_t b = (static_cast<uint64_t>(k.to) << 33) | (static_cast<uint64_t>(k.grad) << 1) |
                   static_cast<uint64_t>(k.regather);
      return mix(a ^ mix(b));
    }
  };
  struct MetaHash {
    size_t operator()(const ir::TensorMeta& t) const {
      uint64_t h = static_cast<uint64_t>(t.dtype) * 2 + (t.requires_grad ? 1 : 0);
      for (const ir::Dim& d : t.shape)
        h = mix(h ^ static_cast<uint64_t>(d.size) ^ std::hash<std::string>{}(d.symbol));
      return mix(h);
    }
  };
  template <class Map, class K>
  static uint32_t intern(Map& ids, const K& k) {
    auto it = ids.find(k);
    if (it != ids.end()) return it->second;
    return ids.emplace(k, static_cast<uint32_t>(ids.size())).first->second;
  }

  std::vector<uint32_t> rowKey(const ir::TensorMeta& t, const PlacementTuple& from,
                               const std::vector<uint32_t>& to_ids) {
    std::vector<uint32_t> key;
    key.reserve(to_ids.size() + 2);
    key.push_back(metaId(t));
    key.push_back(tupleId(from));
    key.insert(key.end(), to_ids.begin(), to_ids.end());
    return key;
  }

  /// A row from its search's result.
  void fill(std::vector<double>& out, const Expected<std::vector<cost::RedistCost>>& c,
            const ir::TensorMeta& t, const PlacementTuple& from,
            const std::vector<PlacementTuple>& tos, const std::vector<uint32_t>& to_ids) {
    out.resize(tos.size());
    for (size_t i = 0; i < tos.size(); ++i) {
      if (c.ok())
        out[i] = (*c)[i].feasible ? (*c)[i].forward_us : kInfinity;
      else  // an argument error: forward() meets it for the guilty pair alone
        out[i] = forward(metaId(t), t, tupleId(from), from, to_ids[i], tos[i]);
    }
  }

  /// One redistribution's forward cost, memoized too: gradients and forwards share many.
  double forward(uint32_t meta, const ir::TensorMeta& t, uint32_t from_id,
                 const PlacementTuple& from, uint32_t to_id, const PlacementTuple& to) {
    Key key{meta, from_id, to_id, 0, false};
    auto it = forward_memo_.find(key);
    if (it != forward_memo_.end()) return it->second;
    auto c = cost::redistributionCost(t, from, to, mesh_, model_);
    double cost = !c.ok() || !c->feasible ? kInfinity : c->forward_us;
    forward_memo_.emplace(key, cost);
    return cost;
  }

  const mesh::DeviceMesh& mesh_;
  const cost::CostModel& model_;
  std::unordered_map<ir::TensorMeta, uint32_t, MetaHash> metas_;
  std::map<PlacementTuple, uint32_t> tuples_;
  std::unordered_map<Key, double, KeyHash> memo_;
  std::unordered_map<Key, double, KeyHash> forward_memo_;  // (meta, from, to) only
  std::unordered_map<std::vector<uint32_t>, std::vector<double>, IdsHash> rows_;  // see row()
};

strategy::Strategy leafStrategy(const PlacementTuple& t) {
  strategy::Strategy s;
  s.outputs = {t};
  return s;
}

/// A sink's "anything goes" strategy: no placement (printed as "->").
strategy::Strategy freeStrategy() {
  strategy::Strategy s;
  s.outputs = {std::nullopt};
  return s;
}

/// A pin resolved to one value of the graph.
struct ResolvedPin {
  ir::ValueId value;
  PlacementTuple placements;
};

bool inModule(const std::string& path, const std::string& module) {
  return path == module ||
         (path.size() > module.size() && path.compare(0, module.size(), module) == 0 &&
          path[module.size()] == '.');
}

/// The values spec.pins name (see the header), in pin order.
Expected<std::vector<ResolvedPin>> resolvePins(const ir::Graph& g, const spec::Spec& spec) {
  std::vector<ResolvedPin> out;
  if (spec.pins.empty()) return out;
  const std::map<std::string, ir::ValueId> names = spec::pinNames(g);
  for (size_t i = 0; i < spec.pins.size(); ++i) {
    const spec::Pin& pin = spec.pins[i];
    std::string path = "$.pins[" + std::to_string(i) + "]";
    if (pin.target == spec::Pin::Target::kNode) {
      auto it = names.find(pin.name);
      if (it == names.end() || !g.value(it->second).tensor)
        return notFound(path + ".node: spec pins node '" + pin.name +
                        "' but the model has no tensor node of that name");
      out.push_back({it->second, pin.placements});
      continue;
    }
    // A module pin: tensors produced inside the module and used outside it.
    std::vector<bool> used_outside(g.numValues(), false);
    for (const ir::Node& n : g.nodes())
      if (n.kind != ir::NodeKind::kOp || !inModule(n.module_path, pin.name))
        for (ir::ValueId v : n.inputs) used_outside[v.v] = true;
    for (ir::ValueId v : g.outputs().leaves()) used_outside[v.v] = true;
    size_t before = out.size();
    for (const ir::Node& n : g.nodes()) {
      if (n.kind != ir::NodeKind::kOp || !inModule(n.module_path, pin.name)) continue;
      for (ir::ValueId v : n.outputs) {
        const ir::Value& val = g.value(v);
        if (!val.tensor || !used_outside[v.v]) continue;
        for (size_t d = 0; d < pin.placements.size(); ++d)
          if (pin.placements[d].isShard() && pin.placements[d].dim() >= val.tensor->rank())
            return invalidArgument(
                path + ".placements[" + std::to_string(d) + "]: " + pin.placements[d].toString() +
                " is out of range for output %" + val.debug_name + " of module '" + pin.name +
                "' (" + ir::toString(*val.tensor) + ")");
        out.push_back({v, pin.placements});
      }
    }
    if (out.size() == before)
      return invalidArgument(path + ".module: module '" + pin.name +
                             "' has no tensor output to pin (no value made inside it is used "
                             "outside it)");
  }
  return out;
}

}  // namespace

namespace {

/// buildGraphProblem's state and its builders, in the order they run: nodes (one per placeable
/// graph node: strategies, compute costs, parameter memory, input pins), edges (one per tensor a
/// consumer reads from a producer, priced per placement class by apc/cost/edge.h's semantics),
/// sinks (output placements, the final reduction of Partial free outputs, pins) and the memory
/// row.
struct GraphProblemBuilder {
  GraphProblemBuilder(const ir::Graph& graph, const std::vector<strategy::NodeStrategies>& all,
                      const spec::Spec& s, const cost::CostModel& model)
      : g(graph),
        spec(s),
        m(s.mesh),
        precision(s.mixed_precision),
        pricer(s.mesh, model),
        grad_bucket_bytes(cost::gradientBucketPricingBytes(graph)) {
    for (const auto& ns : all) op_strategies[ns.node.v] = &ns;
  }

  Status addNodes();
  /// False when `deadline` passed before every edge was priced.
  bool addEdges(const Deadline& deadline);
  /// Sinks of the output leaves the spec places (constrained); the others go to free_leaves.
  Status addOutputSinks();
  void addFreeOutputSinks();
  Status addPinSinks();
  void addMemoryRow();
  /// gp.shared_reads, from the op edges addEdges made (see SharedReads).
  void addSharedReads();
  /// Appends a sink node fed by `e` (its dst is set here) with `strategies`.
  void addSink(ProblemNode sink, ProblemEdge e, strategy::StrategyList strategies);
  using Out = std::optional<PlacementTuple>;
  /// The placement classes of an edge from output `out` of a node with `src` to input `in` of one
  /// with `dst`: per strategy its class, per class its placement(s), and the classes' part of the
  /// class-cost key. Pointers into the lists, which the problem keeps.
  struct EdgeClasses {
    std::vector<uint32_t> src_class, dst_class;
    std::vector<const Out*> froms;
    std::vector<std::pair<const Out*, PlacementTuple>> tos;  // (input placement, gradient)
    // Both ends have token-local region strategies (apc/strategy/token_local.h); then per class,
    // its region variant (Strategy::region_variant; always 0 otherwise).
    bool internal = false;
    std::vector<int> from_local, to_local;
    // The classes' placements as tuple ids, interned (class_key_ids): part of the memo key of
    // an edge's costs, one number instead of the whole list for every edge.
    uint32_t key_id = 0;
  };
  const EdgeClasses& edgeClasses(const strategy::StrategyList& src, uint32_t out,
                                 const strategy::StrategyList& dst, uint32_t in);
  /// The strategies of a leaf (input, parameter, buffer) of tensor `t`: one list per shape.
  strategy::StrategyList leafStrategies(const ir::TensorMeta& t);

  const ir::Graph& g;
  const spec::Spec& spec;
  const mesh::DeviceMesh& m;
  const cost::Precision precision;
  EdgePricer pricer;
  const double grad_bucket_bytes;  // cost::gradientBucketPricingBytes
  std::map<uint32_t, const strategy::NodeStrategies*> op_strategies;
  std::vector<ResolvedPin> pins;
  GraphProblem gp;
  std::map<uint32_t, uint32_t> problem_of;                            // graph node -> problem node
  std::vector<std::pair<ir::ValueId, PlacementTuple>> constrained;    // output leaves placed
  std::vector<ir::ValueId> free_leaves;                               // and left free
  std::map<std::vector<int64_t>, strategy::StrategyList> leaf_lists;  // by tensor sizes
  // By (source list, output, destination list, input); lists by identity, which the problem keeps.
  std::map<std::tuple<const void*, uint32_t, const void*, uint32_t>, EdgeClasses> edge_classes;
  std::map<std::vector<uint32_t>, uint32_t> class_key_ids;
};

const GraphProblemBuilder::EdgeClasses& GraphProblemBuilder::edgeClasses(
    const strategy::StrategyList& src, uint32_t out, const strategy::StrategyList& dst,
    uint32_t in) {
  auto [it, fresh] =
      edge_classes.try_emplace(std::make_tuple(src.identity(), out, dst.identity(), in));
  EdgeClasses& c = it->second;
  if (!fresh) return c;
  c.src_class.resize(src.size());
  c.dst_class.resize(dst.size());
  // A token-local region's strategies (apc/strategy/token_local.h) are classes of their own, one
  // per variant: between two nodes that both have them, the edge forbids pairing two variants
  // (a rule's strategy is variant 0).
  auto hasRegionStrategies = [](const strategy::StrategyList& l) {
    return std::any_of(l.begin(), l.end(),
                       [](const strategy::Strategy& s) { return s.regionLocal(); });
  };
  c.internal = hasRegionStrategies(src) && hasRegionStrategies(dst);
  {
    std::map<std::pair<Out, int>, uint32_t> seen;
    for (size_t s = 0; s < src.size(); ++s) {
      const Out& from = src[s].outputs.at(out);
      const int local = c.internal ? src[s].region_variant : 0;
      auto [at, is_new] =
          seen.emplace(std::make_pair(from, local), static_cast<uint32_t>(c.froms.size()));
      if (is_new) {
        c.froms.push_back(&from);
        c.from_local.push_back(local);
      }
      c.src_class[s] = at->second;
    }
  }
  {
    std::map<std::tuple<Out, PlacementTuple, int>, uint32_t> seen;
    for (size_t t = 0; t < dst.size(); ++t) {
      const Out& to = dst[t].inputs[in];
      PlacementTuple grad = to ? gradientPlacement(dst[t], in) : PlacementTuple{};
      const int local = c.internal ? dst[t].region_variant : 0;
      auto [at, is_new] =
          seen.emplace(std::make_tuple(to, grad, local), static_cast<uint32_t>(c.tos.size()));
      if (is_new) {
        c.tos.emplace_back(&to, std::move(grad));
        c.to_local.push_back(local);
      }
      c.dst_class[t] = at->second;
    }
  }
  std::vector<uint32_t> key{UINT32_MAX};
  for (size_t a = 0; a < c.froms.size(); ++a) {
    const Out* from = c.froms[a];
    key.push_back(*from ? pricer.tupleId(**from) + 1 : 0);
    key.push_back(static_cast<uint32_t>(c.from_local[a]));
  }
  key.push_back(UINT32_MAX);
  for (size_t b = 0; b < c.tos.size(); ++b) {
    const auto& [to, grad] = c.tos[b];
    key.push_back(*to ? pricer.tupleId(**to) + 1 : 0);
    key.push_back(pricer.tupleId(grad));
    key.push_back(static_cast<uint32_t>(c.to_local[b]));
  }
  c.key_id = class_key_ids.try_emplace(std::move(key), static_cast<uint32_t>(class_key_ids.size()))
                 .first->second;
  return c;
}

strategy::StrategyList GraphProblemBuilder::leafStrategies(const ir::TensorMeta& t) {
  std::vector<int64_t> sizes;
  for (const ir::Dim& d : t.shape) sizes.push_back(d.size);
  auto [it, fresh] = leaf_lists.try_emplace(std::move(sizes));
  if (fresh) {
    std::vector<strategy::Strategy> list;
    for (const PlacementTuple& p : leafPlacements(t, m)) list.push_back(leafStrategy(p));
    it->second = std::move(list);
  }
  return it->second;
}

void GraphProblemBuilder::addSink(ProblemNode sink, ProblemEdge e,
                                  strategy::StrategyList strategies) {
  e.dst = static_cast<uint32_t>(gp.problem.nodes.size());
  gp.problem.nodes.push_back(std::move(sink));
  gp.graph_nodes.emplace_back();
  gp.module_paths.emplace_back();
  gp.strategies.push_back(std::move(strategies));
  gp.problem.edges.push_back(std::move(e));
  gp.edge_input.push_back(0);
}

Status GraphProblemBuilder::addNodes() {
  for (const ir::Node& n : g.nodes()) {
    ProblemNode pn;
    pn.name = n.name.empty() ? n.qualifiedOp() + " #" + std::to_string(n.id.v) : n.name;
    strategy::StrategyList strats;
    if (n.kind == ir::NodeKind::kOp) {
      auto it = op_strategies.find(n.id.v);
      if (it == op_strategies.end() || it->second->strategies.empty()) continue;
      strats = it->second->strategies;
      for (const auto& s : strats) pn.costs.push_back(s.compute_us);
    } else {
      const ir::Value& v = g.value(n.outputs.at(0));
      if (!v.tensor) continue;
      strats = leafStrategies(*v.tensor);
      for (const strategy::Strategy& s : strats) {
        pn.costs.push_back(0.0);
        if (n.kind == ir::NodeKind::kParameter)
          pn.memory.push_back(cost::localNumel(*v.tensor, *s.outputs[0], m) *
                              ir::dtypeBytes(v.tensor->dtype));
      }
      if (n.kind == ir::NodeKind::kParameter)
        gp.total_param_bytes += static_cast<double>(v.tensor->bytes());
      if (n.kind == ir::NodeKind::kInput) {
        PlacementTuple want = mesh::replicated(m.ndim());
        pn.pin_group = "inputs";
        if (auto it = spec.inputs.find(n.name); it != spec.inputs.end()) {
          want = it->second;
        } else {
          // A user pin on an input the spec does not place sets its placement (see the header).
          auto pin = std::find_if(pins.begin(), pins.end(),
                                  [&](const ResolvedPin& r) { return r.value == n.outputs[0]; });
          if (pin != pins.end()) {
            want = pin->placements;
            pn.pin_group = "pins";
          }
        }
        for (size_t i = 0; i < strats.size(); ++i)
          if (*strats[i].outputs[0] == want) pn.pinned = static_cast<uint32_t>(i);
        if (!pn.pinned)
          return invalidArgument("input '" + n.name + "' cannot be placed " + mesh::toString(want) +
                                 " on mesh " + m.toString() + " (a dim is smaller than the mesh)");
      }
    }
    problem_of[n.id.v] = static_cast<uint32_t>(gp.problem.nodes.size());
    gp.problem.nodes.push_back(std::move(pn));
    gp.graph_nodes.push_back(n.id);
    gp.module_paths.push_back(n.module_path);
    gp.strategies.push_back(std::move(strats));
  }
  return Status::success();
}

bool GraphProblemBuilder::addEdges(const Deadline& deadline) {
  // One shared table per distinct question (CostTable): the copies of a layer reference it.
  std::unordered_map<std::vector<uint32_t>, CostTable, IdsHash> class_costs;
  for (const ir::Node& n : g.nodes()) {
    auto dst_it = problem_of.find(n.id.v);
    if (dst_it == problem_of.end() || n.kind != ir::NodeKind::kOp) continue;
    if (deadline.passed()) return false;
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
      bool regather = cost::regatheredInBackward(g.node(v.producer));
      ProblemEdge e;
      e.src = src;
      e.dst = dst;
      // The cost of a pair depends only on the producer's output placement and the consumer's
      // (input, gradient) placements: price each pair of such classes once (strategies of one
      // node share few placements), then fill the matrix. The classes depend only on the two
      // strategy lists and the positions, so the nodes of shared lists (repeated layers) reuse
      // them.
      const EdgeClasses& cls = edgeClasses(src_strats, v.producer_output, dst_strats, i);
      const auto& froms = cls.froms;
      const auto& tos = cls.tos;
      // Repeated layers have equal edges: the class costs are memoized by everything they
      // depend on (tensors, regather, the placements of each class).
      // A tensor list is not redistributed (lowering passes it as its producer placed it): its
      // consumer must read it at that placement.
      const bool list = v.type == ir::ValueType::kTensorList;
      // State written in place (a BatchNorm's running statistics, num_batches_tracked): the
      // write must land in the buffer itself, not in a redistributed copy of it (a local slice
      // of a replicated buffer would leave each rank's replica updated in a different part).
      bool written = false;
      if (g.node(v.producer).kind == ir::NodeKind::kBuffer)
        for (ir::ValueId w : ir::writtenInPlace(n)) written = written || w == n.inputs[i];
      std::vector<uint32_t> key;
      for (const ir::TensorMeta* meta : metas) key.push_back(pricer.metaId(*meta));
      key.push_back((regather ? 1 : 0) | (list ? 2 : 0) | (written ? 4 : 0));
      key.push_back(cls.key_id);
      auto [memo_it, fresh] = class_costs.try_emplace(std::move(key));
      if (fresh) {
        std::vector<double>& class_cost = memo_it->second.mutableValues();
        // Row by row: per source placement one search prices every target (EdgePricer::row), for
        // the forward redistributions from each producer placement and the gradient's way back
        // from each gradient placement to the producer placements. Summed per tensor as
        // the forward in the compute dtype, doubled for a parameter (re-gathered in backward), and
        // the gradient's way back in the compute dtype or, for a parameter, the reduce dtype.
        class_cost.assign(froms.size() * tos.size(), 0.0);
        std::vector<PlacementTuple> to_list, grad_list, back_list;
        std::vector<uint32_t> to_ids, grad_ids, back_ids;
        std::vector<uint32_t> to_index(tos.size(), 0), grad_index(tos.size(), 0);
        std::vector<uint32_t> back_index(froms.size(), 0);
        auto listed = [&](const PlacementTuple& t, std::vector<PlacementTuple>& list,
                          std::vector<uint32_t>& ids, std::unordered_map<uint32_t, uint32_t>& at) {
          uint32_t id = pricer.tupleId(t);
          auto [it, is_new] = at.try_emplace(id, static_cast<uint32_t>(list.size()));
          if (is_new) {
            list.push_back(t);
            ids.push_back(id);
          }
          return it->second;
        };
        {
          std::unordered_map<uint32_t, uint32_t> to_at, grad_at, back_at;
          for (size_t b = 0; b < tos.size(); ++b) {
            if (!*tos[b].first) continue;
            to_index[b] = listed(**tos[b].first, to_list, to_ids, to_at);
            grad_index[b] = listed(tos[b].second, grad_list, grad_ids, grad_at);
          }
          for (size_t a = 0; a < froms.size(); ++a)
            if (*froms[a])
              back_index[a] =
                  listed(cost::partialAsReplicate(**froms[a]), back_list, back_ids, back_at);
        }
        for (const ir::TensorMeta* meta : metas) {
          ir::TensorMeta t = precision.compute(*meta);
          ir::TensorMeta g = t;  // the gradient's tensor on its way back
          if (regather && precision.reduceDtype(*meta) != t.dtype) {
            g.dtype = precision.reduceDtype(*meta);
            g.requires_grad = false;
          }
          {  // every row this table reads, the missing ones priced in parallel
            std::vector<EdgePricer::RowRequest> rows;
            if (t.requires_grad)
              for (const PlacementTuple& grad : grad_list)
                rows.push_back({&g, &grad, &back_list, &back_ids});
            for (const Out* from : froms)
              if (*from) rows.push_back({&t, &**from, &to_list, &to_ids});
            if (!pricer.prefetch(rows, deadline)) return false;
          }
          std::vector<const std::vector<double>*> back(grad_list.size(), nullptr);
          if (t.requires_grad)
            for (size_t k = 0; k < grad_list.size(); ++k)
              back[k] = &pricer.row(g, grad_list[k], back_list, back_ids);
          // A parameter read where it lies whose gradient comes back through one all-reduce: the
          // runtime buckets that all-reduce (cost::bucketedGradientUs), priced per (gradient,
          // producer) placement pair once.
          std::map<std::pair<uint32_t, uint32_t>, std::optional<double>> bucketed;
          auto backUs = [&](size_t a, size_t b) {
            const double plain = (*back[grad_index[b]])[back_index[a]];
            if (!regather || !(**froms[a] == **tos[b].first)) return plain;
            auto [it, fresh] = bucketed.try_emplace({grad_index[b], back_index[a]});
            if (fresh) {
              auto plan = cost::planRedistribution(g, grad_list[grad_index[b]],
                                                   back_list[back_index[a]], m, pricer.model());
              if (plan.ok())
                it->second = cost::bucketedGradientUs(*plan, pricer.model(), grad_bucket_bytes);
            }
            return it->second ? *it->second : plain;
          };
          for (size_t a = 0; a < froms.size(); ++a) {
            if (!*froms[a]) continue;
            const std::vector<double>& fwd = pricer.row(t, **froms[a], to_list, to_ids);
            for (size_t b = 0; b < tos.size(); ++b) {
              if (!*tos[b].first) continue;
              double c = fwd[to_index[b]];
              if (t.requires_grad) {
                if (regather) c *= 2;
                if (std::isfinite(c)) c += backUs(a, b);
              }
              class_cost[a * tos.size() + b] += c;
            }
          }
        }
        for (size_t a = 0; a < froms.size(); ++a)
          for (size_t b = 0; b < tos.size(); ++b)
            if (!*froms[a] || !*tos[b].first ||
                ((list || written) && !(**froms[a] == **tos[b].first)) ||
                cls.from_local[a] != cls.to_local[b])
              class_cost[a * tos.size() + b] = kInfinity;
      }
      // Factorized (see ProblemEdge): the table over classes, never |S_src| x |S_dst|.
      e.costs = memo_it->second;
      e.src_class = cls.src_class;
      e.dst_class = cls.dst_class;
      e.num_dst_classes = static_cast<uint32_t>(tos.size());
      gp.problem.edges.push_back(std::move(e));
      gp.edge_input.push_back(i);
    }
  }
  return true;
}

Status GraphProblemBuilder::addOutputSinks() {
  std::function<Status(const ir::OutputTree&, const spec::OutputPlacementTree&)> walk =
      [&](const ir::OutputTree& gt, const spec::OutputPlacementTree& st) -> Status {
    using K = spec::OutputPlacementTree::Kind;
    if (st.kind == K::kFree) {
      for (ir::ValueId v : gt.leaves()) free_leaves.push_back(v);
      return Status::success();
    }
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
    ProblemEdge e;
    e.src = src_it->second;
    PlacementTuple grad = cost::partialAsReplicate(want);
    ir::TensorMeta t = precision.compute(*v.tensor);
    for (const auto& s : gp.strategies[e.src]) {
      const auto& from = s.outputs.at(v.producer_output);
      e.costs.push_back(from ? pricer.price(t, *from, want, t.requires_grad ? &grad : nullptr)
                             : kInfinity);
    }
    addSink(std::move(sink), std::move(e), {leafStrategy(want)});
  }
  return Status::success();
}

void GraphProblemBuilder::addFreeOutputSinks() {
  // Free output leaves whose producer may leave them Partial: the final reduction (see the header).
  std::set<uint32_t> sunk;
  for (const auto& [vid, want] : constrained) sunk.insert(vid.v);
  for (ir::ValueId vid : free_leaves) {
    const ir::Value& v = g.value(vid);
    auto src_it = problem_of.find(v.producer.v);
    if (!v.tensor || src_it == problem_of.end() || !sunk.insert(vid.v).second) continue;
    const auto& src_strats = gp.strategies[src_it->second];
    auto partial = [&](const strategy::Strategy& s) {
      const auto& o = s.outputs.at(v.producer_output);
      return o &&
             std::any_of(o->begin(), o->end(), [](const Placement& p) { return p.isPartial(); });
    };
    if (std::none_of(src_strats.begin(), src_strats.end(), partial)) continue;
    ProblemNode sink;
    sink.name = "output %" + v.debug_name;
    sink.costs = {0.0};
    ProblemEdge e;
    e.src = src_it->second;
    ir::TensorMeta t = precision.compute(*v.tensor);
    for (const auto& s : src_strats) {
      const auto& from = s.outputs.at(v.producer_output);
      e.costs.push_back(
          partial(s) ? pricer.price(t, *from, cost::partialAsReplicate(*from), nullptr) : 0.0);
    }
    addSink(std::move(sink), std::move(e), {freeStrategy()});
  }
}

Status GraphProblemBuilder::addPinSinks() {
  for (const ResolvedPin& pin : pins) {
    const ir::Value& v = g.value(pin.value);
    auto src_it = problem_of.find(v.producer.v);
    if (src_it == problem_of.end())
      return invalidArgument("pinned value %" + v.debug_name +
                             " has no strategies (its producer is not placeable)");
    ProblemNode sink;
    sink.name = "pin %" + (v.debug_name.empty() ? g.node(v.producer).name : v.debug_name);
    sink.costs = {0.0, 0.0};
    sink.pinned = 0;
    sink.pin_group = "pins";
    ProblemEdge e;
    e.src = src_it->second;
    for (const auto& s : gp.strategies[e.src]) {
      const auto& from = s.outputs.at(v.producer_output);
      e.costs.push_back(from && *from == pin.placements ? 0.0 : kInfinity);
      e.costs.push_back(0.0);
    }
    addSink(std::move(sink), std::move(e), {leafStrategy(pin.placements), freeStrategy()});
  }
  return Status::success();
}

/// (e) parameter memory. The default high is 1/world size, or the fully sharded footprint when
/// that is more: a dim that does not divide by its mesh sizes leaves a largest piece of
/// ceil(n / p) (the bytes counted), so 1/world is unreachable for such parameters and would make
/// every default plan infeasible (cnn_small on [4]: 24,412 bytes needed, 24,410 allowed).
void GraphProblemBuilder::addMemoryRow() {
  if (gp.total_param_bytes > 0) {
    double high_bytes = spec.memory_budget.highOr(m.worldSize()) * gp.total_param_bytes;
    if (!spec.memory_budget.high) {
      double least = 0;
      for (const auto& n : gp.problem.nodes)
        if (!n.memory.empty()) least += *std::min_element(n.memory.begin(), n.memory.end());
      if (least > high_bytes) high_bytes = least;
    }
    gp.problem.memory = MemoryBound{spec.memory_budget.low * gp.total_param_bytes, high_bytes,
                                    gp.total_param_bytes};
  }
}

void GraphProblemBuilder::addSharedReads() {
  const Problem& p = gp.problem;
  // Op reads per (producer node, value), in edge order.
  std::map<std::pair<uint32_t, uint32_t>, std::vector<uint32_t>> reads;
  for (uint32_t k = 0; k < p.edges.size(); ++k) {
    const ProblemEdge& e = p.edges[k];
    const ir::NodeId reader = gp.graph_nodes[e.dst];
    if (!reader.valid() || !e.factorized()) continue;
    const ir::Node& n = g.node(reader);
    if (n.kind != ir::NodeKind::kOp) continue;
    const ir::ValueId vid = n.inputs.at(gp.edge_input[k]);
    const ir::Value& v = g.value(vid);
    const ir::Node& producer = g.node(v.producer);
    if (v.type == ir::ValueType::kTensorList || cost::regatheredInBackward(producer)) continue;
    if (producer.kind == ir::NodeKind::kBuffer) {
      const std::vector<ir::ValueId> written = ir::writtenInPlace(n);
      if (std::find(written.begin(), written.end(), vid) != written.end()) continue;
    }
    reads[{e.src, vid.v}].push_back(k);
  }
  for (auto& [at, edges] : reads) {
    if (edges.size() < 2) continue;
    const ProblemEdge& first = p.edges[edges[0]];
    // Rows must mean the same producer classes on every edge (they do unless region variants
    // split them differently; such a group is left unshared).
    bool same_rows = true;
    for (uint32_t k : edges) same_rows = same_rows && p.edges[k].src_class == first.src_class;
    if (!same_rows) continue;
    const size_t rows = first.tableRows(p.nodes[at.first].numStrategies());
    // The (input, gradient) placement each destination class reads.
    std::map<std::pair<PlacementTuple, PlacementTuple>, uint32_t> key_ids;
    std::vector<std::vector<int32_t>> key_of(edges.size());
    for (size_t i = 0; i < edges.size(); ++i) {
      const ProblemEdge& e = p.edges[edges[i]];
      const strategy::StrategyList& dst = gp.strategies[e.dst];
      const uint32_t in = gp.edge_input[edges[i]];
      key_of[i].assign(e.num_dst_classes, -1);
      for (size_t t = 0; t < dst.size(); ++t) {
        int32_t& key = key_of[i][e.dst_class[t]];
        if (key != -1 || !dst[t].inputs.at(in)) continue;
        auto [it, fresh] = key_ids.try_emplace({*dst[t].inputs[in], gradientPlacement(dst[t], in)},
                                               static_cast<uint32_t>(key_ids.size()));
        key = static_cast<int32_t>(it->second);
      }
    }
    // A key is shared when two edges read it, it costs more than 0 from some producer class, and
    // every edge prices it alike from each producer class (forbidden pairs aside).
    const size_t n_keys = key_ids.size();
    std::vector<uint32_t> readers(n_keys, 0);
    std::vector<bool> ok(n_keys, true), positive(n_keys, false);
    std::vector<double> price(rows * n_keys, kInfinity);
    for (size_t i = 0; i < edges.size(); ++i) {
      const ProblemEdge& e = p.edges[edges[i]];
      std::vector<bool> seen(n_keys, false);
      for (uint32_t col = 0; col < e.num_dst_classes; ++col) {
        const int32_t key = key_of[i][col];
        if (key < 0) continue;
        if (!seen[key]) ++readers[key];
        seen[key] = true;
        for (size_t r = 0; r < rows; ++r) {
          const double c = e.costs[r * e.num_dst_classes + col];
          if (!std::isfinite(c)) continue;
          double& known = price[r * n_keys + key];
          if (!std::isfinite(known)) known = c;
          ok[key] = ok[key] && std::abs(known - c) <= 1e-9 * std::max(1.0, std::abs(c));
          positive[key] = positive[key] || c > 0;
        }
      }
    }
    std::vector<int32_t> renumber(n_keys, -1);
    SharedReads sr;
    sr.src = at.first;
    for (size_t key = 0; key < n_keys; ++key)
      if (readers[key] >= 2 && ok[key] && positive[key])
        renumber[key] = static_cast<int32_t>(sr.num_keys++);
    if (sr.num_keys == 0) continue;
    for (size_t i = 0; i < edges.size(); ++i) {
      for (int32_t& key : key_of[i])
        if (key >= 0) key = renumber[key];
      sr.edges.push_back(edges[i]);
      sr.key_of_class.push_back(std::move(key_of[i]));
    }
    gp.shared_reads.push_back(std::move(sr));
  }
}

}  // namespace

std::vector<bool> paidByAnEarlierReader(const GraphProblem& gp,
                                        const std::vector<uint32_t>& choice) {
  std::vector<bool> paid(gp.problem.edges.size(), false);
  const std::vector<std::vector<std::vector<bool>>> reads = sharedReadsOf(gp, choice);
  for (size_t group = 0; group < reads.size(); ++group)
    for (const std::vector<bool>& on : reads[group]) {
      bool first = true;
      for (size_t i = 0; i < on.size(); ++i) {
        if (!on[i]) continue;
        if (!first) paid[gp.shared_reads[group].edges[i]] = true;
        first = false;
      }
    }
  return paid;
}

double evaluate(const GraphProblem& gp, const std::vector<uint32_t>& choice) {
  const double whole = evaluate(gp.problem, choice);
  if (gp.shared_reads.empty() || !std::isfinite(whole)) return whole;
  const std::vector<bool> paid = paidByAnEarlierReader(gp, choice);
  double saved = 0;
  for (size_t k = 0; k < paid.size(); ++k) {
    if (!paid[k]) continue;
    const ProblemEdge& e = gp.problem.edges[k];
    saved += e.cost(choice[e.src], choice[e.dst], gp.problem.nodes[e.dst].numStrategies());
  }
  return whole - saved;
}

ReadShares evenReadShares(const GraphProblem& gp) {
  ReadShares out;
  for (const SharedReads& sr : gp.shared_reads) {
    auto& keys = out.emplace_back(sr.num_keys, std::vector<double>(sr.edges.size(), 0.0));
    std::vector<uint32_t> readers(sr.num_keys, 0);
    for (size_t i = 0; i < sr.edges.size(); ++i) {
      std::vector<bool> seen(sr.num_keys, false);
      for (int32_t key : sr.key_of_class[i])
        if (key >= 0 && !seen[key]) {
          seen[key] = true;
          keys[key][i] = 1;
          ++readers[key];
        }
    }
    for (uint32_t key = 0; key < sr.num_keys; ++key)
      for (double& share : keys[key]) share /= readers[key];
  }
  return out;
}

std::vector<std::vector<std::vector<bool>>> sharedReadsOf(const GraphProblem& gp,
                                                          const std::vector<uint32_t>& choice) {
  std::vector<std::vector<std::vector<bool>>> out;
  for (const SharedReads& sr : gp.shared_reads) {
    auto& keys = out.emplace_back(sr.num_keys, std::vector<bool>(sr.edges.size(), false));
    for (size_t i = 0; i < sr.edges.size(); ++i) {
      const ProblemEdge& e = gp.problem.edges[sr.edges[i]];
      const int32_t key = sr.key_of_class[i][e.dst_class[choice[e.dst]]];
      if (key >= 0) keys[key][i] = true;
    }
  }
  return out;
}

GraphProblem withReadShares(const GraphProblem& gp, const ReadShares& shares) {
  GraphProblem out = gp;
  out.shared_reads.clear();
  for (size_t group = 0; group < gp.shared_reads.size(); ++group) {
    const SharedReads& sr = gp.shared_reads[group];
    for (size_t i = 0; i < sr.edges.size(); ++i) {
      ProblemEdge& e = out.problem.edges[sr.edges[i]];
      const size_t cols = e.num_dst_classes;
      std::vector<double>* costs = nullptr;
      for (size_t col = 0; col < cols; ++col) {
        const int32_t key = sr.key_of_class[i][col];
        if (key < 0) continue;
        if (!costs) costs = &e.costs.mutableValues();
        const double share = shares.at(group).at(static_cast<size_t>(key)).at(i);
        for (size_t at = col; at < costs->size(); at += cols)
          if (std::isfinite((*costs)[at])) (*costs)[at] *= share;
      }
    }
  }
  return out;
}

Expected<GraphProblem> buildGraphProblem(const ir::Graph& g,
                                         const std::vector<strategy::NodeStrategies>& strategies,
                                         const spec::Spec& spec, const Deadline& deadline) {
  APC_ASSIGN_OR_RETURN(cost::CostModel model, cost::costModelFor(spec));
  GraphProblemBuilder b(g, strategies, spec, model);
  APC_ASSIGN_OR_RETURN(b.pins, resolvePins(g, spec));
  APC_RETURN_IF_ERROR(b.addNodes());
  if (!b.addEdges(deadline))
    return deadlineError("the problem was not built before the deadline (" +
                         std::to_string(b.gp.problem.edges.size()) + " edges priced)");
  if (spec.shared_reads) b.addSharedReads();
  APC_RETURN_IF_ERROR(b.addOutputSinks());
  b.addFreeOutputSinks();
  APC_RETURN_IF_ERROR(b.addPinSinks());
  b.addMemoryRow();
  APC_RETURN_IF_ERROR(b.gp.problem.validate());
  return std::move(b.gp);
}

}  // namespace apc::solver
