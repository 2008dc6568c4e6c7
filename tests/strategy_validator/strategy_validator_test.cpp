//===- tests/strategy_validator/strategy_validator_test.cpp - Every rule, executed ===//
//
// The main guarantee that the planner only proposes correct plans (DESIGN.md "Placements and
// strategies"): every strategy that strategy::enumerate offers for every op node of the sample
// models, on meshes [4], [2,2], [2,4] and [2,2,2], is executed on simulated ranks and compared
// with the unsharded op (node_check.h). Node instances with the same (op, input and output
// metadata, constants) have the same strategies and are validated once (transformer layers
// repeat); their count is reported.
//
// Executed samples run at small shapes (the op set and the rules are what matter, not the size):
// toy_block x:[2,4,1024], mlp_stack, gpt2_tiny*, llama_tiny*, cnn_small, multi_output, with batch
// and sequence lengths chosen to include uneven shards. The stub-weight samples (gpt2_small*,
// llama_small, llama3_8b: zero-stride weights, too big to execute) share the op set and rules of
// their tiny siblings; for them the test asserts that every op they use with strategies was
// validated on the tiny samples, and reports which of their (op, tensor ranks, strategy) classes
// were executed on a tiny sample. Every sample, on every mesh, must also be free of the
// Replicate-only fallback (strategy::fallbackOps), and every strategy must be well formed with the
// all-Replicate strategy first.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>

#include <c10/core/DefaultDtype.h>
#include <nlohmann/json.hpp>

#include "apc/frontend/torchscript.h"
#include "apc/strategy/strategy.h"
#include "apc/support/strings.h"
#include "node_check.h"

namespace apc::validator {
namespace {

namespace fs = std::filesystem;
using mesh::DeviceMesh;
using strategy::Strategy;

const fs::path kSamples = fs::path(APC_SOURCE_DIR) / "sample_models" / "out";

/// An executed sample and its input shapes (empty: the recorded ones).
struct ExecutedSample {
  const char* name;
  std::vector<const char*> inputs;
};

const ExecutedSample kExecuted[] = {
    {"toy_block", {"x:f32[2,4,1024]"}},
    {"mlp_stack", {"x:f32[4,6,128]"}},
    {"gpt2_tiny", {"idx:i64[4,8]"}},
    {"gpt2_tiny_loss", {"idx:i64[4,8]", "targets:i64[4,8]"}},
    {"gpt2_tiny_scripted", {"idx:i64[4,8]"}},
    {"llama_tiny", {"tokens:i64[4,12]"}},
    {"llama_tiny_scripted", {"tokens:i64[6,10]"}},
    {"cnn_small", {"x:f32[4,3,16,16]"}},
    {"multi_output", {}},
};

/// Stub-weight samples: imported at their recorded shapes, enumerated, never executed.
const char* const kStubs[] = {"gpt2_small", "gpt2_small_loss", "llama_small", "llama3_8b"};

const std::vector<std::vector<int64_t>> kMeshShapes = {{4}, {2, 2}, {2, 4}, {2, 2, 2}};

struct LoadedModel {
  std::string name;
  bool executed = false;
  ir::Graph graph;
  std::vector<std::vector<strategy::NodeStrategies>> per_mesh;  // one per kMeshShapes entry
  std::string error;                                            // import failure
};

/// A distinct node instance: (op, input/output metadata, constants). Validated once.
struct Combo {
  const LoadedModel* model = nullptr;  // first occurrence
  ir::NodeId node;
  int64_t occurrences = 0;
  std::set<std::string> models;
  std::vector<std::vector<Strategy>> per_mesh;  // union over occurrences, deduplicated
  std::vector<std::set<std::string>> keys;
};

struct Corpus {
  std::vector<DeviceMesh> meshes;
  std::vector<std::unique_ptr<LoadedModel>> models;
  std::map<std::string, Combo> combos;  // executed samples only; ordered: deterministic
  double load_s = 0;
};

/// "|"-joined value descriptions: what enumerate's cache key holds (less requires_grad).
std::string valueKey(const ir::Value& v) {
  std::string k = ir::valueTypeName(v.type);
  if (v.tensor) k += ":" + ir::toString(*v.tensor);
  for (const ir::TensorMeta& e : v.elements) k += ";" + ir::toString(e);
  if (v.constant) k += "=" + ir::toString(*v.constant);
  return k;
}

std::string signature(const ir::Graph& g, const ir::Node& n) {
  std::string k = n.qualifiedOp() + "(";
  for (ir::ValueId v : n.inputs) k += valueKey(g.value(v)) + "|";
  k += ")->(";
  for (ir::ValueId v : n.outputs) k += valueKey(g.value(v)) + "|";
  return k + ")";
}

/// Placement text of every entry, "-" for non-tensors: distinguishes strategies fully.
std::string strategyKey(const Strategy& s) {
  auto part = [](const std::vector<std::optional<mesh::PlacementTuple>>& v) {
    return joinMap(v, " ", [](const auto& t) { return t ? mesh::toCompactString(*t) : "-"; });
  };
  return part(s.inputs) + " -> " + part(s.outputs);
}

/// Ranks of the tensor inputs and outputs: the class of an op instance across model sizes.
std::string rankClass(const ir::Graph& g, const ir::Node& n) {
  auto rank = [&](ir::ValueId id) {
    const ir::Value& v = g.value(id);
    if (v.tensor) return std::to_string(v.tensor->rank());
    if (!v.elements.empty()) return std::to_string(v.elements.front().rank()) + "[]";
    return std::string("-");
  };
  return n.qualifiedOp() + "(" + joinMap(n.inputs, ",", rank) + ")->(" +
         joinMap(n.outputs, ",", rank) + ")";
}

std::unique_ptr<LoadedModel> load(const std::string& name, const std::vector<const char*>& inputs,
                                  bool executed, const std::vector<DeviceMesh>& meshes) {
  auto m = std::make_unique<LoadedModel>();
  m->name = name;
  m->executed = executed;
  frontend::ImportOptions opts;
  for (const char* text : inputs) {
    auto spec = frontend::parseInputSpec(text);
    if (!spec.ok()) {
      m->error = spec.error().message();
      return m;
    }
    opts.inputs.push_back(*spec);
  }
  auto g = frontend::importTorchScript((kSamples / (name + ".pt")).string(), opts);
  if (!g.ok()) {
    m->error = g.error().message();
    return m;
  }
  m->graph = std::move(*g);
  for (const DeviceMesh& mesh : meshes) m->per_mesh.push_back(strategy::enumerate(m->graph, mesh));
  return m;
}

const Corpus& corpus() {
  static const Corpus c = [] {
    auto start = std::chrono::steady_clock::now();
    Corpus c;
    for (const auto& s : kMeshShapes) c.meshes.push_back(*DeviceMesh::create(s));
    for (const ExecutedSample& s : kExecuted)
      c.models.push_back(load(s.name, s.inputs, true, c.meshes));
    for (const char* s : kStubs) c.models.push_back(load(s, {}, false, c.meshes));
    for (const auto& m : c.models) {
      if (!m->executed || !m->error.empty()) continue;
      for (size_t mi = 0; mi < c.meshes.size(); ++mi) {
        for (const strategy::NodeStrategies& ns : m->per_mesh[mi]) {
          const ir::Node& node = m->graph.node(ns.node);
          Combo& combo = c.combos[signature(m->graph, node)];
          if (!combo.model) {
            combo.model = m.get();
            combo.node = ns.node;
            combo.per_mesh.resize(c.meshes.size());
            combo.keys.resize(c.meshes.size());
          }
          if (mi == 0) ++combo.occurrences;
          combo.models.insert(m->name);
          for (const Strategy& st : ns.strategies)
            if (combo.keys[mi].insert(strategyKey(st)).second) combo.per_mesh[mi].push_back(st);
        }
      }
    }
    c.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return c;
  }();
  return c;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

std::string whereText(const Combo& combo, const DeviceMesh* mesh, const Strategy* s) {
  const ir::Node& n = combo.model->graph.node(combo.node);
  std::string t = n.qualifiedOp() + " node " + std::to_string(combo.node.v) + " (" +
                  (n.module_path.empty() ? "top level" : n.module_path) + ") of " +
                  combo.model->name;
  if (combo.occurrences > 1)
    t += " [+" + std::to_string(combo.occurrences - 1) + " identical nodes in " +
         join({combo.models.begin(), combo.models.end()}, ",") + "]";
  if (mesh) t += ", mesh " + mesh->toString();
  if (s) t += ", strategy " + s->toString() + " {" + strategyKey(*s) + "}";
  return t;
}

// --- tests ----------------------------------------------------------------------------------------

// Every importable sample of the manifest is either executed or checked as a stub here.
TEST(StrategyValidator, EveryImportableSampleIsCovered) {
  std::ifstream f(kSamples / "manifest.json");
  ASSERT_TRUE(f) << "missing " << (kSamples / "manifest.json");
  nlohmann::json manifest = nlohmann::json::parse(f);
  std::set<std::string> known;
  for (const ExecutedSample& s : kExecuted) known.insert(s.name);
  for (const char* s : kStubs) known.insert(s);
  int importable = 0;
  for (const auto& s : manifest["samples"]) {
    if (!s.value("importable", true)) continue;
    ++importable;
    std::string name = s["name"];
    EXPECT_TRUE(known.count(name)) << "sample " << name << " is neither executed nor a stub here";
    bool stub = s.value("stub_weights", false);
    bool is_stub_here = std::find_if(std::begin(kStubs), std::end(kStubs), [&](const char* k) {
                          return name == k;
                        }) != std::end(kStubs);
    EXPECT_EQ(stub, is_stub_here) << name << ": stub_weights " << stub;
  }
  EXPECT_EQ(importable, static_cast<int>(known.size()));
  for (const auto& m : corpus().models) EXPECT_EQ(m->error, "") << m->name;
}

TEST(StrategyValidator, NoSampleHasReplicateOnlyFallback) {
  const Corpus& c = corpus();
  for (const auto& m : c.models) {
    if (!m->error.empty()) continue;
    for (size_t mi = 0; mi < c.meshes.size(); ++mi) {
      std::vector<std::string> ops = strategy::fallbackOps(m->graph, m->per_mesh[mi]);
      EXPECT_TRUE(ops.empty()) << m->name << " on mesh " << c.meshes[mi].toString()
                               << ": Replicate-only fallback for " << join(ops, ", ");
    }
  }
}

TEST(StrategyValidator, StrategiesAreWellFormedWithReplicateFirst) {
  const Corpus& c = corpus();
  int failures = 0;
  for (const auto& m : c.models) {
    if (!m->error.empty()) continue;
    for (size_t mi = 0; mi < c.meshes.size(); ++mi) {
      for (const strategy::NodeStrategies& ns : m->per_mesh[mi]) {
        const ir::Node& node = m->graph.node(ns.node);
        std::string where = m->name + " node " + std::to_string(ns.node.v) + " " +
                            node.qualifiedOp() + " on mesh " + c.meshes[mi].toString();
        if (ns.strategies.empty()) {
          if (++failures <= 20) ADD_FAILURE() << where << ": no strategies";
          continue;
        }
        for (size_t k = 0; k < ns.strategies.size(); ++k) {
          const Strategy& s = ns.strategies[k];
          if (auto bad = checkStrategyForm(m->graph, node, s, c.meshes[mi])) {
            if (++failures <= 20) ADD_FAILURE() << where << ", strategy " << k << ": " << *bad;
            continue;
          }
          if (k != 0) continue;
          bool all_r = true;
          for (const auto& t : s.inputs)
            if (t)
              for (const auto& p : *t) all_r = all_r && p.isReplicate();
          for (const auto& t : s.outputs)
            if (t)
              for (const auto& p : *t) all_r = all_r && p.isReplicate();
          if (!all_r && ++failures <= 20)
            ADD_FAILURE() << where << ": the first strategy is " << s.toString()
                          << ", not all-Replicate";
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// The main property: every strategy of every distinct op instance, executed on every mesh.
TEST(StrategyValidator, EveryStrategyMatchesTheUnshardedOp) {
  const Corpus& c = corpus();
  ASSERT_FALSE(c.combos.empty());
  // Factories without a dtype (full(..., -inf), ones) follow the default dtype: f64, like the
  // widened inputs.
  const caffe2::TypeMeta saved_dtype = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  auto start = std::chrono::steady_clock::now();

  CheckStats stats;
  std::vector<int64_t> per_mesh(c.meshes.size(), 0);
  int64_t strategies = 0, failures = 0, nodes = 0;
  std::map<std::string, int64_t> failures_by_op;
  std::set<std::string> ops;
  auto fail = [&](const std::string& op, const std::string& text) {
    ++failures;
    ++failures_by_op[op];
    if (failures <= 40) ADD_FAILURE() << "WRONG: " << text;
  };
  std::vector<std::pair<double, std::string>> slowest;  // (seconds, combo), for tuning
  // APC_VALIDATOR_FILTER=<text>: only the combos whose signature contains <text> (debugging).
  const char* filter_env = std::getenv("APC_VALIDATOR_FILTER");
  const std::string filter = filter_env ? filter_env : "";
  for (const auto& [sig, combo] : c.combos) {
    auto combo_start = std::chrono::steady_clock::now();
    struct Timer {  // records the combo's time however the iteration ends
      std::chrono::steady_clock::time_point start;
      std::vector<std::pair<double, std::string>>& out;
      std::string what;
      ~Timer() {
        out.push_back(
            {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), what});
      }
    } timer{combo_start, slowest,
            whereText(combo, nullptr, nullptr) + ", strategies per mesh " +
                joinMap(combo.per_mesh, "/", [](const auto& v) { return std::to_string(v.size()); })};
    if (!filter.empty() && sig.find(filter) == std::string::npos) continue;
    const ir::Graph& g = combo.model->graph;
    const ir::Node& node = g.node(combo.node);
    nodes += combo.occurrences;
    ops.insert(node.qualifiedOp());
    Expected<NodeOp> op = NodeOp::resolve(node);
    if (!op.ok()) {
      fail(node.qualifiedOp(), whereText(combo, nullptr, nullptr) + ": " + op.error().message());
      continue;
    }
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(fnv1a(sig));
    Expected<std::vector<c10::IValue>> inputs = makeFullInputs(g, node, *op, gen);
    if (!inputs.ok()) {
      fail(node.qualifiedOp(), whereText(combo, nullptr, nullptr) + ": inputs: " +
                                   inputs.error().message());
      continue;
    }
    Expected<std::vector<c10::IValue>> reference = runNode(node, *op, *inputs);
    if (!reference.ok()) {
      fail(node.qualifiedOp(), whereText(combo, nullptr, nullptr) + ": unsharded run: " +
                                   reference.error().message());
      continue;
    }
    if (auto bad = checkReferenceShapes(g, node, *reference)) {
      fail(node.qualifiedOp(), whereText(combo, nullptr, nullptr) + ": " + *bad);
      continue;
    }
    for (size_t mi = 0; mi < c.meshes.size(); ++mi) {
      for (const Strategy& s : combo.per_mesh[mi]) {
        ++strategies;
        ++per_mesh[mi];
        if (auto bad = checkStrategyForm(g, node, s, c.meshes[mi])) {
          fail(node.qualifiedOp(), whereText(combo, &c.meshes[mi], &s) + ": " + *bad);
          continue;
        }
        std::optional<std::string> bad;
        try {
          bad = checkStrategy(g, node, *op, s, c.meshes[mi], *inputs, *reference, gen, stats);
        } catch (const std::exception& e) {
          bad = "exception: " + firstLine(e.what());
        }
        if (bad) fail(node.qualifiedOp(), whereText(combo, &c.meshes[mi], &s) + ": " + *bad);
      }
    }
  }
  c10::set_default_dtype(saved_dtype);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[strategy validator] samples imported and enumerated in " << c.load_s << " s\n"
            << "[strategy validator] " << nodes << " op nodes with strategies in the executed "
            << "samples, " << c.combos.size() << " distinct (op, shapes, constants) combos, "
            << ops.size() << " ops; " << strategies << " strategies executed (";
  for (size_t mi = 0; mi < c.meshes.size(); ++mi)
    std::cout << (mi ? ", " : "") << c.meshes[mi].toString() << ": " << per_mesh[mi];
  std::cout << "); " << stats.rank_calls << " rank calls, " << stats.rewrites
            << " with local rewrites; " << secs << " s\n";
  std::sort(slowest.rbegin(), slowest.rend());
  for (size_t i = 0; i < std::min<size_t>(slowest.size(), 5); ++i)
    std::cout << "[strategy validator] slowest: " << slowest[i].first << " s " << slowest[i].second
              << "\n";
  if (failures)
    for (const auto& [op, n] : failures_by_op)
      std::cout << "[strategy validator] WRONG " << op << ": " << n << " strategies\n";
  EXPECT_EQ(failures, 0);
  // Every mesh must have exercised sharded strategies, not only all-Replicate ones.
  for (size_t mi = 0; mi < c.meshes.size(); ++mi)
    EXPECT_GT(per_mesh[mi], static_cast<int64_t>(c.combos.size())) << c.meshes[mi].toString();
}

// The stub-weight samples cannot be executed; their ops and strategy classes must have been
// executed on the tiny samples, which share their code (the tiny and big models come from the
// same Python classes).
TEST(StrategyValidator, StubSamplesUseOnlyValidatedOps) {
  const Corpus& c = corpus();
  std::set<std::string> validated_ops;
  // (mesh index, rank class) -> strategy keys executed on tiny samples.
  std::map<std::pair<size_t, std::string>, std::set<std::string>> validated_classes;
  for (const auto& [sig, combo] : c.combos) {
    const ir::Node& n = combo.model->graph.node(combo.node);
    validated_ops.insert(n.qualifiedOp());
    for (size_t mi = 0; mi < c.meshes.size(); ++mi)
      validated_classes[{mi, rankClass(combo.model->graph, n)}].insert(combo.keys[mi].begin(),
                                                                       combo.keys[mi].end());
  }
  for (const auto& m : c.models) {
    if (m->executed || !m->error.empty()) continue;
    std::set<std::string> ops;
    int64_t total = 0, covered = 0;
    std::map<std::string, int64_t> uncovered;  // rank class -> strategies not executed
    for (size_t mi = 0; mi < c.meshes.size(); ++mi) {
      std::set<std::pair<std::string, std::string>> seen;
      for (const strategy::NodeStrategies& ns : m->per_mesh[mi]) {
        const ir::Node& n = m->graph.node(ns.node);
        ops.insert(n.qualifiedOp());
        std::string cls = rankClass(m->graph, n);
        auto it = validated_classes.find({mi, cls});
        for (const Strategy& s : ns.strategies) {
          std::string key = strategyKey(s);
          if (!seen.insert({cls, key}).second) continue;
          ++total;
          if (it != validated_classes.end() && it->second.count(key))
            ++covered;
          else
            ++uncovered[cls];
        }
      }
    }
    std::vector<std::string> missing;
    for (const std::string& op : ops)
      if (!validated_ops.count(op)) missing.push_back(op);
    EXPECT_TRUE(missing.empty()) << m->name << " uses ops never validated on a tiny sample: "
                                 << join(missing, ", ");
    std::cout << "[strategy validator] stub " << m->name << ": " << ops.size() << " ops, all "
              << (missing.empty() ? "validated" : "NOT validated") << "; " << covered << " of "
              << total << " distinct (mesh, op ranks, strategy) classes executed on tiny samples";
    if (!uncovered.empty()) {  // the most frequent classes whose strategies the big dims add
      std::vector<std::pair<int64_t, std::string>> top;
      for (const auto& [cls, n] : uncovered) top.push_back({-n, cls});
      std::sort(top.begin(), top.end());
      top.resize(std::min<size_t>(top.size(), 4));
      std::cout << " (most not executed: "
                << joinMap(top, ", ",
                           [](const auto& t) { return t.second + " x" + std::to_string(-t.first); })
                << ")";
    }
    std::cout << "\n";
  }
}

}  // namespace
}  // namespace apc::validator
