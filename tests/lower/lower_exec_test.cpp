//===- tests/lower/lower_exec_test.cpp - Lowered programs against the unsharded model ===//
//
// The oracle of lib/lower. For toy_block, mlp_stack, gpt2_tiny, llama_tiny and cnn_small on the
// meshes [4], [2,2] and [2,4]: plan in-process (lib/planner's pipeline), lower every rank, check
// the programs' form (program_checks.h) and that lowering is deterministic, then execute all ranks'
// programs in ONE process, node by node in lockstep: op nodes run per rank through the JIT
// operator registry (runtime::OpKernel, as the runtime does), redistribute nodes run their
// forward steps on the simulated collectives of tests/strategy_validator/sim_ranks.h, and nodes
// with a local graph without collectives (proto::OpCollective without mesh dims: a vocab-parallel
// embedding's masked lookup) run it through the runtime's OpCollectiveRunner. Inputs, parameters
// and buffers are random full tensors (float64) sliced by each rank's ProgramTensor pieces; every
// output leaf of every rank must be its piece of the unsharded graph's output (the imported graph
// interpreted by the same op runner).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <torch/csrc/autograd/autograd.h>

#include <map>
#include <memory>

#include "apc/frontend/torchscript.h"
#include "apc/ir/proto_io.h"
#include "apc/ir/torch_dtype.h"
#include "apc/lower/lower.h"
#include "apc/planner/pipeline.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/op_collective.h"
#include "program_checks.h"
#include "sim_ranks.h"

namespace apc::lower {
namespace {

using validator::RankTensors;

/// The dtype a value runs in here: floats widened to f64 (the comparison is in f64), the rest
/// as the graph says.
c10::ScalarType widened(ir::DType d) {
  c10::ScalarType t = scalarTypeOf(d);
  return at::isFloatingType(t) ? at::kDouble : t;
}

c10::TypeKind argKind(const c10::Argument& arg) {
  c10::TypePtr t = arg.real_type();
  if (t->kind() == c10::TypeKind::OptionalType)
    t = t->expectRef<c10::OptionalType>().getElementType();
  return t->kind();
}

/// A non-tensor constant as the schema argument wants it; floating ScalarTypes become f64 and
/// devices the CPU (the importer records "meta" for devices read off a tensor).
c10::IValue toIValue(const ir::Constant& c, const c10::Argument* arg) {
  c10::TypeKind kind = arg ? argKind(*arg) : c10::TypeKind::AnyType;
  if (std::holds_alternative<ir::None>(c)) return {};
  if (const auto* i = std::get_if<int64_t>(&c)) {
    if (kind == c10::TypeKind::FloatType) return c10::IValue(static_cast<double>(*i));
    if (kind == c10::TypeKind::ScalarTypeType) {
      auto st = static_cast<c10::ScalarType>(*i);
      if (st == at::kFloat || st == at::kHalf || st == at::kBFloat16)
        return c10::IValue(static_cast<int64_t>(at::kDouble));
    }
    return c10::IValue(*i);
  }
  if (const auto* d = std::get_if<double>(&c)) return c10::IValue(*d);
  if (const auto* b = std::get_if<bool>(&c)) return c10::IValue(*b);
  if (const auto* s = std::get_if<std::string>(&c)) {
    if (kind == c10::TypeKind::DeviceObjType) return c10::IValue(c10::Device(c10::kCPU));
    return c10::IValue(*s);
  }
  if (const auto* l = std::get_if<std::vector<int64_t>>(&c)) return c10::IValue(*l);
  if (const auto* l = std::get_if<std::vector<double>>(&c)) return c10::IValue(*l);
  const auto& bl = std::get<std::vector<bool>>(c);
  c10::List<bool> list;
  for (bool b : bl) list.push_back(b);
  return c10::IValue(list);
}

/// A node's operator as the runtime runs it (by name and overload; the structural prim ops and
/// apc's own aten::einsum.operands by hand).
using Kernel = runtime::OpKernel;

/// The kernel of `n` (its output type types an empty prim::ListConstruct).
Expected<Kernel> kernelOf(const ir::Graph& g, const ir::Node& n) {
  return Kernel::resolve(n, n.outputs.empty() ? ir::ValueType::kOther : g.value(n.outputs[0]).type);
}

/// The values of one (simulated) rank's graph.
struct Store {
  const ir::Graph* g = nullptr;
  std::vector<std::optional<c10::IValue>> v;
};

/// The argument stack of an op node.
std::vector<c10::IValue> argsOf(const Store& s, const ir::Node& n, const Kernel& k) {
  std::vector<c10::IValue> args;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ir::Value& v = s.g->value(n.inputs[i]);
    if (s.v[v.id.v]) {
      args.push_back(*s.v[v.id.v]);
    } else if (v.constant) {
      const c10::Argument* a =
          k.schema() && i < k.schema()->arguments().size() ? &k.schema()->arguments()[i] : nullptr;
      if (v.tensor) {
        at::TensorOptions o = at::TensorOptions().dtype(widened(v.tensor->dtype));
        c10::IValue iv = toIValue(*v.constant, nullptr);
        args.emplace_back(iv.isDouble() ? at::scalar_tensor(iv.toDouble(), o)
                          : iv.isInt()  ? at::scalar_tensor(iv.toInt(), o)
                          : iv.isBool() ? at::scalar_tensor(iv.toBool(), o)
                                        : at::zeros({}, o));
      } else {
        args.push_back(toIValue(*v.constant, a));
      }
    } else {
      ADD_FAILURE() << "value %" << v.debug_name << " has no value";
      args.emplace_back();
    }
  }
  return args;
}

/// The exclusive bound of an integer input's values: the rows of the embedding it indexes.
int64_t integerBound(const ir::Graph& g, ir::ValueId v) {
  int64_t bound = 1 << 30;
  for (const ir::Node& n : g.nodes())
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (n.inputs[i] == v && n.op == "aten::embedding" && i == 1)
        bound = std::min(bound, g.value(n.inputs[0]).tensor->shape[0].size);
  return bound == (1 << 30) ? 8 : bound;
}

at::Tensor randomFull(const ir::Graph& g, const ir::Value& v, const std::string& name,
                      at::Generator& gen) {
  std::vector<int64_t> sizes = ir::hintSizes(v.tensor->shape);
  c10::ScalarType dt = widened(v.tensor->dtype);
  if (dt == at::kDouble) {
    at::Tensor t = at::randn(sizes, gen, at::TensorOptions().dtype(dt));
    if (name.find("running_var") != std::string::npos) return t.abs() + 0.5;
    return t * 0.5;
  }
  if (dt == at::kBool) return at::randint(0, 2, sizes, gen, at::kLong).to(at::kBool);
  return at::randint(0, integerBound(g, v.id), sizes, gen, at::TensorOptions().dtype(dt));
}

at::Tensor sliceOf(const at::Tensor& full, const proto::ProgramTensor& t) {
  std::vector<layout::DimPiece> piece;
  for (const proto::Piece& p : t.local()) piece.push_back({p.offset(), p.size()});
  return validator::slicePiece(full, piece).contiguous().clone();
}

cost::StepKind stepKind(proto::StepKind k) {
  auto kind = artifact::stepKindFromProto(k);
  EXPECT_TRUE(kind.ok()) << kind.error().message();
  return kind.ok() ? *kind : cost::StepKind::kAllGather;
}

cost::RedistributionStep stepOf(const proto::RedistStep& p, const mesh::DeviceMesh& mesh) {
  cost::RedistributionStep s;
  s.kind = stepKind(p.kind());
  s.mesh_dim = p.mesh_dim();
  s.group_size = mesh.size(p.mesh_dim());
  s.gather_dim = p.gather_dim();
  s.shard_dim = p.shard_dim();
  if (p.reduce_op() != proto::REDUCE_OP_UNSET)
    s.reduce_op = *artifact::reduceOpFromProto(p.reduce_op());
  s.before = testing::tupleOf(p.before());
  s.after = testing::tupleOf(p.after());
  return s;
}

/// The program's graph as an ir::Graph (redistribute nodes become ops named apc::redistribute).
ir::Graph graphOf(const proto::Program& p) {
  proto::Graph pg = p.graph();
  for (auto& n : *pg.mutable_nodes())
    if (n.kind() == "redistribute") n.set_kind("op");
  auto g = ir::deserializeGraph(pg.SerializeAsString());
  EXPECT_TRUE(g.ok()) << g.error().message();
  return g.ok() ? std::move(g).value() : ir::Graph();
}

struct Case {
  std::string model;
  std::vector<int64_t> mesh;
  std::string label;                                      // test name suffix for pinned cases
  std::vector<std::pair<std::string, std::string>> pins;  // node name -> placement text
  std::string first_input;                                // placement of the first input, or ""
};

std::string caseName(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.model;
  for (int64_t d : info.param.mesh) s += "_" + std::to_string(d);
  return info.param.label.empty() ? s : s + "_" + info.param.label;
}

class LowerExec : public ::testing::TestWithParam<Case> {};

TEST_P(LowerExec, ShardedForwardMatchesUnsharded) {
  const Case& c = GetParam();
  std::string path = std::string(APC_SOURCE_DIR) + "/sample_models/out/" + c.model + ".pt";
  // Small inputs (the system LibTorch has reference BLAS): batch <= 4, sequence / rows <= 16.
  auto recorded = frontend::recordedInputs(path);
  ASSERT_TRUE(recorded.ok()) << recorded.error().message();
  frontend::ImportOptions options;
  for (frontend::InputSpec in : *recorded) {
    if (!in.shape.empty()) in.shape[0].size = std::min<int64_t>(in.shape[0].size, 4);
    if (in.shape.size() == 2 || in.shape.size() == 3)
      in.shape[1].size = std::min<int64_t>(in.shape[1].size, 16);
    options.inputs.push_back(in);
  }
  auto imported = frontend::importTorchScript(path, options);
  ASSERT_TRUE(imported.ok()) << imported.error().message();
  const ir::Graph& g = *imported;

  spec::Spec spec;
  spec.mesh = *mesh::DeviceMesh::create(c.mesh);
  for (const auto& [name, text] : c.pins)
    spec.pins.push_back({spec::Pin::Target::kNode, name, *mesh::parsePlacementTuple(text)});
  if (c.label == "mp") {
    spec.mixed_precision.param_dtype = ir::DType::kBF16;
    spec.mixed_precision.reduce_dtype = ir::DType::kF32;
  }
  if (!c.first_input.empty())
    spec.inputs[recorded->front().name] = *mesh::parsePlacementTuple(c.first_input);
  plan::PlanSource source;
  source.model_path = path;
  source.model_name = g.name;
  source.model_sha256 = std::string(64, '0');
  source.inputs = plan::inputShapes(g);
  auto built = plan::buildProblem(g, spec);
  ASSERT_TRUE(built.ok()) << built.error().message();
  auto result = plan::solveAndPlan(g, *built, spec, source, {});
  if (!result.ok()) {  // a budget too tight for the mesh (cnn_small): allow replication
    spec.memory_budget.high = 1.0;
    built = plan::buildProblem(g, spec);
    ASSERT_TRUE(built.ok()) << built.error().message();
    result = plan::solveAndPlan(g, *built, spec, source, {});
  }
  ASSERT_TRUE(result.ok()) << result.error().message();
  const plan::Plan& p = result->plan;

  auto programs = lowerPlan(g, p);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  testing::checkPrograms(g, p, *programs);
  if (c.label == "vocab") {  // the pinned vocab-parallel embedding runs as its local graph
    for (const proto::Program& prog : *programs) {
      size_t lookups = 0;
      for (const proto::OpCollective& oc : prog.op_collectives()) {
        ASSERT_LT(oc.node(), static_cast<uint32_t>(prog.graph().nodes_size()));
        if (prog.graph().nodes(static_cast<int>(oc.node())).op() != "aten::embedding") continue;
        EXPECT_EQ(oc.mesh_dims_size(), 0) << "rank " << prog.rank();
        bool masked = false, looks_up = false;
        for (const auto& ln : oc.local().nodes()) {
          masked = masked || (ln.op() == "aten::masked_fill" && ln.overload() == "Scalar");
          looks_up = looks_up || ln.op() == "aten::embedding";
        }
        EXPECT_TRUE(masked && looks_up) << "rank " << prog.rank();
        ++lookups;
      }
      EXPECT_GT(lookups, 0u) << "rank " << prog.rank();
    }
  }
  if (c.label == "partial") {  // the Partial output is all-reduced by the last node
    const proto::Program& prog = programs->front();
    int last = prog.graph().nodes_size() - 1;
    ASSERT_GT(prog.node_redistribution(last), 0u);
    const auto& red = prog.redistributions(static_cast<int>(prog.node_redistribution(last) - 1));
    bool partial = false;
    for (const mesh::Placement& f : testing::tupleOf(red.from()))
      partial = partial || f.isPartial();
    EXPECT_TRUE(partial) << red.edge();
    EXPECT_EQ(red.forward(0).kind(), proto::ALL_REDUCE);
  }
  auto again = lowerPlan(g, p);
  ASSERT_TRUE(again.ok());
  for (size_t r = 0; r < programs->size(); ++r)
    EXPECT_EQ((*programs)[r].SerializeAsString(), (*again)[r].SerializeAsString()) << "rank " << r;

  // Random full inputs, parameters and buffers.
  at::Generator gen = at::detail::createCPUGenerator(1234);
  std::map<std::string, at::Tensor> full;  // by input / parameter / buffer name
  Store ref{&g, std::vector<std::optional<c10::IValue>>(g.numValues())};
  for (const ir::Node& n : g.nodes()) {
    if (n.kind == ir::NodeKind::kOp) continue;
    const ir::Value& v = g.value(n.outputs.at(0));
    ASSERT_TRUE(v.tensor) << n.name;
    full[n.name] = randomFull(g, v, n.name, gen);
    at::Tensor leaf = full[n.name].clone();
    if (n.kind == ir::NodeKind::kParameter && leaf.is_floating_point()) leaf.requires_grad_(true);
    ref.v[v.id.v] = leaf;
  }
  // The unsharded reference.
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kOp) continue;
    bool known = g.isShapeNode(n.id);  // size arithmetic known at import: its consumers read it
    for (ir::ValueId o : n.outputs) known = known && g.value(o).constant.has_value();
    if (known) continue;
    auto k = kernelOf(g, n);
    ASSERT_TRUE(k.ok()) << k.error().message();
    auto out = k->run(argsOf(ref, n, *k), n.outputs.size());
    ASSERT_TRUE(out.ok()) << out.error().message();
    for (size_t j = 0; j < n.outputs.size(); ++j) ref.v[n.outputs[j].v] = (*out)[j];
  }

  // Every rank in lockstep.
  const mesh::DeviceMesh& mesh = p.spec.mesh;
  const size_t world = programs->size();
  std::vector<ir::Graph> graphs;
  std::vector<Store> ranks;
  for (const proto::Program& prog : *programs) graphs.push_back(graphOf(prog));
  for (size_t r = 0; r < world; ++r)
    ranks.push_back({&graphs[r], std::vector<std::optional<c10::IValue>>(graphs[r].numValues())});
  const size_t num_nodes = graphs[0].numNodes();
  for (size_t r = 0; r < world; ++r) ASSERT_EQ(graphs[r].numNodes(), num_nodes);
  std::map<std::string, Kernel> kernels;
  size_t collectives = 0;
  struct Cut {  // a redistribute node: autograd stops at its output leaves
    size_t node;
    RankTensors in, out;
  };
  std::vector<Cut> cuts;
  for (size_t i = 0; i < num_nodes; ++i) {
    const ir::NodeId id(static_cast<uint32_t>(i));
    const ir::Node& n0 = graphs[0].node(id);
    if (n0.kind != ir::NodeKind::kOp) {
      for (size_t r = 0; r < world; ++r) {
        const proto::Program& prog = (*programs)[r];
        const ir::Node& n = graphs[r].node(id);
        auto* list = n.kind == ir::NodeKind::kInput       ? &prog.inputs()
                     : n.kind == ir::NodeKind::kParameter ? &prog.parameters()
                                                          : &prog.buffers();
        for (const proto::ProgramTensor& t : *list)
          if (t.value() == n.outputs[0].v) {
            at::Tensor local = sliceOf(full.at(n.name), t);
            if (n.kind == ir::NodeKind::kParameter && local.is_floating_point())
              local.requires_grad_(true);
            ranks[r].v[t.value()] = local;
          }
        ASSERT_TRUE(ranks[r].v[n.outputs[0].v]) << n.name;
      }
      continue;
    }
    if (n0.op == kRedistributeOp) {
      RankTensors locals, inputs;
      for (size_t r = 0; r < world; ++r) {
        inputs.push_back(ranks[r].v[graphs[r].node(id).inputs[0].v]->toTensor());
        locals.push_back(inputs.back().detach());
      }
      const uint32_t ri = (*programs)[0].node_redistribution(static_cast<int>(i));
      ASSERT_GT(ri, 0u);
      const proto::Redistribution& red = (*programs)[0].redistributions(static_cast<int>(ri - 1));
      for (const proto::RedistStep& st : red.forward()) {
        Status s = validator::executeStep(locals, stepOf(st, mesh), mesh);
        ASSERT_TRUE(s.ok()) << s.error().message();
        ++collectives;
      }
      for (size_t r = 0; r < world; ++r) {
        const ir::Node& n = graphs[r].node(id);
        const proto::Redistribution& rr = (*programs)[r].redistributions(static_cast<int>(ri - 1));
        if (rr.forward_size() > 0) {
          EXPECT_EQ(std::vector<int64_t>(locals[r].sizes().begin(), locals[r].sizes().end()),
                    testing::sizesOf(rr.forward(rr.forward_size() - 1).local_out()))
              << rr.edge() << " rank " << r;
        }
        ranks[r].v[n.outputs[0].v] = locals[r].contiguous().clone();
        if (red.requires_grad()) ranks[r].v[n.outputs[0].v]->toTensor().requires_grad_(true);
      }
      if (red.requires_grad()) {
        RankTensors outs;
        for (size_t r = 0; r < world; ++r)
          outs.push_back(ranks[r].v[graphs[r].node(id).outputs[0].v]->toTensor());
        cuts.push_back({i, inputs, outs});
      }
      continue;
    }
    for (size_t r = 0; r < world; ++r) {
      const ir::Node& n = graphs[r].node(id);
      // By op and output type: an empty prim::ListConstruct's list is typed by its output.
      const std::string key =
          n.qualifiedOp() + "/" +
          (n.outputs.empty() ? "" : ir::valueTypeName(graphs[r].value(n.outputs[0]).type));
      auto it = kernels.find(key);
      if (it == kernels.end()) {
        auto k = kernelOf(graphs[r], n);
        ASSERT_TRUE(k.ok()) << k.error().message();
        it = kernels.emplace(key, *k).first;
      }
      std::vector<c10::IValue> args = argsOf(ranks[r], n, it->second);
      // A node that runs as its local graph (proto::OpCollective) runs it, as the runtime does.
      const proto::OpCollective* oc = nullptr;
      for (const proto::OpCollective& o : (*programs)[r].op_collectives())
        if (o.node() == i) oc = &o;
      Expected<std::vector<c10::IValue>> out = std::vector<c10::IValue>{};
      if (oc) {
        ASSERT_EQ(oc->mesh_dims_size(), 0)
            << "rank " << r << " node " << i << ": an op collective is not simulated here";
        auto local = ir::deserializeGraph(oc->local().SerializeAsString());
        ASSERT_TRUE(local.ok()) << local.error().message();
        auto runner = runtime::OpCollectiveRunner::create(std::move(local).value(), n.inputs.size(),
                                                          n.outputs.size());
        ASSERT_TRUE(runner.ok()) << runner.error().message();
        out = runner->run(args, [](size_t, const at::Tensor& t) { return t; });
      } else {
        out = it->second.run(std::move(args), n.outputs.size());
      }
      ASSERT_TRUE(out.ok()) << "rank " << r << " node " << i << ": " << out.error().message();
      for (size_t j = 0; j < n.outputs.size(); ++j) ranks[r].v[n.outputs[j].v] = (*out)[j];
    }
  }

  // Every output leaf is its piece of the reference.
  std::vector<ir::ValueId> ref_leaves = g.outputs().leaves();
  size_t compared = 0;
  for (size_t k = 0; k < ref_leaves.size(); ++k) {
    const proto::ProgramTensor& t0 = (*programs)[0].outputs(static_cast<int>(k));
    if (t0.placement_size() == 0) continue;
    RankTensors locals;
    for (size_t r = 0; r < world; ++r) {
      uint32_t v = (*programs)[r].outputs(static_cast<int>(k)).value();
      locals.push_back(ranks[r].v[v]->toTensor());
    }
    at::Tensor expected = ref.v[ref_leaves[k].v]->toTensor();
    auto bad = validator::checkLayout(locals, expected, testing::tupleOf(t0.placement()), mesh,
                                      {1e-6, 1e-8});
    EXPECT_FALSE(bad) << "output " << t0.name() << ": " << *bad;
    ++compared;
  }
  EXPECT_GT(compared, 0u);

  // Backward: loss = sum over float outputs of <output, W>; each rank's loss is its piece's
  // share, so an output's gradient is W's piece (Replicate: the whole W on every rank).
  at::Tensor ref_loss = at::zeros({}, at::kDouble);
  std::vector<at::Tensor> rank_loss(world, at::zeros({}, at::kDouble));
  for (size_t k = 0; k < ref_leaves.size(); ++k) {
    const proto::ProgramTensor& t0 = (*programs)[0].outputs(static_cast<int>(k));
    at::Tensor expected = ref.v[ref_leaves[k].v]->toTensor();
    if (t0.placement_size() == 0 || !expected.is_floating_point()) continue;
    at::Tensor w = at::randn(expected.sizes(), gen, at::TensorOptions().dtype(at::kDouble));
    ref_loss = ref_loss + (expected * w).sum();
    for (size_t r = 0; r < world; ++r) {
      const proto::ProgramTensor& t = (*programs)[r].outputs(static_cast<int>(k));
      rank_loss[r] = rank_loss[r] + (ranks[r].v[t.value()]->toTensor() * sliceOf(w, t)).sum();
    }
  }
  if (!ref_loss.requires_grad()) return;
  ref_loss.backward();
  std::vector<at::Tensor> roots;
  for (const at::Tensor& l : rank_loss)
    if (l.requires_grad()) roots.push_back(l);
  torch::autograd::backward(roots, {}, /*retain_graph=*/true);
  // The redistribute nodes in reverse: their backward steps carry each output leaf's gradient
  // (grad_from) to the input's (grad_to), which autograd takes further back.
  for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {
    const uint32_t ri = (*programs)[0].node_redistribution(static_cast<int>(it->node));
    const proto::Redistribution& red = (*programs)[0].redistributions(static_cast<int>(ri - 1));
    RankTensors grads;
    for (size_t r = 0; r < world; ++r) {
      at::Tensor gr = it->out[r].grad();
      grads.push_back(gr.defined() ? gr.detach().clone() : at::zeros_like(it->out[r]).detach());
    }
    for (const proto::RedistStep& st : red.backward()) {
      Status s = validator::executeStep(grads, stepOf(st, mesh), mesh);
      ASSERT_TRUE(s.ok()) << red.edge() << " backward: " << s.error().message();
    }
    std::vector<at::Tensor> xs, gs;
    for (size_t r = 0; r < world; ++r) {
      ASSERT_EQ(grads[r].sizes(), it->in[r].sizes()) << red.edge() << " backward, rank " << r;
      if (it->in[r].requires_grad()) {
        xs.push_back(it->in[r]);
        gs.push_back(grads[r].contiguous());
      }
    }
    if (!xs.empty()) torch::autograd::backward(xs, gs, /*retain_graph=*/true);
  }
  // Every parameter's gradient is its piece of the unsharded gradient.
  size_t grads_compared = 0;
  for (int k = 0; k < (*programs)[0].parameters_size(); ++k) {
    const proto::ProgramTensor& t0 = (*programs)[0].parameters(k);
    auto gn = g.findParameter(t0.name());
    ASSERT_TRUE(gn.has_value());
    at::Tensor ref_grad = ref.v[g.node(*gn).outputs[0].v]->toTensor().grad();
    if (!ref_grad.defined()) continue;
    RankTensors locals;
    for (size_t r = 0; r < world; ++r) {
      at::Tensor leaf = ranks[r].v[(*programs)[r].parameters(k).value()]->toTensor();
      locals.push_back(leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf).detach());
    }
    auto bad = validator::checkLayout(locals, ref_grad, testing::tupleOf(t0.placement()), mesh,
                                      {1e-6, 1e-8});
    EXPECT_FALSE(bad) << "gradient of " << t0.name() << " ("
                      << mesh::toString(testing::tupleOf(t0.placement())) << "): " << *bad;
    ++grads_compared;
  }
  std::cout << "  " << grads_compared << " parameter gradients compared\n";
  std::cout << c.model << " on " << mesh.toString() << ": " << num_nodes << " program nodes, "
            << (*programs)[0].redistributions_size() << " redistributions per rank, " << collectives
            << " steps executed, " << compared << " outputs compared\n";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* m : {"toy_block", "mlp_stack", "gpt2_tiny", "llama_tiny", "cnn_small"})
    for (std::vector<int64_t> mesh : {std::vector<int64_t>{4}, {2, 2}, {2, 4}})
      out.push_back({m, mesh, "", {}, ""});
  // Vocab-parallel embedding with uneven pieces (50257 rows), flat and nested.
  out.push_back({"gpt2_tiny", {4}, "vocab", {{"transformer.wte.weight", "S(0)"}}, ""});
  out.push_back({"gpt2_tiny", {2, 2}, "vocab", {{"transformer.wte.weight", "S(0),S(0)"}}, ""});
  // Mixed precision: parameters cast to bf16 before any collective (run widened to f64 here).
  out.push_back({"gpt2_tiny", {2, 2}, "mp", {}, ""});
  out.push_back({"llama_tiny", {2, 4}, "mp", {}, ""});
  // Data parallel convolutions.
  out.push_back({"cnn_small", {4}, "dp", {}, "S(0)"});
  out.push_back({"cnn_small", {2, 2}, "dp", {}, "S(0),R"});
  // A Partial output reduced at the end (row-parallel second linear).
  out.push_back(
      {"toy_block", {4}, "partial", {{"up.weight", "S(0)"}, {"down.weight", "S(1)"}}, "R"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Samples, LowerExec, ::testing::ValuesIn(cases()), caseName);

}  // namespace
}  // namespace apc::lower
