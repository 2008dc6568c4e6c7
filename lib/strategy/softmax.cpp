//===- lib/strategy/softmax.cpp - softmax and log_softmax -----------------===//
//
// Rules of softmax-like ops: every dim except the softmax dim can be sharded (each rank normalizes
// whole rows); the softmax dim must be R. softmax is not linear: no Partial.
//
//===----------------------------------------------------------------------===//
#include <algorithm>

#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

/// softmax.int(self, dim, dtype?), _softmax(self, dim, half_to_float) and the log_ variants.
std::vector<DimStrategy> softmaxRule(const RuleContext& c) {
  int64_t r = commonRank(c);
  auto dim = c.intArg(1);
  if (r < 0 || !dim) return {};
  auto d = normDim(*dim, std::max<int64_t>(r, 1));
  if (!d) return {};
  return uniformStrategies(c, dimsExcept(r, {*d}), kNoPartial);
}

}  // namespace

void registerSoftmaxRules(Registry& r) {
  for (const char* op :
       {"aten::_log_softmax", "aten::_softmax", "aten::log_softmax", "aten::softmax"})
    r.add(op, softmaxRule, cost::OpFamily::kSoftmax);

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  samples({"aten::softmax", "aten::log_softmax"}, {{"int", {S::f32({5, 6}), S::of(1)}},
                                                   {"int", {S::f32({2, 5, 7}), S::of(-1)}},
                                                   {"int", {S::f32({2, 5, 7}), S::of(0)}}});
  samples({"aten::_softmax", "aten::_log_softmax"},
          {{"", {S::f32({5, 6}), S::of(1), S::of(false)}},
           {"", {S::f32({2, 5, 7}), S::of(-1), S::of(false)}}});
}

}  // namespace apc::strategy
