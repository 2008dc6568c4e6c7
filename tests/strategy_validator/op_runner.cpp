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
  c10::ScalarType t = runtime::scalarTypeOf(d);
  return at::isFloatingType(t) ? at::kDouble : t;
}

}  // namespace apc::validator
