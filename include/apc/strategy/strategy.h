//===- apc/strategy/strategy.h - Sharding strategies of ops ----------------===//
//
// A strategy of a node says where its tensor inputs must be and where its outputs will be, one
// placement per mesh dim. Rules are written for ONE mesh dimension (DimStrategy) and expanded over
// the mesh by a cartesian product, then pruned (shards that would leave a rank an empty piece,
// dims that must divide evenly and do not, Partials of bool tensors or P(avg) of integer ones,
// partial placements that cannot be reduced together, duplicates), as in DTensor. The rule
// families live in lib/strategy (one file per family, registered explicitly by the functions of
// apc/strategy/rules.h).
//
// Conventions:
// - `inputs` has one entry per node input; nullopt for non-tensor inputs (ints, int lists, None).
//   A Tensor[] input (cat, stack) has one tuple that applies to every element.
// - `outputs` has one entry per node output; nullopt for non-tensor outputs. A Tensor[] output
//   (split, chunk, unbind, prim::ListConstruct) has one tuple for every element.
// - Partial placements carry their reduce op; a rule only emits Partial where the op is linear in
//   that input (P(sum), and P(avg) where averaging commutes with the op), or, for max-like
//   reductions, the matching reduce op (P(max), P(min)).
// - Within each rule's list the all-Replicate strategy comes first, so strategies[0] of every
//   enumerated node is all-Replicate.
//
// Uneven sharding policy. Shards follow torch.chunk, nested in mesh-dim order
// (apc/layout/layout.h): ceil-sized pieces, the last one short; collectives pad. A tensor dim is
// shardable when every piece is non-empty: n >= p is not enough, as torch.chunk leaves empty pieces
// for some sizes (4 over 3 ranks: 2, 2, 0; 5 over 4: 2, 2, 1, 0), and convolutions, pooling,
// batch_norm and embeddings reject empty channel or row ranges. GPT-2's vocabulary of 50257 stays
// shardable on 8 ranks (6283 * 7 + 6276) and on 8x8 for pointwise ops, contractions and embeddings:
// every operand that shares that dim has the same size and is cut identically. Exact divisibility
// (n % p == 0, recorded in DimStrategy::must_divide) is required where uneven pieces would change
// the result: a view that merges or splits dims (the element layout of the merged dim differs
// otherwise), mean-like reductions that give P(avg) (the mean of unequal-sized local means is not
// the global mean), and mean-reduced losses. Rules that are exact only under an assumption name it
// where they are registered; when unsure, a rule emits no strategy.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apc/cost/compute.h"
#include "apc/cost/cost_model.h"
#include "apc/cost/device.h"
#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/support/error.h"

namespace apc::strategy {

using mesh::Placement;
using mesh::PlacementTuple;

/// A tensor dim of a node input or output, named by position.
struct TensorDimRef {
  bool output = false;  // an output (true) or an input (false)
  uint32_t index = 0;   // node input/output index
  int dim = 0;          // tensor dim (non-negative)
  /// In must_divide: each piece must also be a multiple of this many elements (kernels that need
  /// aligned row strides: _grouped_mm's 16 bytes).
  int64_t multiple = 1;
  bool operator==(const TensorDimRef&) const;  // defaulted in the .cpp (C++17 users)
};

/// A strategy for one mesh dimension.
struct DimStrategy {
  std::vector<std::optional<Placement>> outputs;
  std::vector<std::optional<Placement>> inputs;
  /// Tensor dims that this strategy shards and whose size must be divisible by the total number
  /// of pieces they are cut into after expansion (views that merge or split dims, P(avg) means),
  /// times TensorDimRef::multiple. enumerate drops the expanded strategy otherwise.
  std::vector<TensorDimRef> must_divide;
};

/// A strategy over the whole mesh.
struct Strategy {
  std::vector<std::optional<PlacementTuple>> outputs;
  std::vector<std::optional<PlacementTuple>> inputs;
  double compute_us = 0;  // forward + backward compute on the local shard (filled by enumerate)
  /// A token-local region's strategy (apc/strategy/token_local.h): the node computes on the
  /// rank's own tokens (or experts), its values are the rank's own, not pieces of the global
  /// ones. 0: a rule's strategy; k > 0: the region's k-th way of cutting, the same k on every
  /// member of the region (the solver takes one k for all of them).
  int region_variant = 0;
  bool regionLocal() const { return region_variant != 0; }

  /// "S(0)R,RS(0) -> S(0)S(0)" (tensor inputs only).
  std::string toString() const;
  bool operator==(const Strategy& o) const {
    return outputs == o.outputs && inputs == o.inputs && region_variant == o.region_variant;
  }
};

/// An immutable list of strategies, shared: copies are O(1) and point at one vector. enumerate
/// gives every node of one cache entry (the repeated layers of a model) the same list, so the
/// strategies, their memory and whatever is derived from a list (buildGraphProblem's placement
/// classes of an edge) follow the distinct layers, not the total. Read it like a const vector.
class StrategyList {
 public:
  StrategyList() = default;
  StrategyList(std::vector<Strategy> strategies)  // NOLINT(google-explicit-constructor)
      : list_(std::make_shared<const std::vector<Strategy>>(std::move(strategies))) {}
  StrategyList(std::initializer_list<Strategy> strategies)
      : StrategyList(std::vector<Strategy>(strategies)) {}

  const std::vector<Strategy>& vector() const { return list_ ? *list_ : none(); }
  size_t size() const { return vector().size(); }
  bool empty() const { return vector().empty(); }
  const Strategy& operator[](size_t i) const { return vector()[i]; }
  const Strategy& at(size_t i) const { return vector().at(i); }
  const Strategy& front() const { return vector().front(); }
  const Strategy& back() const { return vector().back(); }
  std::vector<Strategy>::const_iterator begin() const { return vector().begin(); }
  std::vector<Strategy>::const_iterator end() const { return vector().end(); }

  /// The shared vector's address (null when empty and never set): equal for copies of one list.
  const void* identity() const { return list_.get(); }
  /// Equal strategies (the same list, or equal contents).
  bool operator==(const StrategyList& o) const {
    return list_ == o.list_ || vector() == o.vector();
  }

 private:
  static const std::vector<Strategy>& none() {
    static const std::vector<Strategy> none;
    return none;
  }
  std::shared_ptr<const std::vector<Strategy>> list_;
};

/// Options that change which strategies rules emit (part of the enumeration, not of the cache key:
/// one enumerate call uses one set).
struct RuleOptions {
  /// cross_entropy_loss / nll_loss with reduction 'mean': offer batch-sharded inputs with a P(avg)
  /// output. Exact when every shard holds the same number of counted targets, which holds when no
  /// target equals ignore_index (the mean is over non-ignored targets); turn off for exactness
  /// with padded targets.
  bool loss_mean_partial = true;
};

/// What a rule sees: the node, its input/output values and the graph (for constant arguments).
/// Rules may read only the node's op, its input and output values (types, tensor metadata,
/// constants) and the options: enumerate caches results by exactly these.
struct RuleContext {
  const ir::Graph& graph;
  const ir::Node& node;
  const RuleOptions* options = nullptr;  // nullptr: the defaults

  size_t numInputs() const { return node.inputs.size(); }
  size_t numOutputs() const { return node.outputs.size(); }
  const ir::Value& input(size_t i) const { return graph.value(node.inputs.at(i)); }
  const ir::Value& output(size_t i) const { return graph.value(node.outputs.at(i)); }
  const RuleOptions& opts() const;

  /// True for a tensor (with metadata) or a Tensor[] (whose element metadata may be unknown: then
  /// it has no rank, and rules that need one decline).
  bool isTensorInput(size_t i) const;
  bool isTensorOutput(size_t i) const;
  /// Rank of tensor input i (or of the elements of a Tensor[] input, when they all have the same
  /// rank); -1 when not a tensor or unknown.
  int64_t inputRank(size_t i) const;
  int64_t outputRank(size_t i) const;
  /// Sizes of tensor input i (of the first element of a Tensor[]; symbolic dims as their hints);
  /// empty for non-tensors.
  std::vector<int64_t> inputSizes(size_t i) const;
  std::vector<int64_t> outputSizes(size_t i) const;
  /// Metadata of every element of input/output i: one for a tensor, n for a Tensor[], none else.
  std::vector<const ir::TensorMeta*> inputMetas(size_t i) const;
  std::vector<const ir::TensorMeta*> outputMetas(size_t i) const;
  /// Constant int / int list / bool / double argument i, when known at import time (and i exists).
  /// intListArg accepts a single int as a one-element list; doubleArg accepts an int.
  std::optional<int64_t> intArg(size_t i) const;
  std::optional<std::vector<int64_t>> intListArg(size_t i) const;
  std::optional<bool> boolArg(size_t i) const;
  std::optional<double> doubleArg(size_t i) const;
  /// True when argument i is absent or None.
  bool isNoneArg(size_t i) const;
};

/// A single-mesh-dim rule: every strategy the op supports on one mesh dim, the all-Replicate one
/// first. An empty list means the rule cannot handle this instance (an unknown constant, an
/// unexpected rank): the node then gets the Replicate-only fallback and is reported.
using Rule = std::function<std::vector<DimStrategy>(const RuleContext&)>;

/// Work of one node on the local shard held by the rank with the largest pieces.
struct Work {
  double flops = 0;
  double bytes = 0;  // read + written
};

/// The local (largest-piece) sizes of every node input and output under one strategy: per
/// input/output, one shape per element (one for a tensor, n for a Tensor[], none for non-tensors).
struct LocalShapes {
  std::vector<std::vector<std::vector<int64_t>>> inputs;
  std::vector<std::vector<std::vector<int64_t>>> outputs;
};

/// Counts the forward work of a node on its local shards.
using WorkFn = std::function<Work(const RuleContext&, const LocalShapes&)>;

/// The default work: one flop per local output element; bytes of every local input and output.
Work defaultWork(const RuleContext& c, const LocalShapes& local);

/// Whether a node of an op draws random numbers (OpInfo::random).
using RandomFn = std::function<bool(const RuleContext&)>;
/// RandomFn of ops that always draw (bernoulli, rand, normal, ...).
bool alwaysRandom(const RuleContext& c);

/// The op's part in the Megatron (tp) baseline's role analysis (apc/solver/baselines.h, "Megatron
/// roles"): which operand is the weight and how the baseline cuts it.
struct TpUse {
  enum class Kind : uint8_t {
    kNone,       // outputs split when any input is split
    kLinear,     // y = x W^T + b, x input 0: W column-cut (S(0)) with b when x is stream
                 // (output split), row-cut (S(1)) with b R when x is split (output stream)
    kVocab,      // a lookup table: W vocab-cut (S(0)), output stream
    kKeepsDims,  // a cast or alias: a parameter read through it counts as the parameter
  };
  Kind kind = Kind::kNone;
  int weight = -1;  // input index of the weight (kLinear, kVocab)
  int bias = -1;    // input index of the bias (kLinear; absent or None: no bias)
};

/// A collective a node of the op runs inside itself under some placements (train-mode BatchNorm's
/// statistics all-reduce, apc/strategy/sync_norm.h): the mesh dims it all-reduces over and its
/// time.
struct OpCollective {
  std::vector<size_t> mesh_dims;  // empty: none under these placements
  double us = 0;                  // forward and backward time; 0 without a cost model
};
/// The collective inside a node whose inputs are computed on `inputs` (one entry per node input,
/// nullopt for non-tensors): enumeration prices it into the strategy's cost (`model` given),
/// lowering records its mesh dims in the program (`model` null) with the node's local graph
/// (OpLocalGraphFn), which the runtime executes.
using OpCollectiveFn = std::function<OpCollective(
    const RuleContext& c, const std::vector<std::optional<PlacementTuple>>& inputs,
    const mesh::DeviceMesh& mesh, const cost::CostModel* model)>;
/// The rank's computation of a node whose OpCollectiveFn gives mesh dims under `inputs`: its local
/// graph (apc/ir/op_collective.h), plain ops on the rank's pieces around ir::kOpAllReduce nodes,
/// each a sum all-reduce over those mesh dims. Lowering records it in the program
/// (proto::OpCollective); the runtime runs it without knowing the op.
using OpLocalGraphFn = std::function<Expected<ir::Graph>(
    const RuleContext& c, const std::vector<std::optional<PlacementTuple>>& inputs)>;

struct RankPieces;   // apc/strategy/local_rewrite.h
struct NodeRewrite;  // apc/strategy/local_rewrite.h
/// Rewrites the constant arguments (`constants[i]`: the known value of non-tensor input i) of one
/// rank's call of `node` for the rank's pieces (apc/strategy/local_rewrite.h), or replaces the call
/// by a local graph of plain ops (NodeRewrite::local: a vocab-parallel embedding's masked lookup);
/// lowering applies it.
using LocalRewriteFn = Status (*)(const ir::Node& node,
                                  const std::vector<std::optional<ir::Constant>>& constants,
                                  const RankPieces& pieces, NodeRewrite& r);

/// One argument of a sample invocation (OpSample): a tensor (dtype and shape, values drawn by the
/// validator), a Tensor[] (one meta per element) or a constant (int, float, bool, string, list,
/// None).
struct SampleArg {
  ir::ValueType type = ir::ValueType::kNone;
  std::vector<ir::TensorMeta> tensors;  // kTensor: one; kTensorList: one per element
  ir::Constant constant;                // the other types

  static SampleArg tensor(ir::DType dtype, const std::vector<int64_t>& shape);
  static SampleArg f32(const std::vector<int64_t>& shape) { return tensor(ir::DType::kF32, shape); }
  static SampleArg i64(const std::vector<int64_t>& shape) { return tensor(ir::DType::kI64, shape); }
  static SampleArg boolean(const std::vector<int64_t>& shape) {
    return tensor(ir::DType::kBool, shape);
  }
  static SampleArg list(ir::DType dtype, const std::vector<std::vector<int64_t>>& shapes);
  static SampleArg of(int64_t v);
  static SampleArg of(int v) { return of(static_cast<int64_t>(v)); }
  static SampleArg of(double v);
  static SampleArg of(bool v);
  static SampleArg of(const char* v);
  static SampleArg of(std::vector<int64_t> v);
  static SampleArg none();
};

/// A sample invocation of an op, as DTensor's OpInfo sample_inputs: the overload (empty: the
/// entry's own, or the default overload) and the leading arguments; the validator fills the
/// schema's remaining arguments with their defaults, draws the tensors and computes the outputs by
/// running the op (tests/strategy_validator/op_samples_test.cpp). IR-level data only: the planner
/// core includes no torch header.
struct OpSample {
  std::string overload;
  std::vector<SampleArg> args;
};
/// The sample invocations of an op (several: uneven pieces, broadcasting, negative dims, keepdim).
using SamplesFn = std::function<std::vector<OpSample>()>;

/// Everything apc knows about one op, in one registry entry: its sharding rule, its cost family,
/// work and backward multiple, the constant arguments lowering rewrites to local sizes (or the
/// local graph a rank runs in place of the op), whether it draws random numbers, the collective it
/// runs inside itself (its price and the local graph the runtime runs), and its Megatron role.
/// Adding an op touches its family's registration (lib/strategy) and the tests.
struct OpInfo {
  Rule rule;  // empty: no sharding rule (the Replicate-only fallback); the entry says the rest
  cost::OpFamily family = cost::OpFamily::kOther;
  WorkFn work;  // empty: defaultWork
  /// >= 0: this op's backward time as a multiple of its forward's (what its autograd formula
  /// runs); < 0: its family's (cost::backwardMultiplier).
  double backward_multiplier = -1;
  /// Kernels the op's backward launches, each dispatched on its own (mul: grad * other and
  /// grad * self; rsqrt: three): the backward pays CostModel::directKernelUs(0) for each beyond
  /// the first. < 0: its family's (cost::backwardKernels).
  int backward_kernels = -1;
  /// A product of two operands, inputs `contraction_lhs` and `contraction_lhs + 1` (its Work's
  /// left operand and the right one): priced as a matrix-vector or outer product where a dim of it
  /// is one (DeviceSpec::matvec_gbps). < 0: not such a product.
  int contraction_lhs = -1;
  /// Work of one more backward kernel the multiple does not cover, on the local shapes: a view's
  /// whose gradient is not a view (expand: the gradient summed back to the input's shape; slice:
  /// copied into a zero-filled input), or an op's that fills a whole input (embedding: the
  /// zero-filled table the gradient rows are added to). Empty: none.
  WorkFn backward_work;
  LocalRewriteFn local_rewrite = nullptr;  // null: every argument keeps its global value (and
                                           // the op runs as itself)
  RandomFn random;                         // empty: never random
  OpCollectiveFn collective;               // empty: none
  OpLocalGraphFn collective_local;         // with `collective`: the node's local graph
  TpUse tp;
  /// Sample invocations the strategy validator runs every strategy of the rule on (empty: the op
  /// is checked only where it occurs in the sample models).
  SamplesFn samples;
};

/// Ops keyed by qualified op name ("aten::add.Tensor"; a bare "aten::relu" matches every overload
/// without a more specific entry).
class Registry {
 public:
  /// Registers (or replaces) the rule of `qualified_op` (the other fields default).
  void add(const std::string& qualified_op, Rule rule,
           cost::OpFamily family = cost::OpFamily::kOther, WorkFn work = {});
  /// Registers (or replaces) the whole entry of `qualified_op`.
  void add(const std::string& qualified_op, OpInfo info);
  /// The entry of the registered `qualified_op` (exact name), to set more of its fields; null when
  /// it is not registered.
  OpInfo* entry(const std::string& qualified_op);
  /// Sets the backward multiplier of the registered `qualified_op` (OpInfo::backward_multiplier);
  /// false when it is not registered.
  bool setBackwardMultiplier(const std::string& qualified_op, double multiplier);
  /// The rule for a node's op: exact "op.overload" first, then "op"; null when the entry has none.
  const Rule* find(const ir::Node& node) const;
  /// The whole entry for a node's op, by the same lookup as find.
  const OpInfo* findEntry(const ir::Node& node) const;
  /// Whether op node `n` draws random numbers (its entry's OpInfo::random).
  bool drawsRandomNumbers(const ir::Graph& g, const ir::Node& n) const;
  /// The share of node `n`'s priced compute (forward + backward) that its forward takes: 1 when
  /// no output takes a gradient, else 1 / (1 + its backward multiplier: the entry's
  /// OpInfo::backward_multiplier, or its family's, cost::backwardMultiplier).
  double forwardShare(const ir::Graph& g, const ir::Node& n) const;
  /// Sets the samples of the registered `qualified_op` (OpInfo::samples); false when it is not
  /// registered.
  bool setSamples(const std::string& qualified_op, SamplesFn samples);
  /// Registered op names (with or without a rule), sorted.
  std::vector<std::string> ops() const;

 private:
  std::map<std::string, OpInfo> rules_;
};

/// The registry with every rule family registered (pointwise, matrix, reduction, view,
/// normalization, softmax, embedding, loss, tensor ops, conv, factory, ...). Built once.
const Registry& defaultRegistry();

/// Checks that a single-dim strategy fits the node: one entry per input and output, a placement
/// exactly for the tensor ones, shard dims within rank, must_divide entries naming sharded dims.
/// The error names the node and the first offending entry.
Status checkDimStrategy(const RuleContext& c, const DimStrategy& s);

struct EnumerateOptions {
  /// Drop strategies dominated by another with identical placements and a lower cost. (Dominance
  /// across different placements depends on the neighbours' redistribution costs and is left to
  /// the solver.) Exact duplicates are always dropped.
  bool prune_dominated = true;
  /// The cost model that prices compute and the collectives inside ops (it must describe the
  /// mesh enumerated on); unset: the analytical model of `device` over the mesh's links.
  const cost::CostModel* cost_model = nullptr;
  /// Device for the compute costs without a cost model; unset: the built-in "h100".
  std::optional<cost::DeviceSpec> device;
  /// Options passed to the rules.
  RuleOptions rules;
  /// Reuse the strategies of nodes with the same (op, input/output types, shapes, dtypes,
  /// requires_grad, constants). Off only for testing.
  bool use_cache = true;
};

/// Strategies of one node.
struct NodeStrategies {
  ir::NodeId node;
  StrategyList strategies;  // shared with the nodes of the same (op, shapes, constants)
  bool fallback = false;    // no rule (or the rule declined): the Replicate-only strategy was used
};

/// Enumerates the strategies of every op node with a tensor (or Tensor[]) output, in graph order.
/// Shape nodes (only non-tensor outputs, like aten::size) and input/parameter nodes get none: the
/// solver gives placeholders their own choices. Deterministic; results for identical (op, shapes,
/// constants) are cached across nodes.
std::vector<NodeStrategies> enumerate(const ir::Graph& g, const mesh::DeviceMesh& mesh,
                                      const Registry& registry = defaultRegistry(),
                                      const EnumerateOptions& options = {});

/// Ops that fell back to Replicate-only (sorted, unique).
std::vector<std::string> fallbackOps(const ir::Graph& g, const std::vector<NodeStrategies>& s);

}  // namespace apc::strategy
