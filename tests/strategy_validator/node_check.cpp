//===- tests/strategy_validator/node_check.cpp - One node, one strategy, all ranks ===//
//
// Random inputs, the unsharded reference run, and the per-rank run of one strategy with its
// comparison (see node_check.h).
//
//===----------------------------------------------------------------------===//
#include "node_check.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "apc/runtime/op_collective.h"
#include "apc/strategy/strategy.h"

#include "apc/layout/layout.h"
#include "apc/lower/local_rewrite.h"
#include "apc/support/strings.h"

namespace apc::validator {

namespace {

bool isTensorValue(const ir::Value& v) {
  return (v.type == ir::ValueType::kTensor && v.tensor) ||
         (v.type == ir::ValueType::kTensorList && !v.elements.empty());
}

std::string inputName(const ir::Graph& g, const ir::Node& node, size_t i) {
  return "input " + std::to_string(i) + " (%" + g.value(node.inputs[i]).debug_name + ")";
}

std::string outputName(const ir::Graph& g, const ir::Node& node, size_t i) {
  return "output " + std::to_string(i) + " (%" + g.value(node.outputs[i]).debug_name + ")";
}

const ir::TensorMeta* tensorMeta(const ir::Graph& g, const ir::Node& node, size_t i) {
  const ir::Value& v = g.value(node.inputs.at(i));
  return v.tensor ? &*v.tensor : nullptr;
}

/// Exclusive upper bound of the integer values of input `i`: the size of what it indexes.
int64_t integerBound(const ir::Graph& g, const ir::Node& node, size_t i) {
  const std::string& op = node.op;
  auto sizeOf = [&](size_t input, int64_t dim) -> int64_t {
    const ir::TensorMeta* m = tensorMeta(g, node, input);
    if (!m || m->rank() == 0) return 8;
    if (dim < 0) dim += m->rank();
    return m->shape.at(static_cast<size_t>(dim)).size;
  };
  if (op == "aten::embedding" && i == 1) return sizeOf(0, 0);
  if ((op == "aten::cross_entropy_loss" || op == "aten::nll_loss" || op == "aten::nll_loss_nd" ||
       op == "aten::nll_loss2d") &&
      i == 1) {
    const ir::TensorMeta* m = tensorMeta(g, node, 0);
    return m && m->rank() == 1 ? sizeOf(0, 0) : sizeOf(0, 1);
  }
  if (((op == "aten::index" && node.overload == "Tensor") || op == "aten::index_put" ||
       op == "aten::index_put_") &&
      i == 1) {  // indices of self's dims
    const ir::Value& list = g.value(node.inputs.at(1));
    int64_t bound = 8;
    for (size_t e = 0; e < list.elements.size(); ++e)
      bound = std::min(bound, sizeOf(0, static_cast<int64_t>(e)));
    return bound;
  }
  // Indices into self's dim `dim` (argument 1): index_select, gather, scatter_add, index_add.
  if ((op == "aten::index_select" || op == "aten::gather" || op == "aten::scatter_add" ||
       op == "aten::scatter" || op == "aten::scatter_" || op == "aten::index_add") &&
      i == 2) {
    const ir::Value& dim = g.value(node.inputs.at(1));
    if (dim.constant && std::holds_alternative<int64_t>(*dim.constant))
      return sizeOf(0, std::get<int64_t>(*dim.constant));
  }
  if (op == "aten::one_hot" && i == 0 && node.inputs.size() > 1) {  // classes below num_classes
    const ir::Value& classes = g.value(node.inputs.at(1));
    if (classes.constant && std::holds_alternative<int64_t>(*classes.constant) &&
        std::get<int64_t>(*classes.constant) > 0)
      return std::get<int64_t>(*classes.constant);
  }
  if (op == "aten::bincount" && i == 0 && node.inputs.size() > 2) {  // values below minlength
    const ir::Value& minlength = g.value(node.inputs.at(2));
    if (minlength.constant && std::holds_alternative<int64_t>(*minlength.constant) &&
        std::get<int64_t>(*minlength.constant) > 0)
      return std::get<int64_t>(*minlength.constant);
  }
  return 8;
}

/// `n` non-negative integers (of `dtype`) that sum to `total`: `total` draws into n bins.
at::Tensor randomComposition(int64_t n, int64_t total, c10::ScalarType dtype, at::Generator& gen) {
  at::Tensor draws = at::randint(0, std::max<int64_t>(n, 1), {total}, gen, at::kLong);
  return at::bincount(draws, {}, n).to(dtype);
}

/// Inputs whose values the IR's shapes fix (nullopt for the others): repeat_interleave's tensor
/// repeats sum to the output's size along the repeated dim (a 0-dim count is that size over
/// self's); _grouped_mm's offs are sorted cumulative row ends (int32) ending at self's rows, empty
/// groups included.
std::optional<at::Tensor> shapedInput(const ir::Graph& g, const ir::Node& node, size_t i,
                                      at::Generator& gen) {
  const ir::TensorMeta* m = tensorMeta(g, node, i);
  if (!m || m->rank() > 1) return std::nullopt;
  const c10::ScalarType dtype = runtime::scalarTypeOf(m->dtype);
  auto outSize = [&](int64_t dim) -> int64_t {
    const ir::Value& out = g.value(node.outputs.at(0));
    if (!out.tensor || out.tensor->rank() == 0) return 0;
    if (dim < 0) dim += out.tensor->rank();
    return out.tensor->shape.at(static_cast<size_t>(dim)).size;
  };
  if (m->rank() == 0) {
    // repeat_interleave.self_Tensor by one count (a traced size): out's dim d / self's dim d.
    const ir::TensorMeta* self = tensorMeta(g, node, 0);
    if (node.op != "aten::repeat_interleave" || node.overload != "self_Tensor" || i != 1 || !self)
      return std::nullopt;
    const ir::Value& dim = g.value(node.inputs.at(2));
    int64_t d = 0, in = ir::numel(self->shape);  // dim None: the flattened output
    if (dim.constant && std::holds_alternative<int64_t>(*dim.constant)) {
      d = std::get<int64_t>(*dim.constant);
      if (d < 0) d += self->rank();
      in = self->shape.at(static_cast<size_t>(d)).size;
    }
    return at::scalar_tensor(in > 0 ? outSize(d) / in : 0, at::TensorOptions().dtype(dtype));
  }
  const int64_t n = m->shape.at(0).size;
  if (node.op == "aten::repeat_interleave" && node.overload == "Tensor" && i == 0)
    return randomComposition(n, outSize(0), dtype, gen);
  if (node.op == "aten::repeat_interleave" && node.overload == "self_Tensor" && i == 1) {
    const ir::Value& dim = g.value(node.inputs.at(2));
    int64_t d = 0;  // dim None: the flattened output
    if (dim.constant && std::holds_alternative<int64_t>(*dim.constant))
      d = std::get<int64_t>(*dim.constant);
    return randomComposition(n, outSize(d), dtype, gen);
  }
  if (node.op == "aten::_grouped_mm" && i == 2) {
    const ir::TensorMeta* self = tensorMeta(g, node, 0);
    if (!self || self->rank() != 2) return std::nullopt;
    const int64_t rows = self->shape.at(0).size;
    at::Tensor ends = std::get<0>(at::sort(at::randint(0, rows + 1, {n}, gen, at::kLong)));
    if (n > 0) ends[n - 1] = rows;
    return ends.to(dtype);
  }
  return std::nullopt;
}

/// True for inputs that must be positive (variances).
bool mustBePositive(const ir::Node& node, size_t i) {
  return (node.op == "aten::batch_norm" || node.op == "aten::_native_batch_norm_legit_functional" ||
          node.op == "aten::_native_batch_norm_legit_no_training") &&
         i == 4;  // running_var
}

at::Tensor randomTensor(const ir::TensorMeta& meta, int64_t bound, bool positive, bool widen,
                        at::Generator& gen) {
  std::vector<int64_t> sizes = ir::hintSizes(meta.shape);
  c10::ScalarType dtype = widen ? widenedScalarType(meta.dtype) : runtime::scalarTypeOf(meta.dtype);
  if (at::isFloatingType(dtype)) {
    at::Tensor t = at::randn(sizes, gen, at::TensorOptions().dtype(dtype));
    return positive ? t.abs() + 0.5 : t;
  }
  if (dtype == at::kBool) return at::randint(0, 2, sizes, gen, at::kLong).to(at::kBool);
  return at::randint(0, std::max<int64_t>(bound, 1), sizes, gen, at::TensorOptions().dtype(dtype));
}

at::Tensor scalarLiteral(const ir::TensorMeta& meta, const ir::Constant& c) {
  c10::ScalarType dtype = widenedScalarType(meta.dtype);
  at::TensorOptions o = at::TensorOptions().dtype(dtype);
  if (const auto* d = std::get_if<double>(&c)) return at::scalar_tensor(*d, o);
  if (const auto* i = std::get_if<int64_t>(&c)) return at::scalar_tensor(*i, o);
  if (const auto* b = std::get_if<bool>(&c)) return at::scalar_tensor(*b, o);
  return at::zeros({}, o);
}

/// The elements of a tensor or tensor-list IValue.
std::vector<at::Tensor> elementsOf(const c10::IValue& v) {
  if (v.isTensor()) return {v.toTensor()};
  std::vector<at::Tensor> out;
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorVector()) out.push_back(t);
  return out;
}

std::vector<int64_t> sizesOf(const at::Tensor& t) {
  return {t.sizes().begin(), t.sizes().end()};
}

/// Where element `t` of a value placed `placement` lies: a tensor as placed, an element of a
/// Tensor[] by the list-element rule (layout::elementPlacement: a size-1 dim broadcasts, whole).
mesh::PlacementTuple placementOf(const c10::IValue& v, const at::Tensor& t,
                                 const mesh::PlacementTuple& placement) {
  return v.isTensorList() ? layout::elementPlacement(placement, sizesOf(t)) : placement;
}

c10::IValue cloneValue(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor().clone();
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorVector()) l.push_back(t.clone());
    return l;
  }
  return v;
}

}  // namespace

bool keepsFloat32(const ir::Node& node) {
  return node.op == "aten::_grouped_mm";
}

Expected<std::vector<c10::IValue>> makeFullInputs(const ir::Graph& g, const ir::Node& node,
                                                  const NodeOp& op, at::Generator& gen) {
  std::vector<c10::IValue> args;
  const c10::FunctionSchema* schema = op.schema();
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const ir::Value& v = g.value(node.inputs[i]);
    const c10::Argument* arg =
        schema && i < schema->arguments().size() ? &schema->arguments()[i] : nullptr;
    if (v.type == ir::ValueType::kTensor && v.tensor) {
      if (v.constant)
        args.emplace_back(scalarLiteral(*v.tensor, *v.constant));
      else if (std::optional<at::Tensor> t = shapedInput(g, node, i, gen))
        args.emplace_back(*t);
      else
        args.emplace_back(randomTensor(*v.tensor, integerBound(g, node, i), mustBePositive(node, i),
                                       !keepsFloat32(node), gen));
    } else if (v.type == ir::ValueType::kTensorList && !v.elements.empty()) {
      c10::List<at::Tensor> list;
      for (const ir::TensorMeta& e : v.elements)
        list.push_back(randomTensor(e, integerBound(g, node, i), false, !keepsFloat32(node), gen));
      args.emplace_back(list);
    } else if (v.type == ir::ValueType::kOther && v.producer.valid() &&
               g.node(v.producer).op == "prim::ListConstruct") {
      // An optional-tensor list (index's [None, idx]): Nones, and tensors indexing self's dim at
      // their position (every rank reads the list whole).
      c10::List<std::optional<at::Tensor>> list;
      const ir::Node& build = g.node(v.producer);
      const ir::TensorMeta* self = tensorMeta(g, node, 0);
      for (size_t e = 0; e < build.inputs.size(); ++e) {
        const ir::Value& item = g.value(build.inputs[e]);
        if (!item.isTensor() || !item.tensor) {
          list.push_back(std::nullopt);
          continue;
        }
        const int64_t bound = self && e < self->shape.size() ? self->shape[e].size : 8;
        list.push_back(randomTensor(*item.tensor, bound, false, !keepsFloat32(node), gen));
      }
      args.emplace_back(list);
    } else if (v.constant) {
      Expected<c10::IValue> iv = constantToIValue(*v.constant, arg);
      if (!iv.ok()) return iv.error().withContext(inputName(g, node, i));
      args.push_back(*iv);
    } else {
      return unsupported(inputName(g, node, i) + " of type " + ir::valueTypeName(v.type) +
                         " has no value known at import time");
    }
  }
  return args;
}

Expected<std::vector<c10::IValue>> runNode(const ir::Node& node, const NodeOp& op,
                                           const std::vector<c10::IValue>& inputs) {
  std::vector<c10::IValue> args;
  for (const c10::IValue& v : inputs) args.push_back(cloneValue(v));
  return op.run(std::move(args), node.outputs.size());
}

std::optional<std::string> checkReferenceShapes(const ir::Graph& g, const ir::Node& node,
                                                const std::vector<c10::IValue>& outputs) {
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    const ir::Value& v = g.value(node.outputs[j]);
    std::vector<const ir::TensorMeta*> metas;
    if (v.type == ir::ValueType::kTensor && v.tensor) metas.push_back(&*v.tensor);
    if (v.type == ir::ValueType::kTensorList)
      for (const ir::TensorMeta& e : v.elements) metas.push_back(&e);
    if (metas.empty()) continue;
    std::vector<at::Tensor> got = elementsOf(outputs[j]);
    if (got.size() != metas.size())
      return outputName(g, node, j) + ": " + std::to_string(got.size()) + " tensors, the IR has " +
             std::to_string(metas.size());
    for (size_t e = 0; e < got.size(); ++e)
      if (sizesOf(got[e]) != ir::hintSizes(metas[e]->shape))
        return outputName(g, node, j) + ": shape " + shapeText(got[e]) + ", the IR has " +
               ir::toString(metas[e]->shape);
  }
  return std::nullopt;
}

std::optional<std::string> checkStrategyForm(const ir::Graph& g, const ir::Node& node,
                                             const strategy::Strategy& s,
                                             const mesh::DeviceMesh& mesh) {
  if (s.inputs.size() != node.inputs.size() || s.outputs.size() != node.outputs.size())
    return "has " + std::to_string(s.inputs.size()) + " inputs and " +
           std::to_string(s.outputs.size()) + " outputs, the node " +
           std::to_string(node.inputs.size()) + " and " + std::to_string(node.outputs.size());
  auto check = [&](const ir::Value& v, const std::optional<mesh::PlacementTuple>& t,
                   const std::string& what) -> std::optional<std::string> {
    if (isTensorValue(v) != t.has_value())
      return what + (t ? " is not a tensor but has a placement" : " is a tensor without placement");
    if (!t) return std::nullopt;
    int64_t rank = v.tensor ? v.tensor->rank() : v.elements.front().rank();
    for (const ir::TensorMeta& e : v.elements)
      if (e.rank() != rank) return what + ": Tensor[] elements of different ranks";
    Status st = mesh::checkPlacementTuple(*t, rank, mesh.ndim());
    if (!st.ok()) return what + ": " + st.error().message();
    return std::nullopt;
  };
  for (size_t i = 0; i < node.inputs.size(); ++i)
    if (auto bad = check(g.value(node.inputs[i]), s.inputs[i], inputName(g, node, i))) return bad;
  for (size_t j = 0; j < node.outputs.size(); ++j)
    if (auto bad = check(g.value(node.outputs[j]), s.outputs[j], outputName(g, node, j)))
      return bad;
  return std::nullopt;
}

namespace {

/// The outputs of a node with an op collective on every rank that has arguments (`args[r]`
/// non-empty): its local graph (what lowering records and the runtime runs), the k-th all-reduce of
/// rank r the sum of the k-th all-reduce inputs of the ranks that differ from r only in `dims`.
/// Pass p runs every rank with the results of the all-reduces before p known (the others return
/// their input) and sums the inputs of all-reduce p; the last pass has them all. Every pass runs on
/// copies of the arguments (the local graph may update some in place).
Expected<std::vector<std::vector<c10::IValue>>> simulateOpCollective(
    const runtime::OpCollectiveRunner& local, const std::vector<std::vector<c10::IValue>>& args,
    const mesh::DeviceMesh& mesh, const std::vector<size_t>& dims) {
  const size_t world = args.size(), k_all = local.numAllReduces();
  std::vector<std::vector<at::Tensor>> results(k_all, std::vector<at::Tensor>(world));
  std::vector<std::vector<c10::IValue>> outs(world);
  for (size_t pass = 0; pass <= k_all; ++pass) {
    std::vector<std::vector<at::Tensor>> seen(k_all, std::vector<at::Tensor>(world));
    for (size_t r = 0; r < world; ++r) {
      if (args[r].empty()) continue;
      std::vector<c10::IValue> copy;
      for (const c10::IValue& a : args[r]) copy.push_back(cloneValue(a));
      try {
        outs[r] = local.run(copy, [&](size_t k, const at::Tensor& t) {
          seen.at(k)[r] = t.detach().clone();
          return k < pass ? results[k][r] : t;
        });
      } catch (const std::exception& e) {
        return unsupported("rank " + std::to_string(r) + ": " + firstLine(e.what()));
      }
    }
    if (pass == k_all) break;
    for (size_t r = 0; r < world; ++r) {
      if (args[r].empty()) continue;
      const std::vector<int64_t> coord = mesh.coordinate(static_cast<int64_t>(r));
      at::Tensor sum;
      for (size_t q = 0; q < world; ++q) {
        const std::vector<int64_t> other = mesh.coordinate(static_cast<int64_t>(q));
        bool same = true;
        for (size_t m = 0; m < mesh.ndim(); ++m)
          if (std::find(dims.begin(), dims.end(), m) == dims.end() && other[m] != coord[m])
            same = false;
        if (!same) continue;
        if (!seen[pass][q].defined())
          return internalError("rank " + std::to_string(q) + " did not reach all-reduce " +
                               std::to_string(pass) + " of the local graph");
        sum = sum.defined() ? sum + seen[pass][q] : seen[pass][q];
      }
      results[pass][r] = sum;
    }
  }
  return outs;
}

/// One rank's call after lowering's local rewrite: the kernel when the overload changes
/// (arange(end) -> arange.start), the local graph the rank runs in place of the op (a
/// vocab-parallel embedding's masked lookup, NodeRewrite::local, run by the runtime's
/// OpCollectiveRunner as for an op collective), the notes.
struct RankCall {
  std::optional<NodeOp> op;
  std::optional<runtime::OpCollectiveRunner> local;
  std::vector<std::string> notes;
};

/// Applies lower::localizeNode's rewrite of `node` for the rank holding `pieces` to `args`
/// exactly as lowering writes it into the rank's program: replaced constants, then the new
/// overload with its prepended argument.
Expected<RankCall> localizeRankCall(const ir::Graph& g, const ir::Node& node, const NodeOp& op,
                                    const lower::RankPieces& pieces,
                                    std::vector<c10::IValue>& args) {
  std::vector<std::optional<ir::Constant>> constants;
  for (ir::ValueId in : node.inputs) {
    const ir::Value& v = g.value(in);
    constants.push_back(v.isTensor() || v.type == ir::ValueType::kTensorList ? std::nullopt
                                                                             : v.constant);
  }
  APC_ASSIGN_OR_RETURN(lower::NodeRewrite rw, lower::localizeNode(node, constants, pieces));
  RankCall call;
  call.notes = rw.notes;
  auto argOf = [](const NodeOp& k, size_t i) -> const c10::Argument* {
    return k.schema() && i < k.schema()->arguments().size() ? &k.schema()->arguments()[i] : nullptr;
  };
  for (const auto& [pos, c] : rw.replace) {
    APC_ASSIGN_OR_RETURN(c10::IValue iv, constantToIValue(c, argOf(op, pos)));
    args.at(pos) = std::move(iv);
  }
  if (rw.overload) {
    ir::Node copy = node;
    copy.overload = *rw.overload;
    APC_ASSIGN_OR_RETURN(NodeOp k, NodeOp::resolve(copy));
    call.op = std::move(k);
  }
  if (rw.prepend) {
    APC_ASSIGN_OR_RETURN(c10::IValue iv,
                         constantToIValue(*rw.prepend, argOf(call.op ? *call.op : op, 0)));
    args.insert(args.begin(), std::move(iv));
  }
  if (rw.local) {
    APC_ASSIGN_OR_RETURN(
        call.local, runtime::OpCollectiveRunner::create(std::move(*rw.local), node.inputs.size(),
                                                        node.outputs.size()));
  }
  return call;
}

}  // namespace

std::optional<std::string> checkStrategy(const ir::Graph& g, const ir::Node& node, const NodeOp& op,
                                         const strategy::Strategy& s, const mesh::DeviceMesh& mesh,
                                         const std::vector<c10::IValue>& full_inputs,
                                         const std::vector<c10::IValue>& full_outputs,
                                         at::Generator& gen, CheckStats& stats) {
  const int64_t world = mesh.worldSize();
  // in_locals[i][e][r]: element e of input i on rank r.
  std::vector<std::vector<RankTensors>> in_locals(node.inputs.size());
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (!s.inputs[i]) continue;
    for (const at::Tensor& full : elementsOf(full_inputs[i])) {
      Expected<RankTensors> d =
          distribute(full, placementOf(full_inputs[i], full, *s.inputs[i]), mesh, gen);
      if (!d.ok()) return inputName(g, node, i) + ": " + d.error().message();
      in_locals[i].push_back(std::move(*d));
    }
  }
  std::vector<std::vector<at::Tensor>> full_outs(node.outputs.size());
  for (size_t j = 0; j < node.outputs.size(); ++j)
    if (s.outputs[j]) full_outs[j] = elementsOf(full_outputs[j]);

  std::vector<std::vector<RankTensors>> out_locals(node.outputs.size());
  for (size_t j = 0; j < node.outputs.size(); ++j)
    out_locals[j].assign(full_outs[j].size(), RankTensors(static_cast<size_t>(world)));
  // Ranks that differ only in mesh dims where every input and output is Replicate hold identical
  // inputs and pieces (sim_ranks.h), so they compute identical outputs: run the op once per class
  // (the rank with those coordinates 0) and give the others its outputs.
  std::vector<bool> active(mesh.ndim(), false);
  auto mark = [&](const std::vector<std::optional<mesh::PlacementTuple>>& tuples) {
    for (const auto& t : tuples)
      if (t)
        for (size_t m = 0; m < t->size(); ++m) active[m] = active[m] || !(*t)[m].isReplicate();
  };
  mark(s.inputs);
  mark(s.outputs);
  std::string notes;
  // A collective inside the node under this strategy (its registry entry's OpInfo::collective,
  // e.g. a batch-sharded training batch_norm's statistics): every rank runs the node's local graph
  // (OpInfo::collective_local, as lowering records it and the runtime runs it), its all-reduces
  // simulated across the ranks (simulateOpCollective), after the loop below.
  std::vector<size_t> collective_dims;
  std::optional<runtime::OpCollectiveRunner> local;
  if (const strategy::OpInfo* info = strategy::defaultRegistry().findEntry(node);
      info && info->collective) {
    const strategy::RuleContext ctx{g, node};
    collective_dims = info->collective(ctx, s.inputs, mesh, nullptr).mesh_dims;
    if (!collective_dims.empty()) {
      if (!info->collective_local) return std::string("the op's collective has no local graph");
      Expected<ir::Graph> lg = info->collective_local(ctx, s.inputs);
      if (!lg.ok()) return "local graph: " + lg.error().message();
      auto runner = runtime::OpCollectiveRunner::create(std::move(lg).value(), node.inputs.size(),
                                                        node.outputs.size());
      if (!runner.ok()) return "local graph: " + runner.error().message();
      local = std::move(runner).value();
    }
  }
  std::vector<std::vector<c10::IValue>> local_args(static_cast<size_t>(world));
  std::vector<int64_t> copies_of(static_cast<size_t>(world), -1);  // with `local`: r's rep
  // Rank r's outputs into out_locals.
  auto store = [&](int64_t r, const std::vector<c10::IValue>& outs) -> std::optional<std::string> {
    if (outs.size() != node.outputs.size())
      return "rank " + std::to_string(r) + ": " + std::to_string(outs.size()) +
             " outputs, the node has " + std::to_string(node.outputs.size());
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      if (!s.outputs[j]) continue;
      std::vector<at::Tensor> got = elementsOf(outs[j]);
      if (got.size() != full_outs[j].size())
        return "rank " + std::to_string(r) + " " + outputName(g, node, j) + ": " +
               std::to_string(got.size()) + " tensors, the reference has " +
               std::to_string(full_outs[j].size()) + notes;
      for (size_t e = 0; e < got.size(); ++e) out_locals[j][e][static_cast<size_t>(r)] = got[e];
    }
    return std::nullopt;
  };
  for (int64_t r = 0; r < world; ++r) {
    const std::vector<int64_t> coord = mesh.coordinate(r);
    std::vector<int64_t> rep_coord = coord;
    for (size_t m = 0; m < mesh.ndim(); ++m)
      if (!active[m]) rep_coord[m] = 0;
    const int64_t rep = mesh.rank(rep_coord);
    if (rep != r && local) {
      copies_of[static_cast<size_t>(r)] = rep;
      continue;
    }
    if (rep != r) {
      for (size_t j = 0; j < node.outputs.size(); ++j)
        for (RankTensors& el : out_locals[j])
          el[static_cast<size_t>(r)] = el[static_cast<size_t>(rep)];
      continue;
    }
    std::vector<c10::IValue> args = full_inputs;
    lower::RankPieces pieces;
    pieces.coordinate = coord;
    pieces.inputs.resize(node.inputs.size());
    pieces.outputs.resize(node.outputs.size());
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (!s.inputs[i]) continue;
      std::vector<at::Tensor> fulls = elementsOf(full_inputs[i]);
      for (size_t e = 0; e < fulls.size(); ++e) {
        std::vector<int64_t> global = sizesOf(fulls[e]);
        const mesh::PlacementTuple t = placementOf(full_inputs[i], fulls[e], *s.inputs[i]);
        pieces.inputs[i].push_back({global, layout::localPiece(global, t, mesh, coord), {}, {}, t});
      }
      if (full_inputs[i].isTensor()) {
        args[i] = in_locals[i][0][static_cast<size_t>(r)];
      } else {
        c10::List<at::Tensor> list;
        for (const RankTensors& el : in_locals[i]) list.push_back(el[static_cast<size_t>(r)]);
        args[i] = list;
      }
    }
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      if (!s.outputs[j]) continue;
      for (const at::Tensor& full : full_outs[j]) {
        std::vector<int64_t> global = sizesOf(full);
        const mesh::PlacementTuple t = placementOf(full_outputs[j], full, *s.outputs[j]);
        pieces.outputs[j].push_back(
            {global, layout::localPiece(global, t, mesh, coord), {}, {}, t});
      }
    }
    // The rank's call, localized by the rewrite lowering ships (apc/lower/local_rewrite.h).
    Expected<RankCall> call = localizeRankCall(g, node, op, pieces, args);
    if (!call.ok()) return "rank " + std::to_string(r) + ": " + call.error().message();
    if (!call->notes.empty()) {
      ++stats.rewrites;
      ++stats.rewrites_by_op[node.qualifiedOp()];
      if (notes.empty())
        notes =
            " [local rewrites on rank " + std::to_string(r) + ": " + join(call->notes, "; ") + "]";
    }
    const NodeOp& run_op = call->op ? *call->op : op;
    if (run_op.schema() && run_op.schema()->is_mutable())  // the inputs are views of shared tensors
      for (c10::IValue& a : args) a = cloneValue(a);
    if (call->local && local) return std::string("both a collective and a local rewrite's graph");
    if (local) {
      local_args[static_cast<size_t>(r)] = std::move(args);
      ++stats.rank_calls;
      continue;
    }
    Expected<std::vector<c10::IValue>> outs = [&]() -> Expected<std::vector<c10::IValue>> {
      if (!call->local) return run_op.run(std::move(args), node.outputs.size());
      // The rank's local graph: no all-reduce node (the runtime refuses one without mesh dims).
      if (call->local->numAllReduces() > 0)
        return invalidArgument("the local rewrite's graph has all-reduce nodes");
      try {
        return call->local->run(args, [](size_t, const at::Tensor& t) { return t; });
      } catch (const std::exception& e) {
        return unsupported(firstLine(e.what()));
      }
    }();
    ++stats.rank_calls;
    if (!outs.ok())
      return "rank " + std::to_string(r) + " failed: " + outs.error().message() + notes;
    if (auto bad = store(r, *outs)) return bad;
  }
  if (local) {
    Expected<std::vector<std::vector<c10::IValue>>> outs =
        simulateOpCollective(*local, local_args, mesh, collective_dims);
    if (!outs.ok()) return "local graph failed: " + outs.error().message() + notes;
    for (int64_t r = 0; r < world; ++r) {
      const int64_t from =
          copies_of[static_cast<size_t>(r)] >= 0 ? copies_of[static_cast<size_t>(r)] : r;
      if (auto bad = store(r, (*outs)[static_cast<size_t>(from)])) return bad;
    }
  }
  // empty, empty_like, new_empty: the values are whatever the allocator held; only the pieces'
  // shapes and dtypes are the op's.
  const bool uninitialized =
      node.op == "aten::empty" || node.op == "aten::empty_like" || node.op == "aten::new_empty";
  for (size_t j = 0; j < node.outputs.size(); ++j) {
    if (!s.outputs[j]) continue;
    for (size_t e = 0; e < full_outs[j].size(); ++e) {
      if (uninitialized) {
        full_outs[j][e] = at::zeros_like(full_outs[j][e]);
        for (at::Tensor& l : out_locals[j][e])
          if (l.defined()) l = at::zeros_like(l);
      }
      const mesh::PlacementTuple t = placementOf(full_outputs[j], full_outs[j][e], *s.outputs[j]);
      auto bad = checkLayout(out_locals[j][e], full_outs[j][e], t, mesh,
                             keepsFloat32(node) ? kFloat32Tolerance : Tolerance{});
      if (!bad) continue;
      std::string which = outputName(g, node, j);
      if (full_outs[j].size() > 1 || g.value(node.outputs[j]).type == ir::ValueType::kTensorList)
        which += " element " + std::to_string(e);
      return which + " as " + mesh::toString(*s.outputs[j]) + ": " + *bad + notes;
    }
  }
  return std::nullopt;
}

std::optional<std::string> checkRegion(const ir::Graph& g, const strategy::TokenLocalRegion& region,
                                       const std::vector<strategy::Strategy>& member_strategies,
                                       const mesh::DeviceMesh& mesh, at::Generator& gen,
                                       CheckStats& stats) {
  if (member_strategies.size() != region.members.size())
    return "one strategy per member expected, got " + std::to_string(member_strategies.size());
  std::set<uint32_t> members;
  for (ir::NodeId id : region.members) members.insert(id.v);
  // The sort's keys are expert ids: below the counts' bins (histc's second argument).
  int64_t experts = region.experts;
  for (ir::NodeId id : region.members) {
    const ir::Node& n = g.node(id);
    if (n.op == "aten::histc" && n.inputs.size() > 1)
      if (const auto& c = g.value(n.inputs[1]).constant)
        if (const int64_t* bins = std::get_if<int64_t>(&*c)) experts = *bins;
  }
  const ir::ValueId keys = g.node(region.root).inputs.at(0);
  std::map<uint32_t, c10::IValue> full;  // the unsharded values, by ValueId
  auto argOf = [](const NodeOp& op, size_t i) -> const c10::Argument* {
    return op.schema() && i < op.schema()->arguments().size() ? &op.schema()->arguments()[i]
                                                              : nullptr;
  };
  // The unsharded value of a node input (a member's output, a constant, or an external input).
  std::function<Expected<c10::IValue>(ir::ValueId, const c10::Argument*)> valueOf =
      [&](ir::ValueId v, const c10::Argument* arg) -> Expected<c10::IValue> {
    if (auto it = full.find(v.v); it != full.end()) return it->second;
    const ir::Value& val = g.value(v);
    if (val.type == ir::ValueType::kNone) return c10::IValue();
    // In the model's dtypes (a cast to f32 stays one: _grouped_mm has no f64 kernel).
    if (!val.isTensor() && val.constant)
      return runtime::constantToIValue(*val.constant, arg, runtime::InterpreterOptions{});
    if (!val.isTensor() || !val.tensor)
      return unsupported("region input %" + val.debug_name + " is not a tensor or a constant");
    if (val.constant) return c10::IValue(scalarLiteral(*val.tensor, *val.constant));
    at::Tensor t;
    const bool factory =
        val.producer.valid() && g.node(val.producer).kind == ir::NodeKind::kOp &&
        std::none_of(g.node(val.producer).inputs.begin(), g.node(val.producer).inputs.end(),
                     [&](ir::ValueId in) { return g.value(in).mayHoldTensors(); });
    if (factory) {  // an arange of positions: computed as the graph does
      const ir::Node& f = g.node(val.producer);
      APC_ASSIGN_OR_RETURN(NodeOp op, NodeOp::resolve(f));
      std::vector<c10::IValue> args;
      for (size_t i = 0; i < f.inputs.size(); ++i) {
        APC_ASSIGN_OR_RETURN(c10::IValue a, valueOf(f.inputs[i], argOf(op, i)));
        args.push_back(std::move(a));
      }
      APC_ASSIGN_OR_RETURN(std::vector<c10::IValue> outs, runNode(f, op, args));
      t = outs.at(val.producer_output).toTensor();
    } else if (v == keys) {
      t = at::randint(0, std::max<int64_t>(experts, 1), ir::hintSizes(val.tensor->shape), gen,
                      at::TensorOptions().dtype(runtime::scalarTypeOf(val.tensor->dtype)));
    } else {
      t = randomTensor(*val.tensor, 1, false, /*widen=*/false, gen);
    }
    full[v.v] = t;
    return c10::IValue(t);
  };

  // Unsharded.
  std::vector<NodeOp> ops;
  for (ir::NodeId id : region.members) {
    const ir::Node& n = g.node(id);
    Expected<NodeOp> resolved = NodeOp::resolve(n);
    if (!resolved.ok()) return n.qualifiedOp() + ": " + resolved.error().message();
    NodeOp op = std::move(resolved).value();
    std::vector<c10::IValue> args;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      Expected<c10::IValue> a = valueOf(n.inputs[i], argOf(op, i));
      if (!a.ok()) return a.error().message();
      args.push_back(std::move(*a));
    }
    Expected<std::vector<c10::IValue>> outs = runNode(n, op, args);
    if (!outs.ok()) return n.qualifiedOp() + " unsharded: " + outs.error().message();
    for (size_t j = 0; j < n.outputs.size(); ++j) full[n.outputs[j].v] = (*outs)[j];
    ops.push_back(std::move(op));
  }

  // Every rank.
  const ir::Node& exit = g.node(region.exit);
  const size_t exit_at = region.members.size() - 1;
  if (region.members.back() != region.exit) return std::string("the exit is not the last member");
  const int64_t world = mesh.worldSize();
  RankTensors exit_locals(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    const std::vector<int64_t> coord = mesh.coordinate(r);
    std::map<uint32_t, c10::IValue> env;  // the rank's values of the members' outputs
    for (size_t k = 0; k < region.members.size(); ++k) {
      const ir::Node& n = g.node(region.members[k]);
      const strategy::Strategy& s = member_strategies[k];
      std::vector<c10::IValue> args;
      lower::RankPieces pieces;
      pieces.coordinate = coord;
      pieces.inputs.resize(n.inputs.size());
      pieces.outputs.resize(n.outputs.size());
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const ir::ValueId v = n.inputs[i];
        const bool internal = g.value(v).producer.valid() && members.count(g.value(v).producer.v);
        Expected<c10::IValue> whole = valueOf(v, argOf(ops[k], i));
        if (!whole.ok()) return whole.error().message();
        if (i >= s.inputs.size() || !s.inputs[i]) {
          args.push_back(internal ? env.at(v.v) : *whole);
          continue;
        }
        const mesh::PlacementTuple& t = *s.inputs[i];
        for (const at::Tensor& e : elementsOf(*whole))
          pieces.inputs[i].push_back(
              {sizesOf(e), layout::localPiece(sizesOf(e), t, mesh, coord), {}, {}, t});
        if (internal)
          args.push_back(env.at(v.v));
        else if (whole->isTensor())
          args.push_back(localOf(whole->toTensor(), t, mesh, coord).contiguous().clone());
        else
          return "external tensor list input %" + g.value(v).debug_name;
      }
      for (size_t j = 0; j < n.outputs.size(); ++j) {
        if (j >= s.outputs.size() || !s.outputs[j]) continue;
        for (const at::Tensor& e : elementsOf(full.at(n.outputs[j].v)))
          pieces.outputs[j].push_back({sizesOf(e),
                                       layout::localPiece(sizesOf(e), *s.outputs[j], mesh, coord),
                                       {},
                                       {},
                                       *s.outputs[j]});
      }
      Expected<RankCall> call = localizeRankCall(g, n, ops[k], pieces, args);
      if (!call.ok())
        return "rank " + std::to_string(r) + " " + n.qualifiedOp() + ": " + call.error().message();
      if (!call->notes.empty()) {
        ++stats.rewrites;
        ++stats.rewrites_by_op[n.qualifiedOp()];
      }
      Expected<std::vector<c10::IValue>> outs = [&]() -> Expected<std::vector<c10::IValue>> {
        try {
          if (call->local)
            return call->local->run(args, [](size_t, const at::Tensor& t) { return t; });
          return (call->op ? *call->op : ops[k]).run(std::move(args), n.outputs.size());
        } catch (const std::exception& e) {
          return unsupported(firstLine(e.what()));
        }
      }();
      ++stats.rank_calls;
      if (!outs.ok())
        return "rank " + std::to_string(r) + " " + n.qualifiedOp() + " (%" +
               g.value(n.outputs.at(0)).debug_name + ") failed: " + outs.error().message();
      for (size_t j = 0; j < n.outputs.size(); ++j) env[n.outputs[j].v] = (*outs)[j];
    }
    exit_locals[static_cast<size_t>(r)] = env.at(exit.outputs.at(0).v).toTensor();
  }
  const strategy::Strategy& s = member_strategies[exit_at];
  if (s.outputs.empty() || !s.outputs[0]) return std::string("the exit has no output placement");
  // float32 sums in another order (each rank sorts its own rows): the error scales with the
  // largest value (products of standard normal activations and weights reach thousands).
  const at::Tensor reference = full.at(exit.outputs.at(0).v).toTensor();
  const double scale = reference.numel() ? reference.abs().max().item<double>() : 0.0;
  if (auto bad = checkLayout(exit_locals, reference, *s.outputs[0], mesh,
                             Tolerance{kFloat32Tolerance.rtol, 1e-6 * scale + 1e-6}))
    return "exit %" + g.value(exit.outputs.at(0)).debug_name + " as " +
           mesh::toString(*s.outputs[0]) + ": " + *bad;
  return std::nullopt;
}

}  // namespace apc::validator
