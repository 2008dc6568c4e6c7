//===- apc/solver/problem.h - The strategy-selection problem ---------------===//
//
// The solver's own problem type, independent of the IR (as in XLA's auto-sharding request): nodes
// with a cost per strategy, edges with a cost per pair of strategies, an optional linear memory
// bound, pins. It can be validated, evaluated for a given choice, dumped to JSON and read back
// (`apc plan --dump-problem`), and solved by the ILP in ilp.h or, for tiny problems, by brute
// force.
//
// Costs are in microseconds. An edge cost of +infinity forbids that pair of strategies.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "apc/support/error.h"

namespace apc::solver {

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();

struct ProblemNode {
  std::string name;                // for messages and dumps
  std::vector<double> costs;       // one per strategy (already scaled by the node's multiplicity)
  std::vector<double> memory;      // bytes per strategy counted by the memory bound; empty = none
  std::optional<uint32_t> pinned;  // the only allowed strategy
  std::string pin_group;           // which constraint group the pin belongs to ("inputs", ...)

  size_t numStrategies() const { return costs.size(); }
};

/// The values of an edge's cost table, shared between the edges that have the same table: the
/// copies of a repeated layer price the same questions (llama3_8b on 2x2x2: 100 M cells over its
/// 2,768 edges, 1.7 M of them distinct), so a copy of the table is a reference. Reads are those of
/// a const vector; a write (mutableValues, push_back) first copies values another table shares.
class CostTable {
 public:
  CostTable() = default;
  CostTable(std::vector<double> values)  // NOLINT(google-explicit-constructor): a vector's stand-in
      : values_(std::make_shared<std::vector<double>>(std::move(values))) {}
  CostTable(std::initializer_list<double> values) : CostTable(std::vector<double>(values)) {}

  size_t size() const { return values().size(); }
  bool empty() const { return values().empty(); }
  double operator[](size_t i) const { return values()[i]; }
  std::vector<double>::const_iterator begin() const { return values().begin(); }
  std::vector<double>::const_iterator end() const { return values().end(); }
  const std::vector<double>& values() const { return values_ ? *values_ : emptyValues(); }
  /// The values to write, copied first when another table shares them.
  std::vector<double>& mutableValues() {
    if (!values_)
      values_ = std::make_shared<std::vector<double>>();
    else if (values_.use_count() > 1)
      values_ = std::make_shared<std::vector<double>>(*values_);
    return *values_;
  }
  void push_back(double x) { mutableValues().push_back(x); }
  /// The same for tables that share their values (for work done once per distinct table).
  const void* identity() const { return values_.get(); }
  void pop_back() { mutableValues().pop_back(); }
  bool operator==(const CostTable& o) const {
    return values_ == o.values_ || values() == o.values();
  }

 private:
  static const std::vector<double>& emptyValues() {
    static const std::vector<double> none;
    return none;
  }
  std::shared_ptr<std::vector<double>> values_;
};

/// An edge's cost table, dense or factorized. Dense (both class maps empty): `costs` is
/// |S_src| x |S_dst|, row-major. Factorized: strategy s of src uses row src_class[s], strategy t of
/// dst column dst_class[t], and `costs` is (max src_class + 1) x num_dst_classes: the cost of an
/// edge depends only on the producer's output placement and the consumer's input (and gradient)
/// placement, of which a node has far fewer than strategies (on 3-d meshes, tens against hundreds),
/// so tables stay small and their consumers (the reduction, the ILP) work per class.
struct ProblemEdge {
  uint32_t src = 0;
  uint32_t dst = 0;
  CostTable costs;                       // +infinity = forbidden pair
  std::vector<uint32_t> src_class = {};  // per strategy of src; empty = dense
  std::vector<uint32_t> dst_class = {};  // per strategy of dst; empty = dense
  uint32_t num_dst_classes = 0;          // columns of a factorized table

  bool factorized() const { return !src_class.empty(); }
  double cost(size_t s, size_t t, size_t num_dst) const {
    return factorized() ? costs[src_class[s] * num_dst_classes + dst_class[t]]
                        : costs[s * num_dst + t];
  }
  /// Rows and columns of the table (`num_src`, `num_dst`: the end nodes' strategy counts).
  size_t tableRows(size_t num_src) const {
    return factorized() ? costs.size() / std::max<size_t>(1, num_dst_classes) : num_src;
  }
  size_t tableCols(size_t num_dst) const { return factorized() ? num_dst_classes : num_dst; }
  /// The row / column of a strategy.
  uint32_t rowOf(size_t s) const { return factorized() ? src_class[s] : static_cast<uint32_t>(s); }
  uint32_t colOf(size_t t) const { return factorized() ? dst_class[t] : static_cast<uint32_t>(t); }
};

/// low <= sum_v memory[v][x_v] <= high.
struct MemoryBound {
  double low = 0;
  double high = kInfinity;
  /// The bytes that a budget fraction of 1 means (all parameter bytes); > 0 lets an infeasible
  /// budget be reported as the smallest feasible `high` fraction.
  double total = 0;
  /// Bytes of the row already fixed outside this problem (nodes a reduction eliminated): the
  /// original row's sum is this problem's sum + offset.
  double offset = 0;
};

struct Problem {
  std::vector<ProblemNode> nodes;
  std::vector<ProblemEdge> edges;
  std::optional<MemoryBound> memory;

  /// Checks sizes, indices and that no cost is NaN or negative; errors name the node or edge.
  Status validate() const;
  size_t numStrategies() const;
};

/// How a solve ended; the plan's solver.status is its name (statusName).
enum class SolveStatus {
  kOptimal,    // the objective meets the proven bound
  kTimeLimit,  // stopped by the time limit or a deadline: the best plan found and its proven bound
  kFeasible,   // a plan without proof for another reason: the clustered plan's check would be an
              // LP too large to build (solve_graph_problem.cpp, kMaxCheckColumns), CBC's own limits
};

/// "optimal", "time_limit", "feasible".
const char* statusName(SolveStatus s);

struct Solution {
  std::vector<uint32_t> choice;  // one strategy per node
  double objective = 0;
  double bound = 0;  // best lower bound the solver proved
  SolveStatus status = SolveStatus::kOptimal;
  double seconds = 0;
  int64_t variables = 0;
  int64_t constraints = 0;
};

/// The objective of a choice; +infinity when a pair is forbidden, a pin or the memory bound is
/// violated.
double evaluate(const Problem& p, const std::vector<uint32_t>& choice);
/// Memory counted by the bound for a choice.
double memoryOf(const Problem& p, const std::vector<uint32_t>& choice);

/// Exhaustive search; for tests on problems with at most ~1e6 combinations.
Expected<Solution> bruteForce(const Problem& p);

nlohmann::json toJson(const Problem& p);
Expected<Problem> problemFromJson(const nlohmann::json& j);

}  // namespace apc::solver
