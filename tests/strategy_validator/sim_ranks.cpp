//===- tests/strategy_validator/sim_ranks.cpp - Simulated ranks in one process ===//
//
// Slicing, random Partial summands, simulated collectives and layout checks over a vector of
// per-rank tensors (see sim_ranks.h). Every collective is written from the step table of
// apc/cost/redistribute.h, not from lib/cost's code, so that the two can disagree.
//
//===----------------------------------------------------------------------===//
#include "sim_ranks.h"

#include <algorithm>
#include <sstream>

namespace apc::validator {

using mesh::DeviceMesh;
using mesh::Placement;
using mesh::PlacementTuple;
using mesh::ReduceOp;

layout::DimPiece chunkOf(int64_t n, int64_t p, int64_t k) {
  int64_t chunk = (n + p - 1) / p;
  int64_t offset = std::min(k * chunk, n);
  int64_t size = std::clamp<int64_t>(n - k * chunk, 0, chunk);
  return {offset, size};
}

at::Tensor slicePiece(const at::Tensor& full, const std::vector<layout::DimPiece>& piece) {
  at::Tensor t = full;
  for (size_t d = 0; d < piece.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), piece[d].offset, piece[d].size);
  return t;
}

at::Tensor localOf(const at::Tensor& full, const PlacementTuple& t, const DeviceMesh& mesh,
                   const std::vector<int64_t>& coordinate) {
  std::vector<int64_t> sizes(full.sizes().begin(), full.sizes().end());
  return slicePiece(full, layout::localPiece(sizes, t, mesh, coordinate));
}

namespace {

bool isLinear(ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kAvg;
}

at::Tensor reduceGroup(const std::vector<at::Tensor>& parts, ReduceOp op) {
  at::Tensor acc = parts.front().clone();
  for (size_t i = 1; i < parts.size(); ++i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc = acc + parts[i];
        break;
      case ReduceOp::kMax:
        acc = at::maximum(acc, parts[i]);
        break;
      case ReduceOp::kMin:
        acc = at::minimum(acc, parts[i]);
        break;
    }
  }
  if (op == ReduceOp::kAvg) acc = acc / static_cast<double>(parts.size());
  return acc;
}

/// A random tensor like `like` (same sizes and dtype): normal floats, small integers.
at::Tensor randomLike(const at::Tensor& like, at::Generator& gen) {
  if (at::isFloatingType(like.scalar_type())) return at::randn(like.sizes(), gen, like.options());
  return at::randint(-4, 5, like.sizes(), gen, like.options());
}

/// A random tensor of positive values (>= 0.5 for floats, >= 1 for integers) shaped like `like`.
at::Tensor randomPositiveLike(const at::Tensor& like, at::Generator& gen) {
  if (at::isFloatingType(like.scalar_type()))
    return at::randn(like.sizes(), gen, like.options()).abs() + 0.5;
  return at::randint(1, 5, like.sizes(), gen, like.options());
}

}  // namespace

bool partialsCommute(const PlacementTuple& t) {
  std::optional<ReduceOp> first;
  for (const Placement& p : t) {
    if (!p.isPartial()) continue;
    if (!first) {
      first = p.reduceOp();
      continue;
    }
    if (*first != p.reduceOp() && !(isLinear(*first) && isLinear(p.reduceOp()))) return false;
  }
  return true;
}

Expected<RankTensors> distribute(const at::Tensor& full, const PlacementTuple& t,
                                 const DeviceMesh& mesh, at::Generator& gen) {
  const int64_t world = mesh.worldSize();
  RankTensors locals(static_cast<size_t>(world));
  std::vector<size_t> partial_dims;
  for (size_t m = 0; m < t.size(); ++m)
    if (t[m].isPartial()) partial_dims.push_back(m);
  if (partial_dims.empty()) {
    for (int64_t r = 0; r < world; ++r)
      locals[static_cast<size_t>(r)] = localOf(full, t, mesh, mesh.coordinate(r)).contiguous();
    return locals;
  }
  if (full.scalar_type() == at::kBool)
    return invalidArgument("a bool tensor cannot be placed as " + mesh::toString(t));
  if (!partialsCommute(t))
    return invalidArgument("partial ops of " + mesh::toString(t) + " do not commute");
  const ReduceOp op = t[partial_dims.front()].reduceOp();
  const bool linear = isLinear(op);
  double scale = 1.0;  // the sum of the summands: the value times the sizes of the avg mesh dims
  for (size_t m : partial_dims)
    if (t[m].reduceOp() == ReduceOp::kAvg) scale *= static_cast<double>(mesh.size(m));
  if (scale != 1.0 && !at::isFloatingType(full.scalar_type()))
    return invalidArgument("an integer tensor cannot be placed as " + mesh::toString(t));

  // One full-size summand per combination of coordinates along the partial mesh dims, shared by
  // every rank with those coordinates (so ranks that differ only in Replicate or Shard mesh dims
  // hold the same summand, or their pieces of it). The combination with all coordinates 0 holds
  // the value (max/min) or the value times `scale` minus the other summands (sum/avg).
  std::vector<int64_t> combo_sizes;
  for (size_t m : partial_dims) combo_sizes.push_back(mesh.size(m));
  int64_t combos = 1;
  for (int64_t n : combo_sizes) combos *= n;
  std::vector<at::Tensor> summands(static_cast<size_t>(combos));
  at::Tensor first = scale != 1.0 ? full * scale : full.clone();
  for (int64_t k = 1; k < combos; ++k) {
    at::Tensor v;
    if (linear) {
      v = randomLike(full, gen);
      first = first - v;
    } else if (op == ReduceOp::kMax) {
      v = full - randomPositiveLike(full, gen);
    } else {
      v = full + randomPositiveLike(full, gen);
    }
    summands[static_cast<size_t>(k)] = v;
  }
  summands[0] = first;
  for (int64_t r = 0; r < world; ++r) {
    std::vector<int64_t> c = mesh.coordinate(r);
    int64_t k = 0;  // row-major index of the rank's partial coordinates
    for (size_t i = 0; i < partial_dims.size(); ++i) k = k * combo_sizes[i] + c[partial_dims[i]];
    locals[static_cast<size_t>(r)] =
        localOf(summands[static_cast<size_t>(k)], t, mesh, c).contiguous();
  }
  return locals;
}

// --- collectives
// ----------------------------------------------------------------------------------

void allGather(RankTensors& locals, const DeviceMesh& mesh, size_t m, int64_t dim) {
  for (const std::vector<int64_t>& group : mesh.groups(m)) {
    std::vector<at::Tensor> parts;
    for (int64_t r : group) parts.push_back(locals[static_cast<size_t>(r)]);
    at::Tensor whole = at::cat(parts, dim);
    for (int64_t r : group) locals[static_cast<size_t>(r)] = whole;
  }
}

void allReduce(RankTensors& locals, const DeviceMesh& mesh, size_t m, ReduceOp op) {
  for (const std::vector<int64_t>& group : mesh.groups(m)) {
    std::vector<at::Tensor> parts;
    for (int64_t r : group) parts.push_back(locals[static_cast<size_t>(r)]);
    at::Tensor reduced = reduceGroup(parts, op);
    for (int64_t r : group) locals[static_cast<size_t>(r)] = reduced;
  }
}

void reduceScatter(RankTensors& locals, const DeviceMesh& mesh, size_t m, ReduceOp op,
                   int64_t dim) {
  for (const std::vector<int64_t>& group : mesh.groups(m)) {
    std::vector<at::Tensor> parts;
    for (int64_t r : group) parts.push_back(locals[static_cast<size_t>(r)]);
    at::Tensor reduced = reduceGroup(parts, op);
    const int64_t p = static_cast<int64_t>(group.size());
    for (int64_t k = 0; k < p; ++k) {
      layout::DimPiece c = chunkOf(reduced.size(dim), p, k);
      locals[static_cast<size_t>(group[static_cast<size_t>(k)])] =
          reduced.narrow(dim, c.offset, c.size);
    }
  }
}

void localSlice(RankTensors& locals, const DeviceMesh& mesh, size_t m, int64_t dim) {
  const int64_t p = mesh.size(m);
  for (size_t r = 0; r < locals.size(); ++r) {
    int64_t k = mesh.coordinate(static_cast<int64_t>(r))[m];
    layout::DimPiece c = chunkOf(locals[r].size(dim), p, k);
    locals[r] = locals[r].narrow(dim, c.offset, c.size);
  }
}

void allToAll(RankTensors& locals, const DeviceMesh& mesh, size_t m, int64_t gather_dim,
              int64_t shard_dim) {
  for (const std::vector<int64_t>& group : mesh.groups(m)) {
    const int64_t p = static_cast<int64_t>(group.size());
    std::vector<at::Tensor> received(group.size());
    for (int64_t q = 0; q < p; ++q) {  // receiver coordinate
      std::vector<at::Tensor> arrivals;
      for (int64_t s = 0; s < p; ++s) {  // sender coordinate, in order
        const at::Tensor& local = locals[static_cast<size_t>(group[static_cast<size_t>(s)])];
        layout::DimPiece c = chunkOf(local.size(shard_dim), p, q);
        arrivals.push_back(local.narrow(shard_dim, c.offset, c.size));
      }
      received[static_cast<size_t>(q)] = at::cat(arrivals, gather_dim);
    }
    for (int64_t q = 0; q < p; ++q)
      locals[static_cast<size_t>(group[static_cast<size_t>(q)])] = received[static_cast<size_t>(q)];
  }
}

Status executeStep(RankTensors& locals, const cost::RedistributionStep& step,
                   const DeviceMesh& mesh) {
  const size_t m = step.mesh_dim;
  if (m >= mesh.ndim() || step.before.size() != mesh.ndim() || step.after.size() != mesh.ndim())
    return invalidArgument("step " + cost::describe(step) + ": mesh dim or tuples out of range");
  for (size_t o = 0; o < mesh.ndim(); ++o)
    if (o != m && !(step.before[o] == step.after[o]))
      return invalidArgument("step " + cost::describe(step) + ": changes mesh dim " +
                             std::to_string(o) + " too");
  const Placement& b = step.before[m];
  const Placement& a = step.after[m];
  auto bad = [&](const char* what) {
    return invalidArgument("step " + cost::describe(step) + " (" + mesh::toString(step.before) +
                           " -> " + mesh::toString(step.after) + "): " + what);
  };
  switch (step.kind) {
    case cost::StepKind::kAllGather:
      if (!b.isShard(step.gather_dim) || !a.isReplicate()) return bad("not S(gather_dim) -> R");
      allGather(locals, mesh, m, step.gather_dim);
      break;
    case cost::StepKind::kAllReduce:
      if (!b.isPartial() || b.reduceOp() != step.reduce_op || !a.isReplicate())
        return bad("not P(op) -> R");
      allReduce(locals, mesh, m, step.reduce_op);
      break;
    case cost::StepKind::kReduceScatter:
      if (!b.isPartial() || b.reduceOp() != step.reduce_op || !a.isShard(step.shard_dim))
        return bad("not P(op) -> S(shard_dim)");
      reduceScatter(locals, mesh, m, step.reduce_op, step.shard_dim);
      break;
    case cost::StepKind::kLocalSlice:
      if (!b.isReplicate() || !a.isShard(step.shard_dim)) return bad("not R -> S(shard_dim)");
      localSlice(locals, mesh, m, step.shard_dim);
      break;
    case cost::StepKind::kAllToAll:
      if (!b.isShard(step.gather_dim) || !a.isShard(step.shard_dim) ||
          step.gather_dim == step.shard_dim)
        return bad("not S(gather_dim) -> S(shard_dim)");
      allToAll(locals, mesh, m, step.gather_dim, step.shard_dim);
      break;
  }
  return Status::success();
}

// --- checking
// -------------------------------------------------------------------------------------

std::string shapeText(const at::Tensor& t) {
  std::ostringstream os;
  os << "[";
  for (int64_t d = 0; d < t.dim(); ++d) os << (d ? "," : "") << t.size(d);
  os << "]";
  return os.str();
}

std::optional<std::string> checkLayout(const RankTensors& locals, const at::Tensor& full,
                                       const PlacementTuple& t, const DeviceMesh& mesh,
                                       Tolerance tol) {
  const int64_t world = mesh.worldSize();
  if (static_cast<int64_t>(locals.size()) != world)
    return "expected " + std::to_string(world) + " ranks, got " + std::to_string(locals.size());
  // Shapes and dtypes first: a rank must hold a piece of exactly its size even when Partial.
  for (int64_t r = 0; r < world; ++r) {
    const at::Tensor& l = locals[static_cast<size_t>(r)];
    at::Tensor want = localOf(full, t, mesh, mesh.coordinate(r));
    if (!l.defined()) return "rank " + std::to_string(r) + " holds no tensor";
    if (l.sizes() != want.sizes())
      return "rank " + std::to_string(r) + " holds shape " + shapeText(l) + ", expected " +
             shapeText(want);
    if (l.scalar_type() != full.scalar_type())
      return "rank " + std::to_string(r) + " holds dtype " +
             std::string(c10::toString(l.scalar_type())) + ", expected " +
             std::string(c10::toString(full.scalar_type()));
  }
  RankTensors reduced = locals;
  for (size_t m = 0; m < t.size(); ++m)
    if (t[m].isPartial()) allReduce(reduced, mesh, m, t[m].reduceOp());
  // Ranks often hold the very same tensor (identical ranks computed once, reduced partials): a
  // (tensor, piece) pair already compared need not be compared again.
  std::vector<std::pair<const void*, std::vector<layout::DimPiece>>> compared;
  std::vector<int64_t> sizes(full.sizes().begin(), full.sizes().end());
  for (int64_t r = 0; r < world; ++r) {
    const at::Tensor& got = reduced[static_cast<size_t>(r)];
    std::vector<layout::DimPiece> piece = layout::localPiece(sizes, t, mesh, mesh.coordinate(r));
    std::pair<const void*, std::vector<layout::DimPiece>> key{got.unsafeGetTensorImpl(), piece};
    if (std::find(compared.begin(), compared.end(), key) != compared.end()) continue;
    compared.push_back(std::move(key));
    at::Tensor want = slicePiece(full, piece);
    if (got.numel() == 0) continue;
    bool same = at::isFloatingType(want.scalar_type())
                    ? at::allclose(got, want, tol.rtol, tol.atol, /*equal_nan=*/true)
                    : at::equal(got, want);
    if (same) continue;
    std::ostringstream os;
    os << "rank " << r << " (piece " << shapeText(want) << ") differs";
    if (at::isFloatingType(want.scalar_type())) {
      at::Tensor diff = (got - want).abs();
      diff = at::where(at::isnan(diff), at::zeros_like(diff), diff);
      os << ": max |diff| " << diff.max().item<double>() << ", max |expected| "
         << want.abs().max().item<double>();
    } else {
      os << ": " << (got != want).sum().item<int64_t>() << " of " << want.numel() << " elements";
    }
    return os.str();
  }
  return std::nullopt;
}

}  // namespace apc::validator
