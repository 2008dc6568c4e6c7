//===- lib/solver/ilp.cpp - The integer program with COIN-OR CBC -----------===//
//
// Builds the program documented in apc/solver/ilp.h (constraints lettered (a)-(e) there) as a
// CoinPackedMatrix and solves it with CbcModel over Clp, through CbcMain0/CbcMain1 so that CBC's
// default cuts and heuristics apply. Infeasible problems are diagnosed by re-solving with one
// constraint group dropped at a time.
//
//===----------------------------------------------------------------------===//
#include "apc/solver/ilp.h"

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "CbcModel.hpp"
#include "CbcSolver.hpp"
#include "CoinPackedMatrix.hpp"
#include "CoinPackedVector.hpp"
#include "OsiClpSolverInterface.hpp"

namespace apc::solver {

namespace {

struct Outcome {
  bool feasible = false;
  bool optimal = false;
  bool hit_limit = false;
  std::vector<uint32_t> choice;
  double objective = 0;
  double bound = 0;
  int64_t variables = 0;
  int64_t constraints = 0;
};

int quietCallback(CbcModel*, int) {
  return 0;
}

/// Builds and solves; `use_pins` / `use_memory` drop constraint groups for diagnosis; when
/// `memory_objective` is set the objective is the memory of (e) instead of the cost.
Outcome run(const Problem& p, const SolverOptions& o, const std::set<std::string>& dropped_groups,
            bool use_memory, bool memory_objective) {
  std::vector<double> obj, collb, colub;
  std::vector<size_t> x_start(p.nodes.size());
  // (d) pins as bounds on x.
  for (size_t v = 0; v < p.nodes.size(); ++v) {
    const ProblemNode& n = p.nodes[v];
    x_start[v] = obj.size();
    bool pinned = n.pinned && !dropped_groups.count(n.pin_group);
    for (size_t s = 0; s < n.numStrategies(); ++s) {
      double c = memory_objective ? (n.memory.empty() ? 0.0 : n.memory[s]) : n.costs[s];
      bool allowed = std::isfinite(n.costs[s]) && (!pinned || *n.pinned == s);
      obj.push_back(std::isfinite(c) ? c : 0.0);
      collb.push_back(0.0);
      colub.push_back(allowed ? 1.0 : 0.0);
    }
  }
  const size_t num_x = obj.size();
  CoinPackedMatrix matrix(false, 0, 0);
  matrix.setDimensions(0, 0);
  std::vector<CoinPackedVector> rows;
  std::vector<double> rowlb, rowub;
  // (a) one strategy per node.
  for (size_t v = 0; v < p.nodes.size(); ++v) {
    CoinPackedVector r;
    for (size_t s = 0; s < p.nodes[v].numStrategies(); ++s)
      r.insert(static_cast<int>(x_start[v] + s), 1.0);
    rows.push_back(r);
    rowlb.push_back(1.0);
    rowub.push_back(1.0);
  }
  // e variables and the marginals (b), (c).
  for (const ProblemEdge& e : p.edges) {
    size_t ns = p.nodes[e.src].numStrategies(), nt = p.nodes[e.dst].numStrategies();
    std::vector<CoinPackedVector> src_rows(ns), dst_rows(nt);
    for (size_t s = 0; s < ns; ++s) src_rows[s].insert(static_cast<int>(x_start[e.src] + s), -1.0);
    for (size_t t = 0; t < nt; ++t) dst_rows[t].insert(static_cast<int>(x_start[e.dst] + t), -1.0);
    for (size_t s = 0; s < ns; ++s) {
      for (size_t t = 0; t < nt; ++t) {
        double c = e.costs[s * nt + t];
        if (!std::isfinite(c)) continue;
        int col = static_cast<int>(obj.size());
        obj.push_back(memory_objective ? 0.0 : c);
        collb.push_back(0.0);
        colub.push_back(1.0);
        src_rows[s].insert(col, 1.0);
        dst_rows[t].insert(col, 1.0);
      }
    }
    for (auto& r : src_rows) {
      rows.push_back(r);
      rowlb.push_back(0.0);
      rowub.push_back(0.0);
    }
    for (auto& r : dst_rows) {
      rows.push_back(r);
      rowlb.push_back(0.0);
      rowub.push_back(0.0);
    }
  }
  // (e) memory.
  if (p.memory && use_memory) {
    CoinPackedVector r;
    for (size_t v = 0; v < p.nodes.size(); ++v)
      for (size_t s = 0; s < p.nodes[v].memory.size(); ++s)
        if (p.nodes[v].memory[s] != 0)
          r.insert(static_cast<int>(x_start[v] + s), p.nodes[v].memory[s]);
    // A small relative slack absorbs rounding in bounds computed from fractions.
    double slack = 1e-9 * std::max(1.0, p.memory->high == kInfinity ? 1.0 : p.memory->high);
    rows.push_back(r);
    rowlb.push_back(p.memory->low - slack);
    rowub.push_back(std::isinf(p.memory->high) ? COIN_DBL_MAX : p.memory->high + slack);
  }
  matrix.setDimensions(0, static_cast<int>(obj.size()));
  for (const auto& r : rows) matrix.appendRow(r);

  OsiClpSolverInterface solver;
  solver.loadProblem(matrix, collb.data(), colub.data(), obj.data(), rowlb.data(), rowub.data());
  for (size_t i = 0; i < num_x; ++i) solver.setInteger(static_cast<int>(i));
  solver.messageHandler()->setLogLevel(o.log_level > 1 ? 1 : 0);

  Outcome out;
  out.variables = static_cast<int64_t>(obj.size());
  out.constraints = static_cast<int64_t>(rows.size());
  CbcModel model(solver);
  model.setLogLevel(o.log_level);
  CbcSolverUsefulData data;
  CbcMain0(model, data);
  data.noPrinting_ = o.log_level == 0;
  data.useSignalHandler_ = false;
  model.setLogLevel(o.log_level);
  std::string sec = std::to_string(std::max(1.0, o.time_limit_s));
  std::string threads = std::to_string(std::max(1, o.threads));
  std::string log = std::to_string(o.log_level);
  const char* argv[] = {"apc",       "-sec",  sec.c_str(), "-threads", threads.c_str(), "-log",
                        log.c_str(), "-slog", log.c_str(), "-solve",   "-quit"};
  CbcMain1(static_cast<int>(sizeof(argv) / sizeof(argv[0])), argv, model, quietCallback, data);

  const double* best = model.bestSolution();
  if (!best) return out;
  out.feasible = true;
  out.optimal = model.isProvenOptimal();
  out.hit_limit = model.isSecondsLimitReached();
  out.objective = model.getObjValue();
  out.bound = model.getBestPossibleObjValue();
  out.choice.resize(p.nodes.size());
  for (size_t v = 0; v < p.nodes.size(); ++v) {
    uint32_t pick = 0;
    double best_value = -1;
    for (size_t s = 0; s < p.nodes[v].numStrategies(); ++s) {
      double val = best[x_start[v] + s];
      if (val > best_value) {
        best_value = val;
        pick = static_cast<uint32_t>(s);
      }
    }
    out.choice[v] = pick;
  }
  return out;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

Error diagnoseInfeasible(const Problem& p, const SolverOptions& o) {
  std::set<std::string> groups;
  for (const auto& n : p.nodes)
    if (n.pinned) groups.insert(n.pin_group);
  std::vector<std::string> culprits;
  for (const std::string& g : groups)
    if (run(p, o, {g}, true, false).feasible) culprits.push_back(g.empty() ? "pins" : g);
  std::string msg = "no plan satisfies the constraints";
  if (p.memory && !run(p, o, {}, false, false).feasible) {
    // Pins alone are infeasible: memory is not the cause.
  } else if (p.memory) {
    Outcome min_mem = run(p, o, {}, false, true);
    Outcome feasible_without_memory = min_mem;
    if (feasible_without_memory.feasible) {
      double m = memoryOf(p, min_mem.choice);
      if (m > p.memory->high)
        return infeasible(msg + ": the memory budget is too small (needs at least " + fmt(m) +
                          " bytes, high allows " + fmt(p.memory->high) + ")");
      if (p.memory->low > 0)
        return infeasible(msg + ": the memory budget's low bound " + fmt(p.memory->low) +
                          " bytes cannot be reached with the other constraints");
    }
  }
  if (!culprits.empty()) {
    std::string list;
    for (const auto& c : culprits) list += (list.empty() ? "" : ", ") + c;
    return infeasible(msg + ": dropping any one of [" + list + "] makes it feasible");
  }
  return infeasible(msg + " (no single constraint group is to blame)");
}

}  // namespace

Expected<Solution> solve(const Problem& p, const SolverOptions& options) {
  APC_RETURN_IF_ERROR(p.validate());
  auto t0 = std::chrono::steady_clock::now();
  Outcome out = run(p, options, {}, true, false);
  if (!out.feasible) {
    if (out.hit_limit) return infeasible("the solver found no plan within the time limit");
    return diagnoseInfeasible(p, options);
  }
  Solution s;
  s.choice = out.choice;
  s.objective = evaluate(p, out.choice);
  if (!std::isfinite(s.objective))
    return internalError("CBC returned a solution that violates the problem");
  s.bound = out.bound;
  s.status = out.optimal ? "optimal" : out.hit_limit ? "time limit (feasible)" : "feasible";
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.variables = out.variables;
  s.constraints = out.constraints;
  return s;
}

}  // namespace apc::solver
