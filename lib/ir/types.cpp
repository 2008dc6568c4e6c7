//===- lib/ir/types.cpp - Dtypes, dims, tensor metadata, constants --------===//
#include "apc/ir/types.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "apc/support/strings.h"

namespace apc::ir {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool Dim::operator==(const Dim&) const = default;
bool TensorMeta::operator==(const TensorMeta&) const = default;
bool None::operator==(const None&) const = default;

namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  int bytes;
  bool floating;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "f32", 4, true},  {DType::kF64, "f64", 8, true},
    {DType::kF16, "f16", 2, true},  {DType::kBF16, "bf16", 2, true},
    {DType::kI64, "i64", 8, false}, {DType::kI32, "i32", 4, false},
    {DType::kI16, "i16", 2, false}, {DType::kI8, "i8", 1, false},
    {DType::kU8, "u8", 1, false},   {DType::kBool, "bool", 1, false},
};
const DTypeInfo* info(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return &i;
  return nullptr;
}
}  // namespace

const char* dtypeName(DType d) {
  const DTypeInfo* i = info(d);
  return i ? i->name : "?";
}

std::optional<DType> parseDType(std::string_view s) {
  for (const auto& i : kDTypes)
    if (s == i.name) return i.dtype;
  struct Alias {
    const char* name;
    DType dtype;
  };
  static const Alias kAliases[] = {
      {"float32", DType::kF32},   {"float", DType::kF32},   {"float64", DType::kF64},
      {"double", DType::kF64},    {"float16", DType::kF16}, {"half", DType::kF16},
      {"bfloat16", DType::kBF16}, {"int64", DType::kI64},   {"long", DType::kI64},
      {"int32", DType::kI32},     {"int", DType::kI32},     {"int16", DType::kI16},
      {"int8", DType::kI8},       {"uint8", DType::kU8},    {"bool", DType::kBool},
  };
  for (const auto& a : kAliases)
    if (s == a.name) return a.dtype;
  return std::nullopt;
}

int dtypeBytes(DType d) {
  const DTypeInfo* i = info(d);
  return i ? i->bytes : 0;
}

bool isFloating(DType d) {
  const DTypeInfo* i = info(d);
  return i && i->floating;
}

std::string toString(const Dim& d) {
  if (d.isSymbolic()) return d.symbol + "=" + std::to_string(d.size);
  return std::to_string(d.size);
}

Shape makeShape(const std::vector<int64_t>& sizes) {
  Shape s;
  s.reserve(sizes.size());
  for (int64_t n : sizes) s.push_back(Dim::fixed(n));
  return s;
}

std::vector<int64_t> hintSizes(const Shape& s) {
  std::vector<int64_t> out;
  out.reserve(s.size());
  for (const Dim& d : s) out.push_back(d.size);
  return out;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (const Dim& d : s) n *= d.size;
  return n;
}

std::string toString(const Shape& s) {
  return "[" + joinMap(s, ",", [](const Dim& d) { return toString(d); }) + "]";
}

std::string toString(const TensorMeta& t) {
  return std::string(dtypeName(t.dtype)) + toString(t.shape);
}

namespace {
std::string formatDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", v);  // shortest form that reads back exactly
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".";
  return s;
}
}  // namespace

std::string toString(const Constant& c) {
  struct Visitor {
    std::string operator()(const None&) const { return "None"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return formatDouble(v); }
    std::string operator()(bool v) const { return v ? "True" : "False"; }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(const std::vector<int64_t>& v) const {
      return "[" + joinMap(v, ", ", [](int64_t x) { return std::to_string(x); }) + "]";
    }
    std::string operator()(const std::vector<double>& v) const {
      return "[" + joinMap(v, ", ", [](double x) { return formatDouble(x); }) + "]";
    }
    std::string operator()(const std::vector<bool>& v) const {
      return "[" + joinMap(v, ", ", [](bool x) { return std::string(x ? "True" : "False"); }) + "]";
    }
  };
  return std::visit(Visitor{}, c);
}

}  // namespace apc::ir
