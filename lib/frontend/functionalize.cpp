//===- lib/frontend/functionalize.cpp - In-place ops made out of place -----===//
//
// The pass (torch-free) and the schema facts it reads from LibTorch's operator registry (see
// apc/frontend/functionalize.h).
//
//===----------------------------------------------------------------------===//
#include "apc/frontend/functionalize.h"

#include <unordered_map>

#include <torch/csrc/jit/runtime/operator.h>

namespace apc::frontend {

namespace {

bool isLeaf(const ir::Graph& g, ir::ValueId v) {
  ir::NodeId p = g.value(v).producer;
  return !p.valid() || g.node(p).kind != ir::NodeKind::kOp;
}

std::string whereOf(const ir::Node& n) {
  std::string s;
  if (!n.source.empty()) s += " at " + n.source;
  if (!n.module_path.empty()) s += " in module " + n.module_path;
  return s;
}

void collectLeaves(ir::OutputTree& t, std::vector<ir::ValueId*>& out) {
  if (t.kind == ir::OutputTree::Kind::kLeaf) {
    out.push_back(&t.leaf);
    return;
  }
  for (auto& c : t.children) collectLeaves(c, out);
}

}  // namespace

Expected<FunctionalizeReport> functionalizeInPlace(ir::Graph& g, const AliasingOf& aliasing) {
  FunctionalizeReport report;
  std::vector<std::vector<ir::Use>> uses = g.computeUses();
  std::vector<ir::ValueId*> output_leaves;
  collectLeaves(g.outputs(), output_leaves);

  // The position of every node; root[v]: the value whose memory v views (itself when fresh);
  // members[root]: every value seen so far viewing that memory.
  std::vector<size_t> pos(g.numNodes());
  for (size_t i = 0; i < g.numNodes(); ++i) pos[g.nodes()[i].id.v] = i;
  std::vector<ir::ValueId> root(g.numValues());
  for (size_t i = 0; i < root.size(); ++i) root[i] = ir::ValueId(static_cast<uint32_t>(i));
  std::unordered_map<uint32_t, std::vector<ir::ValueId>> members;

  auto readAfter = [&](ir::ValueId w, size_t after) {
    for (const ir::Use& u : uses[w.v])
      if (pos[u.node.v] > after) return true;
    for (const ir::ValueId* leaf : output_leaves)
      if (*leaf == w) return true;
    return false;
  };

  for (size_t i = 0; i < g.numNodes(); ++i) {
    ir::Node& n = g.node(g.nodes()[i].id);
    if (n.kind != ir::NodeKind::kOp) continue;
    NodeAliasing a = aliasing(n);
    bool functional = false;
    if (a.in_place && !n.inputs.empty() && !n.outputs.empty() && g.value(n.inputs[0]).isTensor()) {
      ir::ValueId v = n.inputs[0];
      ir::ValueId r = root[v.v];
      if (isLeaf(g, r)) {
        // A write into module state or an input: kept (state the runtime holds per rank).
        ++report.kept;
      } else {
        for (ir::ValueId w : members[r.v]) {
          if (w == v) continue;
          if (readAfter(w, i))
            return unsupported("in-place " + n.qualifiedOp() + whereOf(n) +
                               " writes through a view of a tensor that is read afterwards; apc "
                               "keeps value semantics only: compute it out of place");
        }
        if (a.functional_op.empty()) {
          ++report.kept;
        } else {
          functional = true;
          ++report.functionalized;
          n.op = a.functional_op;
          n.overload = a.functional_overload;
          ir::ValueId y = n.outputs[0];
          // Later reads of x read y (scripted code reads x itself after `x.add_(1)`).
          std::vector<ir::Use> keep;
          for (const ir::Use& u : uses[v.v]) {
            if (pos[u.node.v] > i) {
              g.node(u.node).inputs[u.input_index] = y;
              uses[y.v].push_back(u);
            } else {
              keep.push_back(u);
            }
          }
          uses[v.v] = std::move(keep);
          for (ir::ValueId* leaf : output_leaves)
            if (*leaf == v) *leaf = y;
        }
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ir::ValueId out = n.outputs[k];
      int src = k < a.output_aliases.size() ? a.output_aliases[k] : -1;
      if (a.in_place && k == 0 && !functional) src = 0;
      if (k == 0 && functional) src = -1;
      if (src >= 0 && static_cast<size_t>(src) < n.inputs.size())
        root[out.v] = root[n.inputs[static_cast<size_t>(src)].v];
      members[root[out.v].v].push_back(out);
    }
    for (ir::ValueId in : n.inputs)
      if (members.find(root[in.v].v) == members.end()) members[root[in.v].v].push_back(in);
  }
  return report;
}

// --- schema facts ------------------------------------------------------------------------------

namespace {

std::shared_ptr<torch::jit::Operator> findOp(const std::string& op, const std::string& overload) {
  try {
    return torch::jit::findOperatorFor(c10::OperatorName(op, overload));
  } catch (const std::exception&) {
    return nullptr;
  }
}

bool sameArgumentTypes(const c10::FunctionSchema& a, const c10::FunctionSchema& b) {
  if (a.arguments().size() != b.arguments().size()) return false;
  for (size_t i = 0; i < a.arguments().size(); ++i)
    if (*a.arguments()[i].type() != *b.arguments()[i].type()) return false;
  return true;
}

}  // namespace

NodeAliasing torchSchemaAliasing(const ir::Node& node) {
  NodeAliasing a;
  a.output_aliases.assign(node.outputs.size(), -1);
  // Structural prim ops: the elements of an unpacked list or tuple view the list's tensors.
  if (node.op == "prim::ListUnpack" || node.op == "prim::TupleUnpack" ||
      node.op == "aten::__getitem__") {
    a.output_aliases.assign(node.outputs.size(), 0);
    return a;
  }
  auto op = findOp(node.op, node.overload);
  if (!op) return a;
  const c10::FunctionSchema& s = op->schema();
  const auto& args = s.arguments();
  const auto& rets = s.returns();
  for (size_t k = 0; k < rets.size() && k < a.output_aliases.size(); ++k) {
    const c10::AliasInfo* ra = rets[k].alias_info();
    if (!ra) continue;
    for (size_t i = 0; i < args.size(); ++i) {
      const c10::AliasInfo* ia = args[i].alias_info();
      if (!ia) continue;
      bool shared = false;
      for (const auto& set : ra->beforeSets())
        if (ia->beforeSets().count(set)) shared = true;
      if (shared) {
        a.output_aliases[k] = static_cast<int>(i);
        break;
      }
    }
  }
  if (args.empty() || !args[0].alias_info() || !args[0].alias_info()->isWrite()) return a;
  const std::string& name = node.op;
  if (name.size() < 2 || name.back() != '_') return a;
  a.in_place = true;
  std::string base = name.substr(0, name.size() - 1);
  // The same overload name first (add_.Tensor -> add.Tensor), else any overload of the base
  // name with the same argument types (bernoulli_.float -> bernoulli.p).
  if (auto f = findOp(base, node.overload); f && sameArgumentTypes(f->schema(), s)) {
    a.functional_op = base;
    a.functional_overload = node.overload;
    return a;
  }
  for (const auto& f : torch::jit::getAllOperatorsFor(c10::Symbol::fromQualString(base))) {
    if (sameArgumentTypes(f->schema(), s) && !f->schema().is_mutable()) {
      a.functional_op = base;
      a.functional_overload = f->schema().overload_name();
      break;
    }
  }
  return a;
}

}  // namespace apc::frontend
