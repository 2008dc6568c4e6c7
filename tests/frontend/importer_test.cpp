//===- tests/frontend/importer_test.cpp - TorchScript importer -------------===//
//
// Differential checks of the importer against LibTorch itself and against the facts the sample
// generator recorded from Python (sample_models/out/manifest.json): output shapes equal what the
// module's own forward returns, parameter names and shapes equal named_parameters(), parameter
// totals match, and imports are deterministic.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "apc/ir/torch_dtype.h"

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>
#include <nlohmann/json.hpp>

#include "../common/samples.h"
#include "apc/frontend/model.h"
#include "apc/frontend/script_module.h"
#include "apc/frontend/torchscript.h"
#include "apc/ir/printer.h"
#include "apc/ir/proto_io.h"
#include "apc/runtime/output_leaves.h"

namespace apc::frontend {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kSamples = apc::testing::samplesDir();

using apc::testing::manifest;

std::vector<InputSpec> inputsOf(const json& sample) {
  std::vector<InputSpec> out;
  for (const auto& i : sample["inputs"]) {
    InputSpec s;
    s.name = i["name"];
    s.dtype = *ir::parseDType(i["dtype"].get<std::string>());
    s.shape = ir::makeShape(i["shape"].get<std::vector<int64_t>>());
    out.push_back(s);
  }
  return out;
}

/// The samples the importer must accept (error-case samples are excluded).
std::vector<const json*> samples() {
  std::vector<const json*> out;
  if (manifest().contains("samples"))
    for (const auto& s : manifest()["samples"])
      if (s.value("importable", true)) out.push_back(&s);
  return out;
}

Expected<ir::Graph> importSample(const json& s) {
  ImportOptions o;
  o.inputs = inputsOf(s);
  return importTorchScript((kSamples / s["file"].get<std::string>()).string(), o);
}

// The memoized meta execution (ImportOptions::memoize_meta) gives the graph of the plain one on
// every sample, and with a symbolic batch where the sample has one.
TEST(Importer, MemoizedMetaExecutionGivesTheSameGraph) {
  int compared = 0;
  for (const json* sp : samples()) {
    const json& s = *sp;
    SCOPED_TRACE(s["name"].get<std::string>());
    std::vector<std::vector<InputSpec>> variants = {inputsOf(s)};
    if (s["name"] == "llama_tiny" || s["name"] == "gpt2_tiny") {
      std::vector<InputSpec> symbolic = inputsOf(s);
      symbolic.at(0).shape.at(0) = ir::Dim::symbolic("B", symbolic[0].shape[0].size);
      variants.push_back(symbolic);
    }
    for (const auto& inputs : variants) {
      ImportOptions memo, plain;
      memo.inputs = plain.inputs = inputs;
      plain.memoize_meta = false;
      const std::string path = (kSamples / s["file"].get<std::string>()).string();
      auto a = importTorchScript(path, memo);
      auto b = importTorchScript(path, plain);
      ASSERT_EQ(a.ok(), b.ok());
      if (!a.ok()) {
        EXPECT_EQ(a.error().message(), b.error().message());
        continue;
      }
      EXPECT_EQ(ir::serializeGraph(*a), ir::serializeGraph(*b));
      ++compared;
    }
  }
  EXPECT_GE(compared, 10);
}

// importModel's last pass: an einsum whose Tensor[] is a ListConstruct of tensors read by it alone
// takes the operands as inputs (aten::einsum.operands) and the list node is gone; the graph is
// otherwise the importer's.
TEST(Importer, EinsumTakesItsOperandsAsInputs) {
  const std::string path = (kSamples / "einsum_upsample.pt").string();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "run sample_models/generate.py";
  auto raw = importTorchScript(path);
  auto g = importModel(path);
  ASSERT_TRUE(raw.ok() && g.ok());
  ASSERT_TRUE(g->verify().ok()) << g->verify().error().message();
  size_t einsums = 0;
  for (const ir::Node& n : raw->nodes())
    if (n.op == "aten::einsum") {
      ++einsums;
      EXPECT_EQ(raw->node(raw->value(n.inputs.at(1)).producer).op, "prim::ListConstruct");
    }
  ASSERT_GT(einsums, 0u);
  size_t rewritten = 0;
  for (const ir::Node& n : g->nodes()) {
    if (n.op != "aten::einsum") continue;
    EXPECT_EQ(n.overload, ir::kEinsumOperandsOverload);
    for (size_t i = 1; i < n.inputs.size(); ++i) EXPECT_TRUE(g->value(n.inputs[i]).isTensor());
    ++rewritten;
  }
  EXPECT_EQ(rewritten, einsums);
  EXPECT_EQ(g->numNodes(), raw->numNodes() - einsums);
}

TEST(Importer, ManifestIsPresent) {
  ASSERT_FALSE(samples().empty()) << "run scripts/setup.sh to generate sample_models/out";
  std::set<std::string> names;
  for (const json* s : samples()) names.insert((*s)["name"]);
  for (const char* required : {"toy_block", "mlp_stack", "gpt2_tiny", "gpt2_small", "llama_tiny",
                               "llama_small", "llama3_8b", "cnn_small", "multi_output"})
    EXPECT_TRUE(names.count(required)) << required;
}

TEST(Importer, ParametersMatchNamedParameters) {
  for (const json* sp : samples()) {
    const json& s = *sp;
    SCOPED_TRACE(s["name"].get<std::string>());
    auto g = importSample(s);
    ASSERT_TRUE(g.ok()) << g.error().message();
    std::vector<ir::NodeId> params = g->nodesOfKind(ir::NodeKind::kParameter);
    ASSERT_EQ(params.size(), s["parameters"].size());
    for (size_t i = 0; i < params.size(); ++i) {
      const ir::Node& n = g->node(params[i]);
      EXPECT_EQ(n.name, s["parameters"][i]["name"]);
      EXPECT_EQ(ir::hintSizes(g->value(n.outputs[0]).tensor->shape),
                s["parameters"][i]["shape"].get<std::vector<int64_t>>())
          << n.name;
      EXPECT_TRUE(g->value(n.outputs[0]).tensor->requires_grad) << n.name;
    }
    ir::GraphStats st = ir::computeStats(*g);
    EXPECT_EQ(st.total_params, s["param_count"].get<int64_t>());
    EXPECT_EQ(st.param_bytes, s["param_bytes"].get<int64_t>());
    // Buffers that the forward reads are all named buffers of the module.
    std::set<std::string> buffers;
    for (const auto& b : s["buffers"]) buffers.insert(b["name"]);
    for (ir::NodeId b : g->nodesOfKind(ir::NodeKind::kBuffer)) {
      const std::string& name = g->node(b).name;
      if (name.rfind("__constant.", 0) == 0) continue;
      EXPECT_TRUE(buffers.count(name)) << name;
    }
  }
}

TEST(Importer, Llama3_8bHasExactParameterCount) {
  auto t0 = std::chrono::steady_clock::now();
  auto g = importTorchScript((kSamples / "llama3_8b.pt").string(),
                             {{InputSpec{"tokens", ir::DType::kI64, ir::makeShape({8, 128})}}});
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(g.ok()) << g.error().message();
  EXPECT_EQ(ir::computeStats(*g).total_params, 8030261248LL);
  std::cout << "[ info ] llama3_8b import: " << s << " s, " << g->numNodes() << " nodes\n";
  auto leaves = g->outputs().leaves();
  ASSERT_EQ(leaves.size(), 1u);
  EXPECT_EQ(ir::hintSizes(g->value(leaves[0]).tensor->shape),
            (std::vector<int64_t>{8, 128, 128256}));
}

/// Random inputs for a forward run: floats normal, integers in [0, 2) (valid indices and targets).
std::vector<c10::IValue> randomInputs(const std::vector<InputSpec>& specs) {
  std::vector<c10::IValue> out;
  for (const InputSpec& s : specs) {
    auto sizes = ir::hintSizes(s.shape);
    if (ir::isFloating(s.dtype))
      out.emplace_back(torch::randn(sizes).to(apc::scalarTypeOf(s.dtype)));
    else
      out.emplace_back(torch::randint(0, 2, sizes, torch::kLong));
  }
  return out;
}

TEST(Importer, OutputShapesEqualLibTorchForward) {
  int checked = 0;
  for (const json* sp : samples()) {
    const json& s = *sp;
    if (!s.value("run_forward", false)) continue;
    SCOPED_TRACE(s["name"].get<std::string>());
    auto specs = inputsOf(s);
    auto g = importSample(s);
    ASSERT_TRUE(g.ok()) << g.error().message();
    torch::jit::Module m = torch::jit::load((kSamples / s["file"].get<std::string>()).string());
    m.eval();
    torch::NoGradGuard no_grad;
    c10::IValue result = m.forward(randomInputs(specs));
    std::vector<at::Tensor> expected = runtime::outputLeaves(result);
    auto leaves = g->outputs().leaves();
    ASSERT_EQ(leaves.size(), expected.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      const ir::Value& v = g->value(leaves[i]);
      ASSERT_TRUE(v.tensor.has_value());
      EXPECT_EQ(ir::hintSizes(v.tensor->shape), expected[i].sizes().vec());
      EXPECT_EQ(ir::dtypeBytes(v.tensor->dtype), static_cast<int>(expected[i].element_size()));
      EXPECT_EQ(ir::isFloating(v.tensor->dtype), expected[i].is_floating_point());
    }
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(Importer, EveryTensorValueHasAShape) {
  for (const json* sp : samples()) {
    SCOPED_TRACE((*sp)["name"].get<std::string>());
    auto g = importSample(*sp);
    ASSERT_TRUE(g.ok()) << g.error().message();
    for (const ir::Value& v : g->values()) {
      if (!v.isTensor()) continue;
      EXPECT_NE(v.tensor->dtype, ir::DType::kUnknown) << v.debug_name;
      for (const ir::Dim& d : v.tensor->shape) EXPECT_GE(d.size, 0) << v.debug_name;
    }
  }
}

TEST(Importer, ModulePathsFollowTheModuleTree) {
  auto g = importSample(*[] {
    for (const json* s : samples())
      if ((*s)["name"] == "llama_tiny") return s;
    return samples().front();
  }());
  ASSERT_TRUE(g.ok()) << g.error().message();
  bool saw_wq = false;
  for (const ir::Node& n : g->nodes()) {
    if (n.op == "aten::linear" && n.module_path == "layers.1.attention.wq") {
      saw_wq = true;
      EXPECT_EQ(g->node(g->value(n.inputs[1]).producer).name, "layers.1.attention.wq.weight");
    }
  }
  EXPECT_TRUE(saw_wq);
}

// A scripted module calling a method of its own (llama_tiny_scripted's attention rotates q and k in
// a helper method) is the same module: "layers.0.attention", not "layers.0.attention.SELF".
TEST(Importer, ScriptedSelfCallsStayInTheirModule) {
  auto g = importTorchScript((kSamples / "llama_tiny_scripted.pt").string());
  ASSERT_TRUE(g.ok()) << g.error().message();
  bool saw_rotation = false;
  for (const ir::Node& n : g->nodes()) {
    EXPECT_EQ(n.module_path.find("SELF"), std::string::npos) << n.op << " in " << n.module_path;
    if (n.op == "aten::neg" && n.module_path == "layers.0.attention") saw_rotation = true;
  }
  EXPECT_TRUE(saw_rotation);
}

TEST(Importer, TupleAndDictOutputsKeepTheirStructure) {
  auto g = importTorchScript((kSamples / "multi_output.pt").string());
  ASSERT_TRUE(g.ok()) << g.error().message();
  const ir::OutputTree& t = g->outputs();
  ASSERT_EQ(t.kind, ir::OutputTree::Kind::kTuple);
  ASSERT_EQ(t.children.size(), 2u);
  EXPECT_EQ(t.children[0].kind, ir::OutputTree::Kind::kLeaf);
  const ir::OutputTree& d = t.children[1];
  ASSERT_EQ(d.kind, ir::OutputTree::Kind::kDict);
  EXPECT_EQ(d.keys, (std::vector<std::string>{"logits", "hidden"}));
  EXPECT_EQ(ir::hintSizes(g->value(d.children[0].leaf).tensor->shape),
            (std::vector<int64_t>{4, 10}));
  EXPECT_EQ(ir::hintSizes(g->value(d.children[1].leaf).tensor->shape),
            (std::vector<int64_t>{4, 32}));
  // The structure itself is not a node of the graph.
  for (const ir::Node& n : g->nodes()) {
    EXPECT_NE(n.op, "prim::TupleConstruct");
    EXPECT_NE(n.op, "prim::DictConstruct");
  }
}

TEST(Importer, TracedAndScriptedAgree) {
  for (const char* base : {"llama_tiny", "gpt2_tiny"}) {
    SCOPED_TRACE(base);
    const json* traced = nullptr;
    const json* scripted = nullptr;
    for (const json* s : samples()) {
      if ((*s)["name"] == base) traced = s;
      if ((*s)["name"] == std::string(base) + "_scripted") scripted = s;
    }
    if (!traced || !scripted) continue;
    auto a = importSample(*traced);
    auto b = importSample(*scripted);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(ir::computeStats(*a).total_params, ir::computeStats(*b).total_params);
    EXPECT_EQ(ir::computeStats(*a).nodes_by_op.at("aten::linear"),
              ir::computeStats(*b).nodes_by_op.at("aten::linear"));
    auto la = a->outputs().leaves(), lb = b->outputs().leaves();
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(a->value(la[0]).tensor->shape, b->value(lb[0]).tensor->shape);
  }
}

/// Every node of `g` with its source position, in order: "kind @file:line:col".
std::vector<std::string> nodeSources(torch::jit::Block* b) {
  std::vector<std::string> out;
  for (torch::jit::Node* n : b->nodes()) {
    auto loc = n->sourceRange().file_line_col();
    out.push_back(std::string(n->kind().toQualString()) + " @" +
                  (loc ? std::get<0>(*loc) + ":" + std::to_string(std::get<1>(*loc)) + ":" +
                             std::to_string(std::get<2>(*loc))
                       : std::string("-")));
    for (torch::jit::Block* sub : n->blocks())
      for (std::string& x : nodeSources(sub)) out.push_back("  " + std::move(x));
  }
  return out;
}

std::string withoutComments(const std::string& dump) {
  std::istringstream in(dump);
  std::string out, line;
  while (std::getline(in, line)) out += line.substr(0, line.find(" # ")) + "\n";
  return out;
}

std::vector<std::string> tensorsOf(const torch::jit::Module& m, bool parameters) {
  std::vector<std::string> out;
  auto describe = [](const std::string& name, const at::Tensor& t) {
    std::ostringstream os;
    os << name << " " << t.scalar_type() << " " << t.sizes() << " " << t.strides() << " "
       << t.storage_offset() << " " << t.requires_grad();
    return os.str();
  };
  if (parameters) {
    for (const auto& p : m.named_parameters(true)) out.push_back(describe(p.name, p.value));
  } else {
    for (const auto& b : m.named_buffers(true)) out.push_back(describe(b.name, b.value));
  }
  return out;
}

TEST(ScriptModule, LoadsWhatTorchJitLoadLoads) {
  // loadScriptModule skips torch::jit::load's quantized-conv rewrite and nothing else: on every
  // TorchScript sample, the same extra file, parameters and buffers (names, geometry, values),
  // and the same inlined forward, node by node, with the same source positions.
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(kSamples)) {
    if (entry.path().extension() != ".pt") continue;
    const std::string path = entry.path().string();
    SCOPED_TRACE(path);
    torch::jit::ExtraFilesMap extra_a{{"apc_inputs.json", ""}}, extra_b = extra_a;
    torch::jit::Module a, b;
    try {
      a = torch::jit::load(path, std::nullopt, extra_a);
    } catch (const std::exception&) {
      EXPECT_ANY_THROW(loadScriptModule(path, extra_b));  // not loadable either way
      continue;
    }
    ASSERT_NO_THROW(b = loadScriptModule(path, extra_b));
    EXPECT_EQ(extra_a, extra_b);
    EXPECT_EQ(tensorsOf(a, true), tensorsOf(b, true));
    EXPECT_EQ(tensorsOf(a, false), tensorsOf(b, false));
    auto pa = a.named_parameters(true), pb = b.named_parameters(true);
    // Same geometry (above), so equal storage bytes mean equal values; stub weights (zero
    // strides over a few bytes) are compared without expanding them.
    for (auto ia = pa.begin(), ib = pb.begin(); ia != pa.end() && ib != pb.end(); ++ia, ++ib) {
      const c10::Storage &sa = (*ia).value.storage(), &sb = (*ib).value.storage();
      ASSERT_EQ(sa.nbytes(), sb.nbytes()) << (*ia).name;
      EXPECT_EQ(std::memcmp(sa.data(), sb.data(), sa.nbytes()), 0) << (*ia).name;
    }
    auto fa = a.find_method("forward"), fb = b.find_method("forward");
    ASSERT_EQ(fa.has_value(), fb.has_value());
    if (!fa) continue;
    auto ga = fa->graph()->copy(), gb = fb->graph()->copy();
    torch::jit::Inline(*ga);
    torch::jit::Inline(*gb);
    // The dump's "# file:line:col" comments differ where the archive has .debug_pkl maps to the
    // user's Python, which loadScriptModule does not read; node source ranges (all the importer
    // reads) are the same.
    EXPECT_EQ(withoutComments(ga->toString()), withoutComments(gb->toString()));
    EXPECT_EQ(nodeSources(ga->block()), nodeSources(gb->block()));
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST(ScriptModule, FilesTorchJitLoadRefusesAreRefused) {
  const fs::path dir =
      fs::temp_directory_path() / ("apc_script_module_" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  // Not a zip; a torch.save pickle's first bytes; a zip cut short.
  std::string sample;
  {
    std::ifstream f(kSamples / "mlp_stack.pt", std::ios::binary);
    sample.assign(std::istreambuf_iterator<char>(f), {});
  }
  ASSERT_GT(sample.size(), 1000u);
  for (const std::string& path :
       {write("text.pt", "not a model"), write("pickle.pt", std::string("\x80\x02junk", 6)),
        write("cut.pt", sample.substr(0, sample.size() / 2)), (dir / "missing.pt").string()}) {
    SCOPED_TRACE(path);
    EXPECT_ANY_THROW(torch::jit::load(path));
    EXPECT_ANY_THROW(loadScriptModule(path));
  }
  fs::remove_all(dir);
}

TEST(Importer, DeterministicAndSerializable) {
  for (const json* sp : samples()) {
    const json& s = *sp;
    SCOPED_TRACE(s["name"].get<std::string>());
    auto a = importSample(s);
    auto b = importSample(s);
    ASSERT_TRUE(a.ok() && b.ok());
    std::string bytes = ir::serializeGraph(*a);
    EXPECT_EQ(bytes, ir::serializeGraph(*b));
    auto back = ir::deserializeGraph(bytes);
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(ir::graphToJson(*back), ir::graphToJson(*a));
  }
}

TEST(Importer, NodeCountsAreStable) {
  // Regression guard: the importer's node counts per sample, checked in. A change here means the
  // importer (or the sample) changed; update tests/frontend/node_counts.json on purpose.
  std::ifstream f(fs::path(APC_SOURCE_DIR) / "tests" / "frontend" / "node_counts.json");
  ASSERT_TRUE(f.good());
  json expected = json::parse(f);
  for (const json* sp : samples()) {
    const json& s = *sp;
    std::string name = s["name"];
    if (!expected.contains(name)) continue;
    auto g = importSample(s);
    ASSERT_TRUE(g.ok()) << g.error().message();
    EXPECT_EQ(static_cast<int64_t>(g->numNodes()), expected[name].get<int64_t>()) << name;
  }
}

TEST(Importer, SymbolicBatchPropagatesThroughTheGraph) {
  // With x:f32[B=8,...] every dim that follows the batch is symbolic B (hint 8), and nothing else
  // is; the same import with a static batch has no symbolic dim, and node counts agree.
  for (const char* name : {"mlp_stack", "toy_block"}) {
    SCOPED_TRACE(name);
    const json* sample = nullptr;
    for (const json* sp : samples())
      if ((*sp)["name"] == name) sample = sp;
    if (!sample) GTEST_SKIP() << "run sample_models/generate.py";
    ImportOptions o;
    o.inputs = inputsOf(*sample);
    ASSERT_EQ(o.inputs.size(), 1u);
    const int64_t batch = o.inputs[0].shape[0].size;
    std::string path = (kSamples / (*sample)["file"].get<std::string>()).string();
    auto fixed = importTorchScript(path, o);
    ASSERT_TRUE(fixed.ok()) << fixed.error().message();
    o.inputs[0].shape[0] = ir::Dim::symbolic("B", batch);
    auto dyn = importTorchScript(path, o);
    ASSERT_TRUE(dyn.ok()) << dyn.error().message();
    ASSERT_EQ(dyn->numNodes(), fixed->numNodes());
    ASSERT_EQ(dyn->numValues(), fixed->numValues());
    int symbolic_values = 0;
    for (uint32_t i = 0; i < dyn->numValues(); ++i) {
      const ir::Value& a = fixed->value(ir::ValueId(i));
      const ir::Value& b = dyn->value(ir::ValueId(i));
      ASSERT_EQ(a.tensor.has_value(), b.tensor.has_value());
      EXPECT_EQ(a.constant, b.constant);  // size constants keep the hint
      if (!a.tensor) continue;
      for (const ir::Dim& d : a.tensor->shape) EXPECT_FALSE(d.isSymbolic());
      ASSERT_EQ(a.tensor->shape.size(), b.tensor->shape.size());
      bool any = false;
      for (size_t d = 0; d < b.tensor->shape.size(); ++d) {
        EXPECT_EQ(b.tensor->shape[d].size, a.tensor->shape[d].size);
        if (b.tensor->shape[d].isSymbolic()) {
          EXPECT_EQ(b.tensor->shape[d].symbol, "B");
          any = true;
        }
      }
      symbolic_values += any;
    }
    EXPECT_GT(symbolic_values, 1);
    auto leaves = dyn->outputs().leaves();
    ASSERT_FALSE(leaves.empty());
    EXPECT_EQ(dyn->value(leaves[0]).tensor->shape[0], ir::Dim::symbolic("B", batch));
  }
}

// --- bad input -----------------------------------------------------------------------------------

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("apc_frontend_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

using ImporterErrors = TempDir;

TEST_F(ImporterErrors, MissingFile) {
  auto g = importTorchScript((dir_ / "nope.pt").string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(g.error().message().find("nope.pt"), std::string::npos);
}

TEST_F(ImporterErrors, NotAnArchive) {
  fs::path p = dir_ / "text.pt";
  std::ofstream(p) << "hello, this is not a zip file\n";
  auto g = importTorchScript(p.string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kParse);
  EXPECT_NE(g.error().message().find("not a readable TorchScript archive"), std::string::npos)
      << g.error().message();
  EXPECT_EQ(g.error().message().find('\n'), std::string::npos);
}

TEST_F(ImporterErrors, TruncatedArchive) {
  fs::path src = kSamples / "mlp_stack.pt";
  std::ifstream in(src, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GT(bytes.size(), 1000u);
  fs::path p = dir_ / "truncated.pt";
  std::ofstream(p, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto g = importTorchScript(p.string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kParse);
}

// Issue 32: nested loops whose trip counts come from the input's shape multiply when unrolled; the
// import is bounded as a whole (ImportOptions::max_interpreted_nodes), with one line.
TEST_F(ImporterErrors, UnrollingIsBoundedAsAWhole) {
  torch::jit::Module m("Loops");
  m.define(R"(
def forward(self, x):
    for i in range(x.size(0)):
        for j in range(x.size(1)):
            x = x + 1.0
    return x
)");
  const fs::path p = dir_ / "loops.pt";
  m.save(p.string());
  ImportOptions small;
  small.inputs = {InputSpec{"x", ir::DType::kF32, ir::makeShape({5, 5})}};
  small.max_interpreted_nodes = 500;
  auto ok = importTorchScript(p.string(), small);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  ImportOptions big = small;
  big.inputs = {InputSpec{"x", ir::DType::kF32, ir::makeShape({40, 40})}};  // 1,600 adds
  auto g = importTorchScript(p.string(), big);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(g.error().message().find("the model unrolls to more than 500 nodes at import"),
            std::string::npos)
      << g.error().message();
  EXPECT_EQ(g.error().message().find('\n'), std::string::npos);
}

// Ops whose meta kernels LibTorch has only in Python (issue 31): max() and min() over every
// element, floor_divide by a tensor and by a scalar get apc's shape rules; each output's shape
// and dtype are those torch computes on real inputs.
TEST_F(ImporterErrors, OpsWithPythonOnlyMetaKernelsImport) {
  torch::jit::Module m("PyMeta");
  m.define(R"(
def forward(self, x, k):
    a = x.max() - x.min()
    b = torch.floor_divide(x, 0.5)
    c = torch.floor_divide(k, 3)
    d = torch.floor_divide(x, x.abs() + 1.0)
    return a, b, c, d
)");
  const fs::path p = dir_ / "pymeta.pt";
  m.save(p.string());
  ImportOptions o;
  o.inputs = {InputSpec{"x", ir::DType::kF32, ir::makeShape({4, 6})},
              InputSpec{"k", ir::DType::kI64, ir::makeShape({4, 6})}};
  auto g = importTorchScript(p.string(), o);
  ASSERT_TRUE(g.ok()) << g.error().message();
  std::vector<c10::IValue> args = {at::randn({4, 6}), at::randint(0, 100, {4, 6})};
  c10::IValue real = m.forward(args);
  const auto& elems = real.toTupleRef().elements();
  std::vector<ir::ValueId> leaves = g->outputs().leaves();
  ASSERT_EQ(leaves.size(), elems.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    const ir::TensorMeta& meta = *g->value(leaves[i]).tensor;
    const at::Tensor& t = elems[i].toTensor();
    EXPECT_EQ(ir::hintSizes(meta.shape), t.sizes().vec());
    EXPECT_EQ(meta.dtype, apc::dtypeOf(t.scalar_type()));
  }
}

// An op whose output size depends on its input's values cannot be planned: one line says so
// (nonzero; repeat_interleave by repeats the model computes, as MoE routing does).
TEST_F(ImporterErrors, DataDependentOutputSizeIsOneLine) {
  for (const auto& [op, body] :
       {std::pair<std::string, std::string>{"aten::nonzero", "return torch.nonzero(x > 0)"},
        std::pair<std::string, std::string>{
            "aten::repeat_interleave",
            "return torch.repeat_interleave(x, (x[:, 0] > 0).long() + 1, dim=0)"}}) {
    SCOPED_TRACE(op);
    torch::jit::Module m("DataDependent");
    m.define("def forward(self, x):\n    " + body + "\n");
    const fs::path p = dir_ / "data_dependent.pt";
    m.save(p.string());
    auto g =
        importTorchScript(p.string(), {{InputSpec{"x", ir::DType::kF32, ir::makeShape({4, 6})}}});
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code(), ErrorCode::kUnsupported);
    const std::string want = op + "'s output size depends on its input's values";
    EXPECT_NE(g.error().message().find(want), std::string::npos) << g.error().message();
    EXPECT_EQ(g.error().message().find("https://"), std::string::npos) << g.error().message();
    EXPECT_EQ(g.error().message().find('\n'), std::string::npos);
  }
}

// Issue 32: TorchScript sizes were not capped as .pt2 sizes are: an input shape or what the forward
// computes from it could reach sizes whose byte counts overflow the planner's int64. Every tensor
// of the import is within [0, 2^40] per dim and 2^56 elements, else one line naming it.
TEST_F(ImporterErrors, TensorSizesAreCappedAsInPt2) {
  torch::jit::Module m("Flatten");
  m.define(R"(
def forward(self, x):
    return x.new_zeros([x.size(0) * x.size(1)])
)");
  const fs::path p = dir_ / "flatten.pt";
  m.save(p.string());
  auto import = [&](int64_t rows, int64_t cols) {
    ImportOptions o;
    o.inputs = {InputSpec{"x", ir::DType::kF32, ir::makeShape({rows, cols})}};
    return importTorchScript(p.string(), o);
  };
  auto ok = import(int64_t{1} << 20, int64_t{1} << 20);  // 2^40 elements, a dim of 2^40: the caps
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  struct Case {
    int64_t rows, cols;
    std::string message;
  };
  for (const Case& c :
       {Case{int64_t{1} << 21, int64_t{1} << 20,
             "(aten::new_zeros) has a size 2199023255552 outside [0, 2^40]"},
        Case{int64_t{1} << 40, int64_t{1} << 17, "tensor %x (input) has more than 2^56 elements"},
        Case{(int64_t{1} << 40) + 1, 1,
             "tensor %x (input) has a size 1099511627777 outside [0, 2^40]"}}) {
    SCOPED_TRACE(c.message);
    auto g = import(c.rows, c.cols);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(g.error().message().find(c.message), std::string::npos) << g.error().message();
    EXPECT_EQ(g.error().message().find('\n'), std::string::npos);
  }
}

TEST_F(ImporterErrors, UnknownInputName) {
  auto g = importTorchScript((kSamples / "toy_block.pt").string(),
                             {{InputSpec{"y", ir::DType::kF32, ir::makeShape({8, 128, 1024})}}});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(g.error().message().find("unknown input 'y'"), std::string::npos)
      << g.error().message();
  EXPECT_NE(g.error().message().find("x"), std::string::npos);
}

TEST_F(ImporterErrors, WrongRankOrDtype) {
  auto rank = importTorchScript((kSamples / "toy_block.pt").string(),
                                {{InputSpec{"x", ir::DType::kF32, ir::makeShape({8, 1024})}}});
  ASSERT_FALSE(rank.ok());
  EXPECT_NE(rank.error().message().find("rank"), std::string::npos) << rank.error().message();
  auto dtype =
      importTorchScript((kSamples / "toy_block.pt").string(),
                        {{InputSpec{"x", ir::DType::kI64, ir::makeShape({8, 128, 1024})}}});
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.error().message().find("dtype"), std::string::npos) << dtype.error().message();
}

// extra/apc_inputs.json is ours (the sample generator writes it): a malformed one is a one-line
// error. Found with a hand-written input run through tests/fuzz/fuzz_pt: a non-object entry of
// "inputs" threw nlohmann's type_error
// out of the importer (an abort in the CLI).
TEST_F(ImporterErrors, MalformedRecordedInputsAreOneLineErrors) {
  auto withInputs = [&](const std::string& text) {
    caffe2::serialize::PyTorchStreamReader reader((kSamples / "multi_output.pt").string());
    fs::path p = dir_ / "inputs.pt";
    caffe2::serialize::PyTorchStreamWriter writer(p.string());
    for (const std::string& name : reader.getAllRecords()) {
      if (name == "version" || name.rfind(".data/", 0) == 0 || name == "extra/apc_inputs.json")
        continue;
      auto [data, size] = reader.getRecord(name);
      writer.writeRecord(name, data.get(), size);
    }
    writer.writeRecord("extra/apc_inputs.json", text.data(), text.size());
    writer.writeEndOfFile();
    return p.string();
  };
  // The sample's own text still imports.
  auto good = withInputs(R"({"inputs": [{"dtype": "f32", "name": "x", "shape": [4, 32]}]})");
  ASSERT_TRUE(importTorchScript(good).ok());
  for (const char* text : {R"([1])", R"({"inputs": 3})", R"({"inputs": [1]})",
                           R"({"inputs": [{"name": 1, "dtype": "f32", "shape": [4, 32]}, 2]})",
                           R"({"inputs": [{"name": "x", "dtype": "f32", "shape": [4, -1]}]})",
                           R"({"inputs": [{"name": "x", "dtype": "f32", "shape": [4, 1e300]}]})",
                           R"({"inputs": [{"name": "x", "dtype": "f32", "shape": ["4,5", 2]}]})"}) {
    SCOPED_TRACE(text);
    auto path = withInputs(text);
    auto recorded = recordedInputs(path);
    ASSERT_FALSE(recorded.ok());
    EXPECT_EQ(recorded.error().code(), ErrorCode::kParse);
    EXPECT_NE(recorded.error().message().find("malformed extra/apc_inputs.json"), std::string::npos)
        << recorded.error().message();
    EXPECT_EQ(recorded.error().message().find('\n'), std::string::npos);
    auto g = importTorchScript(path);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().message(), recorded.error().message());
  }
}

TEST_F(ImporterErrors, DataDependentControlFlowNamesTheNode) {
  fs::path p = kSamples / "control_flow.pt";
  auto g = importTorchScript(p.string());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::kUnsupported);
  EXPECT_NE(g.error().message().find("prim::If"), std::string::npos) << g.error().message();
  EXPECT_NE(g.error().message().find(".py:"), std::string::npos) << g.error().message();
}

}  // namespace
}  // namespace apc::frontend
