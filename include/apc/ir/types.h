//===- apc/ir/types.h - Dtypes, dims, tensor metadata, constants ----------===//
//
// The value-level vocabulary of the IR: element types (short names as on the command line: f32,
// bf16, i64, ...), dimensions that are either static or symbolic with a hint (dynamic batch),
// TensorMeta (global shape, dtype, requires_grad), and compile-time constants of non-tensor values.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace apc::ir {

enum class DType : uint8_t { kUnknown, kF32, kF64, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

/// Short name: "f32", "bf16", "i64", "bool", "?" for unknown.
const char* dtypeName(DType d);
/// Parses a short name ("f32") or a torch name ("float32", "float", "int64", "long", "bfloat16").
std::optional<DType> parseDType(std::string_view s);
/// Bytes per element (0 for unknown; 1 for bool).
int dtypeBytes(DType d);
bool isFloating(DType d);

/// One dimension: a static size, or a symbol (dynamic) with a hint used for costing.
struct Dim {
  int64_t size = 0;    // the static size, or the hint when symbolic
  std::string symbol;  // empty when static
  /// Symbolic dims: the size is per_symbol x the symbol's value (1: the symbol itself, 32: B*32
  /// of a flattened batch), or 0 when it is some other function of it (B+1, B//2, B*T with T
  /// dynamic too). Lowering recomputes sizes from it at run time (apc/lower/local_rewrite.h).
  int64_t per_symbol = 1;

  static Dim fixed(int64_t n) { return {n, {}, 1}; }
  static Dim symbolic(std::string sym, int64_t hint, int64_t per_symbol = 1) {
    return {hint, std::move(sym), per_symbol};
  }
  bool isSymbolic() const { return !symbol.empty(); }
  bool operator==(const Dim&) const;  // defaulted in the .cpp (C++17 users)
};

/// "128" or "B=8".
std::string toString(const Dim& d);

using Shape = std::vector<Dim>;

Shape makeShape(const std::vector<int64_t>& sizes);
/// Sizes with symbols replaced by their hints.
std::vector<int64_t> hintSizes(const Shape& s);
/// Product of the hints (1 for a scalar).
int64_t numel(const Shape& s);
/// "[8,128,1024]".
std::string toString(const Shape& s);

struct TensorMeta {
  Shape shape;
  DType dtype = DType::kUnknown;
  bool requires_grad = false;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const { return ir::numel(shape); }
  int64_t bytes() const { return numel() * dtypeBytes(dtype); }
  bool operator==(const TensorMeta&) const;  // defaulted in the .cpp (C++17 users)
};

/// "f32[8,128,1024]".
std::string toString(const TensorMeta& t);

/// A compile-time constant of a non-tensor value. Dtype, layout and memory-format arguments appear
/// as ints (their TorchScript encoding); devices as strings.
struct None {
  bool operator==(const None&) const;  // defaulted in the .cpp (C++17 users)
};
using Constant = std::variant<None, int64_t, double, bool, std::string, std::vector<int64_t>,
                              std::vector<double>, std::vector<bool>>;

/// TorchScript-like text: None, 3, 1.5, True, "cpu", [1, 2].
std::string toString(const Constant& c);

}  // namespace apc::ir
