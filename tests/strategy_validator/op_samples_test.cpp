//===- tests/strategy_validator/op_samples_test.cpp - Every op on its own samples ===//
//
// The strategy validator on each registered op's sample invocations (OpInfo::samples, as DTensor's
// OpInfo sample_inputs), not only on the ops that occur in the sample models: for every op of
// defaultRegistry() with a rule and samples, each sample becomes a one-op graph (the sample's
// arguments, the schema's defaults for the rest, the outputs' metas from running the op on
// LibTorch), its strategies are enumerated on meshes [2], [3] and [2,2], and every strategy runs
// on simulated ranks (node_check.h) and must reassemble to the unsharded op. The coverage (ops with
// a rule that have samples) is printed with the ops that lack them, and held to a floor. The
// in-place variants run on their op's samples where torch has them and self can hold the result.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <set>

#include <ATen/core/ivalue.h>
#include <c10/core/DefaultDtype.h>

#include "apc/ir/torch_dtype.h"
#include "apc/strategy/strategy.h"
#include "node_check.h"

namespace apc::validator {
namespace op_samples {

using mesh::DeviceMesh;
using strategy::OpSample;
using strategy::SampleArg;

/// Meshes every sample runs on: even and uneven pieces (5 over 2 is 3, 2; over 3, 2, 2, 1) and a
/// two-dim mesh with nested cuts and mixed Partial/Shard placements.
const std::vector<std::vector<int64_t>> kSampleMeshes = {{2}, {3}, {2, 2}};

/// The op and overload a sample of registry entry `key` calls: "aten::div.Tensor" names both;
/// "aten::add" takes the sample's overload.
std::pair<std::string, std::string> sampleOp(const std::string& key, const OpSample& s) {
  size_t colons = key.find("::");
  size_t dot = key.find('.', colons == std::string::npos ? 0 : colons);
  if (dot == std::string::npos) return {key, s.overload};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

/// The IR form of a schema argument's default value; nullopt when there is none we can express.
std::optional<SampleArg> defaultArg(const c10::Argument& a) {
  if (!a.default_value()) return std::nullopt;
  const c10::IValue& v = *a.default_value();
  if (v.isNone()) return SampleArg::none();
  if (v.isBool()) return SampleArg::of(v.toBool());
  if (v.isInt()) return SampleArg::of(v.toInt());
  if (v.isDouble()) return SampleArg::of(v.toDouble());
  if (v.isString()) return SampleArg::of(v.toStringRef().c_str());
  if (v.isIntList()) return SampleArg::of(v.toIntVector());
  return std::nullopt;
}

/// A one-op graph: an input node per tensor argument, constants for the others, and the op node
/// with `outputs` (placeholders of type None when empty: `num_outputs` of them).
struct SampleGraph {
  ir::Graph g;
  ir::NodeId node;
};

SampleGraph buildSampleGraph(const std::string& op, const std::string& overload,
                             const std::vector<SampleArg>& args, std::vector<ir::Value> outputs,
                             size_t num_outputs) {
  SampleGraph sg;
  ir::Node n;
  n.op = op;
  n.overload = overload;
  for (size_t i = 0; i < args.size(); ++i) {
    const SampleArg& a = args[i];
    if (a.type != ir::ValueType::kTensor && a.type != ir::ValueType::kTensorList) {
      n.inputs.push_back(sg.g.addConstant(a.type, a.constant));
      continue;
    }
    ir::Value v;
    v.type = a.type;
    v.debug_name = "in" + std::to_string(i);
    if (a.type == ir::ValueType::kTensor)
      v.tensor = a.tensors.at(0);
    else
      v.elements = a.tensors;
    ir::ValueId id = sg.g.addValue(std::move(v));
    ir::Node in;
    in.kind = ir::NodeKind::kInput;
    in.op = "input";
    in.name = "in" + std::to_string(i);
    in.outputs = {id};
    sg.g.addNode(std::move(in));
    n.inputs.push_back(id);
  }
  if (outputs.empty()) outputs.resize(num_outputs);  // type None
  for (size_t j = 0; j < outputs.size(); ++j) {
    outputs[j].debug_name = "out" + std::to_string(j);
    n.outputs.push_back(sg.g.addValue(std::move(outputs[j])));
  }
  sg.node = sg.g.addNode(std::move(n));
  return sg;
}

/// The IR value of a reference output. Floating outputs (widened to f64 for the run) take the
/// dtype of the sample's first floating tensor, f32 when it has none.
ir::Value outputValue(const c10::IValue& v, ir::DType floating) {
  auto meta = [&](const at::Tensor& t) {
    ir::DType d = apc::dtypeOf(t.scalar_type());
    if (at::isFloatingType(t.scalar_type())) d = floating;
    return ir::TensorMeta{ir::makeShape({t.sizes().begin(), t.sizes().end()}), d, false};
  };
  ir::Value out;
  if (v.isTensor()) {
    out.type = ir::ValueType::kTensor;
    out.tensor = meta(v.toTensor());
  } else if (v.isTensorList()) {
    out.type = ir::ValueType::kTensorList;
    for (const at::Tensor& t : v.toTensorVector()) out.elements.push_back(meta(t));
  } else if (v.isInt()) {
    out.type = ir::ValueType::kInt;
  } else if (v.isDouble()) {
    out.type = ir::ValueType::kFloat;
  } else if (v.isBool()) {
    out.type = ir::ValueType::kBool;
  } else {
    out.type = ir::ValueType::kNone;
  }
  return out;
}

struct SampleResult {
  std::vector<std::string> failures;
  int64_t strategies = 0;  // executed, over every mesh
  int64_t sharded = 0;     // of them, not all-Replicate
  bool skipped_random = false;
  bool skipped_form = false;  // an in-place variant torch lacks, or a sample it cannot take
};

/// Runs sample `s` of registry entry `key`: builds its graph and checks every strategy on every
/// mesh of kSampleMeshes.
SampleResult runSample(const std::string& key, const OpSample& s, uint64_t seed,
                       bool in_place = false) {
  SampleResult res;
  auto fail = [&](const std::string& what) { res.failures.push_back(what); };
  auto [op, overload] = sampleOp(key, s);
  ir::Node probe;
  probe.op = op;
  probe.overload = overload;
  Expected<NodeOp> kernel = NodeOp::resolve(probe);
  if (!kernel.ok() && in_place) {
    res.skipped_form = true;
    return res;
  }
  if (!kernel.ok()) {
    fail("resolving " + op + "." + overload + ": " + kernel.error().message());
    return res;
  }
  const c10::FunctionSchema* schema = kernel->schema();
  if (!schema) {
    fail(op + "." + overload + " has no schema");
    return res;
  }
  std::vector<SampleArg> args = s.args;
  if (args.size() > schema->arguments().size()) {
    fail("more arguments than " + schema->name() + "'s schema");
    return res;
  }
  for (size_t i = args.size(); i < schema->arguments().size(); ++i) {
    std::optional<SampleArg> d = defaultArg(schema->arguments()[i]);
    if (!d) {
      fail("argument " + std::to_string(i) + " (" + schema->arguments()[i].name() +
           ") has no sample and no default");
      return res;
    }
    args.push_back(*d);
  }
  ir::DType floating = ir::DType::kF32;
  for (const SampleArg& a : args)
    if (!a.tensors.empty() && ir::isFloating(a.tensors.front().dtype)) {
      floating = a.tensors.front().dtype;
      break;
    }

  // The outputs' metas: run the op once on a graph with placeholder outputs.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  SampleGraph probe_graph = buildSampleGraph(op, overload, args, {}, schema->returns().size());
  const ir::Node& probe_node = probe_graph.g.node(probe_graph.node);
  Expected<std::vector<c10::IValue>> probe_in =
      makeFullInputs(probe_graph.g, probe_node, *kernel, gen);
  if (!probe_in.ok()) {
    fail("inputs: " + probe_in.error().message());
    return res;
  }
  Expected<std::vector<c10::IValue>> probe_out = runNode(probe_node, *kernel, *probe_in);
  if (!probe_out.ok() && in_place) {  // self cannot hold the result (a broadcast, a cast)
    res.skipped_form = true;
    return res;
  }
  if (!probe_out.ok()) {
    fail("running the op: " + probe_out.error().message());
    return res;
  }
  std::vector<ir::Value> outputs;
  for (const c10::IValue& v : *probe_out) outputs.push_back(outputValue(v, floating));
  if (in_place && (outputs.empty() || !outputs[0].tensor || args.at(0).tensors.empty() ||
                   !(*outputs[0].tensor == args[0].tensors[0]))) {
    res.skipped_form = true;
    return res;
  }

  SampleGraph sg = buildSampleGraph(op, overload, args, std::move(outputs), 0);
  const ir::Node& node = sg.g.node(sg.node);
  if (strategy::defaultRegistry().drawsRandomNumbers(sg.g, node)) {
    res.skipped_random = true;
    return res;
  }
  Expected<std::vector<c10::IValue>> full = makeFullInputs(sg.g, node, *kernel, gen);
  if (!full.ok()) {
    fail("inputs: " + full.error().message());
    return res;
  }
  Expected<std::vector<c10::IValue>> ref = runNode(node, *kernel, *full);
  if (!ref.ok()) {
    fail("reference: " + ref.error().message());
    return res;
  }
  if (auto bad = checkReferenceShapes(sg.g, node, *ref)) fail("reference shapes: " + *bad);
  for (const std::vector<int64_t>& shape : kSampleMeshes) {
    DeviceMesh mesh = *DeviceMesh::create(shape);
    strategy::EnumerateOptions eo;
    eo.use_cache = false;
    std::vector<strategy::NodeStrategies> all =
        strategy::enumerate(sg.g, mesh, strategy::defaultRegistry(), eo);
    const strategy::NodeStrategies* ns = nullptr;
    for (const auto& x : all)
      if (x.node == sg.node) ns = &x;
    if (!ns) {
      fail("no strategies on mesh " + mesh.toString());
      continue;
    }
    if (ns->fallback) {
      fail("the rule declined the sample (Replicate-only fallback) on mesh " + mesh.toString());
      continue;
    }
    for (const strategy::Strategy& st : ns->strategies) {
      std::string where = "mesh " + mesh.toString() + ", " + st.toString() + ": ";
      if (auto bad = checkStrategyForm(sg.g, node, st, mesh)) {
        fail(where + *bad);
        continue;
      }
      CheckStats stats;
      if (auto bad = checkStrategy(sg.g, node, *kernel, st, mesh, *full, *ref, gen, stats))
        fail(where + *bad);
      ++res.strategies;
      bool replicated = true;
      for (const auto& t : st.inputs)
        if (t)
          for (const mesh::Placement& p : *t) replicated = replicated && p.isReplicate();
      for (const auto& t : st.outputs)
        if (t)
          for (const mesh::Placement& p : *t) replicated = replicated && p.isReplicate();
      if (!replicated) ++res.sharded;
    }
  }
  return res;
}

std::string sampleText(const OpSample& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.args.size(); ++i) {
    const SampleArg& a = s.args[i];
    t += i ? ", " : "";
    if (a.type == ir::ValueType::kTensor) {
      t += ir::toString(a.tensors.at(0));
    } else if (a.type == ir::ValueType::kTensorList) {
      t += "[";
      for (size_t e = 0; e < a.tensors.size(); ++e)
        t += (e ? ", " : "") + ir::toString(a.tensors[e]);
      t += "]";
    } else {
      t += ir::toString(a.constant);
    }
  }
  return t + ")";
}

/// Out-of-place ops with a rule that must have samples; in-place variants (registered from them by
/// registerInPlaceVariants, with the same rule behind input 0's placement) are counted apart.
bool isInPlaceVariant(const std::string& key) {
  size_t dot = key.find('.', key.find("::"));
  std::string base = key.substr(0, dot);
  return !base.empty() && base.back() == '_' && base.compare(0, 6, "aten::") == 0;
}

/// Rules that give only the all-Replicate strategy, by design: factories without tensor inputs
/// (each rank makes the whole output) and std/var over every element (neither linear nor
/// max-like, so no Partial).
const std::set<std::string> kReplicateOnly = {
    "aten::arange",        "aten::empty", "aten::full", "aten::ones",
    "aten::scalar_tensor", "aten::zeros", "aten::std",  "aten::var"};

/// Ops with a rule and no samples, each for a reason; any other op with a rule must have samples
/// (adding an op touches the registry and its tests).
const std::set<std::string> kWithoutSamples = {
    // Tensor repeats whose sum the output's size fixes (node_check's shapedInput reads it from the
    // IR): the output meta would have to come before the run that computes it.
    "aten::repeat_interleave.Tensor", "aten::repeat_interleave.self_Tensor",
    // Structural prim ops without a schema (the runtime's hand-written kernels).
    "prim::ListConstruct", "prim::ListUnpack", "prim::NumToTensor"};

/// The floor: at least this many out-of-place ops with a rule have samples (233 of 241 when
/// written).
constexpr size_t kMinOpsWithSamples = 233;

TEST(OpSamples, EveryStrategyOfEverySampleMatchesTheUnshardedOp) {
  auto start = std::chrono::steady_clock::now();
  caffe2::TypeMeta saved = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  const strategy::Registry& reg = strategy::defaultRegistry();
  std::vector<std::string> with_rule, with_samples, without, in_place;
  int64_t samples = 0, strategies = 0, sharded = 0;
  uint64_t seed = 1;
  for (const std::string& key : reg.ops()) {
    ir::Node probe;
    size_t dot = key.find('.', key.find("::"));
    probe.op = key.substr(0, dot);
    probe.overload = dot == std::string::npos ? "" : key.substr(dot + 1);
    const strategy::OpInfo* info = reg.findEntry(probe);
    if (!info || !info->rule) continue;
    if (isInPlaceVariant(key)) {
      in_place.push_back(key);
      continue;
    }
    with_rule.push_back(key);
    if (!info->samples) {
      without.push_back(key);
      EXPECT_TRUE(kWithoutSamples.count(key)) << key << " has a rule but no samples";
      continue;
    }
    std::vector<OpSample> list = info->samples();
    EXPECT_FALSE(list.empty()) << key << ": a samples function that returns none";
    with_samples.push_back(key);
    int64_t op_sharded = 0;
    for (const OpSample& s : list) {
      ++samples;
      SampleResult r = runSample(key, s, seed++);
      for (const std::string& f : r.failures) {
        ADD_FAILURE() << key << " on sample " << sampleText(s) << ": " << f;
      }
      strategies += r.strategies;
      sharded += r.sharded;
      op_sharded += r.sharded + (r.skipped_random ? 1 : 0);
    }
    // A sample that only ever runs all-Replicate checks nothing about the rule (except where the
    // rule is Replicate-only by design).
    if (!kReplicateOnly.count(key)) {
      EXPECT_GT(op_sharded, 0) << key << ": no sample gave a sharded strategy";
    }
  }
  c10::set_default_dtype(saved);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[op samples] " << with_samples.size() << " of " << with_rule.size()
            << " out-of-place ops with a rule have samples (" << samples << " samples, "
            << strategies << " strategies executed, " << sharded << " sharded) in " << seconds
            << " s; " << in_place.size() << " in-place variants share their op's rule\n";
  std::cout << "[op samples] without samples (" << without.size() << "):";
  for (const std::string& k : without) std::cout << " " << k;
  std::cout << "\n";
  EXPECT_GE(with_samples.size(), kMinOpsWithSamples) << "op sample coverage fell below the floor";
  EXPECT_GT(sharded, 0);
}

/// The key of the out-of-place op an in-place variant was registered from ("aten::add_.Tensor" ->
/// "aten::add.Tensor").
std::string outOfPlaceKey(const std::string& key) {
  size_t dot = key.find('.', key.find("::"));
  std::string base = key.substr(0, dot);
  base.pop_back();
  return base + (dot == std::string::npos ? "" : key.substr(dot));
}

// The in-place variants (registerInPlaceVariants: the out-of-place rule with output 0 laid out as
// input 0) on their op's samples, where torch has the variant and self can hold the result.
TEST(OpSamples, InPlaceVariantsMatchOnTheirOpsSamples) {
  caffe2::TypeMeta saved = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  const strategy::Registry& reg = strategy::defaultRegistry();
  size_t variants = 0, checked = 0;
  int64_t strategies = 0;
  uint64_t seed = 100000;
  for (const std::string& key : reg.ops()) {
    if (!isInPlaceVariant(key)) continue;
    auto entryOf = [&](const std::string& k) {
      ir::Node n;
      size_t dot = k.find('.', k.find("::"));
      n.op = k.substr(0, dot);
      n.overload = dot == std::string::npos ? "" : k.substr(dot + 1);
      return reg.findEntry(n);
    };
    const strategy::OpInfo* info = entryOf(key);
    const strategy::OpInfo* base = entryOf(outOfPlaceKey(key));
    if (!info || !info->rule || !base || !base->samples) continue;
    ++variants;
    bool ran = false;
    for (const OpSample& s : base->samples()) {
      SampleResult r = runSample(key, s, seed++, /*in_place=*/true);
      for (const std::string& f : r.failures) {
        ADD_FAILURE() << key << " on sample " << sampleText(s) << ": " << f;
      }
      strategies += r.strategies;
      ran = ran || r.strategies > 0;
    }
    if (ran) ++checked;
  }
  c10::set_default_dtype(saved);
  std::cout << "[op samples] in place: " << checked << " of " << variants
            << " in-place variants of ops with samples checked (" << strategies
            << " strategies executed); the others do not exist in torch or take none of the "
               "samples in place\n";
  EXPECT_GE(checked, 88u) << "in-place sample coverage fell below the floor (88 when written)";
}

}  // namespace op_samples
}  // namespace apc::validator
