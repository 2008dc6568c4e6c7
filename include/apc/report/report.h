//===- apc/report/report.h - Printed forms of a plan -------------------------===//
//
// What `apc plan` prints: the summary (estimated step time split into compute and communication,
// parameter memory, per-parameter placements grouped by module, problem sizes before and after
// reduction, solver status, objective and bound, time per phase) and, with --verbose, the
// optimizer log in the manner of AutoParallel's: one line per node with its placement
// `placement=<inputs> -> <output>` and its (comm, compute) cost, totals at the end.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/plan/plan.h"
#include "apc/planner/pipeline.h"

namespace apc::plan {

/// A node as logs print it: "%linear_1" (the value it defines), or "output %y" for output sinks.
std::string displayName(const PlanNode& n);

// formatMicros ("12.35 us", "4.50 ms", "1.20 s") is apc/plan/plan.h's.
/// A cost difference: "+1.250 us", "-0.500 us"; "+inf" when not finite.
std::string formatSignedMicros(double us);

/// The summary `apc plan` prints. With `timings`, the solver line ends with the solver's own time
/// and a last line gives the time per phase; without, neither is printed.
/// The repeated layer a module belongs to: its path through the first numbered component
/// ("layers.3.attention.wq" -> "layers.3", "model.layers.0.mlp" -> "model.layers.0"); "" when no
/// component is a number. The summary and `apc diff` group by it.
std::string repeatedLayerOf(const std::string& module_path);
/// The module a node or change is counted under: its repeated layer, else its path's first
/// component ("tok_embeddings"); "-" at the top level.
std::string moduleGroupOf(const std::string& module_path);

std::string summaryText(const Plan& p, const PhaseTimings* timings);

/// The predicted memory per rank (apc/plan/memory.h) for the spec's optimizer, what its peak is
/// made of, the device memory when the spec gives one, and the peaks under the other optimizers;
/// "" for a plan without an estimate.
std::string memoryText(const Plan& p);
/// "" when the plan's parameter memory per rank is within its budget, else "; OVER the budget:
/// <baseline> keeps 100.00% per rank, the budget allows 0.00% to 25.00%" (baselines ignore the
/// budget; the optimizer never exceeds it).
std::string budgetNote(const Plan& p);

/// The lines a planning run prints before its summary (stderr for apc plan, the log for
/// optimize_placement(verbose)): a warning per op without a sharding rule, and the prefetch
/// discount with the number of edges it scaled. "" when there is nothing to say.
std::string buildNotes(const BuiltProblem& built, const spec::Spec& spec);

/// Op nodes that draw random numbers, as their registry entries say (strategy::OpInfo::random:
/// dropout with p != 0 not in eval, bernoulli, rand*, normal, uniform, ...). The runtime does not
/// reproduce a single device's random stream under sharding.
std::vector<ir::NodeId> randomNodes(const ir::Graph& g);
/// "" without random nodes, else one line naming them and saying that a sharded run matches a
/// single-device run in distribution only.
std::string randomnessNote(const ir::Graph& g);

/// The optimizer log: per node `#<i> %<name>  <op>  <module>  placement=<in> -> <out>
/// cost=(comm <c>, compute <c>)`, then the totals.
std::string optimizerLog(const Plan& p);

}  // namespace apc::plan
