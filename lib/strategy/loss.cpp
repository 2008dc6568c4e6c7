//===- lib/strategy/loss.cpp - Cross entropy and NLL losses ---------------===//
//
// cross_entropy_loss(self, target, weight?, reduction, ignore_index, label_smoothing) and
// nll_loss / nll_loss_nd / nll_loss2d(self, target, weight?, reduction, ignore_index). self is
// [N, C, d1...] (or [C]); target holds class indices [N, d1...] or, for cross entropy, class
// probabilities shaped like self. Every dim but the class dim C is a sample dim that self and
// target share. Sharding a sample dim gives each rank the loss of its samples:
//   reduction 'none' (0)  out S(the dim's position in the output)
//   reduction 'sum'  (2)  out P(sum), uneven allowed
//   reduction 'mean' (1)  out P(avg), only when the dim divides evenly (must_divide) and without
//                         class weights (a weighted mean divides by the per-shard weight sums);
//                         for class-index targets also only under RuleOptions::loss_mean_partial,
//                         which assumes every shard counts the same number of targets (the mean is
//                         over targets != ignore_index; exact when none is ignored)
// Class weights are R. The class dim is never sharded: a vocab-parallel cross entropy needs its
// own max/sum-exp collectives, which a single-op rule cannot express.
//
//===----------------------------------------------------------------------===//
#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

std::vector<DimStrategy> lossRule(const RuleContext& c) {
  int64_t rs = c.inputRank(0), rt = c.inputRank(1);
  auto reduction = c.intArg(3);
  if (rs < 1 || rt < 0 || !reduction || *reduction < 0 || *reduction > 2) return {};
  bool probabilities = rt == rs;
  if (!probabilities && rt != rs - 1) return {};
  int64_t class_dim = rs == 1 ? 0 : 1;
  bool weighted = c.isTensorInput(2);
  int64_t out_rank = c.outputRank(0);
  if (*reduction == 0 ? out_rank != rs - 1 : out_rank != 0) return {};
  auto make = [&](Placement self, Placement target, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.inputs[1] = target;
    if (weighted) s.inputs[2] = R();
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R(), R()));
  for (int64_t d = 0; d < rs; ++d) {
    if (d == class_dim) continue;
    int64_t td = probabilities ? d : (d == 0 ? 0 : d - 1);
    int64_t od = d == 0 ? 0 : d - 1;
    if (*reduction == 0) {
      res.push_back(make(S(d), S(td), S(od)));
    } else if (*reduction == 2) {
      res.push_back(make(S(d), S(td), P()));
    } else if (!weighted && (probabilities || c.opts().loss_mean_partial)) {
      DimStrategy s = make(S(d), S(td), P(ReduceOp::kAvg));
      s.must_divide.push_back({false, 0, static_cast<int>(d)});
      res.push_back(std::move(s));
    }
  }
  return res;
}

}  // namespace

void registerLossRules(Registry& r) {
  for (const char* op :
       {"aten::cross_entropy_loss", "aten::nll_loss", "aten::nll_loss2d", "aten::nll_loss_nd"})
    r.add(op, lossRule, cost::OpFamily::kLoss);

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  samples({"aten::cross_entropy_loss"},
          {{"", {S::f32({6, 5}), S::i64({6})}},
           {"", {S::f32({6, 5}), S::i64({6}), S::none(), S::of(0)}},  // reduction none
           {"", {S::f32({6, 5}), S::i64({6}), S::none(), S::of(2)}},  // sum
           {"", {S::f32({2, 5, 4}), S::i64({2, 4})}},
           {"", {S::f32({6, 5}), S::i64({6}), S::none(), S::of(1), S::of(-100), S::of(0.1)}}});
  samples({"aten::nll_loss", "aten::nll_loss_nd"},
          {{"", {S::f32({6, 5}), S::i64({6})}},
           {"", {S::f32({6, 5}), S::i64({6}), S::f32({5}), S::of(2)}},
           {"", {S::f32({6, 5}), S::i64({6}), S::none(), S::of(0)}}});
  samples({"aten::nll_loss2d"}, {{"", {S::f32({2, 5, 3, 4}), S::i64({2, 3, 4})}}});
}

}  // namespace apc::strategy
