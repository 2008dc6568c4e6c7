//===- lib/strategy/local_rewrite.cpp - Op constants rewritten for local pieces //
//
// The rewrites of apc/strategy/local_rewrite.h, one small function per row of its table; each op's
// registration puts its function in its OpInfo::local_rewrite (view.cpp, tensor_ops.cpp,
// embedding.cpp). Argument positions are those of the ATen schemas of LibTorch 2.x (this library
// links no torch).
//
//===----------------------------------------------------------------------===//
#include "apc/strategy/local_rewrite.h"

#include "apc/ir/op_collective.h"
#include "rule_util.h"

namespace apc::strategy {

std::vector<int64_t> TensorPiece::localSizes() const {
  std::vector<int64_t> s;
  s.reserve(local.size());
  for (const layout::DimPiece& p : local) s.push_back(p.size);
  return s;
}

namespace {

std::string listText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const std::vector<int64_t>* intListAt(const std::vector<std::optional<ir::Constant>>& c, size_t i) {
  if (i >= c.size() || !c[i]) return nullptr;
  return std::get_if<std::vector<int64_t>>(&*c[i]);
}

const int64_t* intAt(const std::vector<std::optional<ir::Constant>>& c, size_t i) {
  if (i >= c.size() || !c[i]) return nullptr;
  return std::get_if<int64_t>(&*c[i]);
}

const TensorPiece* firstOutput(const RankPieces& p) {
  if (p.outputs.empty() || p.outputs[0].empty()) return nullptr;
  return &p.outputs[0][0];
}

/// The SymbolicSize of dim `d` of `t` at argument `input` (element `element`), or nullopt when the
/// dim is static or not proportional to its symbol (it then keeps its hint).
std::optional<SymbolicSize> symbolicOf(const TensorPiece& t, size_t d, size_t input,
                                       int64_t element, SymbolicSize::Part part, int64_t scale = 1,
                                       int64_t shift = 0) {
  if (d >= t.dims.size() || !t.dims[d].isSymbolic() || t.dims[d].per_symbol <= 0)
    return std::nullopt;
  SymbolicSize s;
  s.input = input;
  s.element = element;
  s.symbol = t.dims[d].symbol;
  s.per_symbol = t.dims[d].per_symbol;
  s.placement = t.placement;
  s.rank = t.dims.size();
  s.dim = d;
  s.part = part;
  s.scale = scale;
  s.shift = shift;
  return s;
}

/// How a size list may say "the run-time size" of a symbolic dim (see the header).
enum class DynamicSizes {
  kNone,    // factories: a size list of numbers only
  kView,    // view / reshape: one -1, when the output has exactly one symbolic dim
  kExpand,  // expand / broadcast_to: -1 (keep the input's size) on every symbolic output dim
            // whose input dim, aligned from the right, is symbolic too
};

/// view/reshape/expand/factories: the size argument at `pos` becomes the local output shape.
Status rewriteSizeList(size_t pos, const std::vector<std::optional<ir::Constant>>& c,
                       const RankPieces& pieces, NodeRewrite& r,
                       DynamicSizes dynamic_sizes = DynamicSizes::kNone) {
  const std::vector<int64_t>* sizes = intListAt(c, pos);
  if (!sizes) {
    // view.dtype and friends take no size list; a size list that is not known is an error.
    if (pos < c.size() && !c[pos]) return unsupported("size argument not known at compile time");
    return Status::success();
  }
  const TensorPiece* out = firstOutput(pieces);
  if (!out) return invalidArgument("no tensor output to take the local shape from");
  std::vector<int64_t> local = out->localSizes();
  bool cut = false;
  for (size_t d = 0; d < out->global.size(); ++d) cut = cut || !out->whole(d);
  int dynamic = -1, num_dynamic = 0;
  for (size_t d = 0; d < out->symbolic.size(); ++d)
    if (out->symbolic[d]) dynamic = static_cast<int>(d), ++num_dynamic;
  if (num_dynamic == 1 && dynamic_sizes == DynamicSizes::kView && local.size() == sizes->size()) {
    local[static_cast<size_t>(dynamic)] = -1;
    cut = true;
  }
  const TensorPiece* in =
      pieces.inputs.empty() || pieces.inputs[0].empty() ? nullptr : &pieces.inputs[0][0];
  if (dynamic_sizes == DynamicSizes::kExpand && in && local.size() == sizes->size() &&
      in->symbolic.size() <= out->symbolic.size()) {
    const size_t lead = out->symbolic.size() - in->symbolic.size();
    for (size_t d = lead; d < out->symbolic.size(); ++d)
      if (out->symbolic[d] && in->symbolic[d - lead]) {
        local[d] = -1;
        cut = true;
      }
  }
  // The other symbolic dims are recomputed at run time (expand from size 1, factories).
  size_t symbolic = 0;
  if (local.size() == sizes->size())
    for (size_t d = 0; d < local.size(); ++d) {
      if (local[d] == -1) continue;
      auto e = symbolicOf(*out, d, pos, static_cast<int64_t>(d), SymbolicSize::Part::kSize);
      if (!e) continue;
      r.symbolic.push_back(std::move(*e));
      ++symbolic;
    }
  if (symbolic > 0) {
    r.notes.push_back(std::to_string(symbolic) + " size(s) from symbols at run time");
    cut = true;
  }
  if (!cut || *sizes == local) return Status::success();  // keeps -1 entries when nothing is cut
  r.notes.push_back("size := " + listText(local));
  r.replace.emplace_back(pos, local);
  return Status::success();
}

/// unflatten(self, dim, sizes): sizes become the local sizes of output dims [dim, dim + n).
Status rewriteUnflatten(const std::vector<std::optional<ir::Constant>>& c, const RankPieces& pieces,
                        NodeRewrite& r) {
  const int64_t* dimp = intAt(c, 1);
  const std::vector<int64_t>* sizes = intListAt(c, 2);
  if (!dimp || !sizes) return invalidArgument("unflatten without int dim and int[] sizes");
  const TensorPiece* outp = firstOutput(pieces);
  if (!outp) return invalidArgument("no tensor output");
  std::vector<int64_t> out = outp->localSizes();
  const auto n = static_cast<int64_t>(sizes->size());
  int64_t in_rank = static_cast<int64_t>(out.size()) - n + 1;
  int64_t dim = *dimp < 0 ? *dimp + in_rank : *dimp;
  if (dim < 0 || dim + n > static_cast<int64_t>(out.size()))
    return invalidArgument("unflatten dim out of range");
  bool cut = false;
  for (int64_t d = dim; d < dim + n; ++d) cut = cut || !outp->whole(static_cast<size_t>(d));
  std::vector<int64_t> local(out.begin() + dim, out.begin() + dim + n);
  for (int64_t d = dim; d < dim + n; ++d) {
    auto e = symbolicOf(*outp, static_cast<size_t>(d), 2, d - dim, SymbolicSize::Part::kSize);
    if (!e) continue;
    r.symbolic.push_back(std::move(*e));
    cut = true;
  }
  if (!cut || local == *sizes) return Status::success();
  r.notes.push_back("sizes := " + listText(local));
  r.replace.emplace_back(2, local);
  return Status::success();
}

/// A scalar constant as a double, and whether it is integral.
std::optional<std::pair<double, bool>> scalarOf(const std::optional<ir::Constant>& c) {
  if (!c) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&*c)) return std::make_pair(double(*i), true);
  if (const auto* d = std::get_if<double>(&*c)) return std::make_pair(*d, false);
  return std::nullopt;
}

/// arange: the bounds of the rank's piece of the 1-d output.
Status rewriteArange(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                     const RankPieces& pieces, NodeRewrite& r) {
  const TensorPiece* out = firstOutput(pieces);
  if (!out || out->global.size() != 1) return invalidArgument("arange without a 1-d output");
  const bool has_start = node.overload == "start" || node.overload == "start_step";
  const bool symbolic = out->dims.size() == 1 && out->dims[0].isSymbolic();
  if (out->whole(0) && !symbolic) return Status::success();
  if (out->whole(0)) {
    // arange(B) on a whole dim: its end follows the symbol (integral bounds only).
    if (!has_start && !node.overload.empty()) return Status::success();
    auto start = has_start ? scalarOf(c.size() > 0 ? c[0] : std::nullopt)
                           : std::make_optional(std::make_pair(0.0, true));
    auto step = node.overload == "start_step" ? scalarOf(c.size() > 2 ? c[2] : std::nullopt)
                                              : std::make_optional(std::make_pair(1.0, true));
    if (!start || !step || !start->second || !step->second) return Status::success();
    auto e = symbolicOf(*out, 0, has_start ? 1 : 0, -1, SymbolicSize::Part::kEnd,
                        static_cast<int64_t>(step->first), static_cast<int64_t>(start->first));
    if (e) {
      r.symbolic.push_back(std::move(*e));
      r.notes.push_back("arange end from a symbol at run time");
    }
    return Status::success();
  }
  if (!has_start && !node.overload.empty())
    return unsupported("arange." + node.overload + " with a cut output");
  const size_t end_pos = has_start ? 1 : 0;
  std::optional<std::pair<double, bool>> start =
      has_start ? scalarOf(c.size() > 0 ? c[0] : std::nullopt) : std::make_pair(0.0, true);
  std::optional<std::pair<double, bool>> step = node.overload == "start_step"
                                                    ? scalarOf(c.size() > 2 ? c[2] : std::nullopt)
                                                    : std::make_pair(1.0, true);
  if (!start || !step || !scalarOf(end_pos < c.size() ? c[end_pos] : std::nullopt))
    return unsupported("arange bounds not known at compile time");
  const int64_t off = out->local[0].offset, len = out->local[0].size;
  ir::Constant new_start, new_end;
  if (start->second && step->second) {
    auto s = static_cast<int64_t>(start->first), st = static_cast<int64_t>(step->first);
    new_start = s + off * st;
    new_end = s + off * st + len * st;
    // A symbolic dim: both bounds of the piece follow the symbol (start is input 0, end input 1,
    // also after arange(end) becomes arange.start below).
    for (auto [pos, part] : {std::make_pair(size_t{0}, SymbolicSize::Part::kOffset),
                             std::make_pair(size_t{1}, SymbolicSize::Part::kEnd)})
      if (auto e = symbolicOf(*out, 0, pos, -1, part, st, s)) r.symbolic.push_back(std::move(*e));
  } else {
    double s = start->first + static_cast<double>(off) * step->first;
    new_start = s;
    new_end = s + (static_cast<double>(len) - 0.5) * step->first;
  }
  if (has_start) {
    r.replace.emplace_back(0, new_start);
    r.replace.emplace_back(1, new_end);
  } else {
    r.replace.emplace_back(0, new_end);
    r.overload = "start";
    r.prepend = new_start;
  }
  r.notes.push_back("arange bounds := [" + std::to_string(off) + ", +" + std::to_string(len) + ")");
  return Status::success();
}

/// narrow(self, dim, start, length) over the whole of a cut dim: the whole local piece.
Status rewriteNarrow(const std::vector<std::optional<ir::Constant>>& c, const RankPieces& pieces,
                     NodeRewrite& r) {
  const int64_t* dimp = intAt(c, 1);
  const int64_t* startp = intAt(c, 2);
  const int64_t* lenp = intAt(c, 3);
  if (!dimp || !startp || !lenp) return Status::success();  // narrow.Tensor: unchanged
  if (pieces.inputs.empty() || pieces.inputs[0].empty()) return invalidArgument("no input");
  const TensorPiece& in = pieces.inputs[0][0];
  int64_t dim = *dimp < 0 ? *dimp + static_cast<int64_t>(in.global.size()) : *dimp;
  auto d = static_cast<size_t>(dim);
  if (dim < 0 || d >= in.global.size() || in.whole(d)) return Status::success();
  if (*startp != 0 || *lenp != in.global[d]) return Status::success();
  r.replace.emplace_back(3, in.local[d].size);
  r.notes.push_back("length := " + std::to_string(in.local[d].size));
  return Status::success();
}

/// repeat(self, repeats): an output dim that follows a symbol while the input dim it repeats has
/// size 1 (or is a new leading dim), as in `cls.repeat(B, 1, 1)`: its repeat count is the output
/// piece's size at run time.
Status rewriteRepeat(const std::vector<std::optional<ir::Constant>>& c, const RankPieces& pieces,
                     NodeRewrite& r) {
  const std::vector<int64_t>* repeats = intListAt(c, 1);
  const TensorPiece* out = firstOutput(pieces);
  if (!repeats || !out || pieces.inputs.empty() || pieces.inputs[0].empty())
    return Status::success();
  const TensorPiece& in = pieces.inputs[0][0];
  if (repeats->size() != out->global.size() || in.global.size() > out->global.size())
    return Status::success();
  const size_t lead = out->global.size() - in.global.size();
  for (size_t d = 0; d < out->global.size(); ++d) {
    const bool unit = d < lead || (in.global[d - lead] == 1 &&
                                   (d - lead >= in.dims.size() || !in.dims[d - lead].isSymbolic()));
    if (!unit) continue;
    auto e = symbolicOf(*out, d, 1, static_cast<int64_t>(d), SymbolicSize::Part::kSize);
    if (!e) continue;
    r.symbolic.push_back(std::move(*e));
    r.notes.push_back("repeats[" + std::to_string(d) + "] from a symbol at run time");
  }
  return Status::success();
}

/// embedding(weight, indices, padding_idx, ...) with the weight's rows cut: padding_idx shifted
/// to the rank's rows, and the masked lookup as the node's local graph (see the header's table).
Status rewriteEmbedding(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                        const RankPieces& pieces, NodeRewrite& r) {
  if (pieces.inputs.empty() || pieces.inputs[0].empty())
    return invalidArgument("embedding without a weight");
  const TensorPiece& w = pieces.inputs[0][0];
  if (w.global.empty() || w.whole(0)) return Status::success();
  if (c.size() < 2 || pieces.outputs.size() != 1)
    return invalidArgument("embedding with " + std::to_string(c.size()) + " inputs and " +
                           std::to_string(pieces.outputs.size()) + " outputs");
  const int64_t off = w.local[0].offset, rows = w.local[0].size;
  if (const int64_t* p = intAt(c, 2); p && *p >= 0) {
    int64_t local = *p - off;
    r.replace.emplace_back(2, local >= 0 && local < rows ? local : int64_t{-1});
  }
  // The masked lookup of rows [off, off + rows): the indices shifted to the rank's rows, those
  // outside looked up as row 0 and their output rows zeroed. The other arguments (padding_idx as
  // rewritten above, scale_grad_by_freq, sparse) pass through.
  ir::LocalGraphBuilder b(node.qualifiedOp(), c, pieces.outputs.size());
  const ir::ValueId zero = b.constant(int64_t{0});
  const ir::ValueId shifted =
      b.op("aten::sub.Scalar", {b.arg(1), b.constant(off), b.constant(int64_t{1})});
  const ir::ValueId outside =
      b.op("aten::logical_or", {b.op("aten::lt.Scalar", {shifted, zero}),
                                b.op("aten::ge.Scalar", {shifted, b.constant(rows)})});
  std::vector<ir::ValueId> args = {b.arg(0),
                                   b.op("aten::masked_fill.Scalar", {shifted, outside, zero})};
  for (size_t i = 2; i < c.size(); ++i) args.push_back(b.arg(i));
  const ir::ValueId looked_up = b.op("aten::embedding", std::move(args));
  const ir::ValueId out =
      b.op("aten::masked_fill.Scalar",
           {looked_up, b.op("aten::unsqueeze", {outside, b.constant(int64_t{-1})}), zero});
  APC_ASSIGN_OR_RETURN(r.local, b.finish({out}));
  r.notes.push_back("vocab rows [" + std::to_string(off) + ", +" + std::to_string(rows) + ")");
  return Status::success();
}

/// The first global position of a rank's piece of dim 0 as run-time arithmetic on a local tensor
/// `t` of the piece: coordinate x local size (a token-local region's pieces are equal, so the
/// coordinate is the hint's offset / size; a dynamic batch keeps it).
ir::ValueId firstPosition(ir::LocalGraphBuilder& b, ir::ValueId t, const layout::DimPiece& p) {
  const int64_t coordinate = p.size > 0 ? p.offset / p.size : 0;
  const ir::ValueId size = b.op("aten::size.int", {t, b.constant(int64_t{0})}, ir::ValueType::kInt);
  return b.op("aten::mul.int", {size, b.constant(coordinate)}, ir::ValueType::kInt);
}

/// See detail::rewriteLocalSort.
Status rewriteSort(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                   const RankPieces& pieces, NodeRewrite& r) {
  if (pieces.inputs.empty() || pieces.inputs[0].size() != 1) return Status::success();
  const TensorPiece& x = pieces.inputs[0][0];
  if (x.global.size() != 1 || x.whole(0)) return Status::success();
  const bool argsort = node.op == "aten::argsort";
  if (pieces.outputs.size() != (argsort ? 1u : 2u))
    return invalidArgument(node.qualifiedOp() + " with " + std::to_string(pieces.outputs.size()) +
                           " outputs");
  // The rank's own sort (argsort with the node's arguments, which sort's overloads share), the
  // values gathered by it, and the indices made global positions.
  ir::LocalGraphBuilder b(node.qualifiedOp(), c, pieces.outputs.size());
  std::vector<ir::ValueId> args;
  for (size_t i = 0; i < c.size(); ++i) args.push_back(b.arg(i));
  const std::string op = node.overload.empty() ? "aten::argsort" : "aten::argsort." + node.overload;
  const ir::ValueId local = b.op(op, args);
  const ir::ValueId global = b.op(
      "aten::add.Scalar", {local, firstPosition(b, b.arg(0), x.local[0]), b.constant(int64_t{1})});
  if (argsort) {
    APC_ASSIGN_OR_RETURN(r.local, b.finish({global}));
  } else {
    const ir::ValueId values =
        b.op("aten::gather", {b.arg(0), b.constant(int64_t{0}), local, b.constant(false)});
    APC_ASSIGN_OR_RETURN(r.local, b.finish({values, global}));
  }
  r.notes.push_back("the rank's sort, indices + the piece's first position");
  return Status::success();
}

/// See detail::rewriteLocalPositions.
Status rewritePositions(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                        const RankPieces& pieces, NodeRewrite& r) {
  if (pieces.inputs.size() < 2 || pieces.inputs[0].size() != 1) return Status::success();
  const TensorPiece& self = pieces.inputs[0][0];
  if (self.global.empty() || self.whole(0)) return Status::success();
  // The rules never cut an indexed dim: only a token-local region's strategies do, with one index
  // tensor for dim 0 (apc/strategy/token_local.h). An optional-tensor list (no pieces: x[:, idx])
  // leaves dim 0 unindexed, so cutting it needs no rewrite.
  if (pieces.inputs[1].empty()) return Status::success();
  if (pieces.inputs[1].size() != 1)
    return unsupported(node.qualifiedOp() + " with self cut along dim 0 and " +
                       std::to_string(pieces.inputs[1].size()) + " index tensors");
  ir::LocalGraphBuilder b(node.qualifiedOp(), c, pieces.outputs.size());
  const ir::ValueId index = b.op("prim::ListUnpack", {b.arg(1)});
  const ir::ValueId shifted =
      b.op("aten::sub.Scalar",
           {index, firstPosition(b, b.arg(0), self.local[0]), b.constant(int64_t{1})});
  std::vector<ir::ValueId> args = {b.arg(0), b.list({shifted}, ir::ValueType::kTensorList)};
  for (size_t i = 2; i < c.size(); ++i) args.push_back(b.arg(i));
  const ir::ValueId out = b.op(node.qualifiedOp(), std::move(args));
  APC_ASSIGN_OR_RETURN(r.local, b.finish({out}));
  r.notes.push_back("positions - the piece's first position");
  return Status::success();
}

/// See detail::rewriteLocalExperts.
Status rewriteExperts(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                      const RankPieces& pieces, NodeRewrite& r) {
  // Only the 2-d x 3-d form with offsets: in the 3-d x 3-d one (no offsets) dim 0 is a batch,
  // cut on both operands by the rule like any batch dim.
  if (pieces.inputs.size() < 3 || pieces.inputs[0].size() != 1 || pieces.inputs[1].size() != 1 ||
      pieces.inputs[2].size() != 1 || pieces.inputs[0][0].global.size() != 2)
    return Status::success();
  const TensorPiece& w = pieces.inputs[1][0];
  if (w.global.size() != 3 || w.whole(0)) return Status::success();
  // The rows may be the rank's own pairs (tokens cut on other mesh dims): offs then holds the
  // rank's own counts, and the arithmetic below reads both at run time.
  if (!pieces.inputs[2][0].whole(0))
    return unsupported(node.qualifiedOp() + " with its groups cut needs whole offsets");
  const int64_t first = w.local[0].offset, groups = w.local[0].size;
  // Rows [start, end) of the sorted input are the rank's groups (offs holds each group's end):
  // start = offs[first - 1] (0 for the first group), end = offs[first + groups - 1].
  ir::LocalGraphBuilder b(node.qualifiedOp(), c, pieces.outputs.size());
  const ir::ValueId zero = b.constant(int64_t{0});
  auto offsetAt = [&](int64_t i) {
    return b.op("aten::Int.Tensor", {b.op("aten::select.int", {b.arg(2), zero, b.constant(i)})},
                ir::ValueType::kInt);
  };
  const ir::ValueId start = first == 0 ? zero : offsetAt(first - 1);
  const ir::ValueId end = offsetAt(first + groups - 1);
  const ir::ValueId rows =
      b.op("aten::narrow",
           {b.arg(0), zero, start, b.op("aten::sub.int", {end, start}, ir::ValueType::kInt)});
  const ir::ValueId offs =
      b.op("aten::sub.Scalar",
           {b.op("aten::narrow", {b.arg(2), zero, b.constant(first), b.constant(groups)}), start,
            b.constant(int64_t{1})});
  std::vector<ir::ValueId> args = {rows, b.arg(1), offs};
  for (size_t i = 3; i < c.size(); ++i) args.push_back(b.arg(i));
  const ir::ValueId product = b.op(node.qualifiedOp(), std::move(args));
  // The other ranks' rows are zero: the output is Partial, each row on the rank of its group.
  const ir::ValueId after =
      b.op("aten::sub.int", {b.op("aten::size.int", {b.arg(0), zero}, ir::ValueType::kInt), end},
           ir::ValueType::kInt);
  const ir::ValueId pad = b.list({zero, zero, start, after}, ir::ValueType::kIntList);
  const ir::ValueId out = b.op("aten::constant_pad_nd", {product, pad, zero});
  APC_ASSIGN_OR_RETURN(r.local, b.finish({out}));
  r.notes.push_back("the rows of groups [" + std::to_string(first) + ", +" +
                    std::to_string(groups) + "), the others zero");
  return Status::success();
}

}  // namespace

namespace detail {

Status rewriteLocalExperts(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r) {
  return rewriteExperts(node, c, pieces, r);
}

Status rewriteLocalSort(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                        const RankPieces& pieces, NodeRewrite& r) {
  return rewriteSort(node, c, pieces, r);
}

Status rewriteLocalPositions(const ir::Node& node,
                             const std::vector<std::optional<ir::Constant>>& c,
                             const RankPieces& pieces, NodeRewrite& r) {
  return rewritePositions(node, c, pieces, r);
}

Status rewriteViewSizes(const ir::Node&, const std::vector<std::optional<ir::Constant>>& c,
                        const RankPieces& pieces, NodeRewrite& r) {
  return rewriteSizeList(1, c, pieces, r, DynamicSizes::kView);
}

Status rewriteExpandSizes(const ir::Node&, const std::vector<std::optional<ir::Constant>>& c,
                          const RankPieces& pieces, NodeRewrite& r) {
  return rewriteSizeList(1, c, pieces, r, DynamicSizes::kExpand);
}

Status rewriteNewFactorySizes(const ir::Node&, const std::vector<std::optional<ir::Constant>>& c,
                              const RankPieces& pieces, NodeRewrite& r) {
  return rewriteSizeList(1, c, pieces, r);
}

Status rewriteFactorySizes(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r) {
  if (!node.overload.empty() && node.overload != "memory_format") return Status::success();
  return rewriteSizeList(0, c, pieces, r);
}

Status rewriteUnflattenSizes(const ir::Node& node,
                             const std::vector<std::optional<ir::Constant>>& c,
                             const RankPieces& pieces, NodeRewrite& r) {
  if (node.overload != "int" && !node.overload.empty()) return Status::success();
  return rewriteUnflatten(c, pieces, r);
}

Status rewriteArangeBounds(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r) {
  return rewriteArange(node, c, pieces, r);
}

Status rewriteNarrowLength(const ir::Node&, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r) {
  return rewriteNarrow(c, pieces, r);
}

Status rewriteEmbeddingRows(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                            const RankPieces& pieces, NodeRewrite& r) {
  return rewriteEmbedding(node, c, pieces, r);
}

Status rewriteAddendOnce(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                         const RankPieces& pieces, NodeRewrite& r) {
  const size_t addend = node.op == "aten::linear" ? 2 : 0;
  const TensorPiece* out = firstOutput(pieces);
  if (!out || addend >= pieces.inputs.size() || pieces.inputs[addend].size() != 1)
    return Status::success();  // no bias
  const mesh::PlacementTuple& bias = pieces.inputs[addend][0].placement;
  bool off_first = false;  // this rank would add the bias again
  for (size_t m = 0; m < out->placement.size() && m < bias.size(); ++m)
    if (out->placement[m].isPartial() && out->placement[m].reduceOp() == mesh::ReduceOp::kSum &&
        bias[m].isReplicate() && m < pieces.coordinate.size() && pieces.coordinate[m] != 0)
      off_first = true;
  if (!off_first) return Status::success();
  ir::LocalGraphBuilder b(node.qualifiedOp(), c, pieces.outputs.size());
  std::vector<ir::ValueId> args;
  for (size_t i = 0; i < c.size(); ++i)
    args.push_back(i == addend ? b.op("aten::mul.Scalar", {b.arg(i), b.constant(0.0)}) : b.arg(i));
  const ir::ValueId y = b.op(node.qualifiedOp(), std::move(args));
  APC_ASSIGN_OR_RETURN(r.local, b.finish({y}));
  r.notes.push_back("bias added on coordinate 0 only");
  return Status::success();
}

Status rewriteRepeatCounts(const ir::Node&, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r) {
  return rewriteRepeat(c, pieces, r);
}

}  // namespace detail

}  // namespace apc::strategy
