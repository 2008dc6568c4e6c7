//===- apc/spec/spec.h - The mesh and constraint spec (JSON) ---------------===//
//
// A Spec is everything the user tells the planner besides the model: the device mesh (shape, dim
// names, per-dim link bandwidth and latency), the device kind and its overrides, fixed placements
// of inputs and outputs, the parameter memory budget, the mixed precision policy, dynamic dims, and
// per-node pins. It is read from JSON (schemas/spec.schema.json describes what the parser accepts):
//
//   {"mesh": {"shape": [2, 4], "names": ["dp", "tp"],
//             "bandwidth_gbps": [50, 450], "latency_us": [10, 2]},
//    "device": "h100",  // or {"kind": "h100", "peak_tflops": {"bf16": 989},
//                       //     "hbm_bandwidth_gbps": 3350}
//    "world_size": 8,
//    "inputs": {"x": ["S(0)", "R"]},
//    "outputs": ["S(0)", "R"],  // a tree in the forward's output structure: OutputPlacementTree
//    "memory_budget": {"low": 0, "high": 0.25},
//    "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "f32", "output_dtype": "f32"},
//    "dynamic_batch": false,
//    "dynamic": [{"input": "tokens", "dim": 1, "min": 1, "max": 2048}],
//    "pins": [{"node": "linear_1", "placements": ["S(0)", "S(2)"]},
//             {"module": "layers.0.attention", "placements": ["S(0)", "R"]}]}
//
// Only "mesh" is required. Unknown keys are errors (they are usually typos). Every error is one
// line that starts with the JSON path of the offending value, like `$.mesh.bandwidth_gbps[1]: ...`.
//
// Numbers have sane ranges (finite, bounded; the constants below and in device_mesh.h):
//   mesh.shape: 1 to 4 dims, at most 65536 devices in all; bandwidth_gbps in [1e-3, 1e6];
//   latency_us in [0, 1e6]; device peak_tflops and hbm_bandwidth_gbps in [1e-3, 1e6];
//   memory_budget fractions in [0, 1]; dynamic: at most 1024 entries, dim in [0, 63], min and max
//   in [1, 2^40] and a recorded size (the hint) in [min, max]. JSON nests at most 64 levels.
//
// The CLI's `--in-shardings` and `--out-shardings` files are parsed here too (parseInShardings,
// parseOutShardings; schema: schemas/out_shardings.schema.json). A parsed spec is checked against a
// model by validateSpecAgainstGraph.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "apc/ir/graph.h"
#include "apc/ir/types.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/mesh/placement_json.h"
#include "apc/support/error.h"

namespace apc::spec {

// The mesh values a spec is made of (lib/mesh): its device mesh and links, and placement tuples.
using mesh::DeviceMesh;
using mesh::LinkParams;
using mesh::PlacementTuple;

/// The device kinds of the cost model's device table: "h100", "h200", "a100", "b200", "cpu".
const std::vector<std::string>& knownDeviceKinds();
bool isKnownDeviceKind(std::string_view kind);
/// The device kind of a Spec that names none.
inline constexpr const char* kDefaultDeviceKind = "h100";
/// The optimizer the memory model assumes unless the spec names another (what LLMs train with).
inline constexpr const char* kDefaultOptimizer = "adamw";

/// Overrides of the device table's entry for the spec's device kind; absent fields keep the
/// table's.
/// Measured kernel times by work (flops for matmuls, bytes for elementwise kernels), ascending,
/// at least two points: apc calibrate's tables, which the cost model interpolates.
struct KernelTable {
  std::vector<double> work;
  std::vector<double> us;

  bool operator==(const KernelTable&) const;  // defaulted in the .cpp (C++17 users)
};

struct DeviceOverrides {
  std::map<ir::DType, double> peak_tflops;      // dense peak per dtype, TFLOP/s (> 0)
  std::optional<double> hbm_bandwidth_gbps;     // GB/s (> 0)
  std::optional<double> compute_efficiency;     // (0, 1]: a calibrated device has measured peaks, 1
  std::optional<double> memory_efficiency;      // (0, 1]
  std::optional<double> kernel_floor_us;        // >= 0: the least time of any kernel
  std::optional<double> dispatch_us;            // >= 0: host time per op node (cost::DeviceSpec)
  std::optional<bool> dispatch_overlaps;        // the host runs ahead of the device (CUDA's queue)
  std::optional<double> view_dispatch_us;       // >= 0: host time per node of an op without kernel
  std::optional<double> overlap_efficiency;     // [0, 1]: what overlapped compute does not pay
  std::optional<double> wait_resume_us;         // >= 0: compute lost after a blocking collective
  std::optional<double> matmul_output_gbps;     // >= 0: a contraction's output beyond its flops
  std::optional<double> matvec_gbps;            // >= 0: a matrix-vector product's matrix read rate
  std::optional<double> outer_product_gbps;     // >= 0: an outer product's output write rate
  std::optional<double> conv_weight_gbps;       // >= 0: a conv's weight beyond its flops, forward
  std::optional<double> conv_weight_grad_gbps;  // >= 0: the same, backward (the weight's gradient)
  /// "measured": {"matmul": {"f32": {"flops": [...], "us": [...]}, ...},
  ///              "conv": {"f32": {"flops": [...], "us": [...]}, ...},
  ///              "elementwise": {"bytes": [...], "us": [...]}}
  std::map<ir::DType, KernelTable> matmul_us;
  std::map<ir::DType, KernelTable> conv_us;
  /// "measured": {"attention": {"f32": {"flops": [...], "us": [...]}}}:
  /// scaled_dot_product_attention.
  std::map<ir::DType, KernelTable> attention_us;
  /// "measured": {"ops": {"aten::tanh": {"bytes": [...], "us": [...]}}}: single ops whose kernels
  /// the elementwise curve does not describe (transcendental math, softmax, norms, pooling), f32,
  /// by the bytes their work counts (strategy::Work, the inputs' and outputs').
  std::map<std::string, KernelTable> op_us;
  std::optional<KernelTable> elementwise_us;
  /// "measured": {"nodes": {"aten::conv2d(f32[8,72,16,16]g, f32[72,1,3,3]g, None, [2, 2], ...)":
  ///                        {"forward_us": 280, "backward_us": 1010}}}: `apc calibrate --model`'s
  /// times of a model's op nodes with the local input shapes of its strategies
  /// (strategy::nodeTimeKey), {forward pass, backward pass} as the runtime's interpreter and
  /// autograd run them. The cost model prices a node whose key is here at these times.
  std::map<std::string, std::array<double, 2>> node_us;

  bool empty() const {
    return peak_tflops.empty() && !hbm_bandwidth_gbps && !compute_efficiency &&
           !memory_efficiency && !kernel_floor_us && !dispatch_us && !dispatch_overlaps &&
           !view_dispatch_us && !overlap_efficiency && !wait_resume_us && !matmul_output_gbps &&
           !matvec_gbps && !outer_product_gbps && !conv_weight_gbps && !conv_weight_grad_gbps &&
           matmul_us.empty() && conv_us.empty() && attention_us.empty() && op_us.empty() &&
           !elementwise_us && node_us.empty();
  }
  bool operator==(const DeviceOverrides&) const;  // defaulted in the .cpp (C++17 users)
};

/// Refinements of one mesh dim's link (Spec::network): measured links per collective kind (apc
/// calibrate: Gloo's all-gather is not half an all-reduce), and the topology of a mesh dim whose
/// groups span nodes. In JSON, one object per mesh dim:
///   {"all-gather": {"bandwidth_gbps": 2.1, "latency_us": 150,
///                   "measured": {"group_size": 2, "bytes": [4096, ...], "us": [340, ...]}},
///    "reduce-scatter": {...},
///    "all-reduce": {...}, "all-to-all": {...},
///    "ranks_per_node": 8, "inter_node": {"bandwidth_gbps": 50, "latency_us": 10}}
/// every key optional. A collective kind without a link uses the mesh dim's link; one with
/// measured times is priced by them on groups of their size (see apc/cost/cost_model.h). With
/// ranks_per_node q below the group size, the groups span nodes: collectives are priced
/// hierarchically, the kind's link inside a node and inter_node between nodes (see
/// apc/cost/cost_model.h).
/// Times a collective kind took on groups of `group_size` ranks, by full bytes (ascending, at
/// least two sizes): apc calibrate's measurements, which the cost model interpolates.
struct CollectiveTable {
  int64_t group_size = 0;
  std::vector<double> bytes;
  std::vector<double> us;

  bool operator==(const CollectiveTable&) const;  // defaulted in the .cpp (C++17 users)
};

struct MeshDimNetwork {
  /// Per collective kind, in the order all-gather, reduce-scatter, all-reduce, all-to-all.
  std::array<std::optional<LinkParams>, 4> by_kind;
  /// Per collective kind, measured times ("measured" beside the kind's link in JSON).
  std::array<std::optional<CollectiveTable>, 4> tables;
  int64_t ranks_per_node = 0;  // 0: every group within one node
  std::optional<LinkParams> inter_node;

  bool empty() const;
  bool operator==(const MeshDimNetwork&) const;  // defaulted in the .cpp (C++17 users)
};
/// "all-gather", "reduce-scatter", "all-reduce", "all-to-all": the keys of MeshDimNetwork.
inline constexpr const char* kNetworkKindKeys[4] = {"all-gather", "reduce-scatter", "all-reduce",
                                                    "all-to-all"};

/// Required placements of the forward's outputs, in the outputs' structure. In JSON:
///   null                      kFree: no constraint on this part
///   ["S(0)", "R"]             kLeaf: a placement tuple (an array whose elements are all strings)
///   [tree, tree, ...]         kSequence: a tuple or list (an array of arrays, objects and nulls)
///   {"key": tree, ...}        kDict: a dict output, by key
/// The empty array `[]` is an empty sequence (a placement tuple is never empty).
struct OutputPlacementTree {
  enum class Kind : uint8_t { kFree, kLeaf, kSequence, kDict };
  Kind kind = Kind::kFree;
  PlacementTuple placements;                  // kLeaf
  std::vector<std::string> keys;              // kDict: sorted, one per child
  std::vector<OutputPlacementTree> children;  // kSequence, kDict

  static OutputPlacementTree makeFree() { return {}; }
  static OutputPlacementTree makeLeaf(PlacementTuple t);
  static OutputPlacementTree makeSequence(std::vector<OutputPlacementTree> children);
  /// A dict node; the entries are stored sorted by key.
  static OutputPlacementTree makeDict(std::map<std::string, OutputPlacementTree> entries);

  bool isFree() const { return kind == Kind::kFree; }
  bool operator==(const OutputPlacementTree&) const;  // memberwise (C++17 users)
};

/// Compact text form for logs: `S(0)R`, `*` (free), `(S(0)R, *)`, `{logits: S(0)R, loss: RR}`.
std::string toString(const OutputPlacementTree& t);

/// Parameter memory per rank as a fraction of the total parameter bytes: low <= used <= high.
struct MemoryBudget {
  double low = 0;              // >= 0
  std::optional<double> high;  // (0, 1]; absent: the default (highOr)

  /// The budget's high as a fraction: the given one, else the default 1 / world size (every
  /// parameter fully sharded). The one home of that default; buildGraphProblem raises it to the
  /// least reachable footprint when some dim cannot be cut evenly (it alone knows the pieces), and
  /// the plan reports the high the solver used (Problem::memory).
  double highOr(int64_t world_size) const {
    return high.value_or(1.0 / static_cast<double>(world_size < 1 ? 1 : world_size));
  }

  /// What breaks the one rule of a budget, wherever it is given (a spec's memory_budget,
  /// `apc plan --memory-budget`, AutoParallel::add_parameter_memory_constraint): low in [0, 1],
  /// high in (0, 1], low <= high. `field` is "low" or "high", or "" when the two disagree.
  struct Violation {
    std::string field;
    std::string message;  // "a budget fraction must be in [0, 1], got -0.1"
    /// "low: MESSAGE" (the message alone when `field` is "").
    std::string text() const { return field.empty() ? message : field + ": " + message; }
  };
  /// The first violation, or nullopt for a valid budget.
  std::optional<Violation> violation() const;

  bool operator==(const MemoryBudget&) const;  // defaulted in the .cpp (C++17 users)
};

/// Mixed precision policy; absent fields keep the model's dtypes. All dtypes are floating.
struct MixedPrecision {
  std::optional<ir::DType> param_dtype;   // dtype parameters are computed in
  std::optional<ir::DType> reduce_dtype;  // dtype of gradient reductions
  std::optional<ir::DType> output_dtype;  // dtype of the forward's outputs

  bool empty() const { return !param_dtype && !reduce_dtype && !output_dtype; }
  bool operator==(const MixedPrecision&) const;  // defaulted in the .cpp (C++17 users)
};

/// Ranges of the spec's numbers beyond those of the mesh (device_mesh.h).
inline constexpr double kMinDeviceRate = 1e-3;     // peak TFLOP/s and HBM GB/s
inline constexpr double kMaxDeviceRate = 1e6;      //
inline constexpr size_t kMaxDynamicDims = 1024;    // entries of "dynamic"
inline constexpr int64_t kMaxTensorRank = 64;      // a dynamic dim's index is below this
inline constexpr int64_t kMaxDimSize = 1LL << 40;  // a dynamic dim's min and max

/// A dim of an input whose size varies between calls.
struct DynamicDim {
  std::string input;           // forward argument name
  int64_t dim = 0;             // >= 0
  int64_t min = 1;             // >= 1
  std::optional<int64_t> max;  // >= min; absent: unbounded

  bool operator==(const DynamicDim&) const;  // defaulted in the .cpp (C++17 users)
};

/// A user pin: the output placement of one node, or of the outputs of one module.
struct Pin {
  enum class Target : uint8_t { kNode, kModule };
  Target target = Target::kNode;
  /// kNode: an input/parameter/buffer name or an op's output value name as printed (`%linear_1`
  /// is named "linear_1"); kModule: a module path like "layers.0.attention".
  std::string name;
  PlacementTuple placements;

  bool operator==(const Pin&) const;  // defaulted in the .cpp (C++17 users)
};

struct Spec {
  DeviceMesh mesh;                          // required
  std::string device = kDefaultDeviceKind;  // one of knownDeviceKinds()
  DeviceOverrides device_overrides;
  std::optional<int64_t> world_size;             // when given, equals mesh.worldSize()
  std::map<std::string, PlacementTuple> inputs;  // fixed input placements, by argument name
  OutputPlacementTree outputs;                   // kFree when not given
  MemoryBudget memory_budget;
  MixedPrecision mixed_precision;
  bool dynamic_batch = false;       // dim 0 of every tensor input is dynamic
  std::vector<DynamicDim> dynamic;  // in the order given; no (input, dim) twice
  std::vector<Pin> pins;            // in the order given
  /// Scale in [0, 1] of the priced communication of parameter-derived edges (their all-gathers,
  /// re-gathers and gradient reductions can overlap other layers' compute): 0 fully overlapped, 1
  /// (the default, not written) no discount. See plan::buildProblem.
  double prefetch_discount = 1.0;
  /// "prefetch_discount": "schedule" (apc plan --prefetch-discount schedule): the discount is the
  /// share of the parameter-derived edges' communication that the runtime's overlap schedule
  /// hides (apc/lower/schedule.h, planner::refineForOverlap); prefetch_discount is then 1.
  bool schedule_discount = false;
  /// "shared_reads": true (apc plan --shared-reads): the solver charges a redistribution that
  /// several readers of one value share once, as lowering runs it (solver::SharedReads), instead
  /// of once per reader's edge. Off by default: plans are then often proven only to a gap (the
  /// bound of a relaxation) and memory-bound solves take longer (docs/DESIGN.md).
  bool shared_reads = false;
  /// Per mesh dim (empty, or one entry per mesh dim): links per collective kind and topology.
  std::vector<MeshDimNetwork> network;
  /// Bytes of memory per device (`apc plan --device-memory`, "device_memory": 85899345920 or
  /// "80GiB"): the plan is the fastest whose predicted peak per rank (apc/plan/memory.h) fits, in
  /// place of the fractional parameter budget, which must then be absent. Positive, < 2^62.
  std::optional<int64_t> device_memory;
  /// The optimizer whose state the memory model counts ("sgd", "momentum", "adamw"); written only
  /// when not the default.
  std::string optimizer = kDefaultOptimizer;

  bool operator==(const Spec&) const;  // defaulted in the .cpp (C++17 users)
};

/// Input placements from an `--in-shardings` file: either a list with one entry per forward input
/// in order (`[["S(0)", "R"], null]`, null = free), or an object by input name (`{"x": ["S(0)",
/// "R"]}`).
struct InputShardings {
  std::vector<std::optional<PlacementTuple>> by_position;  // the list form
  std::map<std::string, PlacementTuple> by_name;           // the object form (null entries dropped)

  bool operator==(const InputShardings&) const;  // defaulted in the .cpp (C++17 users)
};

// --- cluster profiles (apc calibrate)
// -------------------------------------------------------------

/// What `apc calibrate` measured, as the cost model takes it (schemas/cluster.schema.json):
///   {"apc_cluster_profile": 1,
///    "device": {"kind": "cpu", "peak_tflops": {...}, "hbm_bandwidth_gbps": ...,
///               "compute_efficiency": 1, "memory_efficiency": 1, "kernel_floor_us": ...},
///    "links": [{"bandwidth_gbps": ..., "latency_us": ...}, ...],   one per calibrated mesh dim
///    "network": [{"all-gather": {...}, ...}, ...],                  optional, one per link
///    "device_memory": 12000000000,                                  optional, bytes per rank
///    "calibration": {...}}                                          the raw measurements, kept
/// "device" has the spec's device syntax; "device_memory" the spec's (bytes, or "12GiB").
struct ClusterProfile {
  std::string device = kDefaultDeviceKind;
  DeviceOverrides device_overrides;
  std::vector<LinkParams> links;        // at least one
  std::vector<MeshDimNetwork> network;  // empty, or one per link: the links per collective kind
  /// Bytes of memory per rank where calibration measured it ("device_memory"; a CPU host's
  /// physical memory over its ranks): `apc plan --cluster` plans to fit it by default.
  std::optional<int64_t> device_memory;
  std::string calibration;  // what was measured, as JSON text (not used for pricing)
};
inline constexpr int kClusterProfileVersion = 1;

Expected<ClusterProfile> parseClusterProfile(const nlohmann::json& j);
/// Reads a cluster profile file; errors name the file and the JSON path.
Expected<ClusterProfile> readClusterProfile(const std::string& path);
nlohmann::json toJson(const ClusterProfile& p);
/// The cluster profile a built-in device kind stands for, or null. "cpu": what `apc calibrate
/// --nproc 2 --threads 1` measured on this project's kind of machine (lib/spec/cpu_cluster.json,
/// embedded in the build; its provenance in docs/TOOLCHAIN.md): the measured kernel curves,
/// dispatch times and Gloo's collectives over loopback. The cost model prices a spec of that kind
/// with it where the spec describes no device of its own (no device overrides) and, per mesh dim,
/// no link of its own (the default link, no network refinements): cost::costModelFor. The other
/// kinds (h100, ...) are datasheet numbers without a profile.
const ClusterProfile* builtinClusterProfile(std::string_view device);

/// Prices `spec` with the profile: its device kind and overrides replace the spec's; its links
/// replace the mesh's, one per mesh dim when it has as many, the same link on every mesh dim when
/// it has one. Another count is an error naming both.
Status applyClusterProfile(const ClusterProfile& p, Spec& spec);

// --- specs ---------------------------------------------------------------------------------------

/// Parses and checks a spec: types, unknown keys, ranges, placement tuple lengths against the mesh,
/// world size against the mesh. Errors start with the JSON path (`$.mesh.shape[1]: ...`).
/// The command-line form of a spec's mixed_precision, `param=bf16,reduce=f32[,output=f32]` (any
/// of the three keys, floating dtypes), checked by the same rules as the spec's JSON object.
/// Errors are one line naming the bad entry.
Expected<MixedPrecision> parseMixedPrecisionText(std::string_view text);

Expected<Spec> parseSpec(const nlohmann::json& j);
Expected<Spec> parseSpecText(std::string_view text);
/// Errors are prefixed by the file path.
Expected<Spec> parseSpecFile(const std::string& path);

/// The JSON form of a spec; parseSpec(toJson(s)) == s for every parsed spec. Fields at their
/// defaults are left out, except the mesh's names and links, which are always written.
nlohmann::json toJson(const Spec& s);

// --- CLI sharding files --------------------------------------------------------------------------

/// Parses an `--in-shardings` document; every tuple must have `mesh_ndim` entries.
Expected<InputShardings> parseInShardings(const nlohmann::json& j, size_t mesh_ndim);
Expected<InputShardings> parseInShardingsFile(const std::string& path, size_t mesh_ndim);
/// Parses an `--out-shardings` document (an OutputPlacementTree); every tuple must have `mesh_ndim`
/// entries.
Expected<OutputPlacementTree> parseOutShardings(const nlohmann::json& j, size_t mesh_ndim);
Expected<OutputPlacementTree> parseOutShardingsFile(const std::string& path, size_t mesh_ndim);

nlohmann::json toJson(const OutputPlacementTree& t);
nlohmann::json toJson(const InputShardings& s);

/// Names the by-position entries after the graph's input nodes (in graph order) and merges the
/// by-name ones: the result is by input name, free inputs left out. A list whose length differs
/// from the number of inputs, or a name that is not an input, is an error.
Expected<std::map<std::string, PlacementTuple>> resolveInShardings(const InputShardings& s,
                                                                   const ir::Graph& g);

// --- against a model -----------------------------------------------------------------------------

/// Checks a spec against a model: input names exist and are tensors, shard dims are below the
/// tensor's rank (inputs, outputs, node pins), dynamic dims exist, pinned nodes and module paths
/// exist, and the outputs tree has the structure of the graph's OutputTree. Errors start with the
/// spec's JSON path (`$.inputs.foo: spec names input 'foo' but the model's inputs are: x`).
Status validateSpecAgainstGraph(const Spec& s, const ir::Graph& g);

/// The names a node pin may use, each with the value it names: input, parameter and buffer names,
/// and the debug names of op outputs (validateSpecAgainstGraph checks pins against these; the
/// solver resolves pins through them).
std::map<std::string, ir::ValueId> pinNames(const ir::Graph& g);

}  // namespace apc::spec
