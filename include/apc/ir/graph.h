//===- apc/ir/graph.h - Graph, Node, Value ---------------------------------===//
//
// The IR the planner works on: a Graph is a topologically ordered list of Nodes over Values.
//
// - Node kinds: Input (a forward argument, `name` is the argument name), Parameter and Buffer
// (`name`
//   is the fully qualified name as named_parameters()/named_buffers() give it), and Op (an ATen or
//   prim operator, `op` is the schema name like "aten::linear" and `overload` the overload name,
//   kept exactly so that the runtime can resolve the same operator).
// - A Value is produced by one node output, or is a graph-level constant (no producer). Tensor
// values
//   carry a TensorMeta with the global shape. Non-tensor values (ints from aten::size, int lists,
//   tuples) are kept and flagged: the planner skips them, lowering rewrites them to local sizes.
// - The graph's outputs keep the forward's structure (tuples, lists, dicts) as an OutputTree.
//
// Ids are dense indices into the graph's arrays; they are typed so that a NodeId cannot be passed
// where a ValueId is meant.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/types.h"
#include "apc/support/error.h"

namespace apc::ir {

/// A dense, typed index.
template <typename Tag>
struct Id {
  static constexpr uint32_t kInvalid = std::numeric_limits<uint32_t>::max();
  uint32_t v = kInvalid;

  constexpr Id() = default;
  constexpr explicit Id(uint32_t value) : v(value) {}
  constexpr bool valid() const { return v != kInvalid; }
  // Spelled out, not `<=> = default`: the installed headers are C++17.
  constexpr bool operator==(const Id& o) const { return v == o.v; }
  constexpr bool operator!=(const Id& o) const { return v != o.v; }
  constexpr bool operator<(const Id& o) const { return v < o.v; }
  constexpr bool operator<=(const Id& o) const { return v <= o.v; }
  constexpr bool operator>(const Id& o) const { return v > o.v; }
  constexpr bool operator>=(const Id& o) const { return v >= o.v; }
};
struct NodeTag {};
struct ValueTag {};
using NodeId = Id<NodeTag>;
using ValueId = Id<ValueTag>;

enum class ValueType : uint8_t {
  kTensor,
  kInt,
  kFloat,
  kBool,
  kString,
  kDevice,
  kNone,
  kIntList,
  kFloatList,
  kBoolList,
  kTensorList,
  kTuple,
  kOther,
};
const char* valueTypeName(ValueType t);

struct Value {
  ValueId id;
  ValueType type = ValueType::kOther;
  std::string debug_name;            // the TorchScript name without '%', for printing
  std::optional<TensorMeta> tensor;  // set iff type == kTensor
  std::vector<TensorMeta> elements;  // element metas of a kTensorList (when known)
  std::optional<Constant> constant;  // the value, when known at import time
  NodeId producer;                   // invalid for graph-level constants
  uint32_t producer_output = 0;

  bool isTensor() const { return type == ValueType::kTensor; }
  /// Whether the value is or may hold a tensor (a tensor, a list of them, a tuple, an unknown
  /// type); sizes, scalars and their lists do not.
  bool mayHoldTensors() const {
    return type == ValueType::kTensor || type == ValueType::kTensorList ||
           type == ValueType::kTuple || type == ValueType::kOther;
  }
};

enum class NodeKind : uint8_t { kInput, kParameter, kBuffer, kOp };
const char* nodeKindName(NodeKind k);

struct Node {
  NodeId id;
  NodeKind kind = NodeKind::kOp;
  std::string op;        // "aten::linear"; "input", "parameter", "buffer" for the other kinds
  std::string overload;  // schema overload name ("Tensor", "int", ...); empty for the default
  std::string name;      // input name or fully qualified parameter/buffer name; empty for ops
  std::vector<ValueId> inputs;
  std::vector<ValueId> outputs;
  std::string module_path;  // "layers.3.attention.wq"; empty at the top level
  std::string source;       // "model.py:42" when known

  /// "aten::add.Tensor" (or just "aten::relu" without overload).
  std::string qualifiedOp() const { return overload.empty() ? op : op + "." + overload; }
};

/// apc's own overload of aten::einsum, written by the importers' last pass: the operands are the
/// node's inputs 1.. (each with its own placement) instead of one Tensor[] input; the runtime packs
/// them into the list aten::einsum takes.
inline constexpr std::string_view kEinsumOperandsOverload = "operands";

/// The forward's output structure.
struct OutputTree {
  enum class Kind : uint8_t { kLeaf, kTuple, kList, kDict };
  Kind kind = Kind::kLeaf;
  ValueId leaf;                      // kLeaf
  std::vector<std::string> keys;     // kDict: one key per child
  std::vector<OutputTree> children;  // kTuple, kList, kDict

  static OutputTree makeLeaf(ValueId v) {
    OutputTree t;
    t.leaf = v;
    return t;
  }
  /// The leaves, depth first.
  std::vector<ValueId> leaves() const;
};

/// Users of a value: (node, input position) pairs in node order.
struct Use {
  NodeId node;
  uint32_t input_index = 0;
};

class Graph {
 public:
  /// Adds a value and returns its id (the id field is assigned).
  ValueId addValue(Value v);
  /// Adds a node after all existing nodes; sets the producer of its outputs.
  NodeId addNode(Node n);
  /// Adds a graph-level constant value of the given type.
  ValueId addConstant(ValueType type, Constant c, std::string debug_name = {});

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  const Node& node(NodeId id) const { return nodes_.at(id.v); }
  Node& node(NodeId id) { return nodes_.at(id.v); }
  const Value& value(ValueId id) const { return values_.at(id.v); }
  Value& value(ValueId id) { return values_.at(id.v); }
  size_t numNodes() const { return nodes_.size(); }
  size_t numValues() const { return values_.size(); }

  /// Nodes of one kind, in graph order.
  std::vector<NodeId> nodesOfKind(NodeKind k) const;
  /// The input node with the given argument name, if any.
  std::optional<NodeId> findInput(const std::string& name) const;
  /// The Parameter/Buffer node with the given fully qualified name, if any.
  std::optional<NodeId> findParameter(const std::string& name) const;

  /// For each value, its users in node order. Recomputed on each call.
  std::vector<std::vector<Use>> computeUses() const;

  /// True when every output of the node is a non-tensor value (size arithmetic, lists, ...).
  bool isShapeNode(NodeId id) const;

  OutputTree& outputs() { return outputs_; }
  const OutputTree& outputs() const { return outputs_; }
  void setOutputs(OutputTree t) { outputs_ = std::move(t); }

  std::string name;  // model name (file stem), for printing

  /// Removes the nodes whose `dead[id]` is true (import-time rewrites that fold a node into
  /// another): the others keep their order and are renumbered. Value ids do not change: the
  /// outputs of a removed node become None constants, which nothing may still read.
  void removeNodes(const std::vector<bool>& dead);

  /// Checks ids, producers and topological order. Errors name the first offending node.
  Status verify() const;

 private:
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  OutputTree outputs_;
};

/// Activation checkpointing's unit: the nodes of one module, contiguous in node order.
struct NodeRange {
  uint32_t first = 0;  // node ids, inclusive
  uint32_t last = 0;
};

/// True when `path` is `module` or below it ("layers.3.mlp" is in "layers.3", "layers.30" not).
bool inModule(std::string_view path, std::string_view module);

/// Ops that update running statistics in place (BatchNorm and InstanceNorm in training: their
/// arguments 3 and 4, running_mean and running_var). The functional and inference forms are pure.
bool updatesRunningStats(const std::string& op);

/// The inputs `n` writes in place: argument 0 of an in-place op (a name ending in '_'), the
/// running statistics of an op that updates them.
std::vector<ValueId> writtenInPlace(const Node& n);

/// The values defined before node `first` that nodes [first, last] may write in place: what
/// writtenInPlace names, followed back through the range's own nodes by their first input (a view
/// or a local slice of an outside buffer, written through). Ascending ids.
std::vector<ValueId> outsideValuesWritten(const Graph& g, uint32_t first, uint32_t last);

/// The nodes [first, last] of module `module` when it can be recomputed in backward (activation
/// checkpointing: the runtime runs the range again from what it reads from outside): the range
/// holds every op node of the module and only op nodes of it and buffer leaves (its parameters'
/// leaf nodes are outside, read like any outside value, and so are buffers), the only outside
/// values it writes are buffers (a BatchNorm's running statistics and num_batches_tracked: the
/// recomputation writes copies, so they are updated once per step, as without checkpointing), and
/// every value it defines that a later node or the graph's outputs read is a tensor or holds none
/// (a size computed in one layer and read by the next: the forward's value is passed on). nullopt
/// otherwise, or when the module has no op node.
std::optional<NodeRange> checkpointRange(const Graph& g, std::string_view module);

/// Lowering's cast of a buffer to the compute dtype under mixed precision (an aten::to of no
/// module reading a buffer's leaf): the buffer's state, as the leaf is (an op that updates it in
/// place updates the buffer: the runtime writes the cast copy back).
bool isBufferCast(const Graph& g, const Node& n);

}  // namespace apc::ir
