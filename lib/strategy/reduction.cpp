//===- lib/strategy/reduction.cpp - Reductions over dims ------------------===//
//
// Rules of reductions (sum, mean, amax, amin, max, min, logsumexp, var, std, vector norms). A dim
// that is not reduced can be sharded: S(d) on the input, S(d') on the output (d' = d with keepdim,
// else d minus the reduced dims before it). A reduced dim that is sharded gives each rank the
// reduction of its slice, so the output is Partial with the op that combines slices:
//   sum        P(sum)   uneven slices are fine
//   mean       P(avg)   only when the dim divides evenly over its pieces (must_divide): the mean of
//                       unequal-sized local means is not the global mean
//   amax, max  P(max)   amin, min: P(min); also must_divide, because torch.chunk leaves empty
//   pieces
//                       for some uneven sizes and the max of an empty slice is an error
// logsumexp, var, std, the vector norms and max.dim/min.dim (whose indices are global positions)
// never reduce a sharded dim. Partial inputs pass where the op commutes with the reduce op: sum and
// mean of P(sum)/P(avg), amax/max of P(max), amin/min of P(min).
//
//===----------------------------------------------------------------------===//
#include <algorithm>

#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

struct ReductionSpec {
  int dims_arg = 1;                        // input index of the dim list; -1: reduce all dims
  std::optional<ReduceOp> sharded_reduce;  // output partial when a reduced dim is sharded
  bool even = false;                       // that reduced dim must divide evenly
  std::vector<ReduceOp> passthrough;       // P(op) input -> P(op) output
};

std::vector<DimStrategy> reduce(const RuleContext& c, const ReductionSpec& spec) {
  int64_t in_rank = c.inputRank(0);
  if (in_rank < 0 || c.input(0).type != ir::ValueType::kTensor) return {};
  int64_t out_rank = c.outputRank(0);
  if (out_rank < 0) return {};
  std::vector<int64_t> reduced;
  if (spec.dims_arg >= 0 && !c.isNoneArg(static_cast<size_t>(spec.dims_arg))) {
    auto dims = c.intListArg(static_cast<size_t>(spec.dims_arg));
    if (!dims) return {};
    for (int64_t d : *dims) {
      auto nd = normDim(d, std::max<int64_t>(in_rank, 1));
      if (!nd) return {};
      if (in_rank > 0) reduced.push_back(*nd);
    }
  }
  if (spec.dims_arg < 0 && out_rank != 0) return {};       // a full reduction gives a scalar
  if (reduced.empty()) reduced = dimsExcept(in_rank, {});  // None or [] reduces every dim
  std::sort(reduced.begin(), reduced.end());
  reduced.erase(std::unique(reduced.begin(), reduced.end()), reduced.end());
  bool keepdim = out_rank == in_rank;
  if (!keepdim && out_rank != in_rank - static_cast<int64_t>(reduced.size())) return {};

  // Every tensor output (values, and indices for max.dim) gets the same placement.
  auto make = [&](Placement in, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = in;
    for (size_t i = 0; i < c.numOutputs(); ++i)
      if (c.isTensorOutput(i)) s.outputs[i] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R()));
  for (int64_t d = 0; d < in_rank; ++d) {
    bool is_reduced = std::binary_search(reduced.begin(), reduced.end(), d);
    if (!is_reduced) {
      int64_t before =
          std::count_if(reduced.begin(), reduced.end(), [&](int64_t x) { return x < d; });
      res.push_back(make(S(d), S(keepdim ? d : d - before)));
    } else if (spec.sharded_reduce) {
      DimStrategy s = make(S(d), P(*spec.sharded_reduce));
      if (spec.even) s.must_divide.push_back({false, 0, static_cast<int>(d)});
      res.push_back(std::move(s));
    }
  }
  for (ReduceOp op : spec.passthrough) res.push_back(make(P(op), P(op)));
  return res;
}

Rule reductionRule(ReductionSpec spec) {
  return [spec](const RuleContext& c) { return reduce(c, spec); };
}

Work reductionWork(const RuleContext& c, const LocalShapes& l) {
  Work w = defaultWork(c, l);
  w.flops = 0;
  if (!l.inputs.empty())
    for (const auto& shape : l.inputs[0]) w.flops += numel(shape);
  return w;
}

}  // namespace

void registerReductionRules(Registry& r) {
  using cost::OpFamily;
  auto add = [&](const char* op, ReductionSpec spec) {
    r.add(op, reductionRule(spec), OpFamily::kReduction, reductionWork);
  };
  const ReductionSpec sum{1, ReduceOp::kSum, false, kSumAvg};
  const ReductionSpec mean{1, ReduceOp::kAvg, true, kSumAvg};
  const ReductionSpec amax{1, ReduceOp::kMax, false, {ReduceOp::kMax}};
  const ReductionSpec amin{1, ReduceOp::kMin, false, {ReduceOp::kMin}};
  const ReductionSpec none{1, std::nullopt, false, {}};
  auto all = [](ReductionSpec s) {
    s.dims_arg = -1;
    return s;
  };
  add("aten::amax", amax);
  add("aten::amin", amin);
  add("aten::logsumexp", none);
  add("aten::max", all(amax));  // max(self): the full reduction
  add("aten::max.dim", none);   // (values, indices): indices are global positions
  add("aten::mean", all(mean));
  add("aten::mean.dim", mean);
  add("aten::min", all(amin));
  add("aten::min.dim", none);
  add("aten::std", all(none));
  add("aten::std.correction", none);
  add("aten::std.dim", none);
  add("aten::sum", all(sum));
  add("aten::sum.dim_IntList", sum);
  add("aten::var", all(none));
  add("aten::var.correction", none);
  add("aten::var.dim", none);
  // linalg_vector_norm(self, ord, dim, keepdim) and norm.ScalarOpt_dim(self, p, dim, keepdim):
  // the dims after `ord`; a norm of pieces does not combine by a reduce op (F.normalize in
  // Swin V2's cosine attention).
  const ReductionSpec norm{2, std::nullopt, false, {}};
  add("aten::linalg_vector_norm", norm);
  add("aten::norm.ScalarOpt_dim", norm);

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  const std::vector<OpSample> dims = {
      {"", {S::f32({5, 6}), S::of(std::vector<int64_t>{1}), S::of(false)}},
      {"", {S::f32({2, 5, 7}), S::of(std::vector<int64_t>{-1}), S::of(true)}},
      {"", {S::f32({2, 5, 7}), S::of(std::vector<int64_t>{0, 2}), S::of(false)}},
  };
  samples(
      {"aten::amax", "aten::amin", "aten::logsumexp", "aten::mean.dim", "aten::sum.dim_IntList"},
      dims);
  samples({"aten::max", "aten::min", "aten::mean", "aten::sum", "aten::std", "aten::var"},
          {{"", {S::f32({5, 6})}}, {"", {S::f32({2, 5, 7})}}});
  samples({"aten::max.dim", "aten::min.dim"}, {{"", {S::f32({5, 6}), S::of(1), S::of(false)}},
                                               {"", {S::f32({2, 5, 7}), S::of(-1), S::of(true)}},
                                               {"", {S::f32({5, 6}), S::of(0), S::of(false)}}});
  samples(
      {"aten::std.dim", "aten::var.dim"},
      {{"", {S::f32({5, 6}), S::of(std::vector<int64_t>{1}), S::of(true), S::of(false)}},
       {"", {S::f32({2, 5, 7}), S::of(std::vector<int64_t>{0, -1}), S::of(false), S::of(true)}}});
  samples({"aten::linalg_vector_norm", "aten::norm.ScalarOpt_dim"},
          {{"", {S::f32({5, 6}), S::of(2.0), S::of(std::vector<int64_t>{1}), S::of(false)}},
           {"", {S::f32({2, 5, 7}), S::of(2.0), S::of(std::vector<int64_t>{-1}), S::of(true)}},
           {"", {S::f32({2, 5, 7}), S::of(1.0), S::of(std::vector<int64_t>{0, 2})}}});
  samples({"aten::std.correction", "aten::var.correction"},
          {{"", {S::f32({5, 6}), S::of(std::vector<int64_t>{1})}},
           {"", {S::f32({2, 5, 7}), S::of(std::vector<int64_t>{-1}), S::of(0), S::of(true)}}});
}

}  // namespace apc::strategy
