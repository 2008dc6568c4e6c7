//===- apc/ir/torch_dtype.h - apc dtypes <-> LibTorch scalar types --------===//
//
// The one mapping between ir::DType and c10::ScalarType, for the code that links LibTorch (the
// importers, the weight loader, the runtime, the API's tensor inputs, the validator). Header-only
// and not part of the torch-free apc_ir library: nothing in the planner core includes it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <c10/core/ScalarType.h>

#include "apc/ir/types.h"

namespace apc {

/// The apc dtype of a torch scalar type; kUnknown for the ones apc has none for (complex,
/// quantized, float8, wide unsigned).
inline ir::DType dtypeOf(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return ir::DType::kF32;
    case c10::kDouble:
      return ir::DType::kF64;
    case c10::kHalf:
      return ir::DType::kF16;
    case c10::kBFloat16:
      return ir::DType::kBF16;
    case c10::kLong:
      return ir::DType::kI64;
    case c10::kInt:
      return ir::DType::kI32;
    case c10::kShort:
      return ir::DType::kI16;
    case c10::kChar:
      return ir::DType::kI8;
    case c10::kByte:
      return ir::DType::kU8;
    case c10::kBool:
      return ir::DType::kBool;
    default:
      return ir::DType::kUnknown;
  }
}

/// The torch scalar type of an apc dtype; kFloat for kUnknown.
inline c10::ScalarType scalarTypeOf(ir::DType d) {
  switch (d) {
    case ir::DType::kF32:
      return c10::kFloat;
    case ir::DType::kF64:
      return c10::kDouble;
    case ir::DType::kF16:
      return c10::kHalf;
    case ir::DType::kBF16:
      return c10::kBFloat16;
    case ir::DType::kI64:
      return c10::kLong;
    case ir::DType::kI32:
      return c10::kInt;
    case ir::DType::kI16:
      return c10::kShort;
    case ir::DType::kI8:
      return c10::kChar;
    case ir::DType::kU8:
      return c10::kByte;
    case ir::DType::kBool:
      return c10::kBool;
    case ir::DType::kUnknown:
      break;
  }
  return c10::kFloat;
}

}  // namespace apc
