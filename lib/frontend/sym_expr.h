//===- lib/frontend/sym_expr.h - Symbolic sizes of exported programs -------===//
//
// torch.export records every symbolic size as the sympy `srepr` of its expression over the
// program's size symbols, with the value at the example inputs as a hint:
//
//   Symbol('s77', positive=True, integer=True)
//   Mul(Integer(64), Symbol('s77', positive=True, integer=True))
//   FloorDiv(Symbol('s0', ...), Integer(2))
//
// This is the small evaluator the exported-program importer needs: parse such a string once,
// list its free symbols, and evaluate it exactly for given symbol values (rational arithmetic,
// an integer result). Supported heads: Symbol, Integer, Rational, Add, Mul, Pow and PowByNatural
// (integer exponent), FloorDiv, CeilDiv, Mod, PythonMod, CleanDiv, ModularIndexing, Max, Min,
// Identity. Anything else is a kUnsupported error that names the head and the expression.
// Torch-free.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "apc/support/error.h"

namespace apc::frontend {

struct SymExpr {
  enum class Kind : uint8_t {
    kSymbol,
    kInteger,
    kRational,
    kAdd,
    kMul,
    kPow,
    kFloorDiv,
    kCeilDiv,
    kMod,
    kCleanDiv,
    kModularIndexing,
    kMax,
    kMin,
  };
  Kind kind = Kind::kInteger;
  std::string symbol;         // kSymbol
  int64_t num = 0, den = 1;   // kInteger (den 1), kRational
  std::vector<SymExpr> args;  // the others
};

/// Parses sympy srepr text. Errors: kParse for malformed text, kUnsupported for unknown heads.
Expected<SymExpr> parseSymExpr(std::string_view text);

/// The free symbols, in order of first appearance.
std::vector<std::string> freeSymbols(const SymExpr& e);

/// The exact value for the given symbol values; an error when a symbol has no value, on
/// division by zero, overflow, or when the result is not an integer.
Expected<int64_t> evaluateSymExpr(const SymExpr& e, const std::map<std::string, int64_t>& values);

/// Compact infix text for messages: "64*s77", "(s0//2)".
std::string toString(const SymExpr& e);

}  // namespace apc::frontend
