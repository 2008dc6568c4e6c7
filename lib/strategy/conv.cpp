//===- lib/strategy/conv.cpp - Convolution and pooling ---------------------===//
//
// Convolutions (_convolution, convolution, conv1d/2d/3d) with input [N, Cin, *], weight
// [Cout, Cin/groups, k...] (transposed: [Cin, Cout/groups, k...]) and bias [Cout]?:
//   batch           input S(0), weight R, bias R           -> out S(0)
//   output channels input R, weight S(0) (transposed S(1)), bias S(0) -> out S(1)
//   input channels  input S(1), weight S(1) (transposed S(0)), bias P -> out P(sum): each rank
//                   convolves its channels; as for linear, the bias must be Partial so that it is
//                   added once (see lib/strategy/matrix.cpp)
//   input P, weight R, bias P -> out P (a convolution is linear in its input); and all-R.
// The channel strategies need groups == 1 (with groups, a channel slice would need a different
// groups argument and grouped channel ranges); unbatched inputs (rank of the weight minus one)
// get only all-R and Partial.
//
// Pooling (max_pool1d/2d/3d[_with_indices], avg_pool1d/2d/3d, adaptive_avg/max_pool1d/2d/3d):
// the batch and channel dims (all but the last 1, 2 or 3 spatial dims) are free, spatial dims R.
// Average pooling is linear (P(sum) passes); max pooling is not. The indices of max pooling are
// positions within each (batch, channel) plane, so they stay correct under those shards.
//
// Upsampling (upsample_bilinear2d, upsample_nearest2d, their .vec overloads) on [N, C, H, W]:
// each output plane is interpolated from its own input plane, so N and C are free (output S on
// the same dim; output_size and the scales are spatial and need no local rewrite) and H, W stay R.
// Interpolation is linear: P(sum) passes through.
//
//===----------------------------------------------------------------------===//
#include <string>

#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

struct ConvArgs {
  size_t transposed_arg = 0;  // 0: never transposed
  size_t groups_arg = 0;
};

std::vector<DimStrategy> convRule(const RuleContext& c, ConvArgs args) {
  int64_t xr = c.inputRank(0), wr = c.inputRank(1);
  if (xr < 2 || wr < 3 || c.outputRank(0) != xr) return {};
  bool transposed = false;
  if (args.transposed_arg) {
    auto t = c.boolArg(args.transposed_arg);
    if (!t) return {};
    transposed = *t;
  }
  auto groups = c.intArg(args.groups_arg);
  bool has_bias = c.isTensorInput(2);
  auto make = [&](Placement x, Placement w, Placement b, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = x;
    s.inputs[1] = w;
    if (has_bias) s.inputs[2] = b;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R(), R(), R()));
  bool batched = xr == wr;
  if (batched) {
    res.push_back(make(S(0), R(), R(), S(0)));
    if (groups && *groups == 1) {
      int64_t w_out = transposed ? 1 : 0, w_in = transposed ? 0 : 1;
      res.push_back(make(R(), S(w_out), S(0), S(1)));
      res.push_back(make(S(1), S(w_in), P(), P()));
    }
  }
  res.push_back(make(P(), R(), P(), P()));
  return res;
}

Rule convRuleWith(ConvArgs args) {
  return [args](const RuleContext& c) { return convRule(c, args); };
}

/// 2 * (output elements, or input elements when transposed) * prod(local weight dims 1..).
Work convWork(const RuleContext& c, const LocalShapes& l, bool transposed) {
  Work w = defaultWork(c, l);
  if (l.inputs.size() < 2 || l.inputs[0].empty() || l.inputs[1].empty() || l.outputs.empty() ||
      l.outputs[0].empty())
    return w;
  const auto& weight = l.inputs[1][0];
  double per = 1;
  for (size_t d = 1; d < weight.size(); ++d) per *= static_cast<double>(weight[d]);
  w.flops = 2 * numel(transposed ? l.inputs[0][0] : l.outputs[0][0]) * per;
  return w;
}

WorkFn convWorkWith(ConvArgs args) {
  return [args](const RuleContext& c, const LocalShapes& l) {
    bool transposed = args.transposed_arg && c.boolArg(args.transposed_arg).value_or(false);
    return convWork(c, l, transposed);
  };
}

/// Pooling over the last `spatial` dims.
Rule poolRule(int64_t spatial, const std::vector<ReduceOp>& partials) {
  return [spatial, partials](const RuleContext& c) {
    int64_t r = commonRank(c);
    if (r <= spatial) return std::vector<DimStrategy>{};
    return uniformStrategies(c,
                             dimsExcept(r,
                                        [&] {
                                          std::vector<int64_t> s;
                                          for (int64_t d = r - spatial; d < r; ++d) s.push_back(d);
                                          return s;
                                        }()),
                             partials);
  };
}

/// upsample_*2d(input [N, C, H, W], ...) -> [N, C, H', W'].
std::vector<DimStrategy> upsampleRule(const RuleContext& c) {
  if (c.inputRank(0) != 4 || c.outputRank(0) != 4 || c.numOutputs() != 1) return {};
  return uniformStrategies(c, {0, 1}, kSumOnly);
}

}  // namespace

void registerConvRules(Registry& r) {
  using cost::OpFamily;
  const ConvArgs full{6, 8};   // _convolution / convolution(input, weight, bias, stride, padding,
                               // dilation, transposed, output_padding, groups, ...)
  const ConvArgs plain{0, 6};  // convNd(input, weight, bias, stride, padding, dilation, groups)
  r.add("aten::_convolution", convRuleWith(full), OpFamily::kConvolution, convWorkWith(full));
  r.add("aten::convolution", convRuleWith(full), OpFamily::kConvolution, convWorkWith(full));
  for (const char* op : {"aten::conv1d", "aten::conv2d", "aten::conv3d"})
    r.add(op, convRuleWith(plain), OpFamily::kConvolution, convWorkWith(plain));

  for (int64_t k = 1; k <= 3; ++k) {
    std::string n = std::to_string(k) + "d";
    r.add("aten::adaptive_avg_pool" + n, poolRule(k, kSumOnly), OpFamily::kPointwise);
    r.add("aten::adaptive_max_pool" + n, poolRule(k, kNoPartial), OpFamily::kPointwise);
    r.add("aten::avg_pool" + n, poolRule(k, kSumOnly), OpFamily::kPointwise);
    r.add("aten::max_pool" + n, poolRule(k, kNoPartial), OpFamily::kPointwise);
    r.add("aten::max_pool" + n + "_with_indices", poolRule(k, kNoPartial), OpFamily::kPointwise);
  }
  r.add("aten::upsample_bilinear2d", upsampleRule, OpFamily::kPointwise);
  r.add("aten::upsample_nearest2d", upsampleRule, OpFamily::kPointwise);

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  const std::vector<int64_t> one2{1, 1}, zero2{0, 0};
  samples({"aten::conv1d"}, {{"", {S::f32({2, 4, 9}), S::f32({6, 4, 3}), S::f32({6})}}});
  samples(
      {"aten::conv2d"},
      {{"", {S::f32({2, 4, 7, 7}), S::f32({6, 4, 3, 3}), S::f32({6}), S::of(one2), S::of(one2)}},
       {"",
        {S::f32({2, 4, 6, 6}), S::f32({6, 2, 3, 3}), S::none(), S::of(std::vector<int64_t>{2, 2}),
         S::of(zero2), S::of(one2), S::of(2)}}});
  samples({"aten::conv3d"},
          {{"", {S::f32({2, 2, 4, 4, 4}), S::f32({3, 2, 2, 2, 2}), S::f32({3})}}});
  samples({"aten::convolution"},
          {{"",
            {S::f32({2, 4, 7, 7}), S::f32({6, 4, 3, 3}), S::f32({6}), S::of(one2), S::of(one2),
             S::of(one2), S::of(false), S::of(zero2), S::of(1)}}});
  samples({"aten::_convolution"},
          {{"",
            {S::f32({2, 4, 7, 7}), S::f32({6, 4, 3, 3}), S::f32({6}), S::of(one2), S::of(one2),
             S::of(one2), S::of(false), S::of(zero2), S::of(1), S::of(false), S::of(false),
             S::of(true), S::of(true)}}});
  samples({"aten::avg_pool1d", "aten::max_pool1d", "aten::max_pool1d_with_indices"},
          {{"", {S::f32({2, 3, 8}), S::of(std::vector<int64_t>{2})}}});
  samples({"aten::avg_pool2d", "aten::max_pool2d", "aten::max_pool2d_with_indices"},
          {{"", {S::f32({2, 3, 8, 8}), S::of(std::vector<int64_t>{2, 2})}},
           {"",
            {S::f32({2, 3, 8, 8}), S::of(std::vector<int64_t>{3, 3}),
             S::of(std::vector<int64_t>{2, 2}), S::of(one2)}}});
  samples({"aten::avg_pool3d", "aten::max_pool3d", "aten::max_pool3d_with_indices"},
          {{"", {S::f32({2, 2, 4, 4, 4}), S::of(std::vector<int64_t>{2, 2, 2})}}});
  samples({"aten::adaptive_avg_pool1d", "aten::adaptive_max_pool1d"},
          {{"", {S::f32({2, 3, 8}), S::of(std::vector<int64_t>{4})}}});
  samples({"aten::adaptive_avg_pool2d", "aten::adaptive_max_pool2d"},
          {{"", {S::f32({2, 3, 8, 8}), S::of(std::vector<int64_t>{4, 4})}},
           {"", {S::f32({2, 3, 6, 6}), S::of(one2)}}});
  samples({"aten::adaptive_avg_pool3d", "aten::adaptive_max_pool3d"},
          {{"", {S::f32({2, 2, 4, 4, 4}), S::of(std::vector<int64_t>{2, 2, 2})}}});
  samples({"aten::upsample_nearest2d"},
          {{"", {S::f32({2, 3, 4, 4}), S::of(std::vector<int64_t>{8, 8})}}});
  samples({"aten::upsample_bilinear2d"},
          {{"", {S::f32({2, 3, 4, 4}), S::of(std::vector<int64_t>{8, 8}), S::of(false)}}});
}

}  // namespace apc::strategy
