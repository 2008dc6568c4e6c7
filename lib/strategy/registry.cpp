//===- lib/strategy/registry.cpp - Rule registry and rule context ---------===//
//
// The Registry (qualified op name -> rule, cost family, work counter), the RuleContext accessors
// rules use to read shapes and constant arguments, the text form of strategies, the structural
// check of single-dim strategies, and the default registry with every family registered.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <string>

#include "apc/strategy/rules.h"
#include "apc/strategy/strategy.h"
#include "rule_util.h"

namespace apc::strategy {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool TensorDimRef::operator==(const TensorDimRef&) const = default;

// --- Strategy ------------------------------------------------------------------------------------

std::string Strategy::toString() const {
  return mesh::toSignatureString(inputs, outputs) +
         (regionLocal() ? " (token-local #" + std::to_string(region_variant) + ")" : "");
}

// --- RuleContext ---------------------------------------------------------------------------------

namespace {

const RuleOptions kDefaultRuleOptions{};

bool isTensorValue(const ir::Value& v) {
  if (v.type == ir::ValueType::kTensor) return v.tensor.has_value();
  return v.type == ir::ValueType::kTensorList;  // elements may be unknown: then only R fits
}

int64_t valueRank(const ir::Value& v) {
  if (v.type == ir::ValueType::kTensor) return v.tensor ? v.tensor->rank() : -1;
  if (v.type == ir::ValueType::kTensorList && !v.elements.empty()) {
    int64_t r = v.elements.front().rank();
    for (const auto& e : v.elements)
      if (e.rank() != r) return -1;
    return r;
  }
  return -1;
}

std::vector<int64_t> valueSizes(const ir::Value& v) {
  if (v.type == ir::ValueType::kTensor && v.tensor) return ir::hintSizes(v.tensor->shape);
  if (v.type == ir::ValueType::kTensorList && !v.elements.empty())
    return ir::hintSizes(v.elements.front().shape);
  return {};
}

std::vector<const ir::TensorMeta*> valueMetas(const ir::Value& v) {
  std::vector<const ir::TensorMeta*> out;
  if (v.type == ir::ValueType::kTensor && v.tensor) out.push_back(&*v.tensor);
  if (v.type == ir::ValueType::kTensorList)
    for (const auto& e : v.elements) out.push_back(&e);
  return out;
}

}  // namespace

const RuleOptions& RuleContext::opts() const {
  return options ? *options : kDefaultRuleOptions;
}

bool RuleContext::isTensorInput(size_t i) const {
  return i < numInputs() && isTensorValue(input(i));
}
bool RuleContext::isTensorOutput(size_t i) const {
  return i < numOutputs() && isTensorValue(output(i));
}
int64_t RuleContext::inputRank(size_t i) const {
  return i < numInputs() ? valueRank(input(i)) : -1;
}
int64_t RuleContext::outputRank(size_t i) const {
  return i < numOutputs() ? valueRank(output(i)) : -1;
}
std::vector<int64_t> RuleContext::inputSizes(size_t i) const {
  return i < numInputs() ? valueSizes(input(i)) : std::vector<int64_t>{};
}
std::vector<int64_t> RuleContext::outputSizes(size_t i) const {
  return i < numOutputs() ? valueSizes(output(i)) : std::vector<int64_t>{};
}
std::vector<const ir::TensorMeta*> RuleContext::inputMetas(size_t i) const {
  return i < numInputs() ? valueMetas(input(i)) : std::vector<const ir::TensorMeta*>{};
}
std::vector<const ir::TensorMeta*> RuleContext::outputMetas(size_t i) const {
  return i < numOutputs() ? valueMetas(output(i)) : std::vector<const ir::TensorMeta*>{};
}

std::optional<int64_t> RuleContext::intArg(size_t i) const {
  if (i >= numInputs() || !input(i).constant) return std::nullopt;
  if (const auto* v = std::get_if<int64_t>(&*input(i).constant)) return *v;
  return std::nullopt;
}

std::optional<std::vector<int64_t>> RuleContext::intListArg(size_t i) const {
  if (i >= numInputs() || !input(i).constant) return std::nullopt;
  if (const auto* v = std::get_if<std::vector<int64_t>>(&*input(i).constant)) return *v;
  if (const auto* v = std::get_if<int64_t>(&*input(i).constant)) return std::vector<int64_t>{*v};
  return std::nullopt;
}

std::optional<bool> RuleContext::boolArg(size_t i) const {
  if (i >= numInputs() || !input(i).constant) return std::nullopt;
  if (const auto* v = std::get_if<bool>(&*input(i).constant)) return *v;
  return std::nullopt;
}

std::optional<double> RuleContext::doubleArg(size_t i) const {
  if (i >= numInputs() || !input(i).constant) return std::nullopt;
  if (const auto* v = std::get_if<double>(&*input(i).constant)) return *v;
  if (const auto* v = std::get_if<int64_t>(&*input(i).constant)) return static_cast<double>(*v);
  return std::nullopt;
}

bool RuleContext::isNoneArg(size_t i) const {
  return i >= numInputs() || input(i).type == ir::ValueType::kNone;
}

// --- Work ----------------------------------------------------------------------------------------

bool detail::isMatrixOperand(const RuleContext& c, size_t i) {
  const auto metas = c.inputMetas(i);
  return metas.size() == 1 && metas[0]->shape.size() >= 2;
}

bool detail::operandTakesGradient(const RuleContext& c, size_t i) {
  const auto metas = c.inputMetas(i);
  return metas.size() == 1 && metas[0]->shape.size() >= 2 && metas[0]->requires_grad;
}

double detail::operandGradientShare(const RuleContext& c, cost::OpFamily family) {
  if (family != cost::OpFamily::kContraction && family != cost::OpFamily::kConvolution) return 1.0;
  int operands = 0, with_gradient = 0;
  for (size_t i = 0; i < c.numInputs(); ++i) {
    operands += isMatrixOperand(c, i) ? 1 : 0;
    with_gradient += operandTakesGradient(c, i) ? 1 : 0;
  }
  return operands >= 2 ? static_cast<double>(with_gradient) / operands : 1.0;
}

Work defaultWork(const RuleContext& c, const LocalShapes& local) {
  Work w;
  for (size_t i = 0; i < local.outputs.size(); ++i)
    for (const auto& shape : local.outputs[i]) w.flops += detail::numel(shape);
  for (size_t i = 0; i < local.inputs.size(); ++i) w.bytes += detail::localInputBytes(c, local, i);
  for (size_t i = 0; i < local.outputs.size(); ++i)
    w.bytes += detail::localOutputBytes(c, local, i);
  return w;
}

// --- Checking ------------------------------------------------------------------------------------

Status checkDimStrategy(const RuleContext& c, const DimStrategy& s) {
  auto where = [&](const std::string& what) {
    return internalError("rule of " + c.node.qualifiedOp() + " (node #" +
                         std::to_string(c.node.id.v) + "): " + what);
  };
  if (s.inputs.size() != c.numInputs())
    return where("has " + std::to_string(s.inputs.size()) + " input placements for " +
                 std::to_string(c.numInputs()) + " inputs");
  if (s.outputs.size() != c.numOutputs())
    return where("has " + std::to_string(s.outputs.size()) + " output placements for " +
                 std::to_string(c.numOutputs()) + " outputs");
  auto checkOne = [&](bool output, size_t i, const std::optional<Placement>& p) -> Status {
    std::string name = std::string(output ? "output " : "input ") + std::to_string(i);
    bool tensor = output ? c.isTensorOutput(i) : c.isTensorInput(i);
    if (tensor != p.has_value())
      return where(name + (tensor ? " is a tensor without a placement"
                                  : " is not a tensor but has a placement"));
    if (p && p->isShard()) {
      int64_t rank = output ? c.outputRank(i) : c.inputRank(i);
      if (p->dim() < 0 || p->dim() >= rank)
        return where(name + " has " + p->toString() + " but rank " + std::to_string(rank));
    }
    return Status::success();
  };
  for (size_t i = 0; i < s.inputs.size(); ++i) APC_RETURN_IF_ERROR(checkOne(false, i, s.inputs[i]));
  for (size_t i = 0; i < s.outputs.size(); ++i)
    APC_RETURN_IF_ERROR(checkOne(true, i, s.outputs[i]));
  for (const TensorDimRef& ref : s.must_divide) {
    const auto& list = ref.output ? s.outputs : s.inputs;
    if (ref.index >= list.size() || !list[ref.index] || !list[ref.index]->isShard(ref.dim))
      return where(std::string("must_divide names ") + (ref.output ? "output " : "input ") +
                   std::to_string(ref.index) + " dim " + std::to_string(ref.dim) +
                   ", which the strategy does not shard");
  }
  return Status::success();
}

// --- Samples -------------------------------------------------------------------------------------

SampleArg SampleArg::tensor(ir::DType dtype, const std::vector<int64_t>& shape) {
  SampleArg a;
  a.type = ir::ValueType::kTensor;
  a.tensors.push_back(ir::TensorMeta{ir::makeShape(shape), dtype, false});
  return a;
}
SampleArg SampleArg::list(ir::DType dtype, const std::vector<std::vector<int64_t>>& shapes) {
  SampleArg a;
  a.type = ir::ValueType::kTensorList;
  for (const auto& shape : shapes)
    a.tensors.push_back(ir::TensorMeta{ir::makeShape(shape), dtype, false});
  return a;
}
SampleArg SampleArg::of(int64_t v) {
  SampleArg a;
  a.type = ir::ValueType::kInt;
  a.constant = v;
  return a;
}
SampleArg SampleArg::of(double v) {
  SampleArg a;
  a.type = ir::ValueType::kFloat;
  a.constant = v;
  return a;
}
SampleArg SampleArg::of(bool v) {
  SampleArg a;
  a.type = ir::ValueType::kBool;
  a.constant = v;
  return a;
}
SampleArg SampleArg::of(const char* v) {
  SampleArg a;
  a.type = ir::ValueType::kString;
  a.constant = std::string(v);
  return a;
}
SampleArg SampleArg::of(std::vector<int64_t> v) {
  SampleArg a;
  a.type = ir::ValueType::kIntList;
  a.constant = std::move(v);
  return a;
}
SampleArg SampleArg::none() {
  return SampleArg{};
}

// --- Registry ------------------------------------------------------------------------------------

bool alwaysRandom(const RuleContext&) {
  return true;
}

void Registry::add(const std::string& qualified_op, Rule rule, cost::OpFamily family, WorkFn work) {
  OpInfo info;
  info.rule = std::move(rule);
  info.family = family;
  info.work = std::move(work);
  rules_[qualified_op] = std::move(info);
}

void Registry::add(const std::string& qualified_op, OpInfo info) {
  rules_[qualified_op] = std::move(info);
}

OpInfo* Registry::entry(const std::string& qualified_op) {
  auto it = rules_.find(qualified_op);
  return it == rules_.end() ? nullptr : &it->second;
}

bool Registry::setSamples(const std::string& qualified_op, SamplesFn samples) {
  OpInfo* e = entry(qualified_op);
  if (!e) return false;
  e->samples = std::move(samples);
  return true;
}

bool Registry::setBackwardMultiplier(const std::string& qualified_op, double multiplier) {
  OpInfo* e = entry(qualified_op);
  if (!e) return false;
  e->backward_multiplier = multiplier;
  return true;
}

const OpInfo* Registry::findEntry(const ir::Node& node) const {
  if (!node.overload.empty()) {
    auto it = rules_.find(node.op + "." + node.overload);
    if (it != rules_.end()) return &it->second;
  }
  auto it = rules_.find(node.op);
  return it == rules_.end() ? nullptr : &it->second;
}

const Rule* Registry::find(const ir::Node& node) const {
  const OpInfo* e = findEntry(node);
  return e && e->rule ? &e->rule : nullptr;
}

bool Registry::drawsRandomNumbers(const ir::Graph& g, const ir::Node& n) const {
  if (n.kind != ir::NodeKind::kOp) return false;
  const OpInfo* e = findEntry(n);
  return e && e->random && e->random(RuleContext{g, n});
}

double Registry::forwardShare(const ir::Graph& g, const ir::Node& n) const {
  bool backward = false;
  for (ir::ValueId o : n.outputs)
    if (const auto& t = g.value(o).tensor; t && t->requires_grad) backward = true;
  if (!backward) return 1.0;
  const OpInfo* rule = findEntry(n);
  const cost::OpFamily family = rule ? rule->family : cost::OpFamily::kOther;
  const double mult = rule && rule->backward_multiplier >= 0 ? rule->backward_multiplier
                                                             : cost::backwardMultiplier(family);
  return 1.0 / (1.0 + mult * detail::operandGradientShare(RuleContext{g, n}, family));
}

std::vector<std::string> Registry::ops() const {
  std::vector<std::string> out;
  out.reserve(rules_.size());
  for (const auto& [name, rule] : rules_) out.push_back(name);
  return out;
}

void registerAllRules(Registry& r) {
  registerPointwiseRules(r);
  registerMatrixRules(r);
  registerReductionRules(r);
  registerViewRules(r);
  registerNormalizationRules(r);
  registerSoftmaxRules(r);
  registerEmbeddingRules(r);
  registerLossRules(r);
  registerTensorOpRules(r);
  registerConvRules(r);
  registerRoutingRules(r);
  registerInPlaceVariants(r);
}

void registerInPlaceVariants(Registry& r) {
  // An in-place op writes its result into input 0, so its strategies are those of the
  // out-of-place op whose output 0 is laid out as input 0. Importers rewrite in-place ops on
  // intermediate values out of place (apc/frontend/functionalize.h); the ones left write module
  // state (BatchNorm's num_batches_tracked) or an input.
  const std::vector<std::string> names = r.ops();
  for (const std::string& name : names) {
    size_t colons = name.find("::");
    if (colons == std::string::npos || name.compare(0, colons, "aten") != 0) continue;
    size_t dot = name.find('.', colons);
    std::string base = name.substr(0, dot);
    if (base.back() == '_') continue;
    std::string in_place = base + "_" + (dot == std::string::npos ? "" : name.substr(dot));
    if (std::find(names.begin(), names.end(), in_place) != names.end()) continue;
    ir::Node functional;
    functional.op = base;
    functional.overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    const OpInfo* entry = r.findEntry(functional);
    if (!entry) continue;
    // The in-place op shares the out-of-place op's cost and randomness; local rewrites, internal
    // collectives and Megatron roles are the out-of-place op's alone.
    OpInfo in_place_info;
    if (entry->rule) {
      in_place_info.rule = [out_of_place = entry->rule](const RuleContext& c) {
        std::vector<DimStrategy> kept;
        for (DimStrategy& d : out_of_place(c))
          if (!d.inputs.empty() && !d.outputs.empty() && d.inputs[0] == d.outputs[0])
            kept.push_back(std::move(d));
        return kept;
      };
    }
    in_place_info.family = entry->family;
    in_place_info.work = entry->work;
    in_place_info.random = entry->random;
    r.add(in_place, std::move(in_place_info));
  }
}

const Registry& defaultRegistry() {
  static const Registry registry = [] {
    Registry r;
    registerAllRules(r);
    return r;
  }();
  return registry;
}

}  // namespace apc::strategy
