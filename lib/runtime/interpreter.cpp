//===- lib/runtime/interpreter.cpp - Executing IR graphs op by op ----------===//
//
// Operator resolution through the JIT registry, constant conversion for schema arguments, the
// hand-written structural prim ops and the node loop (see
// apc/runtime/interpreter.h).
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/interpreter.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>

#include "apc/support/activity.h"
#include "apc/support/hash.h"

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
  const bool einsum_operands =
      node.op == "aten::einsum" && node.overload == ir::kEinsumOperandsOverload;
  // aten::view runs as aten::reshape (same arguments; a view whenever one exists): a local
  // piece can have strides the global tensor did not (a slice of a sharded dim, an op's local
  // output), so a view the model takes globally may need a copy locally. Writes through views
  // are functionalized at import, so nothing depends on the alias.
  const bool view_as_reshape = node.op == "aten::view" && node.overload.empty();
  std::shared_ptr<torch::jit::Operator> found;
  try {
    found = torch::jit::findOperatorFor(
        c10::OperatorName(view_as_reshape ? "aten::reshape" : node.op,
                          einsum_operands ? std::string() : node.overload));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return notFound("operator " + node.qualifiedOp() + ": " + firstLine(e.what()));
  }
  if (!found) return notFound("no registered operator " + node.qualifiedOp());
  // aten::einsum.operands' inputs are not aten::einsum's arguments one by one: no schema.
  if (einsum_operands) op.kind_ = Kind::kEinsumOperands;
  // The functional aten::copy, which functionalizing `t[...] = v` records, has no derivative in
  // torch: it runs as copy_ into a fresh tensor like self, which has one.
  if (node.op == "aten::copy" && node.overload.empty()) op.kind_ = Kind::kCopy;
  op.schema_ = einsum_operands ? nullptr : &found->schema();
  const auto& schema_args = found->schema().arguments();
  for (size_t i = 0; i < schema_args.size() && !einsum_operands; ++i)
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
  // Tensors with Nones among them (the indices of x[:, :, idx]): the optional-tensor list that
  // index and index_put take (a generic list is refused by their Tensor?[] argument).
  const auto nones =
      std::count_if(args.begin(), args.end(), [](const auto& a) { return a.isNone(); });
  const auto tensors =
      std::count_if(args.begin(), args.end(), [](const auto& a) { return a.isTensor(); });
  if (nones > 0 && tensors > 0 && static_cast<size_t>(nones + tensors) == args.size()) {
    c10::List<std::optional<at::Tensor>> list;
    for (c10::IValue& a : args)
      list.push_back(a.isNone() ? std::optional<at::Tensor>() : std::move(a).toTensor());
    return list;
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
    case Kind::kEinsumOperands: {
      // (equation, t0, t1, ...) -> aten::einsum(equation, [t0, t1, ...], path=None)
      TORCH_CHECK(!args.empty(), "aten::einsum.operands without an equation");
      c10::List<at::Tensor> operands;
      for (size_t i = 1; i < args.size(); ++i) operands.push_back(std::move(args[i]).toTensor());
      std::vector<c10::IValue> stack{std::move(args[0]), std::move(operands), c10::IValue()};
      op_(stack);
      out = std::move(stack);
      break;
    }
    case Kind::kCopy: {
      // copy(self, src, non_blocking): self's shape, dtype, device and strides, filled with src
      // broadcast. The gradient reaches src (summed over its broadcast dims), not self, whose
      // values the copy overwrites.
      TORCH_CHECK(args.size() >= 2 && args[0].isTensor() && args[1].isTensor(),
                  "aten::copy takes the tensors self and src");
      at::Tensor result = at::empty_like(args[0].toTensor(), at::MemoryFormat::Preserve);
      result.copy_(args[1].toTensor(), args.size() > 2 && args[2].isBool() && args[2].toBool());
      out.emplace_back(std::move(result));
      break;
    }
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

/// A checkpoint segment, prepared (Interpreter::create).
struct Interpreter::Segment {
  std::string module;
  std::shared_ptr<const ir::Graph> graph;
  c10::Device device = c10::kCPU;
  std::vector<Step> steps;  // copies of the interpreter's steps [first, last]
  std::vector<SymbolicArgSpec> symbolic;
  std::vector<uint32_t> inputs;  // values defined before the segment and read inside
  std::vector<bool> written;  // per input: written in place inside (a buffer, ir::checkpointRange)
  std::vector<uint32_t> outputs;  // tensor values defined inside and read after it
  std::vector<uint32_t> leaves;   // buffer leaf nodes among the ops: run before, read as inputs
  bool has_external = false;
};

Expected<Interpreter> Interpreter::create(std::shared_ptr<const ir::Graph> graph,
                                          const InterpreterOptions& options,
                                          std::vector<bool> external,
                                          std::vector<SymbolicArgSpec> symbolic_args,
                                          std::vector<CheckpointSpec> checkpoints) {
  Interpreter in;
  in.graph_ = std::move(graph);
  in.options_ = options;
  in.symbolic_ = std::move(symbolic_args);
  const ir::Graph& g = *in.graph_;
  external.resize(g.numNodes(), false);

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
    if (!s.external && in.options_.mixed_compute && mixedPrecisionCastsArguments(n.op))
      s.cast_floats = in.options_.mixed_compute;
    if (auto it = in.options_.random_streams.find(n.id.v); it != in.options_.random_streams.end())
      s.random_stream = it->second;
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
  // Checkpoint segments: inside the graph, disjoint, in order, op nodes only; their inputs (values
  // defined before them and read inside) and outputs (values defined inside and read after them,
  // or graph outputs), tensors (sizes and scalars read later stay in the environment).
  in.checkpoints_ = std::move(checkpoints);
  in.segment_at_.assign(g.numNodes(), -1);
  int64_t previous_last = -1;
  for (size_t k = 0; k < in.checkpoints_.size(); ++k) {
    const CheckpointSpec& c = in.checkpoints_[k];
    const std::string what = "checkpoint segment " + std::to_string(k) + " ('" + c.module +
                             "', nodes " + std::to_string(c.first) + ".." + std::to_string(c.last) +
                             ")";
    if (c.first > c.last || c.last >= g.numNodes())
      return invalidArgument(what + " is not a node range of the " + std::to_string(g.numNodes()) +
                             "-node program");
    if (static_cast<int64_t>(c.first) <= previous_last)
      return invalidArgument(what +
                             " overlaps or precedes the segment before it (which ends at "
                             "node " +
                             std::to_string(previous_last) + ")");
    previous_last = c.last;
    auto seg = std::make_shared<Segment>();
    seg->module = c.module;
    seg->graph = in.graph_;
    seg->device = in.options_.device;
    seg->symbolic = in.symbolic_;
    std::set<uint32_t> inputs;
    for (uint32_t i = c.first; i <= c.last; ++i) {
      const ir::Node& n = g.node(ir::NodeId(i));
      if (n.kind == ir::NodeKind::kBuffer) {  // read by the segment like a value from before it
        seg->leaves.push_back(i);
        for (ir::ValueId v : n.outputs) inputs.insert(v.v);
        continue;
      }
      if (n.kind != ir::NodeKind::kOp)
        return invalidArgument(what + " holds " + nodeLabel(n) + ", which is not an op node");
      seg->has_external = seg->has_external || in.steps_[i].external;
      seg->steps.push_back(in.steps_[i]);
      for (ir::ValueId v : n.inputs) {
        const ir::Value& val = g.value(v);
        if (val.producer.valid() && val.producer.v < c.first) inputs.insert(v.v);
      }
      for (ir::ValueId v : n.outputs) {
        if (last_use[v.v] <= static_cast<int64_t>(c.last)) continue;
        // A size or scalar read later (one layer's size arithmetic reused by the next) is the
        // forward's value, left in the environment; a value that may hold tensors must be one.
        if (!g.value(v).isTensor() && !g.value(v).mayHoldTensors()) continue;
        if (!g.value(v).isTensor())
          return invalidArgument(what + ": " + nodeLabel(n) + " defines %" + g.value(v).debug_name +
                                 ", read after the segment, which is not a tensor");
        seg->outputs.push_back(v.v);
      }
    }
    seg->inputs.assign(inputs.begin(), inputs.end());
    std::set<uint32_t> written;
    for (ir::ValueId v : ir::outsideValuesWritten(g, c.first, c.last)) written.insert(v.v);
    for (uint32_t v : seg->inputs) seg->written.push_back(written.count(v) > 0);
    in.segment_at_[c.first] = static_cast<int>(in.segments_.size());
    in.segments_.push_back(std::move(seg));
  }
  return in;
}

bool mixedPrecisionCastsArguments(const std::string& op) {
  static const std::set<std::string> ops = {
      // Contractions.
      "aten::linear", "aten::matmul", "aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm",
      "aten::addbmm", "aten::einsum", "aten::conv1d", "aten::conv2d", "aten::conv3d",
      "aten::convolution", "aten::_convolution", "aten::conv_transpose1d", "aten::conv_transpose2d",
      "aten::conv_transpose3d", "aten::scaled_dot_product_attention", "aten::_grouped_mm",
      // Normalizations (ATen's CPU kernels take a bf16 input with f32 weights, not the reverse).
      "aten::layer_norm", "aten::native_layer_norm", "aten::group_norm", "aten::native_group_norm",
      "aten::batch_norm", "aten::native_batch_norm", "aten::_native_batch_norm_legit",
      "aten::_native_batch_norm_legit_no_training", "aten::instance_norm", "aten::rms_norm",
      "aten::_fused_rms_norm"};
  return ops.count(op) > 0;
}

namespace {

/// A contraction's floating tensor arguments (tensor lists' elements too) cast to `dtype` when
/// they are not all of one dtype (InterpreterOptions::mixed_compute).
void castDisagreeingFloats(std::vector<c10::IValue>& args, c10::ScalarType dtype) {
  std::optional<c10::ScalarType> seen;
  bool disagree = false;
  auto look = [&](const at::Tensor& t) {
    if (!t.defined() || !at::isFloatingType(t.scalar_type())) return;
    if (seen && *seen != t.scalar_type()) disagree = true;
    seen = t.scalar_type();
  };
  for (const c10::IValue& a : args) {
    if (a.isTensor()) look(a.toTensor());
    if (a.isTensorList())
      for (const at::Tensor& t : a.toTensorVector()) look(t);
  }
  if (!disagree) return;
  auto cast = [&](const at::Tensor& t) {
    return t.defined() && at::isFloatingType(t.scalar_type()) && t.scalar_type() != dtype
               ? t.to(dtype)
               : t;
  };
  for (c10::IValue& a : args) {
    if (a.isTensor()) a = cast(a.toTensor());
    if (a.isTensorList()) {
      std::vector<at::Tensor> ts = a.toTensorVector();
      for (at::Tensor& t : ts) t = cast(t);
      a = c10::IValue(ts);
    }
  }
}

}  // namespace

/// The random-number state of the CPU default generator and, for a CUDA device, of that device's:
/// captured in a segment's forward, restored for its recomputation, then put back; and put back
/// after a node that drew from a random stream of its own.
struct RngState {
  at::Tensor cpu;
  std::optional<c10::Device> cuda;
  at::Tensor cuda_state;

  static RngState capture(c10::Device device) {
    RngState r;
    {
      at::Generator gen = at::globalContext().defaultGenerator(c10::DeviceType::CPU);
      std::lock_guard<std::mutex> lock(gen.mutex());
      r.cpu = gen.get_state();
    }
    if (device.is_cuda()) {
      at::Generator gen = at::globalContext().defaultGenerator(device);
      std::lock_guard<std::mutex> lock(gen.mutex());
      r.cuda = device;
      r.cuda_state = gen.get_state();
    }
    return r;
  }

  void restore() const {
    {
      at::Generator gen = at::globalContext().defaultGenerator(c10::DeviceType::CPU);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(cpu);
    }
    if (cuda) {
      at::Generator gen = at::globalContext().defaultGenerator(*cuda);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(cuda_state);
    }
  }
};

/// Seeds the default generators a node on `device` draws from (the CPU's, and the device's on
/// CUDA) with the random stream `stream` of the run seeded `run_seed`.
static void seedStream(uint64_t run_seed, uint64_t stream, c10::Device device) {
  const uint64_t seed = mixSeeds(run_seed, stream + 1);
  {
    at::Generator gen = at::globalContext().defaultGenerator(c10::DeviceType::CPU);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  if (device.is_cuda()) {
    at::Generator gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
}

Status Interpreter::runSteps(const ir::Graph& g, const std::vector<Step>& steps, size_t begin,
                             size_t end, std::vector<c10::IValue>& env, const RunContext& ctx) {
  const std::vector<SymbolicArgSpec>& symbolic = *ctx.symbolic;
  const std::vector<int64_t>& symbolic_values = *ctx.symbolic_values;
  Observer* observer = ctx.observer;
  for (size_t si = begin; si < end; ++si) {
    const Step& s = steps[si];
    const ir::Node& n = g.node(s.node);
    std::vector<c10::IValue> args;
    args.reserve(n.inputs.size());
    for (size_t i = 0; i < n.inputs.size(); ++i)
      args.push_back(s.is_constant[i] ? s.constant_args[i] : env[n.inputs[i].v]);
    for (size_t k : s.symbolic) {
      const SymbolicArgSpec& a = symbolic[k];
      c10::IValue& arg = args[a.input];
      if (a.element < 0) {
        arg = c10::IValue(symbolic_values[k]);
      } else {
        std::vector<int64_t> list = arg.toIntVector();
        list[static_cast<size_t>(a.element)] = symbolic_values[k];
        arg = c10::IValue(list);
      }
    }
    if (s.cast_floats) castDisagreeingFloats(args, *s.cast_floats);
    std::vector<c10::IValue> out;
    std::optional<RngState> drawn_from;  // the generators' state before a node's own stream
    try {
      if (observer) observer->before(n, args);
      if (s.random_stream) {
        drawn_from = RngState::capture(ctx.device);
        seedStream(ctx.random_seed, *s.random_stream, ctx.device);
      }
      if (s.external) {
        TORCH_CHECK(ctx.external,
                    "no external callback for this run (a checkpoint segment's "
                    "recomputation needs one)");
        out = (*ctx.external)(n, args);
      } else {
        out = s.kernel.call(std::move(args));
      }
      if (drawn_from) drawn_from->restore();
    } catch (const std::exception& e) {
      if (drawn_from) drawn_from->restore();
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
  return Status::success();
}

// --- Checkpoint segments ---------------------------------------------------------------------

/// What a segment's autograd function holds: the prepared segment, the recompute callback, the
/// run's symbolic values, the non-tensor inputs and the random-number state of the forward. The
/// forward-only pointers (env, external, observer) are valid during the forward call only.
struct CheckpointState : torch::CustomClassHolder {
  std::shared_ptr<const void> segment;  // Interpreter::Segment
  std::shared_ptr<const Interpreter::ExternalFn> recompute;
  std::vector<int64_t> symbolic_values;
  uint64_t random_seed = 0;
  std::vector<c10::IValue> captured;  // per segment input: its non-tensor value (None: a tensor)
  std::vector<bool> is_tensor;        // per segment input
  std::vector<bool> requires_grad;    // per segment input
  RngState rng;
  // During forward only.
  std::vector<c10::IValue>* env = nullptr;
  const Interpreter::ExternalFn* external = nullptr;
  Interpreter::Observer* observer = nullptr;
  std::optional<Error> error;
};

/// The autograd function of one checkpoint segment run (PyTorch's reentrant checkpoint).
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  using Segment = Interpreter::Segment;
  struct Failed {};  // the forward failed: CheckpointState::error says why

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::intrusive_ptr<CheckpointState>& st,
                                                at::TensorList inputs) {
    const auto& seg = *std::static_pointer_cast<const Segment>(st->segment);
    st->rng = RngState::capture(seg.device);
    // Grad mode is off here (Function::apply): nothing inside is recorded or saved.
    const Interpreter::RunContext run{st->external,         st->observer,    &seg.symbolic,
                                      &st->symbolic_values, st->random_seed, seg.device};
    Status s = Interpreter::runSteps(*seg.graph, seg.steps, 0, seg.steps.size(), *st->env, run);
    if (!s.ok()) {
      st->error = s.error();
      throw Failed{};
    }
    torch::autograd::variable_list outputs;
    std::set<const c10::TensorImpl*> seen;
    for (uint32_t v : seg.outputs) {
      const c10::IValue& iv = (*st->env)[v];
      if (!iv.isTensor()) {
        st->error = internalError("checkpoint segment '" + seg.module + "': value %" +
                                  seg.graph->value(ir::ValueId(v)).debug_name +
                                  ", read after it, is not a tensor at run time");
        throw Failed{};
      }
      at::Tensor t = iv.toTensor();
      // The same tensor twice among the outputs (an op that returned its input): a view each
      // further time, so that every output of the function is a tensor of its own.
      if (t.defined() && !seen.insert(t.unsafeGetTensorImpl()).second) t = t.view_as(t);
      outputs.push_back(t);
    }
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["state"] = c10::IValue::make_capsule(st);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const c10::intrusive_ptr<torch::CustomClassHolder> held = ctx->saved_data["state"].toCapsule();
    auto st = c10::intrusive_ptr<CheckpointState>::reclaim_copy(
        static_cast<CheckpointState*>(held.get()));
    const auto& seg = *std::static_pointer_cast<const Segment>(st->segment);
    torch::autograd::variable_list saved = ctx->get_saved_variables();
    std::vector<c10::IValue> env(seg.graph->numValues());
    std::vector<at::Tensor> detached;  // per tensor input
    size_t t = 0;
    for (size_t k = 0; k < seg.inputs.size(); ++k) {
      if (!st->is_tensor[k]) {
        env[seg.inputs[k]] = st->captured[k];
        continue;
      }
      at::Tensor d = saved.at(t++).detach();
      // State the segment writes (running statistics): the recomputation writes a copy, so the
      // forward's update is the only one.
      if (seg.written[k]) d = d.clone();
      if (st->requires_grad[k]) d.requires_grad_(true);
      env[seg.inputs[k]] = d;
      detached.push_back(d);
    }
    {
      // The forward's random numbers again (dropout masks), then the state put back.
      const RngState now = RngState::capture(seg.device);
      st->rng.restore();
      Status s;
      {
        at::AutoGradMode grad(true);
        const Interpreter::RunContext run{st->recompute.get(),  nullptr,         &seg.symbolic,
                                          &st->symbolic_values, st->random_seed, seg.device};
        s = Interpreter::runSteps(*seg.graph, seg.steps, 0, seg.steps.size(), env, run);
      }
      now.restore();
      TORCH_CHECK(s.ok(), "checkpoint segment '", seg.module,
                  "' recomputation: ", s.ok() ? std::string() : s.error().message());
    }
    torch::autograd::variable_list outs, out_grads;
    for (size_t i = 0; i < seg.outputs.size() && i < grads.size(); ++i) {
      const c10::IValue& iv = env[seg.outputs[i]];
      if (!grads[i].defined() || !iv.isTensor()) continue;
      const at::Tensor& o = iv.toTensor();
      if (!o.defined() || !o.requires_grad()) continue;
      outs.push_back(o);
      out_grads.push_back(grads[i]);
    }
    if (!outs.empty()) torch::autograd::backward(outs, out_grads);
    torch::autograd::variable_list result;
    result.reserve(detached.size() + 1);
    result.emplace_back();  // the state
    for (const at::Tensor& d : detached)
      result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    return result;
  }
};

Expected<std::vector<c10::IValue>> Interpreter::run(const ExternalFn& external, Observer* observer,
                                                    const std::vector<int64_t>& symbolic_values,
                                                    std::shared_ptr<const ExternalFn> recompute,
                                                    uint64_t random_seed) const {
  const ir::Graph& g = *graph_;
  if (symbolic_values.size() != symbolic_.size())
    return internalError("the program has " + std::to_string(symbolic_.size()) +
                         " symbolic arguments, the run was given " +
                         std::to_string(symbolic_values.size()) + " values");
  std::vector<c10::IValue> env(g.numValues());
  const RunContext run{&external,        observer,    &symbolic_,
                       &symbolic_values, random_seed, options_.device};
  size_t next = 0;
  while (next < steps_.size()) {
    const int k = segment_at_.empty() ? -1 : segment_at_[next];
    if (k < 0) {
      size_t end = next + 1;
      while (end < steps_.size() && (segment_at_.empty() || segment_at_[end] < 0)) ++end;
      APC_RETURN_IF_ERROR(runSteps(g, steps_, next, end, env, run));
      next = end;
      continue;
    }
    const CheckpointSpec& spec = checkpoints_[static_cast<size_t>(k)];
    const auto& seg = segments_[static_cast<size_t>(k)];
    next = spec.last + 1;
    if (!at::GradMode::is_enabled()) {  // nothing to recompute: the nodes as they are
      APC_RETURN_IF_ERROR(runSteps(g, steps_, spec.first, spec.last + 1, env, run));
      continue;
    }
    for (uint32_t i : seg->leaves) APC_RETURN_IF_ERROR(runSteps(g, steps_, i, i + 1, env, run));
    auto st = c10::make_intrusive<CheckpointState>();
    st->segment = seg;
    st->recompute = recompute;
    st->symbolic_values = symbolic_values;
    st->random_seed = random_seed;
    torch::autograd::variable_list tensors;
    for (uint32_t v : seg->inputs) {
      const c10::IValue& iv = env[v];
      const bool tensor = iv.isTensor() && iv.toTensor().defined();
      st->is_tensor.push_back(tensor);
      st->requires_grad.push_back(tensor && iv.toTensor().requires_grad());
      st->captured.push_back(tensor ? c10::IValue() : iv);
      if (tensor) tensors.push_back(iv.toTensor());
    }
    st->env = &env;
    st->external = &external;
    st->observer = observer;
    torch::autograd::variable_list outputs;
    try {
      // A TensorList (not a vector): each tensor is one input of the function.
      outputs = CheckpointFunction::apply(st, at::TensorList(tensors));
    } catch (const CheckpointFunction::Failed&) {
      return st->error ? *st->error : internalError("checkpoint segment failed");
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      return unsupported("checkpoint segment '" + spec.module + "': " + firstLine(e.what()));
    }
    st->env = nullptr;
    st->external = nullptr;
    st->observer = nullptr;
    for (size_t i = 0; i < seg->outputs.size(); ++i) env[seg->outputs[i]] = outputs.at(i);
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
