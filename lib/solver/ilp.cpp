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
  StartOutcome how = StartOutcome::kLpIntegral;
};

int quietCallback(CbcModel*, int) {
  return 0;
}

/// The strategy with the largest x value per node.
std::vector<uint32_t> pickChoice(const Problem& p, const std::vector<size_t>& x_start,
                                 const double* sol) {
  std::vector<uint32_t> choice(p.nodes.size());
  for (size_t v = 0; v < p.nodes.size(); ++v) {
    double best_value = -1;
    for (size_t s = 0; s < p.nodes[v].numStrategies(); ++s) {
      double val = sol[x_start[v] + s];
      if (val > best_value) {
        best_value = val;
        choice[v] = static_cast<uint32_t>(s);
      }
    }
  }
  return choice;
}

/// Builds and solves; `use_pins` / `use_memory` drop constraint groups for diagnosis; when
/// `memory_objective` is set the objective is the memory of (e) instead of the cost. `start`: a
/// feasible choice of the full program (see solve() with a start in ilp.h).
Outcome run(const Problem& p, const SolverOptions& o, const std::set<std::string>& dropped_groups,
            bool use_memory, bool memory_objective, const std::vector<uint32_t>* start = nullptr) {
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
  // e variables and the marginals (b), (c), over classes of strategies: strategies of u whose
  // rows of the cost matrix are identical (typically: the same output placement) share one class,
  // likewise for v's columns. Then (b) reads sum_Q e[P,Q] = sum_{s in P} x[u,s] and (c) likewise;
  // for integral x this is the same set of solutions, with far fewer e variables.
  for (const ProblemEdge& e : p.edges) {
    size_t ns = p.nodes[e.src].numStrategies(), nt = p.nodes[e.dst].numStrategies();
    std::vector<uint32_t> row_class(ns), col_class(nt);
    std::vector<size_t> row_rep, col_rep;  // a representative strategy per class
    {
      std::map<std::vector<double>, uint32_t> seen;
      for (size_t s = 0; s < ns; ++s) {
        std::vector<double> row(e.costs.begin() + static_cast<long>(s * nt),
                                e.costs.begin() + static_cast<long>((s + 1) * nt));
        auto [it, fresh] = seen.emplace(std::move(row), static_cast<uint32_t>(row_rep.size()));
        if (fresh) row_rep.push_back(s);
        row_class[s] = it->second;
      }
    }
    {
      std::map<std::vector<double>, uint32_t> seen;
      for (size_t t = 0; t < nt; ++t) {
        std::vector<double> col(ns);
        for (size_t s = 0; s < ns; ++s) col[s] = e.costs[s * nt + t];
        auto [it, fresh] = seen.emplace(std::move(col), static_cast<uint32_t>(col_rep.size()));
        if (fresh) col_rep.push_back(t);
        col_class[t] = it->second;
      }
    }
    std::vector<CoinPackedVector> src_rows(row_rep.size()), dst_rows(col_rep.size());
    for (size_t s = 0; s < ns; ++s)
      src_rows[row_class[s]].insert(static_cast<int>(x_start[e.src] + s), -1.0);
    for (size_t t = 0; t < nt; ++t)
      dst_rows[col_class[t]].insert(static_cast<int>(x_start[e.dst] + t), -1.0);
    for (size_t a = 0; a < row_rep.size(); ++a) {
      for (size_t b = 0; b < col_rep.size(); ++b) {
        double c = e.costs[row_rep[a] * nt + col_rep[b]];
        if (!std::isfinite(c)) continue;
        int col = static_cast<int>(obj.size());
        obj.push_back(memory_objective ? 0.0 : c);
        collb.push_back(0.0);
        colub.push_back(1.0);
        src_rows[a].insert(col, 1.0);
        dst_rows[b].insert(col, 1.0);
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
  // One row-ordered matrix from the rows at once: appending row by row reallocated the matrix
  // and took longer than the LP itself.
  std::vector<CoinBigIndex> starts;
  std::vector<int> lengths, indices;
  std::vector<double> elements;
  starts.reserve(rows.size() + 1);
  lengths.reserve(rows.size());
  for (const auto& r : rows) {
    starts.push_back(static_cast<CoinBigIndex>(indices.size()));
    lengths.push_back(r.getNumElements());
    indices.insert(indices.end(), r.getIndices(), r.getIndices() + r.getNumElements());
    elements.insert(elements.end(), r.getElements(), r.getElements() + r.getNumElements());
  }
  starts.push_back(static_cast<CoinBigIndex>(indices.size()));
  CoinPackedMatrix matrix(false, static_cast<int>(obj.size()), static_cast<int>(rows.size()),
                          static_cast<CoinBigIndex>(indices.size()), elements.data(),
                          indices.data(), starts.data(), lengths.data());

  OsiClpSolverInterface solver;
  solver.loadProblem(matrix, collb.data(), colub.data(), obj.data(), rowlb.data(), rowub.data());
  for (size_t i = 0; i < num_x; ++i) solver.setInteger(static_cast<int>(i));
  solver.messageHandler()->setLogLevel(o.log_level > 1 ? 1 : 0);

  Outcome out;
  out.variables = static_cast<int64_t>(obj.size());
  out.constraints = static_cast<int64_t>(rows.size());

  // The marginal polytope is usually integral on our graphs: solve the LP relaxation first, and
  // when its optimum is integral in x it is the ILP's optimum (skipping CBC's preprocessing, cuts
  // and heuristics, which dominate the time on large problems).
  // Dual simplex (after Clp's presolve): on these LPs, with an equality row per class marginal
  // and most edge columns at zero, it took 0.1-0.2 s on llama3_8b 8x8 where Clp's default
  // (idiot crash, then primal) took 1.4 s.
  ClpSolve lp_options;
  lp_options.setSolveType(ClpSolve::useDual);
  solver.setSolveOptions(lp_options);
  solver.initialSolve();
  if (solver.isProvenPrimalInfeasible()) return out;
  const double start_objective = start ? evaluate(p, *start) : kInfinity;
  if (solver.isProvenOptimal()) {
    // The LP optimum bounds every integral choice from below: a start that meets it is optimal.
    // The relative tolerance covers the LP's own rounding (its objective can sit a hair below the
    // value of an optimal vertex); it is far below the 1e-6 the tests ask of "the same optimum".
    const double lp = solver.getObjValue();
    if (start && start_objective <= lp + 1e-9 * std::max(1.0, std::fabs(lp))) {
      out.feasible = out.optimal = true;
      out.objective = start_objective;
      out.bound = std::min(lp, start_objective);
      out.choice = *start;
      out.how = StartOutcome::kStartProven;
      return out;
    }
    const double* sol = solver.getColSolution();
    bool integral = true;
    for (size_t i = 0; i < num_x && integral; ++i)
      integral = std::fabs(sol[i] - std::round(sol[i])) < 1e-7;
    if (integral) {
      out.feasible = out.optimal = true;
      out.objective = out.bound = solver.getObjValue();
      out.choice = pickChoice(p, x_start, sol);
      return out;
    }
  }
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
  // With a start, its objective (plus a hair, so that CBC may still return an equal choice) is the
  // cutoff: CBC prunes every node that cannot beat it, and "no solution" then means that none is
  // cheaper than the start.
  char cutoff[64];
  std::snprintf(cutoff, sizeof cutoff, "%.17g",
                start_objective + 1e-9 * std::max(1.0, std::fabs(start_objective)));
  std::vector<const char*> argv = {"apc",  "-sec",      sec.c_str(), "-threads", threads.c_str(),
                                   "-log", log.c_str(), "-slog",     log.c_str()};
  if (start) {
    argv.push_back("-cutoff");
    argv.push_back(cutoff);
  }
  argv.push_back("-solve");
  argv.push_back("-quit");
  CbcMain1(static_cast<int>(argv.size()), argv.data(), model, quietCallback, data);

  out.how = StartOutcome::kBranchAndBound;
  out.hit_limit = model.isSecondsLimitReached();
  const double* best = model.bestSolution();
  std::vector<uint32_t> found;
  if (best) found = pickChoice(p, x_start, best);
  if (start && (found.empty() || !(evaluate(p, found) < start_objective))) {
    // CBC found nothing cheaper than the start: keep it. It is optimal when CBC finished (proved
    // the cutoff problem optimal or infeasible).
    out.feasible = true;
    out.optimal = !out.hit_limit && (model.isProvenOptimal() || model.isProvenInfeasible());
    out.objective = start_objective;
    out.bound =
        out.optimal ? start_objective : std::min(start_objective, model.getBestPossibleObjValue());
    out.choice = *start;
    return out;
  }
  if (!best) return out;
  out.feasible = true;
  out.optimal = model.isProvenOptimal();
  out.objective = model.getObjValue();
  out.bound = model.getBestPossibleObjValue();
  out.choice = std::move(found);
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
  if (p.memory) {
    // Without the memory row, minimize memory: infeasible means the pins alone are to blame.
    Outcome min_mem = run(p, o, {}, false, true);
    if (min_mem.feasible) {
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

namespace {

Expected<Solution> solveWith(const Problem& p, const SolverOptions& options,
                             const std::vector<uint32_t>* start, StartOutcome* outcome) {
  APC_RETURN_IF_ERROR(p.validate());
  if (start && (start->size() != p.nodes.size() || !std::isfinite(evaluate(p, *start))))
    return invalidArgument("the start is not a feasible choice of the problem");
  auto t0 = std::chrono::steady_clock::now();
  Outcome out = run(p, options, {}, true, false, start);
  if (outcome) *outcome = out.how;
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

}  // namespace

Expected<Solution> solve(const Problem& p, const SolverOptions& options) {
  return solveWith(p, options, nullptr, nullptr);
}

Expected<Solution> solve(const Problem& p, const SolverOptions& options,
                         const std::vector<uint32_t>& start, StartOutcome* outcome) {
  return solveWith(p, options, &start, outcome);
}

}  // namespace apc::solver
