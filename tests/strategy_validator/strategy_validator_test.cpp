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
// toy_block x:[2,4,1024], mlp_stack, gpt2_tiny*, llama_tiny*, cnn_small, resnet_bottleneck,
// swin_tiny, multi_output, moe_tiny, hf_mixtral_tiny (and the .pt2 of the grouped_mm HF MoE
// samples), random_ops (its nodes that draw random numbers are not executed: a draw cannot match
// the unsharded one), with batch and sequence lengths chosen to
// include uneven shards. The stub-weight samples (gpt2_small*, llama_small, llama3_8b: zero-stride
// weights, too big to execute) share the op set and rules of their tiny siblings; for them the test
// asserts that every op they use with strategies was validated on the tiny samples, and reports
// which of their (op, tensor ranks, strategy) classes were executed on a tiny sample. Every sample,
// on every mesh, must also be free of the Replicate-only fallback (strategy::fallbackOps), and
// every strategy must be well formed with the all-Replicate strategy first. Forms of ops that the
// executed samples lack (einsum and index.Tensor with broadcast operands, more einsum equations and
// upsample arguments, the core-ATen BatchNorm forms) are validated the same way on nodes built by
// hand (HandBuiltOpCasesMatchTheUnshardedOp).
//
// Time: f64 matmuls run on the reference BLAS here, so the few big combos (gpt2's lm_head and
// vocabulary-sized views, toy_block's 4096x1024 linears) validate an evenly spread subset of their
// strategies per mesh (kBigComboStrategies, logged as "capped"); everything else runs in full.
// The validator's own teeth are tested too: deliberately wrong rules (Partial through gelu, a
// sharded softmax dim, a Partial output called Replicate, ...) must all be reported.
// Debugging: APC_VALIDATOR_FILTER=<text> runs only the combos whose signature contains <text>;
// APC_VALIDATOR_VERBOSE=1 prints every strategy before running it.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <set>

#include <c10/core/DefaultDtype.h>
#include <nlohmann/json.hpp>

#include "../strategy/builder.h"
#include "apc/frontend/model.h"
#include "apc/frontend/torchscript.h"
#include "apc/strategy/rules.h"
#include "apc/strategy/strategy.h"
#include "apc/strategy/token_local.h"
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
  const char* file = ".pt";  // the program validated: <name><file>
};

const ExecutedSample kExecuted[] = {
    {"toy_block", {"x:f32[2,4,1024]"}},
    {"mlp_stack", {"x:f32[4,6,128]"}},
    {"gpt2_tiny", {"idx:i64[2,8]"}},
    {"gpt2_tiny_loss", {"idx:i64[2,8]", "targets:i64[2,8]"}},
    {"gpt2_tiny_scripted", {"idx:i64[2,8]"}},
    {"llama_tiny", {"tokens:i64[4,12]"}},
    {"llama_tiny_scripted", {"tokens:i64[6,10]"}},
    {"cnn_small", {"x:f32[4,3,16,16]"}},
    // Training-mode BatchNorm (batch-sharded with synchronized statistics), in-place ops.
    {"resnet_bottleneck", {"x:f64[4,3,32,32]"}},
    // Shifted windows: pad, roll, table[index], slice_scatter/fill of the mask, strided slices.
    {"swin_tiny", {"x:f32[4,3,40,40]"}},
    {"multi_output", {}},
    // Hugging Face transformers' LlamaForCausalLM and GPT2LMHeadModel (small configs), traced.
    {"hf_llama_tiny", {"input_ids:i64[2,8]"}},
    {"hf_gpt2_tiny", {"input_ids:i64[2,8]"}},
    // Sizes from the batch: class token expand, zeros + repeat initial state, arange, branch cat.
    {"batch_sized", {"x:f32[6,6,16]"}},
    // maxvit-style einsum attention, upsample_bilinear2d and upsample_nearest2d.
    {"einsum_upsample", {"x:f64[4,3,16,16]"}},
    // index.Tensor with optional-tensor lists ([None, pos], [None, None, const]), mT, numpy_T.
    {"gather_patterns", {"x:f32[4,6,16]", "idx:i64[4]"}},
    // Training dropouts (not executed: random), linears around them, a matmul by a weight.
    {"random_ops", {"x:f32[5,16]"}},
    // Mixture of experts: topk, gather, sort, repeat_interleave, index.Tensor of expert weights,
    // index_add / scatter_add combines, histc.
    {"moe_tiny", {"x:f32[4,6,32]"}},
    // Hugging Face MixtralForCausalLM with batched_mm experts (topk, repeat_interleave by a
    // traced size, expert weights gathered by index, bmm).
    {"hf_mixtral_tiny", {"input_ids:i64[2,8]"}},
    // Hugging Face Qwen3MoeForCausalLM, batched_mm experts (q/k RMSNorm, normalized top-k).
    {"hf_qwen3_moe_tiny", {"input_ids:i64[2,8]"}},
    // DeepSeek-V3-shaped decoder with capacity experts: one_hot, cumsum, the dispatch, expert and
    // combine einsums with their operands placed one by one (aten::einsum.operands), MLA's sdpa
    // with a v head dim other than qk's.
    {"deepseek_tiny", {"tokens:i64[2,8]"}},
    // The Hugging Face MoE models in transformers' default grouped_mm experts, as exported (their
    // .pt is the batched_mm trace): sort, histc, cumsum, _grouped_mm (imported from
    // transformers::grouped_mm_fallback), index_put; DeepseekV3's latent attention and router add
    // copy (slice assignments) and scatter.
    {"hf_mixtral_gmm_tiny", {"input_ids:i64[2,32]"}, ".pt2"},
    {"hf_qwen3_moe_gmm_tiny", {"input_ids:i64[2,32]"}, ".pt2"},
    {"hf_deepseek_v3_gmm_tiny", {"input_ids:i64[2,32]"}, ".pt2"},
};

/// Stub-weight samples: imported at their recorded shapes, enumerated, never executed.
const char* const kStubs[] = {"gpt2_small", "gpt2_small_loss", "llama_small", "llama_small_4l",
                              "llama3_8b",  "llama3_405b",     "deepseek_v3"};

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
                                  bool executed, const std::vector<DeviceMesh>& meshes,
                                  const std::string& file = ".pt") {
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
  // importModel: the graph the product plans (its import rewrites included: einsum operands).
  auto g = frontend::importModel((kSamples / (name + file)).string(), opts);
  if (!g.ok()) {
    m->error = g.error().message();
    return m;
  }
  m->graph = std::move(*g);
  for (const DeviceMesh& mesh : meshes) {
    std::vector<strategy::NodeStrategies> all = strategy::enumerate(m->graph, mesh);
    // The rules' strategies only. A token-local region's strategies (apc/strategy/token_local.h)
    // are not the op on pieces of its global inputs: each member computes on the rank's own
    // tokens, and only the region as a whole equals the model
    // (TokenLocalRegionsMatchTheUnshardedRegion runs them so).
    for (strategy::NodeStrategies& ns : all) {
      std::vector<Strategy> rules;
      for (const Strategy& st : ns.strategies)
        if (!st.regionLocal()) rules.push_back(st);
      if (rules.size() != ns.strategies.size()) ns.strategies = std::move(rules);
    }
    m->per_mesh.push_back(std::move(all));
  }
  return m;
}

const Corpus& corpus() {
  static const Corpus c = [] {
    auto start = std::chrono::steady_clock::now();
    Corpus c;
    for (const auto& s : kMeshShapes) c.meshes.push_back(*DeviceMesh::create(s));
    for (const ExecutedSample& s : kExecuted)
      c.models.push_back(load(s.name, s.inputs, true, c.meshes, s.file));
    for (const char* s : kStubs) c.models.push_back(load(s, {}, false, c.meshes));
    for (const auto& m : c.models) {
      if (!m->executed || !m->error.empty()) continue;
      for (size_t mi = 0; mi < c.meshes.size(); ++mi) {
        for (const strategy::NodeStrategies& ns : m->per_mesh[mi]) {
          // A Replicate-only fallback (no rule) computes the unsharded op on every rank: nothing
          // to validate (and its inputs may be lists the checker cannot build, e.g. Tensor?[]).
          if (ns.fallback) continue;
          const ir::Node& node = m->graph.node(ns.node);
          // A node that draws random numbers (random_ops' training dropouts) cannot match the
          // unsharded draw number for number; tests/runtime/random_streams_test.cpp checks what
          // the ranks draw.
          if (strategy::defaultRegistry().drawsRandomNumbers(m->graph, node)) continue;
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

/// Combos whose inputs and outputs hold more elements than this are big (gpt2's lm_head and
/// vocabulary-sized views, toy_block's 4096x1024 linears): f64 matmuls run on the reference BLAS
/// here, so each of their strategies costs a tenth of a second or more.
constexpr int64_t kBigComboElements = int64_t{1} << 20;
/// Strategies validated per mesh for a big combo, spread evenly over its list (the all-Replicate
/// one first). The same rules run in full on the smaller combos of the same ops.
constexpr size_t kBigComboStrategies = 40;

/// Indices of the strategies to validate out of `n` for a combo of `elements` elements.
std::vector<size_t> pickStrategies(size_t n, int64_t elements) {
  std::vector<size_t> picked;
  if (elements <= kBigComboElements || n <= kBigComboStrategies) {
    for (size_t i = 0; i < n; ++i) picked.push_back(i);
    return picked;
  }
  for (size_t i = 0; i < kBigComboStrategies; ++i) picked.push_back(i * n / kBigComboStrategies);
  return picked;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

/// APC_VALIDATOR_VERBOSE=1: print every strategy before running it (debugging).
bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("APC_VALIDATOR_VERBOSE");
    return e && std::string(e) == "1";
  }();
  return v;
}

/// Factories without a dtype (full(..., -inf), ones) follow the default dtype: f64 while this
/// lives, like the widened inputs.
struct DoubleDefaultDtype {
  caffe2::TypeMeta saved = c10::get_default_dtype();
  DoubleDefaultDtype() { c10::set_default_dtype(caffe2::TypeMeta::Make<double>()); }
  ~DoubleDefaultDtype() { c10::set_default_dtype(saved); }
};

struct NodeValidation {
  std::vector<int64_t> executed;  // strategies executed per mesh
  int64_t skipped = 0;            // strategies left out by the cap on big combos
};

/// Failures go here: the mesh and strategy (nullptr when the node fails before either) and what.
using FailFn = std::function<void(const DeviceMesh*, const Strategy*, const std::string&)>;

/// Validates `per_mesh[i]` (strategies of `node` on `meshes[i]`): random inputs seeded by `seed`,
/// the unsharded reference, then every strategy (or, with `cap`, at most kBigComboStrategies per
/// mesh of a big combo; `label` names the node in the log line saying so).
NodeValidation validateNode(const ir::Graph& g, const ir::Node& node,
                            const std::vector<DeviceMesh>& meshes,
                            const std::vector<std::vector<Strategy>>& per_mesh, uint64_t seed,
                            bool cap, const std::string& label, CheckStats& stats,
                            const FailFn& fail) {
  NodeValidation result;
  result.executed.assign(meshes.size(), 0);
  Expected<NodeOp> op = NodeOp::resolve(node);
  if (!op.ok()) {
    fail(nullptr, nullptr, op.error().message());
    return result;
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Expected<std::vector<c10::IValue>> inputs = makeFullInputs(g, node, *op, gen);
  if (!inputs.ok()) {
    fail(nullptr, nullptr, "inputs: " + inputs.error().message());
    return result;
  }
  Expected<std::vector<c10::IValue>> reference = runNode(node, *op, *inputs);
  if (!reference.ok()) {
    fail(nullptr, nullptr, "unsharded run: " + reference.error().message());
    return result;
  }
  if (auto bad = checkReferenceShapes(g, node, *reference)) {
    fail(nullptr, nullptr, *bad);
    return result;
  }
  int64_t elements = 0;
  auto count = [&](const c10::IValue& v) {
    if (v.isTensor()) elements += v.toTensor().numel();
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector()) elements += t.numel();
  };
  for (const c10::IValue& v : *inputs) count(v);
  for (const c10::IValue& v : *reference) count(v);
  for (size_t mi = 0; mi < meshes.size(); ++mi) {
    const std::vector<Strategy>& all = per_mesh[mi];
    std::vector<size_t> picked = pickStrategies(all.size(), cap ? elements : 0);
    if (picked.size() < all.size()) {
      result.skipped += static_cast<int64_t>(all.size() - picked.size());
      std::cout << "[strategy validator] capped " << label << " (" << elements
                << " elements): " << picked.size() << " of " << all.size() << " strategies on mesh "
                << meshes[mi].toString() << "\n";
    }
    for (size_t pi : picked) {
      const Strategy& s = all[pi];
      ++result.executed[mi];
      if (auto bad = checkStrategyForm(g, node, s, meshes[mi])) {
        fail(&meshes[mi], &s, *bad);
        continue;
      }
      if (verbose())
        std::cout << "[strategy validator] " << label << ", mesh " << meshes[mi].toString() << ": "
                  << strategyKey(s) << "\n";
      std::optional<std::string> bad;
      try {
        bad = checkStrategy(g, node, *op, s, meshes[mi], *inputs, *reference, gen, stats);
      } catch (const std::exception& e) {
        bad = "exception: " + firstLine(e.what());
      }
      if (bad) fail(&meshes[mi], &s, *bad);
    }
  }
  return result;
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

// --- tests
// ----------------------------------------------------------------------------------------

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
    bool is_stub_here = std::find_if(std::begin(kStubs), std::end(kStubs),
                                     [&](const char* k) { return name == k; }) != std::end(kStubs);
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
      const std::vector<std::string> ops = strategy::fallbackOps(m->graph, m->per_mesh[mi]);
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
// The token-local regions of the executed samples (the grouped_mm MoE layers of Hugging Face's
// Mixtral, Qwen3-MoE and DeepSeek-V3, apc/strategy/token_local.h): their strategies are not the op
// on pieces of its global inputs, so the per-node check leaves them out (load). Here every variant
// of every region on every mesh runs as a whole (checkRegion): the members on each rank's pieces,
// as lowering ships them, and the exit laid out as its placement must equal the unsharded region.
TEST(StrategyValidator, TokenLocalRegionsMatchTheUnshardedRegion) {
  const Corpus& c = corpus();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
  CheckStats stats;
  int64_t variants = 0, failures = 0;
  std::set<std::string> models;
  for (const auto& m : c.models) {
    if (!m->executed || !m->error.empty()) continue;
    const std::vector<strategy::TokenLocalRegion> regions =
        strategy::findTokenLocalRegions(m->graph);
    if (regions.empty()) continue;
    models.insert(m->name);
    for (const DeviceMesh& mesh : c.meshes) {
      std::map<uint32_t, strategy::StrategyList> of;  // node -> its strategies with the regions'
      for (const strategy::NodeStrategies& ns : strategy::enumerate(m->graph, mesh))
        of[ns.node.v] = ns.strategies;
      for (const strategy::TokenLocalRegion& region : regions) {
        std::set<int> ks;
        for (const Strategy& st : of[region.root.v])
          if (st.regionLocal()) ks.insert(st.region_variant);
        for (int k : ks) {
          std::vector<Strategy> chosen;
          for (ir::NodeId id : region.members)
            for (const Strategy& st : of[id.v])
              if (st.region_variant == k) {
                chosen.push_back(st);
                break;
              }
          const std::string where =
              m->name + " region at %" +
              m->graph.value(m->graph.node(region.root).outputs[0]).debug_name + " variant " +
              std::to_string(k) + " on " + mesh.toString();
          std::optional<std::string> bad =
              chosen.size() == region.members.size()
                  ? checkRegion(m->graph, region, chosen, mesh, gen, stats)
                  : std::optional<std::string>("a member lacks the variant");
          ++variants;
          if (bad && ++failures <= 10) ADD_FAILURE() << where << ": " << *bad;
        }
      }
    }
  }
  std::cout << "[strategy validator] token-local regions of "
            << join({models.begin(), models.end()}, ", ") << ": " << variants
            << " variants executed, " << failures << " wrong; " << stats.rank_calls
            << " rank calls, " << stats.rewrites << " localized" << std::endl;
  EXPECT_GE(models.size(), 3u) << "the grouped_mm samples have regions";
  EXPECT_GT(variants, 0);
  EXPECT_GT(stats.rewrites, 0);
  EXPECT_EQ(failures, 0);
}

TEST(StrategyValidator, EveryStrategyMatchesTheUnshardedOp) {
  const Corpus& c = corpus();
  ASSERT_FALSE(c.combos.empty());
  DoubleDefaultDtype f64;
  auto start = std::chrono::steady_clock::now();

  CheckStats stats;
  std::vector<int64_t> per_mesh(c.meshes.size(), 0);
  int64_t strategies = 0, failures = 0, nodes = 0, skipped = 0;
  std::map<std::string, int64_t> failures_by_op;
  std::set<std::string> ops;
  std::map<std::string, int64_t> per_op;  // strategies executed per op
  auto fail = [&](const std::string& op, const std::string& text) {
    ++failures;
    ++failures_by_op[op];
    if (failures <= 40) ADD_FAILURE() << "WRONG: " << text;
  };
  std::vector<std::pair<double, std::string>> slowest;  // (seconds, combo), for tuning
  // APC_VALIDATOR_FILTER=<text>: only the combos whose signature contains <text> (debugging).
  const char* filter_env = std::getenv("APC_VALIDATOR_FILTER");
  const std::string filter = filter_env ? filter_env : "";
  for (const auto& entry : c.combos) {
    // Not a structured binding: clang 14 (the sanitizer build) cannot capture one in a lambda.
    const auto& sig = entry.first;
    const auto& combo = entry.second;
    if (!filter.empty() && sig.find(filter) == std::string::npos) continue;
    auto combo_start = std::chrono::steady_clock::now();
    struct Timer {  // records the combo's time however the iteration ends
      std::chrono::steady_clock::time_point start;
      std::vector<std::pair<double, std::string>>& out;
      std::string what;
      ~Timer() {
        out.push_back(
            {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
             what});
      }
    } timer{
        combo_start, slowest,
        whereText(combo, nullptr, nullptr) + ", strategies per mesh " +
            joinMap(combo.per_mesh, "/", [](const auto& v) { return std::to_string(v.size()); })};
    const ir::Graph& g = combo.model->graph;
    const ir::Node& node = g.node(combo.node);
    nodes += combo.occurrences;
    ops.insert(node.qualifiedOp());
    NodeValidation v =
        validateNode(g, node, c.meshes, combo.per_mesh, fnv1a(sig), /*cap=*/true,
                     whereText(combo, nullptr, nullptr), stats,
                     [&](const DeviceMesh* mesh, const Strategy* s, const std::string& what) {
                       fail(node.qualifiedOp(), whereText(combo, mesh, s) + ": " + what);
                     });
    skipped += v.skipped;
    for (size_t mi = 0; mi < c.meshes.size(); ++mi) per_mesh[mi] += v.executed[mi];
    int64_t n = std::accumulate(v.executed.begin(), v.executed.end(), int64_t{0});
    strategies += n;
    per_op[node.qualifiedOp()] += n;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[strategy validator] samples imported and enumerated in " << c.load_s << " s\n"
            << "[strategy validator] " << nodes << " op nodes with strategies in the executed "
            << "samples, " << c.combos.size() << " distinct (op, shapes, constants) combos, "
            << ops.size() << " ops; " << strategies << " strategies executed (";
  for (size_t mi = 0; mi < c.meshes.size(); ++mi)
    std::cout << (mi ? ", " : "") << c.meshes[mi].toString() << ": " << per_mesh[mi];
  std::cout << "); " << skipped << " skipped by the cap on big combos; " << stats.rank_calls
            << " rank calls, " << stats.rewrites << " with local rewrites; " << secs << " s\n";
  std::cout << "[strategy validator] local rewrites per op: "
            << joinMap(stats.rewrites_by_op, ", ",
                       [](const auto& kv) { return kv.first + " " + std::to_string(kv.second); })
            << "\n";
  std::cout << "[strategy validator] strategies per op: "
            << joinMap(per_op, ", ",
                       [](const auto& kv) { return kv.first + " " + std::to_string(kv.second); })
            << "\n";
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
    // Big dims make more dims shardable, so a few classes stay unexecuted (about 3% today); a
    // drop below 90% means the big models use rules the tiny ones no longer exercise.
    EXPECT_GE(covered * 10, total * 9) << m->name << ": only " << covered << " of " << total
                                       << " strategy classes were executed on tiny samples";
    std::cout << "[strategy validator] stub " << m->name << ": " << ops.size() << " ops, all "
              << (missing.empty() ? "validated" : "NOT validated") << "; " << covered << " of "
              << total << " distinct (mesh, op ranks, strategy) classes executed on tiny samples";
    if (!uncovered.empty()) {  // the most frequent classes whose strategies the big dims add
      std::vector<std::pair<int64_t, std::string>> top;
      for (const auto& [cls, n] : uncovered) top.push_back({-n, cls});
      std::sort(top.begin(), top.end());
      top.resize(std::min<size_t>(top.size(), 4));
      std::cout << " (most not executed: " << joinMap(top, ", ", [](const auto& t) {
        return t.second + " x" + std::to_string(-t.first);
      }) << ")";
    }
    std::cout << "\n";
  }
}

// --- ops no executed sample has, built by hand --------------------------------------------------

/// One hand-built op node (tests/strategy/builder.h) for an op that real models use but no
/// executed sample does (maxvit's einsum, upsampling, the core-ATen BatchNorm of .pt2 exports).
struct OpCase {
  const char* what;
  std::function<void(strategy::testing::Builder&)> build;  // the node under test is built last
};

// Every strategy of each case, on every validator mesh, executed against the unsharded op; the
// node must have a rule (no fallback) and more than the all-Replicate strategy. The shapes include
// dims that split unevenly (3, 5 and 7 over 2 and 4 ranks). The mixture-of-experts ops (topk,
// sort, argsort, gather, scatter_add, index_add, bincount, histc, repeat_interleave, _grouped_mm)
// are here too: no executed sample has them.
TEST(StrategyValidator, HandBuiltOpCasesMatchTheUnshardedOp) {
  using strategy::testing::Builder;
  using strategy::testing::ValueId;
  auto einsum = [](const char* eq, std::vector<std::vector<int64_t>> shapes,
                   std::vector<int64_t> out) {
    return [eq, shapes, out](Builder& b) {
      std::vector<ValueId> xs;
      for (size_t i = 0; i < shapes.size(); ++i)
        xs.push_back(b.input("x" + std::to_string(i), shapes[i]));
      ValueId list = b.listOp("prim::ListConstruct", xs, shapes);
      b.op("aten::einsum", {b.str(eq), list, b.none()}, out);
    };
  };
  // aten::einsum.operands: the import's form of an einsum whose operands each take a placement.
  auto einsumOperands = [](const char* eq, std::vector<std::vector<int64_t>> shapes,
                           std::vector<int64_t> out) {
    return [eq, shapes, out](Builder& b) {
      std::vector<ValueId> in{b.str(eq)};
      for (size_t i = 0; i < shapes.size(); ++i)
        in.push_back(b.input("x" + std::to_string(i), shapes[i]));
      b.op("aten::einsum.operands", in, out);
    };
  };
  auto batchNorm = [](int mode) {  // 0, 1: functional eval, training; 2: no_training
    return [mode](Builder& b) {
      ValueId x = b.input("x", {7, 7, 3, 3});
      ValueId w = b.param("w", {7}), bias = b.param("b", {7});
      ValueId rm = b.buffer("rm", {7}), rv = b.buffer("rv", {7});
      int64_t saved = mode == 1 ? 7 : 0;
      if (mode == 2)
        b.multiOp("aten::_native_batch_norm_legit_no_training",
                  {x, w, bias, rm, rv, b.f(0.1), b.f(1e-5)}, {{7, 7, 3, 3}, {0}, {0}});
      else
        b.multiOp("aten::_native_batch_norm_legit_functional",
                  {x, w, bias, rm, rv, b.b(mode == 1), b.f(0.1), b.f(1e-5)},
                  {{7, 7, 3, 3}, {saved}, {saved}, {7}, {7}});
    };
  };
  // index.Tensor(self, [i0, i1]) with integer indices that broadcast, as Hugging Face decoders
  // build their masks (self [B, S], indices [B, 1, 1, 1] and [1, 1, S, 1]).
  auto indexBroadcast = [](std::vector<int64_t> self, std::vector<std::vector<int64_t>> shapes,
                           std::vector<int64_t> out) {
    return [self, shapes, out](Builder& b) {
      ValueId x = b.input("self", self);
      std::vector<ValueId> xs;
      for (size_t i = 0; i < shapes.size(); ++i)
        xs.push_back(b.input("i" + std::to_string(i), shapes[i], ir::DType::kI64));
      ValueId list = b.listOp("prim::ListConstruct", xs, shapes, ir::DType::kI64);
      b.op("aten::index.Tensor", {x, list}, out);
    };
  };
  // index.Tensor(self, [None.., i0, i1.., None..]): an optional-tensor list, as `x[:, :, idx]`
  // exports (Falcon's attention); `nones_before` Nones, the index tensors, `nones_after` Nones.
  auto indexAfterNones = [](std::vector<int64_t> self, int nones_before,
                            std::vector<std::vector<int64_t>> shapes, int nones_after,
                            std::vector<int64_t> out) {
    return [=](Builder& b) {
      ValueId x = b.input("self", self);
      std::vector<ValueId> items;
      for (int i = 0; i < nones_before; ++i) items.push_back(b.none());
      for (size_t i = 0; i < shapes.size(); ++i)
        items.push_back(b.input("i" + std::to_string(i), shapes[i], ir::DType::kI64));
      for (int i = 0; i < nones_after; ++i) items.push_back(b.none());
      ir::Value list;
      list.type = ir::ValueType::kOther;
      list.debug_name = "indices";
      ValueId l = b.g.addValue(list);
      b.addOp("prim::ListConstruct", items, {l});
      b.op("aten::index.Tensor", {x, l}, out);
    };
  };
  auto floats = [](Builder& b, std::vector<double> v) {
    return b.g.addConstant(ir::ValueType::kFloatList, std::move(v));
  };
  // An op node with outputs of the given shapes and dtypes (values and indices of topk / sort).
  using Out = std::pair<std::vector<int64_t>, ir::DType>;
  auto addNode = [](Builder& b, const std::string& op, std::vector<ValueId> ins,
                    std::vector<Out> outs) {
    std::vector<ValueId> vs;
    for (auto& [shape, dt] : outs)
      vs.push_back(b.tensor("o" + std::to_string(b.g.numValues()), shape, dt, true));
    b.addOp(op, std::move(ins), std::move(vs));
  };
  const ir::DType f32 = ir::DType::kF32, i64 = ir::DType::kI64, i32 = ir::DType::kI32;
  // topk / sort / argsort(x [6,7,5] or [7,6]): values f32 and indices i64 of the output shape.
  auto topk = [&](std::vector<int64_t> in, int64_t k, int64_t dim, std::vector<int64_t> out) {
    return [=](Builder& b) {
      ValueId x = b.input("x", in);
      addNode(b, "aten::topk", {x, b.i(k), b.i(dim), b.b(true), b.b(true)},
              {{out, f32}, {out, i64}});
    };
  };
  const OpCase cases[] = {
      {"einsum bhid,bhjd->bhij (maxvit scores)",
       einsum("bhid,bhjd->bhij", {{3, 4, 5, 7}, {3, 4, 6, 7}}, {3, 4, 5, 6})},
      {"einsum bhij,bhjd->bhid",
       einsum("bhij,bhjd->bhid", {{3, 4, 5, 6}, {3, 4, 6, 7}}, {3, 4, 5, 7})},
      {"einsum ...ij,...kj->...ik",
       einsum("...ij,...kj->...ik", {{2, 5, 4, 7}, {2, 5, 3, 7}}, {2, 5, 4, 3})},
      {"einsum bij,bjk (implicit)", einsum("bij,bjk", {{7, 2, 3}, {7, 3, 4}}, {2, 4})},
      {"einsum bij,bjk->bik, lhs broadcast in b",
       einsum("bij,bjk->bik", {{1, 2, 3}, {7, 3, 4}}, {7, 2, 4})},
      {"einsum bij,bkj->bik, rhs broadcast in j (contracted)",
       einsum("bij,bkj->bik", {{7, 2, 7}, {7, 3, 1}}, {7, 2, 3})},
      {"index.Tensor broadcasting [B,1,1,1], [1,1,S,1] (HF mask)",
       indexBroadcast({7, 5}, {{7, 1, 1, 1}, {1, 1, 5, 1}}, {7, 1, 5, 1})},
      {"index.Tensor broadcasting [B,1,1,1], [1,1,1,S] (HF mask)",
       indexBroadcast({6, 5}, {{6, 1, 1, 1}, {1, 1, 1, 5}}, {6, 1, 1, 5})},
      {"index.Tensor broadcasting [B,1], [1,S] with a trailing dim",
       indexBroadcast({7, 5, 6}, {{7, 1}, {1, 5}}, {7, 5, 6})},
      {"index.Tensor [None, None, idx] (x[:, :, idx])",
       indexAfterNones({6, 5, 7, 3}, 2, {{2}}, 0, {6, 5, 2, 3})},
      {"index.Tensor [None, i0, i1] broadcasting, a trailing dim",
       indexAfterNones({6, 7, 5, 4}, 1, {{3, 1}, {1, 2}}, 0, {6, 3, 2, 4})},
      {"index.Tensor [None, idx, None]", indexAfterNones({6, 4, 5}, 1, {{3}}, 1, {6, 3, 5})},
      {"einsum bij->bji", einsum("bij->bji", {{5, 4, 7}}, {5, 7, 4})},
      {"einsum.operands gsec,gsd->egcd (dispatch)",
       einsumOperands("gsec,gsd->egcd", {{6, 5, 4, 3}, {6, 5, 7}}, {4, 6, 3, 7})},
      {"einsum.operands egcd,edf->egcf (experts)",
       einsumOperands("egcd,edf->egcf", {{4, 6, 3, 7}, {4, 7, 5}}, {4, 6, 3, 5})},
      {"einsum.operands gsec,egcd->gsd (combine)",
       einsumOperands("gsec,egcd->gsd", {{6, 5, 4, 3}, {4, 6, 3, 7}}, {6, 5, 7})},
      {"einsum.operands bij,jk->bik, rhs broadcast-free, lhs size 1 in b",
       einsumOperands("bij,jk->bik", {{1, 4, 6}, {6, 5}}, {1, 4, 5})},
      {"einsum.operands bij,bjk->bik, lhs broadcast in b",
       einsumOperands("bij,bjk->bik", {{1, 2, 3}, {7, 3, 4}}, {7, 2, 4})},
      {"einsum.operands ij,jk,kl->il (three operands)",
       einsumOperands("ij,jk,kl->il", {{6, 4}, {4, 5}, {5, 7}}, {6, 7})},
      {"one_hot [G,S,k] -> [G,S,k,E]",
       [](Builder& b) {
         ValueId idx = b.input("idx", {8, 6, 4}, ir::DType::kI64);
         b.op("aten::one_hot", {idx, b.i(5)}, {8, 6, 4, 5}, ir::DType::kI64);
       }},
      {"einsum bij->b", einsum("bij->b", {{5, 4, 7}}, {5})},
      {"upsample_bilinear2d.vec scales, align_corners",
       [&](Builder& b) {
         ValueId x = b.input("x", {5, 6, 3, 4});
         b.op("aten::upsample_bilinear2d.vec", {x, b.none(), b.b(true), floats(b, {2.0, 1.5})},
              {5, 6, 6, 6});
       }},
      {"upsample_bilinear2d output_size",
       [](Builder& b) {
         ValueId x = b.input("x", {5, 6, 3, 4});
         b.op("aten::upsample_bilinear2d", {x, b.ints({7, 9}), b.b(false), b.none(), b.none()},
              {5, 6, 7, 9});
       }},
      {"upsample_nearest2d.vec scales",
       [&](Builder& b) {
         ValueId x = b.input("x", {5, 6, 3, 4});
         b.op("aten::upsample_nearest2d.vec", {x, b.none(), floats(b, {2.0, 2.0})}, {5, 6, 6, 8});
       }},
      {"upsample_nearest2d output_size",
       [](Builder& b) {
         ValueId x = b.input("x", {5, 6, 3, 4});
         b.op("aten::upsample_nearest2d", {x, b.ints({7, 9}), b.none(), b.none()}, {5, 6, 7, 9});
       }},
      {"_native_batch_norm_legit_functional eval", batchNorm(0)},
      {"_native_batch_norm_legit_functional training", batchNorm(1)},
      {"_native_batch_norm_legit_no_training", batchNorm(2)},
      // Mixture-of-experts routing and expert ops (lib/strategy/routing.cpp).
      {"topk k=3 of the last dim (router)", topk({6, 7, 5}, 3, -1, {6, 7, 3})},
      {"topk k=2 of dim 1", topk({7, 6, 9}, 2, 1, {7, 2, 9})},
      {"sort dim 0 descending",
       [&](Builder& b) {
         ValueId x = b.input("x", {6, 7});
         addNode(b, "aten::sort", {x, b.i(0), b.b(true)}, {{{6, 7}, f32}, {{6, 7}, i64}});
       }},
      {"sort.stable dim -1",
       [&](Builder& b) {
         ValueId x = b.input("x", {7, 5});
         addNode(b, "aten::sort.stable", {x, b.b(true), b.i(-1), b.b(false)},
              {{{7, 5}, f32}, {{7, 5}, i64}});
       }},
      {"argsort dim 1",
       [&](Builder& b) {
         ValueId x = b.input("x", {7, 5, 3});
         addNode(b, "aten::argsort", {x, b.i(1), b.b(false)}, {{{7, 5, 3}, i64}});
       }},
      {"argsort.stable dim 0 descending",
       [&](Builder& b) {
         ValueId x = b.input("x", {5, 7});
         addNode(b, "aten::argsort.stable", {x, b.b(true), b.i(0), b.b(true)}, {{{5, 7}, i64}});
       }},
      {"gather dim 1, index of self's size in the other dims",
       [&](Builder& b) {
         ValueId x = b.input("x", {6, 7, 5});
         ValueId idx = b.input("index", {6, 3, 5}, i64);
         addNode(b, "aten::gather", {x, b.i(1), idx, b.b(false)}, {{{6, 3, 5}, f32}});
       }},
      {"gather dim 1, a smaller index",
       [&](Builder& b) {
         ValueId x = b.input("x", {6, 7});
         ValueId idx = b.input("index", {5, 4}, i64);
         addNode(b, "aten::gather", {x, b.i(1), idx, b.b(false)}, {{{5, 4}, f32}});
       }},
      {"scatter_add dim 0 (token combine)",
       [&](Builder& b) {
         ValueId x = b.input("self", {7, 6});
         ValueId idx = b.input("index", {9, 6}, i64);
         ValueId src = b.input("src", {9, 6});
         addNode(b, "aten::scatter_add", {x, b.i(0), idx, src}, {{{7, 6}, f32}});
       }},
      {"scatter_add dim 1, a smaller index and src",
       [&](Builder& b) {
         ValueId x = b.input("self", {6, 7});
         ValueId idx = b.input("index", {5, 3}, i64);
         ValueId src = b.input("src", {5, 4});
         addNode(b, "aten::scatter_add", {x, b.i(1), idx, src}, {{{6, 7}, f32}});
       }},
      {"index_add dim 0, alpha 2 (token combine)",
       [&](Builder& b) {
         ValueId x = b.input("self", {7, 6});
         ValueId idx = b.input("index", {9}, i64);
         ValueId src = b.input("source", {9, 6});
         addNode(b, "aten::index_add", {x, b.i(0), idx, src, b.f(2.0)}, {{{7, 6}, f32}});
       }},
      {"index_add dim 1",
       [&](Builder& b) {
         ValueId x = b.input("self", {5, 7, 3});
         ValueId idx = b.input("index", {4}, i64);
         ValueId src = b.input("source", {5, 4, 3});
         addNode(b, "aten::index_add", {x, b.i(1), idx, src, b.i(1)}, {{{5, 7, 3}, f32}});
       }},
      {"bincount minlength 8 (tokens per expert)",
       [&](Builder& b) {
         ValueId x = b.input("x", {10}, i64);
         addNode(b, "aten::bincount", {x, b.none(), b.i(8)}, {{{8}, i64}});
       }},
      {"bincount with weights, minlength 6",
       [&](Builder& b) {
         ValueId x = b.input("x", {10}, i64);
         ValueId w = b.input("weights", {10});
         addNode(b, "aten::bincount", {x, w, b.i(6)}, {{{6}, f32}});
       }},
      {"histc bins 8 over [-2, 2]",
       [&](Builder& b) {
         ValueId x = b.input("x", {7, 5});
         addNode(b, "aten::histc", {x, b.i(8), b.f(-2.0), b.f(2.0)}, {{{8}, f32}});
       }},
      {"repeat_interleave.self_int dim 1",
       [&](Builder& b) {
         ValueId x = b.input("x", {5, 6, 3});
         addNode(b, "aten::repeat_interleave.self_int", {x, b.i(2), b.i(1), b.none()},
              {{{5, 12, 3}, f32}});
       }},
      {"repeat_interleave.self_int dim 0 (tokens to top-k slots)",
       [&](Builder& b) {
         ValueId x = b.input("x", {8, 5});
         addNode(b, "aten::repeat_interleave.self_int", {x, b.i(2), b.i(0), b.none()},
                 {{{16, 5}, f32}});
       }},
      {"repeat_interleave.self_int dim 0 with output_size",
       [&](Builder& b) {
         ValueId x = b.input("x", {8, 5});
         addNode(b, "aten::repeat_interleave.self_int", {x, b.i(2), b.i(0), b.i(16)},
                 {{{16, 5}, f32}});
       }},
      {"repeat_interleave.self_int flattened",
       [&](Builder& b) {
         ValueId x = b.input("x", {5, 3});
         addNode(b, "aten::repeat_interleave.self_int", {x, b.i(2), b.none(), b.none()},
              {{{30}, f32}});
       }},
      {"repeat_interleave.self_Tensor dim 1",
       [&](Builder& b) {
         ValueId x = b.input("x", {5, 6, 3});
         ValueId rep = b.input("repeats", {6}, i64);
         addNode(b, "aten::repeat_interleave.self_Tensor", {x, rep, b.i(1), b.none()},
              {{{5, 11, 3}, f32}});
       }},
      {"_grouped_mm 2D x 3D with offs (experts)",
       [&](Builder& b) {
         ValueId x = b.input("x", {10, 32});
         ValueId w = b.param("w", {3, 32, 32});
         ValueId offs = b.input("offs", {3}, i32);
         addNode(b, "aten::_grouped_mm", {x, w, offs, b.none(), b.none()}, {{{10, 32}, f32}});
       }},
      {"_grouped_mm 3D x 3D",
       [&](Builder& b) {
         ValueId x = b.input("x", {8, 5, 32});
         ValueId w = b.param("w", {8, 32, 32});
         addNode(b, "aten::_grouped_mm", {x, w, b.none(), b.none(), b.none()}, {{{8, 5, 32}, f32}});
       }},
  };
  std::vector<DeviceMesh> meshes;
  for (const auto& shape : kMeshShapes) meshes.push_back(*DeviceMesh::create(shape));
  DoubleDefaultDtype f64;
  CheckStats stats;
  int64_t total = 0;
  for (const OpCase& oc : cases) {
    Builder b;
    oc.build(b);
    const ir::Node& node = b.g.node(b.last());
    std::vector<std::vector<Strategy>> per_mesh;
    for (const DeviceMesh& mesh : meshes)
      for (const strategy::NodeStrategies& ns : strategy::enumerate(b.g, mesh))
        if (ns.node == node.id) {
          EXPECT_FALSE(ns.fallback) << oc.what << ": no rule";
          EXPECT_GT(ns.strategies.size(), 1u) << oc.what << " on " << mesh.toString();
          per_mesh.push_back(ns.strategies.vector());
        }
    ASSERT_EQ(per_mesh.size(), meshes.size()) << oc.what;
    int failures = 0;
    NodeValidation v = validateNode(
        b.g, node, meshes, per_mesh, fnv1a(oc.what), /*cap=*/false, oc.what, stats,
        [&](const DeviceMesh* mesh, const Strategy* s, const std::string& what) {
          if (failures++ < 10)
            ADD_FAILURE() << "WRONG: " << oc.what << (mesh ? ", mesh " + mesh->toString() : "")
                          << (s ? ", strategy " + s->toString() : "") << ": " << what;
        });
    int64_t n = std::accumulate(v.executed.begin(), v.executed.end(), int64_t{0});
    total += n;
    std::cout << "[strategy validator] " << oc.what << ": " << n << " strategies on "
              << meshes.size() << " meshes, " << failures << " wrong\n";
  }
  std::cout << "[strategy validator] hand-built op cases: " << total << " strategies executed\n";
}

// --- the validator's own check: it must catch wrong rules ----------------------------------------

using strategy::DimStrategy;
using strategy::Placement;
using strategy::Rule;
using strategy::RuleContext;

/// A single-dim strategy of the node's arity with the given placements (others nullopt).
DimStrategy dimStrategy(const RuleContext& c, std::vector<std::pair<size_t, Placement>> ins,
                        std::vector<std::pair<size_t, Placement>> outs) {
  DimStrategy s;
  s.inputs.resize(c.numInputs());
  s.outputs.resize(c.numOutputs());
  for (auto& [i, p] : ins) s.inputs.at(i) = p;
  for (auto& [i, p] : outs) s.outputs.at(i) = p;
  return s;
}

/// A deliberately wrong rule: the real rule of the op, changed by `change`.
struct Mutation {
  const char* op;  // qualified op of gpt2_tiny nodes
  const char* what;
  std::function<void(const RuleContext&, std::vector<DimStrategy>&)> change;
};

// Each mutation below breaks one rule the way real rule bugs look (a nonlinear op passing
// Partial through, a reduction dim sharded, a contraction's Partial output called Replicate, a
// dim mapping off by one, adding a replicated value to a partial one); the validator must report
// every one of them on gpt2_tiny, on mesh [2,2].
TEST(StrategyValidator, CatchesDeliberatelyWrongRules) {
  const Corpus& c = corpus();
  const LoadedModel* gpt2 = nullptr;
  for (const auto& m : c.models)
    if (m->name == "gpt2_tiny" && m->error.empty()) gpt2 = m.get();
  ASSERT_NE(gpt2, nullptr);
  const ir::Graph& g = gpt2->graph;
  const Mutation mutations[] = {
      {"aten::gelu", "P passes through gelu",
       [](const RuleContext& c, std::vector<DimStrategy>& v) {
         v.push_back(dimStrategy(c, {{0, Placement::partial()}}, {{0, Placement::partial()}}));
       }},
      {"aten::scaled_dot_product_attention",
       "attention's head dim (contracted in q k^T) is sharded",
       [](const RuleContext& c, std::vector<DimStrategy>& v) {
         int d = static_cast<int>(c.inputRank(0)) - 1;
         v.push_back(dimStrategy(
             c, {{0, Placement::shard(d)}, {1, Placement::shard(d)}, {2, Placement::shard(d)}},
             {{0, Placement::shard(d)}}));
       }},
      {"aten::linear", "a contraction's Partial output is called Replicate",
       [](const RuleContext&, std::vector<DimStrategy>& v) {
         for (DimStrategy& s : v)
           for (auto& o : s.outputs)
             if (o && o->isPartial()) o = Placement::replicate();
       }},
      {"aten::add.Tensor", "P + R gives P",
       [](const RuleContext& c, std::vector<DimStrategy>& v) {
         v.push_back(dimStrategy(c, {{0, Placement::partial()}, {1, Placement::replicate()}},
                                 {{0, Placement::partial()}}));
       }},
      {"aten::transpose.int", "transpose keeps the shard dim",
       [](const RuleContext& c, std::vector<DimStrategy>& v) {
         for (int d = 0; d < c.inputRank(0); ++d)
           v.push_back(dimStrategy(c, {{0, Placement::shard(d)}}, {{0, Placement::shard(d)}}));
       }},
      {"aten::view", "a view maps the last input dim to the last output dim",
       [](const RuleContext& c, std::vector<DimStrategy>& v) {
         int in = static_cast<int>(c.inputRank(0)) - 1, out = static_cast<int>(c.outputRank(0)) - 1;
         v.push_back(dimStrategy(c, {{0, Placement::shard(in)}}, {{0, Placement::shard(out)}}));
       }},
      {"aten::embedding", "a weight sharded on the embedding dim gives Partial",
       [](const RuleContext& c, std::vector<DimStrategy>& v) {
         v.push_back(dimStrategy(c, {{0, Placement::shard(1)}, {1, Placement::replicate()}},
                                 {{0, Placement::partial()}}));
       }},
  };
  std::vector<DeviceMesh> meshes = {*DeviceMesh::create({2, 2})};
  DoubleDefaultDtype f64;
  CheckStats stats;
  for (const Mutation& mu : mutations) {
    // The node of this op with the fewest elements, and its real rule.
    const ir::Node* node = nullptr;
    for (const ir::Node& n : g.nodes())
      if (n.kind == ir::NodeKind::kOp && n.qualifiedOp() == mu.op &&
          (!node ||
           g.value(n.outputs[0]).tensor->numel() < g.value(node->outputs[0]).tensor->numel()))
        node = &n;
    ASSERT_NE(node, nullptr) << mu.op;
    const Rule* real = strategy::defaultRegistry().find(*node);
    ASSERT_NE(real, nullptr) << mu.op;
    strategy::Registry registry;
    strategy::registerAllRules(registry);
    Rule real_rule = *real;
    auto change = mu.change;
    registry.add(mu.op, [real_rule, change](const RuleContext& ctx) {
      std::vector<DimStrategy> v = real_rule(ctx);
      change(ctx, v);
      return v;
    });
    std::vector<strategy::NodeStrategies> mutated = strategy::enumerate(g, meshes[0], registry);
    std::vector<strategy::NodeStrategies> original = strategy::enumerate(g, meshes[0]);
    std::set<std::string> original_keys;
    for (const auto& ns : original)
      if (ns.node == node->id)
        for (const Strategy& s : ns.strategies) original_keys.insert(strategyKey(s));
    std::vector<std::vector<Strategy>> added(1);
    for (const auto& ns : mutated)
      if (ns.node == node->id)
        for (const Strategy& s : ns.strategies)
          if (!original_keys.count(strategyKey(s))) added[0].push_back(s);
    ASSERT_FALSE(added[0].empty()) << mu.what << ": the mutation added no strategy";
    int caught = 0;
    std::string first;
    validateNode(g, *node, meshes, added, fnv1a(mu.what), /*cap=*/false, mu.op, stats,
                 [&](const DeviceMesh*, const Strategy* s, const std::string& what) {
                   if (!s) ADD_FAILURE() << mu.op << " could not run: " << what;
                   if (caught++ == 0) first = (s ? s->toString() : "") + ": " + what;
                 });
    EXPECT_EQ(caught, static_cast<int>(added[0].size()))
        << "mutation \"" << mu.what << "\": the validator missed "
        << added[0].size() - static_cast<size_t>(caught) << " of " << added[0].size()
        << " wrong strategies";
    std::cout << "[strategy validator] caught \"" << mu.what << "\" (" << caught << " of "
              << added[0].size() << "), e.g. " << first.substr(0, 160) << "\n";
  }
}

}  // namespace
}  // namespace apc::validator
