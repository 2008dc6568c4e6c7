//===- tests/strategy_validator/op_runner.cpp - Running IR nodes by name -----===//
//
// Operator resolution through the JIT registry, constant conversion for schema arguments (with
// floating dtypes widened to f64) and the hand-written structural prim ops (see op_runner.h).
//
//===----------------------------------------------------------------------===//
#include "op_runner.h"

#include <torch/csrc/jit/runtime/operator.h>

namespace apc::validator {

std::string firstLine(const std::string& what) {
  size_t nl = what.find('\n');
  return nl == std::string::npos ? what : what.substr(0, nl);
}

c10::ScalarType widenedScalarType(ir::DType d) {
  switch (d) {
    case ir::DType::kF32:
    case ir::DType::kF64:
    case ir::DType::kF16:
    case ir::DType::kBF16:
      return at::kDouble;
    case ir::DType::kI64:
      return at::kLong;
    case ir::DType::kI32:
      return at::kInt;
    case ir::DType::kI16:
      return at::kShort;
    case ir::DType::kI8:
      return at::kChar;
    case ir::DType::kU8:
      return at::kByte;
    case ir::DType::kBool:
      return at::kBool;
    case ir::DType::kUnknown:
      break;
  }
  return at::kDouble;
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

Expected<c10::IValue> constantToIValue(const ir::Constant& c, const c10::Argument* arg) {
  c10::TypeKind kind = arg ? argKind(*arg) : c10::TypeKind::AnyType;
  if (std::holds_alternative<ir::None>(c)) return c10::IValue();
  if (const auto* i = std::get_if<int64_t>(&c)) {
    if (kind == c10::TypeKind::FloatType) return c10::IValue(static_cast<double>(*i));
    if (kind == c10::TypeKind::ScalarTypeType) {
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
      // scripted models) is recorded as "meta"; the ranks run on the CPU.
      try {
        return c10::IValue(c10::Device(*s == "meta" ? std::string("cpu") : *s));
      } catch (const std::exception& e) {
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

Expected<NodeOp> NodeOp::resolve(const ir::Node& node) {
  NodeOp op;
  op.name_ = node.op;
  if (node.op == "prim::ListConstruct") {
    op.kind_ = Kind::kListConstruct;
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
  std::shared_ptr<torch::jit::Operator> found;
  try {
    found = torch::jit::findOperatorFor(c10::OperatorName(node.op, node.overload));
  } catch (const std::exception& e) {
    return notFound("operator " + node.qualifiedOp() + ": " + firstLine(e.what()));
  }
  if (!found) return notFound("no registered operator " + node.qualifiedOp());
  op.schema_ = &found->schema();
  try {
    torch::jit::Operation operation = found->getOperation();
    op.op_ = [operation](std::vector<c10::IValue>& stack) mutable { operation(stack); };
  } catch (const std::exception& e) {
    return unsupported("operator " + node.qualifiedOp() +
                       " needs a graph node to run: " + firstLine(e.what()));
  }
  return op;
}

Expected<std::vector<c10::IValue>> NodeOp::run(std::vector<c10::IValue> args,
                                               size_t num_outputs) const {
  std::vector<c10::IValue> out;
  switch (kind_) {
    case Kind::kListConstruct: {
      c10::List<at::Tensor> list;
      for (const c10::IValue& a : args) {
        if (!a.isTensor()) return unsupported("prim::ListConstruct of non-tensors");
        list.push_back(a.toTensor());
      }
      out.emplace_back(list);
      break;
    }
    case Kind::kListUnpack: {
      if (args.size() != 1 || !args[0].isList()) return invalidArgument("ListUnpack of a non-list");
      for (const c10::IValue& e : args[0].toListRef()) out.push_back(e);
      break;
    }
    case Kind::kTupleConstruct:
      out.emplace_back(c10::ivalue::Tuple::create(std::move(args)));
      break;
    case Kind::kOperator:
      try {
        op_(args);
      } catch (const std::exception& e) {
        return unsupported(name_ + ": " + firstLine(e.what()));
      }
      out = std::move(args);
      break;
  }
  if (out.size() != num_outputs)
    return internalError(name_ + " returned " + std::to_string(out.size()) +
                         " values, the node has " + std::to_string(num_outputs) + " outputs");
  return out;
}

}  // namespace apc::validator
