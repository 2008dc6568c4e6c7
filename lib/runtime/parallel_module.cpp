//===- lib/runtime/parallel_module.cpp - A rank's piece of a sharded model --===//
//
// Artifact loading, shard allocation and weight loading, the forward through the interpreter with
// redistribute nodes as autograd functions, gradient gathering and clipping
// (see apc/runtime/parallel_module.h).
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/parallel_module.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "apc.pb.h"
#include "apc/artifact/artifact.h"
#include "apc/artifact/typed_proto.h"
#include "apc/ir/proto_io.h"
#include "apc/ir/torch_dtype.h"
#include "apc/layout/layout.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/op_collective.h"
#include "apc/runtime/output_leaves.h"
#include "apc/runtime/redistribute.h"
#include "apc/support/hash.h"
#include "parallel_module_reader.h"

namespace apc::runtime {

std::vector<int64_t> PlacedTensor::localShape() const {
  std::vector<int64_t> s;
  for (const layout::DimPiece& p : local) s.push_back(p.size);
  return s;
}

namespace {

Expected<at::ScalarType> scalarType(const std::string& name) {
  auto d = ir::parseDType(name);
  if (!d || *d == ir::DType::kUnknown) return parseError("unknown dtype '" + name + "'");
  return scalarTypeOf(*d);
}

// The program came through artifact::readProgram, whose checkProgramEnums checked every typed
// field (each placement converts and has one entry per mesh dim, each step's kind, mesh dim and
// reduce op): the conversions below cannot fail on it; they still pass an error on, never crash.
Expected<mesh::PlacementTuple> placementOf(const artifact::PlacementField& p,
                                           const std::string& what) {
  auto t = artifact::placementFromProto(p);
  if (!t.ok()) return parseError(what + ": " + t.error().message());
  return t;
}

Expected<PlacedTensor> placedTensor(const proto::ProgramTensor& p) {
  PlacedTensor t;
  t.name = p.name();
  for (const proto::Dim& d : p.global_shape()) {
    t.global_shape.push_back(d.size());
    t.symbols.push_back(d.symbol());
  }
  APC_ASSIGN_OR_RETURN(t.dtype, scalarType(p.dtype()));
  t.storage_dtype = t.dtype;
  if (!p.storage_dtype().empty()) {
    APC_ASSIGN_OR_RETURN(t.storage_dtype, scalarType(p.storage_dtype()));
  }
  APC_ASSIGN_OR_RETURN(t.placement, placementOf(p.placement(), "tensor " + p.name()));
  for (const proto::Piece& piece : p.local()) t.local.push_back({piece.offset(), piece.size()});
  if (t.local.size() != t.global_shape.size())
    return parseError("tensor " + p.name() + ": " + std::to_string(t.local.size()) +
                      " local pieces for rank " + std::to_string(t.global_shape.size()));
  t.requires_grad = p.requires_grad();
  t.value = p.value();
  return t;
}

Expected<RedistStepSpec> stepSpec(const proto::RedistStep& p) {
  RedistStepSpec s;
  APC_ASSIGN_OR_RETURN(s.kind, artifact::stepKindFromProto(p.kind()));
  s.mesh_dim = p.mesh_dim();
  s.gather_dim = p.gather_dim();
  s.shard_dim = p.shard_dim();
  // Only the reducing steps carry an op; the others ignore theirs.
  if (s.kind == layout::StepKind::kAllReduce || s.kind == layout::StepKind::kReduceScatter) {
    APC_ASSIGN_OR_RETURN(s.reduce_op, artifact::reduceOpFromProto(p.reduce_op()));
  }
  s.local_in.assign(p.local_in().begin(), p.local_in().end());
  s.local_out.assign(p.local_out().begin(), p.local_out().end());
  s.group_sizes.assign(p.group_sizes().begin(), p.group_sizes().end());
  s.priced_bytes = p.priced_bytes();
  s.dynamic.assign(p.dynamic().begin(), p.dynamic().end());
  return s;
}

Expected<RedistSpec> redistSpec(const proto::Redistribution& p) {
  RedistSpec r;
  r.edge = p.edge();
  r.requires_grad = p.requires_grad();
  for (const proto::RedistStep& s : p.forward()) {
    APC_ASSIGN_OR_RETURN(RedistStepSpec step, stepSpec(s));
    r.forward.push_back(std::move(step));
  }
  for (const proto::RedistStep& s : p.backward()) {
    APC_ASSIGN_OR_RETURN(RedistStepSpec step, stepSpec(s));
    r.backward.push_back(std::move(step));
  }
  return r;
}

/// The program's graph as an ir::Graph: redistribute nodes become op nodes (marked external).
Expected<ir::Graph> programGraph(const proto::Program& program) {
  return ir::deserializeProgramGraph(program.graph().SerializeAsString());
}

int64_t wireBytes(const RedistStepSpec& s, const mesh::DeviceMesh& mesh) {
  const int64_t p = mesh.size(s.mesh_dim);
  switch (s.kind) {
    case layout::StepKind::kAllGather:
    case layout::StepKind::kReduceScatter:
      return s.priced_bytes * (p - 1) / p;
    case layout::StepKind::kAllReduce:
      return 2 * s.priced_bytes * (p - 1) / p;
    case layout::StepKind::kAllToAll:
      return s.priced_bytes * (p - 1) / (p * p);
    case layout::StepKind::kLocalSlice:
      return 0;
  }
  return 0;
}

/// wireBytes of a step in a grouped gather or reduce-scatter (GroupedGather,
/// GroupedReduceScatter): every member's piece padded to the largest one.
int64_t paddedWireBytes(const RedistStepSpec& s, const mesh::DeviceMesh& mesh) {
  const int64_t p = mesh.size(s.mesh_dim);
  int64_t n = 0, most = 0;
  if (s.kind == layout::StepKind::kAllGather) {
    for (int64_t k : s.group_sizes) {
      n += k;
      most = std::max(most, k);
    }
  } else if (s.kind == layout::StepKind::kReduceScatter && s.shard_dim >= 0 &&
             static_cast<size_t>(s.shard_dim) < s.local_in.size()) {
    n = s.local_in[static_cast<size_t>(s.shard_dim)];
    most = mesh::chunkSize(n, p, 0);
  }
  if (n <= 0 || most * p == n) return wireBytes(s, mesh);
  return s.priced_bytes / n * most * (p - 1);
}

static_assert(kDefaultGradBucketBytes == artifact::kDefaultGradBucketBytes,
              "the runtime's default bucket is the one lowering's prediction assumes");
static_assert(kFirstGradBucketBytes == artifact::kFirstGradBucketBytes,
              "the runtime's default first bucket is the one lowering's prediction assumes");

}  // namespace

/// The gradient buckets of ParallelModuleOptions::grad_bucket_bytes. A deferred edge's backward
/// hands its gradient here instead of reducing it (and feeds autograd nothing). Gradients of the
/// same (mesh dim, op, dtypes) are summed per parameter, concatenated into flat buckets of at most
/// `bucket_bytes`, all-reduced once per bucket, and added to the parameters' grads.
///
/// With overlap (ParallelModuleOptions::overlap), the buckets are laid out when the backward's
/// first gradient arrives, from the deferred edges the forward ran (expect()): parameters in
/// reverse program order (the order backward reaches them), each (key, parameter) expecting as many
/// gradients as the forward ran edges for it. A bucket whose gradients have all arrived is
/// all-reduced asynchronously (allReduceAsync: c10d's Work handle) while backward goes on, buckets
/// strictly in layout order, so that every rank issues them in the same order. The engine callback
/// queued by the first gradient runs when the backward's graph has been executed: it issues the
/// buckets still waiting (a gradient that never came: its slot is zeros, its parameter gets no
/// grad), waits for every bucket in order (each wait with the communicator's timeout) and adds the
/// results to the grads. A gradient that comes for a bucket already issued (a second backward
/// through retained graphs, two forwards before one backward) is reduced on its own at the callback
/// (the all-reduce is linear). Without overlap, every bucket is laid out and reduced at the
/// callback, blocking, parameters in program order. Every rank runs the same program, so the
/// layouts and the order of the collectives match.
class GradBuckets {
 public:
  GradBuckets(World& world, std::vector<at::Tensor>& params, const std::vector<RedistSpec>& redists,
              int64_t bucket_bytes, int64_t first_bucket_bytes, bool overlap)
      : world_(world),
        params_(params),
        redists_(redists),
        bucket_bytes_(bucket_bytes),
        first_bucket_bytes_(first_bucket_bytes > 0 ? std::min(first_bucket_bytes, bucket_bytes)
                                                   : bucket_bytes),
        overlap_(overlap) {}

  /// The forward ran deferred edge `redist` of parameter `param` on `x` (its gradient will have
  /// x's shape and dtype).
  void expect(size_t param, size_t redist, const at::Tensor& x) {
    if (!overlap_) return;
    Expect& e = expected_[{keyOf(redist, x.scalar_type()), param}];
    ++e.edges;
    e.numel = x.numel();
    e.sizes = x.sizes().vec();
  }

  /// Queues the end-of-backward callback on the backward running now (AsyncGrads::arm).
  void arm() {
    if (queued_) return;
    queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { flush(); });
  }

  void defer(size_t param, size_t redist, const at::Tensor& grad) {
    arm();
    if (!overlap_) {
      if (grad.defined()) late_.push_back({param, redist, grad});
      return;
    }
    if (!laid_out_) layOut();
    const Key key = keyOf(redist, grad.defined() ? grad.scalar_type() : paramDtype(param));
    auto it = slot_.find({key, param});
    if (it == slot_.end() || buckets_[it->second.first].issued) {
      if (grad.defined()) late_.push_back({param, redist, grad});
      return;
    }
    Bucket& b = buckets_[it->second.first];
    Entry& en = b.entries[it->second.second];
    if (grad.defined()) en.grad = en.grad.defined() ? en.grad + grad : grad;
    if (--en.waiting == 0 && --b.waiting == 0) issueReady();
  }

  /// Drops what an interrupted backward left (called before every forward); issued collectives
  /// finish on their own.
  void reset() {
    expected_.clear();
    clearBackward();
  }

 private:
  // The all-reduces' mesh dims in order (a replicated parameter of a 2-d data-parallel mesh
  // reduces on each), op, reduce dtype, grad dtype.
  using Key = std::tuple<std::vector<size_t>, int, int, int>;
  struct Expect {
    int edges = 0;
    int64_t numel = 0;
    std::vector<int64_t> sizes;
  };
  struct Entry {
    size_t param = 0;
    int64_t numel = 0;
    std::vector<int64_t> sizes;
    int waiting = 0;  // gradients still to come
    at::Tensor grad;  // their sum so far
  };
  struct Bucket {
    Key key;
    std::vector<Entry> entries;
    int waiting = 0;  // entries still waiting for a gradient
    bool issued = false;
    at::Tensor flat;
    std::unique_ptr<PendingCollective> pending;
  };
  struct Late {
    size_t param;
    size_t redist;
    at::Tensor grad;
  };

  Key keyOf(size_t redist, at::ScalarType grad_dtype) const {
    const RedistSpec& r = redists_[redist];
    const RedistStepSpec& st = r.backward.front();
    const at::ScalarType rd = r.reduce_dtype.value_or(grad_dtype);
    std::vector<size_t> dims;
    for (const RedistStepSpec& s : r.backward) dims.push_back(s.mesh_dim);
    return Key{std::move(dims), static_cast<int>(st.reduce_op), static_cast<int>(rd),
               static_cast<int>(grad_dtype)};
  }
  at::ScalarType paramDtype(size_t param) const { return params_[param].scalar_type(); }

  /// Buckets from the expected gradients: parameters in reverse program order, one open bucket per
  /// key, closed when the next entry would pass bucket_bytes (first_bucket_bytes for a key's first
  /// bucket, as DDP's); the layout order is the order of closing (then the open ones, in key
  /// order).
  void layOut() {
    laid_out_ = true;
    std::vector<std::pair<std::pair<Key, size_t>, const Expect*>> order;
    for (const auto& [kp, e] : expected_) order.push_back({kp, &e});
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first.second > b.first.second; });
    std::map<Key, Bucket> open;
    std::map<Key, int64_t> open_bytes;
    std::set<Key> closed;  // keys with a bucket closed: their next buckets take bucket_bytes
    auto close = [&](const Key& key) {
      auto it = open.find(key);
      if (it == open.end()) return;
      Bucket& b = it->second;
      b.waiting = static_cast<int>(b.entries.size());
      for (size_t i = 0; i < b.entries.size(); ++i)
        slot_[{key, b.entries[i].param}] = {buckets_.size(), i};
      buckets_.push_back(std::move(b));
      open.erase(it);
      open_bytes.erase(key);
      closed.insert(key);
    };
    for (const auto& [kp, e] : order) {
      const Key& key = kp.first;
      const int64_t bytes =
          e->numel *
          static_cast<int64_t>(c10::elementSize(static_cast<at::ScalarType>(std::get<2>(key))));
      const int64_t cap = closed.count(key) ? bucket_bytes_ : first_bucket_bytes_;
      if (open.count(key) && open_bytes[key] + bytes > cap) close(key);
      Bucket& b = open[key];
      b.key = key;
      b.entries.push_back({kp.second, e->numel, e->sizes, e->edges, at::Tensor()});
      open_bytes[key] += bytes;
    }
    while (!open.empty()) close(open.begin()->first);
  }

  /// Issues, in layout order, every bucket from the next one on whose gradients have all come.
  void issueReady() {
    while (next_ < buckets_.size() && buckets_[next_].waiting == 0) issue(buckets_[next_++]);
  }

  void issue(Bucket& b) {
    at::NoGradGuard no_grad;
    b.issued = true;
    const auto reduce = static_cast<at::ScalarType>(std::get<2>(b.key));
    std::vector<at::Tensor> flat;
    for (const Entry& e : b.entries)
      flat.push_back(e.grad.defined()
                         ? e.grad.to(reduce).contiguous().reshape({-1})
                         : at::zeros({e.numel}, params_[e.param].options().dtype(reduce)));
    b.flat = flat.size() == 1 ? flat[0].clone() : at::cat(flat);
    b.pending = world_.dim(std::get<0>(b.key).front())
                    .allReduceAsync(b.flat, static_cast<mesh::ReduceOp>(std::get<1>(b.key)));
  }

  /// Waits for an issued bucket (and runs its all-reduces on its further mesh dims) and adds its
  /// pieces to the grads of the parameters that got one.
  void finish(Bucket& b) {
    b.pending->wait();
    at::NoGradGuard no_grad;
    const std::vector<size_t>& dims = std::get<0>(b.key);
    for (size_t i = 1; i < dims.size(); ++i)
      world_.dim(dims[i]).allReduce(b.flat, static_cast<mesh::ReduceOp>(std::get<1>(b.key)));
    int64_t offset = 0;
    for (const Entry& e : b.entries) {
      at::Tensor r = b.flat.narrow(0, offset, e.numel);
      offset += e.numel;
      if (!e.grad.defined()) continue;
      r = r.view(e.grad.sizes());
      addGrad(e.param,
              r.scalar_type() == e.grad.scalar_type() ? r.clone() : r.to(e.grad.scalar_type()));
    }
  }

  void addGrad(size_t param, const at::Tensor& r) {
    at::Tensor& grad = params_[param].mutable_grad();
    if (grad.defined())
      grad.add_(r);
    else
      grad = r;
  }

  void clearBackward() {
    buckets_.clear();
    slot_.clear();
    late_.clear();
    next_ = 0;
    laid_out_ = false;
    queued_ = false;
  }

  void flush() {
    queued_ = false;
    // Buckets with a gradient that never came go now, in order; then every wait, in order.
    while (next_ < buckets_.size()) issue(buckets_[next_++]);
    for (Bucket& b : buckets_) finish(b);
    reduceLate();
    clearBackward();
    expected_.clear();
  }

  /// The gradients outside the layout (all of them without overlap), reduced now, blocking:
  /// summed per (key, parameter), in buckets per key, parameters in program order.
  void reduceLate() {
    std::vector<Late> items = std::move(late_);
    late_.clear();
    if (items.empty()) return;
    at::NoGradGuard no_grad;
    std::map<std::pair<Key, size_t>, at::Tensor> summed;  // (key, param) -> gradient
    for (const Late& p : items) {
      at::Tensor& g = summed[{keyOf(p.redist, p.grad.scalar_type()), p.param}];
      g = g.defined() ? g + p.grad : p.grad;
    }
    std::map<Key, std::vector<std::pair<size_t, at::Tensor>>> by_key;
    for (auto& [kp, g] : summed) by_key[kp.first].push_back({kp.second, g});
    for (auto& [key, grads] : by_key) {
      const auto& [dims, op, rd, gd] = key;
      const auto reduce = static_cast<at::ScalarType>(rd);
      const int64_t elem = static_cast<int64_t>(c10::elementSize(reduce));
      size_t begin = 0;
      while (begin < grads.size()) {
        size_t end = begin;
        int64_t bytes = 0;
        while (end < grads.size() &&
               (end == begin || bytes + grads[end].second.numel() * elem <= bucket_bytes_)) {
          bytes += grads[end].second.numel() * elem;
          ++end;
        }
        std::vector<at::Tensor> flat;
        for (size_t i = begin; i < end; ++i)
          flat.push_back(grads[i].second.to(reduce).contiguous().reshape({-1}));
        at::Tensor bucket = flat.size() == 1 ? flat[0].clone() : at::cat(flat);
        for (size_t mesh_dim : dims)
          world_.dim(mesh_dim).allReduce(bucket, static_cast<mesh::ReduceOp>(op));
        int64_t offset = 0;
        for (size_t i = begin; i < end; ++i) {
          const at::Tensor& g = grads[i].second;
          at::Tensor r = bucket.narrow(0, offset, g.numel()).view(g.sizes());
          offset += g.numel();
          addGrad(grads[i].first,
                  r.scalar_type() == g.scalar_type() ? r.clone() : r.to(g.scalar_type()));
        }
        begin = end;
      }
    }
  }

  World& world_;
  std::vector<at::Tensor>& params_;
  const std::vector<RedistSpec>& redists_;
  int64_t bucket_bytes_;
  int64_t first_bucket_bytes_;  // at most bucket_bytes_
  bool overlap_;
  std::map<std::pair<Key, size_t>, Expect> expected_;  // (key, param) -> the forward's edges
  std::vector<Bucket> buckets_;                        // the layout of this backward
  std::map<std::pair<Key, size_t>, std::pair<size_t, size_t>> slot_;  // -> (bucket, entry)
  size_t next_ = 0;                                                   // the next bucket to issue
  std::vector<Late> late_;
  bool laid_out_ = false;
  bool queued_ = false;
};

/// FSDP's gradient reductions run behind the rest of backward (ParallelModuleOptions::overlap): the
/// backward of a parameter's gather (AsyncGradFunction) issues its reduce-scatter asynchronously
/// and hands the handle here instead of feeding autograd a gradient; the engine callback queued by
/// the first one runs when the backward's graph has been executed and waits for every one, in the
/// order they were issued (the same on every rank: autograd's order), each with the collective
/// timeout, adding the pieces to the parameters' grads.
///
/// The gradients of a gather group (artifact::paramGatherGroups, every member's backward one
/// reduce-scatter) are reduced together: the forward counts each member's gathers (expect), the
/// backward sums each member's gradients, and the group's last expected gradient issues ONE
/// reduce-scatter of all of them (GroupedReduceScatter, asynchronous). A gradient that comes for a
/// group already issued (a second backward through a retained graph) is reduce-scattered on its
/// own at once; a group still missing gradients when backward ends is issued by the callback
/// (groups in order; a member whose gradient never came is zeros there and gets no grad), before
/// the waits. Every rank's autograd reaches the gradients in the same order, so the collectives
/// match.
class AsyncGrads {
 public:
  /// A gather group's members: the parameter and redistribution of each.
  struct GroupMember {
    size_t param;
    const RedistSpec* spec;
  };

  /// `blocking` (no overlap): a group's reduce-scatter runs when its last gradient comes, and
  /// returns when it is done (the gradients of a group are still reduced in one call).
  AsyncGrads(std::vector<at::Tensor>& params, World& world, bool blocking)
      : params_(params), world_(world), blocking_(blocking) {}

  /// The gather groups whose gradients are reduced together, by group index (empty: none).
  void setGroups(std::vector<std::vector<GroupMember>> groups) { groups_ = std::move(groups); }

  void add(size_t param, std::unique_ptr<PendingCollective> pending, at::ScalarType dtype) {
    queue();
    Item it;
    it.param = param;
    it.pending = std::move(pending);
    it.dtype = dtype;
    pending_.push_back(std::move(it));
  }

  /// Queues the end-of-backward callback now, on the backward running now: a checkpoint
  /// segment's recomputation calls it before its reentrant backward, whose own callbacks would run
  /// when the segment's gradients are done, not the step's.
  void arm() { queue(); }

  /// The forward ran member `member` of group `group`'s gather (its gradient will come).
  void expect(size_t group, size_t member) {
    GroupState& st = stateOf(group);
    ++st.expected[member];
  }

  /// Member `member` of group `group`'s gradient `g` (the full gradient of its gather).
  void addGrouped(size_t group, size_t member, const at::Tensor& g) {
    queue();
    GroupState& st = stateOf(group);
    if (st.issued || st.arrived[member] >= st.expected[member]) {
      // Late: reduced on its own (a group of one).
      if (!g.defined()) return;
      const GroupMember& m = groups_.at(group).at(member);
      Item it;
      it.params = {m.param};
      it.dtypes = {g.scalar_type()};
      it.group = std::make_unique<GroupedReduceScatter>(
          std::vector<const RedistSpec*>{m.spec}, std::vector<at::Tensor>{g},
          m.spec->reduce_dtype.value_or(g.scalar_type()), world_, !blocking_);
      pending_.push_back(std::move(it));
      return;
    }
    if (g.defined()) {
      st.grads[member] = st.grads[member].defined() ? st.grads[member] + g : g;
      st.dtypes[member] = g.scalar_type();
    }
    ++st.arrived[member];
    for (size_t i = 0; i < st.expected.size(); ++i)
      if (st.arrived[i] < st.expected[i]) return;
    issue(group, st);
  }

  /// Drops what an interrupted backward left (called before every forward).
  void reset() {
    pending_.clear();
    states_.clear();
    queued_ = false;
  }

 private:
  struct Item {
    size_t param = 0;
    std::unique_ptr<PendingCollective> pending;
    at::ScalarType dtype = at::kFloat;  // the gradient's (the reduction may run in another)
    /// A group's reduce-scatter instead: its members' parameters and gradient dtypes (nullopt:
    /// no gradient came, no grad).
    std::unique_ptr<GroupedReduceScatter> group;
    std::vector<size_t> params;
    std::vector<std::optional<at::ScalarType>> dtypes;
  };
  struct GroupState {
    std::vector<int> expected, arrived;
    std::vector<at::Tensor> grads;
    std::vector<std::optional<at::ScalarType>> dtypes;
    bool issued = false;
  };

  void queue() {
    if (queued_) return;
    queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { flush(); });
  }

  GroupState& stateOf(size_t group) {
    GroupState& st = states_[group];
    const size_t n = groups_.at(group).size();
    if (st.expected.size() != n) {
      st.expected.assign(n, 0);
      st.arrived.assign(n, 0);
      st.grads.assign(n, at::Tensor());
      st.dtypes.assign(n, std::nullopt);
    }
    return st;
  }

  void issue(size_t group, GroupState& st) {
    st.issued = true;
    const std::vector<GroupMember>& members = groups_.at(group);
    std::vector<const RedistSpec*> specs;
    std::optional<at::ScalarType> reduce = members.front().spec->reduce_dtype;
    Item it;
    for (size_t i = 0; i < members.size(); ++i) {
      specs.push_back(members[i].spec);
      it.params.push_back(members[i].param);
      if (!reduce && st.dtypes[i]) reduce = st.dtypes[i];
    }
    it.dtypes = st.dtypes;
    it.group = std::make_unique<GroupedReduceScatter>(
        std::move(specs), st.grads, reduce.value_or(params_[members.front().param].scalar_type()),
        world_, !blocking_);
    st.grads.assign(members.size(), at::Tensor());
    pending_.push_back(std::move(it));
  }

  void addGrad(size_t param, at::Tensor r, at::ScalarType dtype) {
    if (r.scalar_type() != dtype) r = r.to(dtype);
    at::Tensor& p = params_[param];
    TORCH_CHECK(r.sizes() == p.sizes(), "a reduce-scattered gradient has shape ", r.sizes(),
                ", its parameter ", p.sizes());
    at::Tensor& grad = p.mutable_grad();
    if (grad.defined())
      grad.add_(r);
    else
      grad = r;
  }

  void flush() {
    queued_ = false;
    // Groups still missing a gradient go now, in order (the same on every rank).
    for (auto& [group, st] : states_) {
      if (st.issued) continue;
      bool any = false;
      for (int a : st.arrived) any = any || a > 0;
      if (any) issue(group, st);
    }
    std::vector<Item> items = std::move(pending_);
    pending_.clear();
    states_.clear();
    at::NoGradGuard no_grad;
    for (Item& it : items) {
      if (it.group) {
        const std::vector<at::Tensor>& pieces = it.group->wait();
        for (size_t i = 0; i < pieces.size(); ++i)
          if (it.dtypes[i]) addGrad(it.params[i], pieces[i], *it.dtypes[i]);
        continue;
      }
      addGrad(it.param, it.pending->wait(), it.dtype);
    }
  }

  std::vector<at::Tensor>& params_;
  World& world_;
  bool blocking_;
  std::vector<std::vector<GroupMember>> groups_;
  std::map<size_t, GroupState> states_;  // this backward's groups
  std::vector<Item> pending_;
  bool queued_ = false;
};

namespace {

/// A parameter's gather whose backward is one reduce-scatter, with overlap: forward runs the
/// gather (or takes the prefetched result); backward issues the reduce-scatter asynchronously and
/// hands it to AsyncGrads, feeding autograd nothing.
struct AsyncGradFunction : public torch::autograd::Function<AsyncGradFunction> {
  /// `counted`: the gather's gradient is already expected (a checkpoint segment's forward counted
  /// it; this is the segment's recomputation).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const RedistSpec* spec, World* world, const at::Tensor* result,
                            AsyncGrads* sink, int64_t param, int64_t group, int64_t member,
                            bool counted) {
    ctx->saved_data["spec"] = reinterpret_cast<int64_t>(spec);
    ctx->saved_data["world"] = reinterpret_cast<int64_t>(world);
    ctx->saved_data["sink"] = reinterpret_cast<int64_t>(sink);
    ctx->saved_data["param"] = param;
    ctx->saved_data["group"] = group;
    ctx->saved_data["member"] = member;
    if (group >= 0 && !counted)
      sink->expect(static_cast<size_t>(group), static_cast<size_t>(member));
    return result->defined() ? *result : runSteps(spec->forward, x, *world, spec->edge);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto* spec = reinterpret_cast<const RedistSpec*>(ctx->saved_data["spec"].toInt());
    auto* world = reinterpret_cast<World*>(ctx->saved_data["world"].toInt());
    auto* sink = reinterpret_cast<AsyncGrads*>(ctx->saved_data["sink"].toInt());
    const at::Tensor& g = grads.at(0);
    if (const int64_t group = ctx->saved_data["group"].toInt(); group >= 0) {
      sink->addGrouped(static_cast<size_t>(group),
                       static_cast<size_t>(ctx->saved_data["member"].toInt()), g);
      return torch::autograd::variable_list(9);
    }
    const RedistStepSpec& st = spec->backward.front();
    at::Tensor in = spec->reduce_dtype && *spec->reduce_dtype != g.scalar_type()
                        ? g.to(*spec->reduce_dtype)
                        : g.contiguous();
    sink->add(static_cast<size_t>(ctx->saved_data["param"].toInt()),
              world->dim(st.mesh_dim).reduceScatterAsync(in, st.shard_dim, st.reduce_op),
              g.scalar_type());
    return torch::autograd::variable_list(9);
  }
};

/// A deferred parameter edge: the identity forward; backward hands the gradient to the buckets.
struct DeferredGradFunction : public torch::autograd::Function<DeferredGradFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            GradBuckets* buckets, int64_t param, int64_t redist) {
    ctx->saved_data["buckets"] = reinterpret_cast<int64_t>(buckets);
    ctx->saved_data["param"] = param;
    ctx->saved_data["redist"] = redist;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* buckets = reinterpret_cast<GradBuckets*>(ctx->saved_data["buckets"].toInt());
    buckets->defer(static_cast<size_t>(ctx->saved_data["param"].toInt()),
                   static_cast<size_t>(ctx->saved_data["redist"].toInt()), grads.at(0));
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

struct ParallelModule::Impl {
  LaunchEnv env;
  ParallelModuleOptions options;
  proto::Program program;
  std::shared_ptr<const ir::Graph> graph;
  mesh::DeviceMesh mesh;
  std::shared_ptr<World> world;
  std::vector<RedistSpec> redists;
  std::vector<int> node_redist;  // per node: index into redists, -1 none
  std::vector<PlacedTensor> inputs, parameters, buffers, outputs;
  std::vector<int> value_input, value_param, value_buffer;  // per value: index, -1 none
  /// Per node: the buffer a mixed-precision cast reads (ir::isBufferCast; BufferWriteBack), -1.
  std::vector<int> buffer_cast_of;
  bool has_buffer_casts = false;
  /// A node that runs as its local graph (proto::OpCollective: an op's internal collective, or a
  /// local rewrite's graph without mesh dims): the graph and the all-reduce its all-reduce nodes
  /// run (the spec outlives backward: autograd keeps a pointer to it).
  struct OpCollectiveExec {
    OpCollectiveRunner runner;
    RedistSpec spec;
  };
  std::map<uint32_t, OpCollectiveExec> op_collectives;  // by node
  std::unique_ptr<Interpreter> interp;
  c10::Device device = c10::kCPU;
  std::vector<at::Tensor> param_tensors, buffer_tensors;
  bool allocated = false;
  /// Per redistribution: the parameter whose gradient it defers to the buckets, -1 none.
  std::vector<int> deferred_param;
  std::unique_ptr<GradBuckets> buckets;
  /// Forward prefetch (ParallelModuleOptions::prefetch_params): the redistribute nodes whose input
  /// is a parameter and whose forward is one all-gather (canIssueForward), in program order, and
  /// per node its position among them (-1 none).
  std::vector<uint32_t> prefetch_nodes;
  std::vector<int> prefetch_pos;
  /// The prefetch nodes in units issued together: a run of consecutive members of one gather group
  /// (artifact::paramGatherGroups: ONE all-gather of a flat buffer, GroupedGather) or a single
  /// node; per prefetch position its unit and its index in it.
  std::vector<std::vector<size_t>> units;
  std::vector<size_t> unit_of, index_in_unit;
  /// Per unit: whether its gradients are reduced together (AsyncGrads' groups, with overlap:
  /// every member's backward one reduce-scatter).
  std::vector<bool> unit_grad_grouped;
  /// Per unit whose gradients are grouped: whether a member takes an all-reduce then a slice, so
  /// the group runs one all-reduce (GroupedReduceScatter), its reduce-scatter members included.
  std::vector<bool> unit_grad_all_reduce;
  /// Per node: the parameter whose gather's backward is one reduce-scatter (AsyncGradFunction
  /// with overlap), or an all-reduce then a local slice in a gather group, -1 none.
  std::vector<int> async_grad_param;
  std::unique_ptr<AsyncGrads> async_grads;
  /// Activation checkpointing (proto::CheckpointSegment): the segments the interpreter runs
  /// without autograd and again in backward, the recomputation's external callback
  /// (buildRecompute), per value whether a segment reads it from outside (a tensor the segment's
  /// autograd function keeps for its recomputation), and per node its segment (-1 none).
  std::vector<CheckpointSpec> checkpoints;
  std::shared_ptr<const Interpreter::ExternalFn> recompute;
  std::vector<bool> segment_input;
  std::vector<int> node_segment;
  /// Per unit: whether every member's gather is inside a checkpoint segment (the recomputation
  /// gathers such a unit as one, and prefetches it).
  std::vector<bool> unit_in_segments;
  /// This run's state for the recomputations: whether the forward records autograd (a segment's
  /// forward then counts the gradients its recomputation will hand the buckets and AsyncGrads),
  /// and the units the recomputations gathered or issued ahead whose members are still to be
  /// taken (a unit's members may lie in several segments; backward recomputes them last first).
  bool training_run = false;
  /// A gather unit issued and not yet taken by all its members (by unit index).
  struct UnitFlight {
    std::unique_ptr<PendingCollective> single;
    std::unique_ptr<GroupedGather> group;
    size_t remaining = 0;  // members not yet taken
  };
  using Flights = std::map<size_t, UnitFlight>;
  Flights recompute_flights;
  Interpreter::Observer* observer = nullptr;  // setObserver's (a profiler), beside the regatherer
  uint64_t random_seed = 0;                   // seedRandom's
  uint64_t forward_index = 0;                 // forwards since seedRandom
  /// Sizes that follow a symbolic dim (proto::SymbolicArg), in the interpreter's order.
  struct SymbolicArg {
    std::string symbol;
    int64_t per_symbol = 1;
    mesh::PlacementTuple placement;
    size_t rank = 0, dim = 0;
    proto::SymbolicArg::Part part = proto::SymbolicArg::SIZE;
    int64_t scale = 1, shift = 0;
  };
  std::vector<SymbolicArg> symbolic;
  std::vector<SymbolicArgSpec> symbolic_specs;
  /// Where each symbol's value comes from: a dim of a program input (its global size over
  /// per_symbol).
  struct SymbolSource {
    size_t input = 0;
    int64_t dim = 0;
    int64_t per_symbol = 1;
  };
  std::map<std::string, SymbolSource> symbol_sources;

  Status readSymbolicArgs(const std::string& where) {
    for (int i = 0; i < program.inputs_size(); ++i) {
      const proto::ProgramTensor& t = program.inputs(i);
      for (int d = 0; d < t.global_shape_size(); ++d) {
        const proto::Dim& dim = t.global_shape(d);
        if (dim.symbol().empty() || symbol_sources.count(dim.symbol())) continue;
        const int64_t k = dim.has_per_symbol() ? dim.per_symbol() : 1;
        if (k <= 0) continue;
        symbol_sources[dim.symbol()] = {static_cast<size_t>(i), d, k};
      }
    }
    for (const proto::SymbolicArg& a : program.symbolic_args()) {
      const std::string what =
          where + ": symbolic argument of node " + std::to_string(a.node()) + " ";
      if (!symbol_sources.count(a.symbol()))
        return parseError(what + "names symbol '" + a.symbol() + "', which no input carries");
      if (a.per_symbol() <= 0 || a.dim() >= a.rank() || a.rank() > 64 ||
          a.part() == proto::SymbolicArg::PART_UNSET)
        return parseError(what + "is malformed (per_symbol " + std::to_string(a.per_symbol()) +
                          ", dim " + std::to_string(a.dim()) + " of rank " +
                          std::to_string(a.rank()) + ")");
      auto t = artifact::placementFromProto(a.placement());
      if (!t.ok()) return t.error().withContext(what);
      APC_RETURN_IF_ERROR(
          mesh::checkPlacementTuple(*t, static_cast<int64_t>(a.rank()), mesh.ndim()));
      symbolic.push_back({a.symbol(), a.per_symbol(), std::move(t).value(), a.rank(), a.dim(),
                          a.part(), a.scale(), a.shift()});
      symbolic_specs.push_back({ir::NodeId(a.node()), a.input(), a.element()});
    }
    return Status::success();
  }

  /// Program.checkpoints, checked: node ranges inside the program, disjoint and in order, op
  /// nodes only (one line naming the segment otherwise; Interpreter::create checks that what a
  /// segment passes on is tensors).
  Status readCheckpoints(const std::string& where) {
    const ir::Graph& g = *graph;
    int64_t previous_last = -1;
    for (int k = 0; k < program.checkpoints_size(); ++k) {
      const proto::CheckpointSegment& c = program.checkpoints(k);
      const std::string what = where + ": checkpoint segment " + std::to_string(k) + " ('" +
                               c.module() + "', nodes " + std::to_string(c.first()) + ".." +
                               std::to_string(c.last()) + ")";
      if (c.first() > c.last() || c.last() >= g.numNodes())
        return parseError(what + " is not a node range of the " + std::to_string(g.numNodes()) +
                          "-node program");
      if (static_cast<int64_t>(c.first()) <= previous_last)
        return parseError(what + " overlaps or precedes the segment before it");
      previous_last = c.last();
      for (uint32_t i = c.first(); i <= c.last(); ++i)
        if (g.node(ir::NodeId(i)).kind != ir::NodeKind::kOp &&
            g.node(ir::NodeId(i)).kind != ir::NodeKind::kBuffer)  // buffers: ir::checkpointRange
          return parseError(what + " holds node " + std::to_string(i) + " (" +
                            g.node(ir::NodeId(i)).op + "), which is not an op node");
      checkpoints.push_back({c.module(), c.first(), c.last()});
    }
    segment_input.assign(g.numValues(), false);
    node_segment.assign(g.numNodes(), -1);
    for (size_t k = 0; k < checkpoints.size(); ++k)
      for (uint32_t i = checkpoints[k].first; i <= checkpoints[k].last; ++i)
        node_segment[i] = static_cast<int>(k);
    for (const CheckpointSpec& c : checkpoints)
      for (uint32_t i = c.first; i <= c.last; ++i)
        for (ir::ValueId v : g.node(ir::NodeId(i)).inputs) {
          const ir::Value& val = g.value(v);
          if (val.producer.valid() && val.producer.v < c.first) segment_input[v.v] = true;
        }
    return Status::success();
  }

  /// Node `node`'s outputs when it has an op collective (null otherwise): its local graph run on
  /// `args`, every all-reduce node a synchronous, autograd-aware all-reduce.
  std::optional<std::vector<c10::IValue>> runOpCollective(uint32_t node,
                                                          const std::vector<c10::IValue>& args) {
    auto it = op_collectives.find(node);
    if (it == op_collectives.end()) return std::nullopt;
    const OpCollectiveExec& oc = it->second;
    return oc.runner.run(
        args, [&](size_t, const at::Tensor& t) { return redistribute(t, oc.spec, *world); });
  }

  /// Issues unit `u`'s gather into `flights` (one GroupedGather for a group, asynchronous when
  /// `async_group`; else the single all-gather, issued asynchronously), unless it is there.
  void issueUnit(Flights& flights, size_t u, bool async_group) {
    if (flights.count(u)) return;
    const ir::Graph& g = *graph;
    std::vector<const RedistSpec*> specs;
    std::vector<at::Tensor> xs;
    for (size_t pos : units[u]) {
      const ir::Node& pn = g.node(ir::NodeId(prefetch_nodes[pos]));
      specs.push_back(&redists.at(static_cast<size_t>(node_redist.at(pn.id.v))));
      xs.push_back(param_tensors.at(static_cast<size_t>(value_param.at(pn.inputs[0].v))));
    }
    UnitFlight f;
    f.remaining = specs.size();
    if (specs.size() == 1 && canIssueForward(*specs[0]))
      f.single = issueForward(*specs[0], xs[0], *world);
    else
      f.group = std::make_unique<GroupedGather>(std::move(specs), xs, *world, async_group);
    flights[u] = std::move(f);
  }

  /// The gathered value of prefetch position `pos` from its unit in `flights` (waited for); the
  /// unit leaves `flights` once every member took its value.
  at::Tensor takeMember(Flights& flights, size_t pos) {
    auto it = flights.find(unit_of[pos]);
    UnitFlight& f = it->second;
    at::Tensor out = f.single ? f.single->wait() : f.group->wait().at(index_in_unit[pos]);
    if (--f.remaining == 0) flights.erase(it);
    return out;
  }

  /// Waits for every gather in `flights` (every rank issued them) and drops them.
  static void drain(Flights& flights) {
    for (auto& [u, f] : flights) {
      if (f.single) f.single->wait();
      if (f.group) f.group->wait();
    }
    flights.clear();
  }

  /// A recomputation's gather of parameter gather `node` (a prefetch node): its unit, or -1 when
  /// the node is none or its unit has one member (`unit`), and the gathered value when the unit
  /// lies inside segments (else undefined: the edge gathers on its own). Such a unit is gathered
  /// as ONE call at the first member the recomputations reach, and with prefetch the unit before
  /// it (the next backward recomputes) is issued then too. Every rank recomputes the same
  /// segments in the same order, so the calls match.
  at::Tensor recomputeGather(uint32_t node, int& unit) {
    unit = -1;
    const int pos = prefetch_pos.at(node);
    if (pos < 0) return {};
    const size_t p = static_cast<size_t>(pos);
    const size_t u = unit_of[p];
    if (units[u].size() > 1) unit = static_cast<int>(u);
    const bool prefetch = options.overlap && options.prefetch_params > 0;
    if (!unit_in_segments[u] || (units[u].size() == 1 && !prefetch)) return {};
    issueUnit(recompute_flights, u, options.overlap);
    if (prefetch && u > 0 && unit_in_segments[u - 1])
      issueUnit(recompute_flights, u - 1, options.overlap);
    return takeMember(recompute_flights, p);
  }

  /// Runs redistribution `rid` of node `node` on `x` (`ahead`: its gather, issued ahead, or
  /// undefined; `unit`: its gather group's unit, -1 none), in the forward or in a checkpoint
  /// segment's `recomputation`. A parameter's gradient goes to the buckets (a deferred edge) or to
  /// AsyncGrads (a gather whose backward is one reduce-scatter, with overlap; a gather group's,
  /// with overlap or without); anything else runs as `redistribute`. Where the step records
  /// autograd, the forward counts each such gradient (the buckets' layout holds it, a group waits
  /// for it): a segment's forward, which runs without autograd, counts the gradient its
  /// recomputation will hand over, and the recomputation, counted already, queues the
  /// end-of-backward callback on the step's backward before the segment's reentrant one (arm()),
  /// which would otherwise run it when the segment's gradients are done.
  at::Tensor runParamEdge(uint32_t node, size_t rid, const at::Tensor& x, const at::Tensor& ahead,
                          int unit, bool recomputation) {
    const RedistSpec& spec = redists.at(rid);
    // A gather group's gradients are reduced together (AsyncGrads), with overlap or without.
    const bool grad_grouped = unit >= 0 && unit_grad_grouped[static_cast<size_t>(unit)];
    const int deferred = rid < deferred_param.size() ? deferred_param[rid] : -1;
    const int ap = async_grad_param.at(node);
    const bool to_buckets = buckets && deferred >= 0;
    const bool to_async = ap >= 0 && (options.overlap || grad_grouped);
    const size_t member =
        grad_grouped ? index_in_unit.at(static_cast<size_t>(prefetch_pos.at(node))) : 0;
    if (!training_run || !x.requires_grad()) return redistribute(x, spec, *world, ahead);
    if (!at::GradMode::is_enabled()) {
      if (!recomputation && node_segment.at(node) >= 0) {  // a segment's forward
        if (to_buckets)
          buckets->expect(static_cast<size_t>(deferred), rid, x);
        else if (to_async && grad_grouped)
          async_grads->expect(static_cast<size_t>(unit), member);
      }
      return redistribute(x, spec, *world, ahead);
    }
    if (to_buckets) {
      if (recomputation)
        buckets->arm();
      else
        buckets->expect(static_cast<size_t>(deferred), rid, x);
      return DeferredGradFunction::apply(x, buckets.get(), deferred, static_cast<int64_t>(rid));
    }
    if (to_async) {
      if (ahead.defined())
        TORCH_CHECK(spec.forward.back().local_out.empty() ||
                        ahead.sizes().vec() == spec.forward.back().local_out,
                    "redistribution ", spec.edge, ": the gather issued ahead gave shape ",
                    ahead.sizes());
      if (recomputation) async_grads->arm();
      return AsyncGradFunction::apply(x, &spec, world.get(), &ahead, async_grads.get(),
                                      static_cast<int64_t>(ap),
                                      grad_grouped ? static_cast<int64_t>(unit) : -1,
                                      static_cast<int64_t>(member), recomputation);
    }
    return redistribute(x, spec, *world, ahead);
  }

  /// The external callback of the segments' recomputation in backward: op collectives as in
  /// forward; a parameter's gather takes its unit's grouped (and prefetched) gather where the unit
  /// lies inside segments, and every redistribution runs as the forward's would (runParamEdge).
  void buildRecompute() {
    Impl* im = this;
    recompute = std::make_shared<const Interpreter::ExternalFn>(
        [im](const ir::Node& n, std::vector<c10::IValue>& args) {
          TORCH_CHECK(n.kind == ir::NodeKind::kOp, "node ", n.id.v,
                      " of a checkpoint segment is not an op node");
          if (auto out = im->runOpCollective(n.id.v, args)) return *out;
          const int rid = im->node_redist.at(n.id.v);
          TORCH_CHECK(rid >= 0, "node ", n.id.v, " is external but not a redistribution");
          TORCH_CHECK(args.size() == 1 && args[0].isTensor(), "redistribute node ", n.id.v,
                      " needs one tensor input");
          int unit = -1;
          const at::Tensor ahead = im->recomputeGather(n.id.v, unit);
          std::vector<c10::IValue> out;
          out.push_back(im->runParamEdge(n.id.v, static_cast<size_t>(rid), args[0].toTensor(),
                                         ahead, unit, true));
          return out;
        });
  }

  Status buildInterpreter() {
    InterpreterOptions io;
    io.device = device;
    if (!program.mixed_precision().param_dtype().empty()) {
      APC_ASSIGN_OR_RETURN(io.mixed_compute, scalarType(program.mixed_precision().param_dtype()));
    }
    std::vector<bool> external(graph->numNodes(), false);
    for (size_t i = 0; i < node_redist.size(); ++i) external[i] = node_redist[i] >= 0;
    for (const auto& entry : op_collectives) external[entry.first] = true;
    // A random node's stream: its plan node and this rank's piece of its output (seedRandom).
    // load() checked the nodes and the pieces' count.
    for (int k = 0; k < program.random_nodes_size(); ++k) {
      const uint32_t n = program.random_nodes(k);
      const uint64_t plan_node = static_cast<uint32_t>(program.source_node(static_cast<int>(n)));
      const uint64_t piece = k < program.random_pieces_size() ? program.random_pieces(k) : 0;
      io.random_streams[n] = (plan_node << 32) ^ piece;
    }
    APC_ASSIGN_OR_RETURN(Interpreter in,
                         Interpreter::create(graph, io, external, symbolic_specs, checkpoints));
    interp = std::make_unique<Interpreter>(std::move(in));
    return Status::success();
  }

  void allocate(c10::Device dev) {
    at::NoGradGuard no_grad;
    device = dev;
    param_tensors.clear();
    buffer_tensors.clear();
    for (const PlacedTensor& p : parameters) {
      at::Tensor t =
          at::empty(p.localShape(), at::TensorOptions().dtype(p.storage_dtype).device(dev));
      if (p.requires_grad) t.set_requires_grad(true);
      param_tensors.push_back(t);
    }
    for (const PlacedTensor& b : buffers)
      buffer_tensors.push_back(
          at::empty(b.localShape(), at::TensorOptions().dtype(b.storage_dtype).device(dev)));
    allocated = true;
  }
};

ParallelModule::ParallelModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ParallelModule::~ParallelModule() = default;

Expected<std::shared_ptr<ParallelModule>> ParallelModule::load(
    const std::string& dir, const ParallelModuleOptions& options) {
  APC_ASSIGN_OR_RETURN(LaunchEnv env, launchEnvFromEnvironment());
  return load(dir, env, options);
}

Expected<std::shared_ptr<ParallelModule>> ParallelModule::load(
    const std::string& dir, const LaunchEnv& env, const ParallelModuleOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->options = options;
  impl->device = options.device;
  APC_ASSIGN_OR_RETURN(impl->program, readRankProgram(dir, env.rank, env.world_size, true));
  const proto::Program& prog = impl->program;
  std::vector<int64_t> shape(prog.mesh_shape().begin(), prog.mesh_shape().end());
  std::vector<std::string> names(prog.mesh_names().begin(), prog.mesh_names().end());
  auto mesh = mesh::DeviceMesh::create(shape, names);
  if (!mesh.ok()) return mesh.error().withContext(dir);
  impl->mesh = std::move(mesh).value();

  auto graph = programGraph(prog);
  if (!graph.ok()) return graph.error().withContext(dir + ": rank " + std::to_string(env.rank));
  impl->graph = std::make_shared<const ir::Graph>(std::move(graph).value());
  const ir::Graph& g = *impl->graph;

  for (const proto::Redistribution& r : prog.redistributions()) {
    APC_ASSIGN_OR_RETURN(RedistSpec spec, redistSpec(r));
    spec.regather = r.regather();
    if (!r.reduce_dtype().empty()) {
      APC_ASSIGN_OR_RETURN(spec.reduce_dtype, scalarType(r.reduce_dtype()));
    }
    impl->redists.push_back(std::move(spec));
  }
  impl->node_redist.assign(g.numNodes(), -1);
  for (int i = 0; i < prog.node_redistribution_size() && i < static_cast<int>(g.numNodes()); ++i) {
    uint32_t r = prog.node_redistribution(i);
    if (r > impl->redists.size())
      return parseError(dir + ": node " + std::to_string(i) + " names redistribution " +
                        std::to_string(r - 1) + " of " + std::to_string(impl->redists.size()));
    impl->node_redist[static_cast<size_t>(i)] = static_cast<int>(r) - 1;
  }
  for (const ir::Node& n : g.nodes())
    if (n.op == "apc::redistribute" && impl->node_redist[n.id.v] < 0)
      return parseError(dir + ": redistribute node " + std::to_string(n.id.v) +
                        " has no redistribution");
  // Random nodes and their pieces (the random streams; none in an older artifact).
  if (prog.random_pieces_size() != 0 && prog.random_pieces_size() != prog.random_nodes_size())
    return parseError(dir + ": the program lists " + std::to_string(prog.random_pieces_size()) +
                      " random pieces for " + std::to_string(prog.random_nodes_size()) +
                      " random nodes");
  for (uint32_t n : prog.random_nodes())
    if (n >= g.numNodes() || static_cast<int>(n) >= prog.source_node_size() ||
        prog.source_node(static_cast<int>(n)) < 0)
      return parseError(dir + ": random node " + std::to_string(n) +
                        " is not a node of the model's graph in the " +
                        std::to_string(g.numNodes()) + "-node program");

  auto collect = [&](const auto& field, std::vector<PlacedTensor>& out, std::vector<int>& by_value,
                     const char* what) -> Status {
    by_value.assign(g.numValues(), -1);
    for (const proto::ProgramTensor& p : field) {
      auto t = placedTensor(p);
      if (!t.ok()) return t.error().withContext(dir);
      if (t->value >= g.numValues())
        return parseError(dir + ": " + what + " " + t->name + " names value " +
                          std::to_string(t->value) + " out of range");
      by_value[t->value] = static_cast<int>(out.size());
      out.push_back(std::move(t).value());
    }
    return Status::success();
  };
  APC_RETURN_IF_ERROR(collect(prog.inputs(), impl->inputs, impl->value_input, "input"));
  APC_RETURN_IF_ERROR(collect(prog.parameters(), impl->parameters, impl->value_param, "parameter"));
  APC_RETURN_IF_ERROR(collect(prog.buffers(), impl->buffers, impl->value_buffer, "buffer"));
  std::vector<int> unused;
  APC_RETURN_IF_ERROR(collect(prog.outputs(), impl->outputs, unused, "output"));
  for (const proto::OpCollective& oc : prog.op_collectives()) {
    const std::string what = dir + ": op collective of node " + std::to_string(oc.node());
    if (oc.node() >= g.numNodes() || g.node(ir::NodeId(oc.node())).kind != ir::NodeKind::kOp ||
        impl->node_redist[oc.node()] >= 0 || impl->op_collectives.count(oc.node()))
      return parseError(what + ": not an op node of the program, or named twice");
    const ir::Node& n = g.node(ir::NodeId(oc.node()));
    std::vector<size_t> dims;
    for (uint32_t m : oc.mesh_dims()) {
      if (m >= impl->mesh.ndim())
        return parseError(what + " names mesh dim " + std::to_string(m) + " of a " +
                          std::to_string(impl->mesh.ndim()) + "-d mesh");
      dims.push_back(m);
    }
    auto local = ir::deserializeGraph(oc.local().SerializeAsString());
    if (!local.ok()) return parseError(what + ": local graph: " + local.error().message());
    InterpreterOptions io;
    io.device = impl->device;
    auto runner =
        OpCollectiveRunner::create(std::move(local).value(), n.inputs.size(), n.outputs.size(), io);
    if (!runner.ok()) return parseError(what + ": " + runner.error().message());
    if (dims.empty() && runner->numAllReduces() > 0)
      return parseError(what + ": its local graph has " + std::to_string(runner->numAllReduces()) +
                        " all-reduce nodes and no mesh dims to reduce over");
    const std::string label =
        "node " + std::to_string(n.id.v) + " " + n.qualifiedOp() + " (" + n.module_path + ")";
    impl->op_collectives.emplace(oc.node(), Impl::OpCollectiveExec{std::move(runner).value(),
                                                                   opCollectiveSpec(dims, label)});
  }
  APC_RETURN_IF_ERROR(impl->readSymbolicArgs(dir));
  APC_RETURN_IF_ERROR(impl->readCheckpoints(dir));
  APC_RETURN_IF_ERROR(impl->buildInterpreter());
  WorldOptions world_options = options.world;
  // Ranks of one job compare it at the rendezvous: ranks of different plans fail at once. Without
  // a job id, ranks rendezvous under it (World::create).
  if (world_options.artifact_hash.empty()) world_options.artifact_hash = prog.plan_hash();
  auto world = World::create(env, impl->mesh, world_options);
  if (!world.ok()) return world.error();
  impl->world = std::move(world).value();
  impl->deferred_param = artifact::deferredGradParameters(prog);
  impl->prefetch_pos.assign(g.numNodes(), -1);
  impl->async_grad_param.assign(g.numNodes(), -1);
  const std::vector<int> gather_group = artifact::paramGatherGroups(prog);
  auto groupOf = [&](uint32_t node) {
    return node < gather_group.size() ? gather_group[node] : -1;
  };
  for (const ir::Node& n : g.nodes()) {
    const int rid = impl->node_redist[n.id.v];
    if (rid < 0 || impl->op_collectives.count(n.id.v) || n.inputs.size() != 1) continue;
    if (static_cast<size_t>(rid) < impl->deferred_param.size() && impl->deferred_param[rid] >= 0)
      continue;  // an identity forward
    // One all-gather, or a gather group's gathers over several mesh dims (GroupedGather).
    if (!canIssueForward(impl->redists[static_cast<size_t>(rid)]) &&
        !(isGatherChain(impl->redists[static_cast<size_t>(rid)]) && groupOf(n.id.v) >= 0))
      continue;
    const ir::Value& v = g.value(n.inputs[0]);
    if (!v.producer.valid() || g.node(v.producer).kind != ir::NodeKind::kParameter ||
        impl->value_param[n.inputs[0].v] < 0)
      continue;
    impl->prefetch_pos[n.id.v] = static_cast<int>(impl->prefetch_nodes.size());
    impl->prefetch_nodes.push_back(n.id.v);
    const RedistSpec& spec = impl->redists[static_cast<size_t>(rid)];
    if (spec.requires_grad && spec.backward.size() == 1 &&
        spec.backward.front().kind == layout::StepKind::kReduceScatter &&
        !spec.backward.front().isDynamic(spec.backward.front().shard_dim))
      impl->async_grad_param[n.id.v] = impl->value_param[n.inputs[0].v];
  }
  // Gather groups: runs of consecutive prefetch nodes of one group.
  for (size_t pos = 0; pos < impl->prefetch_nodes.size(); ++pos) {
    const int grp = groupOf(impl->prefetch_nodes[pos]);
    if (pos == 0 || grp < 0 || grp != groupOf(impl->prefetch_nodes[pos - 1]))
      impl->units.emplace_back();
    impl->unit_of.push_back(impl->units.size() - 1);
    impl->index_in_unit.push_back(impl->units.back().size());
    impl->units.back().push_back(pos);
  }
  impl->unit_in_segments.assign(impl->units.size(), true);
  for (size_t u = 0; u < impl->units.size(); ++u)
    for (size_t pos : impl->units[u])
      if (impl->node_segment.at(impl->prefetch_nodes[pos]) < 0) impl->unit_in_segments[u] = false;
  impl->async_grads =
      std::make_unique<AsyncGrads>(impl->param_tensors, *impl->world, !options.overlap);
  std::vector<std::vector<AsyncGrads::GroupMember>> grad_groups(impl->units.size());
  impl->unit_grad_grouped.assign(impl->units.size(), false);
  impl->unit_grad_all_reduce.assign(impl->units.size(), false);
  for (size_t u = 0; u < impl->units.size(); ++u) {
    const std::vector<size_t>& unit = impl->units[u];
    bool grouped = unit.size() > 1;
    for (size_t pos : unit) {
      const uint32_t node = impl->prefetch_nodes[pos];
      const RedistSpec& spec = impl->redists[static_cast<size_t>(impl->node_redist[node])];
      const int param = spec.requires_grad && isGroupedGradient(spec)
                            ? impl->value_param[g.node(ir::NodeId(node)).inputs[0].v]
                            : -1;
      if (param < 0) {
        grouped = false;
        break;
      }
      grad_groups[u].push_back({static_cast<size_t>(param),
                                &impl->redists[static_cast<size_t>(impl->node_redist[node])]});
      if (!isGradientChain(spec) && spec.backward.front().kind == layout::StepKind::kAllReduce)
        impl->unit_grad_all_reduce[u] = true;
    }
    impl->unit_grad_grouped[u] = grouped;
    if (!grouped) {
      grad_groups[u].clear();
      continue;
    }
    // Their gradients go through AsyncGrads' group (an all-reduce then a local slice too).
    for (size_t pos : unit) {
      const uint32_t node = impl->prefetch_nodes[pos];
      impl->async_grad_param[node] = impl->value_param[g.node(ir::NodeId(node)).inputs[0].v];
    }
  }
  impl->async_grads->setGroups(std::move(grad_groups));
  impl->buffer_cast_of.assign(g.numNodes(), -1);
  for (const ir::Node& n : g.nodes())
    if (ir::isBufferCast(g, n)) {
      impl->buffer_cast_of[n.id.v] = impl->value_buffer[n.inputs[0].v];
      impl->has_buffer_casts = true;
    }
  impl->buildRecompute();
  if (options.grad_bucket_bytes > 0)
    impl->buckets = std::make_unique<GradBuckets>(*impl->world, impl->param_tensors, impl->redists,
                                                  options.grad_bucket_bytes,
                                                  options.first_grad_bucket_bytes, options.overlap);
  return std::shared_ptr<ParallelModule>(new ParallelModule(std::move(impl)));
}

c10::Device ParallelModule::device() const {
  return impl_->device;
}
int ParallelModule::rank() const {
  return impl_->env.rank;
}
int ParallelModule::worldSize() const {
  return impl_->env.world_size;
}
World& ParallelModule::world() {
  return *impl_->world;
}
const mesh::DeviceMesh& ParallelModule::mesh() const {
  return impl_->mesh;
}
const ir::Graph& ParallelModule::graph() const {
  return *impl_->graph;
}
std::vector<ir::NodeId> ParallelModule::randomNodes() const {
  std::vector<ir::NodeId> out;
  for (uint32_t n : impl_->program.random_nodes()) out.push_back(ir::NodeId(n));  // load() checked
  return out;
}
const std::string& ParallelModule::modelName() const {
  return impl_->program.model_name();
}
const std::string& ParallelModule::modelHash() const {
  return impl_->program.model_hash();
}
const std::string& ParallelModule::planHash() const {
  return impl_->program.plan_hash();
}
const std::vector<PlacedTensor>& ParallelModule::inputSpecs() const {
  return impl_->inputs;
}
const std::vector<PlacedTensor>& ParallelModule::parameterSpecs() const {
  return impl_->parameters;
}
const std::vector<PlacedTensor>& ParallelModule::bufferSpecs() const {
  return impl_->buffers;
}
const std::vector<PlacedTensor>& ParallelModule::outputSpecs() const {
  return impl_->outputs;
}

void ParallelModule::to_empty(c10::Device device) {
  const bool rebuild = device != impl_->device;
  impl_->allocate(device);
  if (rebuild) {
    Status s = impl_->buildInterpreter();
    (void)s;  // the same graph resolved before; only the device constants change
  }
}

void ParallelModule::init_weights(
    const std::function<void(const PlacedTensor& spec, at::Tensor& local)>& init) {
  if (!impl_->allocated) impl_->allocate(impl_->device);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < impl_->parameters.size(); ++i)
    init(impl_->parameters[i], impl_->param_tensors[i]);
  for (size_t i = 0; i < impl_->buffers.size(); ++i)
    init(impl_->buffers[i], impl_->buffer_tensors[i]);
}

namespace {

at::Tensor pieceOf(const at::Tensor& full, const PlacedTensor& spec) {
  at::Tensor t = full;
  for (size_t d = 0; d < spec.local.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), spec.local[d].offset, spec.local[d].size);
  return t;
}

Status copyPiece(const std::map<std::string, at::Tensor>& full, const PlacedTensor& spec,
                 at::Tensor& local) {
  auto it = full.find(spec.name);
  if (it == full.end()) return notFound("state dict has no entry '" + spec.name + "'");
  const at::Tensor& f = it->second;
  std::vector<int64_t> sizes(f.sizes().begin(), f.sizes().end());
  if (sizes != spec.global_shape) {
    std::string want, got;
    for (int64_t s : spec.global_shape) want += (want.empty() ? "" : ",") + std::to_string(s);
    for (int64_t s : sizes) got += (got.empty() ? "" : ",") + std::to_string(s);
    return invalidArgument("state dict entry '" + spec.name + "' has shape [" + got +
                           "], the program expects [" + want + "]");
  }
  local.copy_(pieceOf(f, spec));
  return Status::success();
}

}  // namespace

Status ParallelModule::load_full_state_dict(const std::map<std::string, at::Tensor>& full) {
  if (!impl_->allocated) impl_->allocate(impl_->device);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < impl_->parameters.size(); ++i)
    APC_RETURN_IF_ERROR(copyPiece(full, impl_->parameters[i], impl_->param_tensors[i]));
  for (size_t i = 0; i < impl_->buffers.size(); ++i)
    APC_RETURN_IF_ERROR(copyPiece(full, impl_->buffers[i], impl_->buffer_tensors[i]));
  return Status::success();
}

std::vector<at::Tensor> ParallelModule::parameters() const {
  return impl_->param_tensors;
}

std::vector<std::pair<std::string, at::Tensor>> ParallelModule::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < impl_->param_tensors.size(); ++i)
    out.emplace_back(impl_->parameters[i].name, impl_->param_tensors[i]);
  return out;
}

std::map<std::string, at::Tensor> ParallelModule::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < impl_->param_tensors.size(); ++i)
    out[impl_->parameters[i].name] = impl_->param_tensors[i];
  for (size_t i = 0; i < impl_->buffer_tensors.size(); ++i)
    out[impl_->buffers[i].name] = impl_->buffer_tensors[i];
  return out;
}

std::map<std::string, at::Tensor> ParallelModule::full_state_dict() {
  std::map<std::string, at::Tensor> out;
  World& w = *impl_->world;
  for (size_t i = 0; i < impl_->param_tensors.size(); ++i) {
    const PlacedTensor& p = impl_->parameters[i];
    at::Tensor full =
        gatherTensor(impl_->param_tensors[i].detach(), p.placement, p.global_shape, w);
    if (rank() == 0) out[p.name] = full;
  }
  for (size_t i = 0; i < impl_->buffer_tensors.size(); ++i) {
    const PlacedTensor& b = impl_->buffers[i];
    at::Tensor full = gatherTensor(impl_->buffer_tensors[i], b.placement, b.global_shape, w);
    if (rank() == 0) out[b.name] = full;
  }
  return out;
}

at::Tensor ParallelModule::fullGrad(size_t parameter) {
  const PlacedTensor& p = impl_->parameters.at(parameter);
  at::Tensor local = impl_->param_tensors.at(parameter);
  at::Tensor g = local.grad();
  if (!g.defined()) g = at::zeros_like(local);
  return gatherTensor(g, p.placement, p.global_shape, *impl_->world);
}

double ParallelModule::clip_grad_norm_(double max_norm) {
  at::NoGradGuard no_grad;
  const std::vector<int64_t> coord = impl_->world->coordinate();
  double local_sq = 0;
  for (size_t i = 0; i < impl_->param_tensors.size(); ++i) {
    at::Tensor g = impl_->param_tensors[i].grad();
    if (!g.defined() || g.numel() == 0) continue;
    // A shard replicated along mesh dim m is counted by the rank at coordinate 0 of m only.
    bool counts = true;
    const mesh::PlacementTuple& pl = impl_->parameters[i].placement;
    for (size_t m = 0; m < pl.size(); ++m)
      if (!pl[m].isShard() && coord[m] != 0) counts = false;
    if (counts) local_sq += g.to(at::kDouble).pow(2).sum().item<double>();
  }
  at::Tensor total = at::full({1}, local_sq, at::TensorOptions().dtype(at::kDouble));
  impl_->world->all().allReduce(total, mesh::ReduceOp::kSum);
  const double norm = std::sqrt(total.item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (at::Tensor& p : impl_->param_tensors) {
      at::Tensor g = p.grad();
      if (g.defined()) g.mul_(coef);
    }
  return norm;
}

namespace {

/// Mixed precision: a floating buffer is read through lowering's cast to param_dtype
/// (ir::isBufferCast), so an op that updates it in place (BatchNorm's running statistics in
/// training mode) updates the cast copy, and the stored buffer never moved (until 2026-12-06:
/// resnet_bottleneck's running means stayed at their initial values under a bf16 plan). The
/// casts' results are kept through the forward; at its end, each one an op wrote (its version
/// counter moved) is copied back into its buffer, in the buffer's dtype.
class BufferWriteBack : public Interpreter::Observer {
 public:
  /// `buffer_of_node`: per node, the buffer its cast reads (-1: not a buffer's cast).
  BufferWriteBack(const std::vector<int>& buffer_of_node, std::vector<at::Tensor>& buffers)
      : buffer_of_node_(buffer_of_node), buffers_(buffers) {}

  void before(const ir::Node&, const std::vector<c10::IValue>&) override {}
  void after(const ir::Node& n, const std::vector<c10::IValue>& outputs,
             const std::vector<c10::IValue>&) override {
    const int b = n.id.v < buffer_of_node_.size() ? buffer_of_node_[n.id.v] : -1;
    if (b < 0 || outputs.empty() || !outputs[0].isTensor()) return;
    const at::Tensor& t = outputs[0].toTensor();
    copies_.push_back({static_cast<size_t>(b), t, t._version()});
  }

  /// After the forward: the written copies back into their buffers. Through a handle with its own
  /// version counter: a checkpoint segment that casts the buffer saved the stored tensor for its
  /// recomputation (which then reads the updated statistics, as it reads them without mixed
  /// precision, where the segment's forward updates the buffer itself before saving it); no other
  /// op reads the stored tensor, only its cast.
  void finish() {
    at::NoGradGuard no_grad;
    for (const Copy& c : copies_)
      if (c.copy._version() != c.version) buffers_.at(c.buffer).variable_data().copy_(c.copy);
    copies_.clear();
  }

 private:
  struct Copy {
    size_t buffer;
    at::Tensor copy;
    int64_t version;
  };
  const std::vector<int>& buffer_of_node_;
  std::vector<at::Tensor>& buffers_;
  std::vector<Copy> copies_;
};

/// FSDP's reshard after forward, for the parameter edges the program marks `regather` (the
/// planner prices them so: forward steps once in forward, once more in backward). The
/// redistributed copy y of a parameter is freed as soon as no value the run still holds shares
/// its storage (views of it included), and gathered again into the same storage by a pre-hook on
/// the backward node of every output of an op that read it (or a view of it): the nodes that
/// unpack what the op saved run after those. A pre-hook on the redistribution's own backward
/// node, which runs once every reader's backward has fed y's gradient, frees it again. The storage
/// is swapped under the tensors (as FSDP does with storage resizing), through a detached handle
/// with its own version counter, so autograd's saved-tensor checks still pass. Every rank runs the
/// same program and the CPU autograd engine visits nodes in the same order, so the re-gathers'
/// collectives match. With prefetch (overlap), a re-gather that is one all-gather, when it runs,
/// issues the previous tracked entry's asynchronously (backward reaches the earlier layer next):
/// that entry's restore waits for it instead of gathering. The tracked members of one gather group
/// (ParallelModule's units: gathered by one all-gather in forward) are re-gathered together, by
/// one GroupedGather of all of them when the first of them is restored, and issued ahead as one.
class Regatherer : public Interpreter::Observer {
 public:
  /// `prefetch`: a re-gather in backward issues the previous tracked entry's ahead (overlap).
  Regatherer(World& world, bool prefetch) : world_(world), prefetch_(prefetch) {}

  /// A regather edge ran: `x` its input (kept: the shard), `y` its result; `unit` the gather
  /// group's unit it belongs to (-1 none).
  void track(const at::Tensor& x, const at::Tensor& y, const RedistSpec& spec, int unit = -1) {
    if (!y.defined() || !y.has_storage() || y.numel() == 0) return;
    auto e = std::make_shared<Entry>();
    e->x = x.detach();
    e->handle = y.variable_data();
    e->storage =
        c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(y.storage().unsafeGetStorageImpl());
    e->nbytes = y.storage().nbytes();
    e->spec = &spec;
    e->world = &world_;
    // The entry before, when its re-gather can be issued ahead (one all-gather, or a group's).
    const bool previous_ahead = prefetch_ && !entries_.empty() &&
                                (entries_.back()->group || canIssueForward(*entries_.back()->spec));
    if (unit >= 0 && isGatherChain(spec)) {
      std::shared_ptr<Group>& grp = groups_[unit];
      if (!grp) {
        grp = std::make_shared<Group>();
        grp->world = &world_;
        if (previous_ahead) grp->previous = entries_.back();
      }
      grp->members.push_back(e);
      e->group = grp;
    } else if (canIssueForward(spec) && previous_ahead) {
      e->previous = entries_.back();
    }
    if (const auto& fn = y.grad_fn()) fn->add_pre_hook(std::make_unique<EntryHook>(e, &release));
    entries_.push_back(std::move(e));
  }

  /// After the run: what is still held (an output, or a view of one) stays for good.
  void finish() {
    for (const auto& e : entries_) e->keep = e->keep || !e->freed;
  }

  void before(const ir::Node&, const std::vector<c10::IValue>& args) override {
    reading_.clear();
    if (std::none_of(entries_.begin(), entries_.end(), [](const auto& e) { return !e->freed; }))
      return;
    const std::vector<at::Tensor> read = leavesOf(args);
    for (const auto& e : entries_)
      if (!e->freed && std::any_of(read.begin(), read.end(),
                                   [&](const at::Tensor& t) { return aliases(t, *e); }))
        reading_.push_back(e);
  }

  void after(const ir::Node&, const std::vector<c10::IValue>& outputs,
             const std::vector<c10::IValue>& live) override {
    if (reading_.empty()) return;
    const std::vector<at::Tensor> made = leavesOf(outputs), held_leaves = leavesOf(live);
    for (const auto& e : reading_) {
      for (const at::Tensor& t : made) hookOutput(t, e);
      bool held = std::any_of(held_leaves.begin(), held_leaves.end(),
                              [&](const at::Tensor& t) { return aliases(t, *e); });
      if (!held) release(*e);
    }
    reading_.clear();
  }

 private:
  struct Entry;
  /// The tracked members of one gather group: re-gathered by one GroupedGather.
  struct Group {
    std::vector<std::weak_ptr<Entry>> members;
    World* world = nullptr;
    std::weak_ptr<Entry> previous;  // the entry tracked before the group (prefetch)
    std::unique_ptr<GroupedGather> ahead;
  };
  struct Entry {
    std::shared_ptr<Group> group;  // its gather group, null none
    at::Tensor x;                  // the redistribution's input
    at::Tensor handle;             // y's data with its own version counter
    c10::intrusive_ptr<c10::StorageImpl> storage;
    size_t nbytes = 0;
    const RedistSpec* spec = nullptr;
    World* world = nullptr;
    bool freed = false;
    bool keep = false;  // held by the forward's outputs: never freed
    std::set<const torch::autograd::Node*> hooked;
    /// The entry tracked before this one, whose re-gather this one's issues ahead (backward
    /// reaches it next), when both are one all-gather and prefetch is on.
    std::weak_ptr<Entry> previous;
    std::unique_ptr<PendingCollective> ahead;  // this entry's re-gather, issued ahead
  };

  static bool aliases(const at::Tensor& t, const Entry& e) {
    return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == e.storage.get();
  }

  /// The tensors inside `values` (runtime::outputLeaves of each), in order.
  static std::vector<at::Tensor> leavesOf(const std::vector<c10::IValue>& values) {
    std::vector<at::Tensor> out;
    for (const c10::IValue& v : values) {
      if (v.isTensor()) {
        out.push_back(v.toTensor());
        continue;
      }
      std::vector<at::Tensor> leaves = outputLeaves(v);
      out.insert(out.end(), leaves.begin(), leaves.end());
    }
    return out;
  }

  static void release(Entry& e) {
    if (e.freed || e.keep) return;
    e.storage->set_data_ptr_noswap(at::DataPtr(nullptr, e.storage->device()));
    e.storage->set_nbytes(0);
    e.freed = true;
  }

  /// Issues the re-gather of `e` (or of its group) ahead, when it is freed and not issued yet.
  static void issueAheadOf(Entry& e) {
    if (const std::shared_ptr<Group>& grp = e.group) {
      if (grp->ahead) return;
      bool freed = false;
      for (const auto& w : grp->members)
        if (auto m = w.lock()) freed = freed || m->freed;
      if (freed) grp->ahead = gatherGroup(*grp, true);
      return;
    }
    if (e.freed && !e.ahead) e.ahead = issueForward(*e.spec, e.x, *e.world);
  }

  /// One GroupedGather of the group's members (every member, freed or not: the same call on
  /// every rank).
  static std::unique_ptr<GroupedGather> gatherGroup(const Group& grp, bool async) {
    std::vector<const RedistSpec*> specs;
    std::vector<at::Tensor> xs;
    for (const auto& w : grp.members) {
      auto m = w.lock();
      TORCH_CHECK(m, "a re-gather group lost a member");
      specs.push_back(m->spec);
      xs.push_back(m->x);
    }
    return std::make_unique<GroupedGather>(std::move(specs), xs, *grp.world, async);
  }

  /// Gives `e` its storage back and copies `g` into it.
  static void refill(Entry& e, const at::Tensor& g) {
    at::NoGradGuard no_grad;
    TORCH_CHECK(g.sizes() == e.handle.sizes(), "redistribution ", e.spec->edge,
                " (re-gather): the gather gave shape ", g.sizes(), ", expected ", e.handle.sizes());
    at::Allocator* alloc = e.storage->allocator();
    if (!alloc) alloc = c10::GetAllocator(e.storage->device().type());
    e.storage->set_data_ptr_noswap(alloc->allocate(e.nbytes));
    e.storage->set_nbytes(e.nbytes);
    e.freed = false;
    e.handle.copy_(g);
  }

  static void restore(Entry& e) {
    if (!e.freed) return;
    at::NoGradGuard no_grad;
    if (const std::shared_ptr<Group> grp = e.group) {
      std::unique_ptr<GroupedGather> gathered =
          grp->ahead ? std::move(grp->ahead) : gatherGroup(*grp, false);
      const std::vector<at::Tensor>& full = gathered->wait();
      for (size_t i = 0; i < grp->members.size(); ++i)
        if (auto m = grp->members[i].lock(); m && m->freed) refill(*m, full.at(i));
      if (auto p = grp->previous.lock()) issueAheadOf(*p);
      return;
    }
    at::Tensor g;
    if (e.ahead) {
      g = e.ahead->wait();
      e.ahead.reset();
    } else {
      g = runSteps(e.spec->forward, e.x, *e.world, e.spec->edge + " (re-gather)");
    }
    refill(e, g);
    // The previous entry's re-gather runs behind this one's readers' backward.
    if (auto p = e.previous.lock()) issueAheadOf(*p);
  }

  /// Runs `action` (restore or release) on the entry before a backward node runs: restore on
  /// the backward node of every output of a reader of y; release on the redistribution's own
  /// backward node, which runs once every reader's backward has fed y's gradient.
  struct EntryHook : torch::autograd::FunctionPreHook {
    EntryHook(std::shared_ptr<Entry> e, void (*action)(Entry&)) : e(std::move(e)), action(action) {}
    torch::autograd::variable_list operator()(
        const torch::autograd::variable_list& grads) override {
      action(*e);
      return grads;
    }
    std::shared_ptr<Entry> e;
    void (*action)(Entry&);
  };

  static void hookOutput(const at::Tensor& t, const std::shared_ptr<Entry>& e) {
    if (!t.defined() || !t.grad_fn()) return;
    const auto& fn = t.grad_fn();
    if (!e->hooked.insert(fn.get()).second) return;
    fn->add_pre_hook(std::make_unique<EntryHook>(e, &restore));
  }

  World& world_;
  bool prefetch_;
  std::vector<std::shared_ptr<Entry>> entries_;
  std::map<int, std::shared_ptr<Group>> groups_;  // by unit
  std::vector<std::shared_ptr<Entry>> reading_;
};

}  // namespace

Status ParallelModule::checkDivisible(const std::vector<c10::IValue>& inputs) {
  Impl& im = *impl_;
  std::map<std::pair<uint32_t, uint32_t>, int64_t> sizes;  // per (input, dim): its global size
  for (const proto::DivisibleDim& dd : im.program.divisible()) {
    if (dd.input() >= inputs.size() || !inputs[dd.input()].isTensor())
      return invalidArgument("input " + std::to_string(dd.input()) + " must be a tensor");
    const at::Tensor& local = inputs[dd.input()].toTensor();
    const int64_t d = dd.dim();
    if (d >= local.dim())
      return invalidArgument("input " + im.inputs.at(dd.input()).name + " has rank " +
                             std::to_string(local.dim()));
    // The runtime value of the symbol: the local size summed over the mesh dims that shard it,
    // on every rank alike (so that all of them fail together); once per (input, dim).
    auto [it, fresh] = sizes.emplace(std::make_pair(dd.input(), dd.dim()), 0);
    if (fresh) {
      at::Tensor n = at::full({1}, local.size(d), at::TensorOptions().dtype(at::kLong));
      const mesh::PlacementTuple& t = im.inputs.at(dd.input()).placement;
      for (size_t m = 0; m < t.size(); ++m)
        if (t[m].isShard(static_cast<int>(d))) im.world->dim(m).allReduce(n, mesh::ReduceOp::kSum);
      it->second = n.item<int64_t>();
    }
    const int64_t value = it->second;
    if (value % dd.pieces() != 0)
      return invalidArgument("dynamic dim " + dd.symbol() + " = " + std::to_string(value) +
                             " does not split evenly into the " + std::to_string(dd.pieces()) +
                             " pieces that " + dd.node() + " " +
                             (dd.why().empty()
                                  ? "reduces across (a mean of uneven pieces would be wrong)"
                                  : dd.why()) +
                             "; use a multiple of " + std::to_string(dd.pieces()));
  }
  return Status::success();
}

Expected<std::vector<int64_t>> ParallelModule::symbolicValues(
    const std::vector<c10::IValue>& inputs) {
  Impl& im = *impl_;
  std::vector<int64_t> values;
  if (im.symbolic.empty()) return values;
  // Each symbol's run-time value: the global size of an input dim that carries it, the local
  // size summed over the mesh dims that shard it (a collective not counted in commStats: it is
  // the runtime's, not the plan's), on every rank alike.
  std::map<std::string, int64_t> bound;
  for (const auto& [symbol, src] : im.symbol_sources) {
    bool used = false;
    for (const Impl::SymbolicArg& a : im.symbolic) used = used || a.symbol == symbol;
    if (!used) continue;
    if (src.input >= inputs.size() || !inputs[src.input].isTensor())
      return invalidArgument("input " + std::to_string(src.input) + " must be a tensor");
    const at::Tensor& local = inputs[src.input].toTensor();
    if (src.dim >= local.dim())
      return invalidArgument("input " + im.inputs.at(src.input).name + " has rank " +
                             std::to_string(local.dim()));
    int64_t size = local.size(src.dim);
    const mesh::PlacementTuple& t = im.inputs.at(src.input).placement;
    at::Tensor n = at::full({1}, size, at::TensorOptions().dtype(at::kLong));
    bool sharded = false;
    for (size_t m = 0; m < t.size(); ++m) {
      if (!t[m].isShard(static_cast<int>(src.dim))) continue;
      Communicator& c = im.world->dim(m);
      const CommStats before = c.stats();
      c.allReduce(n, mesh::ReduceOp::kSum);
      c.restoreStats(before);
      sharded = true;
    }
    if (sharded) size = n.item<int64_t>();
    if (size % src.per_symbol != 0)
      return invalidArgument(
          "input " + im.inputs.at(src.input).name + " dim " + std::to_string(src.dim) + " = " +
          std::to_string(size) + " is not a multiple of " + std::to_string(src.per_symbol) +
          " (it was exported as " + std::to_string(src.per_symbol) + " x " + symbol + ")");
    bound[symbol] = size / src.per_symbol;
  }
  std::vector<int64_t> coord(im.program.coordinate().begin(), im.program.coordinate().end());
  values.reserve(im.symbolic.size());
  for (const Impl::SymbolicArg& a : im.symbolic) {
    std::vector<int64_t> sizes(a.rank, 1);
    if (__builtin_mul_overflow(a.per_symbol, bound.at(a.symbol), &sizes[a.dim]))
      return invalidArgument("a size of " + std::to_string(a.per_symbol) + " x " + a.symbol +
                             " overflows at " + a.symbol + " = " +
                             std::to_string(bound.at(a.symbol)));
    const layout::DimPiece p = layout::localPiece(sizes, a.placement, im.mesh, coord)[a.dim];
    const int64_t part = a.part == proto::SymbolicArg::SIZE     ? p.size
                         : a.part == proto::SymbolicArg::OFFSET ? p.offset
                                                                : p.offset + p.size;
    int64_t scaled = 0, value = 0;
    if (__builtin_mul_overflow(a.scale, part, &scaled) ||
        __builtin_add_overflow(a.shift, scaled, &value))
      return invalidArgument("a size argument that follows " + a.symbol + " overflows");
    values.push_back(value);
  }
  return values;
}

Status ParallelModule::checkPlannedShapes(const std::vector<c10::IValue>& inputs) {
  Impl& im = *impl_;
  for (size_t i = 0; i < im.inputs.size() && i < inputs.size(); ++i) {
    if (!inputs[i].isTensor()) continue;
    const PlacedTensor& spec = im.inputs[i];
    const at::Tensor& local = inputs[i].toTensor();
    auto planned = [&] {
      std::string dims;
      for (size_t d = 0; d < spec.global_shape.size(); ++d)
        dims += (d ? "," : "") + (spec.symbols[d].empty() ? "" : spec.symbols[d] + "=") +
                std::to_string(spec.global_shape[d]);
      return spec.name + ":" + ir::dtypeName(apc::dtypeOf(spec.storage_dtype)) + "[" + dims + "]";
    };
    if (local.dim() != static_cast<int64_t>(spec.global_shape.size()))
      return invalidArgument("input '" + spec.name + "' has rank " + std::to_string(local.dim()) +
                             " but the artifact was planned for " + planned());
    for (size_t d = 0; d < spec.global_shape.size(); ++d) {
      if (!spec.symbols[d].empty()) continue;  // dynamic: checkDivisible and the program cope
      const auto dim = static_cast<int64_t>(d);
      int64_t size = local.size(dim);
      bool sharded = false;
      for (const mesh::Placement& p : spec.placement) sharded |= p.isShard(static_cast<int>(d));
      if (sharded) {
        at::Tensor n = at::full({1}, size, at::TensorOptions().dtype(at::kLong));
        for (size_t m = 0; m < spec.placement.size(); ++m) {
          if (!spec.placement[m].isShard(static_cast<int>(d))) continue;
          Communicator& c = im.world->dim(m);
          const CommStats before = c.stats();
          c.allReduce(n, mesh::ReduceOp::kSum);
          c.restoreStats(before);
        }
        size = n.item<int64_t>();
      }
      if (size == spec.global_shape[d]) continue;
      std::string hint;
      if (d == 0) {
        std::string dims = "B=" + std::to_string(spec.global_shape[0]);
        for (size_t e = 1; e < spec.global_shape.size(); ++e)
          dims += "," + std::to_string(spec.global_shape[e]);
        hint = "; to run at other batch sizes plan a dynamic batch: apc plan --input '" +
               spec.name + ":" + ir::dtypeName(apc::dtypeOf(spec.storage_dtype)) + "[" + dims +
               "]' (or export the .pt2 with a torch.export.Dim)";
      }
      return invalidArgument("input '" + spec.name + "' has size " + std::to_string(size) +
                             " in dim " + std::to_string(d) + " but the artifact was planned for " +
                             std::to_string(spec.global_shape[d]) + " (" + planned() + ")" + hint);
    }
  }
  return Status::success();
}

Expected<std::vector<c10::IValue>> ParallelModule::forwardLeaves(
    const std::vector<c10::IValue>& inputs) {
  Impl& im = *impl_;
  if (!im.allocated) return invalidArgument("forward before to_empty / init_weights / load");
  if (inputs.size() != im.inputs.size())
    return invalidArgument("forward takes " + std::to_string(im.inputs.size()) + " inputs, got " +
                           std::to_string(inputs.size()));
  APC_RETURN_IF_ERROR(checkPlannedShapes(inputs));
  APC_RETURN_IF_ERROR(checkDivisible(inputs));
  APC_ASSIGN_OR_RETURN(std::vector<int64_t> symbolic_values, symbolicValues(inputs));
  Regatherer regather(*im.world, im.options.overlap && im.options.prefetch_params > 0);
  if (im.buckets) im.buckets->reset();
  im.async_grads->reset();
  // Gathers the last backward's recomputations issued and never took: waited for (every rank
  // issued them), dropped.
  Impl::drain(im.recompute_flights);
  im.training_run = at::GradMode::is_enabled();
  const ir::Graph& g = *im.graph;
  // Forward prefetch: gathers issued ahead, by unit of im.prefetch_nodes (a gather group's
  // members in one all-gather; prefetch_params units ahead with overlap). A group's gather is
  // issued at its first member without overlap too (blocking then).
  const int lookahead = im.options.overlap ? std::max(0, im.options.prefetch_params) : 0;
  Impl::Flights in_flight;
  size_t issued = 0;  // units below it are issued
  auto issueAhead = [&](size_t end) {
    for (end = std::min(end, im.units.size()); issued < end; ++issued)
      im.issueUnit(in_flight, issued, lookahead > 0);
  };
  auto external = [&](const ir::Node& n, std::vector<c10::IValue>& args) {
    std::vector<c10::IValue> out;
    switch (n.kind) {
      case ir::NodeKind::kInput: {
        int i = im.value_input.at(n.outputs.at(0).v);
        TORCH_CHECK(i >= 0, "input ", n.name, " is not in the program's inputs");
        out.push_back(inputs[static_cast<size_t>(i)]);
        break;
      }
      case ir::NodeKind::kParameter: {
        int i = im.value_param.at(n.outputs.at(0).v);
        TORCH_CHECK(i >= 0, "parameter ", n.name, " is not in the program's parameters");
        out.push_back(im.param_tensors[static_cast<size_t>(i)]);
        break;
      }
      case ir::NodeKind::kBuffer: {
        int i = im.value_buffer.at(n.outputs.at(0).v);
        TORCH_CHECK(i >= 0, "buffer ", n.name, " is not in the program's buffers");
        out.push_back(im.buffer_tensors[static_cast<size_t>(i)]);
        break;
      }
      case ir::NodeKind::kOp: {
        if (auto collective = im.runOpCollective(n.id.v, args)) {
          out = std::move(*collective);
          break;
        }
        const size_t rid = static_cast<size_t>(im.node_redist.at(n.id.v));
        const RedistSpec& spec = im.redists.at(rid);
        TORCH_CHECK(args.size() == 1 && args[0].isTensor(), "redistribute node ", n.id.v,
                    " needs one tensor input");
        const at::Tensor& x = args[0].toTensor();
        // The parameter gathers of the next prefetch_params nodes are issued now, this one's
        // waited for (issued here when nothing issued it before).
        at::Tensor ahead;
        int unit = -1;  // this node's unit when it is a group's member (-1 none)
        if (const int pos = im.prefetch_pos.at(n.id.v);
            pos >= 0 &&
            (lookahead > 0 || im.units[im.unit_of[static_cast<size_t>(pos)]].size() > 1)) {
          const size_t u = im.unit_of[static_cast<size_t>(pos)];
          if (lookahead == 0) issued = std::max(issued, u);  // the units before ran on their own
          issueAhead(u + 1 + static_cast<size_t>(lookahead));
          if (in_flight.count(u)) {
            ahead = im.takeMember(in_flight, static_cast<size_t>(pos));
            if (im.units[u].size() > 1) unit = static_cast<int>(u);
          }
        }
        const at::Tensor y = im.runParamEdge(n.id.v, rid, x, ahead, unit, false);
        // Re-gathers are tracked where autograd saves the gathered tensor: not under a
        // checkpoint segment's forward (grad mode off: nothing saves it, the run drops it after
        // its last reader, backward recomputes it), and not when a segment reads it from outside
        // (the segment's function keeps it for its recomputation: it must not be freed).
        if (spec.regather && at::GradMode::is_enabled() && !im.segment_input.at(n.outputs.at(0).v))
          regather.track(args[0].toTensor(), y, spec, unit);
        out.push_back(y);
        break;
      }
    }
    return out;
  };
  (void)g;
  // The re-gatherer, the buffers' write-back and the caller's observer (setObserver) watch.
  BufferWriteBack write_back(im.buffer_cast_of, im.buffer_tensors);
  struct Fanout : Interpreter::Observer {
    std::vector<Interpreter::Observer*> all;
    void before(const ir::Node& n, const std::vector<c10::IValue>& args) override {
      for (Interpreter::Observer* o : all) o->before(n, args);
    }
    void after(const ir::Node& n, const std::vector<c10::IValue>& outputs,
               const std::vector<c10::IValue>& live) override {
      for (Interpreter::Observer* o : all) o->after(n, outputs, live);
    }
  } fanout;
  fanout.all = {&regather};
  if (im.has_buffer_casts) fanout.all.push_back(&write_back);
  if (im.observer) fanout.all.push_back(im.observer);
  // The run's seed of the random streams, from (seedRandom's seed, forward).
  const uint64_t random_seed = mixSeeds(im.random_seed, im.forward_index++ + 1);
  auto leaves = im.interp->run(external, fanout.all.size() == 1 ? fanout.all[0] : &fanout,
                               symbolic_values, im.recompute, random_seed);
  regather.finish();
  if (leaves.ok()) write_back.finish();
  // Gathers issued for nodes that did not run: waited for (every rank issued them), dropped.
  Impl::drain(in_flight);
  return leaves;
}

Expected<c10::IValue> ParallelModule::forward(const std::vector<c10::IValue>& inputs) {
  APC_ASSIGN_OR_RETURN(std::vector<c10::IValue> leaves, forwardLeaves(inputs));
  return packOutputs(impl_->graph->outputs(), leaves);
}

int64_t ParallelModule::inputIndexBound(size_t i) const {
  const Impl& im = *impl_;
  const PlacedTensor& spec = im.inputs.at(i);
  if (at::isFloatingType(spec.dtype) || spec.dtype == at::kBool) return 0;
  const ir::Graph& g = *im.graph;
  // Rows of the parameter behind an embedding's weight input (through redistributions).
  auto weightRows = [&](ir::ValueId w) -> int64_t {
    for (int hops = 0; hops < 8 && w.valid(); ++hops) {
      int p = im.value_param[w.v];
      if (p >= 0) {
        const PlacedTensor& ps = im.parameters[static_cast<size_t>(p)];
        return ps.global_shape.empty() ? 0 : ps.global_shape[0];
      }
      const ir::Value& v = g.value(w);
      if (!v.producer.valid() || g.node(v.producer).inputs.empty()) return 0;
      w = g.node(v.producer).inputs[0];
    }
    return 0;
  };
  std::vector<std::vector<ir::Use>> uses = g.computeUses();
  int64_t smallest = 0;
  for (const ir::Node& n : g.nodes())
    if (n.op == "aten::embedding" && !n.inputs.empty()) {
      int64_t rows = weightRows(n.inputs[0]);
      if (rows > 0 && (smallest == 0 || rows < smallest)) smallest = rows;
    }
  std::vector<ir::ValueId> frontier = {ir::ValueId(spec.value)};
  for (int depth = 0; depth < 16 && !frontier.empty(); ++depth) {
    std::vector<ir::ValueId> next;
    for (ir::ValueId v : frontier)
      for (const ir::Use& u : uses[v.v]) {
        const ir::Node& n = g.node(u.node);
        if (n.op == "aten::embedding" && u.input_index == 1) {
          int64_t rows = weightRows(n.inputs[0]);
          if (rows > 0) return rows;
        }
        for (ir::ValueId o : n.outputs) {
          const ir::Value& ov = g.value(o);
          if (ov.tensor && !ir::isFloating(ov.tensor->dtype)) next.push_back(o);
        }
      }
    frontier = std::move(next);
  }
  return smallest > 0 ? smallest : 2;
}

at::Tensor ParallelModule::shardInput(size_t i, const at::Tensor& full) const {
  const PlacedTensor& spec = impl_->inputs.at(i);
  // A dynamic dim may differ from the recorded hint: the runtime size is cut.
  return localPieceOf(full, spec.placement, impl_->mesh, impl_->world->coordinate())
      .to(impl_->device, spec.storage_dtype);
}

at::Tensor ParallelModule::gatherOutput(size_t leaf, const at::Tensor& local) {
  const PlacedTensor& spec = impl_->outputs.at(leaf);
  std::vector<int64_t> global = spec.global_shape;
  // Dynamic dims: the runtime size along an unsharded dim is the global one; along a sharded dim
  // it is unknown (-1: the gather exchanges the members' sizes).
  for (size_t d = 0; d < global.size() && static_cast<int64_t>(d) < local.dim(); ++d) {
    bool sharded = false;
    for (const mesh::Placement& p : spec.placement) sharded |= p.isShard(static_cast<int>(d));
    if (!sharded)
      global[d] = local.size(static_cast<int64_t>(d));
    else if (d < spec.symbols.size() && !spec.symbols[d].empty())
      global[d] = -1;
  }
  return gatherToFull(local, spec.placement, global, *impl_->world);
}

PricedComm ParallelModule::pricedComm() const {
  PricedComm c;
  const Impl& im = *impl_;
  for (size_t node = 0; node < im.node_redist.size(); ++node) {
    const int r = im.node_redist[node];
    if (r < 0) continue;
    const RedistSpec& spec = impl_->redists[static_cast<size_t>(r)];
    // A gather group's members run one call between them (its first member counts it): the
    // gather, the re-gather, and with overlap the gradients' reduce-scatter. Their bytes add up.
    bool later_member = false, grad_grouped = false, in_group = false, grad_all_reduce = false;
    if (const int pos = im.prefetch_pos[node]; pos >= 0) {
      const size_t u = im.unit_of[static_cast<size_t>(pos)];
      in_group = im.units[u].size() > 1;
      later_member = im.index_in_unit[static_cast<size_t>(pos)] > 0;
      grad_grouped = im.unit_grad_grouped[u];  // one call, with overlap or without
      grad_all_reduce = grad_grouped && im.unit_grad_all_reduce[u];
    }
    const int64_t call = later_member ? 0 : 1;
    const int64_t grad_call = later_member && grad_grouped ? 0 : 1;
    for (const RedistStepSpec& s : spec.forward) {
      if (s.kind == layout::StepKind::kLocalSlice) continue;
      c.forward_steps += call;
      c.priced_bytes += s.priced_bytes;
      c.forward_wire_bytes +=
          in_group ? paddedWireBytes(s, impl_->mesh) : wireBytes(s, impl_->mesh);
    }
    if (!spec.requires_grad) continue;
    // A re-gathered parameter runs its forward steps once more, in backward.
    if (spec.regather)
      for (const RedistStepSpec& s : spec.forward) {
        if (s.kind == layout::StepKind::kLocalSlice) continue;
        c.backward_steps += call;
        c.priced_bytes += s.priced_bytes;
        c.backward_wire_bytes +=
            in_group ? paddedWireBytes(s, impl_->mesh) : wireBytes(s, impl_->mesh);
      }
    for (const RedistStepSpec& s : spec.backward) {
      if (s.kind == layout::StepKind::kLocalSlice) continue;
      c.backward_steps += grad_call;
      c.priced_bytes += s.priced_bytes;
      if (in_group && grad_all_reduce && s.kind == layout::StepKind::kReduceScatter) {
        // A reduce-scatter member of a group reduced by one all-reduce: its full gradient is in
        // the all-reduce.
        RedistStepSpec all = s;
        all.kind = layout::StepKind::kAllReduce;
        c.backward_wire_bytes += wireBytes(all, impl_->mesh);
        continue;
      }
      c.backward_wire_bytes +=
          in_group && grad_grouped ? paddedWireBytes(s, impl_->mesh) : wireBytes(s, impl_->mesh);
    }
  }
  c.wire_bytes = c.forward_wire_bytes + c.backward_wire_bytes;
  return c;
}

void ParallelModule::setObserver(Interpreter::Observer* observer) {
  impl_->observer = observer;
}

void ParallelModule::seedRandom(uint64_t seed, uint64_t forward) {
  impl_->random_seed = seed;
  impl_->forward_index = forward;
}

PredictedStep ParallelModule::predictedStep() const {
  PredictedStep p;
  if (!impl_->program.has_prediction()) return p;
  const proto::Prediction& pr = impl_->program.prediction();
  p.cost_model = pr.cost_model();
  p.step_us = pr.step_us();
  p.compute_us = pr.compute_us();
  p.comm_us = pr.comm_us();
  p.forward_comm_us = pr.forward_comm_us();
  p.backward_comm_us = pr.backward_comm_us();
  p.optimizer_sgd_us = pr.optimizer_sgd_us();
  p.optimizer_adamw_us = pr.optimizer_adamw_us();
  // The plan priced bucketed gradients at their marginal cost: add each bucket's latency when
  // this module buckets (lowering assumed the default size), every gradient's when it does not.
  const double adjust =
      impl_->buckets ? -pr.grad_bucket_saving_us() : pr.grad_unbucketed_extra_us();
  p.grad_bucket_saving_us = -adjust;
  p.node_compute_us.assign(pr.node_compute_us().begin(), pr.node_compute_us().end());
  for (const proto::PeakMemory& m : pr.peak_memory())
    p.peak_memory.push_back({m.optimizer(), m.peak_bytes(), m.phase(), m.forward_peak(),
                             m.loss_peak(), m.backward_peak(), m.optimizer_peak()});
  p.step_us += adjust;
  p.comm_us += adjust;
  p.backward_comm_us += adjust;
  p.exposed_comm_us = p.comm_us;
  // The overlap lowering's schedule assumes: the runtime's, with its gradient buckets.
  if (impl_->options.overlap && impl_->buckets) {
    p.hidden_comm_us = pr.hidden_comm_us();
    p.exposed_comm_us = pr.exposed_comm_us();
    p.overlap_efficiency = pr.overlap_efficiency();
    p.step_us -= p.overlap_efficiency * p.hidden_comm_us;
  }
  p.present = true;
  return p;
}

CommStats ParallelModule::commStats() const {
  return impl_->world->stats();
}

std::vector<CommStats> ParallelModule::commStatsByMeshDim() const {
  std::vector<CommStats> out;
  for (size_t m = 0; m < impl_->mesh.ndim(); ++m) out.push_back(impl_->world->dim(m).stats());
  return out;
}
void ParallelModule::resetCommStats() {
  impl_->world->resetStats();
}

}  // namespace apc::runtime
