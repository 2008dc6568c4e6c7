//===- lib/solver/reducer.cpp - Exact reduction of a Problem ---------------===//
//
// See reducer.h; the argument for each step is in solve_graph_problem.cpp's file comment.
//
//===----------------------------------------------------------------------===//
#include "reducer.h"

#include "apc/support/parallel.h"

#include <cmath>

namespace apc::solver::detail {

std::vector<std::vector<uint32_t>> allowedStrategies(const Problem& p) {
  std::vector<std::vector<uint32_t>> keep(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const ProblemNode& v = p.nodes[i];
    for (uint32_t s = 0; s < v.numStrategies(); ++s)
      if (std::isfinite(v.costs[s]) && (!v.pinned || *v.pinned == s)) keep[i].push_back(s);
  }
  return keep;
}

void dropByMemory(const Problem& p, std::vector<std::vector<uint32_t>>& keep) {
  if (!p.memory) return;
  const size_t n = p.nodes.size();
  auto mem = [&](size_t v, uint32_t s) {
    return p.nodes[v].memory.empty() ? 0.0 : p.nodes[v].memory[s];
  };
  const double low = p.memory->low, high = p.memory->high;
  // Larger than the ILP's slack (1e-9 relative): only strategies that violate (e) by a clear
  // margin are dropped.
  const double tol =
      1e-7 * std::max({1.0, std::fabs(low), std::isfinite(high) ? std::fabs(high) : 0.0});
  bool changed = true;
  while (changed) {
    changed = false;
    std::vector<double> lo(n, 0), hi(n, 0);
    double sum_lo = 0, sum_hi = 0;
    for (size_t v = 0; v < n; ++v) {
      if (keep[v].empty() || p.nodes[v].memory.empty()) continue;
      lo[v] = kInfinity;
      hi[v] = -kInfinity;
      for (uint32_t s : keep[v]) {
        lo[v] = std::min(lo[v], mem(v, s));
        hi[v] = std::max(hi[v], mem(v, s));
      }
      sum_lo += lo[v];
      sum_hi += hi[v];
    }
    for (size_t v = 0; v < n; ++v) {
      if (keep[v].empty() || p.nodes[v].memory.empty() || lo[v] == hi[v]) continue;
      std::vector<uint32_t> kept;
      for (uint32_t s : keep[v]) {
        double m = mem(v, s);
        bool over = sum_lo - lo[v] + m > high + tol;
        bool under = sum_hi - hi[v] + m < low - tol;
        if (!over && !under) kept.push_back(s);
      }
      if (kept.size() == keep[v].size()) continue;
      keep[v] = std::move(kept);
      changed = true;  // the sums above stay valid (weaker) bounds: keep going, then redo
    }
  }
}

std::optional<std::vector<std::vector<uint32_t>>> feasibleStrategies(const Problem& p) {
  std::vector<std::vector<uint32_t>> keep = allowedStrategies(p);
  dropByMemory(p, keep);
  for (const auto& k : keep)
    if (k.empty()) return std::nullopt;
  return keep;
}

Reducer::Reducer(const Problem& p, ReducerOptions options)
    : p_(p),
      frozen_(std::move(options.frozen)),
      drop_unsupported_frozen_(options.drop_unsupported_frozen) {
  size_t n = p.nodes.size();
  alive_.assign(n, true);
  cost_.resize(n);
  adj_.resize(n);
  frozen_.resize(n, false);
  keep_ = allowedStrategies(p);
  if (options.drop_by_memory) dropByMemory(p, keep_);
  for (size_t i = 0; i < n; ++i)
    for (uint32_t s : keep_[i]) cost_[i].push_back(p.nodes[i].costs[s]);
  fixMemory();
  const auto passed = [&] { return options.deadline.passed(); };
  for (const ProblemEdge& e : p.edges) {
    if ((stopped_ = passed())) return;
    Table t = detail::restrict(
        detail::tableOf(e, p.nodes[e.src].numStrategies(), p.nodes[e.dst].numStrategies()),
        keep_[e.src], keep_[e.dst]);
    addEdge(e.src, e.dst, std::move(t));
  }
  if (!hasEmptyNode() && dropUnsupported(options.deadline) && stopped_) return;
  if (options.prune_dominated && !hasEmptyNode()) pruneDominated(options.deadline);
}

bool Reducer::run(const Deadline& deadline) {
  if (stopped_) return false;
  bool changed = true;
  while (changed) {
    changed = false;
    for (uint32_t v = 0; v < alive_.size(); ++v) {
      if (!alive_[v] || inMemory(v) || frozen_[v]) continue;
      if (cost_[v].empty()) continue;  // infeasible node: leave it to the ILP to report
      if (cost_[v].size() == 1 || adj_[v].size() <= 2) {
        if (deadline.passed()) return false;
        eliminate(v);
        changed = true;
      }
    }
    // Eliminations sum tables into new edges, whose infinite rows 1a drops in turn (and a node
    // left with one strategy is eliminated on the next pass).
    if (!changed && !hasEmptyNode()) {
      changed = dropUnsupported(deadline);
      if (stopped_) return false;
    }
  }
  return true;
}

void Reducer::restrictNode(uint32_t v, const std::vector<uint32_t>& local) {
  std::vector<uint32_t> keep;
  std::vector<double> cost;
  keep.reserve(local.size());
  cost.reserve(local.size());
  for (uint32_t k : local) {
    keep.push_back(keep_[v][k]);
    cost.push_back(cost_[v][k]);
  }
  // Each edge restricted where it is stored (v's side the rows when v < u): no transposes.
  for (uint32_t u : adj_[v]) {
    std::vector<uint32_t> all(cost_[u].size());
    for (uint32_t k = 0; k < all.size(); ++k) all[k] = k;
    Table& t = edges_.at({std::min(u, v), std::max(u, v)});
    t = v < u ? detail::restrict(t, local, all) : detail::restrict(t, all, local);
  }
  keep_[v] = std::move(keep);
  cost_[v] = std::move(cost);
  // Eliminations that have v as a neighbour read its choice by its kept index of that time
  // (expand): renumbered to the new ones. (1a drops after eliminations; 1c only before any.)
  for (Elimination& el : eliminations_)
    for (size_t k = 0; k < el.neighbours.size(); ++k) {
      if (el.neighbours[k] != v) continue;
      std::vector<uint32_t> classes(local.size());
      for (size_t j = 0; j < local.size(); ++j) classes[j] = el.classes[k][local[j]];
      el.classes[k] = std::move(classes);
    }
}

bool Reducer::dropUnsupported(const Deadline& deadline) {
  const size_t n = alive_.size();
  std::vector<uint32_t> queue;
  std::vector<bool> queued(n, false);
  for (uint32_t v = 0; v < n; ++v)
    if (alive_[v] && !adj_[v].empty()) {
      queue.push_back(v);
      queued[v] = true;
    }
  // Smallest node id first: the drops, and so the kept lists, do not depend on the queue's order
  // anyway (the fixed point is unique), but a stable order keeps the work predictable.
  std::reverse(queue.begin(), queue.end());
  bool any = false;
  while (!queue.empty()) {
    if (deadline.passed()) {
      stopped_ = true;
      return any;
    }
    const uint32_t v = queue.back();
    queue.pop_back();
    queued[v] = false;
    if (!alive_[v] || cost_[v].empty() || (frozen_[v] && !drop_unsupported_frozen_)) continue;
    // v's classes on each edge that have a finite entry, read off the stored orientation.
    std::vector<bool> ok(cost_[v].size(), true);
    bool drop = false;
    for (uint32_t u : adj_[v]) {
      const Table& t = edges_.at({std::min(u, v), std::max(u, v)});
      const bool rows = v < u;  // v's strategies index the rows
      std::vector<bool> supported(rows ? t.rows : t.cols, false);
      for (size_t r = 0; r < t.rows; ++r)
        for (size_t c = 0; c < t.cols; ++c)
          if (std::isfinite(t.at(r, c))) {
            supported[rows ? r : c] = true;
            if (rows) break;  // this row is settled
          }
      const std::vector<uint32_t>& of = rows ? t.row_of : t.col_of;
      for (size_t s = 0; s < ok.size(); ++s)
        if (!supported[of[s]]) {
          ok[s] = false;
          drop = true;
        }
    }
    if (!drop) continue;
    std::vector<uint32_t> local;
    for (uint32_t k = 0; k < ok.size(); ++k)
      if (ok[k]) local.push_back(k);
    unsupported_ += ok.size() - local.size();
    restrictNode(v, local);
    any = true;
    if (local.empty()) return any;  // infeasible: hasEmptyNode() says so
    for (uint32_t u : adj_[v])
      if (!queued[u]) {
        queue.push_back(u);
        queued[u] = true;
      }
  }
  return any;
}

Problem Reducer::reduced(std::vector<uint32_t>& ids) const {
  Problem r;
  bool any_memory = false;
  std::map<uint32_t, uint32_t> index;
  for (uint32_t v = 0; v < alive_.size(); ++v) {
    if (!alive_[v]) continue;
    index[v] = static_cast<uint32_t>(ids.size());
    ids.push_back(v);
    ProblemNode n;
    n.name = p_.nodes[v].name;
    n.costs = cost_[v];
    if (n.costs.empty()) n.costs.push_back(kInfinity);  // keeps the problem well-formed: infeasible
    if (!p_.nodes[v].memory.empty())
      for (uint32_t s : keep_[v]) n.memory.push_back(p_.nodes[v].memory[s]);
    if (!n.memory.empty() && n.memory.size() != n.costs.size())
      n.memory.resize(n.costs.size(), 0.0);
    r.nodes.push_back(std::move(n));
    any_memory = any_memory || !r.nodes.back().memory.empty();
  }
  for (const auto& [key, m] : edges_)
    r.edges.push_back(detail::edgeOf(index.at(key.first), index.at(key.second), m));
  if (hasMemoryRow()) {
    // Eliminated nodes of constant memory (1b) contribute `eliminated_memory_` to the row.
    r.memory =
        MemoryBound{p_.memory->low - eliminated_memory_, p_.memory->high - eliminated_memory_,
                    p_.memory->total, p_.memory->offset + eliminated_memory_};
    // Without a node left in the row, the constant alone decides feasibility (as evaluate()
    // does); an infeasible constant keeps the row so that the ILP reports it.
    double eps = 1e-9 * std::max(1.0, std::fabs(eliminated_memory_));
    if (!any_memory && eliminated_memory_ >= p_.memory->low - eps &&
        eliminated_memory_ <= p_.memory->high + eps)
      r.memory.reset();
  }
  return r;
}

std::vector<uint32_t> Reducer::expand(const std::vector<uint32_t>& ids,
                                      const std::vector<uint32_t>& choice) const {
  std::vector<uint32_t> local(alive_.size(), 0);  // index into keep_
  for (size_t i = 0; i < ids.size(); ++i) local[ids[i]] = choice[i];
  for (auto it = eliminations_.rbegin(); it != eliminations_.rend(); ++it) {
    size_t idx = 0;
    for (size_t k = 0; k < it->neighbours.size(); ++k)
      idx = idx * it->widths[k] + it->classes[k][local[it->neighbours[k]]];
    local[it->node] = it->argmin.empty() ? 0 : it->argmin[idx];
  }
  std::vector<uint32_t> full(alive_.size());
  for (uint32_t v = 0; v < alive_.size(); ++v) full[v] = keep_[v].empty() ? 0 : keep_[v][local[v]];
  return full;
}

std::vector<uint32_t> Reducer::restrictChoice(const std::vector<uint32_t>& ids,
                                              std::vector<uint32_t> full) const {
  for (const Pruned& d : pruned_)
    if (full[d.node] == d.dropped) full[d.node] = d.replacement;
  std::vector<uint32_t> choice(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<uint32_t>& k = keep_[ids[i]];
    auto it = std::find(k.begin(), k.end(), full[ids[i]]);
    if (it == k.end()) return {};
    choice[i] = static_cast<uint32_t>(it - k.begin());
  }
  return choice;
}

MemoryRange memoryRange(const Problem& p, const std::vector<std::vector<uint32_t>>& keep) {
  MemoryRange r;
  r.varies.assign(p.nodes.size(), false);
  for (size_t v = 0; v < p.nodes.size(); ++v) {
    if (keep[v].empty() || p.nodes[v].memory.empty()) continue;
    double lo = kInfinity, hi = -kInfinity;
    for (uint32_t s : keep[v]) {
      lo = std::min(lo, p.nodes[v].memory[s]);
      hi = std::max(hi, p.nodes[v].memory[s]);
    }
    r.least += lo;
    r.most += hi;
    r.varies[v] = lo != hi;
  }
  return r;
}

void Reducer::fixMemory() {
  const size_t n = p_.nodes.size();
  variable_memory_.assign(n, false);
  if (!p_.memory) return;
  const double low = p_.memory->low, high = p_.memory->high;
  // A row that every choice satisfies (a loose budget, like high = 1) is dropped altogether.
  MemoryRange range = memoryRange(p_, keep_);
  variable_memory_ = std::move(range.varies);
  // No tolerance needed here: every choice is within [least, most] up to summation rounding,
  // far below the ILP's and evaluate()'s slack.
  if (range.most <= high && range.least >= low) {
    memory_redundant_ = true;
    variable_memory_.assign(n, false);
  }
}

void Reducer::addEdge(uint32_t a, uint32_t b, Table m) {
  if (a > b) {
    std::swap(a, b);
    m = m.transposed();
  }
  auto it = edges_.find({a, b});
  if (it == edges_.end()) {
    edges_.emplace(std::make_pair(a, b), std::move(m));
    adj_[a].insert(b);
    adj_[b].insert(a);
  } else {
    it->second = detail::sum(it->second, m);
  }
}

void Reducer::pruneDominated(const Deadline& deadline) {
  const size_t n = alive_.size();
  for (int pass = 0; pass < 3; ++pass) {
    bool changed = false;
    for (uint32_t v = 0; v < n; ++v) {
      if (deadline.passed()) {
        stopped_ = true;
        return;
      }
      changed = pruneNode(v) || changed;
    }
    if (!changed) break;
  }
}

bool Reducer::pruneNode(uint32_t v) {
  const size_t ns = cost_[v].size();
  if (ns < 2 || frozen_[v]) return false;
  std::vector<uint32_t> nbs(adj_[v].begin(), adj_[v].end());
  // Per incident edge: the table with v's strategies as rows, and which row is <= which.
  std::vector<Table> tables;
  size_t work = 0;
  for (uint32_t u : nbs) {
    tables.push_back(edgeMatrix(v, u));
    const Table& t = tables.back();
    work += t.rows * t.rows * t.cols;
  }
  if (work > kDominanceWork) return false;  // too large to compare: keep everything (exact)
  // Whether row a <= row b elementwise in table k, compared when first asked (the scan below
  // asks about few of the rows^2 pairs: a strategy is compared with the kept ones, on the edges up
  // to the first that fails) and memoized. A row whose sum is larger is not <= (rounding is
  // monotone, so a row <= another elementwise has a sum <= the other's; a +infinity entry makes
  // the sum +infinity): most pairs are settled without reading a row.
  std::vector<std::vector<int8_t>> leq(tables.size());  // -1: not compared yet
  std::vector<std::vector<double>> sums(tables.size());
  for (size_t k = 0; k < tables.size(); ++k) {
    const Table& t = tables[k];
    leq[k].assign(t.rows * t.rows, -1);
    sums[k].assign(t.rows, 0.0);
    for (size_t a = 0; a < t.rows; ++a)
      for (size_t c = 0; c < t.cols; ++c) sums[k][a] += t.at(a, c);
  }
  auto rowLeq = [&](size_t k, size_t a, size_t b) {
    const Table& t = tables[k];
    int8_t& known = leq[k][a * t.rows + b];
    if (known < 0) {
      bool ok = !(sums[k][a] > sums[k][b]);
      for (size_t c = 0; c < t.cols && ok; ++c) ok = t.at(a, c) <= t.at(b, c);
      known = ok ? 1 : 0;
    }
    return known == 1;
  };
  auto mem = [&](size_t k) {
    return p_.nodes[v].memory.empty() ? 0.0 : p_.nodes[v].memory[keep_[v][k]];
  };
  std::vector<uint32_t> order(ns);
  for (uint32_t k = 0; k < ns; ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return cost_[v][a] < cost_[v][b]; });
  std::vector<uint32_t> kept;
  std::vector<std::pair<uint32_t, uint32_t>> dropped;  // (local dropped, local dominator)
  for (uint32_t s : order) {
    uint32_t by = UINT32_MAX;
    for (uint32_t k : kept) {
      if (mem(k) != mem(s)) continue;
      bool dom = true;
      for (size_t e = 0; e < tables.size() && dom; ++e) {
        const Table& t = tables[e];
        dom = rowLeq(e, t.row_of[k], t.row_of[s]);
      }
      if (dom) {
        by = k;
        break;
      }
    }
    if (by == UINT32_MAX)
      kept.push_back(s);
    else
      dropped.emplace_back(s, by);
  }
  if (dropped.empty()) return false;
  for (auto [s, by] : dropped) pruned_.push_back({v, keep_[v][s], keep_[v][by]});
  std::sort(kept.begin(), kept.end());
  restrictNode(v, kept);
  return true;
}

void Reducer::eliminate(uint32_t v) {
  std::vector<uint32_t> nbs(adj_[v].begin(), adj_[v].end());
  Elimination el;
  el.node = v;
  const std::vector<double>& cv = cost_[v];
  if (cv.size() == 1) {
    // Fixed choice: fold each edge into the neighbour.
    for (uint32_t u : nbs) {
      Table m = edgeMatrix(u, v);
      for (size_t s = 0; s < cost_[u].size(); ++s) cost_[u][s] += m.cost(s, 0);
      removeEdge(u, v);
    }
    constant_ += cv[0];
    el.argmin = {0};
  } else if (nbs.empty()) {
    auto best = std::min_element(cv.begin(), cv.end());
    constant_ += *best;
    el.argmin = {static_cast<uint32_t>(best - cv.begin())};
  } else if (nbs.size() == 1) {
    uint32_t u = nbs[0];
    Table m = edgeMatrix(u, v);
    // The cheapest strategy of v per column class, then per row class of u.
    std::vector<double> col_best(m.cols, kInfinity);
    std::vector<uint32_t> col_arg(m.cols, 0);
    for (size_t t = 0; t < cv.size(); ++t)
      if (cv[t] < col_best[m.col_of[t]]) {
        col_best[m.col_of[t]] = cv[t];
        col_arg[m.col_of[t]] = static_cast<uint32_t>(t);
      }
    std::vector<double> row_best(m.rows, kInfinity);
    el.argmin.assign(m.rows, 0);
    for (size_t a = 0; a < m.rows; ++a)
      for (size_t c = 0; c < m.cols; ++c) {
        double x = m.at(a, c) + col_best[c];
        if (x < row_best[a]) {
          row_best[a] = x;
          el.argmin[a] = col_arg[c];
        }
      }
    for (size_t s = 0; s < cost_[u].size(); ++s) cost_[u][s] += row_best[m.row_of[s]];
    el.neighbours = {u};
    el.classes = {m.row_of};
    el.widths = {m.rows};
    removeEdge(u, v);
  } else {
    uint32_t u = nbs[0], w = nbs[1];
    Table a = edgeMatrix(u, v), b = edgeMatrix(v, w);
    // out(i, j) = min_t a(i, col_a(t)) + c(t) + b(row_b(t), j), in two stages over the classes
    // of v, v's cheapest strategy per (col_a, row_b) pair standing for the others. Either
    // P(i, r) = min over pairs with row_b = r of a(i, col_a) + c, then out(i, j) = min_r P(i, r)
    // + b(r, j) (a.rows x b.rows x b.cols), or Q(k, j) = min over pairs with col_a = k of c +
    // b(row_b, j), then out(i, j) = min_k a(i, k) + Q(k, j) (a.rows x a.cols x b.cols): the
    // cheaper of the two, a choice made from the sizes alone (deterministic).
    std::map<std::pair<uint32_t, uint32_t>, uint32_t> best_t;  // (col_a, row_b) -> cheapest t
    for (uint32_t t = 0; t < cv.size(); ++t) {
      auto [it, fresh] = best_t.try_emplace({a.col_of[t], b.row_of[t]}, t);
      if (!fresh && cv[t] < cv[it->second]) it->second = t;
    }
    Table out;
    out.row_of = a.row_of;
    out.col_of = b.col_of;
    out.rows = a.rows;
    out.cols = b.cols;
    out.v.assign(a.rows * b.cols, kInfinity);
    el.argmin.assign(a.rows * b.cols, 0);
    if (b.rows <= a.cols) {
      std::vector<double> pm(a.rows * b.rows, kInfinity);
      std::vector<uint32_t> parg(a.rows * b.rows, 0);
      for (const auto& [key, t] : best_t)
        for (size_t i = 0; i < a.rows; ++i) {
          double x = a.at(i, key.first) + cv[t];
          double& cur = pm[i * b.rows + key.second];
          if (x < cur) {
            cur = x;
            parg[i * b.rows + key.second] = t;
          }
        }
      // Rows on threads when the product is large (four-dim meshes: ~600 classes a side).
      const bool small_p = static_cast<double>(a.rows) * b.rows * b.cols < 4e6;
      parallelFor(
          a.rows,
          [&](size_t i) {
            for (size_t r = 0; r < b.rows; ++r) {
              double x0 = pm[i * b.rows + r];
              if (!std::isfinite(x0)) continue;
              const double* brow = &b.v[r * b.cols];
              double* orow = &out.v[i * b.cols];
              for (size_t j = 0; j < b.cols; ++j) {
                double x = x0 + brow[j];
                if (x < orow[j]) {
                  orow[j] = x;
                  el.argmin[i * b.cols + j] = parg[i * b.rows + r];
                }
              }
            }
          },
          small_p);
    } else {
      std::vector<double> qm(a.cols * b.cols, kInfinity);
      std::vector<uint32_t> qarg(a.cols * b.cols, 0);
      for (const auto& [key, t] : best_t) {
        const double* brow = &b.v[key.second * b.cols];
        double* qrow = &qm[key.first * b.cols];
        for (size_t j = 0; j < b.cols; ++j) {
          double x = cv[t] + brow[j];
          if (x < qrow[j]) {
            qrow[j] = x;
            qarg[key.first * b.cols + j] = t;
          }
        }
      }
      const bool small_q = static_cast<double>(a.rows) * a.cols * b.cols < 4e6;
      parallelFor(
          a.rows,
          [&](size_t i) {
            for (size_t k = 0; k < a.cols; ++k) {
              double x0 = a.at(i, k);
              if (!std::isfinite(x0)) continue;
              const double* qrow = &qm[k * b.cols];
              double* orow = &out.v[i * b.cols];
              for (size_t j = 0; j < b.cols; ++j) {
                double x = x0 + qrow[j];
                if (x < orow[j]) {
                  orow[j] = x;
                  el.argmin[i * b.cols + j] = qarg[k * b.cols + j];
                }
              }
            }
          },
          small_q);
    }
    // Rows whose every entry is infinite still need an argmin: any t (the pair is forbidden).
    el.neighbours = {u, w};
    el.classes = {a.row_of, b.col_of};
    el.widths = {a.rows, b.cols};
    removeEdge(u, v);
    removeEdge(v, w);
    out.compact();
    addEdge(u, w, std::move(out));
  }
  eliminations_.push_back(std::move(el));
  alive_[v] = false;
  if (hasMemoryRow() && !p_.nodes[v].memory.empty() && !keep_[v].empty())
    eliminated_memory_ += p_.nodes[v].memory[keep_[v][0]];
}

}  // namespace apc::solver::detail
