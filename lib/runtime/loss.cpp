//===- lib/runtime/loss.cpp - A training loss on this rank's rows of the output -===//
//
// See apc/runtime/loss.h.
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/loss.h"

#include <string>
#include <vector>

#include "apc/runtime/redistribute.h"

namespace apc::runtime {

namespace {

std::string shapeText(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
  return s + "]";
}

}  // namespace

Expected<ShardedLoss> shardedLoss(ParallelModule& pm, const at::Tensor& local,
                                  const at::Tensor* targets, at::Generator* gen) {
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
  const at::Tensor rows = gathers ? gatherToFull(local, gather, sizes, world) : local;
  // The whole batch's row sizes: the static global ones, and a dynamic dim's local size summed
  // over the mesh dims that split it (a collective of the trainer's, like the gather).
  std::vector<int64_t> global_rows(rows.sizes().begin(), rows.sizes().begin() + row_dims);
  for (int64_t d = 0; d < row_dims; ++d) {
    const auto ud = static_cast<size_t>(d);
    if (ud < spec.global_shape.size() && (ud >= spec.symbols.size() || spec.symbols[ud].empty())) {
      global_rows[ud] = spec.global_shape[ud];
      continue;
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
    const int64_t c = rows.size(-1);
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
    out.share =
        at::cross_entropy_loss(rows.reshape({-1, c}), mine.reshape({-1}), {}, at::Reduction::Sum) /
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
