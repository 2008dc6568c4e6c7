//===- lib/solver/ilp.cpp - The integer program with COIN-OR CBC -----------===//
//
// Builds the program documented in apc/solver/ilp.h (constraints lettered (a)-(e) there) as a
// CoinPackedMatrix and solves it with CbcModel over Clp, through CbcMain0/CbcMain1 so that CBC's
// default cuts and heuristics apply. Infeasible problems are diagnosed by re-solving with one
// constraint group dropped at a time.
//
//===----------------------------------------------------------------------===//
#include "apc/solver/ilp.h"
#include "apc/support/strings.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "CbcModel.hpp"
#include "CbcSolver.hpp"
#include "CoinPackedMatrix.hpp"
#include "CoinPackedVector.hpp"
#include "OsiClpSolverInterface.hpp"
#include "lp_bound.h"

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

/// The program of ilp.h in column-major form: x columns first (node by node), then the e columns.
struct Program {
  std::vector<double> obj, collb, colub, rowlb, rowub;
  std::vector<CoinBigIndex> starts{0};  // column starts, numCols() + 1 entries
  std::vector<int> index;               // row indices
  std::vector<double> value;
  std::vector<size_t> x_start;  // first x column of each node
  size_t num_x = 0;

  size_t numCols() const { return obj.size(); }
  int numRows() const { return static_cast<int>(rowlb.size()); }
  void addColumn(double c, double ub, std::initializer_list<std::pair<int, double>> entries) {
    obj.push_back(c);
    collb.push_back(0.0);
    colub.push_back(ub);
    for (auto [r, v] : entries) {
      index.push_back(r);
      value.push_back(v);
    }
    starts.push_back(static_cast<CoinBigIndex>(index.size()));
  }
};

/// Groups the `count` vectors that `get(i, k)` (k < length) describes into classes of identical
/// vectors; returns the class of each and fills `rep` with a representative per class.
template <typename Get>
std::vector<uint32_t> classify(size_t count, size_t length, Get get, std::vector<size_t>& rep) {
  std::vector<uint32_t> cls(count);
  std::unordered_map<uint64_t, std::vector<uint32_t>> buckets;  // hash -> classes
  auto same = [&](size_t a, size_t b) {
    for (size_t k = 0; k < length; ++k)
      if (!(get(a, k) == get(b, k))) return false;  // inf == inf holds; costs are never NaN
    return true;
  };
  for (size_t i = 0; i < count; ++i) {
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < length; ++k) {
      double d = get(i, k);
      uint64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      h = (h ^ bits) * 1099511628211ull;
    }
    std::vector<uint32_t>& bucket = buckets[h];
    auto it =
        std::find_if(bucket.begin(), bucket.end(), [&](uint32_t c) { return same(rep[c], i); });
    if (it != bucket.end()) {
      cls[i] = *it;
    } else {
      cls[i] = static_cast<uint32_t>(rep.size());
      bucket.push_back(cls[i]);
      rep.push_back(i);
    }
  }
  return cls;
}

/// The rows of the linked groups (lp_bound.h): per group its class map over its node's strategies
/// and its first row.
struct LinkedRows {
  std::vector<const std::vector<uint32_t>*> class_of;  // per group
  std::vector<int> first_row;                          // per group
  std::vector<std::vector<uint32_t>> of_node;          // per node: its groups
};

/// Builds the program; `use_pins` / `use_memory` / `memory_objective` as in run(). With `groups`
/// and `linked` (lp_bound.h), their rows and columns too (`ok` is cleared when a group's edges
/// disagree on its class map).
Program buildProgram(const Problem& p, const std::set<std::string>& dropped_groups, bool use_memory,
                     bool memory_objective,
                     const std::vector<detail::LinkedGroup>* groups = nullptr,
                     const std::vector<detail::LinkedEdge>* linked = nullptr, bool* ok = nullptr) {
  Program g;
  const size_t n = p.nodes.size();
  // Rows: (a) per node, then (b)/(c) per edge and class, then (e).
  for (size_t v = 0; v < n; ++v) {
    g.rowlb.push_back(1.0);
    g.rowub.push_back(1.0);
  }
  // e variables and the marginals (b), (c), over classes of strategies: strategies of u whose
  // rows of the cost matrix are identical (typically: the same output placement) share one class,
  // likewise for v's columns. Then (b) reads sum_Q e[P,Q] = sum_{s in P} x[u,s] and (c) likewise;
  // for integral x this is the same set of solutions, with far fewer e variables. The LP optimum
  // is the same too: e'[s,t] = e[P,Q] x[u,s]/x[u,P] x[v,t]/x[v,Q] is a solution of the
  // uncompressed marginals with the same cost.
  struct EdgeRows {
    std::vector<uint32_t> src_class, dst_class;
    std::vector<size_t> src_rep, dst_rep;
    int src_row = 0, dst_row = 0;  // first row of each side's classes
  };
  std::vector<EdgeRows> er(p.edges.size());
  std::vector<std::vector<std::pair<size_t, bool>>> incident(n);  // (edge, node is its source)
  for (size_t i = 0; i < p.edges.size(); ++i) {
    const ProblemEdge& e = p.edges[i];
    const size_t ns = p.nodes[e.src].numStrategies(), nt = p.nodes[e.dst].numStrategies();
    // Classes of identical rows (columns) of the edge's table; a factorized table has fewer rows
    // than strategies already. src_rep / dst_rep hold a table row / column per class.
    const size_t rows = e.tableRows(ns), cols = e.tableCols(nt);
    EdgeRows& r = er[i];
    std::vector<uint32_t> row_class = classify(
        rows, cols, [&](size_t a, size_t b) { return e.costs[a * cols + b]; }, r.src_rep);
    std::vector<uint32_t> col_class = classify(
        cols, rows, [&](size_t b, size_t a) { return e.costs[a * cols + b]; }, r.dst_rep);
    r.src_class.resize(ns);
    r.dst_class.resize(nt);
    for (size_t s = 0; s < ns; ++s) r.src_class[s] = row_class[e.rowOf(s)];
    for (size_t t = 0; t < nt; ++t) r.dst_class[t] = col_class[e.colOf(t)];
    r.src_row = g.numRows();
    r.dst_row = r.src_row + static_cast<int>(r.src_rep.size());
    g.rowlb.resize(g.rowlb.size() + r.src_rep.size() + r.dst_rep.size(), 0.0);
    g.rowub.resize(g.rowlb.size(), 0.0);
    incident[e.src].push_back({i, true});
    incident[e.dst].push_back({i, false});
  }
  LinkedRows lr;
  if (groups && linked) {
    lr.class_of.assign(groups->size(), nullptr);
    lr.first_row.assign(groups->size(), 0);
    lr.of_node.resize(n);
    std::vector<size_t> classes(groups->size(), 0);
    auto side = [&](uint32_t group, const std::vector<uint32_t>& map, size_t count) {
      if (!lr.class_of[group]) {
        lr.class_of[group] = &map;
        classes[group] = count;
      } else if (*lr.class_of[group] != map || classes[group] != count) {
        if (ok) *ok = false;
      }
    };
    for (const detail::LinkedEdge& e : *linked) {
      side(e.src_group, e.table.row_of, e.table.rows);
      side(e.dst_group, e.table.col_of, e.table.cols);
    }
    for (size_t k = 0; k < groups->size(); ++k) {
      if (!lr.class_of[k]) continue;
      const detail::LinkedGroup& gr = (*groups)[k];
      lr.first_row[k] = g.numRows();
      lr.of_node[gr.node].push_back(static_cast<uint32_t>(k));
      g.rowlb.resize(g.rowlb.size() + classes[k], gr.equality ? 0.0 : -COIN_DBL_MAX);
      g.rowub.resize(g.rowlb.size(), 0.0);
    }
  }
  const bool memory_row = p.memory && use_memory;
  const int mem_row = g.numRows();
  if (memory_row) {
    // A small relative slack absorbs rounding in bounds computed from fractions.
    double slack = 1e-9 * std::max(1.0, p.memory->high == kInfinity ? 1.0 : p.memory->high);
    g.rowlb.push_back(p.memory->low - slack);
    g.rowub.push_back(std::isinf(p.memory->high) ? COIN_DBL_MAX : p.memory->high + slack);
  }
  // x columns; (d) pins as bounds.
  g.x_start.resize(n);
  for (size_t v = 0; v < n; ++v) {
    const ProblemNode& node = p.nodes[v];
    g.x_start[v] = g.numCols();
    bool pinned = node.pinned && !dropped_groups.count(node.pin_group);
    for (size_t s = 0; s < node.numStrategies(); ++s) {
      double m = node.memory.empty() ? 0.0 : node.memory[s];
      double c = memory_objective ? m : node.costs[s];
      bool allowed = std::isfinite(node.costs[s]) && (!pinned || *node.pinned == s);
      g.addColumn(std::isfinite(c) ? c : 0.0, allowed ? 1.0 : 0.0, {{static_cast<int>(v), 1.0}});
      for (auto [i, is_src] : incident[v]) {
        const EdgeRows& r = er[i];
        int row = is_src ? r.src_row + static_cast<int>(r.src_class[s])
                         : r.dst_row + static_cast<int>(r.dst_class[s]);
        g.index.push_back(row);
        g.value.push_back(-1.0);
      }
      if (!lr.of_node.empty())
        for (uint32_t k : lr.of_node[v]) {
          g.index.push_back(lr.first_row[k] + static_cast<int>((*lr.class_of[k])[s]));
          g.value.push_back(-(*groups)[k].coef);
        }
      if (memory_row && m != 0) {
        g.index.push_back(mem_row);
        g.value.push_back(m);
      }
      g.starts.back() = static_cast<CoinBigIndex>(g.index.size());
    }
  }
  g.num_x = g.numCols();
  // e columns, for class pairs of finite cost.
  for (size_t i = 0; i < p.edges.size(); ++i) {
    const ProblemEdge& e = p.edges[i];
    const size_t cols = e.tableCols(p.nodes[e.dst].numStrategies());
    const EdgeRows& r = er[i];
    for (size_t a = 0; a < r.src_rep.size(); ++a) {
      for (size_t b = 0; b < r.dst_rep.size(); ++b) {
        double c = e.costs[r.src_rep[a] * cols + r.dst_rep[b]];
        if (!std::isfinite(c)) continue;
        g.addColumn(
            memory_objective ? 0.0 : c, 1.0,
            {{r.src_row + static_cast<int>(a), 1.0}, {r.dst_row + static_cast<int>(b), 1.0}});
      }
    }
  }
  if (groups && linked)
    for (const detail::LinkedEdge& e : *linked) {
      const detail::Table& t = e.table;
      for (size_t a = 0; a < t.rows; ++a)
        for (size_t b = 0; b < t.cols; ++b) {
          double c = t.at(a, b);
          if (!std::isfinite(c)) continue;
          g.addColumn(memory_objective ? 0.0 : c, COIN_DBL_MAX,
                      {{lr.first_row[e.src_group] + static_cast<int>(a), 1.0},
                       {lr.first_row[e.dst_group] + static_cast<int>(b), 1.0}});
        }
    }
  return g;
}

}  // namespace

double trivialBound(const Problem& p) {
  // Each edge's cost is charged to its ends: a fraction f to the source, 1 - f to the
  // destination, each end taking the cheapest entry of its row (column). For any choice x,
  // sum_v c_v(x_v) + sum_e e(x_u, x_w) >= sum_v [c_v(x_v) + sum of the charged row minima], so the
  // sum over nodes of the cheapest such term bounds every choice. f = 1, 0 and 1/2; the best.
  const size_t n = p.nodes.size();
  std::vector<std::vector<double>> row_min(p.edges.size()), col_min(p.edges.size());
  for (size_t k = 0; k < p.edges.size(); ++k) {
    const ProblemEdge& e = p.edges[k];
    const size_t rows = e.tableRows(p.nodes[e.src].numStrategies());
    const size_t cols = e.tableCols(p.nodes[e.dst].numStrategies());
    row_min[k].assign(rows, kInfinity);
    col_min[k].assign(cols, kInfinity);
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        double x = e.costs[r * cols + c];
        row_min[k][r] = std::min(row_min[k][r], x);
        col_min[k][c] = std::min(col_min[k][c], x);
      }
  }
  std::vector<std::vector<size_t>> out(n), in(n);
  for (size_t k = 0; k < p.edges.size(); ++k) {
    out[p.edges[k].src].push_back(k);
    in[p.edges[k].dst].push_back(k);
  }
  double best = -kInfinity;
  for (double f : {1.0, 0.0, 0.5}) {
    double b = 0;
    for (size_t v = 0; v < n; ++v) {
      const ProblemNode& node = p.nodes[v];
      double m = kInfinity;
      for (size_t s = 0; s < node.numStrategies(); ++s) {
        if (node.pinned && *node.pinned != s) continue;
        double x = node.costs[s];
        for (size_t k : out[v])
          if (f > 0) x += f * row_min[k][p.edges[k].rowOf(s)];
        for (size_t k : in[v])
          if (f < 1) x += (1 - f) * col_min[k][p.edges[k].colOf(s)];
        m = std::min(m, x);
      }
      b += m;
    }
    best = std::max(best, b);
  }
  return best;
}

size_t programColumns(const Problem& p) {
  size_t n = p.numStrategies();
  for (const ProblemEdge& e : p.edges) {
    // Finite entries of the table: an upper bound on the class pairs buildProgram makes.
    for (double c : e.costs) n += std::isfinite(c) ? 1 : 0;
  }
  return n;
}

namespace {

/// The LP relaxation's optimum: its objective and the x part of a solution.
struct LpResult {
  bool optimal = false;
  bool infeasible = false;
  double objective = 0;
  std::vector<double> x;
};

/// Solves the LP relaxation of `g`, loaded into `solver`, within `seconds` of wall time (<= 0: no
/// limit); stopped by the limit, the result is neither optimal nor infeasible. `plain`: the dual
/// simplex alone, without Clp's presolve and crash (see linkedLpBound).
LpResult solveLp(OsiClpSolverInterface& solver, const Program& g, double seconds,
                 bool plain = false) {
  // Dual simplex after Clp's presolve, from a crash basis. On these LPs, with an equality row per
  // class marginal and most edge columns at zero, the dual took 0.1-0.2 s on llama3_8b 8x8 (the
  // clustered problem) where Clp's default (idiot crash, then primal) took 1.4 s; on the
  // unclustered problem of the exactness check (826 k columns) primal took 86 s, barrier 47 s,
  // sprint over 120 s, the dual from an all-slack basis 3.0 s and 30 k iterations, and from the
  // crash basis 2.5 s and 18.5 k iterations. (Column generation from the clustered plan's pairs
  // finds the optimum at once but needs ~10 rounds and 15 s to price out the rest: the optimal
  // face is highly dual-degenerate.)
  ClpSolve lp_options;
  lp_options.setSolveType(ClpSolve::useDual);
  if (plain) {
    lp_options.setPresolveType(ClpSolve::presolveOff);
  } else {
    lp_options.setSpecialOption(0, 1);  // dual crash
  }
  solver.setSolveOptions(lp_options);
  if (seconds > 0) solver.getModelPtr()->setMaximumWallSeconds(seconds);
  solver.initialSolve();
  if (seconds > 0) solver.getModelPtr()->setMaximumWallSeconds(-1.0);
  LpResult r;
  r.infeasible = solver.isProvenPrimalInfeasible();
  r.optimal = solver.isProvenOptimal();
  if (r.optimal) {
    r.objective = solver.getObjValue();
    r.x.assign(solver.getColSolution(), solver.getColSolution() + g.num_x);
  }
  return r;
}

}  // namespace

namespace detail {

std::optional<double> linkedLpBound(const Problem& p, const std::vector<LinkedGroup>& groups,
                                    const std::vector<LinkedEdge>& linked, double seconds,
                                    size_t* columns, std::vector<double>* x) {
  bool ok = true;
  const Program g = buildProgram(p, {}, true, false, &groups, &linked, &ok);
  if (columns) *columns = g.numCols();
  if (!ok || seconds <= 0) return std::nullopt;
  OsiClpSolverInterface solver;
  std::vector<int> lengths(g.numCols());
  for (size_t j = 0; j < g.numCols(); ++j)
    lengths[j] = static_cast<int>(g.starts[j + 1] - g.starts[j]);
  CoinPackedMatrix matrix(true, g.numRows(), static_cast<int>(g.numCols()),
                          static_cast<CoinBigIndex>(g.index.size()), g.value.data(), g.index.data(),
                          g.starts.data(), lengths.data());
  solver.loadProblem(matrix, g.collb.data(), g.colub.data(), g.obj.data(), g.rowlb.data(),
                     g.rowub.data());
  solver.messageHandler()->setLogLevel(0);
  // The folded bound's problem comes out of the reducer, whose step 1a left nothing for Clp's
  // presolve to remove (it dropped 106 of 1.36 M columns, in 2.3 s, on DeepSeek-V3 8x8x8; before
  // 1a its forcing rows removed half the columns, those of strategies without a finite entry on
  // some edge). Without presolve and crash, the dual simplex on that LP (2026-12-06, this 2-core
  // VM, Clp time, DeepSeek-V3 at tokens [64,4096], --device h100 --memory-budget 0,): 8x8x8 7.5 ->
  // 3.4 s, 4x4x4 9.8 -> 7.0 s, 2x2x2 5.7 -> 6.5 s (with crash but no presolve: 4.4, 9.8, 4.3 s).
  LpResult lp = solveLp(solver, g, seconds, /*plain=*/true);
  if (!lp.optimal) return std::nullopt;
  if (x) *x = std::move(lp.x);
  return lp.objective;
}

}  // namespace detail

namespace {

/// Builds and solves; `use_pins` / `use_memory` drop constraint groups for diagnosis; when
/// `memory_objective` is set the objective is the memory of (e) instead of the cost. `start`: a
/// feasible choice of the full program (see solve() with a start in ilp.h).
/// `t0`: when the solve started (the time limit counts from there). Without a start the LP runs to
/// the end whatever the limit (there is no plan otherwise) and CBC gets at least a second.
Outcome run(const Problem& p, const SolverOptions& o, const std::set<std::string>& dropped_groups,
            bool use_memory, bool memory_objective, const std::vector<uint32_t>* start = nullptr,
            std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now()) {
  Outcome out;
  // Out of time with a start: the start, with the bound of a relaxation.
  auto keep_start = [&]() {
    out.feasible = true;
    out.hit_limit = true;
    out.objective = evaluate(p, *start);
    out.bound = std::min(trivialBound(p), out.objective);
    out.choice = *start;
    out.how = StartOutcome::kBranchAndBound;
    return out;
  };
  if (start && secondsLeft(o, t0) <= 0) return keep_start();
  const Program g = buildProgram(p, dropped_groups, use_memory, memory_objective);
  out.variables = static_cast<int64_t>(g.numCols());
  out.constraints = g.numRows();
  OsiClpSolverInterface solver;
  {
    std::vector<int> lengths(g.numCols());
    for (size_t j = 0; j < g.numCols(); ++j)
      lengths[j] = static_cast<int>(g.starts[j + 1] - g.starts[j]);
    CoinPackedMatrix matrix(true, g.numRows(), static_cast<int>(g.numCols()),
                            static_cast<CoinBigIndex>(g.index.size()), g.value.data(),
                            g.index.data(), g.starts.data(), lengths.data());
    solver.loadProblem(matrix, g.collb.data(), g.colub.data(), g.obj.data(), g.rowlb.data(),
                       g.rowub.data());
  }
  for (size_t i = 0; i < g.num_x; ++i) solver.setInteger(static_cast<int>(i));
  solver.messageHandler()->setLogLevel(o.log_level > 1 ? 1 : 0);

  // The marginal polytope is usually integral on our graphs: solve the LP relaxation first, and
  // when its optimum is integral in x it is the ILP's optimum (skipping CBC's preprocessing, cuts
  // and heuristics, which dominate the time on large problems).
  const double start_objective = start ? evaluate(p, *start) : kInfinity;
  double left = secondsLeft(o, t0);
  if (start && left <= 0) return keep_start();
  const LpResult lp = solveLp(solver, g, start ? std::max(left, 1e-3) : 0.0);
  if (lp.infeasible) return out;
  if (!lp.optimal && start) return keep_start();  // stopped by the limit
  if (lp.optimal) {
    // The LP optimum bounds every integral choice from below: a start that meets it is optimal.
    // The relative tolerance covers the LP's own rounding (its objective can sit a hair below the
    // value of an optimal vertex); it is far below the 1e-6 the tests ask of "the same optimum".
    if (start && start_objective <= lp.objective + 1e-9 * std::max(1.0, std::fabs(lp.objective))) {
      out.feasible = out.optimal = true;
      out.objective = start_objective;
      out.bound = std::min(lp.objective, start_objective);
      out.choice = *start;
      out.how = StartOutcome::kStartProven;
      return out;
    }
    bool integral = true;
    for (size_t i = 0; i < g.num_x && integral; ++i)
      integral = std::fabs(lp.x[i] - std::round(lp.x[i])) < 1e-7;
    if (integral) {
      out.feasible = out.optimal = true;
      out.objective = out.bound = lp.objective;
      out.choice = pickChoice(p, g.x_start, lp.x.data());
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
  left = secondsLeft(o, t0);
  std::string sec = std::to_string(start ? std::max(left, 1e-3) : std::max(left, 1.0));
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
  if (best) found = pickChoice(p, g.x_start, best);
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

/// ": the memory budget is too small...": the least footprint any plan has, as the smallest
/// feasible `high` fraction (rounded up at 4 significant digits, so that the suggestion is
/// feasible) and in bytes, with the flag that sets it; in bytes only without a total.
std::string tooSmallBudget(double need_here, const MemoryBound& b) {
  const double need = need_here + b.offset, high = b.high + b.offset;
  if (!(b.total > 0))
    return ": the memory budget is too small (needs at least " + fmt(need) +
           " bytes, high allows " + fmt(high) + ")";
  double fraction = need / b.total;
  double scale = std::pow(10.0, 3 - std::floor(std::log10(fraction)));
  double suggested = std::min(1.0, std::ceil(fraction * scale * (1 + 1e-9)) / scale);
  char text[64], have[64];
  std::snprintf(text, sizeof text, "%.4g", suggested);
  std::snprintf(have, sizeof have, "%.4g", high / b.total);
  return std::string(": the memory budget is too small: the smallest feasible high is ") + text +
         " of the parameter bytes (" + humanBytes(need) + " per rank of " + humanBytes(b.total) +
         "), the budget's high is " + have + " (" + humanBytes(high) + "); use --memory-budget 0," +
         text + " (memory_budget.high in a spec)";
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
      if (m > p.memory->high) return infeasible(msg + tooSmallBudget(m, *p.memory));
      if (p.memory->low > 0)
        return infeasible(msg + ": the memory budget's low bound " +
                          fmt(p.memory->low + p.memory->offset) +
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
  Outcome out = run(p, options, {}, true, false, start, t0);
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
  s.status = out.optimal     ? SolveStatus::kOptimal
             : out.hit_limit ? SolveStatus::kTimeLimit
                             : SolveStatus::kFeasible;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.variables = out.variables;
  s.constraints = out.constraints;
  return s;
}

}  // namespace

double secondsLeft(const SolverOptions& o, std::chrono::steady_clock::time_point start) {
  auto now = std::chrono::steady_clock::now();
  double left = o.time_limit_s - std::chrono::duration<double>(now - start).count();
  left = std::min(left, o.deadline.secondsLeft(now));  // +inf without a deadline
  return std::max(0.0, left);
}

Expected<Solution> solve(const Problem& p, const SolverOptions& options) {
  return solveWith(p, options, nullptr, nullptr);
}

Expected<Solution> solve(const Problem& p, const SolverOptions& options,
                         const std::vector<uint32_t>& start, StartOutcome* outcome) {
  return solveWith(p, options, &start, outcome);
}

}  // namespace apc::solver
