//===- tests/baselines/baselines_test.cpp - Baseline pins ------------------===//
//
// The placements each baseline gives the parameters of the sample models, written from the rules
// of apc/solver/baselines.h (not from a run): DDP replicates, FSDP shards every parameter on every
// mesh dim, Megatron TP shards column-parallel linears on dim 0 and row-parallel ones on dim 1 on
// the last mesh dim, FSDP+TP adds FSDP on the other mesh dims. Also the names, the batch placement
// helper, and that applyBaseline pins exactly the parameters and drops the memory bound.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <tuple>

#include "apc/solver/baselines.h"
#include "samples.h"

namespace apc::solver {
namespace {

using baselines_test::buildProblem;
using baselines_test::sampleGraph;
using mesh::Placement;
using mesh::PlacementTuple;

const Placement R = Placement::replicate();
Placement S(int d) {
  return Placement::shard(d);
}

mesh::DeviceMesh meshOf(const char* text) {
  return *mesh::DeviceMesh::parse(text);
}

std::map<std::string, PlacementTuple> placements(const char* sample, Baseline b,
                                                 const char* mesh_text) {
  const auto& g = sampleGraph(sample);
  EXPECT_TRUE(g.ok()) << g.error().message();
  if (!g.ok()) return {};
  auto p = baselineParameterPlacements(*g, b, meshOf(mesh_text));
  EXPECT_TRUE(p.ok()) << p.error().message();
  return p.ok() ? *p : std::map<std::string, PlacementTuple>{};
}

TEST(Baselines, NamesRoundTrip) {
  for (Baseline b : allBaselines()) {
    auto parsed = parseBaseline(baselineName(b));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, b);
  }
  EXPECT_EQ(std::string(baselineName(Baseline::kFsdpTp)), "fsdp+tp");
  EXPECT_EQ(*parseBaseline("FSDP"), Baseline::kFsdp);
  EXPECT_EQ(*parseBaseline("zero3"), Baseline::kFsdp);
  auto bad = parseBaseline("pipeline");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("ddp, fsdp, tp, fsdp+tp"), std::string::npos);
  EXPECT_FALSE(baselineApplies(Baseline::kFsdpTp, 1));
  EXPECT_TRUE(baselineApplies(Baseline::kFsdpTp, 2));
  EXPECT_TRUE(baselineApplies(Baseline::kTp, 1));
}

TEST(Baselines, DdpReplicatesEverything) {
  for (const char* m : {"8", "2x4"})
    for (const auto& [name, p] : placements("llama_tiny", Baseline::kDdp, m))
      EXPECT_EQ(p, mesh::replicated(meshOf(m).ndim())) << name;
}

TEST(Baselines, FsdpShardsEveryParameterOnItsLargestDim) {
  // On 8 ranks: every llama_tiny parameter has dim 0 divisible by 8 (64, 32, 160, 256), so dim 0.
  auto p = placements("llama_tiny", Baseline::kFsdp, "8");
  ASSERT_EQ(p.size(), 21u);
  for (const auto& [name, t] : p) EXPECT_EQ(t, (PlacementTuple{S(0)})) << name;
  // On 8x8 (64 pieces): wk [32,64] has dim 0 not divisible by 64, so its largest dim 1 is cut on
  // both mesh dims; wq [64,64] keeps dim 0; the norm weight [64] is cut 64 ways; w1 [160,64]: 160
  // is not divisible by 64; its largest dim 0 gives 20 rows per piece on the first mesh dim, which
  // the second cuts into 3,3,3,3,3,3,2,0 (an empty piece), so dim 1 (64 -> 8 per piece) there.
  auto q = placements("llama_tiny", Baseline::kFsdp, "8x8");
  EXPECT_EQ(q.at("layers.0.attention.wk.weight"), (PlacementTuple{S(1), S(1)}));
  EXPECT_EQ(q.at("layers.0.attention.wq.weight"), (PlacementTuple{S(0), S(0)}));
  EXPECT_EQ(q.at("layers.0.attention_norm.weight"), (PlacementTuple{S(0), S(0)}));
  EXPECT_EQ(q.at("layers.0.feed_forward.w1.weight"), (PlacementTuple{S(0), S(1)}));
  // gpt2_tiny on 8x8: a [48] bias cuts into 8 pieces of 6 but not into 64: S(0) on the first mesh
  // dim only. c_attn.weight [144,48]: 144 % 64 != 0, so the largest dim (0) first: 18 rows per
  // piece on the first mesh dim, which the second would cut into 3,3,3,3,3,3,0,0, so dim 1 there.
  auto r = placements("gpt2_tiny", Baseline::kFsdp, "8x8");
  EXPECT_EQ(r.at("transformer.h.0.attn.c_proj.bias"), (PlacementTuple{S(0), R}));
  EXPECT_EQ(r.at("transformer.h.0.attn.c_attn.weight"), (PlacementTuple{S(0), S(1)}));
}

TEST(Baselines, MegatronRolesFromStructure) {
  const auto& g = sampleGraph("llama_tiny");
  ASSERT_TRUE(g.ok()) << g.error().message();
  auto roles = megatronRoles(*g);
  for (const char* l : {"layers.0.", "layers.1."}) {
    std::string p = l;
    for (const char* col :
         {"attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"})
      EXPECT_EQ(roles.at(p + col + ".weight"), TpRole::kColumnWeight) << p + col;
    for (const char* row : {"attention.wo", "feed_forward.w2"})
      EXPECT_EQ(roles.at(p + row + ".weight"), TpRole::kRowWeight) << p + row;
    EXPECT_EQ(roles.at(p + "attention_norm.weight"), TpRole::kNone);
  }
  EXPECT_EQ(roles.at("tok_embeddings.weight"), TpRole::kEmbeddingVocab);
  EXPECT_EQ(roles.at("output.weight"), TpRole::kColumnWeight);  // the lm head reads the stream
  EXPECT_EQ(roles.at("norm.weight"), TpRole::kNone);

  // GPT-2: linears with biases; the lm head is tied to the embedding (one parameter, first use).
  const auto& h = sampleGraph("gpt2_tiny");
  ASSERT_TRUE(h.ok()) << h.error().message();
  auto gr = megatronRoles(*h);
  const std::string b = "transformer.h.1.";
  EXPECT_EQ(gr.at(b + "attn.c_attn.weight"), TpRole::kColumnWeight);
  EXPECT_EQ(gr.at(b + "attn.c_attn.bias"), TpRole::kColumnBias);
  EXPECT_EQ(gr.at(b + "attn.c_proj.weight"), TpRole::kRowWeight);
  EXPECT_EQ(gr.at(b + "attn.c_proj.bias"), TpRole::kRowBias);
  EXPECT_EQ(gr.at(b + "mlp.c_fc.weight"), TpRole::kColumnWeight);
  EXPECT_EQ(gr.at(b + "mlp.c_proj.weight"), TpRole::kRowWeight);
  EXPECT_EQ(gr.at(b + "ln_1.weight"), TpRole::kNone);
  EXPECT_EQ(gr.at("transformer.wte.weight"), TpRole::kEmbeddingVocab);
  EXPECT_EQ(gr.at("transformer.wpe.weight"), TpRole::kEmbeddingVocab);

  // Two linears without a residual: up column, down row.
  const auto& t = sampleGraph("toy_block");
  ASSERT_TRUE(t.ok()) << t.error().message();
  auto tr = megatronRoles(*t);
  EXPECT_EQ(tr.at("up.weight"), TpRole::kColumnWeight);
  EXPECT_EQ(tr.at("down.weight"), TpRole::kRowWeight);
}

TEST(Baselines, TpShardsOnTheLastMeshDim) {
  auto p = placements("llama_tiny", Baseline::kTp, "2x4");
  for (const char* col : {"wq", "wk", "wv"})
    EXPECT_EQ(p.at(std::string("layers.0.attention.") + col + ".weight"), (PlacementTuple{R, S(0)}))
        << col;
  for (const char* col : {"w1", "w3"})
    EXPECT_EQ(p.at(std::string("layers.1.feed_forward.") + col + ".weight"),
              (PlacementTuple{R, S(0)}))
        << col;
  EXPECT_EQ(p.at("layers.0.attention.wo.weight"), (PlacementTuple{R, S(1)}));
  EXPECT_EQ(p.at("layers.1.feed_forward.w2.weight"), (PlacementTuple{R, S(1)}));
  EXPECT_EQ(p.at("tok_embeddings.weight"), (PlacementTuple{R, S(0)}));
  EXPECT_EQ(p.at("output.weight"), (PlacementTuple{R, S(0)}));
  EXPECT_EQ(p.at("layers.0.ffn_norm.weight"), (PlacementTuple{R, R}));
  // Biases: column S(0), row R.
  auto q = placements("gpt2_tiny", Baseline::kTp, "8");
  EXPECT_EQ(q.at("transformer.h.0.mlp.c_fc.bias"), (PlacementTuple{S(0)}));
  EXPECT_EQ(q.at("transformer.h.0.mlp.c_proj.bias"), (PlacementTuple{R}));
  EXPECT_EQ(q.at("transformer.h.0.mlp.c_proj.weight"), (PlacementTuple{S(1)}));
  // Too small to cut: multi_output's head has 10 classes; as a row-parallel linear (it reads the
  // column-parallel proj's output) it is cut on its 32 input features, 4 per rank.
  auto r = placements("multi_output", Baseline::kTp, "8");
  EXPECT_EQ(r.at("proj.weight"), (PlacementTuple{S(0)}));
  EXPECT_EQ(r.at("head.weight"), (PlacementTuple{S(1)}));
  // cnn_small: convolutions and batch norms stay R; the classifier [10,64] is column-parallel, but
  // 10 rows over 8 ranks leave empty pieces (2,2,2,2,2,0,0,0): R.
  for (const auto& [name, t] : placements("cnn_small", Baseline::kTp, "8"))
    EXPECT_EQ(t, (PlacementTuple{R})) << name;
}

TEST(Baselines, FsdpPlusTpShardsTheFirstMeshDimToo) {
  auto p = placements("llama_tiny", Baseline::kFsdpTp, "2x4");
  // Column weights: dim 0 nested (divisible by 2*4); row weights: tp on dim 1, fsdp on dim 0.
  EXPECT_EQ(p.at("layers.0.attention.wq.weight"), (PlacementTuple{S(0), S(0)}));
  EXPECT_EQ(p.at("layers.0.feed_forward.w1.weight"), (PlacementTuple{S(0), S(0)}));
  EXPECT_EQ(p.at("layers.0.attention.wo.weight"), (PlacementTuple{S(0), S(1)}));
  EXPECT_EQ(p.at("layers.0.feed_forward.w2.weight"), (PlacementTuple{S(0), S(1)}));
  EXPECT_EQ(p.at("layers.0.ffn_norm.weight"), (PlacementTuple{S(0), R}));
  EXPECT_EQ(p.at("tok_embeddings.weight"), (PlacementTuple{S(0), S(0)}));
  auto m = meshOf("8");
  const auto& g = sampleGraph("llama_tiny");
  ASSERT_TRUE(g.ok());
  auto bad = baselineParameterPlacements(*g, Baseline::kFsdpTp, m);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("fsdp+tp"), std::string::npos);
}

TEST(Baselines, DataParallelInput) {
  ir::TensorMeta tokens{ir::makeShape({8, 128}), ir::DType::kI64, false};
  auto m24 = meshOf("2x4");
  EXPECT_EQ(dataParallelInput(tokens, m24, Baseline::kDdp), (PlacementTuple{S(0), S(0)}));
  EXPECT_EQ(dataParallelInput(tokens, m24, Baseline::kFsdp), (PlacementTuple{S(0), S(0)}));
  EXPECT_EQ(dataParallelInput(tokens, m24, Baseline::kTp), (PlacementTuple{R, R}));
  EXPECT_EQ(dataParallelInput(tokens, m24, Baseline::kFsdpTp), (PlacementTuple{S(0), R}));
  // A batch of 8 on 8x8 cuts on the first mesh dim only.
  EXPECT_EQ(dataParallelInput(tokens, meshOf("8x8"), Baseline::kDdp), (PlacementTuple{S(0), R}));
  ir::TensorMeta scalar{ir::makeShape({}), ir::DType::kF32, false};
  EXPECT_EQ(dataParallelInput(scalar, m24, Baseline::kDdp), (PlacementTuple{R, R}));
}

TEST(Baselines, ApplyPinsParametersAndDropsTheMemoryBound) {
  const auto& g = sampleGraph("toy_block");
  ASSERT_TRUE(g.ok()) << g.error().message();
  auto m = meshOf("2x4");
  auto gp = buildProblem(
      *g, m, [&](const ir::TensorMeta& t) { return dataParallelInput(t, m, Baseline::kFsdpTp); });
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  ASSERT_TRUE(gp->problem.memory.has_value());
  auto bgp = applyBaseline(*gp, *g, Baseline::kFsdpTp, m);
  ASSERT_TRUE(bgp.ok()) << bgp.error().message();
  EXPECT_FALSE(bgp->problem.memory.has_value());
  size_t pinned = 0;
  for (size_t i = 0; i < bgp->problem.nodes.size(); ++i) {
    const ProblemNode& n = bgp->problem.nodes[i];
    bool is_param = bgp->graph_nodes[i].valid() &&
                    g->node(bgp->graph_nodes[i]).kind == ir::NodeKind::kParameter;
    if (is_param) {
      ASSERT_TRUE(n.pinned.has_value()) << n.name;
      EXPECT_EQ(n.pin_group, "baseline");
      ++pinned;
    } else if (n.pinned) {
      EXPECT_EQ(n.pin_group, "inputs") << n.name;
    }
  }
  EXPECT_EQ(pinned, 2u);
  auto s = solveGraphProblem(*bgp);
  ASSERT_TRUE(s.ok()) << s.error().message();
  // up [4096,1024] S(0)S(0) and down [1024,4096] S(0)S(1): every weight cut 8 ways.
  EXPECT_NEAR(memoryFraction(*bgp, s->choice), 1.0 / 8, 1e-12);
  // The pinned placements are the chosen ones.
  for (size_t i = 0; i < bgp->problem.nodes.size(); ++i) {
    if (bgp->problem.nodes[i].pin_group == "baseline") {
      EXPECT_EQ(s->choice[i], *bgp->problem.nodes[i].pinned);
    }
  }
  // A problem of another mesh is refused.
  auto other = applyBaseline(*gp, *g, Baseline::kDdp, meshOf("8"));
  EXPECT_FALSE(other.ok());
}

// DDP and FSDP compute on batch shards: every op whose output carries the batch is S(0) on the
// data-parallel mesh dims in the solved baseline (issue: a ddp plan of llama_tiny used to gather
// the batch and compute R,R -> R with replicated weights, which is not DDP). fsdp+tp keeps the
// batch cut on its first mesh dim only.
TEST(Baselines, DataParallelBaselinesComputeOnBatchShards) {
  const auto& g = sampleGraph("llama_tiny");
  ASSERT_TRUE(g.ok()) << g.error().message();
  std::vector<bool> carries = batchCarryingValues(*g);
  for (auto [b, mesh_text, dp_dims] :
       {std::tuple{Baseline::kDdp, "4", size_t{1}}, std::tuple{Baseline::kFsdp, "2x2", size_t{2}},
        std::tuple{Baseline::kFsdpTp, "2x2", size_t{1}}}) {
    SCOPED_TRACE(baselineName(b));
    auto m = meshOf(mesh_text);
    const Baseline baseline = b;  // clang 14 cannot capture a structured binding
    auto gp = buildProblem(
        *g, m, [&](const ir::TensorMeta& t) { return dataParallelInput(t, m, baseline); });
    ASSERT_TRUE(gp.ok()) << gp.error().message();
    auto bgp = applyBaseline(*gp, *g, b, m);
    ASSERT_TRUE(bgp.ok()) << bgp.error().message();
    auto s = solveGraphProblem(*bgp);
    ASSERT_TRUE(s.ok()) << s.error().message();
    int linears = 0;
    for (size_t i = 0; i < bgp->problem.nodes.size(); ++i) {
      if (!bgp->graph_nodes[i].valid()) continue;
      const ir::Node& n = g->node(bgp->graph_nodes[i]);
      if (n.op != "aten::linear") continue;
      ASSERT_TRUE(carries[n.outputs[0].v]) << n.module_path;
      const auto& out = bgp->strategies[i][s->choice[i]].outputs[0];
      ASSERT_TRUE(out.has_value());
      for (size_t j = 0; j < dp_dims; ++j)
        EXPECT_TRUE((*out)[j].isShard(0)) << n.module_path << " " << mesh::toString(*out);
      ++linears;
    }
    EXPECT_GE(linears, 14);  // 2 layers x 7 projections + the output head
  }
}

// GPT-2's position ids are arange(T) of a size read off the input ([64], a multiple of the batch
// of 8): they and the position embedding are the same on every rank, so the ddp plan replicates
// them (before, it split them by the batch rule and all-gathered the embedding every step), while
// the token embedding, read with the input's ids, carries the batch.
TEST(Baselines, ValuesComputedFromAnInputsSizeDoNotCarryTheBatch) {
  const auto& g = sampleGraph("gpt2_tiny");
  ASSERT_TRUE(g.ok()) << g.error().message();
  std::vector<bool> carries = batchCarryingValues(*g);
  int aranges = 0, embeddings = 0;
  for (const ir::Node& n : g->nodes()) {
    if (n.op == "aten::arange" || n.op == "aten::arange.start") {
      ++aranges;
      EXPECT_FALSE(carries[n.outputs[0].v]) << n.op;
    }
    if (n.op == "aten::embedding") {
      ++embeddings;
      EXPECT_EQ(carries[n.outputs[0].v], n.module_path == "transformer.wte") << n.module_path;
    }
  }
  EXPECT_GE(aranges, 1);
  EXPECT_EQ(embeddings, 2);
  // Through a list of tensors the batch still flows: llama_tiny's rotary halves, concatenated
  // from a prim::ListConstruct of q's and k's pieces.
  const auto& llama = sampleGraph("llama_tiny");
  ASSERT_TRUE(llama.ok()) << llama.error().message();
  std::vector<bool> llama_carries = batchCarryingValues(*llama);
  int cats = 0;
  for (const ir::Node& n : llama->nodes()) {
    if (n.op != "aten::cat") continue;
    ++cats;
    EXPECT_TRUE(llama_carries[n.outputs[0].v]) << n.module_path;
  }
  EXPECT_GE(cats, 2);
}

}  // namespace
}  // namespace apc::solver
