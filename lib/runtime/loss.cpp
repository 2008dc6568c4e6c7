//===- lib/runtime/loss.cpp - A training loss on this rank's rows of the output -===//
//
// See apc/runtime/loss.h.
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/loss.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <string>
#include <vector>

#include "apc/layout/layout.h"
#include "apc/runtime/redistribute.h"

namespace apc::runtime {

namespace {

std::string shapeText(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
  return s + "]";
}

/// The sum over the mesh dims `dims` of a value every rank of those dims then holds alike, whose
/// gradient is this rank's own (the identity): the all-reduce of Megatron's vocab-parallel cross
/// entropy. Each rank differentiates the same loss; its piece of the logits enters the sum once.
struct SumOverDims : public torch::autograd::Function<SumOverDims> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x, World* world,
                            const std::vector<int64_t>& dims) {
    at::Tensor out = x.detach().contiguous().clone();
    for (int64_t m : dims) world->dim(static_cast<size_t>(m)).allReduce(out, mesh::ReduceOp::kSum);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads.at(0), at::Tensor(), at::Tensor()};
  }
};

/// Cross entropy of logits whose class (last) dim is split over the mesh dims `class_dims`
/// (placed `class_placement`, which shards only that dim), without gathering them: per row the
/// classes' maximum (all-reduced, MAX), the sum of exp(x - max) and the target's logit (each
/// all-reduced, SUM, with SumOverDims), then log(sum) + max - target. The row losses, summed.
at::Tensor vocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     int64_t classes, const mesh::PlacementTuple& class_placement,
                                     const std::vector<int64_t>& class_dims, ParallelModule& pm) {
  World& world = pm.world();
  const bool low = logits.scalar_type() != at::kFloat && logits.scalar_type() != at::kDouble;
  const at::Tensor x = low ? logits.to(at::kFloat) : logits;
  // This rank's classes: [offset, offset + size) of the class dim (layout::localPiece).
  mesh::PlacementTuple ids_placement(class_placement.size(), mesh::Placement::replicate());
  for (size_t m = 0; m < class_placement.size(); ++m)
    if (class_placement[m].isShard()) ids_placement[m] = mesh::Placement::shard(0);
  const layout::DimPiece mine_classes =
      layout::localPiece({classes}, ids_placement, pm.mesh(), world.coordinate()).at(0);
  // A rank whose piece of the classes is empty (more ranks than classes) takes -inf.
  at::Tensor max = x.size(-1) > 0 ? std::get<0>(x.detach().max(-1)).contiguous()
                                  : at::full({x.size(0)}, -INFINITY, x.options());
  for (int64_t m : class_dims)
    world.dim(static_cast<size_t>(m)).allReduce(max, mesh::ReduceOp::kMax);
  const at::Tensor sum =
      SumOverDims::apply(at::exp(x - max.unsqueeze(-1)).sum(-1), &world, class_dims);
  // The target's logit where this rank holds its class, else 0.
  at::Tensor mine = at::zeros_like(max);
  if (mine_classes.size > 0) {
    const at::Tensor pos = targets.to(x.device()) - mine_classes.offset;
    const at::Tensor held = (pos >= 0) & (pos < mine_classes.size);
    mine = x.gather(-1, pos.clamp(0, mine_classes.size - 1).unsqueeze(-1)).squeeze(-1) *
           held.to(x.scalar_type());
  }
  const at::Tensor target = SumOverDims::apply(mine, &world, class_dims);
  return (at::log(sum) + max - target).sum();
}

}  // namespace

std::map<std::string, int64_t> inputSymbolSizes(const ParallelModule& pm,
                                                const std::vector<at::Tensor>& full_inputs) {
  std::map<std::string, int64_t> out;
  const std::vector<PlacedTensor>& specs = pm.inputSpecs();
  for (size_t i = 0; i < specs.size() && i < full_inputs.size(); ++i)
    for (size_t d = 0; d < specs[i].symbols.size(); ++d)
      if (!specs[i].symbols[d].empty() && static_cast<int64_t>(d) < full_inputs[i].dim())
        out.emplace(specs[i].symbols[d], full_inputs[i].size(static_cast<int64_t>(d)));
  return out;
}

Expected<ShardedLoss> shardedLoss(ParallelModule& pm, const at::Tensor& local,
                                  const at::Tensor* targets, at::Generator* gen,
                                  const std::map<std::string, int64_t>* symbol_sizes) {
  const PlacedTensor& spec = pm.outputSpecs().at(0);
  World& world = pm.world();
  ShardedLoss out;
  int64_t global_numel = 1;
  for (int64_t s : spec.global_shape) global_numel *= s;
  if (spec.global_shape.empty() || (global_numel == 1 && spec.symbols.empty())) {
    at::Tensor full = pm.gatherOutput(0, local);
    out.share = full.reshape({});
    out.resolved = out.share.item<double>();
    return out;
  }
  const int64_t rank = local.dim();
  const bool classes = at::isFloatingType(local.scalar_type()) && rank >= 2 &&
                       !(targets && at::isFloatingType(targets->scalar_type()));
  const int64_t row_dims = classes ? rank - 1 : rank;
  // keep: the mesh dims that split rows (they stay split); gather: the placement left to undo.
  const mesh::PlacementTuple& t = spec.placement;
  mesh::PlacementTuple keep(t.size(), mesh::Placement::replicate());
  mesh::PlacementTuple gather = t;
  std::vector<size_t> row_mesh_dims;
  for (size_t m = 0; m < t.size(); ++m)
    if (t[m].isShard() && t[m].dim() < row_dims) {
      keep[m] = t[m];
      gather[m] = mesh::Placement::replicate();
      row_mesh_dims.push_back(m);
    }
  std::vector<int64_t> sizes(local.sizes().begin(), local.sizes().end());
  bool gathers = false;
  for (size_t m = 0; m < gather.size(); ++m) {
    if (!gather[m].isShard()) continue;
    gathers = true;
    const auto d = static_cast<size_t>(gather[m].dim());
    sizes[d] = d < spec.symbols.size() && !spec.symbols[d].empty() ? -1 : spec.global_shape[d];
  }
  // The class dim split (vocab-parallel logits) and no other dim to undo: the cross entropy takes
  // the split logits as they are (vocabParallelCrossEntropy), not the gathered ones.
  std::vector<int64_t> class_dims;
  bool only_classes = classes && gathers &&
                      (spec.symbols.size() < static_cast<size_t>(rank) ||
                       spec.symbols[static_cast<size_t>(rank - 1)].empty());
  for (size_t m = 0; only_classes && m < gather.size(); ++m) {
    if (gather[m].isShard() && gather[m].dim() == rank - 1)
      class_dims.push_back(static_cast<int64_t>(m));
    else if (!gather[m].isReplicate())
      only_classes = false;
  }
  const at::Tensor rows =
      gathers && !only_classes ? gatherToFull(local, gather, sizes, world) : local;
  // The whole batch's row sizes: the static global ones, and a dynamic dim's local size summed
  // over the mesh dims that split it (a collective of the trainer's, like the gather).
  std::vector<int64_t> global_rows(rows.sizes().begin(), rows.sizes().begin() + row_dims);
  for (int64_t d = 0; d < row_dims; ++d) {
    const auto ud = static_cast<size_t>(d);
    if (ud < spec.global_shape.size() && (ud >= spec.symbols.size() || spec.symbols[ud].empty())) {
      global_rows[ud] = spec.global_shape[ud];
      continue;
    }
    if (symbol_sizes && ud < spec.symbols.size()) {
      const auto known = symbol_sizes->find(spec.symbols[ud]);
      if (known != symbol_sizes->end()) {
        if (known->second < rows.size(d))
          return invalidArgument("the loss: the batch's size " + std::to_string(known->second) +
                                 " of '" + spec.symbols[ud] + "' is below this rank's " +
                                 std::to_string(rows.size(d)) + " rows of the output");
        global_rows[ud] = known->second;
        continue;
      }
    }
    bool split = false;
    at::Tensor n = at::full({1}, rows.size(d), at::TensorOptions().dtype(at::kLong));
    for (size_t m : row_mesh_dims)
      if (keep[m].dim() == d) {
        world.dim(m).allReduce(n, mesh::ReduceOp::kSum);
        split = true;
      }
    if (split) global_rows[static_cast<size_t>(d)] = n.item<int64_t>();
  }
  int64_t total = 1;
  for (int64_t s : global_rows) total *= s;
  const std::vector<int64_t> coordinate = world.coordinate();
  auto piece = [&](const at::Tensor& full) {
    return localPieceOf(full, keep, pm.mesh(), coordinate).to(rows.device());
  };
  if (classes) {
    const int64_t c = only_classes ? spec.global_shape.back() : rows.size(-1);
    at::Tensor full_targets;
    if (targets) {
      if (targets->numel() != total)
        return invalidArgument("the targets " + shapeText(targets->sizes()) + " do not fit the " +
                               std::to_string(total) + " rows of the output");
      full_targets = targets->reshape(global_rows).to(at::kLong);
    } else {
      if (!gen) return invalidArgument("shardedLoss: synthetic targets need a generator");
      full_targets = at::randint(0, c, {total}, *gen, at::kLong).reshape(global_rows);
    }
    const at::Tensor mine = piece(full_targets);
    if (only_classes)
      out.share = vocabParallelCrossEntropy(rows.reshape({-1, rows.size(-1)}), mine.reshape({-1}),
                                            c, gather, class_dims, pm) /
                  static_cast<double>(total);
    else
      out.share = at::cross_entropy_loss(rows.reshape({-1, c}), mine.reshape({-1}), {},
                                         at::Reduction::Sum) /
                  static_cast<double>(total);
  } else {
    at::Tensor diff = rows;
    if (targets) {
      if (targets->numel() != total)
        return invalidArgument("the targets " + shapeText(targets->sizes()) + " do not fit the " +
                               "output's " + std::to_string(total) + " values");
      diff = rows - piece(targets->reshape(global_rows)).to(rows.scalar_type());
    }
    out.share = diff.pow(2).sum() / static_cast<double>(total);
  }
  at::Tensor v = out.share.detach().to(at::kDouble).reshape({1}).contiguous().cpu();
  if (row_mesh_dims.empty()) {
    out.resolved = v.item<double>();
    return out;
  }
  // The first mesh dim's sum behind the backward; the others (each needs the one before) at
  // value().
  std::shared_ptr<PendingCollective> pending =
      world.dim(row_mesh_dims.front()).allReduceAsync(v, mesh::ReduceOp::kSum);
  out.resolve =
      [&world, v, pending,
       rest = std::vector<size_t>(row_mesh_dims.begin() + 1, row_mesh_dims.end())]() mutable {
        pending->wait();
        for (size_t m : rest) world.dim(m).allReduce(v, mesh::ReduceOp::kSum);
        return v.item<double>();
      };
  return out;
}

double ShardedLoss::value() {
  if (!resolved) {
    resolved = resolve();
    resolve = nullptr;
  }
  return *resolved;
}

}  // namespace apc::runtime
