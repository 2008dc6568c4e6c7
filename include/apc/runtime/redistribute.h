//===- apc/runtime/redistribute.h - Redistributions as autograd functions --===//
//
// Executes the redistribution steps that lowering recorded on every edge of a per-rank program
// (proto/apc.proto RedistStep; the steps of apc/cost/redistribute.h as this rank runs them) with
// the Communicator of each step's mesh dim:
//   all-gather      comm.allGather(x, gather_dim, group_sizes)
//   all-reduce      comm.allReduce on a contiguous copy (the input is never written)
//   reduce-scatter  comm.reduceScatter(x, shard_dim, op)
//   local-slice     torch.chunk piece `comm.index()` of x along shard_dim (narrow + contiguous)
//   all-to-all      comm.allToAll(x, gather_dim, shard_dim, group_sizes)
// After each step the local shape is checked against the recorded local_out, except along dynamic
// dims (RedistStep.dynamic, a dynamic batch) and dims whose size already differed from local_in on
// the way in. An all-gather or all-to-all that gathers a dynamic dim first exchanges the members'
// sizes along it (one small all-gather on every member: pieces may be uneven, 7 rows on 2 ranks
// are 4 + 3, and a member cannot tell from its own piece whether the others differ).
//
// `redistribute` wraps a RedistSpec as a custom autograd function: forward runs `forward`, backward
// runs `backward` on the incoming gradient (DESIGN.md "Backward"). Backward collectives run in
// autograd's order, which is the same on every rank because every rank records the same graph.
// A forward all-reduce or reduce-scatter with op avg scales its summands by 1/p, so the backward
// scales the gradient by the same factor (the backward steps describe placements only). P(max) /
// P(min) reductions have no backward here: the gradient goes to every summand unmasked (no sample
// model needs it). The "gradient convention" is in the Program comment of proto/apc.proto.
//
// `gatherToFull` (autograd-aware) and `gatherTensor` (plain) undo a placement without Partial:
// gather every sharded mesh dim, innermost first, so that every rank holds the full tensor. The
// backward of gatherToFull keeps this rank's piece of the full gradient, which is exact when every
// rank computes the same function of the full tensor (a loss).
//
// Failures of a collective are CommError exceptions; a shape that disagrees with the program is a
// c10::Error; both have a one-line what(). The spec and the World must outlive every autograd
// graph that uses them (ParallelModule owns both).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "apc/layout/layout.h"
#include "apc/mesh/placement.h"
#include "apc/runtime/comm.h"
#include "apc/support/error.h"

namespace apc::runtime {

/// One step as this rank runs it (proto RedistStep, parsed).
struct RedistStepSpec {
  layout::StepKind kind = layout::StepKind::kAllGather;
  size_t mesh_dim = 0;
  int64_t gather_dim = -1;
  int64_t shard_dim = -1;
  mesh::ReduceOp reduce_op = mesh::ReduceOp::kSum;
  std::vector<int64_t> local_in;
  std::vector<int64_t> local_out;
  std::vector<int64_t> group_sizes;
  int64_t priced_bytes = 0;
  std::vector<bool> dynamic;  // per tensor dim: symbolic (empty: none)
  bool isDynamic(int64_t d) const {
    return d >= 0 && static_cast<size_t>(d) < dynamic.size() && dynamic[static_cast<size_t>(d)];
  }
};

/// One edge's redistribution (proto Redistribution, parsed).
struct RedistSpec {
  std::vector<RedistStepSpec> forward;
  std::vector<RedistStepSpec> backward;
  bool requires_grad = false;
  std::string edge;  // "linear_1 -> matmul_2 (input 0)", for messages
  /// Mixed precision: backward steps that reduce (all-reduce, reduce-scatter) run in this dtype
  /// (the gradient is cast to it and back); nullopt: the gradient's own dtype.
  std::optional<at::ScalarType> reduce_dtype;
  /// A parameter's edge: the result is freed after its last forward use and gathered again
  /// before backward (proto::Redistribution.regather; ParallelModule does it).
  bool regather = false;
};

/// Runs `steps` on `x` in order, without autograd. Throws CommError / c10::Error.
at::Tensor runSteps(const std::vector<RedistStepSpec>& steps, const at::Tensor& x, World& world,
                    const std::string& edge = {},
                    std::optional<at::ScalarType> reduce_dtype = std::nullopt);

/// `x` redistributed by `spec.forward`; when spec.requires_grad and x requires grad, the result's
/// backward runs `spec.backward`. A defined `forward_result` is the forward's result computed
/// ahead (issueForward's, waited for): its shape is checked and it is used instead of running
/// the steps.
at::Tensor redistribute(const at::Tensor& x, const RedistSpec& spec, World& world,
                        const at::Tensor& forward_result = {});

/// Whether issueForward can run `spec`'s forward ahead: exactly one all-gather, along a dim that is
/// not dynamic (an FSDP parameter gather).
bool canIssueForward(const RedistSpec& spec);

/// Issues `spec`'s forward on `x` asynchronously (canIssueForward(spec) must hold; `x` must stay
/// unmodified until the wait): the handle's wait() gives the forward's result, for
/// redistribute's `forward_result`. Throws CommError.
std::unique_ptr<PendingCollective> issueForward(const RedistSpec& spec, const at::Tensor& x,
                                                World& world);

/// Whether `spec`'s forward is one or more all-gathers along static dims (artifact::isGatherChain):
/// what a GroupedGather runs.
bool isGatherChain(const RedistSpec& spec);

/// FSDP's grouped parameter gather (artifact::paramGatherGroups): the forwards of `specs` (each
/// isGatherChain, all with the same steps' mesh dims) on `xs` (one dtype), each step as ONE
/// all-gather of a flat buffer: each member's piece flattened into a slot as large as its largest
/// member piece (uneven shards padded with zeros), the slots concatenated; the gathered rows are
/// cut back into the members' pieces and joined along each one's gather dim (a fresh tensor per
/// member), the next step's pieces. `async`: the first step is issued with allGatherAsync (`xs`
/// must stay unmodified until wait()) and the later ones run in wait(); else every step runs at
/// once. Throws CommError / c10::Error.
class GroupedGather {
 public:
  GroupedGather(std::vector<const RedistSpec*> specs, const std::vector<at::Tensor>& xs,
                World& world, bool async);
  /// The members' gathered tensors, in order (the first call waits; later ones return them).
  const std::vector<at::Tensor>& wait();

 private:
  struct Member {
    std::vector<int64_t> local;  // this rank's piece
    int64_t dim = 0;             // the gather dim
    std::vector<int64_t> sizes;  // every member's size along it
    int64_t row = 1;             // elements per unit of the gather dim
    int64_t offset = 0;          // the slot in the flat buffer
  };
  /// Issues step `step` on `xs` (its members' pieces).
  void begin(size_t step, const std::vector<at::Tensor>& xs, bool async);
  /// Waits for the step begun last and cuts its result into the members' tensors.
  std::vector<at::Tensor> finish(size_t step);

  std::vector<const RedistSpec*> specs_;
  World* world_ = nullptr;
  std::vector<Member> members_;
  int64_t ranks_ = 1;
  std::unique_ptr<PendingCollective> pending_;
  at::Tensor gathered_;
  std::vector<at::Tensor> results_;
  bool done_ = false;
};

/// Whether `spec`'s backward can join a GroupedReduceScatter: one reduce-scatter, or an all-reduce
/// then a local slice on the same mesh dim, along a static dim, or a chain of all-reduces,
/// reduce-scatters and local slices along static dims (artifact::gatherGradientForm on the
/// program's redistribution).
bool isGroupedGradient(const RedistSpec& spec);

/// Whether `spec`'s backward is a chain (isGroupedGradient, not one of the single-step forms).
bool isGradientChain(const RedistSpec& spec);

/// FSDP's grouped gradient reduction: the backwards of `specs` (on one mesh dim with one op:
/// isGroupedGradient) on the full gradients `grads` (an undefined one counts as zeros of the
/// gradient's shape, the step's local_in) as ONE collective of a flat buffer in dtype `reduce`.
/// One reduce-scatter each: ONE reduce-scatter, member k's block holding every member's chunk k
/// (torch.chunk along the shard dim, padded to the largest chunk). When any member takes an
/// all-reduce then a local slice (what a plan picks where the links price a reduce-scatter above
/// an all-reduce, Gloo's on CPU, for small tensors): ONE all-reduce of the gradients
/// concatenated, each then cut to this rank's chunk (for a reduce-scatter member, the same sums
/// its reduce-scatter gives). When the members' backwards are chains (isGradientChain; every
/// member's the same steps), step by step: each all-reduce ONE all-reduce of the members' pieces
/// concatenated, each reduce-scatter as above, each local slice on each member's piece. `async`:
/// the first collective issued with the *Async call (a chain's later steps run in wait()), else
/// everything runs at once.
class GroupedReduceScatter {
 public:
  GroupedReduceScatter(std::vector<const RedistSpec*> specs, const std::vector<at::Tensor>& grads,
                       at::ScalarType reduce, World& world, bool async);
  /// This rank's piece of every member's reduced gradient (in `reduce`), in order: views of one
  /// buffer (the first call waits).
  const std::vector<at::Tensor>& wait();

 private:
  struct Member {
    std::vector<int64_t> piece;  // this rank's piece of the gradient
    int64_t offset = 0;
    std::vector<int64_t> full;  // all-reduce form: the full gradient, cut along dim
    int64_t dim = 0, chunk_offset = 0;
  };
  /// A chain: runs its steps from `step` on `pieces` until one is issued asynchronously (`async`)
  /// or all ran (then results_ holds the pieces).
  void runChain(size_t step, std::vector<at::Tensor> pieces, bool async);
  /// One reduce-scatter's buffer [p, slots] for `grads` (each cut along its `dims` entry into p
  /// chunks as torch.chunk, padded to the largest), members_ laid out for this rank's row.
  at::Tensor layOutChunks(const std::vector<at::Tensor>& grads, const std::vector<int64_t>& dims,
                          int64_t p, int64_t me);
  /// The members' pieces cut from `flat` as members_ lays them out.
  std::vector<at::Tensor> cutPieces(const at::Tensor& flat) const;

  bool all_reduce_ = false;
  std::vector<Member> members_;
  /// A chain's members, world, and the step whose collective is pending (its members' pieces laid
  /// out as members_ says).
  std::vector<const RedistSpec*> chain_;
  World* world_ = nullptr;
  size_t chain_step_ = 0;
  std::unique_ptr<PendingCollective> pending_;
  at::Tensor reduced_;
  std::vector<at::Tensor> results_;
  bool done_ = false;
};

/// The sum all-reduce of an op's internal collective (proto::OpCollective) over `mesh_dims`,
/// forward and on the gradient; `label` names the node in messages.
RedistSpec opCollectiveSpec(const std::vector<size_t>& mesh_dims, const std::string& label);

/// The full tensor of a local piece placed as `placement` (no Partial) with global sizes
/// `global_sizes`; autograd-aware (backward: this rank's piece of the gradient). A global size of
/// -1 (a dynamic dim) is not known: the members of each gather exchange their sizes along it.
at::Tensor gatherToFull(const at::Tensor& local, const mesh::PlacementTuple& placement,
                        const std::vector<int64_t>& global_sizes, World& world);

/// The same without autograd (gradients, state dicts).
at::Tensor gatherTensor(const at::Tensor& local, const mesh::PlacementTuple& placement,
                        const std::vector<int64_t>& global_sizes, World& world);

/// This rank's piece of a full tensor placed as `placement` (Partial dims keep the whole value):
/// a contiguous copy.
at::Tensor localPieceOf(const at::Tensor& full, const mesh::PlacementTuple& placement,
                        const mesh::DeviceMesh& mesh, const std::vector<int64_t>& coordinate);

}  // namespace apc::runtime
