//===- tests/strategy_validator/op_runner.cpp - Running IR nodes by name -----===//
//
// The validator's f64 widening over the runtime's operator runner (see op_runner.h).
//
//===----------------------------------------------------------------------===//
#include "op_runner.h"

namespace apc::validator {

Expected<c10::IValue> constantToIValue(const ir::Constant& c, const c10::Argument* arg) {
  runtime::InterpreterOptions options;
  options.widen_floats = true;
  return runtime::constantToIValue(c, arg, options);
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

}  // namespace apc::validator
