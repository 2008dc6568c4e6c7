//===- tools/apc/calibrate.cpp - `apc calibrate`: measure the cost model's parameters ===//
//
// `apc calibrate --nproc N [--mesh 2x2] [--threads T] [--device cpu|cuda] -o cluster.json`
// starts N local ranks of itself through `apc run` (the same launcher and torchrun variables);
// under torchrun (RANK and WORLD_SIZE set, no --nproc) each process is a rank already. On the
// ranks' device, all ranks at once (as they will train), it times:
//   - matmuls (f32 and bf16) at several sizes, a narrow product against a square one, batched
//     matrix-vector and outer products, convolutions, attention, single ops (math, softmax, norms,
//     pooling, the row gather aten::index), elementwise adds of several sizes, and a chain of
//     minimal ops called as the runtime's interpreter calls them, forward and backward (the per-op
//     floor);
//   - for every mesh dim, all-gather, reduce-scatter, all-reduce and all-to-all on the groups of
//     that dim (all groups at once) over message sizes from 4 KiB to --max-mib.
// With --model M (repeatable) it also times M's op nodes at the local input shapes of their
// strategies on the mesh (strategy::nodeSamples), each alone, forward and backward; the profile
// keeps them by strategy::nodeTimeKey and the cost model prices those nodes at them.
// Each time is the slowest rank's. lib/cost/calibration fits the roofline's rates and each mesh
// dim's alpha-beta link, one for all kinds and one per kind; rank 0 writes the cluster profile
// (schemas/cluster.schema.json) that `apc plan --cluster` takes: the device, the links, per mesh
// dim and kind the measured times (which the cost model interpolates) and each fit's error.
//
//===----------------------------------------------------------------------===//
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <torch/version.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apc/cost/calibration.h"
#include "apc/cost/cost_model.h"
#include "apc/ir/graph.h"
#include "apc/runtime/comm.h"
#include "apc/runtime/host_allocator.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/output_leaves.h"
#include "apc/strategy/node_time.h"
#include "apc/support/file_io.h"
#include "apc/support/strings.h"
#include "commands.h"
#include "common.h"

namespace apc::tool {
namespace {

/// The memory this host gives its processes: the physical memory, or the cgroup's limit
/// (cgroup v2 memory.max, v1 memory.limit_in_bytes) when smaller. 0 when unknown.
int64_t hostMemoryBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  int64_t bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    long long limit = 0;
    if (in >> limit && limit > 0 && (bytes == 0 || limit < bytes)) bytes = limit;  // "max": none
  }
  return bytes;
}

struct CalibrateOptions {
  int nproc = 0;
  std::string output;
  MeshFlags mesh;
  int threads = 1;
  std::string device = "cpu";
  double max_mib =
      0;  // 0: 64 MiB on CPU (larger Gloo messages only measure page faults), 256 on CUDA
  double min_seconds = 0.05;  // least measured time per size (more repetitions below it)
  double timeout_s = 900;
  bool worker = false;
  double gap_us = -1;               // -1: 500 us on CPU, 0 on CUDA
  std::vector<std::string> models;  // --model: time these models' op nodes (absolute paths)
};

using Clock = std::chrono::steady_clock;

/// The ranks' device (CUDA LOCAL_RANK with --device cuda).
c10::Device g_device = c10::kCPU;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

/// Runs `fn` until at least `min_s` seconds and 2 calls have passed (after one warm-up call),
/// synchronizing a CUDA device around; returns the mean seconds per call.
template <typename Fn>
double timeIt(Fn&& fn, const c10::Device& device, double min_s, int max_reps = 1000) {
  auto sync = [&] {
    if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
  };
  fn();
  sync();
  int reps = 0;
  const auto t0 = Clock::now();
  double elapsed = 0;
  while (reps < 2 || (elapsed < min_s && reps < max_reps)) {
    fn();
    ++reps;
    sync();
    elapsed = seconds(t0, Clock::now());
  }
  return elapsed / reps;
}

/// How many copies of a kernel's operands (of `bytes` per call) the timing loops of the
/// memory-bound kernels (the elementwise curve, the single ops' curves) rotate through, so that
/// together they pass kRotationBytes. A step's kernels find their operands in the last-level cache
/// at best, not in the core's own caches, where a loop over one set of operands keeps them: on
/// one CPU core (2 MiB of L2) a relu of 512 KiB took 15 us on one set and 35 us on 64, and an
/// add of 192 KiB 2.1 and 8.9 us. Timed on one set, the elementwise curve ran at 58-93 GB/s up to
/// 3 MiB and 24-28 beyond; a step's pointwise nodes measured 1.7-3 times its price (mlp_stack's
/// relu, hf_llama_tiny's mul; docs/TOOLCHAIN.md, 2026-12-07). Matmuls measured the same either
/// way. On CUDA the footprint stays within the L2 (50 MiB on an H100), as a step's would.
constexpr double kRotationBytes = 16.0 * 1024 * 1024;
/// The inputs, outputs and gradients of the model nodes timed together in rounds (timeModelNodes).
constexpr double kNodeGroupBytes = 256.0 * 1024 * 1024;
size_t rotationSets(double bytes) {
  if (bytes <= 0) return 1;
  return static_cast<size_t>(std::clamp(std::ceil(kRotationBytes / bytes), 1.0, 256.0));
}

/// timeIt of `fn` on each of `sets` in turn (the operand sets of rotationSets).
template <typename T, typename Fn>
double timeRotating(std::vector<T>& sets, Fn&& fn, const c10::Device& device, double min_s) {
  size_t next = 0;
  return timeIt(
      [&] {
        fn(sets[next]);
        next = (next + 1) % sets.size();
      },
      device, min_s);
}

/// The largest of every rank's values, elementwise, in one all-reduce (the step waits for the
/// slowest rank).
std::vector<double> slowest(runtime::World& world, std::vector<double> v) {
  if (world.worldSize() == 1 || v.empty()) return v;
  // On the ranks' device: NCCL reduces CUDA tensors only.
  at::Tensor t = at::tensor(v, at::kDouble).to(g_device);
  world.all().allReduce(t, mesh::ReduceOp::kMax);
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}
double slowest(runtime::World& world, double v) {
  return slowest(world, std::vector{v})[0];
}

/// The q-quantile of `v` (non-empty), the lower of two middle values.
double quantile(std::vector<double> v, double q) {
  const auto k = static_cast<std::ptrdiff_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[static_cast<size_t>(k)];
}

/// What --model measured: per node key {forward, backward} us (the slowest rank's).
struct NodeTimes {
  std::map<std::string, std::array<double, 2>> us;
  size_t samples = 0;
  std::vector<std::string> failures;  // "key: message", the first few
};

/// --model: every model's op nodes with the local input shapes of their strategies on `dmesh`
/// (strategy::nodeSamples), each run by the runtime's interpreter on random inputs of its local
/// shapes, forward and then backward (autograd's gradients of the inputs that take one), all ranks
/// at once as they train. A step runs each node once between hundreds of others, which evict its
/// code and data from the core's caches; a node rerun in a loop finds them there and took 0.5-0.9
/// of its step time (docs/TOOLCHAIN.md). So the nodes run in rounds, as a step runs them: the
/// nodes of a group (consecutive samples whose inputs and outputs come to at most
/// kNodeGroupBytes) each once per round, in graph order, one warm-up round and then rounds until
/// every node has `min_s` seconds' worth and at least 5 runs (at most 64). Each run's outputs and
/// gradients stay alive until the node's next run, so that every run writes fresh blocks as a
/// step's nodes do. The median forward and backward of each.
Expected<NodeTimes> timeModelNodes(runtime::World& world, const mesh::DeviceMesh& dmesh,
                                   const std::vector<std::string>& models,
                                   const c10::Device& device, double min_s) {
  struct Feed {
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
    bool floating = false, grad = false;
  };
  struct NodeRun {
    std::string key;
    std::optional<runtime::Interpreter> interp;
    std::vector<Feed> feeds;
    double bytes = 0;  // the inputs, and as much again for outputs and gradients
    std::vector<at::Tensor> in, kept;
    std::vector<double> f_s, b_s;
    std::string failure;
  };
  std::vector<NodeRun> runs;
  std::vector<std::string> keys;
  for (const std::string& path : models) {
    ModelFlags mf;
    mf.model = path;
    APC_ASSIGN_OR_RETURN(ir::Graph graph, mf.load());
    const std::vector<strategy::NodeStrategies> strategies = strategy::enumerate(graph, dmesh);
    for (const strategy::NodeSample& sample : strategy::nodeSamples(graph, dmesh, strategies)) {
      if (std::find(keys.begin(), keys.end(), sample.key) != keys.end()) continue;
      keys.push_back(sample.key);
      const ir::Node& src = graph.node(sample.node);
      NodeRun run;
      run.key = sample.key;
      // The node alone: an input node per tensor input, the constants as they are.
      auto g = std::make_shared<ir::Graph>();
      ir::Node n;
      n.op = src.op;
      n.overload = src.overload;
      for (size_t i = 0; i < src.inputs.size(); ++i) {
        const ir::Value& v = graph.value(src.inputs[i]);
        if (!v.isTensor()) {
          n.inputs.push_back(g->addConstant(v.type, *v.constant, v.debug_name));
          continue;
        }
        Feed f;
        f.sizes = sample.local_inputs[i][0];
        f.dtype = scalarTypeOf(v.tensor->dtype);
        f.floating = ir::isFloating(v.tensor->dtype);
        f.grad = v.tensor->requires_grad && f.floating;
        double numel = 1;
        for (int64_t s : f.sizes) numel *= static_cast<double>(s);
        run.bytes += 2 * numel * static_cast<double>(c10::elementSize(f.dtype));
        run.feeds.push_back(std::move(f));
        ir::Value iv;
        iv.type = ir::ValueType::kTensor;
        iv.debug_name = "in" + std::to_string(i);
        iv.tensor = ir::TensorMeta{ir::Shape{}, v.tensor->dtype, v.tensor->requires_grad};
        ir::Node in;
        in.kind = ir::NodeKind::kInput;
        in.op = "input";
        in.name = std::to_string(run.feeds.size() - 1);
        in.outputs = {g->addValue(std::move(iv))};
        n.inputs.push_back(in.outputs[0]);
        g->addNode(std::move(in));
      }
      ir::OutputTree outs;
      outs.kind = ir::OutputTree::Kind::kTuple;
      for (ir::ValueId o : src.outputs) {
        ir::Value ov;
        ov.type = graph.value(o).type;
        ov.debug_name = "out";
        if (graph.value(o).tensor) ov.tensor = ir::TensorMeta{};
        const ir::ValueId id = g->addValue(std::move(ov));
        n.outputs.push_back(id);
        if (graph.value(o).mayHoldTensors()) outs.children.push_back(ir::OutputTree::makeLeaf(id));
      }
      g->addNode(std::move(n));
      g->setOutputs(std::move(outs));
      auto interp =
          runtime::Interpreter::create(g, runtime::InterpreterOptions{device, false, {}, {}});
      if (interp.ok())
        run.interp.emplace(std::move(interp).value());
      else
        run.failure = interp.error().message();
      runs.push_back(std::move(run));
    }
  }

  auto sync = [&] {
    if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
  };
  // One run of a node: forward, then backward; false (and `failure`) if it failed.
  auto once = [&](NodeRun& r) -> bool {
    try {
      r.kept.clear();
      const auto t0 = Clock::now();
      auto out = r.interp->run([&](const ir::Node& node, std::vector<c10::IValue>&) {
        return std::vector<c10::IValue>{r.in.at(std::stoul(node.name))};
      });
      if (!out.ok()) {
        r.failure = out.error().message();
        return false;
      }
      sync();
      const auto t1 = Clock::now();
      std::vector<at::Tensor> ys, gs;
      for (const c10::IValue& v : *out)
        for (at::Tensor& y : runtime::outputLeaves(v)) {
          if (!y.defined()) continue;
          if (y.requires_grad() && at::isFloatingType(y.scalar_type())) {
            gs.push_back(at::ones_like(y));
            ys.push_back(y);
          }
          r.kept.push_back(y.detach());
        }
      std::vector<at::Tensor> wrt;
      for (const at::Tensor& t : r.in)
        if (t.requires_grad()) wrt.push_back(t);
      sync();
      const auto t2 = Clock::now();
      if (!ys.empty() && !wrt.empty()) {
        for (at::Tensor& g : torch::autograd::grad(ys, wrt, gs, /*retain_graph=*/false,
                                                   /*create_graph=*/false,
                                                   /*allow_unused=*/true))
          r.kept.push_back(std::move(g));
      }
      sync();
      r.f_s.push_back(seconds(t0, t1));
      r.b_s.push_back(seconds(t2, Clock::now()));
      return true;
    } catch (const std::exception& e) {
      r.failure = runtime::firstLine(e.what());
      return false;
    }
  };
  for (size_t first = 0; first < runs.size();) {
    size_t last = first;  // the group: [first, last)
    double bytes = 0;
    while (last < runs.size() && (last == first || bytes + runs[last].bytes <= kNodeGroupBytes))
      bytes += runs[last++].bytes;
    std::vector<NodeRun*> group;
    for (size_t k = first; k < last; ++k) {
      NodeRun& r = runs[k];
      if (!r.failure.empty()) continue;
      for (const Feed& f : r.feeds) {
        const at::TensorOptions opts = at::TensorOptions().device(device).dtype(f.dtype);
        at::Tensor t = f.floating ? at::randn(f.sizes, opts) : at::zeros(f.sizes, opts);
        if (f.grad) t.requires_grad_();
        r.in.push_back(std::move(t));
      }
      if (once(r)) group.push_back(&r);  // the warm-up run
    }
    for (NodeRun* r : group) {
      r->f_s.clear();
      r->b_s.clear();
    }
    // Rounds until every node has run 5 times and for min_s seconds in all (64 runs at most).
    std::vector<double> spent(group.size(), 0);
    for (int round = 0; round < 64; ++round) {
      bool more = false;
      for (size_t k = 0; k < group.size(); ++k) {
        NodeRun& r = *group[k];
        if (!r.failure.empty()) continue;
        if (round >= 5 && spent[k] >= min_s) continue;
        const auto t0 = Clock::now();
        if (!once(r)) continue;
        spent[k] += seconds(t0, Clock::now());
        more = more || round < 4 || spent[k] < min_s;
      }
      if (!more) break;
    }
    for (size_t k = first; k < last; ++k) {
      runs[k].in.clear();
      runs[k].kept.clear();
    }
    first = last;
  }
  NodeTimes out;
  std::vector<double> fwd, bwd, failed;
  for (const NodeRun& r : runs) {
    const bool ok = r.failure.empty() && !r.f_s.empty();
    fwd.push_back(ok ? quantile(r.f_s, 0.5) * 1e6 : 0.0);
    bwd.push_back(ok ? quantile(r.b_s, 0.5) * 1e6 : 0.0);
    failed.push_back(ok ? 0.0 : 1.0);
    if (!ok && out.failures.size() < 8)
      out.failures.push_back(r.key + ": " + (r.failure.empty() ? "no run" : r.failure));
  }
  fwd = slowest(world, fwd);
  bwd = slowest(world, bwd);
  failed = slowest(world, failed);
  out.samples = keys.size();
  for (size_t i = 0; i < keys.size(); ++i)
    if (failed[i] == 0.0) out.us[keys[i]] = {fwd[i], bwd[i]};
  return out;
}

ir::DType irDType(at::ScalarType t) {
  return t == at::kBFloat16 ? ir::DType::kBF16
         : t == at::kDouble ? ir::DType::kF64
                            : ir::DType::kF32;
}

/// APC_ASSIGN_OR_RETURN for a command: reports the error and returns its exit code.
#define APC_ASSIGN_OR_RETURN_TOOL(lhs, expr)                \
  auto APC_CONCAT(tool_exp_, __LINE__) = (expr);            \
  if (!APC_CONCAT(tool_exp_, __LINE__).ok())                \
    return report(APC_CONCAT(tool_exp_, __LINE__).error()); \
  lhs = std::move(APC_CONCAT(tool_exp_, __LINE__)).value()

int runWorker(const CalibrateOptions& o) {
  const auto start = Clock::now();
  auto env = runtime::launchEnvFromEnvironment();
  if (!env.ok()) return report(env.error());
  MeshFlags mf = o.mesh;
  if (mf.mesh.empty() && mf.spec.empty()) mf.mesh = std::to_string(env->world_size);
  auto spec = mf.resolve(nullptr);
  if (!spec.ok()) return report(spec.error());
  const mesh::DeviceMesh& dmesh = spec->mesh;
  if (dmesh.worldSize() != env->world_size)
    return report(invalidArgument("--mesh " + dmesh.toString() + " has " +
                                  std::to_string(dmesh.worldSize()) + " devices but " +
                                  std::to_string(env->world_size) + " ranks run"));
  at::set_num_threads(o.threads);
  // The runtime's CPU tensors come from its caching allocator (apc-train installs it): kernels
  // timed here then pay what they pay in a step, no fresh pages per call.
  runtime::useCachingHostAllocator();
  runtime::WorldOptions wo;
  c10::Device device = c10::kCPU;
  if (o.device == "cuda") {
    if (!at::detail::getCUDAHooks().isBuilt() || !at::hasCUDA())
      return report(invalidArgument("--device cuda: no CUDA LibTorch or no CUDA device"));
    wo.backend = runtime::Backend::kNccl;
    device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env->local_rank));
  }
  g_device = device;
  auto world_or = runtime::World::create(*env, dmesh, wo);
  if (!world_or.ok()) return report(world_or.error());
  runtime::World& world = **world_or;
  const bool rank0 = world.rank() == 0;
  auto progress = [&](const std::string& what) {
    if (rank0)
      std::fprintf(stderr, "apc calibrate: %s (%.1f s)\n", what.c_str(),
                   seconds(start, Clock::now()));
  };
  const at::TensorOptions f32 = at::TensorOptions().device(device).dtype(at::kFloat);
  nlohmann::ordered_json compute = nlohmann::ordered_json::array();
  std::vector<cost::KernelSample> kernels;

  // --- compute ---------------------------------------------------------------------------------
  progress("timing kernels");
  const std::vector<int64_t> mm_sizes = device.is_cuda()
                                            ? std::vector<int64_t>{256, 512, 1024, 2048, 4096, 8192}
                                            : std::vector<int64_t>{16, 32, 64, 128, 256, 512, 1024};
  spec::DeviceOverrides measured;  // the curves the cost model interpolates
  // Kernels are timed over a longer window than collectives' calls: a step runs for seconds on
  // a machine whose other tenants come and go, and a 50 ms window caught the 512^3 f32 matmul at
  // 2.7 ms in one calibration and 6.0 ms in another; the mean over 200 ms follows the average.
  const double kernel_s = 4 * o.min_seconds;
  // A contraction's curve is the forward's share of forward and backward, as a linear layer
  // pays them: Y = X W^T, dX = dY W, dW = dY^T X (transposed operands included), over 3.
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kDouble})
    for (int64_t n : mm_sizes) {
      at::Tensor x = at::randn({n, n}, f32).to(dt), w = at::randn({n, n}, f32).to(dt),
                 g = at::randn({n, n}, f32).to(dt);
      world.all().barrier();
      const double s = slowest(world, timeIt(
                                          [&] {
                                            (void)at::mm(x, w.t());
                                            (void)at::mm(g, w);
                                            (void)at::mm(g.t(), x);
                                          },
                                          device, kernel_s)) /
                       3;
      const double flops = 2.0 * static_cast<double>(n * n * n);
      const double bytes = 3.0 * static_cast<double>(n * n) * static_cast<double>(x.element_size());
      kernels.push_back({flops, bytes, irDType(dt), s * 1e6});
      spec::KernelTable& table = measured.matmul_us[irDType(dt)];
      table.work.push_back(flops);
      table.us.push_back(s * 1e6);
      compute.push_back({{"op", "mm (linear forward and backward, over 3)"},
                         {"dtype", ir::dtypeName(irDType(dt))},
                         {"size", {n, n, n}},
                         {"us", s * 1e6},
                         {"tflops", flops / s / 1e12}});
    }
  // A contraction's output beyond its flops (DeviceSpec::matmul_output_gbps): a product whose
  // inner dim is 16 against a square one of the same flops, both into preallocated outputs (the
  // runtime's allocator reuses its blocks); the difference over the difference in output bytes.
  double matmul_output_gbps = 0;
  {
    const int64_t n = device.is_cuda() ? 1024 : 512, k = 16;
    const auto wide = static_cast<int64_t>(std::sqrt(static_cast<double>(n * n * n / k)));
    at::Tensor a = at::randn({n, n}, f32), b = at::randn({n, n}, f32), c = at::empty({n, n}, f32);
    at::Tensor x = at::randn({wide, k}, f32), w = at::randn({k, wide}, f32),
               y = at::empty({wide, wide}, f32);
    world.all().barrier();
    const double square = slowest(world, timeIt([&] { at::mm_out(c, a, b); }, device, kernel_s));
    const double skinny = slowest(world, timeIt([&] { at::mm_out(y, x, w); }, device, kernel_s));
    const double extra_bytes = 4.0 * static_cast<double>(wide * wide - n * n);
    if (skinny > square && extra_bytes > 0)
      matmul_output_gbps = extra_bytes / (skinny - square) / 1e9;
    compute.push_back({{"op", "mm of inner dim 16 against a square mm of the same flops"},
                       {"dtype", "f32"},
                       {"size", {wide, k, wide}},
                       {"us", skinny * 1e6},
                       {"square_size", {n, n, n}},
                       {"square_us", square * 1e6},
                       {"output_gbps", matmul_output_gbps}});
  }
  // Products with a dim of one (DeviceSpec::matvec_gbps, outer_product_gbps), in the forms a
  // batched matrix-vector product's forward and backward run them (16 MiB of matrices on CPU, 256
  // MiB on CUDA, into preallocated outputs): y = W x and dx = W^T dy (its matrices' bytes over
  // the mean of the two), and dW = dy x^T with x^T a transposed view, as autograd passes it (its
  // output's bytes; on a CPU core that view took 3.6 times a contiguous [b,1,k] operand).
  double matvec_gbps = 0, outer_product_gbps = 0;
  {
    const int64_t batch = device.is_cuda() ? 1024 : 256, rows = 256, cols = 64;
    at::Tensor w = at::randn({batch, rows, cols}, f32), x = at::randn({batch, cols, 1}, f32),
               dy = at::randn({batch, rows, 1}, f32);
    at::Tensor y = at::empty({batch, rows, 1}, f32), dx = at::empty({batch, cols, 1}, f32),
               dw = at::empty({batch, rows, cols}, f32);
    const double bytes = 4.0 * static_cast<double>(batch * rows * cols);
    world.all().barrier();
    const double matvec_s = slowest(world, timeIt(
                                               [&] {
                                                 at::bmm_out(y, w, x);
                                                 at::bmm_out(dx, w.transpose(1, 2), dy);
                                               },
                                               device, kernel_s)) /
                            2;
    const double outer_s =
        slowest(world, timeIt([&] { at::bmm_out(dw, dy, x.transpose(1, 2)); }, device, kernel_s));
    matvec_gbps = bytes / matvec_s / 1e9;
    outer_product_gbps = bytes / outer_s / 1e9;
    compute.push_back({{"op", "bmm, a matrix-vector product per matrix (W x and W^T dy, over 2)"},
                       {"dtype", "f32"},
                       {"size", {batch, rows, cols, 1}},
                       {"us", matvec_s * 1e6},
                       {"matrix_gbps", matvec_gbps}});
    compute.push_back({{"op", "bmm, an outer product per matrix (dy x^T)"},
                       {"dtype", "f32"},
                       {"size", {batch, rows, 1, cols}},
                       {"us", outer_s * 1e6},
                       {"output_gbps", outer_product_gbps}});
  }
  // Convolutions likewise (3x3, stride 1, padding 1): forward and the backward of input and
  // weight, over 3. CPU kernels differ from matmuls by dtype (f64 has no oneDNN path). The
  // smallest sizes are small maps of 8 and 16 channels: a conv below the curve's first point is
  // priced at its time, and on a CPU core every small conv takes about as long (a 1x1, a
  // depthwise or a 3x3 of 0.1-2 MFLOP, 57-75 us a pass), where 4 channels, which oneDNN pads to
  // its blocks, took 176 us at the same flops (ShuffleNet's 56 convs were priced at 3.4 times
  // their measured time from such a first point; docs/TOOLCHAIN.md).
  {
    const int64_t batch = device.is_cuda() ? 32 : 8;
    // (channels, height and width)
    const std::vector<std::pair<int64_t, int64_t>> shapes =
        device.is_cuda()
            ? std::vector<std::pair<int64_t, int64_t>>{{32, 56}, {64, 56}, {128, 56}, {256, 56}}
            : std::vector<std::pair<int64_t, int64_t>>{
                  {8, 7}, {16, 7}, {16, 28}, {32, 28}, {64, 28}};
    std::vector<at::ScalarType> dtypes = {at::kFloat, at::kDouble};
    if (device.is_cuda()) dtypes = {at::kFloat, at::kBFloat16};
    for (at::ScalarType dt : dtypes)
      for (const auto& [c, hw] : shapes) {
        at::Tensor x = at::randn({batch, c, hw, hw}, f32).to(dt),
                   w = at::randn({c, c, 3, 3}, f32).to(dt),
                   gy = at::randn({batch, c, hw, hw}, f32).to(dt);
        world.all().barrier();
        const double s = slowest(world, timeIt(
                                            [&] {
                                              (void)at::conv2d(x, w, {}, 1, 1);
                                              (void)at::convolution_backward(
                                                  gy, x, w, std::nullopt, {1, 1}, {1, 1}, {1, 1},
                                                  false, {0, 0}, 1, {true, true, false});
                                            },
                                            device, kernel_s)) /
                         3;
        const double flops = 2.0 * static_cast<double>(batch * c * hw * hw * c * 9);
        spec::KernelTable& table = measured.conv_us[irDType(dt)];
        table.work.push_back(flops);
        table.us.push_back(s * 1e6);
        compute.push_back({{"op", "conv2d 3x3 (forward and backward, over 3)"},
                           {"dtype", ir::dtypeName(irDType(dt))},
                           {"size", {batch, c, hw, hw, c, 3, 3}},
                           {"us", s * 1e6},
                           {"tflops", flops / s / 1e12}});
      }
  }
  // Convolutions whose weight, not their flops, sets the time (DeviceSpec::conv_weight_gbps,
  // conv_weight_grad_gbps): 3x3 on 2x2 maps, 64-512 channels, f32, forward and backward (input
  // and weight gradients) timed apart; fitted below against the measured model's price of them
  // without the weight term.
  struct WeightConv {
    double flops = 0, bytes = 0, weight_bytes = 0, forward_us = 0, backward_us = 0;
  };
  std::vector<WeightConv> weight_convs;
  {
    const int64_t batch = 4, hw = 2;
    for (int64_t c : {64, 128, 256, 512}) {
      at::Tensor x = at::randn({batch, c, hw, hw}, f32), w = at::randn({c, c, 3, 3}, f32),
                 gy = at::randn({batch, c, hw, hw}, f32);
      world.all().barrier();
      const double fwd =
          slowest(world, timeIt([&] { (void)at::conv2d(x, w, {}, 1, 1); }, device, kernel_s / 2));
      const double bwd = slowest(world, timeIt(
                                            [&] {
                                              (void)at::convolution_backward(
                                                  gy, x, w, std::nullopt, {1, 1}, {1, 1}, {1, 1},
                                                  false, {0, 0}, 1, {true, true, false});
                                            },
                                            device, kernel_s / 2));
      WeightConv wc;
      wc.flops = 2.0 * static_cast<double>(batch * c * hw * hw * c * 9);
      wc.weight_bytes = static_cast<double>(c * c * 9 * 4);
      wc.bytes = wc.weight_bytes + 2.0 * static_cast<double>(batch * c * hw * hw * 4);
      wc.forward_us = fwd * 1e6;
      wc.backward_us = bwd * 1e6;
      weight_convs.push_back(wc);
      compute.push_back({{"op", "conv2d 3x3 on 2x2 maps (forward; backward of input and weight)"},
                         {"dtype", "f32"},
                         {"size", {batch, c, hw, hw, c, 3, 3}},
                         {"forward_us", wc.forward_us},
                         {"backward_us", wc.backward_us}});
    }
  }
  // scaled_dot_product_attention, causal, forward and backward through autograd, over 1 + 2.5
  // (the attention family's backward multiplier): the fused kernels' own curve. Priced by the
  // matmul curve instead, hf_llama_tiny's attention on one CPU rank predicted 0.45 of its
  // measured time (square matmuls reach a throughput these small batched products do not).
  {
    // (batch * heads, sequence, head dim)
    const std::vector<std::array<int64_t, 3>> sizes =
        device.is_cuda() ? std::vector<std::array<int64_t, 3>>{{32, 256, 64},
                                                               {64, 1024, 64},
                                                               {64, 2048, 128},
                                                               {128, 4096, 128}}
                         : std::vector<std::array<int64_t, 3>>{
                               {8, 32, 16}, {16, 64, 32}, {16, 128, 64}, {32, 256, 64}};
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
      for (const auto& [bh, seq, hd] : sizes) {
        auto make = [&] { return at::randn({bh, 1, seq, hd}, f32).to(dt).requires_grad_(); };
        at::Tensor q = make(), k = make(), v = make();
        at::Tensor gy = at::randn({bh, 1, seq, hd}, f32).to(dt);
        world.all().barrier();
        const double s = slowest(world, timeIt(
                                            [&] {
                                              at::Tensor y = at::scaled_dot_product_attention(
                                                  q, k, v, {}, 0.0, /*is_causal=*/true);
                                              y.backward(gy);
                                            },
                                            device, kernel_s)) /
                         3.5;
        // strategy::sdpaWork's count: 2 * (rows of q) * (keys) * (q's and v's head dims).
        const double flops = 2.0 * static_cast<double>(bh * seq * seq * 2 * hd);
        spec::KernelTable& table = measured.attention_us[irDType(dt)];
        table.work.push_back(flops);
        table.us.push_back(s * 1e6);
        compute.push_back({{"op",
                            "scaled_dot_product_attention, causal (forward and backward, "
                            "over 3.5)"},
                           {"dtype", ir::dtypeName(irDType(dt))},
                           {"size", {bh, 1, seq, hd}},
                           {"us", s * 1e6},
                           {"tflops", flops / s / 1e12}});
      }
  }
  // Single ops whose kernels the elementwise curve does not describe, f32, forward, by the bytes
  // strategy::Work counts for them (their inputs' and outputs'); recorded under each name a
  // model's node may carry. On a CPU core tanh took 30 times an add of its bytes, max_pool2d
  // 2x2 50 times (hf_gpt2_tiny's tanh was predicted at 0.09 of its time, cnn_small's
  // max_pool2d at 0.03).
  {
    struct OpKernel {
      std::vector<const char*> names;
      bool pool;  // a [n, 16, h, w] input (2x2 window) instead of [n, 256]
      std::function<std::vector<at::Tensor>(const at::Tensor&)> run;
    };
    at::Tensor ln_w = at::ones({256}, f32), ln_b = at::zeros({256}, f32);
    // batch_norm in training mode over the pooling shape's 16 channels: the batch statistics, the
    // running stats' in-place update and the normalization are several kernels (on a CPU core
    // ShuffleNet's 56 batch norms took 75 us a node forward and backward, priced 20 by the
    // elementwise curve; docs/TOOLCHAIN.md).
    at::Tensor bn_w = at::ones({16}, f32), bn_b = at::zeros({16}, f32),
               bn_mean = at::zeros({16}, f32), bn_var = at::ones({16}, f32);
    // aten::index gathers rows one element at a time on a CPU core (Hugging Face's batched_mm
    // experts gather each slot's weights so: 6 GB/s where a copy streams 40): four times the
    // table's rows, drawn at random.
    std::map<int64_t, at::Tensor> gather_rows;
    auto rowsFor = [&](int64_t rows) -> const at::Tensor& {
      at::Tensor& t = gather_rows[rows];
      if (!t.defined())
        t = at::randint(0, rows, {4 * rows}, at::TensorOptions().dtype(at::kLong)).to(device);
      return t;
    };
    const std::vector<OpKernel> ops = {
        {{"aten::tanh"}, false, [](const at::Tensor& x) { return std::vector{at::tanh(x)}; }},
        {{"aten::exp"}, false, [](const at::Tensor& x) { return std::vector{at::exp(x)}; }},
        {{"aten::log"}, false, [](const at::Tensor& x) { return std::vector{at::log(x)}; }},
        {{"aten::sigmoid"}, false, [](const at::Tensor& x) { return std::vector{at::sigmoid(x)}; }},
        {{"aten::erf"}, false, [](const at::Tensor& x) { return std::vector{at::erf(x)}; }},
        {{"aten::silu"}, false, [](const at::Tensor& x) { return std::vector{at::silu(x)}; }},
        {{"aten::gelu"}, false, [](const at::Tensor& x) { return std::vector{at::gelu(x)}; }},
        {{"aten::softmax", "aten::_softmax"},
         false,
         [](const at::Tensor& x) { return std::vector{at::softmax(x, -1)}; }},
        {{"aten::log_softmax", "aten::_log_softmax"},
         false,
         [](const at::Tensor& x) { return std::vector{at::log_softmax(x, -1)}; }},
        {{"aten::layer_norm", "aten::native_layer_norm"},
         false,
         [&](const at::Tensor& x) { return std::vector{at::layer_norm(x, {256}, ln_w, ln_b)}; }},
        {{"aten::max_pool2d", "aten::max_pool2d_with_indices"},
         true,
         [](const at::Tensor& x) {
           return std::vector{at::max_pool2d(x, {2, 2}, {2, 2})};
         }},
        {{"aten::index"},
         false,
         [&](const at::Tensor& x) { return std::vector{at::index(x, {rowsFor(x.size(0))})}; }},
        {{"aten::avg_pool2d"},
         true,
         [](const at::Tensor& x) {
           return std::vector{at::avg_pool2d(x, {2, 2}, {2, 2})};
         }},
        {{"aten::batch_norm"},
         true,
         [&](const at::Tensor& x) {
           return std::vector{
               at::batch_norm(x, bn_w, bn_b, bn_mean, bn_var, true, 0.1, 1e-5, false)};
         }},
    };
    const std::vector<int64_t> numels = device.is_cuda()
                                            ? std::vector<int64_t>{1 << 16, 1 << 20, 1 << 24}
                                            : std::vector<int64_t>{1 << 12, 1 << 16, 1 << 20};
    for (const OpKernel& op : ops)
      for (int64_t n : numels) {
        // Pooling: [b, 16, h, h] with h = sqrt(n / 16) up to 64; others [n / 256, 256].
        int64_t h = 1;
        while (h < 64 && 16 * (2 * h) * (2 * h) <= n) h *= 2;
        const at::Tensor x =
            (op.pool ? at::rand({std::max<int64_t>(n / (16 * h * h), 1), 16, h, h}, f32)
                     : at::rand({n / 256, 256}, f32)) +
            0.5;  // positive: log's input
        std::vector<at::Tensor> outs = op.run(x);
        double bytes = static_cast<double>(x.numel()) * 4;
        for (const at::Tensor& y : outs) bytes += static_cast<double>(y.numel()) * 4;
        std::vector<at::Tensor> xs = {x};
        for (size_t k = rotationSets(bytes); xs.size() < k;) xs.push_back(x.clone());
        world.all().barrier();
        const double s = slowest(
            world, timeRotating(
                       xs, [&](const at::Tensor& xi) { (void)op.run(xi); }, device, kernel_s / 4));
        for (const char* name : op.names) {
          spec::KernelTable& table = measured.op_us[name];
          // max_pool2d_with_indices also writes its int64 indices.
          const double own = std::string(name) == "aten::max_pool2d_with_indices"
                                 ? bytes + static_cast<double>(outs[0].numel()) * 8
                                 : bytes;
          table.work.push_back(own);
          table.us.push_back(s * 1e6);
        }
        compute.push_back({{"op", op.names.front()},
                           {"dtype", "f32"},
                           {"size", x.sizes().vec()},
                           {"bytes", bytes},
                           {"operand_sets", xs.size()},
                           {"us", s * 1e6}});
      }
  }
  const std::vector<int64_t> ew_sizes =
      device.is_cuda() ? std::vector<int64_t>{1 << 16, 1 << 20, 1 << 24, 1 << 26, 1 << 28}
                       : std::vector<int64_t>{1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22};
  measured.elementwise_us.emplace();
  for (int64_t n : ew_sizes) {
    const double bytes = 3.0 * static_cast<double>(n) * 4;
    std::vector<std::array<at::Tensor, 3>> sets(rotationSets(bytes));  // a, b, c = a + b
    for (auto& set : sets) set = {at::randn({n}, f32), at::randn({n}, f32), at::empty({n}, f32)};
    world.all().barrier();
    const double s = slowest(
        world, timeRotating(
                   sets, [](std::array<at::Tensor, 3>& t) { at::add_out(t[2], t[0], t[1]); },
                   device, kernel_s));
    kernels.push_back({0, bytes, ir::DType::kF32, s * 1e6});
    measured.elementwise_us->work.push_back(bytes);
    measured.elementwise_us->us.push_back(s * 1e6);
    compute.push_back({{"op", "add"},
                       {"dtype", "f32"},
                       {"size", {n}},
                       {"bytes", bytes},
                       {"operand_sets", sets.size()},
                       {"us", s * 1e6},
                       {"gbps", bytes / s / 1e9}});
  }
  // Per op node, as the runtime pays it: chains of ops on tiny tensors run by the runtime's own
  // interpreter (apc/runtime/interpreter.h) with autograd recording, then their backward; the
  // time per node counts forward and backward once each (the cost model charges dispatch_us per
  // node and pass). Three chains: views (aten::t, the dispatch alone), adds (dispatch plus the
  // least kernel: the kernel floor) and the mix of ops a model's graph is made of (linear, silu,
  // mul, add, transpose, reshape, unsqueeze, squeeze, a cast, softmax, rsqrt: more arguments, more
  // autograd work per node than a view). The mix sets dispatch_us: a model's nodes pay what it
  // pays (hf_llama_tiny: 6.7 ms measured for its ~190 nodes, fwd + bwd, where views alone
  // predicted 2.8 ms).
  struct ChainOp {
    const char* name;
    const char* overload;
    std::vector<int> args;  // kChainValue, kWeight, or a constant's index in `consts`
  };
  constexpr int kChainValue = -1, kWeight = -2;
  enum : int { kNoneC, kZero, kOne, kMinusOne, kFalse, kF32, kShape8x8 };
  auto chainUs = [&](const std::vector<ChainOp>& ops, at::Tensor start,
                     at::Tensor weight) -> Expected<double> {
    constexpr int kChain = 48;
    auto g = std::make_shared<ir::Graph>();
    auto tensorValue = [&](const char* debug) {
      ir::Value v;
      v.type = ir::ValueType::kTensor;
      v.debug_name = debug;
      v.tensor = ir::TensorMeta{};
      return g->addValue(std::move(v));
    };
    auto input = [&](const char* name) {
      ir::Node in;
      in.kind = ir::NodeKind::kInput;
      in.op = "input";
      in.name = name;
      in.outputs = {tensorValue(name)};
      const ir::ValueId v = in.outputs[0];
      g->addNode(std::move(in));
      return v;
    };
    ir::ValueId y = input("x");
    const ir::ValueId w = input("w");
    const std::vector<ir::ValueId> consts = {
        g->addConstant(ir::ValueType::kNone, ir::Constant(ir::None{}), "none"),
        g->addConstant(ir::ValueType::kInt, ir::Constant(int64_t{0}), "zero"),
        g->addConstant(ir::ValueType::kInt, ir::Constant(int64_t{1}), "one"),
        g->addConstant(ir::ValueType::kInt, ir::Constant(int64_t{-1}), "minus_one"),
        g->addConstant(ir::ValueType::kBool, ir::Constant(false), "false"),
        g->addConstant(ir::ValueType::kInt,
                       ir::Constant(static_cast<int64_t>(static_cast<int>(at::kFloat))), "f32"),
        g->addConstant(ir::ValueType::kIntList, ir::Constant(std::vector<int64_t>{8, 8}), "shape")};
    for (int i = 0; i < kChain; ++i) {
      const ChainOp& op = ops[static_cast<size_t>(i) % ops.size()];
      ir::Node n;
      n.op = op.name;
      n.overload = op.overload;
      for (int a : op.args)
        n.inputs.push_back(a == kChainValue ? y
                           : a == kWeight   ? w
                                            : consts[static_cast<size_t>(a)]);
      n.outputs = {tensorValue("y")};
      y = n.outputs[0];
      g->addNode(std::move(n));
    }
    g->setOutputs(ir::OutputTree::makeLeaf(y));
    runtime::InterpreterOptions io;
    io.device = device;
    APC_ASSIGN_OR_RETURN(runtime::Interpreter interp, runtime::Interpreter::create(g, io));
    std::string failure;
    auto chain = [&] {
      auto out = interp.run([&](const ir::Node& node, std::vector<c10::IValue>&) {
        return std::vector<c10::IValue>{node.name == "w" ? weight : start};
      });
      if (!out.ok()) {
        failure = out.error().message();
        return;
      }
      (*out)[0].toTensor().sum().backward();
    };
    world.all().barrier();
    const double s = slowest(world, timeIt(chain, device, o.min_seconds));
    if (!failure.empty())
      return internalError("timing " + std::string(ops[0].name) + ": " + failure);
    return s * 1e6 / (2 * kChain);
  };
  at::Tensor x8 = at::rand({8, 8}, f32).requires_grad_();
  at::Tensor w8 = (at::randn({8, 8}, f32) * 0.3).requires_grad_();
  APC_ASSIGN_OR_RETURN_TOOL(
      const double add_us,
      chainUs({{"aten::add", "Tensor", {kChainValue, kChainValue, kOne}}}, x8, w8));
  APC_ASSIGN_OR_RETURN_TOOL(const double view_us,
                            chainUs({{"aten::t", "", {kChainValue}}}, x8, w8));
  APC_ASSIGN_OR_RETURN_TOOL(
      const double mix_us,
      chainUs({{"aten::linear", "", {kChainValue, kWeight, kNoneC}},
               {"aten::silu", "", {kChainValue}},
               {"aten::mul", "Tensor", {kChainValue, kWeight}},
               {"aten::add", "Tensor", {kChainValue, kWeight, kOne}},
               {"aten::transpose", "int", {kChainValue, kZero, kOne}},
               {"aten::reshape", "", {kChainValue, kShape8x8}},
               {"aten::unsqueeze", "", {kChainValue, kZero}},
               {"aten::squeeze", "dim", {kChainValue, kZero}},
               {"aten::to", "dtype", {kChainValue, kF32, kFalse, kFalse, kNoneC}},
               {"aten::softmax", "int", {kChainValue, kMinusOne, kNoneC}},
               {"aten::rsqrt", "", {kChainValue}}},
              x8, w8));
  const double floor_us = std::max(add_us - view_us, 0.0);
  // On the CPU the dispatching thread runs the kernels: a node pass costs its dispatch plus its
  // kernels, and the mix's time less the least kernel is the dispatch. On CUDA the host queues
  // kernels and runs ahead (CostModel::passUs: the larger of the two): these tiny kernels hide
  // under their dispatch, so the mix's whole time per node is the dispatch (H200, 16 host cores:
  // 22.8 us; a fit of dispatch plus kernel over-predicted gpt2_small's step by 45%).
  const bool overlaps = device.is_cuda();
  const double dispatch_us = overlaps ? mix_us : std::max(mix_us - floor_us, view_us);
  compute.push_back({{"op", "aten::add (64 elements) run by the runtime's interpreter, fwd + bwd"},
                     {"us_per_op", add_us}});
  compute.push_back({{"op", "aten::t (a view) through the operator registry, fwd + bwd"},
                     {"us_per_op", view_us}});
  compute.push_back(
      {{"op", "a mix of 11 model ops (64 elements), fwd + bwd"}, {"us_per_op", mix_us}});
  auto device_fit = cost::fitDevice(kernels, floor_us);
  if (!device_fit.ok()) return report(device_fit.error());

  // --- the models' own nodes (--model) ----------------------------------------------------------
  NodeTimes node_times;
  if (!o.models.empty()) {
    progress("timing the op nodes of " + std::to_string(o.models.size()) + " model" +
             (o.models.size() == 1 ? "" : "s"));
    auto t = timeModelNodes(world, dmesh, o.models, device, 0.02);
    if (!t.ok()) return report(t.error());
    node_times = std::move(t).value();
  }

  // --- collectives -----------------------------------------------------------------------------
  nlohmann::ordered_json collectives = nlohmann::ordered_json::array();
  nlohmann::ordered_json fits = nlohmann::ordered_json::array();
  spec::ClusterProfile profile;
  // A collective in a training step follows compute: its peers arrive with the jitter of that
  // compute, and Gloo's threads wake from idle. Measured back to back, CPU collectives of a few
  // KiB take 2-6 times less than in a step (docs/TOOLCHAIN.md), so each timed call follows
  // --gap-us of compute (default 500 us on CPU; none on CUDA, where NCCL runs on its stream).
  const double gap_us = o.gap_us >= 0 ? o.gap_us : device.is_cuda() ? 0 : 500;
  at::Tensor gap_a = at::randn({32, 32}, f32);
  const double max_bytes = (o.max_mib > 0 ? o.max_mib : device.is_cuda() ? 256 : 64) * 1024 * 1024;
  for (size_t m = 0; m < dmesh.ndim(); ++m) {
    runtime::Communicator& c = world.dim(m);
    const int64_t p = c.size();
    if (p <= 1) {
      profile.links.push_back(dmesh.link(m));
      fits.push_back({{"mesh_dim", m}, {"note", "a group of one rank: nothing to measure"}});
      continue;
    }
    progress("timing collectives on mesh dim " + std::to_string(m));
    // Every (kind, size) case, timed in interleaved rounds: a slow spell of a shared machine (it
    // lasts seconds) then falls on every case alike rather than on the sizes of one kind timed
    // while it lasted, and the median of each case's calls over the rounds discards it.
    struct Case {
      cost::CollectiveKind kind;
      double full = 0;
      std::function<void()> fn = nullptr;
      int per_round = 0;
      std::vector<double> times;
    };
    std::vector<std::pair<at::Tensor, at::Tensor>> buffers;  // per size: full tensor, local piece
    std::vector<Case> cases;
    for (double n = 4096; n <= max_bytes; n *= 4) {
      // n is the full tensor as the formulas see it: a multiple of p*p floats.
      const int64_t elems =
          std::max<int64_t>(p * p, static_cast<int64_t>(n / 4) / (p * p) * (p * p));
      buffers.emplace_back(at::ones({elems}, f32), at::ones({elems / p}, f32));
    }
    for (cost::CollectiveKind kind :
         {cost::CollectiveKind::kAllGather, cost::CollectiveKind::kReduceScatter,
          cost::CollectiveKind::kAllReduce, cost::CollectiveKind::kAllToAll})
      for (auto& buffer : buffers) {
        at::Tensor& full_t = buffer.first;
        at::Tensor& local = buffer.second;
        const int64_t elems = full_t.numel();
        Case cs;
        cs.kind = kind;
        cs.full = static_cast<double>(elems) * 4;
        std::vector<int64_t> sizes(static_cast<size_t>(p), elems / p);
        switch (kind) {
          case cost::CollectiveKind::kAllGather:
            cs.fn = [&c, &local, sizes] { (void)c.allGather(local, 0, sizes); };
            break;
          case cost::CollectiveKind::kReduceScatter:
            cs.fn = [&c, &full_t] { (void)c.reduceScatter(full_t, 0, mesh::ReduceOp::kSum); };
            break;
          case cost::CollectiveKind::kAllReduce:
            cs.fn = [&c, &full_t] { c.allReduce(full_t, mesh::ReduceOp::kSum); };
            break;
          default:
            cs.fn = [&c, &local, p, elems] {
              (void)c.allToAll(local.view({p, elems / (p * p)}), 0, 1,
                               std::vector<int64_t>(static_cast<size_t>(p), p));
            };
            break;
        }
        cases.push_back(std::move(cs));
      }
    // Every member must run the same number of calls: counts from the slowest first calls.
    constexpr int kRounds = 5;
    for (Case& cs : cases) {
      world.all().barrier();
      const double first = slowest(world, timeIt(cs.fn, device, 0, 2));
      // Small sizes get up to 200 calls: the mean they are priced at counts the stalls one call in
      // five to ten takes, and 60 calls hold only 6-12 of them.
      const int reps = static_cast<int>(std::clamp(4 * o.min_seconds / first, 15.0, 200.0));
      cs.per_round = (reps + kRounds - 1) / kRounds;
    }
    for (int round = 0; round < kRounds; ++round)
      for (Case& cs : cases) {
        world.all().barrier();
        for (int r = 0; r < cs.per_round; ++r) {
          if (gap_us > 0) {  // compute between calls, as in a training step
            const auto g0 = Clock::now();
            while (seconds(g0, Clock::now()) * 1e6 < gap_us) (void)at::mm(gap_a, gap_a);
          }
          const auto t0 = Clock::now();
          cs.fn();
          if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
          cs.times.push_back(seconds(t0, Clock::now()));
        }
      }
    // Each call timed alone; a case is priced at the mean of its calls, the slowest rank's, with
    // the median and the 10th and 90th percentiles recorded beside it. The mean, not the median: a
    // training step's calls pay the stalls (a scheduler tick, 3-4 ms) that one call in five to ten
    // takes on a shared CPU host, as often as calibration saw them. On 2 CPU ranks (2026-12-07)
    // steps' calls took 0.7-2.1 ms each where the median of a 4-64 KiB all-reduce was 0.36-0.5
    // and the mean 1.0-1.3; priced at the median, every plan with collectives was predicted
    // 25-55% short. Every rank's statistics of every case in one all-reduce.
    std::vector<double> stats;  // per case: median, mean, p10, p90
    for (const Case& cs : cases) {
      double sum = 0;
      for (double t : cs.times) sum += t;
      for (double v : {quantile(cs.times, 0.5), sum / static_cast<double>(cs.times.size()),
                       quantile(cs.times, 0.1), quantile(cs.times, 0.9)})
        stats.push_back(v * 1e6);
    }
    stats = slowest(world, stats);
    std::vector<cost::CollectiveSample> samples;
    for (size_t i = 0; i < cases.size(); ++i) {
      const double* s = &stats[4 * i];
      samples.push_back({cases[i].kind, p, cases[i].full, s[1]});
      collectives.push_back({{"mesh_dim", m},
                             {"kind", cost::collectiveName(cases[i].kind)},
                             {"group_size", p},
                             {"bytes", cases[i].full},
                             {"calls", cases[i].times.size()},
                             {"us", s[1]},
                             {"median_us", s[0]},
                             {"mean_us", s[1]},
                             {"p10_us", s[2]},
                             {"p90_us", s[3]}});
    }
    // One link for every kind (the mesh dim's link), then one per kind (the network refinement
    // the cost model prices with: Gloo's kinds differ by more than the ring formulas' ratios).
    auto fit = cost::fitLink(samples);
    if (!fit.ok()) return report(fit.error().withContext("mesh dim " + std::to_string(m)));
    profile.links.push_back(fit->link);
    spec::MeshDimNetwork net;
    nlohmann::ordered_json by_kind = nlohmann::ordered_json::object();
    for (size_t k = 0; k < 4; ++k) {
      std::vector<cost::CollectiveSample> mine;
      std::vector<size_t> rows;
      for (size_t i = 0; i < samples.size(); ++i)
        if (std::string(cost::collectiveName(samples[i].kind)) == spec::kNetworkKindKeys[k]) {
          mine.push_back(samples[i]);
          rows.push_back(collectives.size() - samples.size() + i);
        }
      auto kf = cost::fitLink(mine);
      if (!kf.ok())
        return report(kf.error().withContext("mesh dim " + std::to_string(m) + " " +
                                             spec::kNetworkKindKeys[k]));
      net.by_kind[k] = kf->link;
      spec::CollectiveTable table;
      table.group_size = p;
      for (const cost::CollectiveSample& cs : mine) {
        table.bytes.push_back(cs.full_bytes);
        table.us.push_back(cs.us);
      }
      // The table the cost model interpolates is made non-decreasing in size (the raw medians
      // stay under "calibration"): a size that landed in a slow band is pooled with its
      // neighbours rather than priced as a spike.
      table.us = cost::monotoneUs(table.us);
      net.tables[k] = std::move(table);
      for (size_t i = 0; i < mine.size(); ++i) {
        collectives[rows[i]]["fit_us"] = cost::fittedUs(*kf, mine[i]);
        collectives[rows[i]]["one_link_fit_us"] = cost::fittedUs(*fit, mine[i]);
      }
      by_kind[spec::kNetworkKindKeys[k]] = {{"bandwidth_gbps", kf->link.bandwidth_gbps},
                                            {"latency_us", kf->link.latency_us},
                                            {"mape_pct", kf->mape_pct}};
    }
    profile.network.push_back(net);
    fits.push_back({{"mesh_dim", m},
                    {"bandwidth_gbps", fit->link.bandwidth_gbps},
                    {"latency_us", fit->link.latency_us},
                    {"mape_pct", fit->mape_pct},
                    {"samples", fit->samples},
                    {"by_kind", by_kind}});
  }
  // --- overlap -----------------------------------------------------------------------------------
  // What compute running beside a collective still pays (DeviceSpec::overlap_efficiency): on the
  // first mesh dim of more than one rank, an all-reduce (4 MiB on CPU, 64 MiB on CUDA) alone, a
  // matmul loop of about its length alone, and the all-reduce issued asynchronously with the loop
  // run before its wait. The three are timed in turn, 9 rounds (the slowest rank's time of each):
  // a disturbance of the shared machine then falls on one round's three, not on all of one kind
  // (timed one kind after the other, a single slow stretch of the all-reduce alone, 4.0 ms
  // against 1.2, read as efficiency 1 where the next calibration read 0). The efficiency is the
  // median of the rounds'; the times printed are the medians of each kind.
  std::optional<double> overlap;
  nlohmann::ordered_json overlap_json;
  for (size_t m = 0; m < dmesh.ndim() && !overlap; ++m) {
    runtime::Communicator& c = world.dim(m);
    if (c.size() <= 1) continue;
    progress("timing compute beside a collective on mesh dim " + std::to_string(m));
    const int64_t elems = (device.is_cuda() ? 64 : 4) * 1024 * 1024 / 4;
    at::Tensor buf = at::ones({elems}, f32);
    at::Tensor mm_a = at::randn({256, 256}, f32);
    auto sync = [&] {
      if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
    };
    auto once = [&](const std::function<void()>& fn) {
      world.all().barrier();
      const auto t0 = Clock::now();
      fn();
      sync();
      return slowest(world, seconds(t0, Clock::now()));
    };
    auto median = [](const std::vector<double>& t) { return quantile(t, 0.5); };
    auto all_reduce = [&] { c.allReduce(buf, mesh::ReduceOp::kSum); };
    std::vector<double> first;
    for (int r = 0; r < 3; ++r) first.push_back(once(all_reduce));
    const double mm_s = timeIt([&] { (void)at::mm(mm_a, mm_a); }, device, 0.02);
    // The same count on every rank (the slowest rank's matmul), about the collective's length.
    const int iters = static_cast<int>(
        std::clamp(median(first) / std::max(slowest(world, mm_s), 1e-9), 1.0, 1e5));
    auto loop = [&] {
      for (int i = 0; i < iters; ++i) (void)at::mm(mm_a, mm_a);
    };
    std::vector<double> comm, compute, both, efficiency;
    for (int r = 0; r < 9; ++r) {
      comm.push_back(once(all_reduce));
      compute.push_back(once(loop));
      both.push_back(once([&] {
        std::unique_ptr<runtime::PendingCollective> pending =
            c.allReduceAsync(buf, mesh::ReduceOp::kSum);
        loop();
        (void)pending->wait();
      }));
      auto e = cost::overlapEfficiency(compute.back() * 1e6, comm.back() * 1e6, both.back() * 1e6);
      if (!e.ok()) return report(e.error().withContext("overlap"));
      efficiency.push_back(*e);
    }
    const double comm_s = median(comm), compute_s = median(compute), both_s = median(both);
    auto us = [](std::vector<double> t) {
      for (double& v : t) v *= 1e6;
      return t;
    };
    overlap = median(efficiency);
    overlap_json = {{"mesh_dim", m},
                    {"bytes", elems * 4},
                    {"collective_us", comm_s * 1e6},
                    {"compute_us", compute_s * 1e6},
                    {"both_us", both_s * 1e6},
                    {"efficiency", *overlap},
                    {"rounds",
                     {{"collective_us", us(comm)},
                      {"compute_us", us(compute)},
                      {"both_us", us(both)},
                      {"efficiency", efficiency}}}};
  }

  // --- wait resume -------------------------------------------------------------------------------
  // The compute a rank loses after waiting for a blocking collective (DeviceSpec::wait_resume_us):
  // on the CPU, on the first mesh dim of more than one rank, a chain of step-sized kernels (a
  // [128,256] x [256,256] product, a relu and a scale, repeated to about 1 ms) timed back to back
  // (after an untimed run of itself) and right after a small blocking all-reduce, the two in turn
  // for 150 rounds. The loss is the median of the rounds' differences (paired, so that a slow spell
  // falls on both of a round), at least 0, the slowest rank's. On this project's 2-core VM torch's
  // own Gloo showed 45-100 us on the same chains.
  std::optional<double> wait_resume;
  nlohmann::ordered_json wait_json;
  for (size_t m = 0; m < dmesh.ndim() && !wait_resume && !device.is_cuda(); ++m) {
    runtime::Communicator& c = world.dim(m);
    if (c.size() <= 1) continue;
    progress("timing compute after a blocking collective on mesh dim " + std::to_string(m));
    at::Tensor x = at::randn({128, 256}, f32), w = at::randn({256, 256}, f32) * 0.05;
    at::Tensor small = at::zeros({2}, f32);
    auto link = [&] { return at::mul(at::relu(at::mm(x, w)), 0.5); };
    const double link_s = slowest(world, timeIt([&] { (void)link(); }, device, 0.02));
    const int links = static_cast<int>(std::clamp(1e-3 / std::max(link_s, 1e-9), 2.0, 1000.0));
    auto chain = [&] {
      const auto t0 = Clock::now();
      for (int i = 0; i < links; ++i) (void)link();
      return seconds(t0, Clock::now());
    };
    std::vector<double> back_to_back, after_wait, lost;
    for (int r = 0; r < 150; ++r) {
      world.all().barrier();
      (void)chain();
      back_to_back.push_back(chain());
      world.all().barrier();
      c.allReduce(small, mesh::ReduceOp::kSum);
      after_wait.push_back(chain());
      lost.push_back(after_wait.back() - back_to_back.back());
    }
    const double b2b_s = slowest(world, quantile(back_to_back, 0.5));
    const double after_s = slowest(world, quantile(after_wait, 0.5));
    wait_resume = std::max(0.0, slowest(world, quantile(lost, 0.5)) * 1e6);
    wait_json = {{"mesh_dim", m},
                 {"chain_links", links},
                 {"back_to_back_us", b2b_s * 1e6},
                 {"after_wait_us", after_s * 1e6},
                 {"wait_resume_us", *wait_resume}};
  }

  // A mesh dim of one rank has no refinement; keep the list aligned with the links.
  if (!profile.network.empty() && profile.network.size() != profile.links.size()) {
    std::vector<spec::MeshDimNetwork> aligned(profile.links.size());
    size_t next = 0;
    for (size_t m = 0; m < dmesh.ndim(); ++m)
      if (world.dim(m).size() > 1) aligned[m] = profile.network[next++];
    profile.network = std::move(aligned);
  }

  if (!rank0) return 0;
  std::string kind = "cpu";
  if (device.is_cuda()) {
    // The closest built-in kind; every number the plan uses is overridden by the measurement.
    kind = "h100";
  }
  profile.device = kind;
  // A CPU rank's memory is its share of the host's; a GPU's is its kind's (the datasheet).
  if (!device.is_cuda()) {
    const int64_t host = hostMemoryBytes();
    if (host > 0) profile.device_memory = host / std::max(env->local_world_size, 1);
  }
  profile.device_overrides.peak_tflops = device_fit->peak_tflops;
  profile.device_overrides.hbm_bandwidth_gbps = device_fit->memory_gbps;
  profile.device_overrides.compute_efficiency = 1.0;
  profile.device_overrides.memory_efficiency = 1.0;
  profile.device_overrides.kernel_floor_us = std::max(device_fit->kernel_floor_us, 0.0);
  profile.device_overrides.dispatch_us = dispatch_us;
  if (overlaps) profile.device_overrides.dispatch_overlaps = true;
  profile.device_overrides.view_dispatch_us = view_us;
  profile.device_overrides.overlap_efficiency = overlap;
  profile.device_overrides.wait_resume_us = wait_resume;
  if (matmul_output_gbps > 0) profile.device_overrides.matmul_output_gbps = matmul_output_gbps;
  profile.device_overrides.matvec_gbps = matvec_gbps;
  profile.device_overrides.outer_product_gbps = outer_product_gbps;
  // The curves likewise made non-decreasing in work (raw times under "calibration").
  for (auto* tables : {&measured.matmul_us, &measured.conv_us, &measured.attention_us})
    for (auto& [dtype, t] : *tables) t.us = cost::monotoneUs(t.us);
  for (auto& [name, t] : measured.op_us) t.us = cost::monotoneUs(t.us);
  if (measured.elementwise_us)
    measured.elementwise_us->us = cost::monotoneUs(measured.elementwise_us->us);
  profile.device_overrides.matmul_us = measured.matmul_us;
  profile.device_overrides.conv_us = measured.conv_us;
  // The weight-bound convolutions: their time beyond what the measured model prices them at
  // without the weight term (CostModel::computeUs of the conv family, the larger of the conv
  // curve's time for the flops and the elementwise curve's for the bytes; backward its family
  // multiple), against their weight's bytes.
  double conv_weight_gbps = 0, conv_weight_grad_gbps = 0;
  if (auto it = measured.conv_us.find(ir::DType::kF32); it != measured.conv_us.end()) {
    cost::DeviceSpec conv_device;
    conv_device.kernel_floor_us = floor_us;
    conv_device.conv_curve[ir::DType::kF32] = cost::KernelCurve{it->second.work, it->second.us};
    if (measured.elementwise_us)
      conv_device.elementwise_curve =
          cost::KernelCurve{measured.elementwise_us->work, measured.elementwise_us->us};
    const cost::CostModel priced(conv_device, dmesh);
    std::vector<cost::ExtraSample> fwd, bwd;
    for (const WeightConv& wc : weight_convs) {
      const double f =
          priced.computeUs(cost::OpFamily::kConvolution, wc.flops, wc.bytes, ir::DType::kF32);
      fwd.push_back({wc.weight_bytes, wc.forward_us - f});
      bwd.push_back(
          {wc.weight_bytes, wc.backward_us - priced.backwardUs(cost::OpFamily::kConvolution, f)});
    }
    if (auto r = cost::fitExtraRateGbps(fwd); r.ok()) conv_weight_gbps = *r;
    if (auto r = cost::fitExtraRateGbps(bwd); r.ok()) conv_weight_grad_gbps = *r;
  }
  if (conv_weight_gbps > 0) profile.device_overrides.conv_weight_gbps = conv_weight_gbps;
  if (conv_weight_grad_gbps > 0)
    profile.device_overrides.conv_weight_grad_gbps = conv_weight_grad_gbps;
  profile.device_overrides.attention_us = measured.attention_us;
  profile.device_overrides.op_us = measured.op_us;
  profile.device_overrides.elementwise_us = measured.elementwise_us;
  profile.device_overrides.node_us = node_times.us;
  nlohmann::ordered_json cal;
  cal["world_size"] = world.worldSize();
  cal["mesh"] = dmesh.shape();
  cal["threads_per_rank"] = o.threads;
  cal["device"] = device.str();
  cal["backend"] = device.is_cuda() ? "nccl" : "gloo";
  cal["libtorch"] = TORCH_VERSION;
  cal["gap_us"] = gap_us;
  cal["seconds"] = seconds(start, Clock::now());
  cal["compute"] = compute;
  cal["collectives"] = collectives;
  cal["link_fits"] = fits;
  if (overlap) cal["overlap"] = overlap_json;
  if (wait_resume) cal["wait_resume"] = wait_json;
  if (!o.models.empty())
    cal["nodes"] = {{"models", o.models},
                    {"samples", node_times.samples},
                    {"timed", node_times.us.size()},
                    {"failed", node_times.failures}};
  profile.calibration = cal.dump();
  const std::string text = spec::toJson(profile).dump(2) + "\n";
  if (Status st = writeFileAtomic(o.output, text); !st.ok()) return report(st.error());
  std::printf("apc calibrate: %d rank%s, %s, %d thread%s per rank, %.1f s\n", world.worldSize(),
              world.worldSize() == 1 ? "" : "s", device.str().c_str(), o.threads,
              o.threads == 1 ? "" : "s", seconds(start, Clock::now()));
  for (const auto& [dt, tf] : device_fit->peak_tflops)
    std::printf("  matmul %s: %s TFLOP/s\n", ir::dtypeName(dt), formatNumber(tf, 4).c_str());
  if (matmul_output_gbps > 0)
    std::printf("  matmul outputs beyond the flops: %s GB/s\n",
                formatNumber(matmul_output_gbps, 4).c_str());
  std::printf("  matrix-vector products: %s GB/s of matrix; outer products: %s GB/s of output\n",
              formatNumber(matvec_gbps, 4).c_str(), formatNumber(outer_product_gbps, 4).c_str());
  if (conv_weight_gbps > 0 || conv_weight_grad_gbps > 0)
    std::printf("  convolution weights beyond the flops: %s GB/s forward, %s GB/s backward\n",
                formatNumber(conv_weight_gbps, 4).c_str(),
                formatNumber(conv_weight_grad_gbps, 4).c_str());
  std::printf("  memory: %s GB/s, kernel floor %s us, dispatch %s us per op%s\n",
              formatNumber(device_fit->memory_gbps, 4).c_str(), formatNumber(floor_us, 4).c_str(),
              formatNumber(dispatch_us, 4).c_str(), overlaps ? " (overlapping kernels)" : "");
  if (overlap)
    std::printf(
        "  overlap: a %s all-reduce beside compute took %s ms, alone %s ms, the compute alone "
        "%s ms: efficiency %s\n",
        humanBytes(overlap_json["bytes"].get<double>()).c_str(),
        formatNumber(overlap_json["both_us"].get<double>() / 1e3, 3).c_str(),
        formatNumber(overlap_json["collective_us"].get<double>() / 1e3, 3).c_str(),
        formatNumber(overlap_json["compute_us"].get<double>() / 1e3, 3).c_str(),
        formatNumber(*overlap, 2).c_str());
  if (wait_resume)
    std::printf(
        "  wait resume: a %s ms chain of kernels took %s ms right after a blocking all-reduce: "
        "%s us lost per wait\n",
        formatNumber(wait_json["back_to_back_us"].get<double>() / 1e3, 3).c_str(),
        formatNumber(wait_json["after_wait_us"].get<double>() / 1e3, 3).c_str(),
        formatNumber(*wait_resume, 3).c_str());
  for (const auto& f : fits) {
    if (!f.contains("bandwidth_gbps")) continue;
    std::printf("  mesh dim %d: %s GB/s, %s us latency (one link for all kinds, fit error %s%%)\n",
                f["mesh_dim"].get<int>(),
                formatNumber(f["bandwidth_gbps"].get<double>(), 4).c_str(),
                formatNumber(f["latency_us"].get<double>(), 4).c_str(),
                formatNumber(f["mape_pct"].get<double>(), 3).c_str());
    for (const auto& [kind, k] : f["by_kind"].items())
      std::printf("    %-14s %s GB/s, %s us latency (fit error %s%%)\n", kind.c_str(),
                  formatNumber(k["bandwidth_gbps"].get<double>(), 4).c_str(),
                  formatNumber(k["latency_us"].get<double>(), 4).c_str(),
                  formatNumber(k["mape_pct"].get<double>(), 3).c_str());
  }
  if (!o.models.empty())
    std::printf("  model nodes: %zu of %zu (op, local shapes) timed, forward and backward\n",
                node_times.us.size(), node_times.samples);
  for (const std::string& f : node_times.failures) std::printf("    not timed: %s\n", f.c_str());
  std::printf("wrote %s\n", o.output.c_str());
  return 0;
}

/// Starts `apc run <scratch> --nproc N -- <this apc> calibrate --worker ...` and waits for it.
int runLauncherFor(const CalibrateOptions& o, const std::vector<std::string>& worker_args) {
  char tmpl[] = "/tmp/apc-calibrate-XXXXXX";
  if (!mkdtemp(tmpl)) return report(ioError("cannot create a scratch directory in /tmp"));
  std::vector<std::string> args = {"apc",
                                   "run",
                                   tmpl,
                                   "--nproc",
                                   std::to_string(o.nproc),
                                   "--timeout",
                                   formatNumber(o.timeout_s),
                                   "--",
                                   "/proc/self/exe"};
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return report(ioError("cannot find this executable (/proc/self/exe)"));
  args.back() = self;
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return report(ioError("fork failed"));
  if (pid == 0) {
    execv(self.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::filesystem::remove_all(tmpl, ec);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 1;
}

}  // namespace

Runner addCalibrateCommand(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  app.add_option("--nproc", o->nproc,
                 "Start this many local ranks (through apc run); without it, under torchrun, each "
                 "process is a rank")
      ->check(integerIn(1, 1024));
  app.add_option("-o,--output", o->output, "Cluster profile to write (JSON)")
      ->required()
      ->check(nonEmptyPath());
  o->mesh.add(app);
  app.add_option("--threads", o->threads, "Intra-op threads per rank (as apc-train --threads)")
      ->check(integerIn(1, 1024));
  app.add_option("--device", o->device, "cpu (Gloo) or cuda (NCCL, device LOCAL_RANK)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--max-mib", o->max_mib,
                 "Largest collective message in MiB (default 64 on CPU, 256 on CUDA)")
      ->check(numberIn(0.004, 65536.0));
  app.add_option("--min-seconds", o->min_seconds,
                 "Least time measured per kernel or message size (default 0.05)")
      ->check(numberIn(0.0, 60.0));
  app.add_option("--timeout", o->timeout_s, "Stop the ranks after this many seconds (default 900)")
      ->check(numberIn(1.0, 604800.0));
  app.add_option("--model", o->models,
                 "Also time this model's op nodes (TorchScript .pt or exported .pt2) at the local "
                 "shapes its strategies give them on the mesh, forward and backward, which apc "
                 "plan then prices at what they measured; repeatable")
      ->check(CLI::ExistingFile);
  app.add_flag("--worker", o->worker, "(internal) run as one rank")->group("");
  app.add_option("--gap-us", o->gap_us,
                 "Microseconds of compute before each timed collective, as in a training step "
                 "(default 500 on CPU, 0 on CUDA)")
      ->check(numberIn(0.0, 1e6));
  return [o] {
    const bool under_torchrun = std::getenv("RANK") && std::getenv("WORLD_SIZE");
    if (o->worker || (o->nproc == 0 && under_torchrun)) return runWorker(*o);
    if (o->nproc == 0)
      return report(invalidArgument(
          "give --nproc N to start N local ranks, or launch apc calibrate under torchrun"));
    // A model that does not import is one line here, not one per rank after the kernels.
    for (const std::string& m : o->models) {
      ModelFlags mf;
      mf.model = m;
      if (auto g = mf.load(); !g.ok()) return report(g.error());
    }
    // The worker's arguments: this command's, with --worker added.
    std::vector<std::string> args = {"calibrate",
                                     "--worker",
                                     "-o",
                                     o->output,
                                     "--threads",
                                     std::to_string(o->threads),
                                     "--device",
                                     o->device,
                                     "--min-seconds",
                                     formatNumber(o->min_seconds, 17)};
    if (o->max_mib > 0) args.insert(args.end(), {"--max-mib", formatNumber(o->max_mib, 17)});
    if (o->gap_us >= 0) args.insert(args.end(), {"--gap-us", formatNumber(o->gap_us, 17)});
    if (!o->mesh.mesh.empty()) args.insert(args.end(), {"--mesh", o->mesh.mesh});
    if (!o->mesh.mesh_names.empty()) args.insert(args.end(), {"--mesh-names", o->mesh.mesh_names});
    if (!o->mesh.spec.empty()) args.insert(args.end(), {"--spec", o->mesh.spec});
    for (const std::string& m : o->models)
      args.insert(args.end(), {"--model", std::filesystem::absolute(m).string()});
    return runLauncherFor(*o, args);
  };
}

}  // namespace apc::tool
