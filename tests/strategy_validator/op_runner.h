//===- tests/strategy_validator/op_runner.h - Running IR nodes by name -------===//
//
// Runs one IR op node on concrete tensors, the way the runtime will: the operator is resolved by
// (name, overload) through the JIT operator registry (torch::jit::findOperatorFor, which also has
// the JIT-only ops), arguments are a boxed stack with one IValue per schema argument, and the
// node's non-tensor arguments come from Value::constant. The structural prim ops whose kernels
// libtorch does not export (prim::ListConstruct, prim::ListUnpack, prim::TupleConstruct) are
// implemented here by hand.
//
// Floating dtypes are widened to float64 so that sharded and unsharded results can be compared
// tightly: random inputs are made in f64, and ScalarType arguments naming a floating dtype
// (aten::to's dtype=6, factories' dtype=) are rewritten to f64 for every run alike.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include "apc/ir/graph.h"
#include "apc/support/error.h"

namespace apc::validator {

/// A node's operator, resolved once.
class NodeOp {
 public:
  /// Resolves the operator of an op node. Errors: no operator with that name and overload.
  static Expected<NodeOp> resolve(const ir::Node& node);

  /// The schema, or nullptr for the hand-written prim ops.
  const c10::FunctionSchema* schema() const { return schema_; }
  /// "aten::view" / "prim::ListConstruct".
  const std::string& name() const { return name_; }

  /// Runs on one IValue per node input; returns one IValue per node output. Exceptions of the
  /// kernel become an Error with the first line of their message.
  Expected<std::vector<c10::IValue>> run(std::vector<c10::IValue> args, size_t num_outputs) const;

 private:
  enum class Kind { kOperator, kListConstruct, kListUnpack, kTupleConstruct };
  Kind kind_ = Kind::kOperator;
  std::string name_;
  const c10::FunctionSchema* schema_ = nullptr;
  std::function<void(std::vector<c10::IValue>&)> op_;
};

/// The IValue of a non-tensor constant for schema argument `arg` (nullptr: no schema): devices
/// from their text ("meta", which the importer records for devices read off a tensor, runs on the
/// CPU), ints widened to float where the argument is a float, and floating
/// ScalarType codes (f16, bf16, f32) replaced by f64 when the argument is a ScalarType.
Expected<c10::IValue> constantToIValue(const ir::Constant& c, const c10::Argument* arg);

/// The torch ScalarType used for an IR dtype: floating types become float64.
c10::ScalarType widenedScalarType(ir::DType d);

/// The first line of an exception message.
std::string firstLine(const std::string& what);

}  // namespace apc::validator
