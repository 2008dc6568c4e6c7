//===- lib/strategy/normalization.cpp - Normalization layers --------------===//
//
// Rules of normalization layers:
//   layer_norm, native_layer_norm, rms_norm  the normalized (last k) dims must be R; every
//       leading dim can be sharded on the input and all outputs (native_layer_norm's mean and
//       rstd keep the leading dims); weight and bias R.
//   group_norm  statistics span channels and spatial dims: only the batch dim 0 is free.
//   batch_norm  per-channel statistics: the channel dim 1 can be sharded with weight, bias,
//       running_mean and running_var S(0) (each rank normalizes its channels; in training each
//       updates its slice of the running stats). In eval (training == False, a constant) the
//       batch and spatial dims are free too, with the stats R; in training they are not, as the
//       batch statistics would become per-shard statistics.
// Normalization is not linear: no Partial.
//
//===----------------------------------------------------------------------===//
#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

/// Input 0 and every tensor output S(d) (or R); the other tensor inputs `others`.
DimStrategy normStrategy(const RuleContext& c, Placement data, Placement others) {
  DimStrategy s = emptyDim(c);
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.isTensorInput(i)) s.inputs[i] = i == 0 ? data : others;
  for (size_t i = 0; i < c.numOutputs(); ++i)
    if (c.isTensorOutput(i)) s.outputs[i] = data;
  return s;
}

bool outputsShareRank(const RuleContext& c, int64_t rank) {
  for (size_t i = 0; i < c.numOutputs(); ++i)
    if (c.isTensorOutput(i) && c.outputRank(i) != rank) return false;
  return true;
}

/// layer_norm(input, normalized_shape, weight?, bias?, ...), rms_norm(input, normalized_shape,
/// ...).
std::vector<DimStrategy> lastDimsNormRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  auto normalized = c.intListArg(1);
  if (r < 0 || !normalized || static_cast<int64_t>(normalized->size()) > r) return {};
  if (!outputsShareRank(c, r)) return {};
  int64_t lead = r - static_cast<int64_t>(normalized->size());
  std::vector<DimStrategy> res;
  res.push_back(normStrategy(c, R(), R()));
  for (int64_t d = 0; d < lead; ++d) res.push_back(normStrategy(c, S(d), R()));
  return res;
}

/// group_norm(input [N, C, *], num_groups, weight?, bias?, ...).
std::vector<DimStrategy> groupNormRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  if (r < 2 || !outputsShareRank(c, r)) return {};
  return {normStrategy(c, R(), R()), normStrategy(c, S(0), R())};
}

/// batch_norm(input [N, C, *], weight?, bias?, running_mean?, running_var?, training, ...).
std::vector<DimStrategy> batchNormRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  if (r < 2 || !outputsShareRank(c, r)) return {};
  for (size_t i = 1; i < 5 && i < c.numInputs(); ++i)
    if (c.isTensorInput(i) && c.inputRank(i) != 1) return {};
  std::vector<DimStrategy> res;
  res.push_back(normStrategy(c, R(), R()));
  std::optional<bool> training = c.boolArg(5);
  bool eval = training.has_value() && !*training;
  for (int64_t d = 0; d < r; ++d) {
    if (d == 1)
      res.push_back(normStrategy(c, S(1), S(0)));
    else if (eval)
      res.push_back(normStrategy(c, S(d), R()));
  }
  return res;
}

}  // namespace

void registerNormalizationRules(Registry& r) {
  using cost::OpFamily;
  r.add("aten::batch_norm", batchNormRule, OpFamily::kNormalization);
  r.add("aten::group_norm", groupNormRule, OpFamily::kNormalization);
  r.add("aten::layer_norm", lastDimsNormRule, OpFamily::kNormalization);
  r.add("aten::native_layer_norm", lastDimsNormRule, OpFamily::kNormalization);
  r.add("aten::rms_norm", lastDimsNormRule, OpFamily::kNormalization);
}

}  // namespace apc::strategy
