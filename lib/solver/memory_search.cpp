//===- lib/solver/memory_search.cpp - A memory row that binds in part ------===//
//
// See memory_search.h for the method and the argument.
//
//===----------------------------------------------------------------------===//
#include "memory_search.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

#include "reducer.h"

namespace apc::solver::detail {

namespace {

/// A plan of the memory-free problem and its two measures.
struct Point {
  std::vector<uint32_t> x;
  double c = 0;  // cost (the objective without the row)
  double m = 0;  // memory counted by the row
};

/// A restriction of one parameter's strategies by memory: m_v(s) <= t, or > t.
struct Cut {
  uint32_t node;
  double t;
  bool at_most;
};

/// Subproblem minimizers by multiplier. A minimizer over a search node's strategies that a child
/// admits is also the child's minimizer at that multiplier (its set is a subset): children reuse
/// their parent's instead of solving again.
using Solved = std::vector<std::pair<double, Point>>;

struct SearchNode {
  std::vector<Cut> cuts;
  double bound;   // the parent's bound until this node is expanded
  double lambda;  // the parent's best multiplier, where to start
  size_t order;   // creation order: ties of `bound` are expanded first-created first
  std::shared_ptr<const Solved> inherited;  // the parent's minimizers
};

struct ByBound {
  bool operator()(const SearchNode& a, const SearchNode& b) const {
    if (a.bound != b.bound) return a.bound > b.bound;
    return a.order > b.order;
  }
};

double memoryOfStrategy(const ProblemNode& v, uint32_t s) {
  return v.memory.empty() ? 0.0 : v.memory[s];
}

class Search {
 public:
  Search(const Problem& p, const SolverOptions& options, const Deadline& give_up,
         size_t max_subproblems, double tighten_within)
      : full_(p),
        sub_(p),
        options_(options),
        give_up_(give_up),
        max_subproblems_(max_subproblems),
        tighten_within_(tighten_within) {
    // A subproblem's ILP stops at the search's budget too (then it is not optimal: the search
    // gives up).
    options_.deadline = options_.deadline.earlier(give_up_);
    sub_.memory.reset();
    plain_ = sub_;  // costs without the row, for c(x)
    high_ = full_.memory->high;
    root_keep_ = allowedStrategies(full_);
  }

  Expected<MemorySearchResult> run() {
    std::priority_queue<SearchNode, std::vector<SearchNode>, ByBound> open;
    open.push({{}, -kInfinity, 0, 0, nullptr});
    size_t created = 1;
    while (!open.empty()) {
      if (open.top().bound >= incumbent_.objective - tolerance()) break;  // proven
      if (out_.subproblems >= max_subproblems_ || give_up_.passed()) {
        abandoned_ = true;
        break;
      }
      SearchNode node = open.top();
      open.pop();
      ++out_.branches;
      APC_ASSIGN_OR_RETURN(std::optional<Expansion> e, expand(node));
      if (!e) {  // a subproblem was not solved to optimality: no bound can be trusted
        abandoned_ = true;
        open.push(node);
        break;
      }
      if (out_.branches == 1 && !e->infeasible && !e->exact && !e->hi.x.empty()) {
        out_.hull = e->hi.x;
        if (e->exact_mix) {
          // A minimizer at the root's multiplier is optimal for the row at its own memory.
          out_.hull = e->exact_mix->x;
          const double lost = e->lambda * (high_ - e->exact_mix->m);
          if (tighten_within_ > 0 && e->exact_mix->m < high_ - 1e-9 * std::max(1.0, high_) &&
              lost <= tighten_within_ * e->exact_mix->c) {
            incumbent_.choice = e->exact_mix->x;
            incumbent_.objective = e->exact_mix->c;
            out_.tightened_high = e->exact_mix->m;
            out_.proven = true;
            out_.bound = e->exact_mix->c;
            out_.best = incumbent_;
            return std::move(out_);
          }
        }
      }
      if (e->infeasible || e->bound >= incumbent_.objective - tolerance() || e->exact) continue;
      // Branch on the parameter whose memory the two hull plans differ in most.
      const std::vector<uint32_t>& lo = e->lo.x;
      const std::vector<uint32_t>& hi = e->hi.x;
      uint32_t best = UINT32_MAX;
      double gap = 0;
      for (uint32_t v = 0; v < full_.nodes.size(); ++v) {
        double d = std::fabs(memoryOfStrategy(full_.nodes[v], lo[v]) -
                             memoryOfStrategy(full_.nodes[v], hi[v]));
        if (d > gap) {
          gap = d;
          best = v;
        }
      }
      if (best == UINT32_MAX) return internalError("memory search: hull plans of equal memory");
      double t = 0.5 * (memoryOfStrategy(full_.nodes[best], lo[best]) +
                        memoryOfStrategy(full_.nodes[best], hi[best]));
      for (bool at_most : {true, false}) {
        SearchNode child{node.cuts, e->bound, e->lambda, created++, e->solved};
        child.cuts.push_back({best, t, at_most});
        open.push(std::move(child));
      }
    }
    out_.proven = !abandoned_;
    // Nodes never expanded hold their parent's bound (the root's is -infinity, costs are >= 0).
    out_.bound =
        std::max(0.0, std::min(incumbent_.objective, open.empty() ? kInfinity : open.top().bound));
    if (!incumbent_.choice.empty()) out_.best = incumbent_;
    return std::move(out_);
  }

 private:
  struct Expansion {
    bool infeasible = false;
    bool exact = false;  // the node's optimum was found (its lambda = 0 plan meets the row)
    double bound = -kInfinity;
    double lambda = 0;
    Point lo, hi;
    /// Where the multiplier search ended at L's maximum (lo and hi both minimize c + lambda m
    /// there): the mix of lo and hi (offerMixes) that meets the row with the most memory among
    /// those that minimize c + lambda m too, if any.
    std::optional<Point> exact_mix;
    std::shared_ptr<const Solved> solved;  // this node's minimizers, for its children
  };

  /// Whether the current search node (keep_) admits the plan x.
  bool admits(const std::vector<uint32_t>& x) const {
    for (size_t v = 0; v < full_.nodes.size(); ++v) {
      if (full_.nodes[v].memory.empty()) continue;
      if (!std::binary_search(keep_[v].begin(), keep_[v].end(), x[v])) return false;
    }
    return true;
  }

  double tolerance() const {
    double ref = std::isfinite(incumbent_.objective) ? std::fabs(incumbent_.objective) : 1.0;
    return 1e-9 * std::max(1.0, ref);
  }
  bool meetsRow(const Point& p) const { return p.m <= high_ + 1e-9 * std::max(1.0, p.m); }

  void offer(const Point& p) {
    if (!meetsRow(p) || p.c >= incumbent_.objective) return;
    incumbent_.choice = p.x;
    incumbent_.objective = p.c;
  }

  /// The strategies a search node admits; false when a node has none left.
  bool keepFor(const std::vector<Cut>& cuts) {
    keep_ = root_keep_;
    for (const Cut& c : cuts) {
      std::vector<uint32_t> kept;
      for (uint32_t s : keep_[c.node]) {
        double m = memoryOfStrategy(full_.nodes[c.node], s);
        if (c.at_most ? m <= c.t : m > c.t) kept.push_back(s);
      }
      keep_[c.node] = std::move(kept);
    }
    dropByMemory(full_, keep_);
    for (const auto& k : keep_)
      if (k.empty()) return false;
    return true;
  }

  /// The memory-free problem at `lambda` over keep_: an empty inner optional when it is infeasible
  /// (a forbidden pair), an empty outer one when it was not solved to optimality within the
  /// search's budget (the search then gives up).
  Expected<std::optional<std::optional<Point>>> solveAt(double lambda) {
    return solveOver(keep_, lambda);
  }

  Expected<std::optional<std::optional<Point>>> solveOver(
      const std::vector<std::vector<uint32_t>>& keep, double lambda) {
    // Past the budget nothing more is solved: the search gives up (no bound is trusted unproven).
    if (give_up_.passed()) return std::optional<std::optional<Point>>();
    ++out_.subproblems;
    for (size_t v = 0; v < full_.nodes.size(); ++v) {
      const ProblemNode& f = full_.nodes[v];
      if (f.memory.empty()) continue;
      std::vector<double>& costs = sub_.nodes[v].costs;
      std::fill(costs.begin(), costs.end(), kInfinity);
      for (uint32_t s : keep[v]) costs[s] = f.costs[s] + lambda * f.memory[s];
    }
    // Exact: the reductions, then CBC on what is left (usually nothing).
    ReducerOptions ro;
    ro.prune_dominated = false;
    ro.deadline = give_up_;
    Reducer reducer(sub_, ro);
    if (reducer.stopped()) return std::optional<std::optional<Point>>();
    if (reducer.hasEmptyNode()) return std::optional<std::optional<Point>>(std::optional<Point>());
    if (!reducer.run(give_up_)) return std::optional<std::optional<Point>>();
    std::vector<uint32_t> ids;
    Problem rest = reducer.reduced(ids);
    std::vector<uint32_t> choice;
    if (!rest.nodes.empty()) {
      auto r = solve(rest, options_);
      if (!r.ok()) {
        if (r.error().code() == ErrorCode::kInfeasible)
          return std::optional<std::optional<Point>>(std::optional<Point>());
        return r.error();
      }
      if (r->status != SolveStatus::kOptimal) return std::optional<std::optional<Point>>();
      choice = std::move(r->choice);
    }
    Point p;
    p.x = reducer.expand(ids, choice);
    p.c = evaluate(plain_, p.x);
    if (!std::isfinite(p.c)) return std::optional<std::optional<Point>>(std::optional<Point>());
    p.m = memoryOf(full_, p.x);
    return std::optional<std::optional<Point>>(std::move(p));
  }

  /// The node's Lagrangian dual (see the file comment); nullopt when a subproblem was not proven.
  Expected<std::optional<Expansion>> expand(const SearchNode& node) {
    Expansion e;
    if (!keepFor(node.cuts)) {
      e.infeasible = true;
      return std::optional<Expansion>(std::move(e));
    }
    auto solved = std::make_shared<Solved>();
    e.solved = solved;
    auto at = [&](double lambda) -> Expected<std::optional<std::optional<Point>>> {
      std::optional<std::optional<Point>> p;
      if (node.inherited)
        for (const auto& [l, q] : *node.inherited)
          if (l == lambda && admits(q.x)) {
            p = std::optional<Point>(q);
            ++out_.reused;
            break;
          }
      if (!p) {
        APC_ASSIGN_OR_RETURN(p, solveAt(lambda));
      }
      if (p && *p) {
        solved->push_back({lambda, **p});
        offer(**p);
        double value = (*p)->c + lambda * ((*p)->m - high_);
        if (value > e.bound) {
          e.bound = value;
          e.lambda = lambda;
        }
      }
      return p;
    };
    APC_ASSIGN_OR_RETURN(auto p0, at(0));
    if (!p0) return std::optional<Expansion>();
    if (!*p0) {
      e.infeasible = true;
      return std::optional<Expansion>(std::move(e));
    }
    if (meetsRow(**p0)) {
      e.exact = true;
      e.bound = (*p0)->c;
      return std::optional<Expansion>(std::move(e));
    }
    Point lo = std::move(**p0);
    // A plan that meets the row: lambda grows from the parent's multiplier (or the scale at which
    // the memory over `high` costs as much as the whole plan) until one does.
    double lambda = node.lambda > 0 ? node.lambda : std::max(lo.c, 1e-9) / (lo.m - high_);
    std::optional<Point> hi;
    for (int i = 0; i < 60 && !hi; ++i, lambda *= 4) {
      APC_ASSIGN_OR_RETURN(auto p, at(lambda));
      if (!p) return std::optional<Expansion>();
      if (!*p) {
        e.infeasible = true;  // forbidden pairs hold at every lambda
        return std::optional<Expansion>(std::move(e));
      }
      if (e.bound >= incumbent_.objective - tolerance())
        return std::optional<Expansion>(std::move(e));
      if (meetsRow(**p))
        hi = std::move(**p);
      else
        lo = std::move(**p);
    }
    if (!hi) return std::optional<Expansion>();  // no plan that meets the row found: give up
    // The lines of lo and hi cross at lambda; a plan below both replaces one of them.
    std::optional<double> at_max;  // the least c + lambda m, where the search ends at L's maximum
    double at_max_lambda = 0;
    // The root of a search that may tighten its row finds L's maximum whatever the incumbent:
    // its two hull plans there are what the tightened plan mixes.
    const bool to_maximum = tighten_within_ > 0 && node.cuts.empty();
    for (int i = 0; i < 200; ++i) {
      if (lo.m <= hi->m) return internalError("memory search: hull plans out of order");
      lambda = std::max(0.0, (hi->c - lo.c) / (lo.m - hi->m));
      double line = lo.c + lambda * lo.m;
      // L's maximum is at most where the two lines cross: when even that is below the
      // incumbent, this node branches whatever the rest of the dual gives; stop solving.
      if (!to_maximum && line - lambda * high_ < incumbent_.objective - tolerance()) break;
      APC_ASSIGN_OR_RETURN(auto p, at(lambda));
      if (!p) return std::optional<Expansion>();
      if (!*p) return internalError("memory search: a subproblem became infeasible");
      double value = (*p)->c + lambda * (*p)->m;
      if (value >= line - 1e-9 * std::max(1.0, std::fabs(line))) {  // L's maximum
        at_max = value;
        at_max_lambda = lambda;
        break;
      }
      if (e.bound >= incumbent_.objective - tolerance()) break;
      if (meetsRow(**p))
        hi = std::move(**p);
      else
        lo = std::move(**p);
    }
    // At the root only: deeper nodes gain little from them (llama_tiny 2x4 at 0,0.25: the same
    // 434 subproblems, a third more time).
    if (node.cuts.empty()) e.exact_mix = offerMixes(lo, *hi, at_max, at_max_lambda);
    if (e.bound < incumbent_.objective - tolerance()) {
      APC_RETURN_IF_ERROR(repair(lo, *hi));
    }
    e.lo = std::move(lo);
    e.hi = std::move(*hi);
    return std::optional<Expansion>(std::move(e));
  }

  /// The plans that take one hull plan's strategies on a prefix of the nodes (program order) and
  /// the other's on the rest, both ways round, each offered as an incumbent. Where lo and hi agree
  /// on a separator of the graph (a chain of repeated layers: the strategies at a layer boundary),
  /// such a mix costs c + lambda m exactly what both do (the two mixes of one split sum to lo + hi
  /// and neither is below the minimum), so when lo and hi minimize c + lambda m (`min_value` at
  /// `lambda`, the search having ended at L's maximum) the mixes fill the hull's segment between
  /// them in steps of about a layer. Returned: the mix that meets the row with the most memory
  /// among those within tolerance of `min_value` (a minimizer, so no plan with at most its memory
  /// costs less), or none.
  std::optional<Point> offerMixes(const Point& lo, const Point& hi, std::optional<double> min_value,
                                  double lambda) {
    std::optional<Point> best;
    const size_t n = full_.nodes.size();
    for (const bool lo_first : {true, false}) {
      const Point& first = lo_first ? lo : hi;
      const Point& second = lo_first ? hi : lo;
      Point mix;
      mix.x = second.x;
      for (size_t k = 0; k + 1 < n; ++k) {
        if (first.x[k] == second.x[k]) continue;
        mix.x[k] = first.x[k];
        // A split point: the next differing node starts the suffix.
        size_t next = k + 1;
        while (next < n && first.x[next] == second.x[next]) ++next;
        if (next == n) break;  // the whole of `first`
        mix.c = evaluate(plain_, mix.x);
        if (!std::isfinite(mix.c)) continue;
        mix.m = memoryOf(full_, mix.x);
        offer(mix);
        if (!min_value || !meetsRow(mix)) continue;
        const double value = mix.c + lambda * mix.m;
        if (value > *min_value + 1e-9 * std::max(1.0, std::fabs(*min_value))) continue;
        if (!best || mix.m > best->m || (mix.m == best->m && mix.c < best->c)) best = mix;
      }
    }
    return best;
  }

  /// A plan that meets the row, near the two hull plans (an incumbent early saves most of the
  /// search): the parameters take lo's memory, then hi's one by one, largest saving first, until
  /// the row is met; the plan is the best one with exactly those memories (one subproblem).
  Status repair(const Point& lo, const Point& hi) {
    std::vector<std::pair<double, uint32_t>> savings;
    for (uint32_t v = 0; v < full_.nodes.size(); ++v) {
      double d =
          memoryOfStrategy(full_.nodes[v], lo.x[v]) - memoryOfStrategy(full_.nodes[v], hi.x[v]);
      if (d > 0) savings.push_back({-d, v});
    }
    std::sort(savings.begin(), savings.end());
    std::vector<uint32_t> pick = lo.x;
    double m = lo.m;
    for (const auto& [minus_d, v] : savings) {
      if (m <= high_) break;
      pick[v] = hi.x[v];
      m += minus_d;
    }
    if (m > high_ + 1e-9 * std::max(1.0, m)) return Status::success();
    std::vector<std::vector<uint32_t>> keep = keep_;
    for (uint32_t v = 0; v < full_.nodes.size(); ++v) {
      if (full_.nodes[v].memory.empty()) continue;
      double level = full_.nodes[v].memory[pick[v]];
      std::vector<uint32_t> kept;
      for (uint32_t s : keep[v])
        if (full_.nodes[v].memory[s] == level) kept.push_back(s);
      keep[v] = std::move(kept);
    }
    APC_ASSIGN_OR_RETURN(auto p, solveOver(keep, 0));
    if (p && *p) offer(**p);
    return Status::success();
  }

  const Problem& full_;
  Problem sub_;
  Problem plain_;
  SolverOptions options_;
  Deadline give_up_;
  size_t max_subproblems_;
  double tighten_within_;
  double high_ = 0;
  std::vector<std::vector<uint32_t>> root_keep_, keep_;
  Solution incumbent_ = [] {
    Solution s;
    s.objective = kInfinity;
    s.status = SolveStatus::kOptimal;
    return s;
  }();
  MemorySearchResult out_;
  bool abandoned_ = false;
};

}  // namespace

bool memoryRowInPlay(const Problem& p) {
  if (!p.memory) return false;
  std::vector<std::vector<uint32_t>> keep = allowedStrategies(p);
  dropByMemory(p, keep);
  for (const auto& k : keep)
    if (k.empty()) return false;  // infeasible: the ILP path names the constraint
  const MemoryRange range = memoryRange(p, keep);
  const bool varies =
      std::find(range.varies.begin(), range.varies.end(), true) != range.varies.end();
  return varies && range.most > p.memory->high && range.least >= p.memory->low;
}

Expected<MemorySearchResult> memorySearch(const Problem& p, const SolverOptions& options,
                                          const Deadline& give_up, size_t max_subproblems,
                                          double tighten_within) {
  return Search(p, options, give_up, max_subproblems, tighten_within).run();
}

}  // namespace apc::solver::detail
