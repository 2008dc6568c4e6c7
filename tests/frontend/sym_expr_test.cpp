//===- tests/frontend/sym_expr_test.cpp - Symbolic sizes of exported programs ===//
//
// The srepr parser and evaluator behind the exported-program importer's dynamic dims: the forms
// torch.export writes, exact integer results, and one-line errors for what it does not evaluate.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "sym_expr.h"

namespace apc::frontend {
namespace {

const char* kS77 = "Symbol('s77', positive=True, integer=True)";

int64_t eval(const std::string& text, std::map<std::string, int64_t> values) {
  auto e = parseSymExpr(text);
  EXPECT_TRUE(e.ok()) << text << ": " << e.error().message();
  if (!e.ok()) return -1;
  auto v = evaluateSymExpr(*e, values);
  EXPECT_TRUE(v.ok()) << text << ": " << v.error().message();
  return v.ok() ? *v : -1;
}

TEST(SymExpr, SymbolAndArithmetic) {
  EXPECT_EQ(eval(kS77, {{"s77", 8}}), 8);
  EXPECT_EQ(eval(std::string("Mul(Integer(64), ") + kS77 + ")", {{"s77", 8}}), 512);
  EXPECT_EQ(eval(std::string("Add(") + kS77 + ", Integer(-1))", {{"s77", 8}}), 7);
  EXPECT_EQ(eval("Mul(Symbol('s0'), Symbol('s1'))", {{"s0", 3}, {"s1", 5}}), 15);
  EXPECT_EQ(eval("Pow(Symbol('s0'), Integer(2))", {{"s0", 7}}), 49);
  EXPECT_EQ(eval("PowByNatural(Symbol('s0'), Integer(3))", {{"s0", 2}}), 8);
  EXPECT_EQ(eval("Mul(Rational(1, 2), Symbol('s0'))", {{"s0", 10}}), 5);
}

TEST(SymExpr, DivisionsFollowPython) {
  EXPECT_EQ(eval("FloorDiv(Symbol('s0'), Integer(2))", {{"s0", 7}}), 3);
  EXPECT_EQ(eval("FloorDiv(Integer(-7), Integer(2))", {}), -4);
  EXPECT_EQ(eval("CeilDiv(Symbol('s0'), Integer(2))", {{"s0", 7}}), 4);
  EXPECT_EQ(eval("Mod(Integer(-7), Integer(3))", {}), 2);
  EXPECT_EQ(eval("PythonMod(Symbol('s0'), Integer(4))", {{"s0", 10}}), 2);
  EXPECT_EQ(eval("CleanDiv(Symbol('s0'), Integer(4))", {{"s0", 12}}), 3);
  EXPECT_EQ(eval("ModularIndexing(Symbol('s0'), Integer(2), Integer(3))", {{"s0", 11}}), 2);
  EXPECT_EQ(eval("Max(Symbol('s0'), Integer(4), Integer(2))", {{"s0", 3}}), 4);
  EXPECT_EQ(eval("Min(Symbol('s0'), Integer(4))", {{"s0", 3}}), 3);
  EXPECT_EQ(eval("Identity(Symbol('s0'))", {{"s0", 9}}), 9);
}

TEST(SymExpr, FreeSymbolsInOrder) {
  auto e = parseSymExpr("Add(Mul(Symbol('s5'), Symbol('s1')), Symbol('s5'), Integer(3))");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(freeSymbols(*e), (std::vector<std::string>{"s5", "s1"}));
  EXPECT_EQ(toString(*e), "(s5*s1 + s5 + 3)");
}

TEST(SymExpr, Errors) {
  auto unknown = parseSymExpr("Piecewise((Symbol('s0'), True))");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(unknown.error().message().find("Piecewise"), std::string::npos);
  auto malformed = parseSymExpr("Mul(Integer(2), ");
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.error().code(), ErrorCode::kParse);
  auto e = parseSymExpr("Mul(Symbol('u0'), Integer(2))");
  ASSERT_TRUE(e.ok());
  auto v = evaluateSymExpr(*e, {});
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message().find("u0"), std::string::npos) << v.error().message();
  auto half = parseSymExpr("Mul(Rational(1, 2), Symbol('s0'))");
  ASSERT_TRUE(half.ok());
  EXPECT_FALSE(evaluateSymExpr(*half, {{"s0", 3}}).ok());  // 3/2 is not a size
  auto zero = parseSymExpr("FloorDiv(Symbol('s0'), Integer(0))");
  ASSERT_TRUE(zero.ok());
  EXPECT_FALSE(evaluateSymExpr(*zero, {{"s0", 3}}).ok());
}

}  // namespace
}  // namespace apc::frontend
