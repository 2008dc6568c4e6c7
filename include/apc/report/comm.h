//===- apc/report/comm.h - The collectives of a plan, as lowered -----------===//
//
// Names what each communicating edge of a plan runs: lowers rank 0's program (lib/lower: the same
// planner that priced the plan, so these are the executed collectives) and reads its
// redistributions: per edge the forward and backward collectives with their mesh dims (by name)
// and bytes, and the time the plan priced. Used by `apc plan --verbose`, `apc explain` (text,
// JSON, dot) and the C++ API's print_costs_for_node.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "apc/ir/graph.h"
#include "apc/layout/layout.h"
#include "apc/mesh/device_mesh.h"
#include "apc/plan/plan.h"
#include "apc/support/error.h"

namespace apc::plan {

struct NodeExplanation;  // apc/report/explain.h

struct CommStep {
  layout::StepKind kind = layout::StepKind::kAllGather;  // never kLocalSlice (left out)
  uint32_t mesh_dim = 0;
  int64_t bytes = 0;  // the full tensor along the mesh dim, as priced
};

/// One redistribution of rank 0's program that communicates (forward or backward).
struct EdgeComm {
  std::string edge;                    // "%x -> aten::linear #5 (input 0)", "%y -> output 0"
  std::optional<uint32_t> graph_node;  // the consumer's graph node (none for outputs)
  std::string sink;                    // for an output: its sink's plan name ("output %y")
  uint32_t input = 0;                  // the consumer's input index
  std::string from, to;                // placements, "S(0)R" -> "RR"
  std::vector<CommStep> forward, backward;
  double forward_us = 0, backward_us = 0;  // as priced
  bool regather = false;                   // a parameter gathered again in backward
  /// Its gradient's all-reduce runs in the runtime's buckets: backward_us is its share of a
  /// bucket's price beyond the latency, which the buckets pay once (cost::bucketedGradientUs).
  bool bucketed = false;
};

/// The communicating edges of `p` over `g` (rank 0's lowered program), in program order.
Expected<std::vector<EdgeComm>> edgeComms(const ir::Graph& g, const Plan& p);

/// "all-gather(dp, 4.00 MiB) + all-reduce(tp, 1.00 KiB)"; "-" when empty.
std::string stepsText(const std::vector<CommStep>& steps, const mesh::DeviceMesh& mesh);
/// "%x -> aten::linear #5 (input 0) S(0)R -> RR: fwd all-gather(dp, 4.00 MiB) | bwd
/// reduce-scatter(dp, 4.00 MiB) [12.5 us + 12.5 us]".
std::string edgeCommText(const EdgeComm& e, const mesh::DeviceMesh& mesh);
/// {"edge", "node" (graph node or null), "input", "from", "to", "forward": [{"kind", "mesh_dim",
/// "mesh_dim_name", "bytes"}], "backward": [...], "forward_us", "backward_us", "regather"}.
nlohmann::json toJson(const EdgeComm& e, const mesh::DeviceMesh& mesh);
/// Short labels for graph edges keyed by (consumer graph node, input): "AG(dp) 4 MiB".
std::map<std::pair<uint32_t, uint32_t>, std::string> edgeLabels(const std::vector<EdgeComm>& comms,
                                                                const mesh::DeviceMesh& mesh);
/// The same for the edges into output sinks, by the sink's plan name.
std::map<std::string, std::string> sinkLabels(const std::vector<EdgeComm>& comms,
                                              const mesh::DeviceMesh& mesh);
/// A text section "communication (rank 0's program): ..." of the edges into `graph_nodes` (all
/// edges when null).
std::string commSection(const std::vector<EdgeComm>& comms, const mesh::DeviceMesh& mesh,
                        const std::vector<uint32_t>* graph_nodes = nullptr);

/// What `apc explain --node` prints for one node: explanationText (apc/report/explain.h), then
/// the communication section of the edges into the node in rank 0's program lowered from `g`,
/// or why it is not shown ("communication: not shown (<why>)") when that program cannot be made.
std::string nodeExplanationText(const Plan& p, const NodeExplanation& e, const ir::Graph& g);
/// The part after the table: "\n" and commSection of the edges into `graph_nodes`, or "\n" and
/// "communication: not shown (<why_not>)\n" when `why_not` is not empty.
std::string commSectionOrWhy(const std::vector<EdgeComm>& comms, const std::string& why_not,
                             const mesh::DeviceMesh& mesh,
                             const std::vector<uint32_t>* graph_nodes);

}  // namespace apc::plan
