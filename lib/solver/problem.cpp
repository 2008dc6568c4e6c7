//===- lib/solver/problem.cpp - Problem validation, evaluation, dumps ------===//
#include "apc/solver/problem.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace apc::solver {

size_t Problem::numStrategies() const {
  size_t n = 0;
  for (const auto& v : nodes) n += v.numStrategies();
  return n;
}

Status Problem::validate() const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ProblemNode& v = nodes[i];
    std::string where = "node " + std::to_string(i) + " (" + v.name + ")";
    if (v.costs.empty()) return invalidArgument(where + " has no strategies");
    for (double c : v.costs)
      if (std::isnan(c) || c < 0) return invalidArgument(where + " has a negative or NaN cost");
    if (!v.memory.empty() && v.memory.size() != v.costs.size())
      return invalidArgument(where + " has " + std::to_string(v.memory.size()) +
                             " memory entries for " + std::to_string(v.costs.size()) +
                             " strategies");
    if (v.pinned && *v.pinned >= v.costs.size())
      return invalidArgument(where + " is pinned to strategy " + std::to_string(*v.pinned) +
                             " of " + std::to_string(v.costs.size()));
  }
  std::unordered_set<const void*> checked;  // cost tables whose values were checked
  for (size_t i = 0; i < edges.size(); ++i) {
    const ProblemEdge& e = edges[i];
    std::string where = "edge " + std::to_string(i);
    if (e.src >= nodes.size() || e.dst >= nodes.size() || e.src == e.dst)
      return invalidArgument(where + " connects invalid nodes");
    const size_t ns = nodes[e.src].numStrategies(), nt = nodes[e.dst].numStrategies();
    if (e.factorized() || !e.dst_class.empty()) {
      if (e.src_class.size() != ns || e.dst_class.size() != nt || e.num_dst_classes == 0 ||
          e.costs.size() % e.num_dst_classes != 0)
        return invalidArgument(where + " has class maps of the wrong size");
      const size_t rows = e.costs.size() / e.num_dst_classes;
      for (uint32_t c : e.src_class)
        if (c >= rows) return invalidArgument(where + " has a source class out of range");
      for (uint32_t c : e.dst_class)
        if (c >= e.num_dst_classes)
          return invalidArgument(where + " has a destination class out of range");
    } else if (e.costs.size() != ns * nt) {
      return invalidArgument(where + " has a cost matrix of the wrong size");
    }
    if (!checked.insert(e.costs.identity()).second) continue;  // a shared table, checked
    for (double c : e.costs)
      if (std::isnan(c) || c < 0) return invalidArgument(where + " has a negative or NaN cost");
  }
  if (memory && (std::isnan(memory->low) || memory->low > memory->high))
    return invalidArgument("memory bound low > high");
  return Status::success();
}

const char* statusName(SolveStatus s) {
  switch (s) {
    case SolveStatus::kOptimal:
      return "optimal";
    case SolveStatus::kTimeLimit:
      return "time_limit";
    case SolveStatus::kFeasible:
      return "feasible";
  }
  return "feasible";
}

double memoryOf(const Problem& p, const std::vector<uint32_t>& choice) {
  double m = 0;
  for (size_t i = 0; i < p.nodes.size(); ++i)
    if (!p.nodes[i].memory.empty()) m += p.nodes[i].memory[choice[i]];
  return m;
}

double evaluate(const Problem& p, const std::vector<uint32_t>& choice) {
  if (choice.size() != p.nodes.size()) return kInfinity;
  double total = 0;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const ProblemNode& v = p.nodes[i];
    if (choice[i] >= v.numStrategies()) return kInfinity;
    if (v.pinned && *v.pinned != choice[i]) return kInfinity;
    total += v.costs[choice[i]];
  }
  for (const ProblemEdge& e : p.edges)
    total += e.cost(choice[e.src], choice[e.dst], p.nodes[e.dst].numStrategies());
  if (p.memory) {
    double m = memoryOf(p, choice);
    // Relative slack so that bounds computed from fractions of byte totals are not missed by
    // rounding.
    double eps = 1e-9 * std::max(1.0, std::fabs(m));
    if (m < p.memory->low - eps || m > p.memory->high + eps) return kInfinity;
  }
  return total;
}

Expected<Solution> bruteForce(const Problem& p) {
  APC_RETURN_IF_ERROR(p.validate());
  double combos = 1;
  for (const auto& v : p.nodes) combos *= static_cast<double>(v.numStrategies());
  if (combos > 5e6) return invalidArgument("problem too large for brute force");
  std::vector<uint32_t> choice(p.nodes.size(), 0), best;
  double best_cost = kInfinity;
  while (true) {
    double c = evaluate(p, choice);
    if (c < best_cost) {
      best_cost = c;
      best = choice;
    }
    size_t i = 0;
    for (; i < choice.size(); ++i) {
      if (++choice[i] < p.nodes[i].numStrategies()) break;
      choice[i] = 0;
    }
    if (i == choice.size()) break;
  }
  if (best.empty() && !p.nodes.empty()) return infeasible("no choice satisfies the constraints");
  Solution s;
  s.choice = best;
  s.objective = best_cost;
  s.bound = best_cost;
  s.status = SolveStatus::kOptimal;
  return s;
}

namespace {
// JSON has no infinity: forbidden pairs are written as null.
nlohmann::json costsToJson(const std::vector<double>& costs) {
  nlohmann::json a = nlohmann::json::array();
  for (double c : costs) a.push_back(std::isinf(c) ? nlohmann::json(nullptr) : nlohmann::json(c));
  return a;
}
Expected<std::vector<double>> costsFromJson(const nlohmann::json& a, const std::string& where) {
  if (!a.is_array()) return parseError(where + ": expected an array of costs");
  std::vector<double> out;
  for (const auto& c : a) {
    if (c.is_null())
      out.push_back(kInfinity);
    else if (c.is_number())
      out.push_back(c.get<double>());
    else
      return parseError(where + ": costs must be numbers or null");
  }
  return out;
}
}  // namespace

nlohmann::json toJson(const Problem& p) {
  using nlohmann::json;
  json nodes = json::array();
  for (const auto& v : p.nodes) {
    json n = {{"name", v.name}, {"costs", costsToJson(v.costs)}};
    if (!v.memory.empty()) n["memory"] = v.memory;
    if (v.pinned) {
      n["pinned"] = *v.pinned;
      n["pin_group"] = v.pin_group;
    }
    nodes.push_back(n);
  }
  json edges = json::array();
  for (const auto& e : p.edges) {
    json j = {{"src", e.src}, {"dst", e.dst}, {"costs", costsToJson(e.costs.values())}};
    if (e.factorized()) {
      j["src_class"] = e.src_class;
      j["dst_class"] = e.dst_class;
      j["num_dst_classes"] = e.num_dst_classes;
    }
    edges.push_back(std::move(j));
  }
  json j = {{"format", "apc-solver-problem-1"}, {"nodes", nodes}, {"edges", edges}};
  if (p.memory)
    j["memory"] = {{"low", p.memory->low},
                   {"high", std::isinf(p.memory->high) ? json(nullptr) : json(p.memory->high)}};
  return j;
}

Expected<Problem> problemFromJson(const nlohmann::json& j) {
  if (!j.is_object() || j.value("format", "") != "apc-solver-problem-1")
    return parseError("not an apc solver problem (format apc-solver-problem-1)");
  Problem p;
  try {
    for (size_t i = 0; i < j.at("nodes").size(); ++i) {
      const auto& n = j["nodes"][i];
      std::string where = "$.nodes[" + std::to_string(i) + "]";
      ProblemNode v;
      v.name = n.value("name", "");
      APC_ASSIGN_OR_RETURN(v.costs, costsFromJson(n.at("costs"), where + ".costs"));
      if (n.contains("memory")) v.memory = n["memory"].get<std::vector<double>>();
      if (n.contains("pinned")) {
        v.pinned = n["pinned"].get<uint32_t>();
        v.pin_group = n.value("pin_group", "");
      }
      p.nodes.push_back(std::move(v));
    }
    for (size_t i = 0; i < j.at("edges").size(); ++i) {
      const auto& e = j["edges"][i];
      ProblemEdge pe;
      pe.src = e.at("src").get<uint32_t>();
      pe.dst = e.at("dst").get<uint32_t>();
      APC_ASSIGN_OR_RETURN(
          pe.costs, costsFromJson(e.at("costs"), "$.edges[" + std::to_string(i) + "].costs"));
      if (e.contains("src_class")) {
        pe.src_class = e["src_class"].get<std::vector<uint32_t>>();
        pe.dst_class = e.at("dst_class").get<std::vector<uint32_t>>();
        pe.num_dst_classes = e.at("num_dst_classes").get<uint32_t>();
      }
      p.edges.push_back(std::move(pe));
    }
    if (j.contains("memory")) {
      MemoryBound m;
      m.low = j["memory"].value("low", 0.0);
      const auto& high = j["memory"]["high"];
      m.high = high.is_null() ? kInfinity : high.get<double>();
      p.memory = m;
    }
  } catch (const nlohmann::json::exception& e) {
    return parseError(std::string("malformed solver problem: ") + e.what());
  }
  APC_RETURN_IF_ERROR(p.validate());
  return p;
}

}  // namespace apc::solver
