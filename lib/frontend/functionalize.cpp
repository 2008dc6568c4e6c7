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

#include "apc/support/activity.h"

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
std::string scatterOf(const std::string& op, const std::string& overload) {
  if (op == "aten::slice" && overload == "Tensor") return "aten::slice_scatter";
  if (op == "aten::select" && overload == "int") return "aten::select_scatter";
  return {};
}

/// Ops whose output is always a view of input 0 (never a copy), so that replaying the op on a new
/// version of the base gives the view's new content. `reshape`, `contiguous`, `to`, `flatten` may
/// copy: a value they return is not regenerated (a read of it after a write is refused).
bool alwaysAView(const std::string& op) {
  static const char* const kViews[] = {
      "aten::alias",     "aten::detach",    "aten::expand",    "aten::expand_as", "aten::narrow",
      "aten::permute",   "aten::select",    "aten::slice",     "aten::squeeze",   "aten::t",
      "aten::transpose", "aten::unflatten", "aten::unsqueeze", "aten::view",      "aten::view_as"};
  for (const char* v : kViews)
    if (op == v) return true;
  return false;
}

/// One view op on the way from a base to an alias of it: the op, its inputs after input 0, and
/// the value it gave (the alias's content when it was current).
struct Link {
  std::string op, overload;
  std::vector<ir::ValueId> args;
  ir::ValueId value;
};
using Path = std::vector<Link>;

}  // namespace

// The pass follows torch's functionalization. Every value that views memory has a root (the value
// owning that memory) and, where it is reached by ops that always return views, the path of view
// ops from the root. A root that is written through any of its aliases gets a new version: the
// functional op computes the alias's new content, scatters (slice_scatter, select_scatter) write
// it back up the path into a new version of the root, and every other alias read afterwards is
// replayed from the new version (its path's view ops applied again). So a second write through
// the same view (`v.mul_(2); v.add_(100.)`, or `v.mul_(2).add_(100.)`) goes through the first
// write's result and is written back too. Writes that cannot be written back (through a view that
// is not slices and selects) and aliases that cannot be replayed (a `reshape`, which may copy)
// are refused when the root or the alias is read after the write.
Expected<FunctionalizeReport> functionalizeInPlace(ir::Graph& g, const AliasingOf& aliasing) {
  FunctionalizeReport report;
  std::vector<std::vector<ir::Use>> uses = g.computeUses();
  std::vector<ir::ValueId*> output_leaves;
  collectLeaves(g.outputs(), output_leaves);

  // The position of every node; root[v]: the value whose memory v views; path[v]: the view ops
  // from root[v] to v (empty for the root and its versions; nullopt where unknown); members[r]:
  // every value seen so far viewing r's memory; version[r]: how many writes r's memory has had,
  // version_of[v]: the version v's content is of; current[r]: the root's current content.
  std::vector<size_t> pos(g.numNodes());
  for (size_t i = 0; i < g.numNodes(); ++i) pos[g.nodes()[i].id.v] = i;
  std::vector<ir::ValueId> root(g.numValues());
  for (size_t i = 0; i < root.size(); ++i) root[i] = ir::ValueId(static_cast<uint32_t>(i));
  std::vector<std::optional<Path>> path(g.numValues(), Path{});
  std::vector<int> version_of(g.numValues(), 0);
  std::unordered_map<uint32_t, std::vector<ir::ValueId>> members;
  std::unordered_map<uint32_t, int> version;
  std::unordered_map<uint32_t, ir::ValueId> current;

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
  // Nodes written after the original node at each position (added in a rebuild at the end, so
  // that the loop's node positions stay valid).
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
    path.emplace_back(Path{});
    version_of.push_back(0);
    fresh.push_back(true);
    return id;
  };
  // A node after position i: `op(inputs) -> a new value like `like``.
  auto emit = [&](size_t i, const ir::Node& at, const std::string& op, const std::string& overload,
                  std::vector<ir::ValueId> inputs, ir::ValueId like, const std::string& suffix) {
    ir::Node nn;
    nn.kind = ir::NodeKind::kOp;
    nn.op = op;
    nn.overload = overload;
    nn.inputs = std::move(inputs);
    nn.module_path = at.module_path;
    nn.source = at.source;
    ir::ValueId out = newValue(like, suffix);
    nn.outputs = {out};
    inserted[i].push_back(std::move(nn));
    return out;
  };
  auto addMember = [&](ir::ValueId r, ir::ValueId v, std::optional<Path> p) {
    root[v.v] = r;
    path[v.v] = std::move(p);
    version_of[v.v] = version[r.v];
    members[r.v].push_back(v);
  };
  // Replays links[from..] after position i on the current value of links[from - 1] (of the root
  // for from == 0): the returned path has the replayed values, each a member of r.
  auto replay = [&](size_t i, const ir::Node& at, ir::ValueId r, Path links, size_t from) {
    ir::ValueId cur = from == 0 ? current[r.v] : links[from - 1].value;
    for (size_t k = from; k < links.size(); ++k) {
      std::vector<ir::ValueId> in{cur};
      in.insert(in.end(), links[k].args.begin(), links[k].args.end());
      cur = emit(i, at, links[k].op, links[k].overload, std::move(in), links[k].value, "_view");
      links[k].value = cur;
      addMember(r, cur, Path(links.begin(), links.begin() + static_cast<std::ptrdiff_t>(k) + 1));
    }
    return links;
  };

  for (size_t i = 0; i < g.numNodes(); ++i) {
    ir::Node& n = g.node(g.nodes()[i].id);
    if (n.kind != ir::NodeKind::kOp) continue;
    NodeAliasing a = aliasing(n);
    for (ir::ValueId in : n.inputs)
      if (root[in.v] == in && members.find(in.v) == members.end()) {
        members[in.v].push_back(in);
        current[in.v] = in;
      }
    bool functional = false;
    if (a.in_place && !n.inputs.empty() && !n.outputs.empty() && g.value(n.inputs[0]).isTensor()) {
      ir::ValueId v = n.inputs[0];
      ir::ValueId r = root[v.v];
      const std::string refused = "in-place " + n.qualifiedOp() + whereOf(n) +
                                  " writes through a view of a tensor that is read afterwards";
      // Other aliases of the memory read after this write: they must see it.
      std::vector<ir::ValueId> observers;
      for (ir::ValueId w : members[r.v])
        if (w != v && readAfter(w, i)) observers.push_back(w);
      if (isLeaf(g, r, fresh)) {
        // A write into module state or an input: kept (state the runtime holds per rank).
        ++report.kept;
      } else if (a.functional_op.empty()) {
        if (!observers.empty())
          return unsupported(refused + " and has no out-of-place form; compute it out of place");
        ++report.kept;
      } else {
        functional = true;
        ++report.functionalized;
        n.op = a.functional_op;
        n.overload = a.functional_overload;
        ir::ValueId y = n.outputs[0];
        // Later reads of x read y (scripted code reads x itself after `x.add_(1)`).
        rebindReadsAfter(v, y, i);
        if (observers.empty()) {
          // Nothing else reads the memory again: y starts a memory of its own.
          addMember(y, y, Path{});
          current[y.v] = y;
        } else {
          if (!path[v.v])
            return unsupported(refused + " through a view apc cannot replay (" +
                               g.value(v).debug_name +
                               " is not reached by views only); compute it out of place");
          const Path links = *path[v.v];  // a copy: path grows below
          for (const Link& l : links)
            if (scatterOf(l.op, l.overload).empty())
              return unsupported(refused +
                                 "; apc writes back through slices and selects only, "
                                 "not " +
                                 l.op + ": compute it out of place");
          // The path's current values (replayed where an earlier write made them stale), then
          // the scatters writing y back up the path into the root's new version.
          Path now = links;
          if (!now.empty()) now.pop_back();
          size_t stale = 0;
          while (stale < now.size() && version_of[now[stale].value.v] == version[r.v]) ++stale;
          now = replay(i, n, r, std::move(now), stale);
          ir::ValueId piece = y;
          std::vector<ir::ValueId> written(links.size() + 1);
          written[links.size()] = y;
          for (size_t k = links.size(); k-- > 0;) {
            ir::ValueId under = k == 0 ? current[r.v] : now[k - 1].value;
            std::vector<ir::ValueId> in{under, piece};
            in.insert(in.end(), links[k].args.begin(), links[k].args.end());
            piece = emit(i, n, scatterOf(links[k].op, links[k].overload), "", std::move(in), under,
                         "_scattered");
            written[k] = piece;
          }
          ++version[r.v];
          current[r.v] = written[0];
          Path updated;
          addMember(r, written[0], Path{});
          for (size_t k = 0; k < links.size(); ++k) {
            Link l = links[k];
            l.value = written[k + 1];
            updated.push_back(l);
            addMember(r, l.value, updated);
          }
          if (!links.empty()) ++report.scattered;
          // Every other alias read afterwards reads its new content: the root's new version, a
          // value on y's path, or its own view ops replayed on the new version.
          for (ir::ValueId w : observers) {
            if (!path[w.v])
              return unsupported(refused + " (" + g.value(w).debug_name +
                                 " views it through an op that may copy); compute it out of "
                                 "place");
            const Path wp = *path[w.v];
            size_t same = 0;
            while (same < wp.size() && same < updated.size() && wp[same].op == updated[same].op &&
                   wp[same].overload == updated[same].overload &&
                   wp[same].args == updated[same].args)
              ++same;
            ir::ValueId now_w = written[0];
            if (same > 0) now_w = updated[same - 1].value;
            if (same < wp.size()) {
              Path replayed(updated.begin(), updated.begin() + static_cast<std::ptrdiff_t>(same));
              replayed.insert(replayed.end(), wp.begin() + static_cast<std::ptrdiff_t>(same),
                              wp.end());
              now_w = replay(i, n, r, std::move(replayed), same).back().value;
            }
            rebindReadsAfter(w, now_w, i);
          }
        }
      }
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      ir::ValueId out = n.outputs[k];
      if (k == 0 && functional) continue;  // registered above
      int src = k < a.output_aliases.size() ? a.output_aliases[k] : -1;
      if (a.in_place && k == 0) src = 0;
      if (src < 0 || static_cast<size_t>(src) >= n.inputs.size()) {
        addMember(out, out, Path{});
        current[out.v] = out;
        continue;
      }
      ir::ValueId in = n.inputs[static_cast<size_t>(src)];
      ir::ValueId r = root[in.v];
      std::optional<Path> p;
      // A view of a value whose path is known: the path plus this op.
      if (src == 0 && !a.in_place && n.outputs.size() == 1 && alwaysAView(n.op) && path[in.v] &&
          g.value(out).isTensor()) {
        p = *path[in.v];
        p->push_back(Link{n.op, n.overload, {n.inputs.begin() + 1, n.inputs.end()}, out});
      }
      addMember(r, out, std::move(p));
    }
  }
  if (!inserted.empty()) {
    // Rebuild with the inserted nodes after their writes (value ids are kept, node ids shift).
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
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
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
