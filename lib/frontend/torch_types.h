//===- lib/frontend/torch_types.h - Torch enums <-> apc and export serde ---===//
//
// Conversions shared by the importers and the weight loader: LibTorch scalar types to apc dtypes
// and back, and the integer codes of torch.export's serde schema (ScalarType, Layout,
// MemoryFormat: their own numbering, see torch/_export/serde/schema.py) to LibTorch's enums.
// Private to lib/frontend.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>

#include "apc/ir/types.h"

namespace apc::frontend {

/// kUnknown for scalar types apc does not model (complex, float8, unsigned > 8 bits, ...).
ir::DType fromScalarType(at::ScalarType t);
/// kFloat for kUnknown.
at::ScalarType toScalarType(ir::DType d);

/// Identity of a weight tensor: tied parameters share storage and geometry (dtype, sizes,
/// strides, storage offset), so they get the same key.
std::string tensorIdentity(const at::Tensor& t);

/// torch._export.serde.schema.ScalarType -> LibTorch; nullopt for UNKNOWN and unknown codes.
std::optional<at::ScalarType> scalarTypeFromSerde(int64_t code);
/// schema.Layout -> LibTorch.
std::optional<at::Layout> layoutFromSerde(int64_t code);
/// schema.MemoryFormat -> LibTorch.
std::optional<at::MemoryFormat> memoryFormatFromSerde(int64_t code);

}  // namespace apc::frontend
