//===- lib/strategy/enumerate.cpp - Expansion, pruning, costing, caching --===//
//
// enumerate() turns the single-mesh-dim rules into whole-mesh strategies for every op node with a
// tensor output:
//   1. look the node up in a cache keyed by (qualified op, every input and output value's type,
//      tensor metadata including requires_grad, Tensor[] element metadata, constant); identical
//      layers of a transformer hit the cache after the first;
//   2. run the rule (or take the Replicate-only fallback), drop malformed single-dim strategies
//      and Partials that the dtypes forbid (none of bool tensors, P(avg) only of floating ones);
//   3. per mesh dim, keep the single-dim strategies whose shards fit that dim alone (no empty
//      torch.chunk piece, divisibility where must_divide asks);
//   4. expand by the cartesian product over mesh dims (mesh dim 0 most significant, so the order
//      is deterministic and all-Replicate comes first), and prune: a tensor dim cut by several
//      mesh dims must still leave no empty piece (every element of a Tensor[] but those of size
//      1 there, which broadcast: layout::elementPlacement), must_divide dims must divide by their
//      total number of pieces, the partial mesh dims of one tensor must be reducible together (sum
//      with avg, or one op);
//   5. price each strategy on its local shards (roofline forward + family backward multiple, plus
//      any collective the op runs inside itself, OpInfo::collective) and drop duplicates.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "apc/layout/layout.h"
#include "apc/strategy/node_time.h"
#include "apc/strategy/strategy.h"
#include "apc/strategy/token_local.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

void appendValueKey(std::string& k, const ir::Value& v) {
  k += '|';
  k += std::to_string(static_cast<int>(v.type));
  if (v.tensor) {
    k += ':';
    k += ir::toString(*v.tensor);
    if (v.tensor->requires_grad) k += 'g';
  }
  for (const auto& e : v.elements) {
    k += ';';
    k += ir::toString(e);
    if (e.requires_grad) k += 'g';
  }
  if (v.constant) {
    k += '=';
    k += ir::toString(*v.constant);
  }
}

std::string cacheKey(const ir::Graph& g, const ir::Node& n) {
  std::string k = n.qualifiedOp();
  for (ir::ValueId v : n.inputs) appendValueKey(k, g.value(v));
  k += '#';
  for (ir::ValueId v : n.outputs) appendValueKey(k, g.value(v));
  return k;
}

bool hasTensorOutput(const RuleContext& c) {
  for (size_t i = 0; i < c.numOutputs(); ++i)
    if (c.isTensorOutput(i)) return true;
  return false;
}

/// (Asked of nodes without a tensor output.) A list that is not a Tensor[] built from tensors (the
/// optional-tensor indices of x[:, idx]: None, None, idx): its consumer reads the tensors through
/// the list, with no placement of its own, so the node is planned (its rule reads them whole) for
/// the edges into it to be priced and lowered. Unplanned, a tensor would enter the list as whatever
/// piece its producer holds.
bool buildsOpaqueListOfTensors(const RuleContext& c) {
  if (c.node.op != "prim::ListConstruct") return false;
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.isTensorInput(i)) return true;
  return false;
}

/// Sizes (hints) of every element of every input and output, computed once per node.
struct NodeShapes {
  std::vector<std::vector<std::vector<int64_t>>> inputs, outputs;
  std::vector<std::vector<const ir::TensorMeta*>> input_metas, output_metas;

  explicit NodeShapes(const RuleContext& c) {
    for (size_t i = 0; i < c.numInputs(); ++i) {
      input_metas.push_back(c.inputMetas(i));
      inputs.emplace_back();
      for (const auto* m : input_metas.back()) inputs.back().push_back(ir::hintSizes(m->shape));
    }
    for (size_t i = 0; i < c.numOutputs(); ++i) {
      output_metas.push_back(c.outputMetas(i));
      outputs.emplace_back();
      for (const auto* m : output_metas.back()) outputs.back().push_back(ir::hintSizes(m->shape));
    }
  }
  const std::vector<std::vector<int64_t>>& of(bool output, size_t i) const {
    return output ? outputs[i] : inputs[i];
  }
};

/// Whether the Partial placements of a single-dim strategy fit the dtypes: no Partial of a bool
/// tensor (a sum of masks is not a mask), P(avg) only of floating tensors (the average of integer
/// summands is not an integer).
bool partialsFitDTypes(const DimStrategy& s, const NodeShapes& shapes) {
  auto fits = [&](bool output, const std::vector<std::optional<Placement>>& list) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i] || !list[i]->isPartial()) continue;
      for (const ir::TensorMeta* m : output ? shapes.output_metas[i] : shapes.input_metas[i]) {
        if (m->dtype == ir::DType::kBool) return false;
        if (list[i]->reduceOp() == mesh::ReduceOp::kAvg && !ir::isFloating(m->dtype)) return false;
      }
    }
    return true;
  };
  return fits(false, s.inputs) && fits(true, s.outputs);
}

/// Whether cutting tensor dim `d` of every element of a value (one for a tensor, n for a
/// Tensor[]) by the mesh sizes `ps` leaves every piece non-empty. An element of size 1 there
/// broadcasts against the others and stays whole (layout::elementPlacement), but one element at
/// least must be cut: a tensor of size 1 is never cut (as mesh::cutsIntoNonEmptyPieces says).
bool elementsFit(const std::vector<std::vector<int64_t>>& element_sizes, int d,
                 const std::vector<int64_t>& ps) {
  bool cut = false;
  for (int64_t p : ps) cut = cut || p > 1;
  if (!cut) return true;
  bool any = false;
  for (const auto& sizes : element_sizes) {
    const int64_t n = sizes.at(static_cast<size_t>(d));
    if (n == 1) continue;
    if (!mesh::cutsIntoNonEmptyPieces(n, ps)) return false;
    any = true;
  }
  return any;
}

/// Whether a single-dim strategy fits mesh dim of size `p` on its own.
bool fitsMeshDim(const DimStrategy& s, const NodeShapes& shapes, int64_t p) {
  auto fits = [&](bool output, const std::vector<std::optional<Placement>>& list) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i] || !list[i]->isShard()) continue;
      if (!elementsFit(shapes.of(output, i), list[i]->dim(), {p})) return false;
    }
    return true;
  };
  if (!fits(false, s.inputs) || !fits(true, s.outputs)) return false;
  for (const TensorDimRef& ref : s.must_divide)
    for (const auto& sizes : shapes.of(ref.output, ref.index))
      if (sizes.at(static_cast<size_t>(ref.dim)) % (p * ref.multiple) != 0) return false;
  return true;
}

/// Partial ops of one tuple can be reduced in either order: all of {sum, avg}, or one op.
bool partialsCommute(const PlacementTuple& t) {
  bool linear = false, other = false;
  std::optional<mesh::ReduceOp> op;
  for (const Placement& p : t) {
    if (!p.isPartial()) continue;
    if (p.reduceOp() == mesh::ReduceOp::kSum || p.reduceOp() == mesh::ReduceOp::kAvg) {
      linear = true;
    } else {
      if (op && *op != p.reduceOp()) return false;
      op = p.reduceOp();
      other = true;
    }
  }
  return !(linear && other);
}

/// Whether every sharded dim of every element of the tensor is cut into non-empty pieces, and
/// the partial mesh dims commute.
bool tupleFits(const PlacementTuple& t, const std::vector<std::vector<int64_t>>& element_sizes,
               const std::vector<int64_t>& mesh_shape) {
  for (size_t m = 0; m < t.size(); ++m) {
    if (!t[m].isShard()) continue;
    int d = t[m].dim();
    bool first = true;  // check each tensor dim once, at its first (outermost) mesh dim
    for (size_t k = 0; k < m; ++k) first = first && !t[k].isShard(d);
    if (!first) continue;
    std::vector<int64_t> ps;
    for (size_t k = m; k < t.size(); ++k)
      if (t[k].isShard(d)) ps.push_back(mesh_shape[k]);
    if (ps.size() == 1) continue;  // already checked per mesh dim (fitsMeshDim)
    if (!elementsFit(element_sizes, d, ps)) return false;
  }
  return partialsCommute(t);
}

int placementCode(const Placement& p) {
  switch (p.kind()) {
    case Placement::Kind::kReplicate:
      return 0;
    case Placement::Kind::kPartial:
      return 1 + static_cast<int>(p.reduceOp());
    case Placement::Kind::kShard:
      return 16 + p.dim();
  }
  return 0;
}

std::vector<int> strategyCode(const Strategy& s) {
  std::vector<int> code;
  auto add = [&](const std::vector<std::optional<PlacementTuple>>& list) {
    for (const auto& t : list) {
      if (!t) {
        code.push_back(-1);
        continue;
      }
      for (const Placement& p : *t) code.push_back(placementCode(p));
    }
  };
  add(s.inputs);
  add(s.outputs);
  return code;
}

ir::DType workDType(const RuleContext& c) {
  for (size_t i = 0; i < c.numInputs(); ++i)
    for (const auto* m : c.inputMetas(i))
      if (ir::isFloating(m->dtype)) return m->dtype;
  for (size_t i = 0; i < c.numOutputs(); ++i)
    for (const auto* m : c.outputMetas(i))
      if (m->dtype != ir::DType::kUnknown) return m->dtype;
  return ir::DType::kF32;
}

bool takesGradient(const RuleContext& c) {
  for (size_t i = 0; i < c.numOutputs(); ++i)
    for (const auto* m : c.outputMetas(i))
      if (m->requires_grad) return true;
  return false;
}

struct Pricer {
  const RuleContext& c;
  const NodeShapes& shapes;
  const mesh::DeviceMesh& mesh;
  const cost::CostModel& model;
  cost::OpFamily family;
  const WorkFn* work;
  const WorkFn* backward_work;  // null: none (OpInfo::backward_work)
  ir::DType dtype;
  bool backward;
  double backward_multiplier;  // < 0: the family's
  int backward_kernels;        // < 0: the family's
  double operand_share;        // detail::operandGradientShare of the node (a per-node constant)
  std::vector<size_t> grad_operands;  // its inputs that detail::operandTakesGradient
  int contraction_lhs = -1;           // OpInfo::contraction_lhs

  double price(const Strategy& s) const {
    // Host dispatch of the node (0 unless calibrated) with its kernels (CostModel::passUs):
    // forward, and backward with a gradient.
    const bool view = family == cost::OpFamily::kView;
    if (view && !(backward && backward_work && *backward_work)) return model.viewNodeUs(backward);
    LocalShapes local;
    auto localOf = [&](bool output, const std::vector<std::optional<PlacementTuple>>& list,
                       std::vector<std::vector<std::vector<int64_t>>>& out) {
      out.resize(list.size());
      for (size_t i = 0; i < list.size(); ++i) {
        if (!list[i]) continue;
        const auto& metas = output ? shapes.output_metas[i] : shapes.input_metas[i];
        for (const auto* m : metas) out[i].push_back(layout::maxLocalSizes(*m, *list[i], mesh));
      }
    };
    localOf(false, s.inputs, local.inputs);
    localOf(true, s.outputs, local.outputs);
    // A node measured at these local shapes (apc calibrate --model) costs what it measured:
    // forward, and backward with a gradient.
    if (model.hasMeasuredNodes()) {
      if (std::optional<std::string> key = nodeTimeKey(c.graph, c.node, local.inputs)) {
        if (auto t = model.measuredNodeUs(*key)) return (*t)[0] + (backward ? (*t)[1] : 0.0);
      }
    }
    const double extra = backward ? backwardExtraUs(local) : 0.0;
    if (view) return model.viewNodeUs(backward) + extra;
    Work w = (work && *work) ? (*work)(c, local) : defaultWork(c, local);
    // A node that runs no kernel (a cast to its own dtype returns its input) pays what a view does.
    if (w.flops <= 0 && w.bytes <= 0) return model.viewNodeUs(backward) + extra;
    const double roofline = model.computeUs(family, w.flops, w.bytes, dtype);
    // An op with its own measured curve (transcendental math, softmax, norms, pooling) takes its
    // forward from it; its backward stays the multiple of the family's price: tanh's or max
    // pooling's backward is a cheap elementwise pass over saved values (on a CPU core tanh's
    // forward took 0.28 ms and its backward 0.02 in hf_gpt2_tiny).
    const double fwd = dtype == ir::DType::kF32
                           ? model.opKernelUs(c.node.op, w.bytes).value_or(roofline)
                           : roofline;
    // An index op's backward scatters the elements its forward gathered (index_put_ with
    // accumulation), one at a time as the gather moves them: its multiple of the forward's
    // measured time (hf_mixtral_tiny's weight gathers on a CPU core: 8.5 ms forward, 7.9 backward).
    const double base = family == cost::OpFamily::kIndex ? fwd : roofline;
    const double bwd = !backward                  ? 0.0
                       : backward_multiplier >= 0 ? backward_multiplier * base
                                                  : model.backwardUs(family, base);
    // A contraction's products also pay their outputs' bytes (CostModel::matmulOutputUs): the
    // forward its result, backward the gradient of each matrix operand that takes one. A [512,48]
    // x [48,25129] vocabulary projection is bound by its 51 MB of logits forward; its backward
    // products, whose inner dims are 25129 and 512, write only the operands' sizes.
    double fwd_out = 0, bwd_out = 0;
    if (family == cost::OpFamily::kContraction) {
      if (!local.outputs.empty()) fwd_out = detail::localOutputBytes(c, local, 0);
      if (backward)
        for (size_t i : grad_operands) bwd_out += detail::localInputBytes(c, local, i);
    }
    if (auto level_two = levelTwoUs(local, w.flops, fwd, bwd))
      return model.nodeUs(level_two->first, level_two->second, backward) + extra;
    // A convolution also pays its weight's bytes beyond its flops (CostModel::convWeightUs):
    // forward, and backward where the weight takes a gradient.
    double conv_fwd = 0, conv_bwd = 0;
    if (family == cost::OpFamily::kConvolution && local.inputs.size() >= 2 &&
        local.inputs[1].size() == 1) {
      const double weight = detail::localInputBytes(c, local, 1);
      conv_fwd = model.convWeightUs(weight, false);
      if (backward && detail::operandTakesGradient(c, 1))
        conv_bwd = model.convWeightUs(weight, true);
    }
    return model.nodeUs(fwd + model.matmulOutputUs(fwd_out) + conv_fwd,
                        bwd * operand_share + model.matmulOutputUs(bwd_out) + conv_bwd, backward) +
           extra;
  }

  /// A product with a dim of one, forward and backward (DeviceSpec::matvec_gbps): out [m, n] =
  /// [m, k] x [k, n] per matrix, its dims read off the local element counts (batch dims cancel:
  /// m = multiply-adds / the right operand's elements, and so on). Backward computes dA = dC B^T
  /// (m, k; inner n) and dB = A^T dC (k, n; inner m) for the operands that take a gradient. A
  /// product with an inner dim of one is an outer product (its output's bytes at
  /// outer_product_gbps), one with m or n of one a matrix-vector product (its larger operand's
  /// bytes at matvec_gbps); each at least its price as a GEMM (`fwd`, and half of `bwd` per
  /// operand). nullopt: no such product, or the device has no such rate.
  std::optional<std::pair<double, double>> levelTwoUs(const LocalShapes& local, double flops,
                                                      double fwd, double bwd) const {
    if (family != cost::OpFamily::kContraction || contraction_lhs < 0 || !(flops > 0))
      return std::nullopt;
    const size_t a = static_cast<size_t>(contraction_lhs), b = a + 1;
    if (b >= local.inputs.size() || local.inputs[a].size() != 1 || local.inputs[b].size() != 1 ||
        local.outputs.empty() || local.outputs[0].size() != 1)
      return std::nullopt;
    const double x = detail::numel(local.inputs[a][0]), y = detail::numel(local.inputs[b][0]),
                 o = detail::numel(local.outputs[0][0]), madds = flops / 2;
    if (!(x > 0 && y > 0 && o > 0)) return std::nullopt;
    const double m = madds / y, n = madds / x, k = madds / o;
    const double elem = static_cast<double>(ir::dtypeBytes(dtype));
    // One product (rows x inner) * (inner x cols) writing `out` elements from operands of `in1`
    // and `in2` elements: its level-2 price, or nullopt for a GEMM (or no rate).
    auto product = [&](double rows, double cols, double inner, double out, double in1,
                       double in2) -> std::optional<double> {
      if (inner < 1.5) return model.outerProductUs(out * elem);
      if (rows < 1.5 || cols < 1.5) return model.matvecUs(std::max(in1, in2) * elem);
      return std::nullopt;
    };
    auto takesGradient = [&](size_t i) {
      const auto metas = c.inputMetas(i);
      return metas.size() == 1 && metas[0]->requires_grad;
    };
    const std::optional<double> f = product(m, n, k, o, x, y);
    const std::optional<double> da = product(m, k, n, x, o, y), db = product(k, n, m, y, x, o);
    if (!f && !da && !db) return std::nullopt;
    double fwd_us = f ? std::max(*f, fwd) : fwd + model.matmulOutputUs(o * elem);
    double bwd_us = 0;
    if (backward) {
      if (takesGradient(a))
        bwd_us += da ? std::max(*da, bwd / 2) : bwd / 2 + model.matmulOutputUs(x * elem);
      if (takesGradient(b))
        bwd_us += db ? std::max(*db, bwd / 2) : bwd / 2 + model.matmulOutputUs(y * elem);
    }
    return std::pair{fwd_us, bwd_us};
  }

  /// What backward runs beyond the node's pass and its multiple of the forward kernel, each a
  /// kernel the autograd engine or the formula launches on its own (CostModel::directKernelUs):
  /// the formula's kernels beyond the first; the entry's backward_work; for a pointwise op, the
  /// sum that takes the gradient of each broadcast input back to its shape. (Not priced: the
  /// additions of the gradients of an output that several nodes read. A per-node price of them
  /// differs between a model's first or last layer and the others, which the solver's
  /// clustering of repeated layers needs equal.)
  double backwardExtraUs(const LocalShapes& local) const {
    double us = 0;
    const int all_kernels =
        backward_kernels >= 0 ? backward_kernels : cost::backwardKernels(family);
    const int kernels = std::max(1, static_cast<int>(std::lround(all_kernels * operand_share)));
    for (int k = 1; k < kernels; ++k) us += model.directKernelUs(0);
    if (backward_work && *backward_work) {
      const Work b = (*backward_work)(c, local);
      if (b.bytes > 0)
        us += model.directKernelUs(model.computeUs(cost::OpFamily::kPointwise, 0, b.bytes, dtype));
    }
    if (family == cost::OpFamily::kPointwise && !local.outputs.empty() &&
        local.outputs[0].size() == 1) {
      const double out_numel = detail::numel(local.outputs[0][0]);
      const double out_bytes = detail::localOutputBytes(c, local, 0);
      for (size_t i = 0; i < local.inputs.size(); ++i) {
        if (local.inputs[i].size() != 1 || shapes.input_metas[i].size() != 1) continue;
        if (!shapes.input_metas[i][0]->requires_grad) continue;
        if (detail::numel(local.inputs[i][0]) >= out_numel) continue;
        us += model.directKernelUs(model.computeUs(cost::OpFamily::kReduction, 0,
                                                   out_bytes + detail::localInputBytes(c, local, i),
                                                   dtype));
      }
    }
    return us;
  }
};

/// The pricer of a node's strategies: its op's family, work and backward when `rule` gave them
/// (null: the fallback's, priced as kOther).
Pricer makePricer(const RuleContext& c, const NodeShapes& shapes, const mesh::DeviceMesh& mesh,
                  const cost::CostModel& model, const OpInfo* rule) {
  const cost::OpFamily family = rule ? rule->family : cost::OpFamily::kOther;
  Pricer pricer{c,
                shapes,
                mesh,
                model,
                family,
                rule ? &rule->work : nullptr,
                rule ? &rule->backward_work : nullptr,
                workDType(c),
                takesGradient(c),
                rule ? rule->backward_multiplier : -1.0,
                rule ? rule->backward_kernels : -1,
                detail::operandGradientShare(c, family),
                {}};
  if (family == cost::OpFamily::kContraction) {
    for (size_t i = 0; i < c.numInputs(); ++i)
      if (detail::operandTakesGradient(c, i)) pricer.grad_operands.push_back(i);
    pricer.contraction_lhs = rule ? rule->contraction_lhs : -1;
  }
  return pricer;
}

struct Entry {
  std::vector<Strategy> strategies;
  StrategyList shared;  // the strategies, once complete (enumerate hands this out)
  bool fallback = false;
};

Entry computeEntry(const RuleContext& c, const mesh::DeviceMesh& mesh, const Registry& registry,
                   const cost::CostModel& model) {
  Entry entry;
  const OpInfo* info = registry.findEntry(c.node);
  const OpInfo* rule = info && info->rule ? info : nullptr;  // an entry without a rule: fallback
  std::vector<DimStrategy> dims;
  NodeShapes shapes(c);
  if (rule) {
    for (DimStrategy& d : rule->rule(c))
      if (checkDimStrategy(c, d).ok() && partialsFitDTypes(d, shapes)) dims.push_back(std::move(d));
  }
  if (dims.empty()) {
    dims.push_back(detail::replicateAll(c));
    entry.fallback = true;
  }

  size_t m = mesh.ndim();
  // 3. Per mesh dim, the single-dim strategies that fit that dim alone.
  std::vector<std::vector<size_t>> allowed(m);
  for (size_t j = 0; j < m; ++j)
    for (size_t k = 0; k < dims.size(); ++k)
      if (fitsMeshDim(dims[k], shapes, mesh.size(j))) allowed[j].push_back(k);

  const bool own = !entry.fallback && rule;
  Pricer pricer = makePricer(c, shapes, mesh, model, own ? rule : nullptr);

  // A collective the op runs inside itself (OpInfo::collective), if any.
  const OpCollectiveFn* collective = info && info->collective ? &info->collective : nullptr;

  // 4. Expansion in lexicographic order (mesh dim 0 most significant).
  std::set<std::vector<int>> seen;
  std::vector<size_t> idx(m, 0);
  bool empty = false;  // a mesh dim with no strategy: only when a rule omits all-R
  for (size_t j = 0; j < m; ++j) empty = empty || allowed[j].empty();
  const std::vector<int64_t>& mesh_shape = mesh.shape();
  while (!empty) {
    Strategy s;
    s.inputs.resize(c.numInputs());
    s.outputs.resize(c.numOutputs());
    auto build = [&](bool output, std::vector<std::optional<PlacementTuple>>& list) {
      for (size_t i = 0; i < list.size(); ++i) {
        bool tensor = output ? c.isTensorOutput(i) : c.isTensorInput(i);
        if (!tensor) continue;
        PlacementTuple t;
        t.reserve(m);
        for (size_t j = 0; j < m; ++j) {
          const DimStrategy& d = dims[allowed[j][idx[j]]];
          t.push_back(*(output ? d.outputs[i] : d.inputs[i]));
        }
        list[i] = std::move(t);
      }
    };
    build(false, s.inputs);
    build(true, s.outputs);

    bool ok = true;
    for (size_t i = 0; ok && i < s.inputs.size(); ++i)
      if (s.inputs[i]) ok = tupleFits(*s.inputs[i], shapes.inputs[i], mesh_shape);
    for (size_t i = 0; ok && i < s.outputs.size(); ++i)
      if (s.outputs[i]) ok = tupleFits(*s.outputs[i], shapes.outputs[i], mesh_shape);
    for (size_t j = 0; ok && j < m; ++j) {
      for (const TensorDimRef& ref : dims[allowed[j][idx[j]]].must_divide) {
        const auto& t = ref.output ? s.outputs[ref.index] : s.inputs[ref.index];
        int64_t f = mesh::shardFactor(*t, mesh_shape, ref.dim);
        for (const auto& sizes : shapes.of(ref.output, ref.index))
          if (sizes.at(static_cast<size_t>(ref.dim)) % (f * ref.multiple) != 0) ok = false;
      }
    }
    if (ok && seen.insert(strategyCode(s)).second) {
      s.compute_us = pricer.price(s);
      if (collective) {
        // Part of the op: priced into its node cost (lowering records it, the runtime runs it).
        OpCollective inside = (*collective)(c, s.inputs, mesh, &model);
        if (!inside.mesh_dims.empty()) s.compute_us += inside.us;
      }
      entry.strategies.push_back(std::move(s));
    }

    // Next index tuple; the last mesh dim varies fastest.
    bool advanced = false;
    for (size_t j = m; j > 0 && !advanced; --j) {
      if (++idx[j - 1] < allowed[j - 1].size()) {
        advanced = true;
      } else {
        idx[j - 1] = 0;
      }
    }
    if (!advanced) break;
  }
  if (entry.strategies.empty()) {  // a rule without all-R whose strategies were all pruned
    Strategy s;
    for (size_t i = 0; i < c.numInputs(); ++i)
      s.inputs.push_back(c.isTensorInput(i) ? std::optional(mesh::replicated(m)) : std::nullopt);
    for (size_t i = 0; i < c.numOutputs(); ++i)
      s.outputs.push_back(c.isTensorOutput(i) ? std::optional(mesh::replicated(m)) : std::nullopt);
    s.compute_us = pricer.price(s);
    entry.strategies.push_back(std::move(s));
    entry.fallback = true;
  }
  // 5. Exact duplicates were skipped above; with identical placements the costs are equal, so
  // keeping the first is keeping the cheapest (EnumerateOptions::prune_dominated has nothing more
  // to drop: dominance across placements depends on the neighbours, which only the solver sees).
  return entry;
}

/// Token-local regions (apc/strategy/token_local.h): every member of a region gets the region's
/// strategies after its rule's own, priced like them. Members of repeated layers share lists.
void addTokenLocalStrategies(const ir::Graph& g, const mesh::DeviceMesh& mesh,
                             const Registry& registry, const cost::CostModel& model,
                             const EnumerateOptions& options, std::vector<NodeStrategies>& out) {
  const std::vector<TokenLocalRegion> regions = findTokenLocalRegions(g);
  if (regions.empty()) return;
  std::unordered_map<uint32_t, size_t> at;  // graph node -> its entry of `out`
  for (size_t i = 0; i < out.size(); ++i) at[out[i].node.v] = i;
  std::unordered_map<std::string, StrategyList> lists;  // looked up only, never iterated
  for (const TokenLocalRegion& region : regions) {
    bool enumerated = true;
    for (ir::NodeId id : region.members) enumerated = enumerated && at.count(id.v);
    if (!enumerated) continue;
    for (ir::NodeId id : region.members) {
      const ir::Node& n = g.node(id);
      std::vector<Strategy> extra = tokenLocalStrategies(g, region, n, mesh);
      if (extra.empty()) break;  // the mesh cuts the tokens nowhere: the same for every member
      NodeStrategies& ns = out[at[id.v]];
      std::string key = cacheKey(g, n) + "|token-local";
      for (const Strategy& s : extra)
        for (int code : strategyCode(s)) key += "," + std::to_string(code);
      auto it = lists.find(key);
      if (it == lists.end()) {
        RuleContext c{g, n, &options.rules};
        NodeShapes shapes(c);
        const OpInfo* info = registry.findEntry(n);
        Pricer pricer =
            makePricer(c, shapes, mesh, model, info && info->rule && !ns.fallback ? info : nullptr);
        std::vector<Strategy> all = ns.strategies.vector();
        for (Strategy& s : extra) {
          s.compute_us = pricer.price(s);
          all.push_back(std::move(s));
        }
        it = lists.emplace(std::move(key), StrategyList(std::move(all))).first;
      }
      ns.strategies = it->second;
    }
  }
}

}  // namespace

std::vector<NodeStrategies> enumerate(const ir::Graph& g, const mesh::DeviceMesh& mesh,
                                      const Registry& registry, const EnumerateOptions& options) {
  std::optional<cost::CostModel> own;
  if (!options.cost_model)
    own.emplace(options.device ? *options.device : cost::deviceByName("h100").value(), mesh);
  const cost::CostModel& model = options.cost_model ? *options.cost_model : *own;
  std::unordered_map<std::string, Entry> cache;  // looked up only, never iterated
  std::vector<NodeStrategies> out;
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kOp) continue;
    RuleContext c{g, n, &options.rules};
    if (!hasTensorOutput(c) && !buildsOpaqueListOfTensors(c)) continue;
    NodeStrategies ns;
    ns.node = n.id;
    if (options.use_cache) {
      std::string key = cacheKey(g, n);
      auto it = cache.find(key);
      if (it == cache.end()) {
        Entry e = computeEntry(c, mesh, registry, model);
        e.shared = StrategyList(std::move(e.strategies));
        it = cache.emplace(std::move(key), std::move(e)).first;
      }
      ns.strategies = it->second.shared;
      ns.fallback = it->second.fallback;
    } else {
      Entry e = computeEntry(c, mesh, registry, model);
      ns.strategies = std::move(e.strategies);
      ns.fallback = e.fallback;
    }
    out.push_back(std::move(ns));
  }
  addTokenLocalStrategies(g, mesh, registry, model, options, out);
  return out;
}

std::vector<std::string> fallbackOps(const ir::Graph& g, const std::vector<NodeStrategies>& s) {
  std::set<std::string> ops;
  for (const NodeStrategies& ns : s)
    if (ns.fallback) ops.insert(g.node(ns.node).qualifiedOp());
  return {ops.begin(), ops.end()};
}

}  // namespace apc::strategy
