//===- apc/report/explain.h - Why the plan chose what it chose ---------------===//
//
// `apc explain`: the costliest nodes of a plan, and for one node every alternative strategy priced
// in the context of the plan, with all other nodes kept at their chosen strategies:
//
//   compute_us   the alternative's compute cost
//   in_comm_us   redistributing the chosen producers' outputs into the inputs it needs
//   out_comm_us  redistributing its output into what the chosen consumers need
//   here_us      compute_us + in_comm_us: what the node itself would cost (its cost_us in a plan)
//   context_us   here_us + out_comm_us: every term of the objective that the node's choice moves
//
// Status of each alternative, compared with the chosen one:
//   CHOSEN                              the plan's strategy
//   UNAVAILABLE                         forbidden: pinned to another strategy (by the inputs,
//                                       outputs or pins group), an infinite compute cost, no
//                                       redistribution to or from a chosen neighbour (an edge of
//                                       infinite cost), or the parameter memory budget would be
//                                       broken; `why` says which
//   TIE                                 context_us equal to the chosen one within 1e-9 relative
//   CHEAPER-HERE-BUT-COSTLIER-OVERALL   here_us below the chosen one's, context_us above: cheaper
//                                       for the node, dearer once its consumers pay to redistribute
//   COSTLIER                            dearer here and in context
//   CHEAPER-IN-CONTEXT                  cheaper in context: only possible when the solver did not
//                                       prove optimality (time limit) or the memory bound binds
//                                       elsewhere; `why` says so
// Since context_us holds every objective term the node's choice touches, an optimal plan has no
// available alternative cheaper in context.
//
// Per-alternative costs need the problem the plan was solved on: `apc explain` imports the model
// again from the path stored in the plan, rebuilds the problem from the stored spec and input
// shapes (rebuildProblem in pipeline.h checks that it matches the plan), and calls explainNode.
// The costliest-nodes list needs the plan alone.
//
// Three output forms: text (for people), JSON (canonical, for tools), and Graphviz dot of the op
// graph coloured by output placement (`apc explain plan.json --format dot | dot -Tsvg`).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "apc/ir/graph.h"
#include "apc/plan/plan.h"
#include "apc/solver/graph_problem.h"
#include "apc/support/error.h"

namespace apc::plan {

enum class AlternativeStatus : uint8_t {
  kChosen,
  kTie,
  kCheaperHereCostlierOverall,
  kCostlier,
  kCheaperInContext,
  kUnavailable,
};
/// "CHOSEN", "TIE", "CHEAPER-HERE-BUT-COSTLIER-OVERALL", "COSTLIER", "CHEAPER-IN-CONTEXT",
/// "UNAVAILABLE".
const char* statusName(AlternativeStatus s);

struct Alternative {
  uint32_t index = 0;    // strategy index in the node's list
  std::string strategy;  // Strategy::toString
  PlacementTuple output_placements;
  double compute_us = 0;
  double in_comm_us = 0;   // +infinity when a producer cannot feed it
  double out_comm_us = 0;  // +infinity when it cannot feed a consumer
  double here_us = 0;
  double context_us = 0;
  double delta_us = 0;  // context_us minus the chosen one's (+infinity when unavailable)
  std::optional<int64_t> param_bytes_per_rank;  // parameters only
  AlternativeStatus status = AlternativeStatus::kCostlier;
  std::string why;  // one line
};

struct NodeExplanation {
  uint32_t node = 0;  // plan node index
  std::string name, op, module_path;
  /// The chosen alternative first, then by context_us (unavailable ones last), ties by index.
  std::vector<Alternative> alternatives;
};

/// The plan node named `name` (PlanNode::name); an unknown name is a kNotFound error that suggests
/// close names.
Expected<uint32_t> findNode(const Plan& p, const std::string& name);
/// The costliest node (by cost_us, ties by index) whose module path is `path` or lies under it
/// (`layers.0` matches `layers.0.attention.wq`); kNotFound when there is none.
Expected<uint32_t> findModuleNode(const Plan& p, const std::string& path);

/// Indices of the `n` costliest nodes by cost_us (ties by index).
std::vector<uint32_t> costliestNodes(const Plan& p, size_t n);

/// Explains one node against the problem the plan was solved on (see rebuildProblem). `g`, when
/// given, lets UNAVAILABLE reasons say why a redistribution is impossible.
Expected<NodeExplanation> explainNode(const Plan& p, const solver::GraphProblem& gp, uint32_t node,
                                      const ir::Graph* g = nullptr);

/// Text of the costliest-nodes table (with the plan's totals).
std::string topNodesText(const Plan& p, size_t n);

/// Where the step goes by module: nodes summed per repeated layer kind ("layers.0-31": every
/// layer of a stack, repeatedLayerOf's stem) or per first path component ("tok_embeddings"),
/// costliest first, at most `n`; with each row's share of the step. For deep models, where every
/// single node is a fraction of a percent.
struct ModuleCost {
  std::string module;  // "layers.0-31", "tok_embeddings", "-" (top level)
  int layers = 1;      // layers summed in the row
  int nodes = 0;
  double compute_us = 0, comm_us = 0, cost_us = 0;
};
std::vector<ModuleCost> costliestModules(const Plan& p, size_t n);
std::string topModulesText(const Plan& p, size_t n);
/// Text of one node's alternatives.
std::string explanationText(const Plan& p, const NodeExplanation& e);

/// {"totals": ..., "top": [...], "node": {...}} (node only when given).
nlohmann::json explainJson(const Plan& p, size_t top, const NodeExplanation* e);

/// `apc explain PLAN --target S(0)R` (AutoParallel's explain_placement(target)): for every node,
/// the cost of its chosen strategy against the cheapest strategy of that node whose (first)
/// output is placed `target`, and the delta.
///
/// Node-local, as explainNode prices alternatives: each node is priced alone with every other
/// node at its chosen strategy, and a strategy's cost is its here_us (compute + redistributing the
/// chosen producers' outputs into what it needs; for the chosen strategy that is the node's
/// cost_us in the plan). It ignores what the node's consumers would pay to take the new output and
/// that neighbours moving together change each other's edges: total_delta_us is the sum of
/// independent per-node deltas, not the step of a plan with the target everywhere. A strategy is
/// available as explainNode's are: not pinned away, finite here, its edges to the chosen
/// neighbours possible, parameter memory within the budget.
struct TargetRow {
  uint32_t node = 0;  // plan node index
  std::string name, op, module_path;
  std::string chosen_strategy;
  double current_us = 0;                 // the chosen strategy's here_us (= cost_us)
  bool already = false;                  // the chosen strategy's output is the target
  std::optional<uint32_t> target_index;  // the cheapest available strategy outputting the target
  std::string target_strategy;
  double target_us = 0;  // its here_us
  double delta_us = 0;   // target_us - current_us
  std::string why;       // without a target strategy: why (one line)
};
struct TargetExplanation {
  PlacementTuple target;
  std::vector<TargetRow> rows;  // every plan node, in plan order
  double current_us = 0;        // sum of current_us (= the plan's total)
  double total_delta_us = 0;    // sum of delta_us over the rows with a target strategy
  size_t can = 0;               // rows with a target strategy
  size_t already = 0;           // rows whose chosen output is the target
};
/// kInvalidArgument when `target` has not one entry per mesh dim.
Expected<TargetExplanation> explainTarget(const Plan& p, const solver::GraphProblem& gp,
                                          const PlacementTuple& target);
std::string targetText(const TargetExplanation& t);
nlohmann::json targetJson(const Plan& p, const TargetExplanation& t);

/// `apc explain PLAN --node N --matrix --input K` (AutoParallel's print_costs_for_node): what the
/// planner charges to redistribute input K of node N, from each placement its producer's
/// strategies output (rows) into each placement N's strategies need there (columns), in us
/// (forward and backward, +infinity where impossible). The entries are the rebuilt problem's
/// edge table, i.e. the planner's own prices (rebuildProblem reruns the construction with the
/// cost model of the plan's spec); strategies with equal placements share a row or column.
struct RedistributionMatrix {
  uint32_t node = 0, input = 0, producer = 0;  // plan node indices and the input index
  std::vector<PlacementTuple> rows, columns;
  std::vector<std::vector<double>> us;  // [row][column]
  size_t chosen_row = 0, chosen_column = 0;
  double charged_us = 0;  // the plan's cost of this edge (PlanEdge::cost_us)
};
/// kNotFound when input K of the node has no producer edge (a constant, a non-tensor input or
/// an index past its inputs; the message lists the inputs that have one). `g`, when given, picks
/// the producer output that feeds the input (else its first output).
Expected<RedistributionMatrix> redistributionMatrix(const Plan& p, const solver::GraphProblem& gp,
                                                    uint32_t node, uint32_t input,
                                                    const ir::Graph* g = nullptr);
std::string matrixText(const Plan& p, const RedistributionMatrix& m);
nlohmann::json matrixJson(const Plan& p, const RedistributionMatrix& m);

struct DotOptions {
  /// Labels of communicating edges by (consumer graph node, input index): the collectives, mesh
  /// dims and bytes (apc explain fills it from the lowered program); edges without one that
  /// cost something are labelled with their cost.
  std::map<std::pair<uint32_t, uint32_t>, std::string> edge_labels;
  /// Labels of the edges into output and pin sinks (no graph node), by the sink's plan name
  /// ("output %y").
  std::map<std::string, std::string> sink_labels;
  bool parameters = true;  // draw parameters and buffers (small ellipses) with their placement
  bool modules = true;     // one nested cluster per module path (layers / layers.0 / ...)
  /// Module paths deeper than this many components are drawn as one box per module (its op
  /// count and cost); 0: no collapsing.
  size_t collapse_depth = 0;
};

/// The fill colour of an output placement ("S(0)R") in every picture (dot, SVG, HTML): a function
/// of the placement's text alone, so a placement has the same colour in every plan. Replicated:
/// grey; with a partial entry: a warm colour; sharded: a cool one; "" or "-": white.
std::string placementColour(const std::string& placement);
/// What every mark of the pictures means (placements, colours, collectives, shapes), one line
/// each: the pictures' legend.
std::vector<std::string> pictureMarks();

/// Graphviz dot of the plan's nodes with their data edges: each node labelled with its name, op
/// and output placement and filled with its placement's colour (placementColour; legend of the
/// placements and of every mark included), parameters as ellipses, modules as clusters in model
/// order (see DotOptions).
std::string dotGraph(const Plan& p, const DotOptions& options = {});

struct PictureOptions {
  /// As DotOptions::edge_labels and sink_labels: the collectives of each communicating edge.
  std::map<std::pair<uint32_t, uint32_t>, std::string> edge_labels;
  std::map<std::string, std::string> sink_labels;
};

/// The plan as one static SVG (lib/report/picture.cpp): a per-module cost chart (compute and
/// communication), the placement legend, and the module tree as nested boxes holding their nodes
/// (ops as boxes, parameters as pills) coloured by output placement, communicating edges' targets
/// outlined in red with their collectives (wrapped, never cut); a run of repeated layers placed
/// alike is the first drawn and one dashed box counting the others.
std::string svgPicture(const Plan& p, const PictureOptions& options = {});
/// The same content as a self-contained HTML page whose modules are collapsible sections.
std::string htmlPicture(const Plan& p, const PictureOptions& options = {});

}  // namespace apc::plan
