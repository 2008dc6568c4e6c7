//===- lib/strategy/normalization.cpp - Normalization layers --------------===//
//
// Rules of normalization layers:
//   layer_norm, native_layer_norm, rms_norm  the normalized (last k) dims must be R; every
//       leading dim can be sharded on the input and all outputs (native_layer_norm's mean and
//       rstd keep the leading dims); weight and bias R.
//   group_norm  statistics span channels and spatial dims: the batch dim 0 is free, and with
//       num_groups a constant so are the spatial dims, each group's statistics all-reduced across
//       the mesh dims that cut them (its OpInfo::collective and collective_local below).
//   batch_norm  per-channel statistics: the channel dim 1 can be sharded with weight, bias,
//       running_mean and running_var S(0) (each rank normalizes its channels; in training each
//       updates its slice of the running stats). The batch and spatial dims are free too, with
//       the stats R: in eval (training == False, a constant) each rank normalizes its piece with
//       the running stats; in training (training == True, a constant) the batch statistics are
//       all-reduced across the mesh dims that cut them (SyncBatchNorm semantics, see
//       apc/strategy/sync_norm.h, which prices and defines it). With `training` not a constant
//       only the channel dim is free.
//   _native_batch_norm_legit_functional(input, weight?, bias?, running_mean, running_var,
//       training, momentum, eps) -> (out, save_mean, save_rstd, running_mean_out, running_var_out)
//   _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean, running_var,
//       momentum, eps) -> (out, save_mean, save_rstd)
//       the core-ATen forms (torch.export's run_decompositions) by the same rule: out as
//       batch_norm's output; the per-channel outputs S(0) with the channel dim ([0]-sized ones,
//       eval's empty save_mean/save_rstd, R) and R otherwise. no_training is eval: every dim free.
//       The functional form in training (training == True) is batch_norm in training: batch and
//       spatial dims free with the statistics synchronized (sync_norm.h), its per-channel outputs
//       (save_mean, save_rstd and the updated running stats, computed from the global statistics)
//       R.
// Normalization is not linear: no Partial.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/collectives.h"
#include "apc/ir/op_collective.h"
#include "apc/layout/layout.h"
#include "apc/strategy/rules.h"
#include "apc/strategy/sync_norm.h"
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
  std::vector<DimStrategy> res = {normStrategy(c, R(), R()), normStrategy(c, S(0), R())};
  // A spatial dim, with each group's statistics all-reduced (groupNormCollective), when
  // num_groups is a constant.
  if (c.intArg(1))
    for (int64_t d = 2; d < r; ++d) res.push_back(normStrategy(c, S(d), R()));
  return res;
}

/// How a batch-norm form says whether it trains.
enum class BatchNormMode {
  kTrainingArg,  // argument 5 `training`; batch dims free when it is a constant (synchronized
                 // statistics in training, sync_norm.h)
  kEval,         // always eval (_native_batch_norm_legit_no_training)
};

/// batch_norm(input [N, C, *], weight?, bias?, running_mean?, running_var?, training, ...) and the
/// core-ATen forms with the same first five inputs and per-channel outputs after the first.
std::vector<DimStrategy> batchNormRule(const RuleContext& c, BatchNormMode mode) {
  int64_t r = c.inputRank(0);
  if (r < 2 || c.numOutputs() < 1 || c.outputRank(0) != r) return {};
  for (size_t i = 1; i < 5 && i < c.numInputs(); ++i)
    if (c.isTensorInput(i) && c.inputRank(i) != 1) return {};
  int64_t channels = c.inputSizes(0)[1];
  // Outputs after the first: per-channel vectors ([C]) or eval's empty save_mean/save_rstd ([0]).
  std::vector<bool> per_channel(c.numOutputs(), false);
  for (size_t j = 1; j < c.numOutputs(); ++j) {
    if (!c.isTensorOutput(j)) continue;
    if (c.outputRank(j) != 1) return {};
    int64_t n = c.outputSizes(j)[0];
    if (n != channels && n != 0) return {};
    per_channel[j] = n == channels;
  }
  auto make = [&](Placement data, bool channel) {
    DimStrategy s = normStrategy(c, data, channel ? S(0) : R());
    for (size_t j = 1; j < c.numOutputs(); ++j)
      if (c.isTensorOutput(j)) s.outputs[j] = channel && per_channel[j] ? S(0) : R();
    return s;
  };
  bool batch_free = mode == BatchNormMode::kEval;
  if (mode == BatchNormMode::kTrainingArg) batch_free = c.boolArg(5).has_value();
  std::vector<DimStrategy> res;
  res.push_back(make(R(), false));
  for (int64_t d = 0; d < r; ++d) {
    if (d == 1)
      res.push_back(make(S(1), true));
    else if (batch_free)
      res.push_back(make(S(d), false));
  }
  return res;
}

}  // namespace

bool isTrainingBatchNorm(const ir::Graph& g, const ir::Node& n) {
  if ((n.op != "aten::batch_norm" && n.op != "aten::_native_batch_norm_legit_functional") ||
      n.inputs.size() < 6)
    return false;
  const auto& c = g.value(n.inputs[5]).constant;
  const bool* b = c ? std::get_if<bool>(&*c) : nullptr;
  return b && *b;
}

std::vector<size_t> syncNormMeshDims(const mesh::PlacementTuple& input) {
  std::vector<size_t> dims;
  for (size_t m = 0; m < input.size(); ++m)
    if (input[m].isShard() && !input[m].isShard(1)) dims.push_back(m);
  return dims;
}

double syncNormUs(const cost::CostModel& model, const mesh::DeviceMesh& mesh,
                  const std::vector<size_t>& dims, int64_t channels, int64_t elem_bytes,
                  bool backward) {
  double us = 0;
  const double bytes = static_cast<double>(channels * elem_bytes);
  for (size_t m : dims)
    us += (backward ? 4 : 2) *
          model.collectiveUs(cost::CollectiveKind::kAllReduce, m, mesh.size(m), bytes);
  return us;
}

namespace {

/// OpInfo::collective of batch_norm: the statistics' all-reduces of a training-mode batch_norm
/// whose input is cut along a non-channel dim (sync_norm.h), priced for `channels` statistics.
OpCollective syncNormCollective(const RuleContext& c,
                                const std::vector<std::optional<PlacementTuple>>& inputs,
                                const mesh::DeviceMesh& mesh, const cost::CostModel* model) {
  OpCollective out;
  if (!isTrainingBatchNorm(c.graph, c.node) || inputs.empty() || !inputs[0]) return out;
  const std::vector<const ir::TensorMeta*> x = c.inputMetas(0);
  if (x.empty() || x[0]->rank() < 2) return out;
  out.mesh_dims = syncNormMeshDims(*inputs[0]);
  if (out.mesh_dims.empty() || !model) return out;
  const int64_t channels = layout::maxLocalSizes(*x[0], *inputs[0], mesh).at(1);
  bool backward = false;  // the gradients' all-reduces too, when the output takes a gradient
  for (size_t i = 0; i < c.numOutputs(); ++i)
    for (const ir::TensorMeta* m : c.outputMetas(i)) backward = backward || m->requires_grad;
  out.us = syncNormUs(*model, mesh, out.mesh_dims, channels, ir::dtypeBytes(x[0]->dtype), backward);
  return out;
}

/// OpInfo::collective_local of batch_norm (and its functional core-ATen form): SyncBatchNorm's
/// forward on this rank's piece, the sums all-reduced (sync_norm.h). The element count travels
/// with the first sums (a dynamic batch may cut unevenly). Running stats: updated in place from
/// the global mean and unbiased variance (batch_norm), or returned with the saved mean and rstd
/// (the functional form).
Expected<ir::Graph> syncNormLocalGraph(const RuleContext& c,
                                       const std::vector<std::optional<PlacementTuple>>&) {
  const int64_t r = c.inputRank(0);
  if (r < 2 || c.numInputs() < 8)
    return internalError(c.node.qualifiedOp() + ": not a batch_norm of a rank >= 2 input");
  const bool functional = c.node.op == "aten::_native_batch_norm_legit_functional";
  ir::LocalGraphBuilder b(c.graph, c.node);
  using ir::ValueType;
  std::vector<int64_t> dims, shape(static_cast<size_t>(r), 1);
  for (int64_t d = 0; d < r; ++d)
    if (d != 1) dims.push_back(d);
  shape[1] = -1;
  const ir::ValueId x = b.arg(0), none = b.constant(ir::None{});
  const ir::ValueId reduce = b.constant(dims), keep = b.constant(false);
  const ir::ValueId view_shape = b.constant(shape), one = b.constant(int64_t{1});
  auto sum = [&](ir::ValueId t) { return b.op("aten::sum.dim_IntList", {t, reduce, keep, none}); };
  auto channelView = [&](ir::ValueId t) { return b.op("aten::view", {t, view_shape}); };
  // sums = all_reduce(cat(sum(x), [count])); n = the global count, mean = sums[:C] / n.
  const ir::ValueId channels = b.op("aten::size.int", {x, one}, ValueType::kInt);
  const ir::ValueId count = b.op(
      "aten::floordiv.int", {b.op("aten::numel", {x}, ValueType::kInt), channels}, ValueType::kInt);
  const ir::ValueId sx = sum(x);
  const ir::ValueId count_t = b.op(
      "aten::new_full", {sx, b.constant(std::vector<int64_t>{1}), count, none, none, none, none});
  const ir::ValueId sums = b.allReduce(
      b.op("aten::cat", {b.list({sx, count_t}, ValueType::kTensorList), b.constant(int64_t{0})}));
  const ir::ValueId zero = b.constant(int64_t{0});
  const ir::ValueId n = b.op("aten::detach", {b.op("aten::narrow", {sums, zero, channels, one})});
  const ir::ValueId mean =
      b.op("aten::div.Tensor", {b.op("aten::narrow", {sums, zero, zero, channels}), n});
  const ir::ValueId centered = b.op("aten::sub.Tensor", {x, channelView(mean), one});
  const ir::ValueId var = b.op(
      "aten::div.Tensor", {b.allReduce(sum(b.op("aten::mul.Tensor", {centered, centered}))), n});
  const ir::ValueId rstd = b.op("aten::rsqrt", {b.op("aten::add.Scalar", {var, b.arg(7), one})});
  ir::ValueId y = b.op("aten::mul.Tensor", {centered, channelView(rstd)});
  if (!c.isNoneArg(1)) y = b.op("aten::mul.Tensor", {y, channelView(b.arg(1))});
  if (!c.isNoneArg(2)) y = b.op("aten::add.Tensor", {y, channelView(b.arg(2)), one});
  // Running stats (without autograd: from detached statistics), lerp'ed by momentum (None: kept).
  const ir::ValueId momentum = c.isNoneArg(6) ? b.constant(0.0) : b.arg(6);
  const ir::ValueId mean_d = b.op("aten::detach", {mean});
  const ir::ValueId unbiased =
      b.op("aten::mul.Tensor",
           {b.op("aten::detach", {var}),
            b.op("aten::div.Tensor",
                 {n, b.op("aten::clamp_min", {b.op("aten::sub.Scalar", {n, one, one}), one})})});
  auto update = [&](size_t stat, ir::ValueId value) -> std::optional<ir::ValueId> {
    if (c.isNoneArg(stat)) return std::nullopt;
    const ir::ValueId typed = b.op("aten::type_as", {value, b.arg(stat)});
    return b.op(functional ? "aten::lerp.Scalar" : "aten::lerp_.Scalar",
                {b.arg(stat), typed, momentum});
  };
  std::optional<ir::ValueId> running_mean = update(3, mean_d), running_var = update(4, unbiased);
  if (!functional) return b.finish({y});
  if (!running_mean || !running_var)
    return internalError(c.node.qualifiedOp() + ": the functional form needs running stats");
  return b.finish({y, mean, rstd, *running_mean, *running_var});
}

/// The mesh dims over which a group_norm whose input is placed `input` reduces its statistics:
/// those that cut a spatial dim (any but the batch dim 0; the channel dim 1 is never cut).
std::vector<size_t> groupNormMeshDims(const PlacementTuple& input) {
  std::vector<size_t> dims;
  for (size_t m = 0; m < input.size(); ++m)
    if (input[m].isShard() && !input[m].isShard(0)) dims.push_back(m);
  return dims;
}

/// OpInfo::collective of group_norm: with a spatial dim cut, each (sample, group)'s sums are
/// all-reduced across the mesh dims that cut it, twice forward (sum, then squared deviations) and
/// twice backward, as batch_norm's statistics (sync_norm.h's price, for N x G statistics).
OpCollective groupNormCollective(const RuleContext& c,
                                 const std::vector<std::optional<PlacementTuple>>& inputs,
                                 const mesh::DeviceMesh& mesh, const cost::CostModel* model) {
  OpCollective out;
  if (inputs.empty() || !inputs[0] || !c.intArg(1)) return out;
  const std::vector<const ir::TensorMeta*> x = c.inputMetas(0);
  if (x.empty() || x[0]->rank() < 3) return out;
  out.mesh_dims = groupNormMeshDims(*inputs[0]);
  if (out.mesh_dims.empty() || !model) return out;
  const int64_t stats = layout::maxLocalSizes(*x[0], *inputs[0], mesh).at(0) * *c.intArg(1);
  bool backward = false;
  for (size_t i = 0; i < c.numOutputs(); ++i)
    for (const ir::TensorMeta* m : c.outputMetas(i)) backward = backward || m->requires_grad;
  out.us = syncNormUs(*model, mesh, out.mesh_dims, stats, ir::dtypeBytes(x[0]->dtype), backward);
  return out;
}

/// OpInfo::collective_local of group_norm(input [N, C, *], num_groups, weight?, bias?, eps, ...)
/// with a spatial dim cut: the rank's piece viewed [N, G, -1], its per-(sample, group) sums and
/// element count all-reduced -> mean; the squared deviations' sums all-reduced -> biased var;
/// y = (x - mean) * rsqrt(var + eps) * weight + bias.
Expected<ir::Graph> groupNormLocalGraph(const RuleContext& c,
                                        const std::vector<std::optional<PlacementTuple>>&) {
  const int64_t r = c.inputRank(0);
  if (r < 3 || c.numInputs() < 5 || !c.intArg(1))
    return internalError(c.node.qualifiedOp() + ": not a group_norm with constant num_groups");
  using ir::ValueType;
  ir::LocalGraphBuilder b(c.graph, c.node);
  const ir::ValueId x = b.arg(0), groups = b.arg(1), none = b.constant(ir::None{});
  const ir::ValueId zero = b.constant(int64_t{0}), one = b.constant(int64_t{1});
  const ir::ValueId last = b.constant(std::vector<int64_t>{2}), keep = b.constant(false);
  const ir::ValueId batch = b.op("aten::size.int", {x, zero}, ValueType::kInt);
  const ir::ValueId stats = b.op("aten::mul.int", {batch, groups}, ValueType::kInt);
  const ir::ValueId grouped = b.op(
      "aten::reshape", {x, b.list({batch, groups, b.constant(int64_t{-1})}, ValueType::kIntList)});
  auto sum = [&](ir::ValueId t) { return b.op("aten::sum.dim_IntList", {t, last, keep, none}); };
  const ir::ValueId flat =
      b.op("aten::reshape", {sum(grouped), b.constant(std::vector<int64_t>{-1})});
  const ir::ValueId count = b.op(
      "aten::floordiv.int", {b.op("aten::numel", {x}, ValueType::kInt), stats}, ValueType::kInt);
  const ir::ValueId count_t = b.op(
      "aten::new_full", {flat, b.constant(std::vector<int64_t>{1}), count, none, none, none, none});
  const ir::ValueId sums =
      b.allReduce(b.op("aten::cat", {b.list({flat, count_t}, ValueType::kTensorList), zero}));
  const ir::ValueId n = b.op("aten::detach", {b.op("aten::narrow", {sums, zero, stats, one})});
  const ir::ValueId stat_shape =
      b.list({batch, groups, b.constant(int64_t{1})}, ValueType::kIntList);
  const ir::ValueId mean = b.op(
      "aten::view",
      {b.op("aten::div.Tensor", {b.op("aten::narrow", {sums, zero, zero, stats}), n}), stat_shape});
  const ir::ValueId centered = b.op("aten::sub.Tensor", {grouped, mean, one});
  const ir::ValueId var = b.op(
      "aten::div.Tensor",
      {b.allReduce(b.op("aten::sum.dim_IntList", {b.op("aten::mul.Tensor", {centered, centered}),
                                                  last, b.constant(true), none})),
       n});
  const ir::ValueId rstd = b.op("aten::rsqrt", {b.op("aten::add.Scalar", {var, b.arg(4), one})});
  ir::ValueId y = b.op("aten::reshape_as", {b.op("aten::mul.Tensor", {centered, rstd}), x});
  std::vector<int64_t> shape(static_cast<size_t>(r), 1);
  shape[1] = -1;
  const ir::ValueId channel_shape = b.constant(shape);
  if (!c.isNoneArg(2))
    y = b.op("aten::mul.Tensor", {y, b.op("aten::view", {b.arg(2), channel_shape})});
  if (!c.isNoneArg(3))
    y = b.op("aten::add.Tensor", {y, b.op("aten::view", {b.arg(3), channel_shape}), one});
  return b.finish({y});
}

}  // namespace

void registerNormalizationRules(Registry& r) {
  using cost::OpFamily;
  r.add(
      "aten::batch_norm",
      [](const RuleContext& c) { return batchNormRule(c, BatchNormMode::kTrainingArg); },
      OpFamily::kNormalization);
  r.add(
      "aten::_native_batch_norm_legit_functional",
      [](const RuleContext& c) { return batchNormRule(c, BatchNormMode::kTrainingArg); },
      OpFamily::kNormalization);
  r.add(
      "aten::_native_batch_norm_legit_no_training",
      [](const RuleContext& c) { return batchNormRule(c, BatchNormMode::kEval); },
      OpFamily::kNormalization);
  // Training-mode batch_norm synchronizes its statistics across a cut batch (sync_norm.h).
  for (const char* op : {"aten::batch_norm", "aten::_native_batch_norm_legit_functional"}) {
    r.entry(op)->collective = syncNormCollective;
    r.entry(op)->collective_local = syncNormLocalGraph;
  }
  r.add("aten::group_norm", groupNormRule, OpFamily::kNormalization);
  // group_norm with a spatial dim cut all-reduces each group's statistics.
  r.entry("aten::group_norm")->collective = groupNormCollective;
  r.entry("aten::group_norm")->collective_local = groupNormLocalGraph;
  r.add("aten::layer_norm", lastDimsNormRule, OpFamily::kNormalization);
  r.add("aten::native_layer_norm", lastDimsNormRule, OpFamily::kNormalization);
  r.add("aten::rms_norm", lastDimsNormRule, OpFamily::kNormalization);

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  samples({"aten::layer_norm"},
          {{"", {S::f32({2, 5, 6}), S::of(std::vector<int64_t>{6}), S::f32({6}), S::f32({6})}},
           {"", {S::f32({2, 5, 6}), S::of(std::vector<int64_t>{5, 6}), S::none(), S::none()}}});
  samples({"aten::native_layer_norm"}, {{"",
                                         {S::f32({2, 5, 6}), S::of(std::vector<int64_t>{6}),
                                          S::f32({6}), S::f32({6}), S::of(1e-5)}}});
  samples({"aten::rms_norm"},
          {{"", {S::f32({2, 5, 6}), S::of(std::vector<int64_t>{6}), S::f32({6})}},
           {"", {S::f32({3, 5, 6}), S::of(std::vector<int64_t>{5, 6}), S::none(), S::of(1e-6)}}});
  samples({"aten::group_norm"}, {{"", {S::f32({2, 6, 5}), S::of(3), S::f32({6}), S::f32({6})}},
                                 {"", {S::f32({4, 4, 3, 3}), S::of(2)}}});
  samples({"aten::batch_norm"},
          {{"",
            {S::f32({4, 6, 5}), S::f32({6}), S::f32({6}), S::f32({6}), S::f32({6}), S::of(false),
             S::of(0.1), S::of(1e-5), S::of(true)}},
           {"",
            {S::f32({4, 6, 3, 3}), S::f32({6}), S::f32({6}), S::f32({6}), S::f32({6}), S::of(true),
             S::of(0.1), S::of(1e-5), S::of(true)}}});
  samples({"aten::_native_batch_norm_legit_no_training"},
          {{"",
            {S::f32({4, 6, 5}), S::f32({6}), S::f32({6}), S::f32({6}), S::f32({6}), S::of(0.1),
             S::of(1e-5)}}});
  samples({"aten::_native_batch_norm_legit_functional"},
          {{"",
            {S::f32({4, 6, 5}), S::f32({6}), S::f32({6}), S::f32({6}), S::f32({6}), S::of(true),
             S::of(0.1), S::of(1e-5)}}});
}

}  // namespace apc::strategy
