//===- apc/runtime/parallel_module.h - A rank's piece of a sharded model ---===//
//
// ParallelModule is what a C++ trainer holds on each rank: the rank's Program (lowered from a
// plan, read from an artifact directory), its parameter and buffer shards, and the World (one
// Communicator per mesh dim). It runs the program with the interpreter (apc/runtime/interpreter.h)
// and the redistributions as autograd functions (apc/runtime/redistribute.h), so that
// `loss.backward()` leaves in each local shard the gradient of that shard: a Replicate parameter
// gets its full gradient on every rank (DDP's all-reduce), a sharded one its shard's gradient
// (FSDP's reduce-scatter).
//
//   auto pm = ParallelModule::load("out/");          // RANK, WORLD_SIZE, MASTER_ADDR/PORT
//   pm->to_empty(torch::kCPU);
//   pm->load_full_state_dict(full);                  // or pm->init_weights(fn)
//   auto out = pm->forward({pm->shardInput(0, x)});  // local pieces in, local pieces out
//   pm->gatherOutput(0, out_leaf).sum().backward();  // full output (autograd-aware) for a loss
//   optimizer over pm->parameters();                 // local shards
//
// Placements and pieces: a tensor placed S(d) on a mesh dim is cut with torch.chunk semantics,
// nested over the mesh dims (apc/layout/layout.h); each rank holds its piece, maybe empty.
// Errors are values (one line) except inside autograd's backward, where a failed collective is a
// CommError exception.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "apc/ir/graph.h"
#include "apc/layout/layout.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/runtime/comm.h"
#include "apc/runtime/interpreter.h"
#include "apc/support/error.h"

namespace apc::runtime {

/// A placed tensor of the program: forward input, parameter, buffer or output leaf.
struct PlacedTensor {
  std::string name;                   // as named_parameters() gives it; input / output leaf name
  std::vector<int64_t> global_shape;  // symbolic dims: their hints
  std::vector<std::string> symbols;   // per dim: the symbol of a dynamic dim, else empty
  at::ScalarType dtype = at::kFloat;  // the dtype the program computes it in
  at::ScalarType storage_dtype = at::kFloat;  // the dtype of the stored shard (mixed precision:
                                              // the model's; the program casts it to `dtype`)
  mesh::PlacementTuple placement;
  std::vector<layout::DimPiece> local;  // this rank's piece of each dim
  bool requires_grad = false;
  uint32_t value = 0;  // the program value holding it

  std::vector<int64_t> localShape() const;
};

/// DDP's default gradient bucket, 25 MiB (ParallelModuleOptions::grad_bucket_bytes).
inline constexpr int64_t kDefaultGradBucketBytes = 25 * 1024 * 1024;
/// DDP's first gradient bucket, 1 MiB (ParallelModuleOptions::first_grad_bucket_bytes).
inline constexpr int64_t kFirstGradBucketBytes = 1024 * 1024;

struct ParallelModuleOptions {
  WorldOptions world;              // backend, collective timeout
  c10::Device device = c10::kCPU;  // where to_empty / load_full_state_dict allocate
  /// Gradient buckets, as DDP's: a parameter edge whose backward is one all-reduce (a replicated
  /// parameter read by a data-parallel op) does not reduce its gradient when autograd reaches
  /// it; the gradient waits, and at the end of the backward (an autograd engine callback) the
  /// waiting gradients are all-reduced together in flat buckets of at most this many bytes, in
  /// program order, then added to the parameters' grads. One call per bucket instead of one per
  /// parameter: the same bytes, a fraction of the latency. 0: every gradient reduced on its own,
  /// as the plan priced it. The artifact's prediction assumes the default (25 MiB, DDP's).
  int64_t grad_bucket_bytes = kDefaultGradBucketBytes;
  /// With overlap, the first bucket laid out (per mesh dim, op and dtype: the gradients backward
  /// produces first) holds at most this many bytes (and at most grad_bucket_bytes), as DDP's
  /// first bucket: its all-reduce starts early and runs behind the rest of backward. 0: the first
  /// bucket is as large as the others.
  int64_t first_grad_bucket_bytes = kFirstGradBucketBytes;
  /// Overlap the gradient buckets' all-reduces with the rest of backward: a bucket is issued
  /// asynchronously as soon as all its gradients have come (buckets laid out in reverse program
  /// order, as DDP's) and waited for at the end of backward, each wait with the collective
  /// timeout; FSDP's gradient reduce-scatters likewise (a gather group's in one call). Off: every
  /// bucket is reduced at the end of backward, blocking (the same sums), and a gather group's
  /// gradients by one blocking call when its last gradient comes.
  bool overlap = true;
  /// With overlap, the forward's parameter gathers (a redistribution of a parameter that is one
  /// all-gather: FSDP's) are issued asynchronously this many gathers ahead of their use, in
  /// program order, and waited for where their value is first used; 0: each gathered where it
  /// is used, blocking.
  int prefetch_params = 1;
};

/// Bytes the program's collectives move per training step (one forward + backward), as priced.
struct PricedComm {
  int64_t forward_steps = 0;
  int64_t backward_steps = 0;
  int64_t priced_bytes = 0;         // sum of the priced n of every step that communicates
  int64_t wire_bytes = 0;           // this rank's share by the alpha-beta formulas ((p-1)/p n, ...)
  int64_t forward_wire_bytes = 0;   // wire_bytes of the forward steps
  int64_t backward_wire_bytes = 0;  // and of the backward steps
};

/// What the plan predicts for one training step of this rank (proto::Prediction), in
/// microseconds; all zero for an artifact lowered before predictions were recorded.
struct PredictedStep {
  std::string cost_model;  // the device and links the plan was priced with
  double step_us = 0;      // the plan's objective (compute_us + comm_us), bucket-adjusted
  double compute_us = 0;
  double comm_us = 0;
  double forward_comm_us = 0;  // this rank's priced forward collectives
  double backward_comm_us = 0;
  double optimizer_sgd_us = 0;  // this rank's optimizer step over its shards
  double optimizer_adamw_us = 0;
  /// What this module's way of reducing bucketable gradients (ParallelModuleOptions::
  /// grad_bucket_bytes: in buckets, or one by one) saves against the plan's marginal prices of
  /// them (negative: what it costs), already taken off step_us, comm_us and backward_comm_us.
  double grad_bucket_saving_us = 0;
  /// The communication the runtime's overlap runs behind compute, as the plan's schedule predicts
  /// it (apc/lower/schedule.h), taken off step_us (its overlap_efficiency share) when this module
  /// overlaps (with its gradient buckets); 0 without overlap. exposed_comm_us: the time the rank
  /// waits for collectives in that schedule (without overlap: comm_us).
  double hidden_comm_us = 0;
  double exposed_comm_us = 0;
  /// The share of hidden_comm_us the step does not pay (the plan's device, apc/cost/device.h:
  /// about 0 on CPU ranks, whose collectives compute on the cores that run the model): step_us
  /// takes overlap_efficiency * hidden_comm_us off.
  double overlap_efficiency = 1.0;
  /// Per node of graph(): the plan's compute (forward and backward, with dispatch) of the plan
  /// node it comes from; 0 for nodes lowering added (redistributions).
  std::vector<double> node_compute_us;
  /// The plan's predicted peak memory of a rank over a step, per optimizer ("sgd", "momentum",
  /// "adamw"; apc/plan/memory.h), with the phase it is in; empty in an artifact without it.
  struct PeakMemory {
    std::string optimizer;
    int64_t peak_bytes = 0;
    std::string phase;
    int64_t forward = 0, loss = 0, backward = 0, step = 0;  // the largest per phase
  };
  std::vector<PeakMemory> peak_memory;
  bool present = false;  // the artifact carries a prediction
};

class ParallelModule {
 public:
  /// Loads this rank's program from an artifact directory: rank and world from the torchrun
  /// environment (launchEnvFromEnvironment), manifest checks (format version, hashes, world
  /// size), process groups per mesh dim. Errors are one line.
  static Expected<std::shared_ptr<ParallelModule>> load(const std::string& dir,
                                                        const ParallelModuleOptions& options = {});
  /// The same with an explicit environment.
  static Expected<std::shared_ptr<ParallelModule>> load(const std::string& dir,
                                                        const LaunchEnv& env,
                                                        const ParallelModuleOptions& options);
  ~ParallelModule();
  ParallelModule(const ParallelModule&) = delete;
  ParallelModule& operator=(const ParallelModule&) = delete;

  int rank() const;
  int worldSize() const;
  World& world();
  const mesh::DeviceMesh& mesh() const;
  /// Where the shards and the input pieces live (ParallelModuleOptions::device, or to_empty's).
  c10::Device device() const;
  const ir::Graph& graph() const;
  /// The nodes of graph() that draw random numbers (the program's random_nodes, which lowering
  /// takes from the op registry): dropout in training, sampling ops.
  std::vector<ir::NodeId> randomNodes() const;
  /// The artifact's model (its name and the SHA-256 of the model file) and the plan's
  /// content_hash, as the program records them (checkpoints name them).
  const std::string& modelName() const;
  const std::string& modelHash() const;
  const std::string& planHash() const;

  const std::vector<PlacedTensor>& inputSpecs() const;
  const std::vector<PlacedTensor>& parameterSpecs() const;
  const std::vector<PlacedTensor>& bufferSpecs() const;
  const std::vector<PlacedTensor>& outputSpecs() const;

  /// Allocates uninitialized local shards of every parameter and buffer on `device`.
  void to_empty(c10::Device device);
  /// Calls `init(spec, local)` for every parameter and buffer (in program order) with its
  /// description (global name and shape, placement, this rank's piece) and its local shard, to be
  /// filled in place (under no_grad). Allocates first when to_empty was not called.
  void init_weights(const std::function<void(const PlacedTensor& spec, at::Tensor& local)>& init);
  /// Copies this rank's piece of every full tensor into the shards. Errors: a missing name or a
  /// shape that differs from the global shape. Extra names are ignored.
  Status load_full_state_dict(const std::map<std::string, at::Tensor>& full);

  /// Local shards (requires_grad), in program order.
  std::vector<at::Tensor> parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  /// Local shards of parameters and buffers.
  std::map<std::string, at::Tensor> state_dict() const;
  /// Full tensors of parameters and buffers gathered on every rank; returned on rank 0 only (the
  /// other ranks get an empty map). Collective: every rank must call it.
  std::map<std::string, at::Tensor> full_state_dict();
  /// The full gradient of one parameter (collective; every rank gets it). Undefined gradient:
  /// zeros.
  at::Tensor fullGrad(size_t parameter);
  /// Scales every local gradient so that the global norm (over the whole mesh, each replicated
  /// shard counted once) is at most `max_norm`; returns the norm before clipping. Collective.
  double clip_grad_norm_(double max_norm);

  /// Runs the program on local input pieces (one per program input, in order); returns the output
  /// in the forward's structure (a tensor, or tuples / lists / dicts of them). With a dynamic
  /// batch the pieces may be uneven (torch.chunk's), except where a node averages across them
  /// (proto::DivisibleDim): then a size that does not split evenly is an error, on every rank.
  Expected<c10::IValue> forward(const std::vector<c10::IValue>& inputs);
  /// The same, the output leaves in OutputTree order.
  Expected<std::vector<c10::IValue>> forwardLeaves(const std::vector<c10::IValue>& inputs);

  /// For an integer input: the rows of the embedding it indexes (followed through integer-valued
  /// ops and redistributions), else those of the smallest embedding of the program, else 2; 0 for
  /// a floating input. Trainers draw synthetic indices below it.
  int64_t inputIndexBound(size_t i) const;
  /// This rank's piece of a full input (program input `i`).
  at::Tensor shardInput(size_t i, const at::Tensor& full) const;
  /// The full tensor of output leaf `leaf` from its local piece; autograd-aware.
  at::Tensor gatherOutput(size_t leaf, const at::Tensor& local);

  /// Also watches every later forward node by node (a profiler: apc-train --profile-nodes);
  /// nullptr stops. The observer must outlive the forwards it watches.
  void setObserver(Interpreter::Observer* observer);

  /// Seeds the random numbers of the forwards that follow (dropout masks, sampled tensors): the
  /// next forward draws from (seed, forward), the one after from (seed, forward + 1), and so on.
  /// Every random node draws from a stream of its own (proto::Program::random_pieces): ranks that
  /// hold the same piece of its output draw the same numbers, so replicas stay equal; ranks that
  /// hold different pieces draw independent ones; and no node's numbers depend on what drew
  /// before it (an uneven piece drawn earlier, the trainer's own draws). A trainer that resumes
  /// at step k seeds as the uninterrupted run did at step k. Without a call: seed 0, forward 0.
  void seedRandom(uint64_t seed, uint64_t forward = 0);

  /// The collectives the plan priced for one forward + backward.
  PricedComm pricedComm() const;
  /// What the plan predicts for one step on this rank.
  PredictedStep predictedStep() const;
  /// What this rank's communicators recorded since the last reset.
  CommStats commStats() const;
  /// The same per mesh dim (the world group's calls, used by the runtime's own checks and
  /// clipping, are not in any).
  std::vector<CommStats> commStatsByMeshDim() const;
  void resetCommStats();

 private:
  struct Impl;
  explicit ParallelModule(std::unique_ptr<Impl> impl);
  /// Checks the program's DivisibleDim entries against the inputs' runtime sizes (collective when
  /// the dim is sharded): an error names the dim and the node that needs it to split evenly.
  Status checkDivisible(const std::vector<c10::IValue>& inputs);
  /// Checks every static (non-dynamic) dim of the inputs against the size the plan was made for:
  /// the global size is the local one summed over the mesh dims that shard it (a collective, not
  /// counted in commStats), so every rank fails alike, with one line naming the planned shape and
  /// how to plan a dynamic batch.
  Status checkPlannedShapes(const std::vector<c10::IValue>& inputs);
  /// The run-time values of the program's symbolic arguments (proto::SymbolicArg) for these
  /// inputs: each symbol's value from the global size of an input dim that carries it (collective
  /// when that dim is sharded), then this rank's piece. Empty when the program has none.
  Expected<std::vector<int64_t>> symbolicValues(const std::vector<c10::IValue>& inputs);
  std::unique_ptr<Impl> impl_;
};

}  // namespace apc::runtime
