//===- lib/strategy/token_local.cpp - Token-local regions of dropless MoE layers ===//
//
// findTokenLocalRegions and tokenLocalStrategies (apc/strategy/token_local.h).
//
//===----------------------------------------------------------------------===//
#include "apc/strategy/token_local.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <set>
#include <string>

namespace apc::strategy {
// A named namespace, not an anonymous one: the library builds as one unity source.
namespace token_local_impl {

const RuleOptions kDefaultRuleOptions{};

bool isIntegerType(ir::DType d) {
  return d == ir::DType::kI64 || d == ir::DType::kI32 || d == ir::DType::kI16 ||
         d == ir::DType::kI8 || d == ir::DType::kU8;
}

/// The tensor metas of a value (one for a tensor, one per element of a Tensor[]).
std::vector<const ir::TensorMeta*> metasOf(const ir::Value& v) {
  std::vector<const ir::TensorMeta*> out;
  if (v.tensor) out.push_back(&*v.tensor);
  for (const ir::TensorMeta& e : v.elements) out.push_back(&e);
  return out;
}

bool holdsTensors(const ir::Value& v) {
  return v.type == ir::ValueType::kTensor || v.type == ir::ValueType::kTensorList;
}

int64_t dim0(const ir::TensorMeta& t) {
  return t.shape.empty() ? -1 : t.shape[0].size;
}

/// The dim argument at `pos`, normalized against `rank`; nullopt when unknown.
std::optional<int64_t> dimArg(const RuleContext& c, size_t pos, int64_t rank, int64_t dflt) {
  std::optional<int64_t> d = pos < c.numInputs() ? c.intArg(pos) : std::nullopt;
  if (!d && pos < c.numInputs() && !c.isNoneArg(pos)) return std::nullopt;
  int64_t v = d ? *d : dflt;
  if (rank > 0 && v < 0) v += rank;
  return v;
}

/// Row-wise ops: each output row along dim 0 is computed from the same row of the cut inputs.
bool rowwiseOp(const std::string& op) {
  static const std::set<std::string> ops = {"aten::to",         "aten::_to_copy",
                                            "aten::type_as",    "aten::floor_divide",
                                            "aten::div",        "aten::mul",
                                            "aten::add",        "aten::sub",
                                            "aten::rsub",       "aten::remainder",
                                            "aten::neg",        "aten::silu",
                                            "aten::gelu",       "aten::sigmoid",
                                            "aten::relu",       "aten::tanh",
                                            "aten::exp",        "aten::clamp",
                                            "aten::clamp_min",  "aten::clamp_max",
                                            "aten::minimum",    "aten::maximum",
                                            "aten::where",      "aten::masked_fill",
                                            "aten::pow",        "aten::sqrt",
                                            "aten::rsqrt",      "aten::contiguous",
                                            "aten::clone",      "aten::alias",
                                            "aten::detach",     "aten::unsqueeze",
                                            "aten::squeeze",    "aten::empty_like",
                                            "aten::zeros_like", "aten::ones_like",
                                            "aten::full_like",  "prim::ListConstruct",
                                            "prim::ListUnpack", "aten::view",
                                            "aten::reshape",    "aten::_unsafe_view",
                                            "aten::expand",     "aten::logical_and",
                                            "aten::logical_or", "aten::eq",
                                            "aten::ne",         "aten::lt",
                                            "aten::gt",         "aten::le",
                                            "aten::ge",         "aten::abs"};
  return ops.count(op) > 0;
}

/// Ops with a dim argument at `pos` that must not be dim 0 of a cut input.
std::optional<size_t> dimArgPosition(const std::string& op) {
  if (op == "aten::chunk" || op == "aten::split" || op == "aten::split_with_sizes" ||
      op == "aten::unsafe_chunk" || op == "aten::unsafe_split")
    return 2;
  if (op == "aten::glu" || op == "aten::slice" || op == "aten::softmax" ||
      op == "aten::log_softmax" || op == "aten::gather" || op == "aten::select" ||
      op == "aten::narrow")
    return 1;
  return std::nullopt;
}

bool isSort(const ir::Node& n) {
  return n.op == "aten::sort" || n.op == "aten::argsort";
}

/// The dim argument position of a sort node (sort.stable / argsort.stable: after `stable`).
size_t sortDimPosition(const ir::Node& n) {
  return n.overload == "stable" ? 2 : 1;
}

class Finder {
 public:
  explicit Finder(const ir::Graph& g) : g_(g), uses_(g.computeUses()) {
    // Values computed from parameters, buffers and constants only (no graph input): whole.
    from_input_.assign(g.numValues(), false);
    for (const ir::Node& n : g.nodes()) {
      bool in = n.kind == ir::NodeKind::kInput;
      for (ir::ValueId v : n.inputs) in = in || from_input_[v.v];
      for (ir::ValueId v : n.outputs) from_input_[v.v] = in;
    }
    for (ir::ValueId v : g.outputs().leaves()) graph_output_.insert(v.v);
  }

  std::optional<TokenLocalRegion> regionAt(const ir::Node& root) const;

 private:
  bool isExit(const ir::Node& n, const std::set<uint32_t>& members) const;
  bool memberOk(const ir::Node& n, TokenLocalRegion& r, const std::set<uint32_t>& bins) const;
  void expertCut(TokenLocalRegion& r, const std::set<uint32_t>& members) const;

  const ir::Graph& g_;
  std::vector<std::vector<ir::Use>> uses_;
  std::vector<bool> from_input_;
  std::set<uint32_t> graph_output_;
};

/// index.Tensor(self, [inv]) whose index list is built from a member index_put's result.
bool Finder::isExit(const ir::Node& n, const std::set<uint32_t>& members) const {
  if (n.op != "aten::index" || n.overload != "Tensor" || n.inputs.size() != 2) return false;
  const ir::Value& list = g_.value(n.inputs[1]);
  if (!list.producer.valid()) return false;
  const ir::Node& lc = g_.node(list.producer);
  if (lc.op != "prim::ListConstruct" || lc.inputs.size() != 1) return false;
  const ir::Value& inv = g_.value(lc.inputs[0]);
  if (!inv.producer.valid() || !members.count(inv.producer.v)) return false;
  return g_.node(inv.producer).op == "aten::index_put";
}

std::optional<TokenLocalRegion> Finder::regionAt(const ir::Node& root) const {
  if (root.inputs.empty() || root.kind != ir::NodeKind::kOp) return std::nullopt;
  const ir::Value& ids = g_.value(root.inputs[0]);
  if (!ids.tensor || ids.tensor->rank() != 1 || !isIntegerType(ids.tensor->dtype))
    return std::nullopt;
  TokenLocalRegion r;
  r.root = root.id;
  r.pairs = ids.tensor->shape[0].size;
  // The token count: the sort's input flattens [N, k] routing choices token-major.
  if (!ids.producer.valid()) return std::nullopt;
  const ir::Node& flat = g_.node(ids.producer);
  if (flat.op != "aten::reshape" && flat.op != "aten::view" && flat.op != "aten::flatten")
    return std::nullopt;
  const ir::Value& choices = g_.value(flat.inputs.at(0));
  if (!choices.tensor || choices.tensor->rank() != 2) return std::nullopt;
  r.tokens = choices.tensor->shape[0].size;
  if (r.tokens <= 0 || r.tokens * choices.tensor->shape[1].size != r.pairs) return std::nullopt;
  {
    RuleContext c{g_, root, &kDefaultRuleOptions};
    std::optional<int64_t> d = dimArg(c, sortDimPosition(root), 1, -1);
    if (!d || *d != 0) return std::nullopt;
  }

  // Members: the nodes reachable from the root, up to the exit (whose consumers are not).
  constexpr size_t kMaxMembers = 256;
  std::set<uint32_t> members{root.id.v};
  std::deque<ir::NodeId> todo{root.id};
  std::optional<ir::NodeId> exit;
  while (!todo.empty()) {
    const ir::Node& n = g_.node(todo.front());
    todo.pop_front();
    if (exit && n.id == *exit) continue;
    for (ir::ValueId v : n.outputs) {
      if (graph_output_.count(v.v)) return std::nullopt;
      for (const ir::Use& u : uses_[v.v]) {
        if (members.count(u.node.v)) continue;
        const ir::Node& c = g_.node(u.node);
        // A size read of a rank-local value would be folded to the global size.
        if (c.kind != ir::NodeKind::kOp || g_.isShapeNode(c.id) || isSort(c)) return std::nullopt;
        members.insert(c.id.v);
        if (members.size() > kMaxMembers) return std::nullopt;
        if (isExit(c, members)) {
          if (exit) return std::nullopt;
          exit = c.id;
        }
        todo.push_back(c.id);
      }
    }
  }
  if (!exit) return std::nullopt;
  r.exit = *exit;
  for (uint32_t m : members) r.members.push_back(ir::NodeId(m));

  // Classify values in graph order (members are), then check every member.
  std::set<uint32_t> bins;  // rank-local per-expert counts and what is computed from them alone
  for (ir::NodeId id : r.members) {
    const ir::Node& n = g_.node(id);
    for (ir::ValueId v : n.inputs) {
      const ir::Value& val = g_.value(v);
      if (!holdsTensors(val)) continue;
      const bool internal = val.producer.valid() && members.count(val.producer.v);
      if (internal) continue;  // classified as its producer's output
      std::vector<const ir::TensorMeta*> metas = metasOf(val);
      if (metas.empty()) return std::nullopt;
      if (!from_input_[v.v] && val.producer.valid() &&
          g_.node(val.producer).kind != ir::NodeKind::kOp) {
        r.cut[v.v] = false;  // a parameter or buffer
        continue;
      }
      // Computed from parameters only (a transposed weight): whole. Otherwise (token rows,
      // routing weights, an arange of positions): cut, by tokens or by pairs.
      bool params_only = !from_input_[v.v];
      if (params_only && val.producer.valid()) {
        // An op with no tensor input (arange) is a factory of positions, not a weight.
        bool reads_tensor = false;
        for (ir::ValueId w : g_.node(val.producer).inputs)
          reads_tensor = reads_tensor || holdsTensors(g_.value(w));
        params_only = reads_tensor;
      }
      if (params_only) {
        r.cut[v.v] = false;
        continue;
      }
      for (const ir::TensorMeta* m : metas)
        if (dim0(*m) != r.pairs && dim0(*m) != r.tokens) return std::nullopt;
      r.cut[v.v] = true;
    }
    bool all_bins = true, any_member_input = false;
    for (ir::ValueId v : n.inputs) {
      const ir::Value& val = g_.value(v);
      if (!holdsTensors(val) || !val.producer.valid() || !members.count(val.producer.v)) continue;
      any_member_input = true;
      all_bins = all_bins && bins.count(v.v);
    }
    const bool counts = n.op == "aten::histc" || n.op == "aten::bincount";
    for (ir::ValueId v : n.outputs) {
      const ir::Value& val = g_.value(v);
      if (!holdsTensors(val)) continue;
      if (counts || (any_member_input && all_bins)) {
        bins.insert(v.v);
        r.cut[v.v] = false;
        continue;
      }
      std::vector<const ir::TensorMeta*> metas = metasOf(val);
      if (metas.empty()) return std::nullopt;
      for (const ir::TensorMeta* m : metas)
        if (dim0(*m) != r.pairs) return std::nullopt;
      r.cut[v.v] = true;
    }
    if (!memberOk(n, r, bins)) return std::nullopt;
  }
  expertCut(r, members);
  return r;
}

/// The expert cut of region `r` (see the header), or none (r.experts 0): every grouped matmul of
/// the region multiplies whole rows by weights of E groups read by nothing else; between two of
/// them any row-wise op may run (the rows of other ranks' experts are dropped by the next
/// grouped matmul); after the last one, up to the exit, only ops linear in those rows that keep a
/// zero row zero (so the ranks' outputs add up to the model's).
void Finder::expertCut(TokenLocalRegion& r, const std::set<uint32_t>& members) const {
  std::vector<ir::NodeId> gmms;
  for (ir::NodeId id : r.members)
    if (g_.node(id).op == "aten::_grouped_mm") gmms.push_back(id);
  if (gmms.empty()) return;
  int64_t experts = 0;
  std::set<uint32_t> weights;
  for (ir::NodeId id : gmms) {
    const ir::Node& n = g_.node(id);
    if (n.inputs.size() < 3) return;
    for (size_t i : {size_t{1}, size_t{3}}) {
      if (i >= n.inputs.size() || !holdsTensors(g_.value(n.inputs[i]))) continue;
      const ir::Value& w = g_.value(n.inputs[i]);
      if (!w.tensor || w.tensor->rank() < 2 || (w.producer.valid() && members.count(w.producer.v)))
        return;
      const int64_t e = w.tensor->shape[0].size;
      if (e < 2 || (experts && e != experts)) return;
      experts = e;
      for (const ir::Use& u : uses_[n.inputs[i].v])
        if (members.count(u.node.v) && g_.node(u.node).op != "aten::_grouped_mm") return;
      weights.insert(n.inputs[i].v);
    }
  }
  // Values from a grouped matmul on (members in graph order), and the members that reach one.
  std::set<uint32_t> rows;
  for (ir::NodeId id : r.members) {
    const ir::Node& n = g_.node(id);
    bool from = n.op == "aten::_grouped_mm";
    for (ir::ValueId v : n.inputs) from = from || rows.count(v.v);
    if (from)
      for (ir::ValueId v : n.outputs) rows.insert(v.v);
  }
  std::set<uint32_t> reaches;
  for (auto it = r.members.rbegin(); it != r.members.rend(); ++it) {
    const ir::Node& n = g_.node(*it);
    bool reach = n.op == "aten::_grouped_mm";
    for (ir::ValueId v : n.outputs)
      for (const ir::Use& u : uses_[v.v]) reach = reach || reaches.count(u.node.v);
    if (reach && *it != r.exit) reaches.insert(it->v);
  }
  if (!rows.count(g_.node(r.exit).outputs.at(0).v)) return;
  static const std::set<std::string> linear = {
      "aten::mul",        "aten::div",           "aten::index",     "aten::to",
      "aten::_to_copy",   "aten::view",          "aten::reshape",   "aten::_unsafe_view",
      "aten::unsqueeze",  "aten::squeeze",       "aten::sum",       "aten::clone",
      "aten::contiguous", "prim::ListConstruct", "prim::ListUnpack"};
  for (ir::NodeId id : r.members) {
    const ir::Node& n = g_.node(id);
    if (reaches.count(id.v) || n.op == "aten::_grouped_mm") continue;
    std::vector<size_t> from;
    for (size_t i = 0; i < n.inputs.size(); ++i)
      if (rows.count(n.inputs[i].v)) from.push_back(i);
    if (from.empty()) continue;  // routing: whole on the expert dim
    if (!linear.count(n.op)) return;
    // A product or an index: the rows in one operand only (the first for div and index).
    if ((n.op == "aten::mul" || n.op == "aten::div" || n.op == "aten::index") &&
        (from.size() != 1 || (n.op != "aten::mul" && from[0] != 0)))
      return;
  }
  r.experts = experts;
  r.expert_rows = std::move(rows);
  r.expert_weights = std::move(weights);
}

/// Whether member `n` computes its rows from the same rows of its cut inputs (see the header).
bool Finder::memberOk(const ir::Node& n, TokenLocalRegion& r,
                      const std::set<uint32_t>& bins) const {
  auto cut = [&](size_t i) {
    if (i >= n.inputs.size()) return false;
    auto it = r.cut.find(n.inputs[i].v);
    return it != r.cut.end() && it->second;
  };
  bool any_cut = false;
  for (size_t i = 0; i < n.inputs.size(); ++i) any_cut = any_cut || cut(i);
  RuleContext c{g_, n, &kDefaultRuleOptions};
  if (n.id == r.root) return true;  // checked by regionAt
  if (n.op == "aten::histc" || n.op == "aten::bincount") return true;
  if (n.op == "aten::cumsum") return !n.inputs.empty() && bins.count(n.inputs[0].v) > 0;
  if (n.op == "aten::_grouped_mm")
    return cut(0) && !cut(1) && (n.inputs.size() < 3 || !cut(2)) &&
           (n.inputs.size() < 4 || !cut(3));
  if (n.op == "aten::linear" || n.op == "aten::mm" || n.op == "aten::matmul") {
    for (size_t i = 1; i < n.inputs.size(); ++i)
      if (cut(i)) return false;
    return true;
  }
  if (n.op == "aten::index" && n.overload == "Tensor") {
    // A cut table is indexed along dim 0 by one index tensor (global positions, rewritten).
    if (!cut(0)) return true;
    const ir::Value& list = g_.value(n.inputs.at(1));
    return list.producer.valid() && g_.node(list.producer).op == "prim::ListConstruct" &&
           g_.node(list.producer).inputs.size() == 1;
  }
  if (n.op == "aten::index_put") {
    // Writes into a rank-local tensor only: a whole one would differ between ranks.
    if (!cut(0)) return !any_cut;
    const ir::Value& list = g_.value(n.inputs.at(1));
    return list.producer.valid() && g_.node(list.producer).op == "prim::ListConstruct" &&
           g_.node(list.producer).inputs.size() == 1;
  }
  if (auto pos = dimArgPosition(n.op)) {
    const int64_t rank = c.inputRank(0);
    std::optional<int64_t> d = dimArg(c, *pos, rank, n.op == "aten::glu" ? -1 : 0);
    return d && *d != 0;
  }
  if (n.op == "aten::sum" || n.op == "aten::mean" || n.op == "aten::amax") {
    std::optional<std::vector<int64_t>> dims = c.intListArg(1);
    if (!dims || dims->empty()) return false;
    const int64_t rank = c.inputRank(0);
    for (int64_t d : *dims)
      if (d == 0 || d + rank == 0) return false;
    return true;
  }
  // Views keep dim 0 (the outputs' dim 0 was checked to be S).
  return rowwiseOp(n.op);
}

}  // namespace token_local_impl

using token_local_impl::Finder;

std::vector<TokenLocalRegion> findTokenLocalRegions(const ir::Graph& g) {
  std::vector<TokenLocalRegion> out;
  Finder f(g);
  std::set<uint32_t> taken;  // a node belongs to one region at most
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kOp || !token_local_impl::isSort(n)) continue;
    std::optional<TokenLocalRegion> r = f.regionAt(n);
    if (!r) continue;
    bool overlaps = false;
    for (ir::NodeId m : r->members) overlaps = overlaps || taken.count(m.v);
    if (overlaps) continue;
    for (ir::NodeId m : r->members) taken.insert(m.v);
    out.push_back(std::move(*r));
  }
  return out;
}

std::vector<Strategy> tokenLocalStrategies(const ir::Graph& g, const TokenLocalRegion& region,
                                           const ir::Node& node, const mesh::DeviceMesh& mesh) {
  std::vector<Strategy> out;
  const size_t m = mesh.ndim();
  if (m == 0 || m >= 16) return out;
  RuleContext c{g, node, &token_local_impl::kDefaultRuleOptions};
  auto placementOf = [&](ir::ValueId v, unsigned mask, int expert,
                         bool tensor) -> std::optional<PlacementTuple> {
    if (!tensor) return std::nullopt;
    auto it = region.cut.find(v.v);
    const bool cut = it != region.cut.end() && it->second;
    PlacementTuple t = mesh::replicated(m);
    if (cut)
      for (size_t j = 0; j < m; ++j)
        if (mask & (1u << j)) t[j] = mesh::Placement::shard(0);
    if (expert >= 0) {
      if (region.expert_rows.count(v.v))
        t[static_cast<size_t>(expert)] = mesh::Placement::partial();
      if (region.expert_weights.count(v.v))
        t[static_cast<size_t>(expert)] = mesh::Placement::shard(0);
    }
    return t;
  };
  // Tokens cut on the dims of `mask`; the experts on mesh dim `expert` (-1: none). The token cuts
  // first (expert -1), then each expert dim with every token cut of the other dims.
  int variant = 0;  // counts every (expert, mask) pair the mesh allows: the same on every member
  for (int expert = -1; expert < static_cast<int>(m); ++expert) {
    if (expert >= 0) {
      const int64_t n = mesh.size(static_cast<size_t>(expert));
      if (region.experts == 0 || n <= 1 || region.experts % n != 0) continue;
    }
    for (unsigned mask = 0; mask < (1u << m); ++mask) {
      if (expert >= 0 && (mask & (1u << expert))) continue;
      if (expert < 0 && mask == 0) continue;
      int64_t pieces = 1;
      for (size_t j = 0; j < m; ++j)
        if (mask & (1u << j)) pieces *= mesh.size(j);
      if (mask && (pieces <= 1 || region.tokens % pieces != 0)) continue;
      Strategy s;
      s.region_variant = ++variant;
      for (size_t i = 0; i < node.inputs.size(); ++i)
        s.inputs.push_back(placementOf(node.inputs[i], mask, expert, c.isTensorInput(i)));
      for (size_t i = 0; i < node.outputs.size(); ++i)
        s.outputs.push_back(placementOf(node.outputs[i], mask, expert, c.isTensorOutput(i)));
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace apc::strategy
