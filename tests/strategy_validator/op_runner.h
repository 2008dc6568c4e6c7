//===- tests/strategy_validator/op_runner.h - Running IR nodes by name -------===//
//
// Runs one IR op node on concrete tensors exactly the way the runtime does: the runtime's
// OpKernel (apc/runtime/interpreter.h) resolves the operator by (name, overload) through the JIT
// operator registry and calls it boxed, with the hand-written structural prim ops.
//
// What the validator adds is its own choice: floating dtypes are widened to float64 so that sharded
// and unsharded results can be compared tightly. Random inputs are made in f64, and ScalarType
// arguments naming a floating dtype (aten::to's dtype=6, factories' dtype=) are rewritten to f64
// for every run alike (InterpreterOptions::widen_floats).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include "apc/ir/graph.h"
#include "apc/runtime/interpreter.h"
#include "apc/support/error.h"

namespace apc::validator {

/// A node's operator, resolved once (the runtime's).
using NodeOp = runtime::OpKernel;
using runtime::firstLine;

/// The IValue of a non-tensor constant for schema argument `arg` (nullptr: no schema), as the
/// runtime converts it, with floating ScalarType codes (f16, bf16, f32) replaced by f64.
Expected<c10::IValue> constantToIValue(const ir::Constant& c, const c10::Argument* arg);

/// The torch ScalarType used for an IR dtype: floating types become float64.
c10::ScalarType widenedScalarType(ir::DType d);

}  // namespace apc::validator
