//===- tests/runtime/interpreter_test.cpp - The interpreter against LibTorch -===//
//
// The interpreter on whole imported graphs (one rank, no sharding): forward outputs and every
// parameter gradient equal TorchScript's own forward and backward on the sample models, with the
// smallest input shapes. Also: the vocab-parallel embedding's local graph (the two halves of a
// vocab-sharded lookup sum to the full lookup, gradients too), output trees, and one-line errors
// for unknown operators.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <torch/jit.h>
#include <torch/script.h>

#include <filesystem>
#include <map>

#include "apc/frontend/input_spec.h"
#include "apc/frontend/torchscript.h"
#include "apc/ir/proto_io.h"
#include "apc/lower/local_rewrite.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/op_collective.h"

// A namespace of its own: the files of runtime_test are compiled together (unity build).
namespace apc::runtime::interpreter_test {
namespace {

std::string samplePath(const std::string& name) {
  return std::string(APC_SOURCE_DIR) + "/sample_models/out/" + name + ".pt";
}

struct Case {
  std::string model;
  std::vector<std::string> inputs;  // "x:f32[2,4,128]"
  int64_t index_bound = 0;          // integer inputs are drawn in [0, bound)
};

std::vector<c10::IValue> makeInputs(const std::vector<frontend::InputSpec>& specs, int64_t bound) {
  at::manual_seed(7);
  std::vector<c10::IValue> out;
  for (const frontend::InputSpec& s : specs) {
    std::vector<int64_t> sizes = ir::hintSizes(s.shape);
    if (ir::isFloating(s.dtype))
      out.emplace_back(at::randn(sizes));
    else
      out.emplace_back(at::randint(0, bound, sizes, at::TensorOptions().dtype(at::kLong)));
  }
  return out;
}

class InterpreterModels : public ::testing::TestWithParam<Case> {};

TEST_P(InterpreterModels, ForwardAndGradientsMatchTorchScript) {
  const Case& c = GetParam();
  if (!std::filesystem::exists(samplePath(c.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  frontend::ImportOptions options;
  for (const std::string& text : c.inputs) {
    auto spec = frontend::parseInputSpec(text);
    ASSERT_TRUE(spec.ok()) << spec.error().message();
    options.inputs.push_back(*spec);
  }
  auto graph = frontend::importTorchScript(samplePath(c.model), options);
  ASSERT_TRUE(graph.ok()) << graph.error().message();
  auto g = std::make_shared<const ir::Graph>(std::move(graph).value());
  auto interp = Interpreter::create(g);
  ASSERT_TRUE(interp.ok()) << interp.error().message();

  torch::jit::Module module = torch::jit::load(samplePath(c.model));
  std::map<std::string, at::Tensor> params, buffers;
  for (const auto& p : module.named_parameters()) params[p.name] = p.value;
  for (const auto& b : module.named_buffers()) buffers[b.name] = b.value;
  std::vector<c10::IValue> inputs = makeInputs(options.inputs, c.index_bound);

  // Reference: TorchScript's forward and backward.
  at::Tensor ref_out = module.forward(inputs).toTensor();
  at::manual_seed(11);
  at::Tensor w = at::randn(ref_out.sizes());
  (ref_out * w).sum().backward();
  std::map<std::string, at::Tensor> ref_grads;
  // Tied parameters appear under several names: record every gradient before clearing any.
  for (auto& [name, p] : params)
    ref_grads[name] = p.grad().defined() ? p.grad().clone() : at::zeros_like(p);
  for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();

  std::vector<std::string> inputs_by_node;
  for (ir::NodeId id : g->nodesOfKind(ir::NodeKind::kInput))
    inputs_by_node.push_back(g->node(id).name);
  auto external = [&](const ir::Node& n, std::vector<c10::IValue>&) -> std::vector<c10::IValue> {
    if (n.kind == ir::NodeKind::kParameter) return {params.at(n.name)};
    if (n.kind == ir::NodeKind::kBuffer) return {buffers.at(n.name)};
    for (size_t i = 0; i < inputs_by_node.size(); ++i)
      if (inputs_by_node[i] == n.name) return {inputs[i]};
    throw std::runtime_error("unexpected external node " + n.name);
  };
  auto out = interp->run(external);
  ASSERT_TRUE(out.ok()) << out.error().message();
  ASSERT_EQ(out->size(), 1u);
  at::Tensor got = (*out)[0].toTensor();
  ASSERT_EQ(got.sizes(), ref_out.sizes());
  EXPECT_TRUE(at::allclose(got, ref_out, 1e-5, 1e-6))
      << "max diff " << (got - ref_out).abs().max().item<double>();
  (got * w).sum().backward();
  for (auto& [name, p] : params) {
    at::Tensor gp = p.grad().defined() ? p.grad() : at::zeros_like(p);
    EXPECT_TRUE(at::allclose(gp, ref_grads[name], 1e-5, 1e-6))
        << name << ": max diff " << (gp - ref_grads[name]).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Samples, InterpreterModels,
    ::testing::Values(Case{"toy_block", {"x:f32[2,2,1024]"}, 0},
                      Case{"mlp_stack", {"x:f32[2,4,128]"}, 0},
                      Case{"gpt2_tiny", {"idx:i64[2,8]"}, 50257},
                      Case{"gpt2_tiny_loss", {"idx:i64[2,8]", "targets:i64[2,8]"}, 50257},
                      Case{"llama_tiny", {"tokens:i64[2,8]"}, 256},
                      Case{"cnn_small", {"x:f32[2,3,32,32]"}, 0}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.model; });

/// A tensor value of `g`.
ir::ValueId addTensor(ir::Graph& g, std::vector<int64_t> shape, ir::DType dtype,
                      bool requires_grad = false) {
  ir::Value v;
  v.type = ir::ValueType::kTensor;
  v.tensor = ir::TensorMeta{ir::makeShape(shape), dtype, requires_grad};
  return g.addValue(v);
}

/// A leaf node of `g` (an input or a parameter) that defines `value`.
void addLeaf(ir::Graph& g, ir::NodeKind kind, const std::string& name, ir::ValueId value) {
  ir::Node n;
  n.kind = kind;
  n.op = kind == ir::NodeKind::kParameter ? "parameter" : "input";
  n.name = name;
  n.outputs = {value};
  g.addNode(n);
}

/// weight [7, 3] (param), idx [6] (input) -> aten::embedding(weight, idx, padding_idx, false,
/// false) -> output; the embedding is node 2.
std::shared_ptr<const ir::Graph> embeddingGraph(int64_t padding_idx) {
  ir::Graph g;
  ir::ValueId w = addTensor(g, {7, 3}, ir::DType::kF32);
  ir::ValueId idx = addTensor(g, {6}, ir::DType::kI64);
  ir::ValueId out = addTensor(g, {6, 3}, ir::DType::kF32);
  addLeaf(g, ir::NodeKind::kParameter, "weight", w);
  addLeaf(g, ir::NodeKind::kInput, "idx", idx);
  ir::Node e;
  e.op = "aten::embedding";
  e.inputs = {w, idx, g.addConstant(ir::ValueType::kInt, padding_idx),
              g.addConstant(ir::ValueType::kBool, false),
              g.addConstant(ir::ValueType::kBool, false)};
  e.outputs = {out};
  g.addNode(e);
  g.setOutputs(ir::OutputTree::makeLeaf(out));
  return std::make_shared<const ir::Graph>(std::move(g));
}

/// Rank r of 2 of a vocab-parallel embedding of 7 rows (torch.chunk: [0, 4) and [4, 7)): the
/// rank's local graph as its registry entry's local rewrite writes it, through the program's
/// serialized form, ready to run; and padding_idx as the rewrite maps it to the rank's rows.
struct VocabRank {
  OpCollectiveRunner runner;
  int64_t padding_idx = -1;
  int64_t offset = 0, rows = 0;
};
Expected<VocabRank> vocabRank(const ir::Node& node, int64_t padding_idx, size_t r) {
  const int64_t offsets[] = {0, 4}, rows[] = {4, 3};
  strategy::TensorPiece w;
  w.global = {7, 3};
  w.local = {{offsets[r], rows[r]}, {0, 3}};
  strategy::TensorPiece ix;
  ix.global = {6};
  ix.local = {{0, 6}};
  strategy::RankPieces pieces;
  pieces.inputs = {{w}, {ix}, {}, {}, {}};
  pieces.outputs = {{}};
  APC_ASSIGN_OR_RETURN(
      lower::NodeRewrite rw,
      lower::localizeNode(node, {std::nullopt, std::nullopt, padding_idx, false, false}, pieces));
  if (!rw.local) return internalError("rank " + std::to_string(r) + ": no local graph");
  if (rw.replace.size() != 1 || rw.replace[0].first != 2)
    return internalError("rank " + std::to_string(r) + ": padding_idx not rewritten");
  APC_ASSIGN_OR_RETURN(ir::Graph local, ir::deserializeGraph(ir::serializeGraph(*rw.local)));
  APC_ASSIGN_OR_RETURN(
      OpCollectiveRunner runner,
      OpCollectiveRunner::create(std::move(local), node.inputs.size(), node.outputs.size()));
  return VocabRank{std::move(runner), std::get<int64_t>(rw.replace[0].second), offsets[r], rows[r]};
}

at::Tensor noAllReduce(size_t, const at::Tensor& t) {
  ADD_FAILURE() << "an all-reduce in the vocab-parallel embedding's local graph";
  return t;
}

// A vocab-parallel embedding (weight cut on its rows, output Partial) runs on each rank as the
// local graph its registry entry's local rewrite writes (plain ATen ops, no all-reduce), through
// the runner the runtime uses for every local graph. 7 rows over 2 ranks, indices on both sides
// of the cut and one equal to padding_idx (5, row 1 of rank 1): the ranks' outputs sum to the full
// lookup, and the weight's gradient through them is the full lookup's (zero on the padding row
// and on the rows no index reads).
TEST(Interpreter, VocabLocalGraphHalvesSumToTheFullLookup) {
  const int64_t padding_idx = 5;
  auto g = embeddingGraph(padding_idx);
  const ir::Node& node = g->node(ir::NodeId(2));
  ASSERT_EQ(node.op, "aten::embedding");
  at::manual_seed(11);
  at::Tensor weight = at::randn({7, 3}).requires_grad_(true);
  at::Tensor idx = at::tensor({0, 3, 4, 5, 6, 3}, at::TensorOptions().dtype(at::kLong));
  at::Tensor sum;
  for (size_t r = 0; r < 2; ++r) {
    auto rank = vocabRank(node, padding_idx, r);
    ASSERT_TRUE(rank.ok()) << rank.error().message();
    // padding_idx on the rank's rows: not local on rank 0, row 1 of rank 1.
    EXPECT_EQ(rank->padding_idx, r == 0 ? int64_t{-1} : int64_t{1});
    EXPECT_EQ(rank->runner.numAllReduces(), 0u);
    std::vector<c10::IValue> args = {weight.narrow(0, rank->offset, rank->rows), idx,
                                     c10::IValue(rank->padding_idx), c10::IValue(false),
                                     c10::IValue(false)};
    std::vector<c10::IValue> out = rank->runner.run(args, noAllReduce);
    ASSERT_EQ(out.size(), 1u);
    at::Tensor part = out[0].toTensor();
    ASSERT_EQ(part.sizes().vec(), (std::vector<int64_t>{6, 3}));
    sum = sum.defined() ? sum + part : part;
  }
  at::Tensor full_weight = weight.detach().clone().requires_grad_(true);
  at::Tensor full = at::embedding(full_weight, idx, padding_idx);
  EXPECT_TRUE(at::allclose(sum, full));
  at::Tensor grad_out = at::randn({6, 3});
  (sum * grad_out).sum().backward();
  (full * grad_out).sum().backward();
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_TRUE(at::allclose(weight.grad(), full_weight.grad()));
  for (int64_t row : {int64_t{1}, int64_t{2}, padding_idx})
    EXPECT_TRUE(weight.grad()[row].eq(0).all().item<bool>()) << "row " << row;
  EXPECT_FALSE(weight.grad()[4].eq(0).all().item<bool>());
}

/// One rank's local graph of a node whose registry entry rewrites it for `pieces` (the program's
/// serialized form), ready to run; `constants` as localizeNode takes them.
Expected<OpCollectiveRunner> localRunner(const std::string& op, const std::string& overload,
                                         size_t num_outputs,
                                         const std::vector<std::optional<ir::Constant>>& constants,
                                         const strategy::RankPieces& pieces) {
  ir::Node node;
  node.op = op;
  node.overload = overload;
  for (size_t i = 0; i < constants.size(); ++i) node.inputs.push_back(ir::ValueId(100 + i));
  for (size_t i = 0; i < num_outputs; ++i) node.outputs.push_back(ir::ValueId(200 + i));
  APC_ASSIGN_OR_RETURN(lower::NodeRewrite rw, lower::localizeNode(node, constants, pieces));
  if (!rw.local) return internalError(node.qualifiedOp() + ": no local graph");
  APC_ASSIGN_OR_RETURN(ir::Graph local, ir::deserializeGraph(ir::serializeGraph(*rw.local)));
  return OpCollectiveRunner::create(std::move(local), node.inputs.size(), num_outputs);
}

/// A piece [offset, offset + size) of dim 0 of a tensor of `global` sizes (the others whole).
strategy::TensorPiece pieceOf(std::vector<int64_t> global, int64_t offset, int64_t size) {
  strategy::TensorPiece p;
  p.global = global;
  p.local.push_back({offset, size});
  for (size_t d = 1; d < global.size(); ++d) p.local.push_back({0, global[d]});
  return p;
}

// A token-local region's rank-local ops (apc/strategy/token_local.h) as their local rewrites
// write them, on 2 ranks that each hold half of 6 (token, choice) pairs: the rank's sort gives
// GLOBAL positions of its own pairs in expert order; index and index_put read and write its own
// piece at those positions; unsorting by the inverse permutation puts the rows back in pair order,
// so the ranks' outputs stacked are the rows of the whole batch. The same local graphs, planned for
// pieces of 3, run on pieces of 4 (a dynamic batch of 8 pairs): the first position comes from the
// local size at run time.
TEST(Interpreter, TokenLocalSortAndIndexUseGlobalPositions) {
  for (int64_t run_size : {int64_t{3}, int64_t{4}}) {
    SCOPED_TRACE("pairs per rank " + std::to_string(run_size));
    const int64_t hint = 3, total = 2 * run_size;
    at::manual_seed(21);
    at::Tensor ids = at::randint(0, 3, {total}, at::TensorOptions().dtype(at::kLong));
    at::Tensor rows = at::randn({total, 2});
    std::vector<at::Tensor> outs;
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t off = r * run_size;
      strategy::RankPieces sort_pieces;
      sort_pieces.inputs = {{pieceOf({6}, r * hint, hint)}, {}, {}};
      sort_pieces.outputs = {{pieceOf({6}, r * hint, hint)}, {pieceOf({6}, r * hint, hint)}};
      auto sort = localRunner("aten::sort", "", 2, {std::nullopt, int64_t{-1}, false}, sort_pieces);
      ASSERT_TRUE(sort.ok()) << sort.error().message();
      at::Tensor mine = ids.narrow(0, off, run_size);
      std::vector<c10::IValue> sorted =
          sort->run({mine, c10::IValue(int64_t{-1}), c10::IValue(false)}, noAllReduce);
      ASSERT_EQ(sorted.size(), 2u);
      at::Tensor values = sorted[0].toTensor(), perm = sorted[1].toTensor();
      // Global positions of the rank's own pairs, in expert order.
      EXPECT_TRUE(at::equal(values, std::get<0>(mine.sort())));
      EXPECT_TRUE(at::equal(ids.index_select(0, perm), values));
      EXPECT_TRUE(perm.ge(off).all().item<bool>() && perm.lt(off + run_size).all().item<bool>());

      strategy::RankPieces index_pieces;
      index_pieces.inputs = {{pieceOf({6, 2}, r * hint, hint)}, {pieceOf({6}, r * hint, hint)}};
      index_pieces.outputs = {{pieceOf({6, 2}, r * hint, hint)}};
      auto index =
          localRunner("aten::index", "Tensor", 1, {std::nullopt, std::nullopt}, index_pieces);
      ASSERT_TRUE(index.ok()) << index.error().message();
      at::Tensor local_rows = rows.narrow(0, off, run_size);
      at::Tensor gathered =
          index->run({local_rows, c10::List<at::Tensor>({perm})}, noAllReduce)[0].toTensor();
      EXPECT_TRUE(at::equal(gathered, rows.index_select(0, perm)));

      // inv[perm] = positions (the arange's piece: global positions), then rows[inv - off].
      strategy::RankPieces put_pieces;
      put_pieces.inputs = {{pieceOf({6}, r * hint, hint)},
                           {pieceOf({6}, r * hint, hint)},
                           {pieceOf({6}, r * hint, hint)},
                           {}};
      put_pieces.outputs = {{pieceOf({6}, r * hint, hint)}};
      auto put = localRunner("aten::index_put", "", 1,
                             {std::nullopt, std::nullopt, std::nullopt, false}, put_pieces);
      ASSERT_TRUE(put.ok()) << put.error().message();
      at::Tensor positions = at::arange(off, off + run_size, at::TensorOptions().dtype(at::kLong));
      at::Tensor inv = put->run({at::empty_like(perm), c10::List<at::Tensor>({perm}), positions,
                                 c10::IValue(false)},
                                noAllReduce)[0]
                           .toTensor();
      outs.push_back(
          index->run({gathered, c10::List<at::Tensor>({inv})}, noAllReduce)[0].toTensor());
    }
    EXPECT_TRUE(at::equal(at::cat(outs), rows));
  }
}

// A token-local region's expert cut (apc/strategy/token_local.h): _grouped_mm with the groups of
// its weight cut runs on each rank as the local graph its rewrite writes, the rows of the rank's
// own experts multiplied and the others zero. 4 experts over 2 ranks, 10 sorted rows: the ranks'
// outputs sum to the full product, the rows' gradient through them to the full one, and each
// rank's weight gradient is its slice of the full one; also where one rank's experts got no row
// and where an expert in the middle got none.
TEST(Interpreter, ExpertCutGroupedMmSumsToTheFullProduct) {
  for (const std::vector<int32_t>& ends :
       {std::vector<int32_t>{3, 3, 7, 10}, std::vector<int32_t>{5, 10, 10, 10}}) {
    SCOPED_TRACE(::testing::PrintToString(ends));
    at::manual_seed(31);
    at::Tensor x = at::randn({10, 8}).requires_grad_(true);
    at::Tensor w = at::randn({4, 8, 4}).requires_grad_(true);
    at::Tensor offs = at::tensor(c10::ArrayRef<int32_t>(ends), at::TensorOptions().dtype(at::kInt));
    at::Tensor grad_out = at::randn({10, 4});
    at::Tensor sum;
    std::vector<at::Tensor> pieces;
    for (int64_t r = 0; r < 2; ++r) {
      strategy::RankPieces p;
      p.inputs = {
          {pieceOf({10, 8}, 0, 10)}, {pieceOf({4, 8, 4}, 2 * r, 2)}, {pieceOf({4}, 0, 4)}, {}, {}};
      p.outputs = {{pieceOf({10, 4}, 0, 10)}};
      auto gmm = localRunner("aten::_grouped_mm", "", 1,
                             {std::nullopt, std::nullopt, std::nullopt, ir::None{}, ir::None{}}, p);
      ASSERT_TRUE(gmm.ok()) << gmm.error().message();
      at::Tensor mine = w.narrow(0, 2 * r, 2);
      at::Tensor part =
          gmm->run({x, mine, offs, c10::IValue(), c10::IValue()}, noAllReduce)[0].toTensor();
      ASSERT_EQ(part.sizes().vec(), (std::vector<int64_t>{10, 4}));
      sum = sum.defined() ? sum + part : part;
    }
    at::Tensor fx = x.detach().clone().requires_grad_(true);
    at::Tensor fw = w.detach().clone().requires_grad_(true);
    at::Tensor full = at::_grouped_mm(fx, fw, offs);
    EXPECT_TRUE(at::allclose(sum, full, 1e-5, 1e-6));
    (sum * grad_out).sum().backward();
    (full * grad_out).sum().backward();
    EXPECT_TRUE(at::allclose(x.grad(), fx.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(w.grad(), fw.grad(), 1e-5, 1e-6));
  }
}

// The same local graphs as the runtime runs them: the embedding node external in the program's
// interpreter, its callback running the local graph, inside a checkpoint segment (run without
// autograd in forward, recomputed through the recompute callback in backward). The outputs and
// the weight's gradient equal the full lookup's.
TEST(Interpreter, VocabLocalGraphRunsInsideACheckpointSegment) {
  const int64_t padding_idx = 5;
  auto g = embeddingGraph(padding_idx);
  const ir::Node& node = g->node(ir::NodeId(2));
  at::manual_seed(12);
  at::Tensor weight = at::randn({7, 3}).requires_grad_(true);
  at::Tensor idx = at::tensor({6, 0, 5, 4, 3, 2}, at::TensorOptions().dtype(at::kLong));
  at::Tensor grad_out = at::randn({6, 3});
  at::Tensor sum;
  for (size_t r = 0; r < 2; ++r) {
    auto rank = vocabRank(node, padding_idx, r);
    ASSERT_TRUE(rank.ok()) << rank.error().message();
    at::Tensor rows = weight.narrow(0, rank->offset, rank->rows);
    size_t local_runs = 0;
    const Interpreter::ExternalFn external = [&](const ir::Node& n,
                                                 std::vector<c10::IValue>& args) {
      if (n.kind == ir::NodeKind::kParameter) return std::vector<c10::IValue>{rows};
      if (n.kind == ir::NodeKind::kInput) return std::vector<c10::IValue>{idx};
      ++local_runs;
      args.at(2) = c10::IValue(rank->padding_idx);  // as lowering writes the rank's node
      return rank->runner.run(args, noAllReduce);
    };
    auto interp = Interpreter::create(g, {}, {false, false, true}, {}, {{"embed", 2, 2}});
    ASSERT_TRUE(interp.ok()) << interp.error().message();
    auto out = interp->run(external, nullptr, {},
                           std::make_shared<const Interpreter::ExternalFn>(external));
    ASSERT_TRUE(out.ok()) << out.error().message();
    at::Tensor part = (*out)[0].toTensor();
    ASSERT_TRUE(part.requires_grad());
    (part * grad_out).sum().backward();
    EXPECT_EQ(local_runs, 2u) << "forward and the backward's recomputation";
    sum = sum.defined() ? sum + part.detach() : part.detach();
  }
  at::Tensor full_weight = weight.detach().clone().requires_grad_(true);
  at::Tensor full = at::embedding(full_weight, idx, padding_idx);
  (full * grad_out).sum().backward();
  EXPECT_TRUE(at::allclose(sum, full));
  ASSERT_TRUE(weight.grad().defined());
  EXPECT_TRUE(at::allclose(weight.grad(), full_weight.grad()));
  EXPECT_TRUE(weight.grad()[padding_idx].eq(0).all().item<bool>());
}

TEST(Interpreter, UnknownOperatorIsAnErrorNamingTheNode) {
  ir::Graph g;
  ir::ValueId in = addTensor(g, {2}, ir::DType::kF32);
  ir::ValueId out = addTensor(g, {2}, ir::DType::kF32);
  addLeaf(g, ir::NodeKind::kInput, "x", in);
  ir::Node op;
  op.op = "aten::no_such_op";
  op.inputs = {in};
  op.outputs = {out};
  g.addNode(op);
  g.setOutputs(ir::OutputTree::makeLeaf(out));
  auto interp = Interpreter::create(std::make_shared<const ir::Graph>(std::move(g)));
  ASSERT_FALSE(interp.ok());
  EXPECT_NE(interp.error().message().find("node 1 aten::no_such_op"), std::string::npos)
      << interp.error().message();
}

// A local piece can have strides its global tensor did not (seen: gpt2_small planned with a
// measured cluster profile, whose attention reshape then met a non-contiguous local input and
// failed with "view size is not compatible with input tensor's size and stride"). aten::view
// runs as aten::reshape: the same values, a copy only where no view exists; gradients flow.
TEST(Interpreter, AViewOfANonContiguousLocalPieceRuns) {
  ir::Graph g;
  ir::ValueId in = addTensor(g, {3, 4}, ir::DType::kF32, true);
  ir::ValueId out = addTensor(g, {12}, ir::DType::kF32, true);
  ir::ValueId shape =
      g.addConstant(ir::ValueType::kIntList, ir::Constant(std::vector<int64_t>{12}));
  addLeaf(g, ir::NodeKind::kInput, "x", in);
  ir::Node view;
  view.op = "aten::view";
  view.inputs = {in, shape};
  view.outputs = {out};
  g.addNode(view);
  g.setOutputs(ir::OutputTree::makeLeaf(out));
  auto interp = Interpreter::create(std::make_shared<const ir::Graph>(std::move(g)));
  ASSERT_TRUE(interp.ok()) << interp.error().message();
  at::Tensor base = at::arange(12, at::kFloat).reshape({4, 3}).requires_grad_();
  at::Tensor x = base.t();  // [3, 4], not contiguous: x.view({12}) throws
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_ANY_THROW((void)x.view({12}));
  auto outs = interp->run(
      [&](const ir::Node&, std::vector<c10::IValue>&) { return std::vector<c10::IValue>{x}; });
  ASSERT_TRUE(outs.ok()) << outs.error().message();
  at::Tensor y = (*outs)[0].toTensor();
  EXPECT_TRUE(at::equal(y, x.reshape({12})));
  (y * at::arange(12, at::kFloat)).sum().backward();
  EXPECT_TRUE(at::equal(base.grad(), at::arange(12, at::kFloat).reshape({3, 4}).t()));
}

// index.Tensor's indices as exports record `x[:, idx]` and `x[idx, :]`: an optional-tensor
// list with Nones before or after the tensor. prim::ListConstruct must build the Tensor?[] that
// index takes (a generic list is refused: "Tried to cast a List<Any> to a List<Tensor?>", which
// stopped Hugging Face's FalconForCausalLM at its first step), whichever element comes first.
TEST(Interpreter, OptionalTensorIndexListsRun) {
  for (bool none_first : {true, false}) {
    ir::Graph g;
    ir::ValueId x = addTensor(g, {4, 5, 3}, ir::DType::kF32, true);
    ir::ValueId idx = addTensor(g, {2}, ir::DType::kI64);
    addLeaf(g, ir::NodeKind::kInput, "x", x);
    addLeaf(g, ir::NodeKind::kInput, "idx", idx);
    const ir::ValueId none = g.addConstant(ir::ValueType::kNone, ir::Constant(ir::None{}));
    ir::Value list;
    list.type = ir::ValueType::kOther;
    ir::Node build;
    build.op = "prim::ListConstruct";
    build.inputs = none_first ? std::vector<ir::ValueId>{none, idx} : std::vector{idx, none};
    build.outputs = {g.addValue(list)};
    g.addNode(build);
    ir::ValueId out =
        addTensor(g, none_first ? std::vector<int64_t>{4, 2, 3} : std::vector<int64_t>{2, 5, 3},
                  ir::DType::kF32, true);
    ir::Node index;
    index.op = "aten::index";
    index.overload = "Tensor";
    index.inputs = {x, build.outputs[0]};
    index.outputs = {out};
    g.addNode(index);
    g.setOutputs(ir::OutputTree::makeLeaf(out));
    auto interp = Interpreter::create(std::make_shared<const ir::Graph>(std::move(g)));
    ASSERT_TRUE(interp.ok()) << interp.error().message();
    at::Tensor xs = at::randn({4, 5, 3}).requires_grad_();
    at::Tensor is = at::tensor(std::vector<int64_t>{2, 0});
    auto outs = interp->run([&](const ir::Node& n, std::vector<c10::IValue>&) {
      return std::vector<c10::IValue>{n.name == "x" ? xs : is};
    });
    ASSERT_TRUE(outs.ok()) << outs.error().message();
    at::Tensor y = (*outs)[0].toTensor();
    at::Tensor want =
        none_first ? xs.detach().index_select(1, is) : xs.detach().index_select(0, is);
    EXPECT_TRUE(at::equal(y, want)) << "none first: " << none_first;
    y.sum().backward();
    ASSERT_TRUE(xs.grad().defined());
    EXPECT_EQ(xs.grad().sum().item<double>(), static_cast<double>(want.numel()));
  }
}

// `t[..., a:b] = v` in a model is functionalized into the functional aten::copy(slice, v), which
// torch gives no derivative ("derivative for aten::copy is not implemented" ended training of
// Hugging Face's DeepseekV3ForCausalLM). It runs as copy_ into a fresh tensor like self: the
// values are src broadcast to self's shape and dtype, the gradient reaches src summed over the
// broadcast dim, and none reaches self, whose values are overwritten.
TEST(Interpreter, FunctionalCopyIsDifferentiable) {
  ir::Graph g;
  ir::ValueId self = addTensor(g, {3, 4}, ir::DType::kF64, true);
  ir::ValueId src = addTensor(g, {4}, ir::DType::kF32, true);
  ir::ValueId out = addTensor(g, {3, 4}, ir::DType::kF64, true);
  addLeaf(g, ir::NodeKind::kInput, "self", self);
  addLeaf(g, ir::NodeKind::kInput, "src", src);
  ir::Node copy;
  copy.op = "aten::copy";
  copy.inputs = {self, src, g.addConstant(ir::ValueType::kBool, ir::Constant(false))};
  copy.outputs = {out};
  g.addNode(copy);
  g.setOutputs(ir::OutputTree::makeLeaf(out));
  auto interp = Interpreter::create(std::make_shared<const ir::Graph>(std::move(g)));
  ASSERT_TRUE(interp.ok()) << interp.error().message();
  at::Tensor x = at::zeros({3, 4}, at::kDouble).requires_grad_();
  at::Tensor v = at::arange(4, at::kFloat).requires_grad_();
  auto outs = interp->run([&](const ir::Node& n, std::vector<c10::IValue>&) {
    return std::vector<c10::IValue>{n.name == "self" ? x : v};
  });
  ASSERT_TRUE(outs.ok()) << outs.error().message();
  at::Tensor y = (*outs)[0].toTensor();
  EXPECT_EQ(y.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(y, v.detach().to(at::kDouble).expand({3, 4})));
  at::Tensor w = at::arange(12, at::kDouble).reshape({3, 4});
  (y * w).sum().backward();
  ASSERT_TRUE(v.grad().defined());
  EXPECT_TRUE(at::allclose(v.grad(), w.sum(0).to(at::kFloat)));
  EXPECT_FALSE(x.grad().defined() && x.grad().abs().sum().item<double>() != 0);
}

// A model traced or exported on the CPU names "cpu" as its factories' device (`device=x.device`);
// run with its tensors elsewhere (CUDA), those factories must follow the tensors, and "meta" (a
// device the importer read off a tensor) likewise. The meta device stands in for CUDA here.
TEST(Interpreter, CpuAndMetaDeviceConstantsRunOnTheModulesDevice) {
  for (const char* recorded : {"cpu", "meta"}) {
    ir::Graph g;
    ir::ValueId out = addTensor(g, {2, 3}, ir::DType::kF32);
    ir::Node ones;
    ones.op = "aten::ones";
    ones.inputs = {g.addConstant(ir::ValueType::kIntList, ir::Constant(std::vector<int64_t>{2, 3})),
                   g.addConstant(ir::ValueType::kNone, ir::Constant(ir::None{})),
                   g.addConstant(ir::ValueType::kNone, ir::Constant(ir::None{})),
                   g.addConstant(ir::ValueType::kDevice, ir::Constant(std::string(recorded))),
                   g.addConstant(ir::ValueType::kNone, ir::Constant(ir::None{}))};
    ones.outputs = {out};
    g.addNode(ones);
    g.setOutputs(ir::OutputTree::makeLeaf(out));
    auto shared = std::make_shared<const ir::Graph>(std::move(g));
    for (c10::Device device : {c10::Device(c10::kCPU), c10::Device(c10::kMeta)}) {
      InterpreterOptions options;
      options.device = device;
      auto interp = Interpreter::create(shared, options);
      ASSERT_TRUE(interp.ok()) << interp.error().message();
      auto outs =
          interp->run([](const ir::Node& n, std::vector<c10::IValue>&) -> std::vector<c10::IValue> {
            throw std::runtime_error("no external node expected, got " + n.name);
          });
      ASSERT_TRUE(outs.ok()) << outs.error().message();
      at::Tensor y = (*outs)[0].toTensor();
      EXPECT_EQ(y.device(), device) << "recorded " << recorded;
      EXPECT_EQ(y.sizes(), at::IntArrayRef({2, 3}));
    }
  }
}

TEST(Interpreter, PacksOutputTrees) {
  ir::OutputTree t;
  t.kind = ir::OutputTree::Kind::kTuple;
  ir::OutputTree d;
  d.kind = ir::OutputTree::Kind::kDict;
  d.keys = {"loss", "logits"};
  d.children = {ir::OutputTree::makeLeaf(ir::ValueId(0)), ir::OutputTree::makeLeaf(ir::ValueId(1))};
  t.children = {ir::OutputTree::makeLeaf(ir::ValueId(2)), d};
  c10::IValue packed =
      packOutputs(t, {c10::IValue(int64_t{1}), c10::IValue(int64_t{2}), c10::IValue(int64_t{3})});
  ASSERT_TRUE(packed.isTuple());
  const auto& elems = packed.toTupleRef().elements();
  EXPECT_EQ(elems[0].toInt(), 1);
  auto dict = elems[1].toGenericDict();
  EXPECT_EQ(dict.at("loss").toInt(), 2);
  EXPECT_EQ(dict.at("logits").toInt(), 3);
}

// Issue 15 finding 3: an error inside the TorchScript interpreter (here a bf16 input into an f32
// matmul, as apc-train --compare-single met under mixed precision) is reported by its cause, not
// by the interpreter's opening sentence.
TEST(FirstLine, TorchScriptInterpreterErrorsShowTheirCause) {
  auto cu = torch::jit::compile("def f(x, w):\n    return torch.mm(x, w)\n");
  std::string what;
  try {
    cu->run_method("f", torch::ones({2, 2}, torch::kBFloat16), torch::ones({2, 2}));
  } catch (const std::exception& e) {
    what = e.what();
  }
  ASSERT_EQ(what.rfind("The following operation failed in the TorchScript interpreter", 0), 0u)
      << what;
  std::string line = firstLine(what);
  EXPECT_EQ(line.find("The following operation failed"), std::string::npos) << line;
  EXPECT_NE(line.find("Error: "), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(firstLine("plain message\nmore"), "plain message");
}

}  // namespace
}  // namespace apc::runtime::interpreter_test
