//===- lib/strategy/pointwise.cpp - Elementwise ops with broadcasting -----===//
//
// Rules of elementwise ops. Sharding: for each output dim d, the output is S(d) and every tensor
// input is S(its aligned dim) when that dim exists and has the output's size, R when it is
// broadcast there (missing or of size 1); plus all-R. Partial flows only through ops linear in
// the partial input, each op naming its linearity:
//   additive        add/sub/rsub: P(op) on both tensor summands -> P(op) (op in sum, avg); and
//                   P(avg) on one summand with the other R or a scalar -> P(avg) (adding the same
//                   value to every term of an average adds it once; with sum it would add it p
//                   times, so P(sum) + R is not offered)
//   multiplicative  mul: one tensor P(op), the other tensors R (or a scalar) -> P(op)
//   numerator       div: the dividend P(op), the divisor R or a scalar -> P(op)
//   unary           neg, positive, contiguous, clone, detach, dropout in eval: P(op) -> P(op)
//   cast            to / type_as / _to_copy: P(op) -> P(op) only between floating dtypes (or the
//                   same dtype): a cast of each summand to an integer type does not sum to the
//                   cast of the sum
// Nonlinear ops (relu, gelu, silu, rsqrt, pow, exp, comparisons, masked_fill, where, ...) never
// take Partial.
//
// type_as(self, other) and to(self, other) read only the dtype of `other`: it gets the placement
// of self on each mesh dim where that placement fits other (same size in that dim), R otherwise,
// so that a matching producer never has to move it.
//
// dropout in training draws a random mask: the rules keep every shard and R strategy. A sharded
// mask is right in distribution when pieces draw independently, and a replicated one only when
// every replica draws the same: lowering records each rank's piece of a random node's output
// (proto::Program::random_pieces) and the runtime seeds the node's draw from it (as Megatron's
// RNG tracker forks a tensor-parallel stream). The pieces are not those of one global mask
// (DTensor's offset-based tracker), so a sharded run equals the single device in distribution
// only. In eval dropout is the identity.
//
//===----------------------------------------------------------------------===//
#include <algorithm>

#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

enum class Linearity { kNone, kUnary, kAdditive, kMultiplicative, kNumerator };

/// Sharding strategies of a broadcasting elementwise op with one tensor output (all-R first).
/// Empty when the inputs do not broadcast to the output.
std::vector<DimStrategy> broadcastShards(const RuleContext& c) {
  size_t num_outputs = 0;
  for (size_t i = 0; i < c.numOutputs(); ++i) num_outputs += c.isTensorOutput(i) ? 1 : 0;
  if (num_outputs != 1 || !c.isTensorOutput(0) || c.output(0).type != ir::ValueType::kTensor)
    return {};
  std::vector<int64_t> out = c.outputSizes(0);
  int64_t r = static_cast<int64_t>(out.size());
  std::vector<size_t> tensors = tensorInputs(c);
  for (size_t i : tensors) {
    if (c.input(i).type != ir::ValueType::kTensor) return {};
    std::vector<int64_t> in = c.inputSizes(i);
    int64_t ri = static_cast<int64_t>(in.size());
    if (ri > r) return {};
    for (int64_t k = 0; k < ri; ++k) {
      int64_t o = out[static_cast<size_t>(k + r - ri)];
      if (in[static_cast<size_t>(k)] != o && in[static_cast<size_t>(k)] != 1) return {};
    }
  }
  std::vector<DimStrategy> res;
  res.push_back(replicateAll(c));
  for (int64_t d = 0; d < r; ++d) {
    DimStrategy s = emptyDim(c);
    s.outputs[0] = S(d);
    for (size_t i : tensors) {
      std::vector<int64_t> in = c.inputSizes(i);
      int64_t aligned = d - (r - static_cast<int64_t>(in.size()));
      bool same = aligned >= 0 && in[static_cast<size_t>(aligned)] == out[static_cast<size_t>(d)];
      s.inputs[i] = same ? S(aligned) : R();
    }
    res.push_back(std::move(s));
  }
  return res;
}

/// A DimStrategy with output 0 = `out`, tensor inputs in `partial_inputs` = P(op), others R.
DimStrategy partialDim(const RuleContext& c, ReduceOp op,
                       const std::vector<size_t>& partial_inputs) {
  DimStrategy s = emptyDim(c);
  s.outputs[0] = P(op);
  for (size_t i : tensorInputs(c)) {
    bool p = std::find(partial_inputs.begin(), partial_inputs.end(), i) != partial_inputs.end();
    s.inputs[i] = p ? P(op) : R();
  }
  return s;
}

std::vector<DimStrategy> pointwise(const RuleContext& c, Linearity lin) {
  std::vector<DimStrategy> res = broadcastShards(c);
  if (res.empty()) return res;
  std::vector<size_t> tensors = tensorInputs(c);
  auto isTensor = [&](size_t i) { return c.isTensorInput(i); };
  switch (lin) {
    case Linearity::kNone:
      break;
    case Linearity::kUnary:
      if (tensors.size() == 1)
        for (ReduceOp op : kSumAvg) res.push_back(partialDim(c, op, tensors));
      break;
    case Linearity::kAdditive: {
      // Summands are inputs 0 and 1 (alpha scales input 1).
      if (isTensor(0) && isTensor(1))
        for (ReduceOp op : kSumAvg) res.push_back(partialDim(c, op, {0, 1}));
      if (isTensor(0)) res.push_back(partialDim(c, ReduceOp::kAvg, {0}));
      if (isTensor(1)) res.push_back(partialDim(c, ReduceOp::kAvg, {1}));
      break;
    }
    case Linearity::kMultiplicative:
      for (size_t i : tensors)
        for (ReduceOp op : kSumAvg) res.push_back(partialDim(c, op, {i}));
      break;
    case Linearity::kNumerator:
      if (isTensor(0))
        for (ReduceOp op : kSumAvg) res.push_back(partialDim(c, op, {0}));
      break;
  }
  return res;
}

Rule pointwiseRule(Linearity lin) {
  return [lin](const RuleContext& c) { return pointwise(c, lin); };
}

bool castKeepsPartial(const RuleContext& c) {
  if (!c.isTensorInput(0) || !c.isTensorOutput(0)) return false;
  ir::DType in = c.input(0).tensor->dtype, out = c.output(0).tensor->dtype;
  return in == out || (ir::isFloating(in) && ir::isFloating(out));
}

/// to / type_as / _to_copy: input 0 is the data, any other tensor input only gives a dtype.
std::vector<DimStrategy> castRule(const RuleContext& c) {
  if (!c.isTensorInput(0) || !c.isTensorOutput(0) || c.input(0).type != ir::ValueType::kTensor)
    return {};
  std::vector<int64_t> self = c.inputSizes(0);
  if (self != c.outputSizes(0)) return {};
  auto follow = [&](DimStrategy s, Placement p) {
    s.inputs[0] = p;
    s.outputs[0] = p;
    for (size_t i = 1; i < c.numInputs(); ++i) {
      if (!c.isTensorInput(i)) continue;
      std::vector<int64_t> other = c.inputSizes(i);
      bool fits = p.isShard() && p.dim() < static_cast<int>(other.size()) &&
                  other[static_cast<size_t>(p.dim())] == self[static_cast<size_t>(p.dim())];
      s.inputs[i] = fits ? p : R();
    }
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(replicateAll(c));
  for (int64_t d = 0; d < static_cast<int64_t>(self.size()); ++d)
    res.push_back(follow(emptyDim(c), S(d)));
  if (castKeepsPartial(c))
    for (ReduceOp op : kSumAvg) res.push_back(follow(emptyDim(c), P(op)));
  return res;
}

/// dropout(input, p, train) and its variants: the identity in eval (Partial passes), a random
/// mask in training (no Partial; see the file comment).
std::vector<DimStrategy> dropoutRule(const RuleContext& c) {
  std::optional<bool> train = c.boolArg(2);
  bool eval = train.has_value() && !*train;
  // native_dropout also returns the mask, which is not a summand of anything.
  return identityStrategies(c, eval && c.numOutputs() == 1 ? kSumAvg : kNoPartial);
}

/// dropout(input, p, train) and its variants draw a random mask unless p == 0 or train is the
/// constant false.
bool dropoutIsRandom(const RuleContext& c) {
  std::optional<double> p = c.doubleArg(1);
  std::optional<bool> train = c.boolArg(2);
  return !(p && *p == 0.0) && !(train && !*train);
}

}  // namespace

void registerPointwiseRules(Registry& r) {
  using cost::OpFamily;
  auto add = [&](std::initializer_list<const char*> ops, Rule rule) {
    for (const char* op : ops) r.add(op, rule, OpFamily::kPointwise);
  };
  // Nonlinear (sorted).
  add({"aten::__and__",
       "aten::__invert__",
       "aten::__or__",
       "aten::__xor__",
       "aten::abs",
       "aten::acos",
       "aten::asin",
       "aten::atan",
       "aten::atan2",
       "aten::bitwise_and",
       "aten::bitwise_not",
       "aten::bitwise_or",
       "aten::bitwise_xor",
       "aten::ceil",
       "aten::clamp",
       "aten::clamp_max",
       "aten::clamp_min",
       "aten::cos",
       "aten::cosh",
       "aten::div.Scalar_mode",
       "aten::div.Tensor_mode",
       "aten::elu",
       "aten::eq",
       "aten::erf",
       "aten::erfc",
       "aten::exp",
       "aten::exp2",
       "aten::expm1",
       "aten::floor",
       "aten::floor_divide",
       "aten::fmax",
       "aten::fmin",
       "aten::fmod",
       "aten::frac",
       "aten::ge",
       "aten::gelu",
       "aten::gt",
       "aten::hardsigmoid",
       "aten::hardswish",
       "aten::hardtanh",
       "aten::hypot",
       "aten::isinf",
       "aten::isnan",
       "aten::le",
       "aten::leaky_relu",
       "aten::log",
       "aten::log10",
       "aten::log1p",
       "aten::log2",
       "aten::logical_and",
       "aten::logical_not",
       "aten::logical_or",
       "aten::logical_xor",
       "aten::logit",
       "aten::lt",
       "aten::masked_fill",
       "aten::max.other",
       "aten::maximum",
       "aten::min.other",
       "aten::minimum",
       "aten::mish",
       "aten::nan_to_num",
       "aten::ne",
       "aten::pow",
       "aten::reciprocal",
       "aten::relu",
       "aten::relu6",
       "aten::remainder",
       "aten::round",
       "aten::rsqrt",
       "aten::selu",
       "aten::sgn",
       "aten::sigmoid",
       "aten::sign",
       "aten::silu",
       "aten::sin",
       "aten::sinh",
       "aten::softplus",
       "aten::sqrt",
       "aten::square",
       "aten::tan",
       "aten::tanh",
       "aten::threshold",
       "aten::trunc",
       "aten::where"},
      pointwiseRule(Linearity::kNone));
  // Linear.
  add({"aten::add", "aten::rsub", "aten::sub"}, pointwiseRule(Linearity::kAdditive));
  add({"aten::mul"}, pointwiseRule(Linearity::kMultiplicative));
  add({"aten::div.Scalar", "aten::div.Tensor", "aten::true_divide"},
      pointwiseRule(Linearity::kNumerator));
  add({"aten::neg", "aten::positive"}, pointwiseRule(Linearity::kUnary));
  add({"aten::alias", "aten::clone", "aten::contiguous", "aten::detach", "aten::lift_fresh",
       "aten::lift_fresh_copy"},
      [](const RuleContext& c) { return identityStrategies(c, kSumAvg); });
  add({"aten::_to_copy", "aten::to", "aten::type_as"}, castRule);
  // copy(self, src): self's shape and dtype holding src broadcast (what functionalizing
  // `t[...] = v` records); self's values are not read. Linear in src: a Partial src gives a
  // Partial result (self whole or Partial alike) where the cast keeps sums.
  add({"aten::copy"}, [](const RuleContext& c) {
    std::vector<DimStrategy> res = broadcastShards(c);
    if (res.empty() || !c.isTensorInput(1)) return res;
    const ir::DType to = c.input(0).tensor->dtype, from = c.input(1).tensor->dtype;
    if (to != from && !(ir::isFloating(to) && ir::isFloating(from))) return res;
    for (ReduceOp op : kSumAvg) {
      res.push_back(partialDim(c, op, {1}));
      res.push_back(partialDim(c, op, {0, 1}));
    }
    return res;
  });
  // Casts and aliases a Megatron weight may be read through (the baseline's roles see the
  // parameter behind them).
  for (const char* op :
       {"aten::clone", "aten::contiguous", "aten::detach", "aten::to", "aten::type_as"})
    r.entry(op)->tp.kind = TpUse::Kind::kKeepsDims;
  for (const char* op : {"aten::alpha_dropout", "aten::dropout", "aten::feature_alpha_dropout",
                         "aten::feature_dropout", "aten::native_dropout"}) {
    OpInfo info;
    info.rule = dropoutRule;
    info.family = OpFamily::kPointwise;
    info.random = dropoutIsRandom;
    r.add(op, std::move(info));
  }
  // Sampling ops: random, without a sharding rule (the Replicate-only fallback; a sharded sample
  // would differ from the single-device one anyway). Their in-place forms (bernoulli_, uniform_,
  // ...) follow from registerInPlaceVariants.
  for (const char* op :
       {"aten::bernoulli", "aten::exponential", "aten::geometric", "aten::multinomial",
        "aten::normal", "aten::rand", "aten::rand_like", "aten::randint", "aten::randint_like",
        "aten::randn", "aten::randn_like", "aten::randperm", "aten::rrelu", "aten::uniform"}) {
    OpInfo info;
    info.random = alwaysRandom;
    r.add(op, std::move(info));
  }
  // Backward over forward time from what each op's autograd formula runs, counted in tensor
  // passes (a read or write of one operand-sized tensor; the forward of a unary op is 2, of a
  // binary one 3). The family's 1.0 stands for a unary op's backward kernel reading the gradient
  // and one saved tensor (3 passes against 2 would be 1.5). Per-op times on an H200
  // (apc-train --profile-nodes, llama_small at batch 64) had mul, pow and rsqrt at 0.42-0.57 of
  // their measured time under the family's 1.0.
  const std::pair<const char*, double> backward[] = {
      {"aten::add", 0.0},                             // the gradient passes through (no kernel)
      {"aten::sub", 2.0 / 3},                         // -grad for the subtrahend
      {"aten::rsub", 2.0 / 3},   {"aten::mul", 2.0},  // grad * other, grad * self: 2 x 3 passes
      {"aten::div.Tensor", 3.0},                      // grad / other; -grad * self / other^2
      {"aten::neg", 1.0},                             // -grad
      {"aten::pow", 2.5},                             // self^(e-1) (2), * e * grad (3)
      {"aten::rsqrt", 3.5},                           // result^3 (2), * -0.5 (2), * grad (3)
      {"aten::sqrt", 2.5},                            // 2 * result (2), grad / it (3)
      {"aten::silu", 1.5},                            // silu_backward(grad, self): 3 passes
      {"aten::gelu", 1.5},                            // gelu_backward(grad, self)
      {"aten::relu", 1.5},                            // threshold_backward(grad, result)
      {"aten::sigmoid", 1.5},                         // sigmoid_backward(grad, result)
      {"aten::tanh", 1.5},                            // tanh_backward(grad, result)
  };
  for (const auto& [op, m] : backward) r.setBackwardMultiplier(op, m);
  // Kernels those formulas launch, each dispatched on its own (the family's is one).
  const std::pair<const char*, int> kernels[] = {
      {"aten::sub", 2},        {"aten::rsub", 2},   // the gradient passes through; -grad
      {"aten::mul", 2},                             // grad * other, grad * self
      {"aten::div.Tensor", 4},                      // grad / other; -grad, * self, / other^2
      {"aten::pow", 3},        {"aten::rsqrt", 3},  // pow, mul, mul
      {"aten::sqrt", 2},                            // 2 * result, grad / it
  };
  for (const auto& [op, k] : kernels) r.entry(op)->backward_kernels = k;
  // A cast to the dtype it already has returns its input: no kernel, no backward node.
  for (const char* op : {"aten::to", "aten::type_as"})
    r.entry(op)->work = [](const RuleContext& c, const LocalShapes& local) {
      const auto in = c.inputMetas(0), out = c.outputMetas(0);
      if (in.size() == 1 && out.size() == 1 && in[0]->dtype == out[0]->dtype) return Work{};
      return defaultWork(c, local);
    };

  // Sample invocations (OpInfo::samples): uneven pieces (5 over 2 and 3 ranks), broadcasting
  // (size-1 dims, missing leading dims, 0-dim operands), Scalar overloads.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  samples({"aten::abs",
           "aten::acos",
           "aten::asin",
           "aten::atan",
           "aten::ceil",
           "aten::cos",
           "aten::cosh",
           "aten::elu",
           "aten::erf",
           "aten::erfc",
           "aten::exp",
           "aten::exp2",
           "aten::expm1",
           "aten::floor",
           "aten::frac",
           "aten::gelu",
           "aten::hardsigmoid",
           "aten::hardswish",
           "aten::hardtanh",
           "aten::isinf",
           "aten::isnan",
           "aten::leaky_relu",
           "aten::log",
           "aten::log10",
           "aten::log1p",
           "aten::log2",
           "aten::logit",
           "aten::mish",
           "aten::nan_to_num",
           "aten::reciprocal",
           "aten::relu",
           "aten::relu6",
           "aten::round",
           "aten::rsqrt",
           "aten::selu",
           "aten::sgn",
           "aten::sigmoid",
           "aten::sign",
           "aten::silu",
           "aten::sin",
           "aten::sinh",
           "aten::softplus",
           "aten::sqrt",
           "aten::square",
           "aten::tan",
           "aten::tanh",
           "aten::trunc",
           "aten::neg",
           "aten::positive",
           "aten::alias",
           "aten::clone",
           "aten::contiguous",
           "aten::detach",
           "aten::lift_fresh",
           "aten::lift_fresh_copy"},
          {{"", {S::f32({5, 6})}}, {"", {S::f32({2, 3, 7})}}});
  samples({"aten::__invert__", "aten::bitwise_not", "aten::logical_not"},
          {{"", {S::boolean({5, 6})}}});
  const std::vector<OpSample> binary = {
      {"Tensor", {S::f32({5, 6}), S::f32({5, 6})}},
      {"Tensor", {S::f32({3, 1, 6}), S::f32({5, 6})}},
      {"Tensor", {S::f32({5, 6}), S::f32({})}},
  };
  samples({"aten::add", "aten::sub", "aten::rsub", "aten::mul", "aten::div.Tensor",
           "aten::true_divide", "aten::fmod", "aten::remainder", "aten::eq", "aten::ne", "aten::lt",
           "aten::le", "aten::gt", "aten::ge"},
          binary);
  samples({"aten::floor_divide", "aten::atan2", "aten::fmax", "aten::fmin", "aten::hypot",
           "aten::maximum", "aten::minimum", "aten::max.other", "aten::min.other"},
          {{"", {S::f32({5, 6}), S::f32({5, 6})}}, {"", {S::f32({3, 1, 6}), S::f32({5, 6})}}});
  samples({"aten::pow"}, {{"Tensor_Scalar", {S::f32({5, 6}), S::of(2.0)}},
                          {"Tensor_Tensor", {S::f32({5, 6}), S::f32({6})}}});
  samples({"aten::div.Scalar"}, {{"", {S::f32({5, 6}), S::of(2.5)}}});
  samples({"aten::div.Tensor_mode"}, {{"", {S::f32({5, 6}), S::f32({3, 1, 6}), S::of("floor")}}});
  samples({"aten::div.Scalar_mode"}, {{"", {S::f32({5, 6}), S::of(2.5), S::of("trunc")}}});
  const std::vector<OpSample> logical = {
      {"Tensor", {S::boolean({5, 6}), S::boolean({5, 6})}},
      {"Tensor", {S::boolean({3, 1, 6}), S::boolean({6})}},
  };
  samples({"aten::__and__", "aten::__or__", "aten::__xor__", "aten::bitwise_and",
           "aten::bitwise_or", "aten::bitwise_xor"},
          logical);
  samples({"aten::logical_and", "aten::logical_or", "aten::logical_xor"},
          {{"", {S::boolean({5, 6}), S::boolean({5, 6})}},
           {"", {S::boolean({3, 1, 6}), S::boolean({6})}}});
  samples({"aten::clamp"}, {{"", {S::f32({5, 6}), S::of(-0.5), S::of(0.5)}},
                            {"Tensor", {S::f32({5, 6}), S::f32({6}), S::none()}}});
  samples({"aten::clamp_min", "aten::clamp_max"}, {{"", {S::f32({5, 6}), S::of(0.25)}}});
  samples({"aten::threshold"}, {{"", {S::f32({5, 6}), S::of(0.1), S::of(-1.0)}}});
  samples({"aten::copy"}, {{"", {S::f32({5, 6}), S::f32({5, 6})}},
                           {"", {S::f32({5, 6}), S::f32({6}), S::of(false)}},
                           {"", {S::f32({5, 6}), S::f32({5, 1})}}});
  samples({"aten::where"}, {{"self", {S::boolean({5, 6}), S::f32({5, 6}), S::f32({5, 6})}},
                            {"self", {S::boolean({5, 1}), S::f32({3, 5, 6}), S::f32({6})}}});
  samples({"aten::masked_fill"}, {{"Scalar", {S::f32({5, 6}), S::boolean({5, 6}), S::of(-1.5)}},
                                  {"Scalar", {S::f32({3, 5, 6}), S::boolean({1, 6}), S::of(0.5)}}});
  samples({"aten::to"}, {{"dtype", {S::f32({5, 6}), S::of(4)}},    // to long
                         {"dtype", {S::i64({5, 6}), S::of(6)}}});  // to float
  samples({"aten::_to_copy"}, {{"", {S::f32({5, 6})}}});
  samples({"aten::type_as"}, {{"", {S::i64({5, 6}), S::f32({2})}}});
  samples({"aten::dropout", "aten::alpha_dropout", "aten::feature_dropout",
           "aten::feature_alpha_dropout"},
          {{"", {S::f32({5, 6, 3}), S::of(0.5), S::of(false)}}});
  samples({"aten::native_dropout"}, {{"", {S::f32({5, 6, 3}), S::of(0.5), S::of(false)}}});
}

}  // namespace apc::strategy
