//===- lib/frontend/sym_expr.cpp - Symbolic sizes of exported programs -----===//
//
// A recursive-descent parser over sympy's srepr grammar (Head(arg, ..., key=value)), and an exact
// evaluator on reduced fractions of 128-bit integers (see sym_expr.h).
//
//===----------------------------------------------------------------------===//
#include "sym_expr.h"

#include <cctype>
#include <limits>
#include <numeric>
#include <optional>

#include "apc/support/activity.h"

namespace apc::frontend {

namespace {

using Kind = SymExpr::Kind;

const std::map<std::string, Kind, std::less<>>& heads() {
  static const std::map<std::string, Kind, std::less<>> m = {
      {"Add", Kind::kAdd},           {"Mul", Kind::kMul},
      {"Pow", Kind::kPow},           {"PowByNatural", Kind::kPow},
      {"FloorDiv", Kind::kFloorDiv}, {"CeilDiv", Kind::kCeilDiv},
      {"Mod", Kind::kMod},           {"PythonMod", Kind::kMod},
      {"CleanDiv", Kind::kCleanDiv}, {"ModularIndexing", Kind::kModularIndexing},
      {"Max", Kind::kMax},           {"Min", Kind::kMin},
  };
  return m;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Expected<SymExpr> parseAll() {
    APC_ASSIGN_OR_RETURN(SymExpr e, parseExpr(0));
    skipSpace();
    if (pos_ != text_.size()) return bad("trailing text");
    return e;
  }

 private:
  Error bad(const std::string& why) const {
    return parseError("malformed symbolic size '" + std::string(text_) + "': " + why +
                      " at offset " + std::to_string(pos_));
  }
  void skipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool eat(char c) {
    skipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::string identifier() {
    skipSpace();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }
  std::optional<int64_t> integerLiteral() {
    skipSpace();
    size_t start = pos_;
    if (pos_ < text_.size() && (text_[pos_] == '-' || text_[pos_] == '+')) ++pos_;
    size_t digits = pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ == digits) {
      pos_ = start;
      return std::nullopt;
    }
    std::string s(text_.substr(start, pos_ - start));
    try {
      return std::stoll(s);
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      pos_ = start;
      return std::nullopt;
    }
  }
  std::optional<std::string> stringLiteral() {
    skipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return std::nullopt;
    char q = text_[pos_++];
    size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != q) ++pos_;
    if (pos_ >= text_.size()) return std::nullopt;
    std::string s(text_.substr(start, pos_ - start));
    ++pos_;
    return s;
  }
  /// Skips `key=value` keyword arguments (Symbol's assumptions); true when one was skipped.
  bool skipKeyword() {
    size_t start = pos_;
    std::string key = identifier();
    if (!key.empty() && eat('=')) {
      identifier();
      return true;
    }
    pos_ = start;
    return false;
  }

  Expected<SymExpr> parseExpr(int depth) {
    if (depth > 200) return bad("nested too deeply");
    std::string head = identifier();
    if (head.empty()) return bad("expected an expression");
    if (!eat('(')) return bad("expected '(' after " + head);
    SymExpr e;
    if (head == "Symbol") {
      auto name = stringLiteral();
      if (!name || name->empty()) return bad("Symbol without a name");
      e.kind = Kind::kSymbol;
      e.symbol = *name;
      while (eat(',')) {
        if (!skipKeyword()) return bad("unexpected Symbol argument");
      }
    } else if (head == "Integer") {
      auto v = integerLiteral();
      if (!v) return bad("Integer without a value");
      e.kind = Kind::kInteger;
      e.num = *v;
    } else if (head == "Rational") {
      auto n = integerLiteral();
      if (!n || !eat(',')) return bad("Rational without a numerator");
      auto d = integerLiteral();
      if (!d || *d == 0) return bad("Rational without a denominator");
      e.kind = Kind::kRational;
      e.num = *n;
      e.den = *d;
    } else if (head == "Identity") {
      APC_ASSIGN_OR_RETURN(e, parseExpr(depth + 1));
    } else {
      auto it = heads().find(head);
      if (it == heads().end())
        return unsupported("symbolic size '" + std::string(text_) + "' uses " + head +
                           ", which apc does not evaluate");
      e.kind = it->second;
      do {
        APC_ASSIGN_OR_RETURN(SymExpr a, parseExpr(depth + 1));
        e.args.push_back(std::move(a));
      } while (eat(','));
      size_t want_min = 2, want_max = 2;
      if (e.kind == Kind::kAdd || e.kind == Kind::kMul || e.kind == Kind::kMax ||
          e.kind == Kind::kMin) {
        want_min = 1;
        want_max = std::numeric_limits<size_t>::max();
      } else if (e.kind == Kind::kModularIndexing) {
        want_min = want_max = 3;
      }
      if (e.args.size() < want_min || e.args.size() > want_max)
        return bad(head + " with " + std::to_string(e.args.size()) + " arguments");
    }
    if (!eat(')')) return bad("expected ')' to close " + head);
    return e;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// --- exact arithmetic ---------------------------------------------------------------------------

using I128 = __int128;

struct Frac {
  I128 n = 0, d = 1;
};

constexpr I128 kLimit = static_cast<I128>(1) << 100;

Expected<Frac> make(I128 n, I128 d) {
  if (d == 0) return invalidArgument("division by zero");
  if (d < 0) {
    n = -n;
    d = -d;
  }
  I128 a = n < 0 ? -n : n, b = d;
  while (b != 0) {
    I128 t = a % b;
    a = b;
    b = t;
  }
  if (a > 1) {
    n /= a;
    d /= a;
  }
  if (n > kLimit || n < -kLimit || d > kLimit) return invalidArgument("overflow");
  return Frac{n, d};
}

I128 floorDiv(I128 a, I128 b) {
  I128 q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Expected<I128> asInteger(const Frac& f, const char* what) {
  if (f.d != 1) return invalidArgument(std::string(what) + " of a non-integer");
  return f.n;
}

Expected<Frac> eval(const SymExpr& e, const std::map<std::string, int64_t>& values) {
  switch (e.kind) {
    case Kind::kSymbol: {
      auto it = values.find(e.symbol);
      if (it == values.end()) return notFound("symbol " + e.symbol + " has no value");
      return Frac{it->second, 1};
    }
    case Kind::kInteger:
      return Frac{e.num, 1};
    case Kind::kRational:
      return make(e.num, e.den);
    default:
      break;
  }
  std::vector<Frac> a;
  for (const SymExpr& x : e.args) {
    APC_ASSIGN_OR_RETURN(Frac v, eval(x, values));
    a.push_back(v);
  }
  switch (e.kind) {
    case Kind::kAdd: {
      Frac s{0, 1};
      for (const Frac& v : a) {
        APC_ASSIGN_OR_RETURN(s, make(s.n * v.d + v.n * s.d, s.d * v.d));
      }
      return s;
    }
    case Kind::kMul: {
      Frac p{1, 1};
      for (const Frac& v : a) {
        APC_ASSIGN_OR_RETURN(p, make(p.n * v.n, p.d * v.d));
      }
      return p;
    }
    case Kind::kPow: {
      APC_ASSIGN_OR_RETURN(I128 k, asInteger(a[1], "an exponent"));
      if (k < 0 || k > 128) return invalidArgument("exponent out of range");
      Frac p{1, 1};
      for (I128 i = 0; i < k; ++i) {
        APC_ASSIGN_OR_RETURN(p, make(p.n * a[0].n, p.d * a[0].d));
      }
      return p;
    }
    case Kind::kFloorDiv:
    case Kind::kCeilDiv:
    case Kind::kCleanDiv: {
      APC_ASSIGN_OR_RETURN(Frac q, make(a[0].n * a[1].d, a[0].d * a[1].n));
      if (e.kind == Kind::kCleanDiv && q.d != 1) return invalidArgument("CleanDiv is not exact");
      I128 f = floorDiv(q.n, q.d);
      if (e.kind == Kind::kCeilDiv && f * q.d != q.n) ++f;
      return Frac{f, 1};
    }
    case Kind::kMod: {
      APC_ASSIGN_OR_RETURN(I128 x, asInteger(a[0], "a modulo"));
      APC_ASSIGN_OR_RETURN(I128 m, asInteger(a[1], "a modulo"));
      if (m == 0) return invalidArgument("modulo by zero");
      return Frac{x - floorDiv(x, m) * m, 1};
    }
    case Kind::kModularIndexing: {
      APC_ASSIGN_OR_RETURN(I128 x, asInteger(a[0], "an index"));
      APC_ASSIGN_OR_RETURN(I128 d, asInteger(a[1], "an index"));
      APC_ASSIGN_OR_RETURN(I128 m, asInteger(a[2], "an index"));
      if (d == 0 || m == 0) return invalidArgument("ModularIndexing by zero");
      I128 q = floorDiv(x, d);
      return Frac{q - floorDiv(q, m) * m, 1};
    }
    case Kind::kMax:
    case Kind::kMin: {
      Frac best = a[0];
      for (const Frac& v : a) {
        bool less = v.n * best.d < best.n * v.d;  // denominators are positive
        bool greater = v.n * best.d > best.n * v.d;
        if (e.kind == Kind::kMax ? greater : less) best = v;
      }
      return best;
    }
    default:
      return internalError("unhandled symbolic expression kind");
  }
}

void collect(const SymExpr& e, std::vector<std::string>& out) {
  if (e.kind == Kind::kSymbol) {
    for (const std::string& s : out)
      if (s == e.symbol) return;
    out.push_back(e.symbol);
  }
  for (const SymExpr& a : e.args) collect(a, out);
}

}  // namespace

Expected<SymExpr> parseSymExpr(std::string_view text) {
  return Parser(text).parseAll();
}

std::vector<std::string> freeSymbols(const SymExpr& e) {
  std::vector<std::string> out;
  collect(e, out);
  return out;
}

Expected<int64_t> evaluateSymExpr(const SymExpr& e, const std::map<std::string, int64_t>& values) {
  auto v = eval(e, values);
  if (!v.ok()) return v.error().withContext("cannot evaluate " + toString(e));
  if (v->d != 1)
    return invalidArgument("symbolic size " + toString(e) + " is not an integer at these sizes");
  if (v->n > std::numeric_limits<int64_t>::max() || v->n < std::numeric_limits<int64_t>::min())
    return invalidArgument("symbolic size " + toString(e) + " overflows");
  return static_cast<int64_t>(v->n);
}

std::string toString(const SymExpr& e) {
  auto joined = [&](const char* sep) {
    std::string s;
    for (size_t i = 0; i < e.args.size(); ++i) s += (i ? sep : "") + toString(e.args[i]);
    return s;
  };
  switch (e.kind) {
    case Kind::kSymbol:
      return e.symbol;
    case Kind::kInteger:
      return std::to_string(e.num);
    case Kind::kRational:
      return std::to_string(e.num) + "/" + std::to_string(e.den);
    case Kind::kAdd:
      return "(" + joined(" + ") + ")";
    case Kind::kMul:
      return joined("*");
    case Kind::kPow:
      return toString(e.args[0]) + "**" + toString(e.args[1]);
    case Kind::kFloorDiv:
      return "(" + joined("//") + ")";
    case Kind::kCeilDiv:
      return "ceildiv(" + joined(", ") + ")";
    case Kind::kMod:
      return "(" + joined(" % ") + ")";
    case Kind::kCleanDiv:
      return "(" + joined("/") + ")";
    case Kind::kModularIndexing:
      return "ModularIndexing(" + joined(", ") + ")";
    case Kind::kMax:
      return "max(" + joined(", ") + ")";
    case Kind::kMin:
      return "min(" + joined(", ") + ")";
  }
  return "?";
}

}  // namespace apc::frontend
