//===- lib/solver/chain_bound.cpp - A lower bound along chains of tied layers ===//
//
// See chain_bound.h for the relaxation and why its optimum is a lower bound.
//
//===----------------------------------------------------------------------===//
#include "chain_bound.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <tuple>

#include "apc/solver/graph_problem.h"
#include "edge_table.h"
#include "reducer.h"

namespace apc::solver::detail {

namespace {

/// Chains shorter than this (two middle instances) are left as they are.
constexpr uint32_t kMinInstances = 4;
/// The most min-plus work (multiply-adds) the powers may take, over all chains.
constexpr double kPowerWork = 4e8;
/// The largest remainder of R handed to the ILP (columns).
constexpr size_t kMaxColumns = 3'000'000;

/// A class matrix of the min-plus power: rows and columns are T's classes.
struct Matrix {
  size_t rows = 0, cols = 0;
  std::vector<double> v;
};

/// The joints between two factors: the pairs (column class of out_k in the left factor, row class
/// of out_k in the right one) that some strategy of out_k has, with the least node cost of such a
/// strategy (the cost T charges to out_k on both sides).
struct Joints {
  std::vector<std::pair<uint32_t, uint32_t>> pairs;
  std::vector<double> cost;
};

/// out(i, j) = min over joints k of a(i, left_k) + cost_k + b(right_k, j).
Matrix multiply(const Matrix& a, const Joints& d, const Matrix& b) {
  Matrix out{a.rows, b.cols, std::vector<double>(a.rows * b.cols, kInfinity)};
  for (size_t i = 0; i < a.rows; ++i) {
    double* orow = &out.v[i * b.cols];
    for (size_t k = 0; k < d.pairs.size(); ++k) {
      double x = a.v[i * a.cols + d.pairs[k].first] + d.cost[k];
      if (!std::isfinite(x)) continue;
      const double* brow = &b.v[d.pairs[k].second * b.cols];
      for (size_t j = 0; j < b.cols; ++j) orow[j] = std::min(orow[j], x + brow[j]);
    }
  }
  return out;
}

/// a^m under multiply() (m >= 1), by repeated squaring.
Matrix power(const Matrix& a, const Joints& d, uint32_t m) {
  std::optional<Matrix> result;
  Matrix base = a;
  while (true) {
    if (m & 1u) result = result ? multiply(*result, d, base) : base;
    m >>= 1;
    if (m == 0) break;
    base = multiply(base, d, base);
  }
  return *result;
}

/// The restricted table of edge `e` of `full`, with `keep`'s strategies.
Table keptTable(const Problem& full, const ProblemEdge& e,
                const std::vector<std::vector<uint32_t>>& keep) {
  return restrict(tableOf(e, full.nodes[e.src].numStrategies(), full.nodes[e.dst].numStrategies()),
                  keep[e.src], keep[e.dst]);
}

bool sameTable(const ProblemEdge& a, const ProblemEdge& b) {
  return a.num_dst_classes == b.num_dst_classes && a.src_class == b.src_class &&
         a.dst_class == b.dst_class && a.costs == b.costs;
}

}  // namespace

ChainBound chainBound(const Problem& full, const std::vector<uint32_t>& rep,
                      const std::vector<uint32_t>& instance, const std::vector<uint32_t>& cluster,
                      const SolverOptions& so) {
  ChainBound out;
  const size_t n = full.nodes.size();
  auto feasible = feasibleStrategies(full);
  if (!feasible) {
    out.why = "a node has no feasible strategy";
    return out;
  }
  std::vector<std::vector<uint32_t>> keep = std::move(*feasible);

  // --- The chains: clusters of at least kMinInstances tied instances. --------------------------
  uint32_t clusters = 0;
  for (uint32_t v = 0; v < n; ++v)
    if (cluster[v] != kNoCluster) clusters = std::max(clusters, cluster[v] + 1);
  std::vector<uint32_t> layers(clusters, 0), width(clusters, 0);
  for (uint32_t v = 0; v < n; ++v)
    if (cluster[v] != kNoCluster)
      layers[cluster[v]] = std::max(layers[cluster[v]], instance[v] + 1);
  std::vector<bool> folds(clusters, false);
  for (uint32_t c = 0; c < clusters; ++c) folds[c] = layers[c] >= kMinInstances;
  auto layer = [&](uint32_t v) { return cluster[v] != kNoCluster && folds[cluster[v]]; };
  auto middle = [&](uint32_t v) {
    return layer(v) && instance[v] >= 1 && instance[v] + 1 < layers[cluster[v]];
  };
  // Position of a node in its layer: its representative's rank among the cluster's
  // representatives (the nodes of instance 0), in node order.
  std::vector<uint32_t> pos(n, UINT32_MAX);
  for (uint32_t v = 0; v < n; ++v)
    if (layer(v) && rep[v] == v) pos[v] = width[cluster[v]]++;
  std::vector<std::vector<uint32_t>> members(clusters);  // [instance * width + position] -> node
  for (uint32_t c = 0; c < clusters; ++c)
    if (folds[c]) members[c].assign(size_t{layers[c]} * width[c], UINT32_MAX);
  for (uint32_t v = 0; v < n; ++v) {
    if (!layer(v)) continue;
    pos[v] = pos[rep[v]];
    uint32_t& slot = members[cluster[v]][size_t{instance[v]} * width[cluster[v]] + pos[v]];
    if (slot != UINT32_MAX || keep[v] != keep[rep[v]]) {
      out.why = "tied layers differ";
      return out;
    }
    slot = v;
  }
  for (uint32_t c = 0; c < clusters; ++c)
    if (folds[c] && std::count(members[c].begin(), members[c].end(), UINT32_MAX) > 0) {
      out.why = "a tied layer misses a node";
      return out;
    }

  // --- Edges: inside a layer, between consecutive layers (from `out`), or to an outside node. ---
  std::vector<uint32_t> out_pos(clusters, UINT32_MAX);
  // Per cluster and instance k >= 1: the edges the transfer of k covers, with a key saying what
  // they join (compared between the middle instances).
  using Key = std::array<uint32_t, 4>;
  std::vector<std::vector<std::vector<std::pair<Key, uint32_t>>>> block(clusters);
  for (uint32_t c = 0; c < clusters; ++c)
    if (folds[c]) block[c].resize(layers[c]);
  for (uint32_t i = 0; i < full.edges.size(); ++i) {
    const uint32_t u = full.edges[i].src, v = full.edges[i].dst;
    const bool lu = layer(u), lv = layer(v);
    if (!lu && !lv) continue;
    if (lu && lv && cluster[u] != cluster[v]) {
      out.why = "an edge joins two chains of layers";
      return out;
    }
    if (lu && lv) {
      const uint32_t c = cluster[u];
      const int64_t d = int64_t{instance[v]} - int64_t{instance[u]};
      if (d == 0) {
        block[c][instance[u]].push_back({Key{0, pos[u], pos[v], 0}, i});
        continue;
      }
      if (d != 1 && d != -1) {
        out.why = "an edge skips a layer";
        return out;
      }
      const uint32_t lo = d == 1 ? u : v, hi = d == 1 ? v : u;
      if (out_pos[c] != UINT32_MAX && out_pos[c] != pos[lo]) {
        out.why = "more than one value passes between layers";
        return out;
      }
      out_pos[c] = pos[lo];
      block[c][instance[hi]].push_back({Key{1, pos[u], pos[v], d == 1 ? 1u : 0u}, i});
      continue;
    }
    const uint32_t a = lu ? u : v;
    block[cluster[a]][instance[a]].push_back({lu ? Key{2, pos[u], v, 0} : Key{3, u, pos[v], 0}, i});
  }
  for (uint32_t c = 0; c < clusters; ++c)
    if (folds[c] && out_pos[c] == UINT32_MAX) {
      out.why = "the tied layers pass no value along";
      return out;
    }
  // Shared nodes: outside the chains, adjacent to a middle instance or to two instances or more
  // of tied layers (folded or not). An edge from one to a tied node of another cluster (`copied`)
  // gets a copy of it; each copy and the original carry an equal share of its cost.
  auto tied = [&](uint32_t v) { return cluster[v] != kNoCluster; };
  auto copied = [&](uint32_t x, uint32_t other) {
    return !layer(x) && tied(other) && !(tied(x) && cluster[x] == cluster[other]);
  };
  struct Touch {
    size_t edges = 0;
    bool middle = false;
    std::set<std::pair<uint32_t, uint32_t>> instances;
  };
  std::map<uint32_t, Touch> touches;
  for (const ProblemEdge& e : full.edges) {
    const bool cu = copied(e.src, e.dst), cv = !cu && copied(e.dst, e.src);
    if (!cu && !cv) continue;
    const uint32_t x = cu ? e.src : e.dst, other = cu ? e.dst : e.src;
    Touch& t = touches[x];
    ++t.edges;
    t.middle = t.middle || middle(other);
    t.instances.insert({cluster[other], instance[other]});
  }
  std::map<uint32_t, double> share;
  for (const auto& [x, t] : touches)
    if (t.middle || t.instances.size() >= 2) share[x] = 1.0 / static_cast<double>(t.edges + 1);
  if (share.empty() && std::none_of(folds.begin(), folds.end(), [](bool f) { return f; })) {
    out.why = "no chain of " + std::to_string(kMinInstances) +
              " or more tied layers and no node shared by tied layers";
    return out;
  }
  // The middle instances must be identical: same edges, tables and outside nodes.
  for (uint32_t c = 0; c < clusters; ++c) {
    if (!folds[c]) continue;
    const auto& first = block[c][1];
    for (uint32_t k = 2; k + 1 < layers[c]; ++k) {
      const auto& other = block[c][k];
      bool same = other.size() == first.size();
      for (size_t j = 0; j < other.size() && same; ++j)
        same = other[j].first == first[j].first &&
               sameTable(full.edges[other[j].second], full.edges[first[j].second]);
      if (!same) {
        out.why = "the middle layers differ";
        return out;
      }
    }
  }

  // --- Per chain: the transfer T of one middle instance, then its power. ------------------------
  struct Chain {
    std::unique_ptr<Problem> block;    // instance 1 with out_0 (node 0) and its copies
    std::unique_ptr<Reducer> reducer;  // of `block`, reduced to out_0 and out_1
    std::vector<uint32_t> ids;
    std::vector<double> in_cost, out_cost;  // T's node costs of out_{k-1} and out_k
    Table e;                                // T's edge (rows: out_{k-1}, columns: out_k)
    Table g;                                // the power's class matrix, with e's class maps
    double constant = 0;                    // T's constant
    uint32_t m = 0;                         // middle instances
  };
  std::vector<Chain> chains(clusters);
  double work = 0;
  for (uint32_t c = 0; c < clusters; ++c) {
    if (!folds[c]) continue;
    Chain& ch = chains[c];
    const uint32_t w = width[c], k1 = 1;
    ch.block = std::make_unique<Problem>();
    Problem& b = *ch.block;
    b.nodes.resize(1 + w);
    b.nodes[0].costs.assign(keep[members[c][out_pos[c]]].size(), 0.0);
    for (uint32_t p = 0; p < w; ++p) {
      const uint32_t v = members[c][size_t{k1} * w + p];
      for (uint32_t s : keep[v]) b.nodes[1 + p].costs.push_back(full.nodes[v].costs[s]);
    }
    auto local = [&](uint32_t v) -> uint32_t {
      if (layer(v) && cluster[v] == c) return instance[v] == k1 ? 1 + pos[v] : 0;
      ProblemNode copy;  // an outside node: a copy of its own for this edge
      for (uint32_t s : keep[v]) copy.costs.push_back(share[v] * full.nodes[v].costs[s]);
      b.nodes.push_back(std::move(copy));
      return static_cast<uint32_t>(b.nodes.size() - 1);
    };
    for (const auto& [key, i] : block[c][k1]) {
      const ProblemEdge& e = full.edges[i];
      b.edges.push_back(edgeOf(local(e.src), local(e.dst), keptTable(full, e, keep)));
    }
    ReducerOptions ro;
    ro.frozen.assign(b.nodes.size(), false);
    ro.frozen[0] = ro.frozen[1 + out_pos[c]] = true;
    ro.drop_by_memory = false;
    ro.deadline = so.first_plan_deadline;
    ch.reducer = std::make_unique<Reducer>(b, ro);
    if (ch.reducer->stopped()) {
      out.why = "the time limit passed in a layer's reduction";
      return out;
    }
    if (ch.reducer->hasEmptyNode()) {
      out.why = "a layer has no feasible choice";
      return out;
    }
    // The reductions run to the end even past the deadline (up to the first plan's deadline):
    // they give the first plan, as the first LP of a solve does (cheaper than the tied problem's
    // LP, which would run instead).
    if (!ch.reducer->run(so.first_plan_deadline)) {
      out.why = "the time limit passed in a layer's reduction";
      return out;
    }
    Problem t = ch.reducer->reduced(ch.ids);
    if (ch.ids.size() != 2 || t.edges.size() > 1) {
      out.why = "a layer does not reduce to the values it passes on";
      return out;
    }
    // Frozen nodes keep every strategy: T's indices are those of keep[out].
    ch.in_cost = t.nodes[0].costs;
    ch.out_cost = t.nodes[1].costs;
    const size_t ns = ch.in_cost.size();
    if (t.edges.empty()) {
      ch.e.rows = ch.e.cols = 1;
      ch.e.v = {0.0};
      ch.e.row_of.assign(ns, 0);
      ch.e.col_of.assign(ns, 0);
    } else {
      ch.e = tableOf(t.edges[0], t.nodes[t.edges[0].src].numStrategies(),
                     t.nodes[t.edges[0].dst].numStrategies());
      if (t.edges[0].src != 0) ch.e = ch.e.transposed();
    }
    ch.constant = ch.reducer->constant();
    ch.m = layers[c] - 2;
    Joints joints;
    std::map<std::pair<uint32_t, uint32_t>, size_t> at;
    for (size_t s = 0; s < ns; ++s) {
      double x = ch.out_cost[s] + ch.in_cost[s];
      auto [it, fresh] = at.try_emplace({ch.e.col_of[s], ch.e.row_of[s]}, joints.pairs.size());
      if (fresh) {
        joints.pairs.push_back(it->first);
        joints.cost.push_back(x);
      } else {
        joints.cost[it->second] = std::min(joints.cost[it->second], x);
      }
    }
    double products = 2 * std::ceil(std::log2(static_cast<double>(ch.m) + 1));
    work += products * static_cast<double>(ch.e.rows) * static_cast<double>(joints.pairs.size()) *
            static_cast<double>(std::max(ch.e.rows, ch.e.cols));
    if (work > kPowerWork) {
      out.why = "the chain's power is too large";
      return out;
    }
    Matrix g = power(Matrix{ch.e.rows, ch.e.cols, ch.e.v}, joints, ch.m);
    ch.g.rows = g.rows;
    ch.g.cols = g.cols;
    ch.g.v = std::move(g.v);
    ch.g.row_of = ch.e.row_of;
    ch.g.col_of = ch.e.col_of;
    ++out.chains;
  }

  // --- R: everything but the middle instances, with copies, and one power edge per chain. -------
  Problem rp;
  std::vector<uint32_t> id(n, UINT32_MAX);
  double constant = 0;
  for (uint32_t v = 0; v < n; ++v) {
    if (middle(v)) continue;
    id[v] = static_cast<uint32_t>(rp.nodes.size());
    ProblemNode node;
    node.name = full.nodes[v].name;
    const double f = share.count(v) ? share[v] : 1.0;
    for (uint32_t s : keep[v]) node.costs.push_back(f * full.nodes[v].costs[s]);
    rp.nodes.push_back(std::move(node));
  }
  std::vector<uint32_t> last_out(clusters, UINT32_MAX);  // the node standing for out_{L-2}
  for (uint32_t c = 0; c < clusters; ++c) {
    if (!folds[c]) continue;
    const Chain& ch = chains[c];
    const uint32_t first_out = id[members[c][out_pos[c]]];
    for (size_t s = 0; s < ch.in_cost.size(); ++s) rp.nodes[first_out].costs[s] += ch.in_cost[s];
    last_out[c] = static_cast<uint32_t>(rp.nodes.size());
    ProblemNode node;
    node.name = full.nodes[members[c][size_t{layers[c] - 2} * width[c] + out_pos[c]]].name;
    node.costs = ch.out_cost;
    rp.nodes.push_back(std::move(node));
    rp.edges.push_back(edgeOf(first_out, last_out[c], ch.g));
    constant += static_cast<double>(ch.m) * ch.constant;
  }
  auto copyOf = [&](uint32_t x) {  // a copy of outside node x for one edge
    ProblemNode node;
    node.name = full.nodes[x].name;
    for (uint32_t s : keep[x]) node.costs.push_back(share[x] * full.nodes[x].costs[s]);
    rp.nodes.push_back(std::move(node));
    return static_cast<uint32_t>(rp.nodes.size() - 1);
  };
  for (const ProblemEdge& e : full.edges) {
    const uint32_t u = e.src, v = e.dst;
    const bool lu = layer(u), lv = layer(v);
    uint32_t a = id[u], b = id[v];
    if (lu && lv) {
      if (instance[u] == instance[v]) {
        if (middle(u)) continue;
      } else {
        // Between consecutive instances: into a middle one it is in T; into the last one it
        // leaves the last middle instance's `out`, which the power's end node stands for.
        const uint32_t hi = instance[u] > instance[v] ? u : v;
        if (middle(hi)) continue;
        (hi == u ? b : a) = last_out[cluster[u]];
      }
    } else if ((lu && middle(u)) || (lv && middle(v))) {
      continue;  // in T
    }
    if (copied(u, v)) {
      if (share.count(u)) a = copyOf(u);
    } else if (copied(v, u)) {
      if (share.count(v)) b = copyOf(v);
    }
    rp.edges.push_back(edgeOf(a, b, keptTable(full, e, keep)));
  }
  ReducerOptions ro;
  ro.drop_by_memory = false;
  ro.deadline = so.first_plan_deadline;
  Reducer r(rp, ro);
  if (r.stopped()) {
    out.why = "the time limit passed in the relaxation's reduction";
    return out;
  }
  if (r.hasEmptyNode()) {
    out.why = "the relaxation has no feasible choice";
    return out;
  }
  if (!r.run(so.first_plan_deadline)) {
    out.why = "the time limit passed in the relaxation's reduction";
    return out;
  }
  std::vector<uint32_t> ids;
  Problem reduced = r.reduced(ids);
  out.nodes_left = reduced.nodes.size();
  out.edges_left = reduced.edges.size();
  out.strategies_left = reduced.numStrategies();
  std::vector<uint32_t> reduced_choice;
  if (reduced.nodes.empty()) {
    out.bound = r.constant() + constant;
  } else {
    // Without a folded chain, a remainder is about the tied problem, which the caller solves
    // next anyway: no ILP twice.
    if (out.chains == 0) {
      out.why = "no chain to fold, and the relaxation does not reduce";
      return out;
    }
    if (programColumns(reduced) > kMaxColumns) {
      out.why = "the relaxation's remainder is too large";
      return out;
    }
    // Past the deadline the solve still returns its first plan, with its proven bound.
    auto s = solve(reduced, so);
    if (!s.ok()) {
      out.why = "the relaxation was not solved: " + s.error().message();
      return out;
    }
    out.bound = s->bound + r.constant() + constant;
    out.variables = s->variables;
    out.constraints = s->constraints;
    reduced_choice = s->choice;
  }

  // --- A plan from R's optimum: the middle instances follow the cheapest path of T's. -----------
  std::vector<uint32_t> rchoice = r.expand(ids, reduced_choice);  // indices into keep
  std::vector<uint32_t> local(n, UINT32_MAX);                     // per node: index into keep
  for (uint32_t v = 0; v < n; ++v)
    if (id[v] != UINT32_MAX) local[v] = rchoice[id[v]];
  for (uint32_t c = 0; c < clusters; ++c) {
    if (!folds[c]) continue;
    const Chain& ch = chains[c];
    const Table& e = ch.e;
    const size_t ns = ch.in_cost.size();
    const uint32_t w = width[c];
    // out_k for k = 1..m, from out_0 (R's choice) to out_m (R's choice for the power's end):
    // f_k(b) = least cost of instances 1..k with out_k = b; by row class of b as the next in.
    std::vector<std::vector<uint32_t>> arg_row(ch.m + 1), arg_col(ch.m + 1);
    const uint32_t first = local[members[c][out_pos[c]]];
    std::vector<double> f(ns);
    for (size_t s = 0; s < ns; ++s) f[s] = e.at(e.row_of[first], e.col_of[s]) + ch.out_cost[s];
    for (uint32_t k = 2; k <= ch.m; ++k) {
      std::vector<double> best_row(e.rows, kInfinity);
      arg_row[k].assign(e.rows, 0);  // per row class: the cheapest out_{k-1}
      for (size_t s = 0; s < ns; ++s) {
        double x = f[s] + ch.in_cost[s];
        if (x < best_row[e.row_of[s]]) {
          best_row[e.row_of[s]] = x;
          arg_row[k][e.row_of[s]] = static_cast<uint32_t>(s);
        }
      }
      std::vector<double> best_col(e.cols, kInfinity);
      arg_col[k].assign(e.cols, 0);  // per column class: the best row class before it
      for (size_t rr = 0; rr < e.rows; ++rr) {
        if (!std::isfinite(best_row[rr])) continue;
        for (size_t cc = 0; cc < e.cols; ++cc) {
          double x = best_row[rr] + e.at(rr, cc);
          if (x < best_col[cc]) {
            best_col[cc] = x;
            arg_col[k][cc] = static_cast<uint32_t>(rr);
          }
        }
      }
      for (size_t s = 0; s < ns; ++s) f[s] = best_col[e.col_of[s]] + ch.out_cost[s];
    }
    std::vector<uint32_t> outs(ch.m + 1);
    outs[0] = first;
    outs[ch.m] = rchoice[last_out[c]];
    for (uint32_t k = ch.m; k >= 2; --k) outs[k - 1] = arg_row[k][arg_col[k][e.col_of[outs[k]]]];
    // Each middle instance k given out_{k-1} and out_k, by T's own back-substitutions.
    for (uint32_t k = 1; k <= ch.m; ++k) {
      std::vector<uint32_t> b = ch.reducer->expand(ch.ids, {outs[k - 1], outs[k]});
      for (uint32_t p = 0; p < w; ++p) local[members[c][size_t{k} * w + p]] = b[1 + p];
    }
  }
  out.choice.resize(n);
  for (uint32_t v = 0; v < n; ++v) out.choice[v] = keep[v][local[v]];
  out.objective = evaluate(full, out.choice);
  return out;
}

}  // namespace apc::solver::detail
