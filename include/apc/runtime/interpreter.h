//===- apc/runtime/interpreter.h - Executing IR graphs op by op ------------===//
//
// Runs an ir::Graph on concrete tensors, one node after the other, with autograd on: libtorch
// records every op, so a backward from the outputs reaches the tensors the caller passed in.
//
// - Ops are resolved ONCE, when the interpreter is created, by (name, overload) through the JIT
//   operator registry (torch::jit::findOperatorFor, which also holds JIT-only ops such as
//   aten::Int.Tensor and prim::NumToTensor), and called boxed: one IValue per schema argument.
//   The structural prim ops whose kernels libtorch does not export (prim::ListConstruct,
//   prim::ListUnpack, prim::TupleConstruct, prim::TupleUnpack) are implemented here.
// - Non-tensor constants (graph-level values) become IValues once, against the schema argument
//   that consumes them (ints widened to float for float arguments; "meta" devices, which the
//   importer records for devices read off tensors, and "cpu" ones, which a model captured on the
//   CPU records, become InterpreterOptions::device;
//   optionally floating ScalarType codes widened to f64, for the strategy validator).
// - Input, parameter and buffer nodes, and op nodes marked external (the runtime's redistribute
//   nodes and the nodes that run as their local graph, apc/runtime/op_collective.h), get their
//   outputs from a caller callback.
// - Symbolic arguments (SymbolicArgSpec): a size constant that follows a dynamic dim is replaced
//   on every run by the value the caller passes (ParallelModule computes it from the inputs).
// - A value is dropped from the environment after its last use, so a forward holds only what
//   autograd saved.
// - Checkpoint segments (CheckpointSpec, proto::CheckpointSegment): the nodes [first, last] run
//   inside one custom autograd function without autograd, which keeps only the segment's inputs
//   (values defined before it and read inside it); its backward restores the random-number state
//   the forward saw, runs the nodes again with autograd from detached inputs, with the recompute
//   external callback, and back-propagates the segment's output gradients through them
//   (PyTorch's reentrant torch.utils.checkpoint).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include "apc/ir/graph.h"
#include "apc/ir/torch_dtype.h"
#include "apc/support/error.h"

namespace apc::runtime {

struct InterpreterOptions {
  /// Where "meta" and "cpu" device constants run (the device of the module's tensors; a model
  /// captured on the CPU names "cpu" for its factories' devices).
  c10::Device device = c10::kCPU;
  /// Replace floating ScalarType codes (f16, bf16, f32) by f64 (the validator compares in f64).
  bool widen_floats = false;
  /// Mixed precision's param_dtype (the program's): a contraction or normalization (linear,
  /// matmul, convolution, attention, layer/group/batch/RMS norm: mixedPrecisionCastsArguments)
  /// whose floating tensor arguments disagree casts them to it, as the whole model in param_dtype
  /// would have them. An exported model's own casts name the dtype it was exported in: Hugging
  /// Face's RMSNorm computes in f32 and casts back "to the input's dtype", f32 in the export, so
  /// its output met a bf16 weight in the next linear, which ATen refuses; GPT-2's position
  /// embeddings are cast "to the device" with the export's f32 and met the bf16 LayerNorm.
  std::optional<c10::ScalarType> mixed_compute;
  /// Random nodes that draw from a stream of their own, by node id (ParallelModule: one stream per
  /// plan node and piece of its output, so that ranks holding the same piece draw the same
  /// numbers). Before such a node runs, the default generators (the CPU's and, on a CUDA device,
  /// the device's) are seeded from the run's random seed (Interpreter::run) and the stream, and
  /// their state is put back after it: a node's numbers depend on the seed and the stream only,
  /// not on what drew before it, on any rank and in a checkpoint segment's recomputation. Other
  /// nodes draw from the default generators as they are.
  std::map<uint32_t, uint64_t> random_streams;
};

/// Whether `op` (without its overload: "aten::linear") is a contraction or normalization whose
/// floating arguments must agree, cast to the mixed-precision compute dtype when they do not
/// (InterpreterOptions::mixed_compute).
bool mixedPrecisionCastsArguments(const std::string& op);

/// The first line of an exception message; for an error of the TorchScript interpreter (whose
/// first line is only "The following operation failed in the TorchScript interpreter.") the
/// line that names the cause (`RuntimeError: ...`).
std::string firstLine(const std::string& what);

/// The torch dtype of an IR dtype: apc::scalarTypeOf (apc/ir/torch_dtype.h).
using apc::scalarTypeOf;

/// A 0-dim tensor literal (a traced constant like the 0.5 of `x * 0.5`): value `c`, dtype `meta`'s
/// (f64 for floating dtypes with widen_floats), on options.device.
at::Tensor tensorLiteral(const ir::TensorMeta& meta, const ir::Constant& c,
                         const InterpreterOptions& options = {});

/// The IValue of a non-tensor constant for schema argument `arg` (nullptr: no schema).
Expected<c10::IValue> constantToIValue(const ir::Constant& c, const c10::Argument* arg,
                                       const InterpreterOptions& options = {});

/// A node's operator, resolved once.
class OpKernel {
 public:
  /// Resolves the operator of an op node. Errors: no operator with that name and overload, or one
  /// that needs a graph node to run. `output_type`: the type of the node's first output, which
  /// gives an empty prim::ListConstruct its element type (an int[] size list of a scalar).
  static Expected<OpKernel> resolve(const ir::Node& node,
                                    ir::ValueType output_type = ir::ValueType::kOther);

  /// The schema, or nullptr for the hand-written prim ops and aten::einsum.operands (whose inputs
  /// are not aten::einsum's arguments one by one).
  const c10::FunctionSchema* schema() const { return schema_; }
  /// "aten::view" / "prim::ListConstruct".
  const std::string& name() const { return name_; }

  /// Runs on one IValue per node input; returns one IValue per node output. Exceptions of the
  /// kernel become an Error with the first line of their message.
  Expected<std::vector<c10::IValue>> run(std::vector<c10::IValue> args, size_t num_outputs) const;
  /// The same, but exceptions propagate (the interpreter's fast path).
  std::vector<c10::IValue> call(std::vector<c10::IValue> args) const;

 private:
  enum class Kind {
    kOperator,
    kEinsumOperands,  // aten::einsum.operands: inputs 1.. packed into aten::einsum's list
    kCopy,            // aten::copy (functional): a fresh tensor like self, copy_'d from src
    kListConstruct,
    kListUnpack,
    kTupleConstruct,
    kTupleUnpack
  };
  Kind kind_ = Kind::kOperator;
  ir::ValueType list_type_ = ir::ValueType::kOther;  // prim::ListConstruct's output type
  std::string name_;
  const c10::FunctionSchema* schema_ = nullptr;
  std::function<void(std::vector<c10::IValue>&)> op_;
  // Positions of `Tensor?[]` arguments (aten::index's indices): a list built of tensors only
  // arrives as List<Tensor> and is re-typed to List<optional<Tensor>> before the call.
  std::vector<size_t> optional_tensor_lists_;
};

/// A constant argument of a node (or one element of an int[] one) that the caller computes on
/// every run (a size that follows a symbolic dim: proto::SymbolicArg).
struct SymbolicArgSpec {
  ir::NodeId node;
  uint32_t input = 0;
  int64_t element = -1;  // element of an int[] argument; -1: an int argument
};

/// A checkpointed segment of a program: its op nodes [first, last] (proto::CheckpointSegment).
struct CheckpointSpec {
  std::string module;  // for messages
  uint32_t first = 0;
  uint32_t last = 0;
};

class Interpreter {
 public:
  /// Supplies the outputs of input / parameter / buffer nodes and of external op nodes; `args`
  /// holds the node's inputs (empty for the non-op kinds). Exceptions propagate.
  using ExternalFn =
      std::function<std::vector<c10::IValue>(const ir::Node& node, std::vector<c10::IValue>& args)>;

  /// Prepares `graph`: resolves every op node not marked in `external` (indexed by node id; may be
  /// shorter than the node list), converts constants. Errors name the first node that fails.
  /// `checkpoints`: segments run without autograd and recomputed in backward; they must lie inside
  /// the graph, be disjoint and in order, hold only op nodes, and every value a segment defines
  /// and a later node (or the graph's outputs) reads must be a tensor. An error names the segment.
  static Expected<Interpreter> create(std::shared_ptr<const ir::Graph> graph,
                                      const InterpreterOptions& options = {},
                                      std::vector<bool> external = {},
                                      std::vector<SymbolicArgSpec> symbolic_args = {},
                                      std::vector<CheckpointSpec> checkpoints = {});

  const ir::Graph& graph() const { return *graph_; }

  /// Watches a run node by node (ParallelModule frees re-gathered parameters with it).
  class Observer {
   public:
    virtual ~Observer() = default;
    /// Before node `node` runs, with its arguments.
    virtual void before(const ir::Node& node, const std::vector<c10::IValue>& args) = 0;
    /// After it ran: its outputs, and every value the run still holds (indexed by value id;
    /// values no later node reads are already empty).
    virtual void after(const ir::Node& node, const std::vector<c10::IValue>& outputs,
                       const std::vector<c10::IValue>& live) = 0;
  };

  /// Runs the graph; returns the output leaves in OutputTree order (graph().outputs().leaves()).
  /// `symbolic_values` holds one value per SymbolicArgSpec given to create(), which replaces that
  /// argument's constant (or its element) in this run.
  /// Errors: the first failing node, "node 12 aten::view (blocks.0.attn): <message>".
  /// `recompute`: the external callback of the checkpoint segments' recomputation in backward
  /// (it outlives the run: the backward nodes hold it); nullptr: `external` is not needed there
  /// (a segment with an external node then fails in backward). The observer sees the segments'
  /// nodes in the forward, not in their recomputation. `random_seed`: the run's seed of the
  /// random streams (InterpreterOptions::random_streams).
  Expected<std::vector<c10::IValue>> run(const ExternalFn& external, Observer* observer = nullptr,
                                         const std::vector<int64_t>& symbolic_values = {},
                                         std::shared_ptr<const ExternalFn> recompute = nullptr,
                                         uint64_t random_seed = 0) const;

  const std::vector<CheckpointSpec>& checkpoints() const { return checkpoints_; }

 private:
  struct Step {
    ir::NodeId node;
    bool external = false;
    OpKernel kernel;
    std::vector<c10::IValue> constant_args;  // per input; None-typed placeholder when not constant
    std::vector<bool> is_constant;
    std::vector<uint32_t> free_after;  // values whose last use is this node
    std::vector<size_t> symbolic;      // indices into symbolic_ of this node's arguments
    /// InterpreterOptions::mixed_compute for a contraction (its disagreeing floating arguments
    /// cast to it), nullopt otherwise.
    std::optional<c10::ScalarType> cast_floats;
    std::optional<uint64_t> random_stream;  // InterpreterOptions::random_streams
  };
  std::shared_ptr<const ir::Graph> graph_;
  InterpreterOptions options_;
  std::vector<Step> steps_;
  std::vector<SymbolicArgSpec> symbolic_;
  std::vector<uint32_t> output_values_;
  std::vector<CheckpointSpec> checkpoints_;
  /// A checkpoint segment, prepared; shared with the backward nodes of its runs, which outlive
  /// the run (and may outlive a moved interpreter).
  struct Segment;
  std::vector<std::shared_ptr<const Segment>> segments_;
  std::vector<int> segment_at_;  // per node: the segment that starts there, or -1
  friend struct CheckpointFunction;

  /// What one run's node loop reads besides its steps and environment.
  struct RunContext {
    const ExternalFn* external = nullptr;
    Observer* observer = nullptr;
    const std::vector<SymbolicArgSpec>* symbolic = nullptr;
    const std::vector<int64_t>* symbolic_values = nullptr;
    uint64_t random_seed = 0;
    c10::Device device = c10::kCPU;  // whose default generator a random stream seeds
  };
  /// Runs `steps` [begin, end) on `env` (the node loop).
  static Status runSteps(const ir::Graph& g, const std::vector<Step>& steps, size_t begin,
                         size_t end, std::vector<c10::IValue>& env, const RunContext& ctx);
};

/// Packs output leaves into the OutputTree's structure: a leaf as itself, tuples and lists as
/// tuples / lists, dicts as Dict[str, Any].
c10::IValue packOutputs(const ir::OutputTree& tree, const std::vector<c10::IValue>& leaves);

}  // namespace apc::runtime
