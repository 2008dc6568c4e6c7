//===- tools/apc-train/node_profile.cpp - Per-node times of a training step -===//
#include "node_profile.h"

#include <ATen/core/Tensor.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>

#include "apc/runtime/output_leaves.h"

namespace apc::train {
namespace {

struct MarkHook : torch::autograd::FunctionPreHook {
  explicit MarkHook(std::function<void()> fn) : fn(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    fn();
    return grads;
  }
  std::function<void()> fn;
};

void tensorsOf(const c10::IValue& v, std::vector<at::Tensor>& out) {
  for (at::Tensor& t : runtime::outputLeaves(v)) out.push_back(std::move(t));
}

}  // namespace

NodeProfiler::NodeProfiler(const ir::Graph& graph, c10::Device device)
    : graph_(graph),
      device_(device),
      forward_s_(graph.numNodes(), 0.0),
      backward_s_(graph.numNodes(), 0.0),
      marked_step_(graph.numNodes(), -1) {}

double NodeProfiler::now() const {
  if (device_.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device_.index());
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void NodeProfiler::before(const ir::Node&, const std::vector<c10::IValue>& args) {
  if (!active_) return;
  input_fns_.clear();
  std::vector<at::Tensor> ins;
  for (const c10::IValue& v : args) tensorsOf(v, ins);
  for (const at::Tensor& t : ins)
    if (t.defined() && t.grad_fn()) input_fns_.insert(t.grad_fn().get());
  t_before_ = now();
}

void NodeProfiler::after(const ir::Node& node, const std::vector<c10::IValue>& outputs,
                         const std::vector<c10::IValue>&) {
  if (!active_) return;
  forward_s_.at(node.id.v) += now() - t_before_;
  // The autograd nodes this node created: those behind its outputs that no input of it had
  // (an output that aliases an input, aten::to of the same dtype, is an earlier node's).
  std::vector<at::Tensor> outs;
  for (const c10::IValue& v : outputs) tensorsOf(v, outs);
  std::set<const void*> hooked;
  for (const at::Tensor& t : outs) {
    if (!t.defined() || !t.requires_grad() || !t.grad_fn()) continue;
    const auto& fn = t.grad_fn();
    if (input_fns_.count(fn.get()) || !hooked.insert(fn.get()).second) continue;
    const uint32_t id = node.id.v;
    fn->add_pre_hook(std::make_unique<MarkHook>([this, id] { mark(id); }));
  }
}

void NodeProfiler::mark(uint32_t node) {
  if (!active_ || marked_step_.at(node) == backward_index_) return;
  marked_step_[node] = backward_index_;
  marks_.push_back({now(), node});
}

void NodeProfiler::backwardStarts() {
  if (!active_) return;
  marks_.clear();
  backward_start_ = now();
}

void NodeProfiler::backwardEnds() {
  if (!active_) return;
  const double end = now();
  for (size_t i = 0; i < marks_.size(); ++i) {
    const double next = i + 1 < marks_.size() ? marks_[i + 1].t : end;
    backward_s_.at(marks_[i].node) += next - marks_[i].t;
  }
  marks_.clear();
  ++backward_index_;
}

std::vector<NodeProfiler::OpTotals> NodeProfiler::totals(
    int steps, const std::vector<double>& predicted_us) const {
  std::map<std::string, OpTotals> by_op;
  const double per = steps > 0 ? 1e3 / steps : 0;
  for (const ir::Node& n : graph_.nodes()) {
    if (n.kind != ir::NodeKind::kOp) continue;
    OpTotals& o = by_op[n.op];
    o.op = n.op;
    ++o.nodes;
    o.forward_ms += forward_s_.at(n.id.v) * per;
    o.backward_ms += backward_s_.at(n.id.v) * per;
    if (n.id.v < predicted_us.size()) o.predicted_ms += predicted_us[n.id.v] / 1e3;
  }
  std::vector<OpTotals> out;
  for (auto& [op, o] : by_op) out.push_back(std::move(o));
  std::sort(out.begin(), out.end(), [](const OpTotals& a, const OpTotals& b) {
    const double x = a.forward_ms + a.backward_ms, y = b.forward_ms + b.backward_ms;
    return x != y ? x > y : a.op < b.op;
  });
  return out;
}

std::vector<NodeProfiler::NodeRow> NodeProfiler::perNode(
    int steps, const std::vector<double>& predicted_us) const {
  std::vector<NodeRow> out;
  const double per = steps > 0 ? 1e3 / steps : 0;
  for (const ir::Node& n : graph_.nodes()) {
    if (n.kind != ir::NodeKind::kOp) continue;
    NodeRow r;
    r.node = n.id.v;
    r.op = n.op;
    r.module_path = n.module_path;
    for (ir::ValueId v : n.inputs) {
      const ir::Value& val = graph_.value(v);
      if (!val.tensor) continue;
      if (!r.inputs.empty()) r.inputs += ' ';
      r.inputs += ir::toString(*val.tensor);
    }
    r.forward_ms = forward_s_.at(n.id.v) * per;
    r.backward_ms = backward_s_.at(n.id.v) * per;
    if (n.id.v < predicted_us.size()) r.predicted_ms = predicted_us[n.id.v] / 1e3;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace apc::train
