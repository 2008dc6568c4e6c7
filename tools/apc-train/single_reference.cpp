//===- tools/apc-train/single_reference.cpp - The unsharded model of --compare-single -===//
//
// The two executors of single_reference.h: LibTorch's TorchScript module, and apc's interpreter
// over an imported graph.
//
//===----------------------------------------------------------------------===//
#include "single_reference.h"

#include <algorithm>
#include <map>

#include <ATen/ATen.h>
#include <torch/script.h>

#include "apc/frontend/model.h"
#include "apc/frontend/weights.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/output_leaves.h"
#include "apc/support/activity.h"

namespace apc::train {

namespace {

class ScriptReference : public SingleReference {
 public:
  explicit ScriptReference(torch::jit::Module m) : module_(std::move(m)) {
    at::NoGradGuard no_grad;
    for (at::Tensor p : module_.parameters())
      if (!p.is_contiguous()) p.set_data(p.contiguous());  // set_data keeps tied ones tied
    for (at::Tensor b : module_.buffers())
      if (!b.is_contiguous()) b.set_data(b.contiguous());
    for (const at::Tensor& p : module_.parameters())
      if (p.is_floating_point()) {
        dtype_ = p.scalar_type();
        break;
      }
  }

  std::vector<std::pair<std::string, at::Tensor>> namedParameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    std::vector<const void*> seen;
    for (const auto& p : module_.named_parameters()) {
      const void* impl = p.value.unsafeGetTensorImpl();
      if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
      seen.push_back(impl);
      out.emplace_back(p.name, p.value);
    }
    return out;
  }
  std::vector<std::pair<std::string, at::Tensor>> namedBuffers() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& b : module_.named_buffers()) out.emplace_back(b.name, b.value);
    return out;
  }
  Expected<std::vector<at::Tensor>> forward(const std::vector<c10::IValue>& inputs) override {
    std::vector<c10::IValue> args = inputs;
    c10::IValue out;
    try {
      out = module_.forward(args);
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      return unsupported("the single-device model's forward: " + runtime::firstLine(e.what()));
    }
    return runtime::outputLeaves(out);
  }
  at::ScalarType floatingDtype() const override { return dtype_; }

 private:
  torch::jit::Module module_;
  at::ScalarType dtype_ = at::kFloat;
};

class GraphReference : public SingleReference {
 public:
  static Expected<std::unique_ptr<SingleReference>> load(const std::string& path,
                                                         const ReferenceOptions& options) {
    frontend::ImportOptions io;
    io.inputs = options.inputs;
    APC_ASSIGN_OR_RETURN(ir::Graph g, frontend::importModel(path, io));
    APC_ASSIGN_OR_RETURN(frontend::NamedTensors state, frontend::loadModelState(path));
    std::map<std::string, at::Tensor> by_name;
    for (auto& [name, t] : state) by_name.emplace(name, t);

    auto ref = std::unique_ptr<GraphReference>(new GraphReference());
    ref->dtype_ = options.widen ? at::kDouble : at::kFloat;
    bool dtype_known = options.widen;
    at::NoGradGuard no_grad;
    for (const ir::Node& n : g.nodes()) {
      if (n.kind == ir::NodeKind::kInput) {
        ref->input_of_[n.id.v] = ref->num_inputs_++;
        continue;
      }
      if (n.kind != ir::NodeKind::kParameter && n.kind != ir::NodeKind::kBuffer) continue;
      auto it = by_name.find(n.name);
      if (it == by_name.end())
        return invalidArgument("holds no tensor for " + std::string(ir::nodeKindName(n.kind)) +
                               " '" + n.name + "'");
      // Memory of its own, dense: stub-weight samples store each weight as a zero-stride view
      // of one element, which in-place updates cannot write.
      at::Tensor t = it->second.detach().clone(at::MemoryFormat::Contiguous).to(options.device);
      if (options.widen && t.is_floating_point()) t = t.to(at::kDouble);
      if (!dtype_known && t.is_floating_point()) {
        ref->dtype_ = t.scalar_type();
        dtype_known = true;
      }
      if (n.kind == ir::NodeKind::kParameter) {
        if (t.is_floating_point()) t.set_requires_grad(true);
        ref->params_.emplace_back(n.name, t);
      } else {
        ref->buffers_.emplace_back(n.name, t);
      }
      ref->tensor_of_[n.id.v] = t;
    }
    runtime::InterpreterOptions opts;
    opts.device = options.device;
    opts.widen_floats = options.widen;
    ref->graph_ = std::make_shared<const ir::Graph>(std::move(g));
    APC_ASSIGN_OR_RETURN(runtime::Interpreter in, runtime::Interpreter::create(ref->graph_, opts));
    ref->interp_ = std::make_unique<runtime::Interpreter>(std::move(in));
    return std::unique_ptr<SingleReference>(std::move(ref));
  }

  std::vector<std::pair<std::string, at::Tensor>> namedParameters() override { return params_; }
  std::vector<std::pair<std::string, at::Tensor>> namedBuffers() override { return buffers_; }
  Expected<std::vector<at::Tensor>> forward(const std::vector<c10::IValue>& inputs) override {
    if (inputs.size() != num_inputs_)
      return invalidArgument("the single-device model takes " + std::to_string(num_inputs_) +
                             " inputs, got " + std::to_string(inputs.size()));
    auto external = [&](const ir::Node& n, std::vector<c10::IValue>&) {
      std::vector<c10::IValue> out;
      if (n.kind == ir::NodeKind::kInput)
        out.push_back(inputs.at(input_of_.at(n.id.v)));
      else
        out.push_back(tensor_of_.at(n.id.v));
      return out;
    };
    APC_ASSIGN_OR_RETURN(std::vector<c10::IValue> leaves, interp_->run(external));
    std::vector<at::Tensor> out;
    for (const c10::IValue& v : leaves)
      if (v.isTensor()) out.push_back(v.toTensor());
    return out;
  }
  at::ScalarType floatingDtype() const override { return dtype_; }

 private:
  GraphReference() = default;
  std::shared_ptr<const ir::Graph> graph_;
  std::unique_ptr<runtime::Interpreter> interp_;
  std::map<uint32_t, size_t> input_of_;       // input node -> position
  std::map<uint32_t, at::Tensor> tensor_of_;  // parameter / buffer node -> tensor
  std::vector<std::pair<std::string, at::Tensor>> params_, buffers_;
  size_t num_inputs_ = 0;
  at::ScalarType dtype_ = at::kFloat;
};

}  // namespace

Expected<std::unique_ptr<SingleReference>> loadSingleReference(const std::string& path,
                                                               const ReferenceOptions& options) {
  auto format = frontend::detectModelFormat(path);
  if (!format.ok()) return format.error().withContext(path);
  if (*format == frontend::ModelFormat::kTorchScript && !options.widen) {
    try {
      return std::unique_ptr<SingleReference>(
          new ScriptReference(torch::jit::load(path, options.device)));
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      return invalidArgument(
          path + ": cannot load as a TorchScript model: " + runtime::firstLine(e.what()));
    }
  }
  auto ref = GraphReference::load(path, options);
  if (!ref.ok()) return ref.error().withContext(path);
  return ref;
}

}  // namespace apc::train
