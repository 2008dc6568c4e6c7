//===- lib/strategy/routing.cpp - Mixture-of-experts routing and expert ops ===//
//
// Rules of the ops that mixture-of-experts layers export: routing (top-k, sorting, counting,
// gathering and scattering tokens) and the grouped expert matmul. Every rule below offers the
// all-Replicate strategy first; "d" is the op's dim argument (negative counts from the end).
//
//   topk(self, k, dim) -> (values, indices)
//   sort(self, dim, descending), sort.stable(self, stable, dim, descending) -> (values, indices)
//   argsort(self, dim, descending), argsort.stable(self, stable, dim, descending)
//                        self and every output S(k != d): each row along d is whole on its rank,
//                        so its local result (indices count along d) is the global one. No
//                        Partial (none is linear).
//   gather(self, d, index)
//                        self S(k) and index S(k), k != d, where both have the same size in k
//                        (gather allows a smaller index there) -> out S(k); self R and index S(d)
//                        -> out S(d) (out has index's shape: each rank gathers its own indices
//                        along d; along the other dims out[i] reads self[i], so there an index
//                        piece needs the matching self piece); self P, index R -> out P (linear
//                        in self).
//   scatter_add(self, d, index, src)
//                        self, index, src S(k), k != d, where the three have the same size in k
//                        -> out S(k); self P, index R, src P -> out P (out = self + scatter(src)
//                        is linear in (self, src) together); self P, index S(d), src S(d) (index
//                        and src of the same size in d) -> out P: each rank adds its share of the
//                        scattered rows into its summand of self.
//   index_add(self, d, index[n], source, alpha)
//                        self S(k), source S(k), k != d, index R -> out S(k); self P, index R,
//                        source P -> out P; self P, index S(0), source S(d) -> out P (as
//                        scatter_add, alpha linear).
//   bincount(self[n], weights, minlength)
//                        self R (weights R) -> out R; self R, weights P -> out P (linear in the
//                        weights); self S(0) (weights S(0)) -> out P(sum) when the output's size
//                        is static and equals minlength: then every value is below minlength,
//                        so every rank's local count has that size too and the counts add up.
//   histc(self, bins, min, max)
//                        self S(k) for any k -> out P(sum) when the range is static (min < max):
//                        counts of the pieces add up. min == max (the data's own range) is
//                        Replicate only: a piece's range is not the whole tensor's.
//   one_hot(self, num_classes) -> [*self, num_classes]
//                        self S(k) -> out S(k) for any dim k of self: each index's row of
//                        classes is whole on its rank (num_classes is the export's constant, not
//                        read from the data). No Partial.
//   repeat_interleave.self_int(self, repeats, dim, output_size),
//   repeat_interleave.self_Tensor(self, repeats[n], dim, output_size)
//                        with a dim: self S(k != d) (repeats R) -> out S(k); self P -> out P
//                        (copying rows is linear); an int repeat count without output_size (which
//                        would name the global size) also self S(d) -> out S(d) when self's dim d
//                        divides evenly (must_divide): piece q of out repeats piece q of self.
//                        Without a dim self is flattened: R and P only.
//   repeat_interleave.Tensor(repeats) -> indices
//                        Replicate only (the output holds global positions).
//   _grouped_mm(self, mat2, offs, bias, out_dtype)
//     2D x 3D with offs: self [M, K] (rows sorted by group), mat2 [G, K, N], offs [G] (int32
//     cumulative row ends): out [M, N], rows offs[g-1]..offs[g] times mat2[g].
//                        mat2 S(2) (self R, offs R) -> out S(1); self S(1), mat2 S(1) -> out P
//                        (the contracted K); self P, mat2 R -> out P; self R, mat2 P -> out P.
//                        The group dim stays whole: which rows a group owns is data, so neither
//                        G nor M can be cut by a placement (rows past offs[G-1] are left
//                        unwritten by the kernel, so no masked form is exact either).
//     3D x 3D without offs: self [G, M, K], mat2 [G, K, N], out [G, M, N] (a bmm):
//                        both S(0) -> out S(0); self S(1) -> out S(1); mat2 S(2) -> out S(2);
//                        self S(2), mat2 S(1) -> out P; self P / mat2 P -> out P.
//     K and N pieces must be even and, as the kernels (CPU and CUDA) need every row stride a
//     multiple of 16 bytes, a multiple of 4 (f32) or 8 (bf16, f16) elements (must_divide with
//     TensorDimRef::multiple). With a bias no rule (the kernels take none today). Other forms
//     (2D x 2D, 3D x 2D, which appear in backward) decline.
//
// Index inputs are never Partial (enumerate drops Partial integer placements only for avg; these
// rules never emit them for indices).
//
//===----------------------------------------------------------------------===//
#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

/// The dim argument `i` normalized against `rank`; `fallback` when the argument is absent or
/// None; nullopt when it is not a known int or out of range.
std::optional<int64_t> dimArg(const RuleContext& c, size_t i, int64_t rank, int64_t fallback) {
  if (c.isNoneArg(i)) return normDim(fallback, rank);
  auto d = c.intArg(i);
  if (!d) return std::nullopt;
  return normDim(*d, rank);
}

/// Ops whose tensor inputs and outputs share one rank and that keep every dim but `dim` (argument
/// `dim_arg`, default -1) within a rank: topk, sort, argsort. No Partial.
std::vector<DimStrategy> exceptDimNoPartial(const RuleContext& c, size_t dim_arg) {
  const int64_t r = commonRank(c);
  if (r < 0) return {};
  if (r == 0) return {replicateAll(c)};  // a scalar: dim -1 names it, nothing to cut
  auto d = dimArg(c, dim_arg, r, -1);
  if (!d) return {};
  return uniformStrategies(c, dimsExcept(r, {*d}), kNoPartial);
}

/// The sizes of inputs `a` and `b` agree in dim `k`.
bool sameSize(const RuleContext& c, size_t a, size_t b, int64_t k) {
  const std::vector<int64_t> x = c.inputSizes(a), y = c.inputSizes(b);
  const auto i = static_cast<size_t>(k);
  return i < x.size() && i < y.size() && x[i] == y[i];
}

/// gather(self, dim, index, sparse_grad).
std::vector<DimStrategy> gatherRule(const RuleContext& c) {
  const int64_t r = c.inputRank(0);
  if (r < 1 || c.inputRank(2) != r || c.outputRank(0) != r || c.numOutputs() != 1) return {};
  auto d = dimArg(c, 1, r, 0);
  if (!d) return {};
  auto make = [&](Placement self, Placement index, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.inputs[2] = index;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res{make(R(), R(), R())};
  for (int64_t k = 0; k < r; ++k)
    if (k != *d && sameSize(c, 0, 2, k)) res.push_back(make(S(k), S(k), S(k)));
  res.push_back(make(R(), S(*d), S(*d)));
  res.push_back(make(P(), R(), P()));
  return res;
}

/// A strategy of scatter_add / index_add (self, dim, index, src): the placements of self, index,
/// src and the output.
DimStrategy combineStrategy(const RuleContext& c, Placement self, Placement index, Placement src,
                            Placement out) {
  DimStrategy s = emptyDim(c);
  s.inputs[0] = self;
  s.inputs[2] = index;
  s.inputs[3] = src;
  s.outputs[0] = out;
  return s;
}

/// scatter_add(self, dim, index, src).
std::vector<DimStrategy> scatterAddRule(const RuleContext& c) {
  const int64_t r = c.inputRank(0);
  if (r < 1 || c.inputRank(2) != r || c.inputRank(3) != r || c.outputRank(0) != r) return {};
  auto d = dimArg(c, 1, r, 0);
  if (!d) return {};
  auto make = [&](Placement self, Placement index, Placement src, Placement out) {
    return combineStrategy(c, self, index, src, out);
  };
  std::vector<DimStrategy> res{make(R(), R(), R(), R())};
  for (int64_t k = 0; k < r; ++k)
    if (k != *d && sameSize(c, 0, 2, k) && sameSize(c, 2, 3, k))
      res.push_back(make(S(k), S(k), S(k), S(k)));
  res.push_back(make(P(), R(), P(), P()));
  if (sameSize(c, 2, 3, *d)) res.push_back(make(P(), S(*d), S(*d), P()));
  return res;
}

/// scatter(self, dim, index, src) and scatter(self, dim, index, value): elements of src (or the
/// value) written at self[... index ...] along dim; any other dim where self, index (and src) have
/// one size may be cut. Which of two writes to one element wins is not promised, so no Partial.
std::vector<DimStrategy> scatterRule(const RuleContext& c) {
  const int64_t r = c.inputRank(0);
  const bool src = c.numInputs() > 3 && c.isTensorInput(3);
  if (r < 1 || c.inputRank(2) != r || (src && c.inputRank(3) != r) || c.outputRank(0) != r)
    return {};
  auto d = dimArg(c, 1, r, 0);
  if (!d) return {};
  auto make = [&](Placement p) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = p;
    s.inputs[2] = p;
    if (src) s.inputs[3] = p;
    s.outputs[0] = p;
    return s;
  };
  std::vector<DimStrategy> res{make(R())};
  for (int64_t k = 0; k < r; ++k)
    if (k != *d && sameSize(c, 0, 2, k) && (!src || sameSize(c, 2, 3, k)))
      res.push_back(make(S(k)));
  return res;
}

/// index_add(self, dim, index [n], source, alpha).
std::vector<DimStrategy> indexAddRule(const RuleContext& c) {
  const int64_t r = c.inputRank(0);
  if (r < 1 || c.inputRank(2) != 1 || c.inputRank(3) != r || c.outputRank(0) != r) return {};
  auto d = dimArg(c, 1, r, 0);
  if (!d) return {};
  auto make = [&](Placement self, Placement index, Placement src, Placement out) {
    return combineStrategy(c, self, index, src, out);
  };
  std::vector<DimStrategy> res{make(R(), R(), R(), R())};
  for (int64_t k = 0; k < r; ++k)
    if (k != *d && sameSize(c, 0, 3, k)) res.push_back(make(S(k), R(), S(k), S(k)));
  res.push_back(make(P(), R(), P(), P()));
  const std::vector<int64_t> index = c.inputSizes(2), src = c.inputSizes(3);
  if (index.at(0) == src.at(static_cast<size_t>(*d))) res.push_back(make(P(), S(0), S(*d), P()));
  return res;
}

/// bincount(self [n], weights, minlength).
std::vector<DimStrategy> bincountRule(const RuleContext& c) {
  if (c.inputRank(0) != 1 || c.outputRank(0) != 1 || c.numOutputs() != 1) return {};
  const bool weights = c.isTensorInput(1);
  if (weights && c.inputRank(1) != 1) return {};
  auto make = [&](Placement self, Placement w, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    if (weights) s.inputs[1] = w;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res{make(R(), R(), R())};
  if (weights) res.push_back(make(R(), P(), P()));
  const ir::TensorMeta* out = c.outputMetas(0).front();
  auto minlength = c.intArg(2);
  if (minlength && *minlength > 0 && !out->shape.at(0).isSymbolic() &&
      out->shape.at(0).size == *minlength)
    res.push_back(make(S(0), S(0), P()));
  return res;
}

/// histc(self, bins, min, max).
std::vector<DimStrategy> histcRule(const RuleContext& c) {
  const int64_t r = c.inputRank(0);
  if (r < 0 || c.outputRank(0) != 1 || c.numOutputs() != 1) return {};
  auto make = [&](Placement self, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res{make(R(), R())};
  auto lo = c.doubleArg(2), hi = c.doubleArg(3);
  if (lo && hi && *lo < *hi)
    for (int64_t k = 0; k < r; ++k) res.push_back(make(S(k), P()));
  return res;
}

/// repeat_interleave.self_int / .self_Tensor(self, repeats, dim, output_size).
std::vector<DimStrategy> repeatInterleaveRule(const RuleContext& c) {
  const int64_t r = c.inputRank(0);
  if (r < 0 || c.outputRank(0) < 0 || c.numOutputs() != 1) return {};
  const bool tensor_repeats = c.isTensorInput(1);
  if (tensor_repeats && c.inputRank(1) > 1) return {};
  auto make = [&](Placement self, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    if (tensor_repeats) s.inputs[1] = R();
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res{make(R(), R())};
  if (!c.isNoneArg(2)) {
    if (c.outputRank(0) != r) return {};
    auto d = dimArg(c, 2, r, 0);
    if (!d) return {};
    for (int64_t k = 0; k < r; ++k)
      if (k != *d) res.push_back(make(S(k), S(k)));
    // An int repeat count: out rows i*n .. i*n+n-1 copy self row i, so even pieces of self's
    // rows give the even pieces of out's (piece q: self rows q*c.., out rows q*c*n..).
    if (!tensor_repeats && c.isNoneArg(3)) {
      DimStrategy s = make(S(*d), S(*d));
      s.must_divide = {{false, 0, static_cast<int>(*d)}};
      res.push_back(std::move(s));
    }
  } else if (c.outputRank(0) != 1) {
    return {};
  }
  res.push_back(make(P(), P()));
  return res;
}

/// repeat_interleave.Tensor(repeats, output_size): global positions, Replicate only.
std::vector<DimStrategy> replicateOnlyRule(const RuleContext& c) {
  if (c.numOutputs() != 1 || c.outputRank(0) < 0) return {};
  return {replicateAll(c)};
}

/// _grouped_mm(self, mat2, offs, bias, out_dtype).
std::vector<DimStrategy> groupedMmRule(const RuleContext& c) {
  if (c.numInputs() < 2 || c.numOutputs() != 1) return {};
  if (c.numInputs() > 3 && c.isTensorInput(3)) return {};  // bias
  const bool offs = c.numInputs() > 2 && c.isTensorInput(2);
  const int64_t a = c.inputRank(0), b = c.inputRank(1), o = c.outputRank(0);
  auto make = [&](Placement self, Placement mat2, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.inputs[1] = mat2;
    if (offs) s.inputs[2] = R();
    s.outputs[0] = out;
    return s;
  };
  // Even pieces whose rows stay 16-byte aligned: a multiple of 16 / element bytes elements.
  auto granule = [&](size_t input) -> int64_t {
    const int bytes = ir::dtypeBytes(c.inputMetas(input).front()->dtype);
    return bytes > 0 && bytes < 16 ? 16 / bytes : 1;
  };
  auto divides = [&](DimStrategy s, std::vector<TensorDimRef> refs) {
    for (TensorDimRef& ref : refs) ref.multiple = granule(ref.index);
    s.must_divide = std::move(refs);
    return s;
  };
  std::vector<DimStrategy> res{make(R(), R(), R())};
  if (a == 2 && b == 3 && o == 2 && offs && c.inputRank(2) == 1) {
    res.push_back(divides(make(R(), S(2), S(1)), {{false, 1, 2}}));
    res.push_back(divides(make(S(1), S(1), P()), {{false, 0, 1}, {false, 1, 1}}));
  } else if (a == 3 && b == 3 && o == 3 && !offs) {
    res.push_back(make(S(0), S(0), S(0)));
    res.push_back(make(S(1), R(), S(1)));
    res.push_back(divides(make(R(), S(2), S(2)), {{false, 1, 2}}));
    res.push_back(divides(make(S(2), S(1), P()), {{false, 0, 2}, {false, 1, 1}}));
  } else {
    return {};
  }
  res.push_back(make(P(), R(), P()));
  res.push_back(make(R(), P(), P()));
  return res;
}

/// one_hot(self, num_classes): any dim of self, the same dim of the output (its new last dim,
/// the classes, stays whole). Replicate only when num_classes is not a constant >= 0 (-1 asks the
/// data for its maximum).
std::vector<DimStrategy> oneHotRule(const RuleContext& c) {
  if (c.numInputs() < 2 || !c.isTensorInput(0) || !c.isTensorOutput(0)) return {};
  const std::optional<int64_t> classes = c.intArg(1);
  if (!classes || *classes < 0) return {replicateAll(c)};
  std::vector<DimStrategy> res{replicateAll(c)};
  for (int64_t d = 0; d < c.inputRank(0); ++d) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = S(d);
    s.outputs[0] = S(d);
    res.push_back(s);
  }
  return res;
}

}  // namespace

void registerRoutingRules(Registry& r) {
  using cost::OpFamily;
  r.add(
      "aten::topk", [](const RuleContext& c) { return exceptDimNoPartial(c, 2); },
      OpFamily::kReduction);
  r.add(
      "aten::sort", [](const RuleContext& c) { return exceptDimNoPartial(c, 1); },
      OpFamily::kReduction);
  r.add(
      "aten::sort.stable", [](const RuleContext& c) { return exceptDimNoPartial(c, 2); },
      OpFamily::kReduction);
  r.add(
      "aten::argsort", [](const RuleContext& c) { return exceptDimNoPartial(c, 1); },
      OpFamily::kReduction);
  r.add(
      "aten::argsort.stable", [](const RuleContext& c) { return exceptDimNoPartial(c, 2); },
      OpFamily::kReduction);
  // Only a token-local region's strategies cut the sorted dim (apc/strategy/token_local.h).
  for (const char* op :
       {"aten::sort", "aten::sort.stable", "aten::argsort", "aten::argsort.stable"})
    r.entry(op)->local_rewrite = detail::rewriteLocalSort;
  r.add("aten::gather", gatherRule, OpFamily::kIndex);
  r.add("aten::one_hot", oneHotRule, OpFamily::kIndex);
  r.add("aten::scatter_add", scatterAddRule, OpFamily::kIndex);
  r.add("aten::scatter.src", scatterRule, OpFamily::kIndex);
  r.add("aten::scatter.value", scatterRule, OpFamily::kIndex);
  r.add("aten::index_add", indexAddRule, OpFamily::kIndex);
  r.add("aten::bincount", bincountRule, OpFamily::kReduction);
  r.add("aten::histc", histcRule, OpFamily::kReduction);
  r.add("aten::repeat_interleave.self_int", repeatInterleaveRule, OpFamily::kIndex);
  r.add("aten::repeat_interleave.self_Tensor", repeatInterleaveRule, OpFamily::kIndex);
  r.add("aten::repeat_interleave.Tensor", replicateOnlyRule, OpFamily::kIndex);
  r.add("aten::_grouped_mm", groupedMmRule, OpFamily::kContraction,
        [](const RuleContext& c, const LocalShapes& l) {
          Work w = contractionWork(c, l, 0, {-1});
          // With the groups cut (a token-local region's expert cut: each rank multiplies the rows
          // of its own experts, apc/strategy/token_local.h), the rank's share of the rows, for
          // routing that spreads them evenly.
          const std::vector<int64_t> global = c.inputSizes(1);
          if (l.inputs.size() > 1 && l.inputs[1].size() == 1 && !global.empty() &&
              !l.inputs[1][0].empty() && global[0] > 0 && l.inputs[1][0][0] < global[0])
            w.flops *= static_cast<double>(l.inputs[1][0][0]) / static_cast<double>(global[0]);
          return w;
        });
  // Only a token-local region's strategies cut the groups (apc/strategy/token_local.h).
  r.entry("aten::_grouped_mm")->local_rewrite = detail::rewriteLocalExperts;

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  samples({"aten::topk"}, {{"", {S::f32({5, 6}), S::of(3)}},
                           {"", {S::f32({5, 6}), S::of(2), S::of(0)}},
                           {"", {S::f32({2, 5, 7}), S::of(3), S::of(1), S::of(false)}}});
  samples({"aten::sort", "aten::argsort"},
          {{"", {S::f32({5, 6})}}, {"", {S::f32({5, 6}), S::of(0), S::of(true)}}});
  samples({"aten::sort.stable", "aten::argsort.stable"},
          {{"", {S::f32({5, 6}), S::of(true), S::of(0)}},
           {"", {S::f32({2, 5, 7}), S::of(true), S::of(-1), S::of(true)}}});
  samples({"aten::gather"}, {{"", {S::f32({5, 6}), S::of(1), S::i64({5, 4})}},
                             {"", {S::f32({5, 6}), S::of(0), S::i64({3, 6})}}});
  samples({"aten::one_hot"}, {{"", {S::i64({5, 3}), S::of(7)}}});
  samples({"aten::scatter_add"},
          {{"", {S::f32({5, 6}), S::of(1), S::i64({5, 4}), S::f32({5, 4})}},
           {"", {S::f32({5, 6}), S::of(0), S::i64({3, 6}), S::f32({3, 6})}}});
  samples({"aten::scatter.src"},
          {{"", {S::f32({5, 6}), S::of(1), S::i64({5, 4}), S::f32({5, 4})}},
           {"", {S::f32({5, 6}), S::of(0), S::i64({3, 6}), S::f32({4, 6})}},
           {"", {S::f32({5, 6}), S::of(1), S::i64({5, 6}), S::f32({5, 6})}}});
  samples({"aten::scatter.value"}, {{"", {S::f32({5, 6}), S::of(1), S::i64({5, 3}), S::of(1.5)}},
                                    {"", {S::f32({5, 6}), S::of(0), S::i64({2, 6}), S::of(-2.0)}},
                                    {"", {S::f32({4, 6}), S::of(1), S::i64({4, 6}), S::of(1.0)}}});
  samples({"aten::index_add"}, {{"", {S::f32({5, 6}), S::of(0), S::i64({3}), S::f32({3, 6})}},
                                {"", {S::f32({5, 6}), S::of(1), S::i64({4}), S::f32({5, 4})}}});
  samples({"aten::bincount"}, {{"", {S::i64({20}), S::none(), S::of(8)}}});
  samples({"aten::histc"}, {{"", {S::f32({5, 6}), S::of(10), S::of(-2.0), S::of(2.0)}}});
  // _grouped_mm: 10 token rows in 3 groups (offs drawn as sorted row ends), K and N multiples of 4
  // (its kernels' 16-byte rows).
  samples({"aten::_grouped_mm"},
          {{"", {S::f32({10, 8}), S::f32({3, 8, 8}), S::tensor(ir::DType::kI32, {3})}}});
  samples({"aten::repeat_interleave.self_int"},
          {{"", {S::f32({5, 6}), S::of(2), S::of(1)}}, {"", {S::f32({5, 6}), S::of(3), S::of(0)}}});
}

}  // namespace apc::strategy
