//===- lib/strategy/tensor_ops.cpp - Concatenation, slicing, lists, factories ===//
//
// Rules of ops that move whole slices of tensors around:
//   cat(tensors[], dim)                 any dim but the cat dim (every element and the output
//                                       alike); P(sum) -> P(sum)
//   stack(tensors[], dim)               any input dim, at its output position; P(sum)
//   split, split_with_sizes, chunk      any dim but the split dim, on the input and the Tensor[]
//                                       output; P(sum)
//   unbind(self, dim)                   any dim but dim, renumbered; P(sum)
//   slice(self, dim, start, end, step), narrow(self, dim, start, length)
//                                       any dim but the sliced one, which too when the slice is
//                                       the whole dim (output size == input size); P(sum)
//   select(self, dim, index)            any dim but dim, renumbered; P(sum)
//   cumsum(self, dim), diff(self, n, dim, prepend, append)
//                                       any dim but dim; P(sum) (both linear)
//   slice_scatter, select_scatter       self, src and out alike as slice / select; P(sum)
//   fill(self, value)                   self's placement, S or R (value R); no Partial
//   index.Tensor(self, indices)         leading dims indexed by integer tensors of one rank that
//                                       broadcast: self S(unindexed dim), or indices S(j) -> out
//                                       S(j) (an index of size 1 there whole); self P
//   pad, constant_pad_nd                any dim not padded; P(sum) for constant 0 padding
//   new_zeros, new_ones, new_full, new_empty
//                                       self in any placement (dtype only); out R or S(any)
//   index_select(self, dim, index)      self S(d != dim) with index R; or index S(0) with self R
//                                       -> out S(dim) (each rank selects its indices); self P
//   triu, tril                          the last two dims R (the mask depends on absolute row and
//                                       column), leading dims free; P(sum) (zeroing is linear)
//   prim::ListConstruct (Tensor[])      one placement for every element and the list: any dim
//                                       all elements have (an element of size 1 there R: it
//                                       broadcasts, layout::elementPlacement); P(sum)
//   prim::ListUnpack (Tensor[] -> tensors) the same
//   factories: full, ones, zeros, empty, arange, scalar_tensor, prim::NumToTensor
//                                       Replicate only (as DTensor: a sharded factory output
//                                       would be a free local slice, but R keeps lowering simple
//                                       and the consumer's rule can still slice it at no cost)
//   zeros_like, ones_like, empty_like, full_like
//                                       the input's placement (S or R): each rank fills its
//                                       local shape
//
//===----------------------------------------------------------------------===//
#include "apc/strategy/rules.h"
#include "rule_util.h"

namespace apc::strategy {

namespace {

using namespace detail;

/// Placement of the single tensor input and every tensor output.
DimStrategy inOut(const RuleContext& c, Placement in, Placement out) {
  DimStrategy s = emptyDim(c);
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.isTensorInput(i)) s.inputs[i] = in;
  for (size_t i = 0; i < c.numOutputs(); ++i)
    if (c.isTensorOutput(i)) s.outputs[i] = out;
  return s;
}

/// Ops that keep the rank and can shard every dim except `dim` (argument `dim_arg`).
std::vector<DimStrategy> exceptDimRule(const RuleContext& c, size_t dim_arg) {
  int64_t r = commonRank(c);
  auto dim = c.intArg(dim_arg);
  if (r < 1 || !dim) return {};
  auto d = normDim(*dim, r);
  if (!d) return {};
  return uniformStrategies(c, dimsExcept(r, {*d}), kSumOnly);
}

/// Ops that drop dim `dim` (argument 1): select, unbind.
std::vector<DimStrategy> dropDimRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  auto dim = c.intArg(1);
  if (r < 1 || !dim || c.input(0).type != ir::ValueType::kTensor) return {};
  auto d = normDim(*dim, r);
  if (!d) return {};
  for (size_t i = 0; i < c.numOutputs(); ++i)
    if (c.isTensorOutput(i) && c.outputRank(i) != r - 1) return {};
  std::vector<DimStrategy> res;
  res.push_back(inOut(c, R(), R()));
  for (int64_t k = 0; k < r; ++k)
    if (k != *d) res.push_back(inOut(c, S(k), S(k < *d ? k : k - 1)));
  res.push_back(inOut(c, P(), P()));
  return res;
}

std::vector<DimStrategy> catRule(const RuleContext& c) {
  return exceptDimRule(c, 1);
}

std::vector<DimStrategy> stackRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  auto dim = c.intArg(1);
  if (r < 0 || !dim || c.outputRank(0) != r + 1) return {};
  auto d = normDim(*dim, r + 1);
  if (!d) return {};
  std::vector<DimStrategy> res;
  res.push_back(inOut(c, R(), R()));
  for (int64_t k = 0; k < r; ++k) res.push_back(inOut(c, S(k), S(k < *d ? k : k + 1)));
  res.push_back(inOut(c, P(), P()));
  return res;
}

std::vector<DimStrategy> sliceRule(const RuleContext& c) {
  int64_t r = commonRank(c);
  auto dim = c.intArg(1);
  if (r < 1 || !dim || c.numOutputs() != 1) return {};
  auto d = normDim(*dim, r);
  if (!d) return {};
  bool whole = c.inputSizes(0) == c.outputSizes(0);
  return uniformStrategies(c, whole ? dimsExcept(r, {}) : dimsExcept(r, {*d}), kSumOnly);
}

/// index_select(self, dim, index [k]).
std::vector<DimStrategy> indexSelectRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  auto dim = c.intArg(1);
  if (r < 1 || !dim || c.inputRank(2) > 1 || c.outputRank(0) != r) return {};
  auto d = normDim(*dim, r);
  if (!d) return {};
  auto make = [&](Placement self, Placement index, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.inputs[2] = index;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R(), R()));
  for (int64_t k = 0; k < r; ++k)
    if (k != *d) res.push_back(make(S(k), R(), S(k)));
  if (c.inputRank(2) == 1) res.push_back(make(R(), S(0), S(*d)));
  res.push_back(make(P(), R(), P()));
  return res;
}

std::vector<DimStrategy> triangleRule(const RuleContext& c) {
  int64_t r = commonRank(c);
  if (r < 2) return {};
  return uniformStrategies(c, dimsExcept(r, {r - 2, r - 1}), kSumOnly);
}

/// roll(self, shifts, dims) and flip(self, dims): the rolled or flipped dims stay whole; a roll
/// without dims rolls the flattened tensor (all R). Both are linear: Partial passes through.
std::vector<DimStrategy> rollRule(const RuleContext& c, size_t dims_arg) {
  int64_t r = c.inputRank(0);
  if (r < 0 || c.outputRank(0) != r) return {};
  auto dims = c.intListArg(dims_arg);
  if (!dims) return {};
  if (dims->empty()) return {replicateAll(c)};
  std::vector<int64_t> kept;
  for (int64_t d : *dims) {
    auto n = normDim(d, r);
    if (!n) return {};
    kept.push_back(*n);
  }
  return uniformStrategies(c, dimsExcept(r, kept), kSumOnly);
}

/// slice_scatter(self, src, dim, start, end, step): self, src and the output alike on any dim but
/// the scattered one (that one too when src covers it whole); P(sum): the op is linear in
/// (self, src) together.
std::vector<DimStrategy> sliceScatterRule(const RuleContext& c) {
  int64_t r = commonRank(c);
  auto dim = c.intArg(2);
  if (r < 1 || !dim || c.numOutputs() != 1) return {};
  auto d = normDim(*dim, r);
  if (!d) return {};
  bool whole = c.inputSizes(0) == c.inputSizes(1);
  return uniformStrategies(c, whole ? dimsExcept(r, {}) : dimsExcept(r, {*d}), kSumOnly);
}

/// select_scatter(self, src, dim, index): src lacks `dim`; self and the output S(k != dim) with
/// src S(k renumbered); P(sum).
std::vector<DimStrategy> selectScatterRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  auto dim = c.intArg(2);
  if (r < 1 || !dim || c.inputRank(1) != r - 1 || c.outputRank(0) != r) return {};
  auto d = normDim(*dim, r);
  if (!d) return {};
  auto make = [&](Placement self, Placement src) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.inputs[1] = src;
    s.outputs[0] = self;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R()));
  for (int64_t k = 0; k < r; ++k)
    if (k != *d) res.push_back(make(S(k), S(k < *d ? k : k - 1)));
  res.push_back(make(P(), P()));
  return res;
}

/// The index tensors of index.Tensor's list argument and where they start: a Tensor[] (they
/// index self's leading dims), or an optional-tensor list built by prim::ListConstruct with Nones
/// (whole dims) before them, as `x[:, :, idx]` exports, and after them (whole too, as if absent).
/// Nullopt for other lists: one with a None between two tensors moves the indexed dims first.
struct IndexTensors {
  std::vector<const ir::TensorMeta*> metas;
  int64_t first = 0;    // self's first indexed dim: the leading Nones
  bool opaque = false;  // an optional-tensor list: read whole, no placement of its own
};
std::optional<IndexTensors> indexTensors(const RuleContext& c) {
  IndexTensors r;
  if (c.isTensorInput(1)) {
    r.metas = c.inputMetas(1);
    return r;
  }
  const ir::Value& list = c.input(1);
  if (list.type != ir::ValueType::kOther || !list.producer.valid()) return std::nullopt;
  const ir::Node& build = c.graph.node(list.producer);
  if (build.op != "prim::ListConstruct") return std::nullopt;
  r.opaque = true;
  bool after = false;  // past the tensors
  for (ir::ValueId id : build.inputs) {
    const ir::Value& e = c.graph.value(id);
    if (e.type == ir::ValueType::kNone) {
      if (r.metas.empty())
        ++r.first;
      else
        after = true;
    } else if (e.isTensor() && e.tensor && !after) {
      r.metas.push_back(&*e.tensor);
    } else {
      return std::nullopt;
    }
  }
  return r;
}

/// index.Tensor(self, indices) with n integer index tensors of one rank k on n consecutive dims of
/// self from `first` (IndexTensors), broadcasting (each dim of one size or 1, as Hugging Face's
/// mask build [B, 1, 1, 1] with [1, 1, S, 1]): out = self.shape[:first] + broadcast shape +
/// self.shape[first + n:]. self S(d) in a dim not indexed with the indices R -> out S(d) before
/// them, S(d - n + k) after; the indices S(j) with self R -> out S(first + j) (each rank gathers
/// its own indices; an index of size 1 in dim j is whole, layout::elementPlacement), for a Tensor[]
/// only: an optional-tensor list's tensors are read whole; self P -> out P (gathering is linear).
std::vector<DimStrategy> indexRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  if (r < 1 || c.numInputs() != 2 || c.numOutputs() != 1) return {};
  std::optional<IndexTensors> it = indexTensors(c);
  if (!it) return {};
  const std::vector<const ir::TensorMeta*>& idx = it->metas;
  const int64_t first = it->first;
  if (idx.empty() || first + static_cast<int64_t>(idx.size()) > r) return {};
  const int64_t k = idx[0]->rank();
  std::vector<int64_t> shape(static_cast<size_t>(std::max<int64_t>(k, 0)), 1);  // broadcast
  for (const ir::TensorMeta* m : idx) {
    if ((m->dtype != ir::DType::kI64 && m->dtype != ir::DType::kI32) || m->rank() != k) return {};
    const std::vector<int64_t> sizes = ir::hintSizes(m->shape);
    for (size_t j = 0; j < sizes.size(); ++j) {
      if (sizes[j] == 1 || sizes[j] == shape[j]) continue;
      if (shape[j] != 1) return {};
      shape[j] = sizes[j];
    }
  }
  const int64_t n = static_cast<int64_t>(idx.size());
  if (c.outputRank(0) != k + r - n) return {};
  const std::vector<int64_t> out = c.outputSizes(0), self = c.inputSizes(0);
  for (int64_t d = 0; d < first; ++d)
    if (out.at(static_cast<size_t>(d)) != self.at(static_cast<size_t>(d))) return {};
  for (size_t j = 0; j < shape.size(); ++j)
    if (out.at(static_cast<size_t>(first) + j) != shape[j]) return {};
  auto make = [&](Placement self_p, Placement index, Placement out_p) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self_p;
    if (!it->opaque) s.inputs[1] = index;
    s.outputs[0] = out_p;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R(), R()));
  for (int64_t d = 0; d < first; ++d) res.push_back(make(S(d), R(), S(d)));
  for (int64_t d = first + n; d < r; ++d) res.push_back(make(S(d), R(), S(d - n + k)));
  if (!it->opaque)
    for (int64_t j = 0; j < k; ++j) res.push_back(make(R(), S(j), S(j)));
  res.push_back(make(P(), R(), P()));
  return res;
}

/// index_put(self, indices, values, accumulate): self with values written (or, accumulating,
/// added) at self[indices], the first n dims of self indexed by n integer index tensors of one
/// shape B. A dim of self past the indexed ones may be cut, with values' matching trailing dim
/// (whole where values broadcast along it) and the output's; the indices stay whole. Accumulating
/// is linear in self and values together: P(sum) of both gives P(sum). (Writing is too, but
/// which of two writes to one element wins is not promised, so a Partial write is not offered.)
std::vector<DimStrategy> indexPutRule(const RuleContext& c) {
  const int64_t r = c.inputRank(0);
  if (r < 1 || c.numInputs() < 3 || !c.isTensorInput(1) || !c.isTensorInput(2) ||
      c.numOutputs() != 1 || c.outputRank(0) != r)
    return {};
  std::vector<const ir::TensorMeta*> idx = c.inputMetas(1);
  if (idx.empty() || static_cast<int64_t>(idx.size()) > r) return {};
  for (const ir::TensorMeta* m : idx)
    if ((m->dtype != ir::DType::kI64 && m->dtype != ir::DType::kI32) || m->rank() != idx[0]->rank())
      return {};
  const auto n = static_cast<int64_t>(idx.size());
  const int64_t vr = c.inputRank(2);
  const std::vector<int64_t> self = c.inputSizes(0), values = c.inputSizes(2);
  auto make = [&](Placement s, Placement v, Placement out) {
    DimStrategy st = emptyDim(c);
    st.inputs[0] = s;
    st.inputs[1] = R();
    st.inputs[2] = v;
    st.outputs[0] = out;
    return st;
  };
  std::vector<DimStrategy> res{make(R(), R(), R())};
  for (int64_t d = n; d < r; ++d) {
    const int64_t vd = vr - (r - d);  // values' dim under self's dim d (broadcast from the right)
    if (vd >= 0 && values.at(static_cast<size_t>(vd)) == self.at(static_cast<size_t>(d)) &&
        self.at(static_cast<size_t>(d)) != 1)
      res.push_back(make(S(d), S(vd), S(d)));
    else if (vd < 0 || values.at(static_cast<size_t>(vd)) == 1)
      res.push_back(make(S(d), R(), S(d)));
  }
  if (c.boolArg(3).value_or(false)) res.push_back(make(P(), P(), P()));
  return res;
}

/// repeat(self, repeats): out dim j = self dim j - lead (lead = len(repeats) - rank) repeated
/// repeats[j] times. A dim repeated once keeps self's cut (S(i) -> S(i + lead)); a tiled dim is
/// whole (a piece of a tiling is no tiling of a piece). P(sum) passes through (linear).
std::vector<DimStrategy> repeatRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  auto repeats = c.intListArg(1);
  if (r < 0 || !repeats || c.numOutputs() != 1) return {};
  const auto o = static_cast<int64_t>(repeats->size());
  if (o < r || c.outputRank(0) != o) return {};
  auto make = [&](Placement self, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res = {make(R(), R()), make(P(), P())};
  for (int64_t i = 0; i < r; ++i)
    if ((*repeats)[static_cast<size_t>(i + o - r)] == 1) res.push_back(make(S(i), S(i + o - r)));
  return res;
}

/// pad(self, pad, mode, value) and constant_pad_nd(self, pad, value): `pad` has two entries per
/// padded dim, from the last dim backwards; every other dim is free. Constant padding with 0 is
/// linear: P(sum) passes through.
std::vector<DimStrategy> padRule(const RuleContext& c, bool has_mode) {
  int64_t r = commonRank(c);
  auto pad = c.intListArg(1);
  if (r < 1 || !pad || pad->size() % 2 != 0 || static_cast<int64_t>(pad->size() / 2) > r) return {};
  size_t value_arg = has_mode ? 3 : 2;
  bool constant = true;
  if (has_mode) {
    const auto& mode = c.input(2).constant;
    const std::string* m = mode ? std::get_if<std::string>(&*mode) : nullptr;
    constant = m && *m == "constant";
  }
  auto value = c.doubleArg(value_arg);
  bool zero = constant && (c.isNoneArg(value_arg) || (value && *value == 0.0));
  std::vector<int64_t> padded;
  for (size_t i = 0; i < pad->size() / 2; ++i) padded.push_back(r - 1 - static_cast<int64_t>(i));
  return uniformStrategies(c, dimsExcept(r, padded), zero ? kSumOnly : kNoPartial);
}

/// new_zeros / new_ones / new_full / new_empty(self, size, ...): self gives only the dtype and
/// device, so it may come in any placement; the output is Replicate or sharded on any dim (each
/// rank makes its local size: lowering rewrites `size`).
std::vector<DimStrategy> newFactoryRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  int64_t o = c.outputRank(0);
  if (r < 0 || o < 0 || c.numOutputs() != 1) return {};
  auto make = [&](Placement self, Placement out) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = self;
    s.outputs[0] = out;
    return s;
  };
  std::vector<DimStrategy> res;
  res.push_back(make(R(), R()));
  for (int64_t d = 0; d < r; ++d) res.push_back(make(S(d), R()));
  res.push_back(make(P(), R()));
  for (int64_t d = 0; d < o; ++d) res.push_back(make(R(), S(d)));
  return res;
}

/// fill(self, value): the output takes self's placement (S or R; each rank fills its local
/// shape); a tensor value is a 0-dim tensor, Replicate. No Partial (a constant is not linear).
std::vector<DimStrategy> fillRule(const RuleContext& c) {
  int64_t r = c.inputRank(0);
  if (r < 0 || c.outputRank(0) != r) return {};
  if (c.isTensorInput(1) && c.inputRank(1) != 0) return {};
  auto make = [&](Placement p) {
    DimStrategy s = emptyDim(c);
    s.inputs[0] = p;
    if (c.isTensorInput(1)) s.inputs[1] = R();
    s.outputs[0] = p;
    return s;
  };
  std::vector<DimStrategy> res{make(R())};
  for (int64_t k = 0; k < r; ++k) res.push_back(make(S(k)));
  return res;
}

/// prim::ListUnpack of a Tensor[]: every element alike.
std::vector<DimStrategy> listRule(const RuleContext& c) {
  return identityStrategies(c, kSumOnly);
}

/// prim::ListConstruct building a Tensor[]: the list's placement for every element, except that an
/// element of size 1 in a cut dim is read whole (Replicate): it broadcasts against the others and
/// is whole under the cut (layout::elementPlacement, the one rule for list elements). Any other
/// list holding tensors (optional tensors: index's [None, idx]) has no placement: its tensors are
/// read whole, which is what its consumers' rules assume.
std::vector<DimStrategy> listConstructRule(const RuleContext& c) {
  if (!c.isTensorOutput(0)) return {replicateAll(c)};
  std::vector<DimStrategy> res = identityStrategies(c, kSumOnly);
  for (DimStrategy& s : res) {
    if (!s.outputs[0] || !s.outputs[0]->isShard()) continue;
    const auto d = static_cast<size_t>(s.outputs[0]->dim());
    for (size_t i = 0; i < c.numInputs(); ++i)
      if (s.inputs[i] && c.inputSizes(i).at(d) == 1) s.inputs[i] = R();
  }
  return res;
}

std::vector<DimStrategy> factoryRule(const RuleContext& c) {
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.isTensorInput(i)) return {};
  return {replicateAll(c)};
}

std::vector<DimStrategy> likeRule(const RuleContext& c) {
  return identityStrategies(c, kNoPartial);
}

/// Writes the output once.
Work factoryWork(const RuleContext& c, const LocalShapes& l) {
  Work w;
  w.bytes = localOutputBytes(c, l, 0);
  return w;
}

}  // namespace

void registerTensorOpRules(Registry& r) {
  using cost::OpFamily;
  r.add("aten::cat", catRule, OpFamily::kIndex);
  r.add(
      "aten::chunk", [](const RuleContext& c) { return exceptDimRule(c, 2); }, OpFamily::kView,
      noWork);
  // cumsum(self, dim, dtype) and diff(self, n, dim, prepend, append): any dim but `dim`; linear.
  r.add(
      "aten::cumsum",
      [](const RuleContext& c) {
        std::vector<DimStrategy> res = exceptDimRule(c, 1);
        // Floats summed as integers (cumsum(counts, 0, dtype=int32)) cast every partial sum
        // before adding them up: no Partial then.
        if (c.isTensorInput(0) && c.isTensorOutput(0) && ir::isFloating(c.input(0).tensor->dtype) &&
            !ir::isFloating(c.output(0).tensor->dtype))
          std::erase_if(res, [](const DimStrategy& s) {
            return !s.outputs.empty() && s.outputs[0] && s.outputs[0]->isPartial();
          });
        return res;
      },
      OpFamily::kPointwise);
  r.add(
      "aten::diff", [](const RuleContext& c) { return exceptDimRule(c, 2); }, OpFamily::kPointwise);
  r.add("aten::index_select", indexSelectRule, OpFamily::kIndex);
  r.add("aten::narrow", sliceRule, OpFamily::kView, noWork);
  r.add("aten::select.int", dropDimRule, OpFamily::kView, noWork);
  r.add("aten::slice.Tensor", sliceRule, OpFamily::kView, noWork);
  r.add(
      "aten::split", [](const RuleContext& c) { return exceptDimRule(c, 2); }, OpFamily::kView,
      noWork);
  r.add(
      "aten::split_with_sizes", [](const RuleContext& c) { return exceptDimRule(c, 2); },
      OpFamily::kView, noWork);
  // slice's, narrow's and select's gradient is a zero-filled input with the output's gradient
  // copied into its piece: the input's bytes written, the output's read and written.
  for (const char* op : {"aten::narrow", "aten::select.int", "aten::slice.Tensor"})
    r.entry(op)->backward_work = [](const RuleContext& c, const LocalShapes& local) {
      Work w;
      w.bytes = detail::localInputBytes(c, local, 0) + 2 * detail::localOutputBytes(c, local, 0);
      return w;
    };
  r.add("aten::slice_scatter", sliceScatterRule, OpFamily::kIndex);
  r.add("aten::select_scatter", selectScatterRule, OpFamily::kIndex);
  r.add("aten::index.Tensor", indexRule, OpFamily::kIndex);
  r.add("aten::index_put", indexPutRule, OpFamily::kIndex);
  r.add("aten::repeat", repeatRule, OpFamily::kIndex);
  r.add(
      "aten::pad", [](const RuleContext& c) { return padRule(c, true); }, OpFamily::kIndex);
  r.add(
      "aten::constant_pad_nd", [](const RuleContext& c) { return padRule(c, false); },
      OpFamily::kIndex);
  r.add("aten::fill.Scalar", fillRule, OpFamily::kFactory, factoryWork);
  r.add("aten::fill.Tensor", fillRule, OpFamily::kFactory, factoryWork);
  r.add("aten::stack", stackRule, OpFamily::kIndex);
  r.add(
      "aten::roll", [](const RuleContext& c) { return rollRule(c, 2); }, OpFamily::kIndex);
  r.add(
      "aten::flip", [](const RuleContext& c) { return rollRule(c, 1); }, OpFamily::kIndex);
  r.add("aten::tril", triangleRule, OpFamily::kPointwise);
  r.add("aten::triu", triangleRule, OpFamily::kPointwise);
  r.add("aten::unbind.int", dropDimRule, OpFamily::kView, noWork);
  r.add(
      "aten::unsafe_chunk", [](const RuleContext& c) { return exceptDimRule(c, 2); },
      OpFamily::kView, noWork);
  r.add(
      "aten::unsafe_split", [](const RuleContext& c) { return exceptDimRule(c, 2); },
      OpFamily::kView, noWork);
  r.add("prim::ListConstruct", listConstructRule, OpFamily::kView, noWork);
  r.add("prim::ListUnpack", listRule, OpFamily::kView, noWork);

  for (const char* op : {"aten::arange", "aten::empty", "aten::full", "aten::ones",
                         "aten::scalar_tensor", "aten::zeros", "prim::NumToTensor"})
    r.add(op, factoryRule, OpFamily::kFactory, factoryWork);
  for (const char* op : {"aten::new_empty", "aten::new_full", "aten::new_ones", "aten::new_zeros"})
    r.add(op, newFactoryRule, OpFamily::kFactory, factoryWork);
  // zero(self): the functional zero_ (zeros like self).
  for (const char* op :
       {"aten::empty_like", "aten::full_like", "aten::ones_like", "aten::zero", "aten::zeros_like"})
    r.add(op, likeRule, OpFamily::kFactory, factoryWork);
  // The arguments lowering rewrites for the rank's local piece (apc/strategy/local_rewrite.h).
  for (const char* op : {"aten::empty", "aten::full", "aten::ones", "aten::zeros"})
    r.entry(op)->local_rewrite = rewriteFactorySizes;
  for (const char* op : {"aten::new_empty", "aten::new_full", "aten::new_ones", "aten::new_zeros"})
    r.entry(op)->local_rewrite = rewriteNewFactorySizes;
  r.entry("aten::arange")->local_rewrite = rewriteArangeBounds;
  r.entry("aten::narrow")->local_rewrite = rewriteNarrowLength;
  r.entry("aten::repeat")->local_rewrite = rewriteRepeatCounts;
  // Only a token-local region's strategies cut the indexed dim (apc/strategy/token_local.h).
  r.entry("aten::index.Tensor")->local_rewrite = rewriteLocalPositions;
  r.entry("aten::index_put")->local_rewrite = rewriteLocalPositions;

  // Sample invocations (OpInfo::samples) for the strategy validator.
  using S = SampleArg;
  auto samples = [&](std::initializer_list<const char*> ops, std::vector<OpSample> list) {
    for (const char* op : ops) r.setSamples(op, [list] { return list; });
  };
  const ir::DType f = ir::DType::kF32;
  samples({"aten::cat"}, {{"", {S::list(f, {{5, 6}, {5, 3}}), S::of(1)}},
                          {"", {S::list(f, {{2, 6}, {3, 6}}), S::of(0)}},
                          {"", {S::list(f, {{5, 6}, {5, 2}}), S::of(-1)}}});
  samples({"aten::stack"}, {{"", {S::list(f, {{5, 6}, {5, 6}}), S::of(0)}},
                            {"", {S::list(f, {{5, 6}, {5, 6}, {5, 6}}), S::of(-1)}},
                            {"", {S::list(f, {{5, 6}, {5, 6}}), S::of(1)}}});
  samples({"aten::chunk", "aten::unsafe_chunk"}, {{"", {S::f32({6, 5}), S::of(3), S::of(0)}},
                                                  {"", {S::f32({5, 6}), S::of(2), S::of(-1)}}});
  samples({"aten::split", "aten::unsafe_split"},
          {{"Tensor", {S::f32({7, 6}), S::of(3), S::of(0)}},
           {"Tensor", {S::f32({5, 6}), S::of(4), S::of(1)}}});
  samples({"aten::split_with_sizes"},
          {{"", {S::f32({7, 6}), S::of(std::vector<int64_t>{3, 4}), S::of(0)}},
           {"", {S::f32({5, 6}), S::of(std::vector<int64_t>{1, 5}), S::of(-1)}}});
  samples({"aten::cumsum"}, {{"", {S::f32({5, 6}), S::of(0), S::of(int64_t{3})}},  // dtype int32
                             {"", {S::f32({5, 6}), S::of(1)}},
                             {"", {S::f32({2, 5, 7}), S::of(-1)}},
                             {"", {S::f32({5, 6}), S::of(0)}}});
  samples({"aten::diff"}, {{"", {S::f32({5, 6})}}, {"", {S::f32({5, 6}), S::of(1), S::of(0)}}});
  samples({"aten::index_select"}, {{"", {S::f32({5, 6}), S::of(0), S::i64({3})}},
                                   {"", {S::f32({5, 6}), S::of(1), S::i64({4})}}});
  samples({"aten::narrow"}, {{"", {S::f32({7, 6}), S::of(0), S::of(2), S::of(4)}},
                             {"", {S::f32({5, 6}), S::of(1), S::of(1), S::of(3)}}});
  samples({"aten::select.int"}, {{"", {S::f32({5, 6}), S::of(0), S::of(2)}},
                                 {"", {S::f32({2, 5, 6}), S::of(-1), S::of(3)}}});
  samples({"aten::slice.Tensor"},
          {{"", {S::f32({7, 6}), S::of(0), S::of(1), S::of(5), S::of(1)}},
           {"", {S::f32({5, 6}), S::of(1), S::of(0), S::of(6), S::of(2)}},
           {"", {S::f32({5, 6}), S::of(-1), S::of(-3), S::none(), S::of(1)}}});
  samples({"aten::slice_scatter"},
          {{"", {S::f32({7, 6}), S::f32({4, 6}), S::of(0), S::of(1), S::of(5), S::of(1)}},
           {"", {S::f32({5, 6}), S::f32({5, 3}), S::of(1), S::of(0), S::of(6), S::of(2)}}});
  samples({"aten::select_scatter"}, {{"", {S::f32({5, 6}), S::f32({6}), S::of(0), S::of(2)}},
                                     {"", {S::f32({5, 6}), S::f32({5}), S::of(-1), S::of(1)}}});
  samples({"aten::index.Tensor"}, {{"", {S::f32({5, 6}), S::list(ir::DType::kI64, {{4}})}}});
  // index_put: one index (rows), two (an element per pair) with values broadcast along the last
  // dim, and accumulating (duplicate rows add up)
  samples(
      {"aten::index_put"},
      {{"", {S::f32({5, 6}), S::list(ir::DType::kI64, {{4}}), S::f32({4, 6}), S::of(false)}},
       {"", {S::f32({5, 6, 4}), S::list(ir::DType::kI64, {{3}, {3}}), S::f32({1}), S::of(false)}},
       {"", {S::f32({5, 6}), S::list(ir::DType::kI64, {{7}}), S::f32({7, 6}), S::of(true)}}});
  samples({"aten::repeat"}, {{"", {S::f32({5, 6}), S::of(std::vector<int64_t>{2, 1})}},
                             {"", {S::f32({5, 6}), S::of(std::vector<int64_t>{2, 1, 3})}}});
  samples({"aten::pad"}, {{"", {S::f32({5, 6}), S::of(std::vector<int64_t>{1, 2})}}});
  samples({"aten::constant_pad_nd"},
          {{"", {S::f32({5, 6}), S::of(std::vector<int64_t>{1, 2, 0, 1}), S::of(0.5)}},
           {"", {S::f32({5, 6}), S::of(std::vector<int64_t>{2, 1}), S::of(-1.0)}}});
  samples({"aten::fill.Scalar"}, {{"", {S::f32({5, 6}), S::of(1.5)}}});
  samples({"aten::fill.Tensor"}, {{"", {S::f32({5, 6}), S::f32({})}}});
  samples(
      {"aten::roll"},
      {{"", {S::f32({5, 6}), S::of(std::vector<int64_t>{2}), S::of(std::vector<int64_t>{1})}},
       {"",
        {S::f32({5, 6}), S::of(std::vector<int64_t>{1, -2}), S::of(std::vector<int64_t>{0, 1})}}});
  samples({"aten::flip"}, {{"", {S::f32({5, 6}), S::of(std::vector<int64_t>{0})}},
                           {"", {S::f32({2, 5, 6}), S::of(std::vector<int64_t>{-1})}}});
  samples({"aten::tril", "aten::triu"}, {{"", {S::f32({5, 6})}},
                                         {"", {S::f32({5, 6}), S::of(1)}},
                                         {"", {S::f32({2, 5, 6}), S::of(-1)}}});
  samples({"aten::unbind.int"},
          {{"", {S::f32({3, 6}), S::of(0)}}, {"", {S::f32({5, 3}), S::of(1)}}});
  samples({"aten::zeros", "aten::ones"}, {{"", {S::of(std::vector<int64_t>{5, 6})}}});
  samples({"aten::empty"}, {{"memory_format", {S::of(std::vector<int64_t>{5, 6})}}});
  samples({"aten::scalar_tensor"}, {{"", {S::of(2.5)}}});
  samples({"aten::full"}, {{"", {S::of(std::vector<int64_t>{5, 6}), S::of(2.5)}}});
  samples({"aten::arange"}, {{"start", {S::of(3), S::of(14)}}, {"", {S::of(7)}}});
  samples({"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::zero"},
          {{"", {S::f32({5, 6})}}});
  samples({"aten::full_like"}, {{"", {S::f32({5, 6}), S::of(2.5)}}});
  samples({"aten::new_zeros", "aten::new_ones", "aten::new_empty"},
          {{"", {S::f32({2, 2}), S::of(std::vector<int64_t>{5, 6})}}});
  samples({"aten::new_full"},
          {{"", {S::f32({2, 2}), S::of(std::vector<int64_t>{5, 6}), S::of(2.5)}}});
}

}  // namespace apc::strategy
