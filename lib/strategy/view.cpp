//===- lib/strategy/view.cpp - Views by a dimension algebra ---------------===//
//
// Rules of ops that only re-index their input: reshape-like ops (view, reshape, _unsafe_view,
// flatten, unflatten, squeeze, unsqueeze), transposes and permutes, and expand.
//
// Reshape-like ops are described by their input and output shapes alone (row-major order makes
// the size list irrelevant once the output shape is known; -1 entries are resolved by it). The
// dims of size 1 are dropped, and the rest are walked left to right into groups whose size
// products match: a group of input dims I maps to a group of output dims O. Per group:
//   one dim to one dim      S(i) -> S(o), uneven allowed (the same dim under a new index)
//   anything else           only the leftmost dims can be sharded, S(I[0]) -> S(O[0]), and only
//                           when both sizes divide evenly by the number of pieces (must_divide):
//                           then the pieces of both are the same contiguous ranges of the group's
//                           flat block. An uneven shard of a merged or split dim changes which
//                           elements a rank holds, so it is rejected. This is DTensor's rule
//                           (a flattened dim is shardable on its leftmost input, a split on its
//                           first part) with the divisibility made explicit.
// Size-1 dims are never sharded (pruned anyway: a dim smaller than the mesh cannot be cut).
//
// transpose/t/permute move S(d) to the dim's new position. expand keeps S on dims it does not
// broadcast and can shard a broadcast dim of the output from a Replicate input (each rank expands
// to its local size). Every view is linear: P(sum) -> P(sum). Lowering rewrites the size lists of
// views to local sizes. Views cost no compute (no kernel).
//
//===----------------------------------------------------------------------===//
#include <algorithm>

#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

DimStrategy unary(const RuleContext& c, Placement in, Placement out) {
  DimStrategy s = emptyDim(c);
  s.inputs[0] = in;
  s.outputs[0] = out;
  return s;
}

bool unaryView(const RuleContext& c) {
  if (!c.isTensorInput(0) || !c.isTensorOutput(0)) return false;
  if (c.input(0).type != ir::ValueType::kTensor || c.output(0).type != ir::ValueType::kTensor)
    return false;
  for (size_t i = 1; i < c.numInputs(); ++i)
    if (c.isTensorInput(i)) return false;
  return c.numOutputs() == 1;
}

std::vector<DimStrategy> reshapeRule(const RuleContext& c) {
  if (!unaryView(c)) return {};
  std::vector<int64_t> in = c.inputSizes(0), out = c.outputSizes(0);
  if (numel(in) != numel(out)) return {};
  // aten::squeeze(self) without dims.
  const bool squeeze_all = c.node.op == "aten::squeeze" && c.numInputs() == 1;
  std::vector<DimStrategy> res;
  res.push_back(unary(c, R(), R()));
  bool has_zero = std::count(in.begin(), in.end(), 0) + std::count(out.begin(), out.end(), 0) > 0;
  if (!has_zero) {
    std::vector<int64_t> in_nz, out_nz;
    for (size_t d = 0; d < in.size(); ++d)
      if (in[d] != 1) in_nz.push_back(static_cast<int64_t>(d));
    for (size_t d = 0; d < out.size(); ++d)
      if (out[d] != 1) out_nz.push_back(static_cast<int64_t>(d));
    size_t i = 0, j = 0;
    while (i < in_nz.size() && j < out_nz.size()) {
      int64_t i0 = in_nz[i++], o0 = out_nz[j++];
      int64_t pin = in[static_cast<size_t>(i0)], pout = out[static_cast<size_t>(o0)];
      bool one_to_one = true;
      while (pin != pout) {
        one_to_one = false;
        if (pin < pout) {
          if (i >= in_nz.size()) return {};
          pin *= in[static_cast<size_t>(in_nz[i++])];
        } else {
          if (j >= out_nz.size()) return {};
          pout *= out[static_cast<size_t>(out_nz[j++])];
        }
      }
      DimStrategy s = unary(c, S(i0), S(o0));
      if (!one_to_one) {
        s.must_divide.push_back({false, 0, static_cast<int>(i0)});
        s.must_divide.push_back({true, 0, static_cast<int>(o0)});
      }
      // squeeze() drops every dim of size 1, so a rank whose piece of a cut dim is one element
      // would drop that dim too (5 rows over 3 ranks: 2, 2, 1): its pieces must be even, of two
      // elements at least (TensorDimRef::multiple).
      if (squeeze_all) s.must_divide.push_back({false, 0, static_cast<int>(i0), 2});
      res.push_back(std::move(s));
    }
    if (i != in_nz.size() || j != out_nz.size()) return {};
  }
  res.push_back(unary(c, P(), P()));
  return res;
}

/// Strategies of a dim permutation: input dim d goes to output dim perm_inverse[d].
std::vector<DimStrategy> permuted(const RuleContext& c, const std::vector<int64_t>& out_of_in) {
  std::vector<DimStrategy> res;
  res.push_back(unary(c, R(), R()));
  for (size_t d = 0; d < out_of_in.size(); ++d)
    res.push_back(unary(c, S(static_cast<int64_t>(d)), S(out_of_in[d])));
  res.push_back(unary(c, P(), P()));
  return res;
}

/// transpose, swapaxes, swapdims (two dims named), t (a matrix's two), numpy_T (x.T: every dim
/// reversed) and mT, mH, adjoint (x.mT: the last two dims, at least two).
std::vector<DimStrategy> transposeRule(const RuleContext& c) {
  if (!unaryView(c)) return {};
  int64_t r = c.inputRank(0);
  if (c.outputRank(0) != r) return {};
  std::vector<int64_t> perm(static_cast<size_t>(r));
  for (int64_t d = 0; d < r; ++d) perm[static_cast<size_t>(d)] = d;
  const std::string& op = c.node.op;
  if (op == "aten::t" || op == "aten::t_") {  // t_: its in-place variant
    if (r == 2) std::swap(perm[0], perm[1]);
  } else if (op == "aten::numpy_T") {
    std::reverse(perm.begin(), perm.end());
  } else if (op == "aten::mT" || op == "aten::mH" || op == "aten::adjoint") {
    if (r < 2) return {};
    std::swap(perm[static_cast<size_t>(r - 1)], perm[static_cast<size_t>(r - 2)]);
  } else if (r > 0) {
    auto a = c.intArg(1), b = c.intArg(2);
    if (!a || !b) return {};
    auto na = normDim(*a, r), nb = normDim(*b, r);
    if (!na || !nb) return {};
    std::swap(perm[static_cast<size_t>(*na)], perm[static_cast<size_t>(*nb)]);
  }
  return permuted(c, perm);
}

std::vector<DimStrategy> permuteRule(const RuleContext& c) {
  if (!unaryView(c)) return {};
  int64_t r = c.inputRank(0);
  auto dims = c.intListArg(1);
  if (!dims || static_cast<int64_t>(dims->size()) != r || c.outputRank(0) != r) return {};
  std::vector<int64_t> out_of_in(static_cast<size_t>(r), -1);
  for (int64_t o = 0; o < r; ++o) {
    auto d = normDim((*dims)[static_cast<size_t>(o)], r);
    if (!d || out_of_in[static_cast<size_t>(*d)] != -1) return {};
    out_of_in[static_cast<size_t>(*d)] = o;
  }
  return permuted(c, out_of_in);
}

/// Strategies of self [in] expanded to [out]: S on a dim kept, R -> S(o) on a dim expanded (each
/// rank expands to its local piece), P -> P; `make(self, out)` builds each one.
template <typename Make>
std::vector<DimStrategy> expanded(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                  Make make) {
  int64_t ri = static_cast<int64_t>(in.size()), ro = static_cast<int64_t>(out.size());
  if (ri > ro) return {};
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R()));
  for (int64_t o = 0; o < ro; ++o) {
    int64_t a = o - (ro - ri);
    if (a >= 0 && in[static_cast<size_t>(a)] == out[static_cast<size_t>(o)])
      res.push_back(make(S(a), S(o)));
    else if (a < 0 || in[static_cast<size_t>(a)] == 1)
      res.push_back(make(R(), S(o)));
    else
      return {};
  }
  res.push_back(make(P(), P()));
  return res;
}

std::vector<DimStrategy> expandRule(const RuleContext& c) {
  if (!unaryView(c)) return {};
  return expanded(c.inputSizes(0), c.outputSizes(0),
                  [&](Placement in, Placement out) { return unary(c, in, out); });
}

/// expand_as(self, other): self expanded to other's shape; other's values are not read, but its
/// local shape is the output's, so other is placed as the output (whole where the output is
/// Partial).
std::vector<DimStrategy> expandAsRule(const RuleContext& c) {
  if (c.numInputs() != 2 || c.numOutputs() != 1 || c.input(0).type != ir::ValueType::kTensor ||
      c.input(1).type != ir::ValueType::kTensor || c.output(0).type != ir::ValueType::kTensor ||
      c.inputSizes(1) != c.outputSizes(0))
    return {};
  return expanded(c.inputSizes(0), c.outputSizes(0), [&](Placement self, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.inputs[1] = out.isPartial() ? R() : out;
    s.outputs[0] = out;
    return s;
  });
}

}  // namespace

void registerViewRules(Registry& r) {
  using cost::OpFamily;
  for (const char* op : {"aten::_unsafe_view", "aten::flatten", "aten::reshape", "aten::squeeze",
                         "aten::unflatten", "aten::unsqueeze", "aten::view"})
    r.add(op, reshapeRule, OpFamily::kView, noWork);
  for (const char* op : {"aten::adjoint", "aten::mH", "aten::mT", "aten::numpy_T", "aten::swapaxes",
                         "aten::swapdims", "aten::t", "aten::transpose"})
    r.add(op, transposeRule, OpFamily::kView, noWork);
  r.add("aten::permute", permuteRule, OpFamily::kView, noWork);
  for (const char* op : {"aten::broadcast_to", "aten::expand"})
    r.add(op, expandRule, OpFamily::kView, noWork);
  r.add("aten::expand_as", expandAsRule, OpFamily::kView, noWork);
  // The size lists lowering rewrites to the rank's local shape (apc/strategy/local_rewrite.h).
  for (const char* op : {"aten::_unsafe_view", "aten::reshape", "aten::view"})
    r.entry(op)->local_rewrite = rewriteViewSizes;
  for (const char* op : {"aten::broadcast_to", "aten::expand"})
    r.entry(op)->local_rewrite = rewriteExpandSizes;
  r.entry("aten::unflatten")->local_rewrite = rewriteUnflattenSizes;
  // expand's gradient is the output's summed back to the input's shape: a reduction reading the
  // output's bytes and writing the input's (none where nothing was expanded: sum_to returns the
  // gradient itself).
  for (const char* op : {"aten::broadcast_to", "aten::expand"})
    r.entry(op)->backward_work = [](const RuleContext& c, const LocalShapes& local) {
      Work w;
      const double in = detail::localInputBytes(c, local, 0);
      const double out = detail::localOutputBytes(c, local, 0);
      if (out > in) w.bytes = in + out;
      return w;
    };

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  const std::vector<OpSample> views = {
      {"", {S::f32({4, 6}), S::of(std::vector<int64_t>{2, 2, 6})}},
      {"", {S::f32({4, 6}), S::of(std::vector<int64_t>{24})}},
      {"", {S::f32({2, 3, 4}), S::of(std::vector<int64_t>{6, 4})}},
      {"", {S::f32({4, 6}), S::of(std::vector<int64_t>{-1, 3})}},
      {"", {S::f32({5, 6}), S::of(std::vector<int64_t>{5, 2, 3})}},
  };
  samples({"aten::view", "aten::reshape", "aten::_unsafe_view"}, views);
  samples({"aten::flatten"}, {{"using_ints", {S::f32({2, 3, 4}), S::of(1), S::of(-1)}},
                              {"using_ints", {S::f32({4, 3, 5}), S::of(0), S::of(1)}}});
  samples({"aten::squeeze"},
          {{"dim", {S::f32({5, 1, 6}), S::of(1)}},
           {"", {S::f32({5, 1, 6})}},
           {"", {S::f32({4, 1, 6})}},
           {"dims", {S::f32({5, 1, 6, 1}), S::of(std::vector<int64_t>{1, -1})}}});
  samples({"aten::unflatten"},
          {{"int", {S::f32({6, 12}), S::of(1), S::of(std::vector<int64_t>{3, 4})}},
           {"int", {S::f32({4, 6}), S::of(-1), S::of(std::vector<int64_t>{2, -1})}}});
  samples({"aten::unsqueeze"}, {{"", {S::f32({5, 6}), S::of(1)}},
                                {"", {S::f32({5, 6}), S::of(-1)}},
                                {"", {S::f32({5, 6}), S::of(0)}}});
  samples({"aten::transpose"}, {{"int", {S::f32({2, 5, 6}), S::of(0), S::of(2)}},
                                {"int", {S::f32({2, 5, 6}), S::of(-1), S::of(-2)}}});
  samples({"aten::swapaxes", "aten::swapdims"}, {{"", {S::f32({2, 5, 6}), S::of(0), S::of(2)}},
                                                 {"", {S::f32({2, 5, 6}), S::of(-1), S::of(-2)}}});
  samples({"aten::t"}, {{"", {S::f32({5, 6})}}, {"", {S::f32({6})}}});
  samples({"aten::numpy_T"}, {{"", {S::f32({5, 6})}}, {"", {S::f32({7, 5})}}});
  samples({"aten::adjoint", "aten::mH", "aten::mT"}, {{"", {S::f32({2, 5, 6})}}});
  samples({"aten::permute"}, {{"", {S::f32({2, 5, 6}), S::of(std::vector<int64_t>{2, 0, 1})}},
                              {"", {S::f32({2, 5, 6}), S::of(std::vector<int64_t>{-1, 0, 1})}}});
  samples({"aten::expand_as"}, {{"", {S::f32({5, 1}), S::f32({5, 6})}},
                                {"", {S::f32({6}), S::f32({3, 5, 6})}},
                                {"", {S::f32({1, 6}), S::f32({2, 5, 6})}}});
  samples({"aten::expand", "aten::broadcast_to"},
          {{"", {S::f32({5, 1}), S::of(std::vector<int64_t>{5, 6})}},
           {"", {S::f32({6}), S::of(std::vector<int64_t>{3, 5, 6})}},
           {"", {S::f32({5, 1}), S::of(std::vector<int64_t>{-1, 6})}}});
}

}  // namespace apc::strategy
