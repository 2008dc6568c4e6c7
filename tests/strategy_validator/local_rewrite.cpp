//===- tests/strategy_validator/local_rewrite.cpp - Local rewrites of op calls ===//
//
// The rewrites of local_rewrite.h, one small function per row of its table.
//
//===----------------------------------------------------------------------===//
#include "local_rewrite.h"

#include <ATen/ATen.h>

#include <optional>

namespace apc::validator {

std::vector<int64_t> TensorPiece::localSizes() const {
  std::vector<int64_t> s;
  for (const cost::DimPiece& p : local) s.push_back(p.size);
  return s;
}

namespace {

/// Index of the schema argument named `name`, if any.
std::optional<size_t> argIndex(const c10::FunctionSchema& schema, const std::string& name) {
  auto i = schema.argumentIndexWithName(name);
  if (!i) return std::nullopt;
  return static_cast<size_t>(*i);
}

std::string listText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

bool isOneOf(const std::string& op, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (op == n) return true;
  return false;
}

/// view/reshape/expand/factories: the size argument becomes the local output shape.
Status rewriteSizeList(const std::string& arg_name, const c10::FunctionSchema& schema,
                       std::vector<c10::IValue>& args, const RankPieces& pieces, LocalCall& call) {
  auto i = argIndex(schema, arg_name);
  if (!i || *i >= args.size()) return invalidArgument("no argument '" + arg_name + "'");
  if (pieces.outputs.empty() || pieces.outputs[0].empty())
    return invalidArgument("no tensor output to take the local shape from");
  std::vector<int64_t> local = pieces.outputs[0][0].localSizes();
  if (args[*i].isIntList() && args[*i].toIntVector() == local) return Status::success();
  call.notes.push_back(arg_name + " := " + listText(local));
  args[*i] = c10::IValue(local);
  return Status::success();
}

/// unflatten(self, dim, sizes): sizes become the local sizes of output dims [dim, dim + n).
Status rewriteUnflatten(const c10::FunctionSchema& schema, std::vector<c10::IValue>& args,
                        const RankPieces& pieces, LocalCall& call) {
  auto di = argIndex(schema, "dim");
  auto si = argIndex(schema, "sizes");
  if (!di || !si || !args[*di].isInt() || !args[*si].isIntList())
    return invalidArgument("unflatten without int dim and int[] sizes");
  if (pieces.outputs.empty() || pieces.outputs[0].empty())
    return invalidArgument("no tensor output");
  std::vector<int64_t> out = pieces.outputs[0][0].localSizes();
  std::vector<int64_t> sizes = args[*si].toIntVector();
  int64_t in_rank = static_cast<int64_t>(out.size()) - static_cast<int64_t>(sizes.size()) + 1;
  int64_t dim = args[*di].toInt();
  if (dim < 0) dim += in_rank;
  if (dim < 0 || dim + static_cast<int64_t>(sizes.size()) > static_cast<int64_t>(out.size()))
    return invalidArgument("unflatten dim out of range");
  std::vector<int64_t> local(out.begin() + dim,
                             out.begin() + dim + static_cast<int64_t>(sizes.size()));
  if (local == sizes) return Status::success();
  call.notes.push_back("sizes := " + listText(local));
  args[*si] = c10::IValue(local);
  return Status::success();
}

/// arange: the bounds of the rank's piece of the 1-d output.
Status rewriteArange(const c10::FunctionSchema& schema, std::vector<c10::IValue>& args,
                     const RankPieces& pieces, LocalCall& call) {
  if (pieces.outputs.empty() || pieces.outputs[0].empty() ||
      pieces.outputs[0][0].global.size() != 1)
    return invalidArgument("arange without a 1-d output");
  const TensorPiece& out = pieces.outputs[0][0];
  if (out.whole(0)) return Status::success();
  auto ei = argIndex(schema, "end");
  if (!ei) return invalidArgument("arange without 'end'");
  auto si = argIndex(schema, "start");
  auto pi = argIndex(schema, "step");
  c10::Scalar start = si ? args[*si].toScalar() : c10::Scalar(int64_t{0});
  c10::Scalar step = pi ? args[*pi].toScalar() : c10::Scalar(int64_t{1});
  const int64_t off = out.local[0].offset, len = out.local[0].size;
  c10::Scalar new_start, new_end;
  if (start.isIntegral(false) && step.isIntegral(false)) {
    new_start = start.toLong() + off * step.toLong();
    new_end = new_start.toLong() + len * step.toLong();
  } else {
    new_start = start.toDouble() + static_cast<double>(off) * step.toDouble();
    new_end = new_start.toDouble() + (static_cast<double>(len) - 0.5) * step.toDouble();
  }
  if (!si) {  // arange(end): becomes arange(start, end) only through the schema; not expressible
    if (off != 0) return unsupported("arange(end) with a cut output needs the start overload");
    args[*ei] = c10::IValue(new_end);
  } else {
    args[*si] = c10::IValue(new_start);
    args[*ei] = c10::IValue(new_end);
  }
  call.notes.push_back("arange bounds := [" + std::to_string(off) + ", +" + std::to_string(len) +
                       ")");
  return Status::success();
}

/// narrow(self, dim, start, length) over the whole of a cut dim: the whole local piece.
Status rewriteNarrow(const c10::FunctionSchema& schema, std::vector<c10::IValue>& args,
                     const RankPieces& pieces, LocalCall& call) {
  auto di = argIndex(schema, "dim");
  auto si = argIndex(schema, "start");
  auto li = argIndex(schema, "length");
  if (!di || !si || !li || !args[*di].isInt() || !args[*li].isInt() || !args[*si].isInt())
    return Status::success();  // narrow.Tensor (start as a tensor): unchanged
  if (pieces.inputs.empty() || pieces.inputs[0].empty()) return invalidArgument("no input");
  const TensorPiece& in = pieces.inputs[0][0];
  int64_t dim = args[*di].toInt();
  if (dim < 0) dim += static_cast<int64_t>(in.global.size());
  size_t d = static_cast<size_t>(dim);
  if (d >= in.global.size() || in.whole(d)) return Status::success();
  if (args[*si].toInt() != 0 || args[*li].toInt() != in.global[d]) return Status::success();
  args[*li] = c10::IValue(in.local[d].size);
  call.notes.push_back("length := " + std::to_string(in.local[d].size));
  return Status::success();
}

/// embedding(weight, indices, padding_idx, ...) with the weight's rows cut.
Status rewriteEmbedding(std::vector<c10::IValue>& args, const RankPieces& pieces, LocalCall& call) {
  if (pieces.inputs.empty() || pieces.inputs[0].empty() || args.size() < 2 || !args[1].isTensor())
    return invalidArgument("embedding without weight and indices");
  const TensorPiece& w = pieces.inputs[0][0];
  if (w.whole(0)) return Status::success();
  const int64_t off = w.local[0].offset, rows = w.local[0].size;
  at::Tensor idx = args[1].toTensor() - off;
  at::Tensor outside = (idx < 0).logical_or(idx >= rows);
  args[1] = c10::IValue(idx.masked_fill(outside, 0));
  if (args.size() > 2 && args[2].isInt() && args[2].toInt() >= 0) {
    int64_t p = args[2].toInt() - off;
    args[2] = c10::IValue(p >= 0 && p < rows ? p : int64_t{-1});
  }
  call.notes.push_back("indices -= " + std::to_string(off) + ", rows outside [0, " +
                       std::to_string(rows) + ") zeroed");
  call.post = [outside](std::vector<c10::IValue>& outs) {
    at::Tensor o = outs.at(0).toTensor();
    outs[0] = c10::IValue(o.masked_fill(outside.unsqueeze(-1), 0));
  };
  return Status::success();
}

}  // namespace

Expected<LocalCall> localizeCall(const ir::Node& node, const c10::FunctionSchema* schema,
                                 std::vector<c10::IValue>& args, const RankPieces& pieces) {
  LocalCall call;
  if (!schema) return call;
  const std::string& op = node.op;
  Status st;
  if (isOneOf(op, {"aten::view", "aten::_unsafe_view", "aten::expand", "aten::broadcast_to"})) {
    if (argIndex(*schema, "size")) st = rewriteSizeList("size", *schema, args, pieces, call);
  } else if (op == "aten::reshape") {
    st = rewriteSizeList("shape", *schema, args, pieces, call);
  } else if (isOneOf(op,
                     {"aten::full", "aten::ones", "aten::zeros", "aten::empty", "aten::new_full",
                      "aten::new_ones", "aten::new_zeros", "aten::new_empty"})) {
    if (argIndex(*schema, "size")) st = rewriteSizeList("size", *schema, args, pieces, call);
  } else if (op == "aten::unflatten") {
    st = rewriteUnflatten(*schema, args, pieces, call);
  } else if (op == "aten::arange") {
    st = rewriteArange(*schema, args, pieces, call);
  } else if (op == "aten::narrow") {
    st = rewriteNarrow(*schema, args, pieces, call);
  } else if (op == "aten::embedding") {
    st = rewriteEmbedding(args, pieces, call);
  }
  if (!st.ok()) return st.error().withContext(node.qualifiedOp());
  return call;
}

}  // namespace apc::validator
