//===- lib/runtime/interpreter.cpp - Executing IR graphs op by op ----------===//
//
// Operator resolution through the JIT registry, constant conversion for schema arguments, the
// hand-written structural prim ops, vocab-parallel embedding masks and the node loop (see
// apc/runtime/interpreter.h).
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/interpreter.h"

#include <ATen/ATen.h>
#include <torch/csrc/jit/runtime/operator.h>

#include "apc/support/activity.h"

namespace apc::runtime {

std::string firstLine(const std::string& what) {
  size_t nl = what.find('\n');
  std::string first = nl == std::string::npos ? what : what.substr(0, nl);
  // The TorchScript interpreter's errors open with a fixed sentence and a traceback; the cause is
  // the last `SomethingError: ...` line.
  if (first.rfind("The following operation failed in the TorchScript interpreter", 0) != 0)
    return first;
  std::string cause;
  size_t pos = 0;
  while (pos < what.size()) {
    size_t end = what.find('\n', pos);
    if (end == std::string::npos) end = what.size();
    std::string line = what.substr(pos, end - pos);
    size_t colon = line.find(": ");
    if (colon != std::string::npos && colon >= 5 && line.compare(colon - 5, 5, "Error") == 0 &&
        line.find(' ') > colon)
      cause = line;
    pos = end + 1;
  }
  return cause.empty() ? first : cause;
}

namespace {

/// The argument's real type with Optional stripped.
c10::TypeKind argKind(const c10::Argument& arg) {
  c10::TypePtr t = arg.real_type();
  if (t->kind() == c10::TypeKind::OptionalType)
    t = t->expectRef<c10::OptionalType>().getElementType();
  return t->kind();
}

}  // namespace

at::Tensor tensorLiteral(const ir::TensorMeta& meta, const ir::Constant& c,
                         const InterpreterOptions& options) {
  c10::ScalarType dtype = scalarTypeOf(meta.dtype);
  if (options.widen_floats && ir::isFloating(meta.dtype)) dtype = at::kDouble;
  at::TensorOptions o = at::TensorOptions().dtype(dtype).device(options.device);
  if (const auto* d = std::get_if<double>(&c)) return at::scalar_tensor(*d, o);
  if (const auto* i = std::get_if<int64_t>(&c)) return at::scalar_tensor(*i, o);
  if (const auto* b = std::get_if<bool>(&c)) return at::scalar_tensor(*b, o);
  return at::zeros({}, o);
}

Expected<c10::IValue> constantToIValue(const ir::Constant& c, const c10::Argument* arg,
                                       const InterpreterOptions& options) {
  c10::TypeKind kind = arg ? argKind(*arg) : c10::TypeKind::AnyType;
  if (std::holds_alternative<ir::None>(c)) return c10::IValue();
  if (const auto* i = std::get_if<int64_t>(&c)) {
    if (kind == c10::TypeKind::FloatType) return c10::IValue(static_cast<double>(*i));
    if (options.widen_floats && kind == c10::TypeKind::ScalarTypeType) {
      auto st = static_cast<c10::ScalarType>(*i);
      if (st == at::kFloat || st == at::kHalf || st == at::kBFloat16)
        return c10::IValue(static_cast<int64_t>(at::kDouble));
    }
    return c10::IValue(*i);
  }
  if (const auto* d = std::get_if<double>(&c)) return c10::IValue(*d);
  if (const auto* b = std::get_if<bool>(&c)) return c10::IValue(*b);
  if (const auto* s = std::get_if<std::string>(&c)) {
    if (kind == c10::TypeKind::DeviceObjType) {
      // The importer interprets on meta tensors, so a device taken from a tensor (prim::device in
      // scripted models) is recorded as "meta"; it runs where the module's tensors live. A model
      // traced or exported on the CPU records "cpu" for `device=x.device` factories (arange of
      // positions, causal masks): those too run on the module's device, or a CUDA run would mix
      // devices in the first op that meets them.
      if (*s == "meta" || *s == "cpu") return c10::IValue(options.device);
      try {
        return c10::IValue(c10::Device(*s));
      } catch (const std::exception& e) {
        rethrowIfOutOfMemory(e);
        return invalidArgument("bad device constant \"" + *s + "\": " + firstLine(e.what()));
      }
    }
    return c10::IValue(*s);
  }
  if (const auto* l = std::get_if<std::vector<int64_t>>(&c)) return c10::IValue(*l);
  if (const auto* l = std::get_if<std::vector<double>>(&c)) return c10::IValue(*l);
  if (const auto* l = std::get_if<std::vector<bool>>(&c)) {
    c10::List<bool> list;
    for (bool b : *l) list.push_back(b);
    return c10::IValue(list);
  }
  return internalError("unhandled constant kind");
}

// --- OpKernel --------------------------------------------------------------------------------

Expected<OpKernel> OpKernel::resolve(const ir::Node& node, ir::ValueType output_type) {
  OpKernel op;
  op.name_ = node.op;
  if (node.op == "prim::ListConstruct") {
    op.kind_ = Kind::kListConstruct;
    op.list_type_ = output_type;
    return op;
  }
  if (node.op == "prim::ListUnpack") {
    op.kind_ = Kind::kListUnpack;
    return op;
  }
  if (node.op == "prim::TupleConstruct") {
    op.kind_ = Kind::kTupleConstruct;
    return op;
  }
  if (node.op == "prim::TupleUnpack") {
    op.kind_ = Kind::kTupleUnpack;
    return op;
  }
  // aten::view runs as aten::reshape (same arguments; a view whenever one exists): a local
  // piece can have strides the global tensor did not (a slice of a sharded dim, an op's local
  // output), so a view the model takes globally may need a copy locally. Writes through views
  // are functionalized at import, so nothing depends on the alias.
  const bool view_as_reshape = node.op == "aten::view" && node.overload.empty();
  std::shared_ptr<torch::jit::Operator> found;
  try {
    found = torch::jit::findOperatorFor(
        c10::OperatorName(view_as_reshape ? "aten::reshape" : node.op, node.overload));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return notFound("operator " + node.qualifiedOp() + ": " + firstLine(e.what()));
  }
  if (!found) return notFound("no registered operator " + node.qualifiedOp());
  op.schema_ = &found->schema();
  const auto& schema_args = op.schema_->arguments();
  for (size_t i = 0; i < schema_args.size(); ++i)
    if (auto list = schema_args[i].type()->cast<c10::ListType>())
      if (auto opt = list->getElementType()->cast<c10::OptionalType>())
        if (opt->getElementType()->kind() == c10::TypeKind::TensorType)
          op.optional_tensor_lists_.push_back(i);
  try {
    torch::jit::Operation operation = found->getOperation();
    op.op_ = [operation](std::vector<c10::IValue>& stack) mutable { operation(stack); };
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return unsupported("operator " + node.qualifiedOp() +
                       " needs a graph node to run: " + firstLine(e.what()));
  }
  return op;
}

namespace {

/// A list IValue of the element kind of `args` (tensors, ints, floats, bools); an empty one of
/// the element kind of `type` (the node's output type), else of tensors.
c10::IValue makeList(std::vector<c10::IValue>& args, ir::ValueType type) {
  if (args.empty()) {
    if (type == ir::ValueType::kIntList) return c10::List<int64_t>();
    if (type == ir::ValueType::kFloatList) return c10::List<double>();
    if (type == ir::ValueType::kBoolList) return c10::List<bool>();
  }
  if (args.empty() || args.front().isTensor()) {
    c10::List<at::Tensor> list;
    for (c10::IValue& a : args) list.push_back(std::move(a).toTensor());
    return list;
  }
  if (args.front().isInt()) {
    c10::List<int64_t> list;
    for (const c10::IValue& a : args) list.push_back(a.toInt());
    return list;
  }
  if (args.front().isDouble()) {
    c10::List<double> list;
    for (const c10::IValue& a : args) list.push_back(a.toDouble());
    return list;
  }
  if (args.front().isBool()) {
    c10::List<bool> list;
    for (const c10::IValue& a : args) list.push_back(a.toBool());
    return list;
  }
  // Optional tensors and other mixtures: a generic list.
  c10::impl::GenericList list(c10::AnyType::get());
  for (c10::IValue& a : args) list.push_back(std::move(a));
  return list;
}

}  // namespace

std::vector<c10::IValue> OpKernel::call(std::vector<c10::IValue> args) const {
  std::vector<c10::IValue> out;
  switch (kind_) {
    case Kind::kListConstruct:
      out.push_back(makeList(args, list_type_));
      break;
    case Kind::kListUnpack:
      TORCH_CHECK(args.size() == 1 && args[0].isList(), "prim::ListUnpack of a non-list");
      for (const c10::IValue& e : args[0].toListRef()) out.push_back(e);
      break;
    case Kind::kTupleConstruct:
      out.emplace_back(c10::ivalue::Tuple::create(std::move(args)));
      break;
    case Kind::kTupleUnpack:
      TORCH_CHECK(args.size() == 1 && args[0].isTuple(), "prim::TupleUnpack of a non-tuple");
      for (const c10::IValue& e : args[0].toTupleRef().elements()) out.push_back(e);
      break;
    case Kind::kOperator:
      for (size_t i : optional_tensor_lists_)
        if (i < args.size() && args[i].isTensorList()) {
          c10::List<std::optional<at::Tensor>> typed;
          for (const at::Tensor& t : args[i].toTensorList().vec()) typed.push_back(t);
          args[i] = std::move(typed);
        }
      op_(args);
      out = std::move(args);
      break;
  }
  return out;
}

Expected<std::vector<c10::IValue>> OpKernel::run(std::vector<c10::IValue> args,
                                                 size_t num_outputs) const {
  std::vector<c10::IValue> out;
  try {
    out = call(std::move(args));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return unsupported(name_ + ": " + firstLine(e.what()));
  }
  if (out.size() != num_outputs)
    return internalError(name_ + " returned " + std::to_string(out.size()) +
                         " values, the node has " + std::to_string(num_outputs) + " outputs");
  return out;
}

// --- Interpreter -----------------------------------------------------------------------------

namespace {

std::string nodeLabel(const ir::Node& n) {
  std::string s = "node " + std::to_string(n.id.v) + " " +
                  (n.kind == ir::NodeKind::kOp ? n.qualifiedOp() : std::string(n.op));
  if (!n.name.empty()) s += " " + n.name;
  if (!n.module_path.empty()) s += " (" + n.module_path + ")";
  return s;
}

}  // namespace

Expected<Interpreter> Interpreter::create(std::shared_ptr<const ir::Graph> graph,
                                          const InterpreterOptions& options,
                                          std::vector<bool> external,
                                          std::vector<VocabMaskSpec> vocab_masks,
                                          std::vector<SymbolicArgSpec> symbolic_args) {
  Interpreter in;
  in.graph_ = std::move(graph);
  in.options_ = options;
  in.masks_ = std::move(vocab_masks);
  in.symbolic_ = std::move(symbolic_args);
  const ir::Graph& g = *in.graph_;
  external.resize(g.numNodes(), false);
  std::vector<int> mask_of(g.numNodes(), -1);
  for (size_t i = 0; i < in.masks_.size(); ++i) {
    const VocabMaskSpec& m = in.masks_[i];
    if (!m.node.valid() || m.node.v >= g.numNodes() || g.node(m.node).op != "aten::embedding")
      return invalidArgument("vocab mask names node " + std::to_string(m.node.v) +
                             ", which is not an aten::embedding");
    mask_of[m.node.v] = static_cast<int>(i);
  }

  // Last use of each value (by node index); outputs live to the end.
  std::vector<int64_t> last_use(g.numValues(), -1);
  for (const ir::Node& n : g.nodes())
    for (ir::ValueId v : n.inputs) last_use[v.v] = n.id.v;
  for (ir::ValueId v : g.outputs().leaves()) {
    last_use[v.v] = static_cast<int64_t>(g.numNodes());
    in.output_values_.push_back(v.v);
  }

  std::vector<std::vector<size_t>> symbolic_of(g.numNodes());
  for (size_t i = 0; i < in.symbolic_.size(); ++i) {
    const SymbolicArgSpec& a = in.symbolic_[i];
    if (!a.node.valid() || a.node.v >= g.numNodes() || a.input >= g.node(a.node).inputs.size())
      return invalidArgument("symbolic argument " + std::to_string(i) + " names node " +
                             std::to_string(a.node.v) + " input " + std::to_string(a.input) +
                             ", which the program does not have");
    const ir::Value& v = g.value(g.node(a.node).inputs[a.input]);
    const auto* list = v.constant ? std::get_if<std::vector<int64_t>>(&*v.constant) : nullptr;
    const bool fits = v.constant && !v.producer.valid() &&
                      (a.element < 0 ? std::holds_alternative<int64_t>(*v.constant)
                                     : list && a.element < static_cast<int64_t>(list->size()));
    if (!fits)
      return invalidArgument(nodeLabel(g.node(a.node)) + ": symbolic argument " +
                             std::to_string(a.input) + " is not an int constant or int[] element");
    symbolic_of[a.node.v].push_back(i);
  }

  for (const ir::Node& n : g.nodes()) {
    Step s;
    s.node = n.id;
    s.symbolic = symbolic_of[n.id.v];
    s.external = n.kind != ir::NodeKind::kOp || external[n.id.v];
    s.mask = mask_of[n.id.v];
    if (!s.external) {
      auto kernel = OpKernel::resolve(
          n, n.outputs.empty() ? ir::ValueType::kOther : g.value(n.outputs[0]).type);
      if (!kernel.ok()) return kernel.error().withContext(nodeLabel(n));
      s.kernel = std::move(kernel).value();
    }
    const c10::FunctionSchema* schema = s.kernel.schema();
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ir::Value& v = g.value(n.inputs[i]);
      const bool constant = !v.producer.valid();
      s.is_constant.push_back(constant);
      if (!constant) {
        s.constant_args.emplace_back();
        continue;
      }
      if (!v.constant)
        return invalidArgument(nodeLabel(n) + ": input " + std::to_string(i) + " (%" +
                               v.debug_name + ") has neither a producer nor a constant");
      if (v.isTensor() && v.tensor) {
        s.constant_args.emplace_back(tensorLiteral(*v.tensor, *v.constant, in.options_));
        continue;
      }
      const c10::Argument* arg =
          schema && i < schema->arguments().size() ? &schema->arguments()[i] : nullptr;
      auto iv = constantToIValue(*v.constant, arg, in.options_);
      if (!iv.ok()) return iv.error().withContext(nodeLabel(n));
      s.constant_args.push_back(std::move(iv).value());
    }
    for (ir::ValueId v : n.inputs)
      if (last_use[v.v] == static_cast<int64_t>(n.id.v) && g.value(v).producer.valid())
        s.free_after.push_back(v.v);
    // Outputs nobody reads are dropped right away.
    for (ir::ValueId v : n.outputs)
      if (last_use[v.v] < 0) s.free_after.push_back(v.v);
    in.steps_.push_back(std::move(s));
  }
  return in;
}

std::vector<c10::IValue> callMaskedEmbedding(const OpKernel& kernel, std::vector<c10::IValue> args,
                                             const VocabMaskSpec& mask) {
  at::Tensor indices = args.at(1).toTensor();
  at::Tensor shifted = indices - mask.row_offset;
  at::Tensor outside = (shifted < 0).logical_or(shifted >= mask.rows);
  args[1] = shifted.masked_fill(outside, 0);
  std::vector<c10::IValue> out = kernel.call(std::move(args));
  at::Tensor rows = out.at(0).toTensor();
  out[0] = rows.masked_fill(outside.unsqueeze(-1), 0);
  return out;
}

Expected<std::vector<c10::IValue>> Interpreter::run(
    const ExternalFn& external, Observer* observer,
    const std::vector<int64_t>& symbolic_values) const {
  const ir::Graph& g = *graph_;
  if (symbolic_values.size() != symbolic_.size())
    return internalError("the program has " + std::to_string(symbolic_.size()) +
                         " symbolic arguments, the run was given " +
                         std::to_string(symbolic_values.size()) + " values");
  std::vector<c10::IValue> env(g.numValues());
  for (const Step& s : steps_) {
    const ir::Node& n = g.node(s.node);
    std::vector<c10::IValue> args;
    args.reserve(n.inputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i)
      args.push_back(s.is_constant[i] ? s.constant_args[i] : env[n.inputs[i].v]);
    for (size_t k : s.symbolic) {
      const SymbolicArgSpec& a = symbolic_[k];
      c10::IValue& arg = args[a.input];
      if (a.element < 0) {
        arg = c10::IValue(symbolic_values[k]);
      } else {
        std::vector<int64_t> list = arg.toIntVector();
        list[static_cast<size_t>(a.element)] = symbolic_values[k];
        arg = c10::IValue(list);
      }
    }
    std::vector<c10::IValue> out;
    try {
      if (observer) observer->before(n, args);
      if (s.external)
        out = external(n, args);
      else if (s.mask >= 0)
        out = callMaskedEmbedding(s.kernel, std::move(args), masks_[static_cast<size_t>(s.mask)]);
      else
        out = s.kernel.call(std::move(args));
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      return unsupported(nodeLabel(n) + ": " + firstLine(e.what()));
    }
    if (out.size() != n.outputs.size())
      return internalError(nodeLabel(n) + " returned " + std::to_string(out.size()) +
                           " values, the node has " + std::to_string(n.outputs.size()) +
                           " outputs");
    // A copy (a reference count), so that the observer sees the outputs even when unused.
    for (size_t i = 0; i < out.size(); ++i) env[n.outputs[i].v] = out[i];
    for (uint32_t v : s.free_after) env[v] = c10::IValue();
    if (observer) {
      try {
        observer->after(n, out, env);
      } catch (const std::exception& e) {
        rethrowIfOutOfMemory(e);
        return unsupported(nodeLabel(n) + ": " + firstLine(e.what()));
      }
    }
  }
  std::vector<c10::IValue> leaves;
  leaves.reserve(output_values_.size());
  for (uint32_t v : output_values_) {
    const ir::Value& val = g.value(ir::ValueId(v));
    if (!val.producer.valid() && val.constant && val.isTensor() && val.tensor) {
      leaves.emplace_back(tensorLiteral(*val.tensor, *val.constant, options_));
    } else if (!val.producer.valid() && val.constant) {
      auto iv = constantToIValue(*val.constant, nullptr, options_);
      if (!iv.ok()) return iv.error();
      leaves.push_back(std::move(iv).value());
    } else {
      leaves.push_back(env[v]);
    }
  }
  return leaves;
}

namespace {

c10::IValue pack(const ir::OutputTree& t, const std::vector<c10::IValue>& leaves, size_t& next) {
  switch (t.kind) {
    case ir::OutputTree::Kind::kLeaf:
      return leaves.at(next++);
    case ir::OutputTree::Kind::kTuple: {
      std::vector<c10::IValue> elems;
      for (const ir::OutputTree& c : t.children) elems.push_back(pack(c, leaves, next));
      return c10::ivalue::Tuple::create(std::move(elems));
    }
    case ir::OutputTree::Kind::kList: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const ir::OutputTree& c : t.children) list.push_back(pack(c, leaves, next));
      return list;
    }
    case ir::OutputTree::Kind::kDict: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (size_t i = 0; i < t.children.size(); ++i)
        dict.insert(t.keys.at(i), pack(t.children[i], leaves, next));
      return dict;
    }
  }
  return {};
}

}  // namespace

c10::IValue packOutputs(const ir::OutputTree& tree, const std::vector<c10::IValue>& leaves) {
  size_t next = 0;
  return pack(tree, leaves, next);
}

}  // namespace apc::runtime
