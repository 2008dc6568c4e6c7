//===- lib/runtime/redistribute.cpp - Redistributions as autograd functions ===//
//
// Step execution on the mesh dims' communicators, the autograd wrappers and full-tensor gathers
// (see apc/runtime/redistribute.h).
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/redistribute.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "apc/layout/layout.h"

namespace apc::runtime {

using layout::StepKind;

namespace {

std::string sizesText(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

/// Checks the step's result against the recorded local shape; dynamic dims and dims whose input
/// size already differed from the recorded one are not checked.
void checkShape(const RedistStepSpec& s, const at::Tensor& in, const at::Tensor& out,
                const std::string& edge) {
  if (s.local_out.empty()) return;
  bool ok = out.dim() == static_cast<int64_t>(s.local_out.size());
  for (int64_t d = 0; ok && d < out.dim(); ++d) {
    bool in_as_recorded = static_cast<size_t>(d) >= s.local_in.size() || d >= in.dim() ||
                          in.size(d) == s.local_in[static_cast<size_t>(d)];
    if (in_as_recorded && !s.isDynamic(d) && out.size(d) != s.local_out[static_cast<size_t>(d)])
      ok = false;
  }
  TORCH_CHECK(ok, "redistribution ", edge, ": ", layout::stepKindName(s.kind), " on mesh dim ",
              s.mesh_dim, " gave local shape ", sizesText(out.sizes()), ", the program expects ",
              sizesText(s.local_out));
}

/// The sizes along `dim` of every member's piece of the group of `comm` (one small all-gather).
std::vector<int64_t> exchangeSizes(Communicator& comm, const at::Tensor& t, int64_t dim) {
  at::Tensor mine = at::full({1}, t.size(dim), at::kLong);
  at::Tensor all =
      comm.allGather(mine, 0, std::vector<int64_t>(static_cast<size_t>(comm.size()), 1));
  return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
}

at::Tensor runStep(const RedistStepSpec& s, const at::Tensor& x, World& world,
                   const std::string& edge, std::optional<at::ScalarType> reduce_dtype) {
  const bool reduces = s.kind == StepKind::kAllReduce || s.kind == StepKind::kReduceScatter;
  if (reduces && reduce_dtype && *reduce_dtype != x.scalar_type())
    return runStep(s, x.to(*reduce_dtype), world, edge, std::nullopt).to(x.scalar_type());
  Communicator& comm = world.dim(s.mesh_dim);
  at::Tensor in = x.contiguous();
  at::Tensor out;
  switch (s.kind) {
    case StepKind::kAllGather: {
      // A dynamic dim may differ from the recorded sizes, and unevenly: every member exchanges
      // its size first (the same decision on all of them, from the program).
      std::vector<int64_t> sizes = s.group_sizes;
      if (s.isDynamic(s.gather_dim) && in.dim() > s.gather_dim)
        sizes = exchangeSizes(comm, in, s.gather_dim);
      out = comm.allGather(in, s.gather_dim, sizes);
      break;
    }
    case StepKind::kAllReduce:
      out = in.clone(at::MemoryFormat::Contiguous);
      comm.allReduce(out, s.reduce_op);
      break;
    case StepKind::kReduceScatter:
      out = comm.reduceScatter(in, s.shard_dim, s.reduce_op);
      break;
    case StepKind::kLocalSlice: {
      const int64_t n = in.size(s.shard_dim);
      const int64_t p = comm.size();
      const int64_t k = comm.index();
      out =
          in.narrow(s.shard_dim, mesh::chunkOffset(n, p, k), mesh::chunkSize(n, p, k)).contiguous();
      break;
    }
    case StepKind::kAllToAll: {
      std::vector<int64_t> sizes = s.group_sizes;
      if (s.isDynamic(s.gather_dim) && in.dim() > s.gather_dim)
        sizes = exchangeSizes(comm, in, s.gather_dim);
      out = comm.allToAll(in, s.gather_dim, s.shard_dim, sizes);
      break;
    }
  }
  checkShape(s, in, out, edge);
  return out;
}

/// The autograd node of one edge: forward steps, backward steps on the gradient.
struct RedistFunction : public torch::autograd::Function<RedistFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const RedistSpec* spec, World* world, const at::Tensor* result) {
    ctx->saved_data["spec"] = reinterpret_cast<int64_t>(spec);
    ctx->saved_data["world"] = reinterpret_cast<int64_t>(world);
    return result->defined() ? *result : runSteps(spec->forward, x, *world, spec->edge);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* spec = reinterpret_cast<const RedistSpec*>(ctx->saved_data["spec"].toInt());
    auto* world = reinterpret_cast<World*>(ctx->saved_data["world"].toInt());
    at::Tensor g = runSteps(spec->backward, grads.at(0), *world, spec->edge + " (backward)",
                            spec->reduce_dtype);
    // A P(avg) reduction scales every summand by 1/p: so does its transpose. The backward steps
    // (placements only) cannot say it; the scale commutes with them.
    double scale = 1.0;
    for (const RedistStepSpec& s : spec->forward)
      if ((s.kind == StepKind::kAllReduce || s.kind == StepKind::kReduceScatter) &&
          s.reduce_op == mesh::ReduceOp::kAvg)
        scale /= static_cast<double>(world->dim(s.mesh_dim).size());
    if (scale != 1.0) g = g * scale;
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

/// The pieces of each member of this rank's group along mesh dim m, along tensor dim d, under
/// `placement`.
std::vector<int64_t> memberSizes(const std::vector<int64_t>& global, const mesh::PlacementTuple& t,
                                 const mesh::DeviceMesh& mesh, std::vector<int64_t> coordinate,
                                 size_t m, int d) {
  std::vector<int64_t> sizes;
  for (int64_t k = 0; k < mesh.size(m); ++k) {
    coordinate[m] = k;
    sizes.push_back(layout::localPiece(global, t, mesh, coordinate)[static_cast<size_t>(d)].size);
  }
  return sizes;
}

/// A placement tuple as autograd's saved data holds it: (kind, dim, reduce op) per mesh dim, as
/// integers (no text round trip inside backward).
std::vector<int64_t> packPlacement(const mesh::PlacementTuple& t) {
  std::vector<int64_t> out;
  for (const mesh::Placement& p : t) {
    out.push_back(static_cast<int64_t>(p.kind()));
    out.push_back(p.dim());
    out.push_back(static_cast<int64_t>(p.reduceOp()));
  }
  return out;
}

mesh::PlacementTuple unpackPlacement(const std::vector<int64_t>& packed) {
  mesh::PlacementTuple t;
  for (size_t i = 0; i + 2 < packed.size(); i += 3) {
    switch (static_cast<mesh::Placement::Kind>(packed[i])) {
      case mesh::Placement::Kind::kReplicate:
        t.push_back(mesh::Placement::replicate());
        break;
      case mesh::Placement::Kind::kShard:
        t.push_back(mesh::Placement::shard(static_cast<int>(packed[i + 1])));
        break;
      case mesh::Placement::Kind::kPartial:
        t.push_back(mesh::Placement::partial(static_cast<mesh::ReduceOp>(packed[i + 2])));
        break;
    }
  }
  return t;
}

struct GatherFunction : public torch::autograd::Function<GatherFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const mesh::PlacementTuple* placement,
                            const std::vector<int64_t>* global, World* world) {
    ctx->saved_data["placement"] = packPlacement(*placement);
    ctx->saved_data["global"] = *global;
    ctx->saved_data["world"] = reinterpret_cast<int64_t>(world);
    return gatherTensor(x, *placement, *global, *world);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* world = reinterpret_cast<World*>(ctx->saved_data["world"].toInt());
    const mesh::PlacementTuple placement =
        unpackPlacement(ctx->saved_data["placement"].toIntVector());
    at::Tensor g = localPieceOf(grads.at(0), placement, world->mesh(), world->coordinate());
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor runSteps(const std::vector<RedistStepSpec>& steps, const at::Tensor& x, World& world,
                    const std::string& edge, std::optional<at::ScalarType> reduce_dtype) {
  at::Tensor t = x;
  for (const RedistStepSpec& s : steps) t = runStep(s, t, world, edge, reduce_dtype);
  return t;
}

at::Tensor redistribute(const at::Tensor& x, const RedistSpec& spec, World& world,
                        const at::Tensor& forward_result) {
  if (forward_result.defined()) {
    TORCH_CHECK(isGatherChain(spec), "redistribution ", spec.edge,
                ": a result computed ahead needs a forward of all-gathers");
    if (spec.forward.size() == 1) {
      checkShape(spec.forward.front(), x, forward_result, spec.edge);
    } else {
      const std::vector<int64_t>& want = spec.forward.back().local_out;
      TORCH_CHECK(want.empty() || forward_result.sizes().vec() == want, "redistribution ",
                  spec.edge, ": the gathers issued ahead gave local shape ",
                  sizesText(forward_result.sizes()), ", the program expects ", sizesText(want));
    }
  }
  if (!spec.requires_grad || !x.requires_grad()) {
    if (forward_result.defined()) return forward_result;
    at::NoGradGuard no_grad;
    return runSteps(spec.forward, x, world, spec.edge);
  }
  return RedistFunction::apply(x, &spec, &world, &forward_result);
}

bool canIssueForward(const RedistSpec& spec) {
  return spec.forward.size() == 1 && spec.forward.front().kind == StepKind::kAllGather &&
         !spec.forward.front().isDynamic(spec.forward.front().gather_dim);
}

std::unique_ptr<PendingCollective> issueForward(const RedistSpec& spec, const at::Tensor& x,
                                                World& world) {
  TORCH_CHECK(canIssueForward(spec), "redistribution ", spec.edge,
              ": only a forward of one all-gather is issued ahead");
  const RedistStepSpec& s = spec.forward.front();
  at::NoGradGuard no_grad;
  return world.dim(s.mesh_dim).allGatherAsync(x.detach().contiguous(), s.gather_dim, s.group_sizes);
}

bool isGatherChain(const RedistSpec& spec) {
  if (spec.forward.empty()) return false;
  for (const RedistStepSpec& s : spec.forward)
    if (s.kind != StepKind::kAllGather || s.gather_dim < 0 || s.isDynamic(s.gather_dim))
      return false;
  return true;
}

GroupedGather::GroupedGather(std::vector<const RedistSpec*> specs,
                             const std::vector<at::Tensor>& xs, World& world, bool async)
    : specs_(std::move(specs)), world_(&world) {
  TORCH_CHECK(!specs_.empty() && specs_.size() == xs.size(), "a grouped gather of ", specs_.size(),
              " redistributions on ", xs.size(), " tensors");
  const RedistSpec& first = *specs_.front();
  for (const RedistSpec* spec : specs_) {
    bool same = isGatherChain(*spec) && spec->forward.size() == first.forward.size();
    for (size_t j = 0; same && j < first.forward.size(); ++j)
      same = spec->forward[j].mesh_dim == first.forward[j].mesh_dim;
    TORCH_CHECK(same, "redistribution ", spec->edge, " cannot join a grouped gather with ",
                first.edge, " (not the same all-gathers' mesh dims)");
  }
  begin(0, xs, async);
}

void GroupedGather::begin(size_t step, const std::vector<at::Tensor>& xs, bool async) {
  at::NoGradGuard no_grad;
  const size_t mesh_dim = specs_.front()->forward[step].mesh_dim;
  Communicator& comm = world_->dim(mesh_dim);
  ranks_ = comm.size();
  members_.clear();
  std::vector<at::Tensor> flat;
  int64_t total = 0;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const RedistSpec& spec = *specs_[i];
    const RedistStepSpec& st = spec.forward[step];
    const at::Tensor x = xs[i].detach().contiguous();
    TORCH_CHECK(x.scalar_type() == xs.front().scalar_type(), "redistribution ", spec.edge,
                ": a grouped gather of ", xs.front().scalar_type(), " and ", x.scalar_type());
    TORCH_CHECK(st.gather_dim >= 0 && st.gather_dim < x.dim(), "redistribution ", spec.edge,
                ": gather dim ", st.gather_dim, " of a rank-", x.dim(), " tensor");
    Member m;
    m.local = x.sizes().vec();
    m.dim = st.gather_dim;
    m.sizes = st.group_sizes;
    if (m.sizes.empty()) m.sizes.assign(static_cast<size_t>(ranks_), x.size(m.dim));
    TORCH_CHECK(static_cast<int64_t>(m.sizes.size()) == ranks_ &&
                    m.sizes[static_cast<size_t>(comm.index())] == x.size(m.dim),
                "redistribution ", spec.edge, ": this rank's piece has ", x.size(m.dim),
                " along the gather dim, the program's group sizes disagree");
    for (int64_t d = 0; d < x.dim(); ++d)
      if (d != m.dim) m.row *= x.size(d);
    const int64_t slot = m.row * *std::max_element(m.sizes.begin(), m.sizes.end());
    m.offset = total;
    total += slot;
    flat.push_back(x.reshape({-1}));
    if (x.numel() < slot) flat.push_back(at::zeros({slot - x.numel()}, x.options()));
    members_.push_back(std::move(m));
  }
  at::Tensor buffer = at::cat(flat);
  const std::vector<int64_t> sizes(static_cast<size_t>(ranks_), total);
  if (async)
    pending_ = comm.allGatherAsync(buffer, 0, sizes);
  else
    gathered_ = comm.allGather(buffer, 0, sizes);
}

std::vector<at::Tensor> GroupedGather::finish(size_t step) {
  if (pending_) {
    gathered_ = pending_->wait();
    pending_.reset();
  }
  at::NoGradGuard no_grad;
  at::Tensor rows = gathered_.view({ranks_, -1});
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < members_.size(); ++i) {
    const Member& m = members_[i];
    std::vector<at::Tensor> pieces;
    for (int64_t k = 0; k < ranks_; ++k) {
      std::vector<int64_t> shape = m.local;
      shape[static_cast<size_t>(m.dim)] = m.sizes[static_cast<size_t>(k)];
      pieces.push_back(
          rows[k].narrow(0, m.offset, m.row * m.sizes[static_cast<size_t>(k)]).view(shape));
    }
    at::Tensor full = at::cat(pieces, m.dim);
    const RedistStepSpec& st = specs_[i]->forward[step];
    TORCH_CHECK(st.local_out.empty() || full.sizes().vec() == st.local_out, "redistribution ",
                specs_[i]->edge, ": the grouped gather gave shape ", full.sizes(), ", expected ",
                at::IntArrayRef(st.local_out));
    out.push_back(std::move(full));
  }
  gathered_ = at::Tensor();
  return out;
}

const std::vector<at::Tensor>& GroupedGather::wait() {
  if (done_) return results_;
  std::vector<at::Tensor> pieces = finish(0);
  for (size_t step = 1; step < specs_.front()->forward.size(); ++step) {
    begin(step, pieces, false);
    pieces = finish(step);
  }
  results_ = std::move(pieces);
  done_ = true;
  return results_;
}

namespace {

/// One reduce-scatter, or an all-reduce then a local slice on its mesh dim, along a static dim.
bool isSingleGroupedGradient(const RedistSpec& spec) {
  const std::vector<RedistStepSpec>& b = spec.backward;
  if (b.size() == 1)
    return b[0].kind == StepKind::kReduceScatter && !b[0].isDynamic(b[0].shard_dim);
  return b.size() == 2 && b[0].kind == StepKind::kAllReduce && b[1].kind == StepKind::kLocalSlice &&
         b[0].mesh_dim == b[1].mesh_dim && b[1].shard_dim >= 0 && !b[1].isDynamic(b[1].shard_dim);
}

}  // namespace

bool isGradientChain(const RedistSpec& spec) {
  if (spec.backward.size() < 2 || isSingleGroupedGradient(spec)) return false;
  bool collective = false;
  for (const RedistStepSpec& s : spec.backward) {
    switch (s.kind) {
      case StepKind::kAllReduce:
        collective = true;
        break;
      case StepKind::kReduceScatter:
        collective = true;
        [[fallthrough]];
      case StepKind::kLocalSlice:
        if (s.shard_dim < 0 || s.isDynamic(s.shard_dim)) return false;
        break;
      default:
        return false;
    }
  }
  return collective;
}

bool isGroupedGradient(const RedistSpec& spec) {
  return isSingleGroupedGradient(spec) || isGradientChain(spec);
}

namespace {

/// The full gradient a grouped reduction takes for `spec`: `g`, or zeros of its shape (the
/// backward's local_in, else the forward's local_out) when no gradient came.
at::Tensor gradientOrZeros(const at::Tensor& g, const RedistSpec& spec,
                           const at::TensorOptions& options) {
  if (g.defined()) return g;
  const RedistStepSpec& b = spec.backward.front();
  return at::zeros(b.local_in.empty() ? spec.forward.front().local_out : b.local_in, options);
}

}  // namespace

GroupedReduceScatter::GroupedReduceScatter(std::vector<const RedistSpec*> specs,
                                           const std::vector<at::Tensor>& grads,
                                           at::ScalarType reduce, World& world, bool async) {
  TORCH_CHECK(!specs.empty() && specs.size() == grads.size(), "a grouped reduce-scatter of ",
              specs.size(), " redistributions on ", grads.size(), " gradients");
  at::NoGradGuard no_grad;
  const RedistStepSpec& first = specs.front()->backward.front();
  Communicator& comm = world.dim(first.mesh_dim);
  const int64_t p = comm.size(), me = comm.index();
  at::TensorOptions options = at::TensorOptions().dtype(reduce);
  for (const at::Tensor& g : grads)
    if (g.defined()) options = options.device(g.device());
  // A chain (every member's the same steps): step by step, each collective one call.
  if (std::any_of(specs.begin(), specs.end(),
                  [](const RedistSpec* s) { return isGradientChain(*s); })) {
    const RedistSpec& head = *specs.front();
    for (const RedistSpec* spec : specs) {
      bool same = isGradientChain(*spec) && spec->backward.size() == head.backward.size();
      for (size_t j = 0; same && j < head.backward.size(); ++j)
        same = spec->backward[j].kind == head.backward[j].kind &&
               spec->backward[j].mesh_dim == head.backward[j].mesh_dim &&
               spec->backward[j].reduce_op == head.backward[j].reduce_op;
      TORCH_CHECK(same, "redistribution ", spec->edge, " cannot join a grouped gradient with ",
                  head.edge, " (not the same steps)");
    }
    chain_ = specs;
    world_ = &world;
    std::vector<at::Tensor> pieces;
    for (size_t i = 0; i < specs.size(); ++i)
      pieces.push_back(gradientOrZeros(grads[i], *specs[i], options).to(reduce).contiguous());
    runChain(0, std::move(pieces), async);
    return;
  }
  // One all-reduce when any member takes its gradient by an all-reduce then a slice (a mixed
  // group: every member's chunk is cut from the all-reduced sum, as a reduce-scatter gives it).
  all_reduce_ = std::any_of(specs.begin(), specs.end(), [](const RedistSpec* s) {
    return s->backward.front().kind == StepKind::kAllReduce;
  });
  if (all_reduce_) {
    // One all-reduce of the full gradients concatenated; each then cut to this rank's chunk.
    std::vector<at::Tensor> flat;
    int64_t flat_total = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      const RedistSpec& spec = *specs[i];
      TORCH_CHECK(isGroupedGradient(spec) && spec.backward.front().mesh_dim == first.mesh_dim &&
                      spec.backward.front().reduce_op == first.reduce_op,
                  "redistribution ", spec.edge, " cannot join a grouped all-reduce");
      // The dim this rank's chunk is cut along: the slice's, or the reduce-scatter's.
      const RedistStepSpec& cut = spec.backward.back();
      const at::Tensor g = gradientOrZeros(grads[i], spec, options);
      TORCH_CHECK(cut.shard_dim < g.dim(), "redistribution ", spec.edge, ": shard dim ",
                  cut.shard_dim, " of a rank-", g.dim(), " gradient");
      Member m;
      m.full = g.sizes().vec();
      m.dim = cut.shard_dim;
      const int64_t n = g.size(m.dim);
      m.chunk_offset = mesh::chunkOffset(n, p, me);
      m.piece = m.full;
      m.piece[static_cast<size_t>(m.dim)] = mesh::chunkSize(n, p, me);
      m.offset = flat_total;
      flat_total += g.numel();
      flat.push_back(g.to(reduce).contiguous().reshape({-1}));
      members_.push_back(std::move(m));
    }
    at::Tensor buffer = at::cat(flat);
    if (async) {
      pending_ = comm.allReduceAsync(buffer, first.reduce_op);
    } else {
      comm.allReduce(buffer, first.reduce_op);
      reduced_ = buffer;
    }
    return;
  }
  std::vector<at::Tensor> gs;
  std::vector<int64_t> dims;
  for (size_t i = 0; i < specs.size(); ++i) {
    const RedistSpec& spec = *specs[i];
    TORCH_CHECK(spec.backward.size() == 1 &&
                    spec.backward.front().kind == layout::StepKind::kReduceScatter &&
                    spec.backward.front().mesh_dim == first.mesh_dim &&
                    spec.backward.front().reduce_op == first.reduce_op,
                "redistribution ", spec.edge, " cannot join a grouped reduce-scatter");
    const RedistStepSpec& st = spec.backward.front();
    const at::Tensor g = gradientOrZeros(grads[i], spec, options);
    TORCH_CHECK(st.shard_dim >= 0 && st.shard_dim < g.dim(), "redistribution ", spec.edge,
                ": shard dim ", st.shard_dim, " of a rank-", g.dim(), " gradient");
    gs.push_back(g.to(reduce).contiguous());
    dims.push_back(st.shard_dim);
  }
  at::Tensor buffer = layOutChunks(gs, dims, p, me);
  if (async)
    pending_ = comm.reduceScatterAsync(buffer, 0, first.reduce_op);
  else
    reduced_ = comm.reduceScatter(buffer, 0, first.reduce_op);
}

at::Tensor GroupedReduceScatter::layOutChunks(const std::vector<at::Tensor>& grads,
                                              const std::vector<int64_t>& dims, int64_t p,
                                              int64_t me) {
  members_.clear();
  int64_t total = 0;
  bool padded = false;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    const int64_t dim = dims[i], n = g.size(dim);
    int64_t row = 1;
    for (int64_t d = 0; d < g.dim(); ++d)
      if (d != dim) row *= g.size(d);
    rows.push_back(row);
    padded = padded || mesh::chunkSize(n, p, p - 1) != mesh::chunkSize(n, p, 0);
    Member m;
    m.piece = g.sizes().vec();
    m.piece[static_cast<size_t>(dim)] = mesh::chunkSize(n, p, me);
    m.offset = total;
    total += row * mesh::chunkSize(n, p, 0);  // torch.chunk: the first chunk is the largest
    members_.push_back(std::move(m));
  }
  const at::TensorOptions options = grads.front().options();
  at::Tensor buffer = padded ? at::zeros({p, total}, options) : at::empty({p, total}, options);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    const int64_t dim = dims[i], n = g.size(dim);
    for (int64_t k = 0; k < p; ++k) {
      const int64_t c = mesh::chunkSize(n, p, k);
      if (c == 0) continue;
      std::vector<int64_t> shape = g.sizes().vec();
      shape[static_cast<size_t>(dim)] = c;
      buffer[k]
          .narrow(0, members_[i].offset, rows[i] * c)
          .view(shape)
          .copy_(g.narrow(dim, mesh::chunkOffset(n, p, k), c));
    }
  }
  return buffer;
}

std::vector<at::Tensor> GroupedReduceScatter::cutPieces(const at::Tensor& flat) const {
  at::Tensor row = flat.reshape({-1});
  std::vector<at::Tensor> out;
  for (const Member& m : members_) {
    int64_t numel = 1;
    for (int64_t s : m.piece) numel *= s;
    out.push_back(row.narrow(0, m.offset, numel).view(m.piece));
  }
  return out;
}

void GroupedReduceScatter::runChain(size_t step, std::vector<at::Tensor> pieces, bool async) {
  at::NoGradGuard no_grad;
  const std::vector<RedistStepSpec>& head = chain_.front()->backward;
  for (size_t j = step; j < head.size(); ++j) {
    Communicator& comm = world_->dim(head[j].mesh_dim);
    const int64_t p = comm.size(), me = comm.index();
    std::vector<int64_t> dims;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const RedistStepSpec& s = chain_[i]->backward[j];
      TORCH_CHECK(s.kind == StepKind::kAllReduce || s.shard_dim < pieces[i].dim(),
                  "redistribution ", chain_[i]->edge, ": shard dim ", s.shard_dim, " of a rank-",
                  pieces[i].dim(), " gradient");
      dims.push_back(s.shard_dim);
    }
    if (head[j].kind == StepKind::kLocalSlice) {
      for (size_t i = 0; i < pieces.size(); ++i) {
        const int64_t n = pieces[i].size(dims[i]);
        pieces[i] = pieces[i]
                        .narrow(dims[i], mesh::chunkOffset(n, p, me), mesh::chunkSize(n, p, me))
                        .contiguous();
      }
      continue;
    }
    at::Tensor buffer;
    if (head[j].kind == StepKind::kAllReduce) {
      // ONE all-reduce of the members' pieces concatenated.
      members_.clear();
      std::vector<at::Tensor> flat;
      int64_t total = 0;
      for (const at::Tensor& t : pieces) {
        Member m;
        m.piece = t.sizes().vec();
        m.offset = total;
        total += t.numel();
        flat.push_back(t.reshape({-1}));
        members_.push_back(std::move(m));
      }
      buffer = at::cat(flat);
      if (async) {
        pending_ = comm.allReduceAsync(buffer, head[j].reduce_op);
        chain_step_ = j;
        return;
      }
      comm.allReduce(buffer, head[j].reduce_op);
    } else {
      at::Tensor chunks = layOutChunks(pieces, dims, p, me);
      if (async) {
        pending_ = comm.reduceScatterAsync(chunks, 0, head[j].reduce_op);
        chain_step_ = j;
        return;
      }
      buffer = comm.reduceScatter(chunks, 0, head[j].reduce_op);
    }
    pieces = cutPieces(buffer);
  }
  results_ = std::move(pieces);
  done_ = true;
}

const std::vector<at::Tensor>& GroupedReduceScatter::wait() {
  if (done_) return results_;
  if (!chain_.empty()) {
    const at::Tensor reduced = pending_->wait();
    pending_.reset();
    runChain(chain_step_ + 1, cutPieces(reduced), false);
    return results_;
  }
  if (pending_) {
    reduced_ = pending_->wait();
    pending_.reset();
  }
  at::Tensor row = reduced_.reshape({-1});
  if (all_reduce_) {
    at::NoGradGuard no_grad;
    for (const Member& m : members_) {
      int64_t numel = 1;
      for (int64_t s : m.full) numel *= s;
      results_.push_back(row.narrow(0, m.offset, numel)
                             .view(m.full)
                             .narrow(m.dim, m.chunk_offset, m.piece[static_cast<size_t>(m.dim)])
                             .clone(at::MemoryFormat::Contiguous));  // the full buffer is freed
    }
    reduced_ = at::Tensor();
    done_ = true;
    return results_;
  }
  results_ = cutPieces(reduced_);
  reduced_ = at::Tensor();
  done_ = true;
  return results_;
}

RedistSpec opCollectiveSpec(const std::vector<size_t>& mesh_dims, const std::string& label) {
  RedistSpec spec;
  for (size_t m : mesh_dims) {
    RedistStepSpec step;
    step.kind = StepKind::kAllReduce;
    step.mesh_dim = m;
    spec.forward.push_back(step);
    spec.backward.push_back(step);
  }
  spec.requires_grad = true;
  spec.edge = label + " (op collective)";
  return spec;
}

at::Tensor gatherTensor(const at::Tensor& local, const mesh::PlacementTuple& placement,
                        const std::vector<int64_t>& global_sizes, World& world) {
  at::NoGradGuard no_grad;
  const mesh::DeviceMesh& mesh = world.mesh();
  const std::vector<int64_t> coordinate = world.coordinate();
  mesh::PlacementTuple t = placement;
  at::Tensor x = local.contiguous();
  std::vector<int64_t> known = global_sizes;  // memberSizes reads one dim; the others must be >= 0
  for (int64_t& n : known) n = std::max<int64_t>(n, 0);
  for (size_t i = t.size(); i-- > 0;) {
    if (t[i].isShard()) {
      const int d = t[i].dim();
      x = world.dim(i).allGather(x, d,
                                 global_sizes.at(static_cast<size_t>(d)) < 0
                                     ? exchangeSizes(world.dim(i), x, d)
                                     : memberSizes(known, t, mesh, coordinate, i, d));
      t[i] = mesh::Placement::replicate();
    } else if (t[i].isPartial()) {
      x = x.clone(at::MemoryFormat::Contiguous);
      world.dim(i).allReduce(x, t[i].reduceOp());
      t[i] = mesh::Placement::replicate();
    }
  }
  return x;
}

at::Tensor gatherToFull(const at::Tensor& local, const mesh::PlacementTuple& placement,
                        const std::vector<int64_t>& global_sizes, World& world) {
  if (!local.requires_grad()) return gatherTensor(local, placement, global_sizes, world);
  return GatherFunction::apply(local, &placement, &global_sizes, &world);
}

at::Tensor localPieceOf(const at::Tensor& full, const mesh::PlacementTuple& placement,
                        const mesh::DeviceMesh& mesh, const std::vector<int64_t>& coordinate) {
  std::vector<int64_t> sizes(full.sizes().begin(), full.sizes().end());
  std::vector<layout::DimPiece> piece = layout::localPiece(sizes, placement, mesh, coordinate);
  at::Tensor t = full;
  for (size_t d = 0; d < piece.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), piece[d].offset, piece[d].size);
  return t.contiguous();
}

}  // namespace apc::runtime
