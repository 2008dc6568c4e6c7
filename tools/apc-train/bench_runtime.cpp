//===- tools/apc-train/bench_runtime.cpp - Interpreter overhead on one rank -===//
//
// `apc-bench-runtime MODEL.pt [--input name:dtype[dims]]... [--iters N] [--threads T]
//  [--device cpu|cuda]`
//
// Times one forward + backward of the TorchScript module itself against the same graph imported
// and run by apc's interpreter (apc/runtime/interpreter.h) on the same weights and inputs, and
// prints the ratio (target <= 1.05). Integer inputs are drawn below the smallest embedding's rows.
// With --device cuda the module, weights and inputs live on cuda:0 and each timed step ends with a
// device synchronization, so the figure is the step's wall time including its kernels.
// The reference is eager execution: TorchScript's graph executor runs with its optimizations off
// (torch::jit::setGraphExecutorOptimize(false): no fusion groups, no autodiff subgraphs), op by op
// as eager PyTorch and apc's interpreter do. `--jit-optimize` turns them on (on CUDA the profiling
// executor then fuses elementwise chains into fewer kernels, which is not what eager runs).
//
//===----------------------------------------------------------------------===//
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>

#include "apc/frontend/input_spec.h"
#include "apc/frontend/torchscript.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/output_leaves.h"
#include "apc/support/activity.h"
#include "cli_checks.h"

namespace {

using Clock = std::chrono::steady_clock;

int fail(const std::string& m) {
  std::cerr << "apc-bench-runtime: error: " << m << "\n";
  return 2;
}

at::Tensor firstLeaf(const c10::IValue& v) {
  std::vector<at::Tensor> leaves = apc::runtime::outputLeaves(v);
  return leaves.empty() ? at::Tensor() : leaves.front();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"apc-bench-runtime: interpreter overhead against TorchScript on one rank",
               "apc-bench-runtime"};
  std::string model;
  std::vector<std::string> input_texts;
  int iters = 5;
  int threads = 1;
  std::string device_name = "cpu";
  bool jit_optimize = false;
  app.add_option("model", model, "TorchScript model")->required();
  app.add_option("--input", input_texts, "Input shape, name:dtype[d0,d1,...]; repeatable");
  app.add_option("--iters", iters, "Timed iterations")->check(apc::tool::integerIn(1, 1 << 30));
  app.add_option("--threads", threads, "Intra-op threads")->check(apc::tool::integerIn(1, 1024));
  app.add_option("--device", device_name, "cpu, or cuda (device 0; needs a CUDA LibTorch)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--jit-optimize", jit_optimize,
               "Let TorchScript's graph executor optimize (fuse) the reference; default: eager");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(threads);
  c10::Device device(c10::kCPU);
  if (device_name == "cuda") {
    if (!at::detail::getCUDAHooks().isBuilt() || !at::hasCUDA())
      return fail("--device cuda: no CUDA LibTorch or no CUDA device");
    device = c10::Device(c10::kCUDA, 0);
  }
  auto sync = [&] {
    if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
  };

  apc::frontend::ImportOptions options;
  for (const std::string& t : input_texts) {
    auto s = apc::frontend::parseInputSpec(t);
    if (!s.ok()) return fail(s.error().message());
    options.inputs.push_back(*s);
  }
  auto graph = apc::frontend::importTorchScript(model, options);
  if (!graph.ok()) return fail(graph.error().message());
  auto g = std::make_shared<const apc::ir::Graph>(std::move(graph).value());
  apc::runtime::InterpreterOptions interp_options;
  interp_options.device = device;
  auto interp = apc::runtime::Interpreter::create(g, interp_options);
  if (!interp.ok()) return fail(interp.error().message());
  torch::jit::Module module = torch::jit::load(model);
  module.train(false);
  module.to(device);
  std::map<std::string, at::Tensor> params, buffers;
  for (const auto& p : module.named_parameters()) params[p.name] = p.value;
  for (const auto& b : module.named_buffers()) buffers[b.name] = b.value;

  int64_t bound = 0;
  for (const apc::ir::Node& n : g->nodes())
    if (n.op == "aten::embedding") {
      const apc::ir::Value& w = g->value(n.inputs.at(0));
      if (w.tensor && (bound == 0 || w.tensor->shape.at(0).size < bound))
        bound = w.tensor->shape.at(0).size;
    }
  if (bound == 0) bound = 2;
  std::vector<apc::ir::NodeId> input_nodes = g->nodesOfKind(apc::ir::NodeKind::kInput);
  std::vector<c10::IValue> inputs;
  at::manual_seed(0);
  for (apc::ir::NodeId id : input_nodes) {
    const apc::ir::TensorMeta& t = *g->value(g->node(id).outputs.at(0)).tensor;
    std::vector<int64_t> sizes = apc::ir::hintSizes(t.shape);
    if (apc::ir::isFloating(t.dtype))
      inputs.emplace_back(at::randn(sizes).to(device));
    else
      inputs.emplace_back(
          at::randint(0, bound, sizes, at::TensorOptions().dtype(at::kLong)).to(device));
  }
  auto zeroGrads = [&] {
    for (auto& [n, p] : params) p.mutable_grad() = at::Tensor();
  };
  auto torchscriptStep = [&] {
    zeroGrads();
    firstLeaf(module.forward(inputs)).sum().backward();
    sync();
  };
  auto external = [&](const apc::ir::Node& n, std::vector<c10::IValue>&) {
    if (n.kind == apc::ir::NodeKind::kParameter) return std::vector<c10::IValue>{params.at(n.name)};
    if (n.kind == apc::ir::NodeKind::kBuffer) return std::vector<c10::IValue>{buffers.at(n.name)};
    for (size_t i = 0; i < input_nodes.size(); ++i)
      if (input_nodes[i] == n.id) return std::vector<c10::IValue>{inputs[i]};
    throw std::runtime_error("unexpected node " + n.name);
  };
  auto interpreterStep = [&] {
    zeroGrads();
    auto out = interp->run(external);
    if (!out.ok()) throw std::runtime_error(out.error().message());
    firstLeaf(out->at(0)).sum().backward();
    sync();
  };
  auto timeIt = [&](const std::function<void()>& f) {
    f();  // warm-up
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      auto t0 = Clock::now();
      f();
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];  // median
  };
  // After the import, which inlines through the executor's passes.
  torch::jit::setGraphExecutorOptimize(jit_optimize);
  // Interleave to share machine noise.
  double ts = 0, in = 0;
  const char* running = "torchscript";
  try {
    ts = timeIt(torchscriptStep);
    running = "interpreter";
    in = timeIt(interpreterStep);
    running = "torchscript";
    ts = std::min(ts, timeIt(torchscriptStep));
    running = "interpreter";
    in = std::min(in, timeIt(interpreterStep));
  } catch (const std::exception& e) {
    apc::rethrowIfOutOfMemory(e);
    return fail(g->name + " (" + device_name + "): the " + running +
                " step failed: " + apc::runtime::firstLine(e.what()));
  }
  size_t ops = 0;
  for (const apc::ir::Node& n : g->nodes()) ops += n.kind == apc::ir::NodeKind::kOp;
  std::printf(
      "%s (%s): %zu ops, forward+backward median of %d: torchscript%s %.3f ms, interpreter %.3f "
      "ms, ratio %.3f\n",
      g->name.c_str(), device_name.c_str(), ops, iters, jit_optimize ? " (optimized)" : "", ts, in,
      in / ts);
  return 0;
}
