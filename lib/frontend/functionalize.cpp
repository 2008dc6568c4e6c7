//===- lib/frontend/functionalize.cpp - In-place ops made out of place -----===//
//
// The pass (torch-free) and the schema facts it reads from LibTorch's operator registry (see
// apc/frontend/functionalize.h).
//
//===----------------------------------------------------------------------===//
#include "apc/frontend/functionalize.h"

#include <optional>
#include <unordered_map>
#include <utility>

#include <torch/csrc/jit/runtime/operator.h>

namespace apc::frontend {

namespace {

/// A value not computed by an op (an input, a parameter or buffer, a constant). Values the pass
/// adds (`fresh`: scatter outputs, producers set only in the final rebuild) are computed.
bool isLeaf(const ir::Graph& g, ir::ValueId v, const std::vector<bool>& fresh) {
  if (v.v < fresh.size() && fresh[v.v]) return false;
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

/// The scatter op that writes a view's new value back into its base: slice.Tensor(self, dim,
/// start, end, step) -> slice_scatter(self, src, dim, start, end, step); select.int(self, dim,
/// index) -> select_scatter(self, src, dim, index). Empty for other view ops.
std::pair<std::string, std::string> scatterOf(const ir::Node& view) {
  if (view.op == "aten::slice" && view.overload == "Tensor") return {"aten::slice_scatter", ""};
  if (view.op == "aten::select" && view.overload == "int") return {"aten::select_scatter", ""};
  return {};
}

/// The chain of views from `v` up to its root `r` (v first, r excluded), when every link is a
/// view with a scatter op taking the viewed tensor as input 0; nullopt otherwise.
std::optional<std::vector<ir::ValueId>> scatterableChain(const ir::Graph& g, ir::ValueId v,
                                                         ir::ValueId r) {
  std::vector<ir::ValueId> chain;
  while (v != r) {
    ir::NodeId p = g.value(v).producer;
    if (!p.valid()) return std::nullopt;
    const ir::Node& view = g.node(p);
    if (scatterOf(view).first.empty() || view.inputs.empty() || view.outputs.size() != 1)
      return std::nullopt;
    chain.push_back(v);
    v = view.inputs[0];
  }
  return chain;
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
  // Every read of `from` after node position `after` reads `to` instead.
  auto rebindReadsAfter = [&](ir::ValueId from, ir::ValueId to, size_t after) {
    std::vector<ir::Use> keep;
    for (const ir::Use& u : uses[from.v]) {
      if (pos[u.node.v] > after) {
        g.node(u.node).inputs[u.input_index] = to;
        uses[to.v].push_back(u);
      } else {
        keep.push_back(u);
      }
    }
    uses[from.v] = std::move(keep);
    for (ir::ValueId* leaf : output_leaves)
      if (*leaf == from) *leaf = to;
  };
  // Scatter nodes written after the original node at each position (added in a rebuild at the
  // end, so that the loop's node positions stay valid).
  std::unordered_map<size_t, std::vector<ir::Node>> inserted;
  std::vector<bool> fresh(g.numValues(), false);
  auto newValue = [&](ir::ValueId like, const std::string& suffix) {
    ir::Value nv;
    nv.type = g.value(like).type;
    nv.tensor = g.value(like).tensor;
    nv.debug_name = g.value(like).debug_name + suffix;
    ir::ValueId id = g.addValue(std::move(nv));
    uses.emplace_back();
    root.push_back(id);
    fresh.push_back(true);
    return id;
  };

  for (size_t i = 0; i < g.numNodes(); ++i) {
    ir::Node& n = g.node(g.nodes()[i].id);
    if (n.kind != ir::NodeKind::kOp) continue;
    NodeAliasing a = aliasing(n);
    bool functional = false;
    if (a.in_place && !n.inputs.empty() && !n.outputs.empty() && g.value(n.inputs[0]).isTensor()) {
      ir::ValueId v = n.inputs[0];
      ir::ValueId r = root[v.v];
      if (isLeaf(g, r, fresh)) {
        // A write into module state or an input: kept (state the runtime holds per rank).
        ++report.kept;
      } else {
        // A write through slices/selects of a base that is read later (`mask[a:b, c:d] =
        // k`) is the functional op followed by scatters writing the new view back up the
        // chain; later reads of the base read the last scatter (torch's functionalization
        // does the same). Other views of the base read later would need regenerating: refused.
        std::optional<std::vector<ir::ValueId>> chain;
        if (v != r && readAfter(r, i) && !a.functional_op.empty())
          chain = scatterableChain(g, v, r);
        for (ir::ValueId w : members[r.v]) {
          if (w == v || (chain && w == r)) continue;
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
          rebindReadsAfter(v, y, i);
          if (chain) {
            ir::ValueId cur = y;
            for (ir::ValueId link : *chain) {
              const ir::Node& view = g.node(g.value(link).producer);
              auto [op, overload] = scatterOf(view);
              ir::Node sc;
              sc.kind = ir::NodeKind::kOp;
              sc.op = op;
              sc.overload = overload;
              sc.inputs = {view.inputs[0], cur};
              sc.inputs.insert(sc.inputs.end(), view.inputs.begin() + 1, view.inputs.end());
              sc.module_path = n.module_path;
              sc.source = n.source;
              cur = newValue(view.inputs[0], "_scattered");
              sc.outputs = {cur};
              inserted[i].push_back(std::move(sc));
            }
            members[cur.v].push_back(cur);
            rebindReadsAfter(r, cur, i);
            ++report.scattered;
          }
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
  if (!inserted.empty()) {
    // Rebuild with the scatters after their writes (value ids are kept, node ids shift).
    ir::Graph out;
    out.name = g.name;
    for (const ir::Value& v : g.values()) out.addValue(v);
    for (size_t i = 0; i < g.numNodes(); ++i) {
      out.addNode(g.nodes()[i]);
      if (auto it = inserted.find(i); it != inserted.end())
        for (ir::Node& sc : it->second) out.addNode(std::move(sc));
    }
    out.setOutputs(g.outputs());
    g = std::move(out);
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
