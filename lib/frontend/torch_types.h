//===- lib/frontend/torch_types.h - Torch enums <-> apc and export serde ---===//
//
// Conversions shared by the importers and the weight loader (LibTorch scalar types <-> apc dtypes
// are apc/ir/torch_dtype.h's, shared with the runtime and the API): the integer codes of
// torch.export's serde schema (ScalarType, Layout, MemoryFormat: their own numbering, see
// torch/_export/serde/schema.py) to LibTorch's enums. Private to lib/frontend.
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

#include "apc/ir/torch_dtype.h"
#include "apc/ir/types.h"

namespace apc::frontend {

/// The first line of a LibTorch exception text, without the paragraph of advice LibTorch appends
/// to miniz's messages ("... This is an internal miniz error. If you are seeing this error, ...").
/// For an error raised inside TorchScript code ("The following operation failed in the TorchScript
/// interpreter." and a traceback), the message of its cause instead.
std::string torchErrorLine(const std::string& what);
/// The same for a caught exception. A c10::Error is read without its backtrace: what() symbolizes
/// the C++ stack (a dladdr scan of libtorch's symbols per frame, about 0.3 s a call), which the
/// importers' fall-backs (a meta kernel that throws, then a shape function) would pay per node.
std::string torchErrorLine(const std::exception& e);

/// Identity of a weight tensor: tied parameters share storage and geometry (dtype, sizes,
/// strides, storage offset), so they get the same key.
std::string tensorIdentity(const at::Tensor& t);

/// torch._export.serde.schema.ScalarType -> LibTorch; nullopt for UNKNOWN and unknown codes.
std::optional<at::ScalarType> scalarTypeFromSerde(int64_t code);
/// schema.Layout -> LibTorch.
std::optional<at::Layout> layoutFromSerde(int64_t code);
/// schema.MemoryFormat -> LibTorch.
std::optional<at::MemoryFormat> memoryFormatFromSerde(int64_t code);

/// Tensor sizes an importer accepts, recorded in a file or computed at import: each dim in
/// [0, 2^40] (the range of a spec's dynamic dims), at most 2^56 elements, so that the planner's
/// byte counts (elements x dtype size, in int64) cannot overflow.
inline constexpr int64_t kMaxTensorDim = int64_t{1} << 40;
inline constexpr int64_t kMaxTensorNumel = int64_t{1} << 56;

}  // namespace apc::frontend
