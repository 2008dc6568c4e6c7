//===- lib/strategy/rule_util.cpp - Helpers shared by the rule families ---===//
//
// Implementation of lib/strategy/rule_util.h.
//
//===----------------------------------------------------------------------===//
#include "rule_util.h"

#include <algorithm>

namespace apc::strategy::detail {

DimStrategy emptyDim(const RuleContext& c) {
  DimStrategy s;
  s.inputs.resize(c.numInputs());
  s.outputs.resize(c.numOutputs());
  return s;
}

DimStrategy uniformDim(const RuleContext& c, Placement p) {
  DimStrategy s = emptyDim(c);
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.isTensorInput(i)) s.inputs[i] = p;
  for (size_t i = 0; i < c.numOutputs(); ++i)
    if (c.isTensorOutput(i)) s.outputs[i] = p;
  return s;
}

std::optional<int64_t> normDim(int64_t d, int64_t rank) {
  if (d < 0) d += rank;
  if (d < 0 || d >= rank) return std::nullopt;
  return d;
}

std::vector<size_t> tensorInputs(const RuleContext& c) {
  std::vector<size_t> out;
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.isTensorInput(i)) out.push_back(i);
  return out;
}

int64_t commonRank(const RuleContext& c) {
  int64_t rank = -2;
  auto merge = [&](int64_t r) {
    if (r < 0) return false;
    if (rank == -2) rank = r;
    return rank == r;
  };
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.isTensorInput(i) && !merge(c.inputRank(i))) return -1;
  for (size_t i = 0; i < c.numOutputs(); ++i)
    if (c.isTensorOutput(i) && !merge(c.outputRank(i))) return -1;
  return rank < 0 ? -1 : rank;
}

std::vector<DimStrategy> uniformStrategies(const RuleContext& c, const std::vector<int64_t>& dims,
                                           const std::vector<ReduceOp>& partials) {
  if (commonRank(c) < 0) return {};
  std::vector<DimStrategy> out;
  out.push_back(replicateAll(c));
  for (int64_t d : dims) out.push_back(uniformDim(c, S(d)));
  for (ReduceOp op : partials) out.push_back(uniformDim(c, P(op)));
  return out;
}

std::vector<DimStrategy> identityStrategies(const RuleContext& c,
                                            const std::vector<ReduceOp>& partials) {
  int64_t rank = commonRank(c);
  if (rank < 0) return {};
  return uniformStrategies(c, dimsExcept(rank, {}), partials);
}

std::vector<int64_t> dimsExcept(int64_t rank, const std::vector<int64_t>& except) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(except.begin(), except.end(), d) == except.end()) out.push_back(d);
  return out;
}

double numel(const std::vector<int64_t>& sizes) {
  double n = 1;
  for (int64_t s : sizes) n *= static_cast<double>(s);
  return n;
}

namespace {
double bytesOf(const std::vector<const ir::TensorMeta*>& metas,
               const std::vector<std::vector<int64_t>>& shapes) {
  double b = 0;
  for (size_t e = 0; e < shapes.size() && e < metas.size(); ++e)
    b += numel(shapes[e]) * ir::dtypeBytes(metas[e]->dtype);
  return b;
}
}  // namespace

double localInputBytes(const RuleContext& c, const LocalShapes& l, size_t i) {
  return i < l.inputs.size() ? bytesOf(c.inputMetas(i), l.inputs[i]) : 0;
}

double localOutputBytes(const RuleContext& c, const LocalShapes& l, size_t i) {
  return i < l.outputs.size() ? bytesOf(c.outputMetas(i), l.outputs[i]) : 0;
}

Work contractionWork(const RuleContext& c, const LocalShapes& l, size_t lhs_input,
                     const std::vector<int64_t>& lhs_contract) {
  Work w = defaultWork(c, l);
  double out = 0;
  for (const auto& shape : l.outputs.empty() ? std::vector<std::vector<int64_t>>{} : l.outputs[0])
    out += numel(shape);
  double k = 1;
  if (lhs_input < l.inputs.size() && !l.inputs[lhs_input].empty()) {
    const auto& lhs = l.inputs[lhs_input].front();
    for (int64_t d : lhs_contract)
      if (auto nd = normDim(d, static_cast<int64_t>(lhs.size())))
        k *= static_cast<double>(lhs[static_cast<size_t>(*nd)]);
  }
  w.flops = 2 * out * k;
  return w;
}

Work noWork(const RuleContext&, const LocalShapes&) {
  return {};
}

}  // namespace apc::strategy::detail
