//===- tools/apc-train/main.cpp - Example trainer over an apc artifact ------===//
//
// `apc-train [DIR] --steps N [--lr X] [--optimizer sgd|adamw] [--seed S] [--batch B]
//            [--model MODEL.pt|MODEL.pt2] [--compare-single MODEL [--no-f64-reference]]
//            [--clip X] [--threads T] [--grad-bucket-mib M] [--first-grad-bucket-mib M]
//            [--no-overlap] [--prefetch K]
//            [--device cpu|cuda] [--onednn on|off|auto] [--profile [--json] [--warmup W]]
//            [--momentum M] [--save DIR [--save-every N] [--keep K]] [--resume DIR]
//            [--data FILE [--data-dtype uint16|uint32|int32|int64]]`
//
// Launched once per rank under torchrun-style variables (torchrun --no-python, or `apc run`, whose
// APC_ARTIFACT names DIR when it is left out), it
// loads the rank's program (apc::runtime::ParallelModule), trains it on synthetic data and prints,
// on rank 0, one line per step: `step <n> loss <x>`, with --compare-single `step <n> loss <x>
// single <y> f64 <z>` where y is the loss of the unsharded model trained in rank 0 from the same
// initial weights and data, and z that of the same unsharded model in float64: |y - z| is the
// float32 run's own rounding, the yardstick for |x - y| (a summary line on stderr at the end
// compares the two, so that a user can tell rounding from a sharding bug).
//
// --data FILE trains on real data (apc/runtime/data.h): a flat binary file of token ids (nanoGPT's
// train.bin: uint16 unless --data-dtype) feeding an input [B, T] with next-token targets and
// cross-entropy, or a .safetensors file of "inputs" and "targets" (or "labels") rows. Each rank
// reads only its piece of the batch; the batches are drawn from (--seed, step), so a resumed run
// sees a straight run's batches. Without --data:
// no per-model code: every step draws full inputs from a generator seeded with --seed and the
// step's number (the same on every rank, and the same whether the run was resumed), floating
// inputs normal, integer inputs below the rows of the embedding they index,
// and cuts this rank's piece. The loss is that of the first output, each rank's share on its own
// rows (apc/runtime/loss.h: the output's rows stay split as the plan placed them, a split class
// dim is gathered): the output itself when it is a scalar, else cross-entropy over its last dim
// with random targets (drawn for the whole batch), else the mean square. Initial weights come from
// --model (a TorchScript .pt or an exported .pt2, read by apc::frontend::loadModelState, or a
// .safetensors full state dict, as Python's safetensors or `apc export` write it; else
// --compare-single; else the model file the artifact was lowered from, its manifest's
// model_path, when it is still there with the artifact's SHA-256): load_full_state_dict of the
// model's parameters and buffers, so that sharded and single start equal. With --random-init, or
// no model file at hand (a note says so), normal(0, 0.02) drawn per full tensor from the seed,
// buffers too: a BatchNorm's running variance drawn so is negative in half its channels, and an
// eval-mode BatchNorm then computes NaN.
// The single-device reference of a .pt runs the TorchScript module; that of a .pt2 (which LibTorch
// cannot run) its graph through apc's interpreter on one device, imported at the run's sizes
// (single_reference.h).
//
// --profile runs --warmup steps (default 2), then measures --steps steps: rank 0 prints the median
// step time (forward + backward + optimizer; the trainer's output gather and loss are reported
// apart, as they are not the program's), its spread, the time blocked in the program's
// collectives, the collectives per mesh dim and kind (calls, bytes, time), the peak memory per
// rank (CUDA: the caching allocator's peak; CPU: apc's caching allocator's peak of tensor bytes, or
// without it the process's peak resident set), each the
// slowest rank's, beside what the plan predicted (proto::Prediction), and the overlap of the
// program's collectives: their time in flight (issue to completion), the time the rank was blocked
// in them (exposed) and the rest, hidden behind compute, as a fraction of the time in flight
// (gradient buckets overlap their all-reduces with backward, and the forward issues parameter
// gathers --prefetch ahead of their use, unless --no-overlap). --json prints one
// object instead (measured_step_ms, predicted_step_ms, ...) and no step lines.
//
// --save DIR writes a checkpoint (apc/runtime/checkpoint.h: shards, optimizer state, step) to
// DIR/step_<n> after the last step and every --save-every steps; --resume DIR loads one (DIR's
// newest complete checkpoint) and continues at its step: `--steps` is the total, so a run resumed
// at step k prints steps k..N-1 exactly as the straight run does (same losses, bit for bit on CPU
// with the same --threads). Rank 0 notes each save and load on stderr with its size and time.
//
// --device cuda puts the shards, the inputs and the reference on CUDA device LOCAL_RANK and runs
// the collectives over NCCL (c10d's ProcessGroupNCCL); it needs a build against a CUDA LibTorch.
// Errors are one line on stderr and exit 2.
//
//===----------------------------------------------------------------------===//
#include <ATen/DeviceAccelerator.h>
#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/script.h>

#include <sys/resource.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apc/artifact/artifact.h"
#include "apc/frontend/weights.h"
#include "apc/runtime/checkpoint.h"
#include "apc/runtime/data.h"
#include "apc/runtime/host_allocator.h"
#include "apc/runtime/interpreter.h"
#include "apc/runtime/loss.h"
#include "apc/runtime/optimizer.h"
#include "apc/runtime/parallel_module.h"
#include "apc/support/activity.h"
#include "apc/support/file_io.h"
#include "apc/support/hash.h"
#include "apc/support/strings.h"
#include "cli_checks.h"
#include "node_profile.h"
#include "single_reference.h"

namespace {

struct Flags {
  std::string dir;
  int steps = 10;
  double lr = 0.01;
  std::string optimizer = "sgd";
  double momentum = 0;  // SGD's
  uint64_t seed = 0;
  int64_t batch = 0;  // 0: the artifact's batch
  std::string model;
  std::string compare_single;
  bool random_init = false;  // normal(0, 0.02) weights even when the artifact's model is at hand
  bool no_f64_reference = false;
  double clip = 0;  // 0: no clipping
  int threads = 1;
  std::string onednn = "auto";
  bool report_comm = false;
  std::string device = "cpu";
  double timeout_s = 0;  // 0: APC_TIMEOUT_S, else the runtime's default (300 s)
  bool profile = false;
  bool profile_nodes = false;
  bool host_cache = true;            // apc/runtime/host_allocator.h (--no-host-cache)
  double grad_bucket_mib = 25;       // ParallelModuleOptions::grad_bucket_bytes, in MiB
  double first_grad_bucket_mib = 1;  // ParallelModuleOptions::first_grad_bucket_bytes, in MiB
  bool overlap = true;               // ParallelModuleOptions::overlap (--no-overlap)
  int prefetch = 1;                  // ParallelModuleOptions::prefetch_params
  bool json = false;
  int warmup = -1;     // -1: 2 under --profile, else 0
  std::string save;    // checkpoint root (apc/runtime/checkpoint.h)
  int save_every = 0;  // 0: only after the last step
  int keep = 0;        // checkpoints kept under --save (0: all)
  std::string resume;  // a checkpoint, or a root whose newest complete one is taken
  std::string data;    // apc/runtime/data.h: token ids or a .safetensors file; "": synthetic
  std::string data_dtype = "uint16";
};

/// Seeds of independent streams from (seed, step, stream).
uint64_t mixSeed(uint64_t seed, uint64_t step, uint64_t stream) {
  return apc::mixSeeds(seed, step, stream);
}

/// Bytes of the regular files in `dir` (a checkpoint's size).
int64_t directoryBytes(const std::string& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) n += static_cast<int64_t>(e.file_size(ec));
  return n;
}

/// --compare-single: one unsharded model trained beside the shards.
struct Reference {
  std::unique_ptr<apc::train::SingleReference> model;
  std::vector<at::Tensor> params;
  std::optional<apc::runtime::Optimizer> opt;
  double last_loss = 0;
};

/// Nine significant digits: enough to compare sharded and single losses in tests.
std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

int fail(const std::string& msg) {
  // One write: ranks share the terminal, and three writes interleave with a peer's.
  std::fputs(("apc-train: error: " + msg + "\n").c_str(), stderr);
  return 2;
}

/// The loss of full output leaves (see the file comment); `targets` caches the random targets.
at::Tensor lossOf(const std::vector<at::Tensor>& outs, at::Generator& gen) {
  const at::Tensor& out = outs.at(0);
  if (out.numel() == 1) return out.reshape({});
  if (at::isFloatingType(out.scalar_type()) && out.dim() >= 2) {
    const int64_t classes = out.size(-1);
    at::Tensor logits = out.reshape({-1, classes});
    at::Tensor targets = at::randint(0, classes, {logits.size(0)}, gen, at::kLong).to(out.device());
    return at::cross_entropy_loss(logits, targets);
  }
  return out.pow(2).mean();
}

/// One training step of a reference on the full inputs (cast to its floating dtype: under mixed
/// precision the artifact's inputs may be bf16, and the float64 twin computes in f64), with the
/// trainer's loss, clipping and optimizer; returns the loss.
apc::Expected<double> referenceStep(Reference& r, const std::vector<at::Tensor>& full_inputs,
                                    uint64_t loss_seed, double clip,
                                    const at::Tensor* targets = nullptr) {
  r.opt->zero_grad();
  const at::ScalarType dtype = r.model->floatingDtype();
  std::vector<c10::IValue> args;
  for (const at::Tensor& x : full_inputs)
    args.emplace_back(x.is_floating_point() ? x.to(dtype) : x);
  APC_ASSIGN_OR_RETURN(std::vector<at::Tensor> outs, r.model->forward(args));
  at::Generator gen = at::detail::createCPUGenerator(loss_seed);
  // --data: the batch's own targets (floating ones in the reference's dtype), else the synthetic
  // loss.
  at::Tensor loss;
  if (targets) {
    const at::Tensor t =
        targets->is_floating_point() ? targets->to(outs.at(0).scalar_type()) : *targets;
    loss = apc::runtime::dataLoss(outs.at(0), t);
  } else {
    loss = lossOf(outs, gen);
  }
  loss.backward();
  if (clip > 0) {
    at::NoGradGuard no_grad;
    double sq = 0;
    for (const at::Tensor& p : r.params)
      if (p.grad().defined()) sq += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    const double coef = clip / (std::sqrt(sq) + 1e-6);
    if (coef < 1)
      for (const at::Tensor& p : r.params)
        if (p.grad().defined()) p.grad().mul_(coef);
  }
  r.opt->step();
  return loss.item<double>();
}

/// The summary of --compare-single: the sharded run's largest difference from the single-device
/// one beside the single-device run's own float32 rounding (against its float64 twin). `mixed`:
/// the artifact computes in this lower precision (a mixed_precision plan) while the single-device
/// run computes in float32, so the bound is that precision's rounding of the largest loss `loss`:
/// five unit roundoffs of it. `draws_random`: the program has random nodes (dropout in training),
/// so the runs differ by their draws.
void reportRounding(double diff, double rounding, std::optional<at::ScalarType> mixed, double loss,
                    bool draws_random) {
  std::string verdict;
  if (draws_random) {
    // The float64 twin draws its own numbers too: neither figure is a rounding error.
    verdict =
        "not comparable number for number: the program draws random numbers, and each run draws "
        "its own";
  } else if (mixed) {
    // Unit roundoff: bf16 keeps 8 significant bits, f16 11.
    const double unit_roundoff = *mixed == at::kBFloat16 ? 0x1p-8 : 0x1p-11;
    const double bound = 5 * unit_roundoff * std::abs(loss);
    char text[256];
    std::snprintf(text, sizeof text,
                  "the artifact computes in %s (mixed precision), the single-device run in "
                  "float32: %s %s's rounding of the loss, %.3g",
                  c10::toString(*mixed), diff <= bound ? "within" : "larger than",
                  c10::toString(*mixed), bound);
    verdict = text;
    if (diff > bound) verdict += ": a sharding bug, or a network that amplifies rounding";
  } else if (diff <= std::max(10 * rounding, 1e-6)) {
    verdict = "within the single-device run's own rounding";
  } else {
    verdict =
        "larger than the single-device run's own rounding: a sharding bug, or a network that "
        "amplifies rounding (compare in float64 to tell)";
  }
  std::fprintf(stderr,
               "apc-train: sharded vs single: largest loss difference %.3g; the single-device "
               "float32 run vs float64: %.3g (%s)\n",
               diff, rounding, verdict.c_str());
}

/// Seconds since the epoch of steady_clock, after the device finished its queued work (CUDA):
/// phase boundaries of the profile.
double now(const c10::Device& device) {
  if (device.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(device.index());
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The peak of allocated bytes per phase of a step (the CUDA caching allocator's, or apc's host
/// caching allocator's; 0 without either): take() returns the peak since the last take and starts
/// a new one, keeping the running maximum of the takes that `count` (the measured steps' phases:
/// not the model's loading, the warm-up or the trainer's synthetic data), which the profile
/// reports as the run's peak.
class PhasePeaks {
 public:
  explicit PhasePeaks(const c10::Device& device) : device_(device) {}

  int64_t take(bool count = true) {
    int64_t p = 0;
    if (device_.is_cuda()) {
      p = at::accelerator::getDeviceStats(device_.index()).allocated_bytes[0].peak;
      at::accelerator::resetPeakStats(device_.index());
    } else if (apc::runtime::cachingHostAllocatorInstalled()) {
      p = apc::runtime::hostAllocatorStats().peak_allocated_bytes;
      apc::runtime::resetHostAllocatorPeak();
    }
    if (count) overall_ = std::max(overall_, p);
    return p;
  }
  int64_t overall() const { return overall_; }

 private:
  c10::Device device_;
  int64_t overall_ = 0;
};

/// One measured step: wall seconds per phase and the program's collectives per mesh dim.
struct StepSample {
  double forward = 0, loss = 0, backward = 0, optimizer = 0;
  // Peak allocated bytes per phase (PhasePeaks): before the forward (the inputs), the forward,
  // the trainer's loss (output gather and loss), backward, the optimizer step.
  int64_t peak_inputs = 0, peak_forward = 0, peak_loss = 0, peak_backward = 0, peak_optimizer = 0;
  double forward_comm = 0, backward_comm = 0;  // seconds blocked in the program's collectives
  double comm_in_flight =
      0;  // seconds with a program collective in flight (CommStats::busy_seconds)
  std::vector<apc::runtime::CommStats> comm;  // per mesh dim, the program's collectives only
  double step() const { return forward + backward + optimizer; }
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

/// The process's peak resident set (getrusage), in bytes.
int64_t peakRssBytes() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

/// --profile-nodes, rank 0: per op, its nodes' measured forward and backward time per step beside
/// the plan's price for them; text, or with --json one JSON object line ({"nodes": [...] per op,
/// "per_node": [...] every node with its local input shapes}) before the profile's.
void reportNodes(const apc::train::NodeProfiler& np, apc::runtime::ParallelModule& pm,
                 const Flags& f) {
  const auto totals = np.totals(f.steps, pm.predictedStep().node_compute_us);
  if (f.json) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const auto& o : totals)
      rows.push_back({{"op", o.op},
                      {"nodes", o.nodes},
                      {"forward_ms", o.forward_ms},
                      {"backward_ms", o.backward_ms},
                      {"predicted_ms", o.predicted_ms}});
    nlohmann::ordered_json each = nlohmann::ordered_json::array();
    for (const auto& r : np.perNode(f.steps, pm.predictedStep().node_compute_us))
      each.push_back({{"node", r.node},
                      {"op", r.op},
                      {"module_path", r.module_path},
                      {"inputs", r.inputs},
                      {"forward_ms", r.forward_ms},
                      {"backward_ms", r.backward_ms},
                      {"predicted_ms", r.predicted_ms}});
    std::printf("%s\n", nlohmann::ordered_json{{"nodes", rows}, {"per_node", each}}.dump().c_str());
    return;
  }
  double fwd = 0, bwd = 0, pred = 0;
  std::printf("per op, per step (nodes timed one by one):\n");
  std::printf("  %-40s %5s %11s %11s %11s %11s %9s\n", "op", "nodes", "forward ms", "backward ms",
              "total ms", "predicted", "pred/meas");
  for (const auto& o : totals) {
    const double total = o.forward_ms + o.backward_ms;
    fwd += o.forward_ms;
    bwd += o.backward_ms;
    pred += o.predicted_ms;
    char ratio[32] = "-";
    if (o.predicted_ms > 0 && total > 0)
      std::snprintf(ratio, sizeof ratio, "%.2f", o.predicted_ms / total);
    std::printf("  %-40s %5lld %11.3f %11.3f %11.3f %11.3f %9s\n", o.op.c_str(),
                static_cast<long long>(o.nodes), o.forward_ms, o.backward_ms, total, o.predicted_ms,
                ratio);
  }
  std::printf("  %-40s %5s %11.3f %11.3f %11.3f %11.3f\n", "all", "", fwd, bwd, fwd + bwd, pred);
}

/// The profile of the measured steps: rank 0 prints it on stdout (text, or one JSON object with
/// --json); every rank contributes its medians and peak memory to an all-reduce of maxima, so the
/// reported times and memory are the slowest (largest) rank's.
void reportProfile(apc::runtime::ParallelModule& pm, const Flags& f,
                   const std::vector<StepSample>& samples, const c10::Device& device,
                   int64_t phase_peak) {
  using apc::runtime::CommKind;
  const size_t ndim = pm.mesh().ndim();
  const size_t n = samples.size();
  auto column = [&](auto get) {
    std::vector<double> v;
    for (const StepSample& s : samples) v.push_back(get(s));
    return v;
  };
  std::vector<double> step = column([](const StepSample& s) { return s.step(); });
  // Medians per phase on this rank, then the maximum over ranks (the step waits for the slowest).
  std::vector<double> local = {
      quantile(step, 0.5),
      quantile(step, 0.0),
      quantile(step, 1.0),
      quantile(column([](const StepSample& s) { return s.forward; }), 0.5),
      quantile(column([](const StepSample& s) { return s.backward; }), 0.5),
      quantile(column([](const StepSample& s) { return s.optimizer; }), 0.5),
      quantile(column([](const StepSample& s) { return s.loss; }), 0.5),
      quantile(column([](const StepSample& s) { return s.forward_comm; }), 0.5),
      quantile(column([](const StepSample& s) { return s.backward_comm; }), 0.5),
      0.0,  // peak memory, filled below
      static_cast<double>(peakRssBytes()),
      quantile(column([](const StepSample& s) { return s.comm_in_flight; }), 0.5),
      quantile(column([](const StepSample& s) { return s.forward_comm + s.backward_comm; }), 0.5),
  };
  int64_t peak = 0;
  std::string memory_kind;
  if (device.is_cuda()) {
    peak = at::accelerator::getDeviceStats(device.index()).allocated_bytes[0].peak;
    memory_kind = "cuda caching allocator peak allocated bytes";
  } else if (apc::runtime::cachingHostAllocatorInstalled()) {
    peak = apc::runtime::hostAllocatorStats().peak_allocated_bytes;
    memory_kind = "apc host caching allocator peak allocated bytes";
  } else {
    peak = peakRssBytes();
    memory_kind = "process peak resident set (getrusage ru_maxrss)";
  }
  // The phases' running maximum covers the steps; the allocator's own peak what came after.
  local[9] = static_cast<double>(std::max(peak, phase_peak));
  // Per phase: the largest over the measured steps.
  auto phaseMax = [&](int64_t StepSample::*field) {
    int64_t m = 0;
    for (const StepSample& s : samples) m = std::max(m, s.*field);
    return static_cast<double>(m);
  };
  const size_t phase_at = local.size();  // agg[phase_at + k]: inputs, forward, loss, ...
  local.push_back(phaseMax(&StepSample::peak_inputs));
  local.push_back(phaseMax(&StepSample::peak_forward));
  local.push_back(phaseMax(&StepSample::peak_loss));
  local.push_back(phaseMax(&StepSample::peak_backward));
  local.push_back(phaseMax(&StepSample::peak_optimizer));
  at::Tensor t = at::tensor(local, at::kDouble);
  if (pm.worldSize() > 1) pm.world().all().allReduce(t, apc::mesh::ReduceOp::kMax);
  std::vector<double> agg(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  if (pm.rank() != 0) return;

  const apc::runtime::PredictedStep pred = pm.predictedStep();
  const double opt_us = f.optimizer == "adamw" ? pred.optimizer_adamw_us : pred.optimizer_sgd_us;
  const double predicted_ms = (pred.step_us + opt_us) / 1e3;
  const double measured_ms = agg[0] * 1e3;
  nlohmann::ordered_json j;
  j["measured_step_ms"] = measured_ms;
  j["predicted_step_ms"] = pred.present ? nlohmann::ordered_json(predicted_ms) : nullptr;
  j["error_pct"] = pred.present && measured_ms > 0
                       ? nlohmann::ordered_json((predicted_ms - measured_ms) / measured_ms * 100)
                       : nullptr;
  j["steps"] = n;
  j["warmup"] = f.warmup;
  j["world_size"] = pm.worldSize();
  j["device"] = device.str();
  j["threads"] = f.threads;
  j["optimizer"] = f.optimizer;
  j["step_ms"] = {{"median", agg[0] * 1e3}, {"min", agg[1] * 1e3}, {"max", agg[2] * 1e3}};
  j["measured_ms"] = {{"forward", agg[3] * 1e3},      {"backward", agg[4] * 1e3},
                      {"optimizer", agg[5] * 1e3},    {"loss_outside_program", agg[6] * 1e3},
                      {"forward_comm", agg[7] * 1e3}, {"backward_comm", agg[8] * 1e3}};
  j["predicted_ms"] = {{"compute", pred.compute_us / 1e3},
                       {"comm", pred.comm_us / 1e3},
                       {"forward_comm_rank0", pred.forward_comm_us / 1e3},
                       {"backward_comm_rank0", pred.backward_comm_us / 1e3},
                       {"optimizer", opt_us / 1e3},
                       {"hidden_comm", pred.hidden_comm_us / 1e3},
                       {"exposed_comm", pred.exposed_comm_us / 1e3}};
  j["overlap_efficiency"] = pred.overlap_efficiency;
  j["cost_model"] = pred.cost_model;
  // The device kind the plan was priced for ("h100: ..." -> "h100") against the one this run is
  // on: a GPU's prediction says nothing about a CPU run, and the other way round.
  const std::string priced_kind = pred.cost_model.substr(0, pred.cost_model.find(':'));
  const bool other_kind = pred.present && !priced_kind.empty() &&
                          (priced_kind == "cpu") != (device.type() == c10::DeviceType::CPU);
  j["predicted_for_another_device"] = other_kind;
  // The overlap of the program's collectives (medians per step, the slowest rank's): in flight is
  // the wall time with at least one of them between issue and completion, exposed the time the
  // rank was blocked in them, hidden the rest (communication that ran while the rank computed).
  const double in_flight_ms = agg[11] * 1e3, exposed_ms = agg[12] * 1e3;
  const double hidden_ms = std::max(0.0, in_flight_ms - exposed_ms);
  j["overlap"] = f.overlap;
  j["comm_overlap_ms"] = {{"in_flight", in_flight_ms},
                          {"exposed", exposed_ms},
                          {"hidden", hidden_ms},
                          {"hidden_fraction", in_flight_ms > 0 ? hidden_ms / in_flight_ms : 0.0}};
  // Rank 0's collectives per mesh dim and kind, per step (averaged over the measured steps).
  nlohmann::ordered_json coll = nlohmann::ordered_json::array();
  for (size_t m = 0; m < ndim; ++m)
    for (size_t k = 0; k < apc::runtime::kNumCommKinds; ++k) {
      double calls = 0, bytes = 0, secs = 0, flight = 0, async = 0;
      for (const StepSample& s : samples) {
        calls += static_cast<double>(s.comm[m].by_kind[k].calls);
        bytes += static_cast<double>(s.comm[m].by_kind[k].bytes_sent);
        secs += s.comm[m].by_kind[k].seconds;
        flight += s.comm[m].by_kind[k].in_flight_seconds;
        async += static_cast<double>(s.comm[m].by_kind[k].async_calls);
      }
      if (calls == 0) continue;
      const double dn = static_cast<double>(std::max<size_t>(n, 1));
      coll.push_back({{"mesh_dim", m},
                      {"kind", apc::runtime::commKindName(static_cast<CommKind>(k))},
                      {"calls", calls / dn},
                      {"bytes_sent", bytes / dn},
                      {"ms", secs / dn * 1e3},
                      {"in_flight_ms", flight / dn * 1e3},
                      {"async_calls", async / dn}});
    }
  j["collectives_per_step"] = coll;
  // What the plan's collectives put on the wire per step by the alpha-beta formulas (rank 0's):
  // equal to the measured bytes_sent summed over collectives_per_step for even pieces.
  j["planned_wire_bytes"] = pm.pricedComm().wire_bytes;
  j["peak_memory_bytes"] = static_cast<int64_t>(agg[9]);
  j["peak_rss_bytes"] = static_cast<int64_t>(agg[10]);  // the process's, whatever the kind
  j["peak_memory_kind"] = memory_kind;
  j["peak_memory_by_phase_bytes"] = {{"inputs", static_cast<int64_t>(agg[phase_at + 0])},
                                     {"forward", static_cast<int64_t>(agg[phase_at + 1])},
                                     {"loss", static_cast<int64_t>(agg[phase_at + 2])},
                                     {"backward", static_cast<int64_t>(agg[phase_at + 3])},
                                     {"optimizer", static_cast<int64_t>(agg[phase_at + 4])}};
  // The plan's predicted peak for this optimizer beside the measured one.
  const std::string memory_optimizer =
      f.optimizer == "adamw" ? "adamw" : (f.momentum != 0 ? "momentum" : "sgd");
  const apc::runtime::PredictedStep::PeakMemory* predicted_peak = nullptr;
  for (const auto& m : pred.peak_memory)
    if (m.optimizer == memory_optimizer) predicted_peak = &m;
  const double measured_peak = agg[9];
  j["predicted_peak_memory_bytes"] =
      predicted_peak ? nlohmann::ordered_json(predicted_peak->peak_bytes) : nullptr;
  if (predicted_peak)
    j["predicted_peak_memory_by_phase_bytes"] = {{"forward", predicted_peak->forward},
                                                 {"loss", predicted_peak->loss},
                                                 {"backward", predicted_peak->backward},
                                                 {"optimizer", predicted_peak->step}};
  j["peak_memory_error_pct"] =
      predicted_peak && measured_peak > 0
          ? nlohmann::ordered_json(
                (static_cast<double>(predicted_peak->peak_bytes) - measured_peak) / measured_peak *
                100)
          : nullptr;
  if (f.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("profile: %zu steps after %d warm-up, %d rank%s, %s, %d thread%s\n", n, f.warmup,
                pm.worldSize(), pm.worldSize() == 1 ? "" : "s", device.str().c_str(), f.threads,
                f.threads == 1 ? "" : "s");
    std::printf("  step (median, slowest rank)  measured %9.3f ms  predicted %s\n", measured_ms,
                pred.present ? (number(predicted_ms) + " ms").c_str() : "n/a (no prediction)");
    if (other_kind)
      std::printf(
          "  note: predicted for %s, the plan's device, not this %s run (apc plan --device cpu, "
          "or --cluster with apc calibrate's profile, prices this machine)\n",
          priced_kind.c_str(), device.str().c_str());
    std::printf("  spread                       min %.3f ms, max %.3f ms\n", agg[1] * 1e3,
                agg[2] * 1e3);
    std::printf(
        "  forward %.3f ms, backward %.3f ms, optimizer %.3f ms (loss outside the "
        "program %.3f ms)\n",
        agg[3] * 1e3, agg[4] * 1e3, agg[5] * 1e3, agg[6] * 1e3);
    std::printf("  blocked in collectives: forward %.3f ms, backward %.3f ms\n", agg[7] * 1e3,
                agg[8] * 1e3);
    std::printf(
        "  collectives in flight %.3f ms, exposed %.3f ms, hidden behind compute %.3f ms (%.0f%%, "
        "overlap %s)\n",
        in_flight_ms, exposed_ms, hidden_ms,
        in_flight_ms > 0 ? hidden_ms / in_flight_ms * 100 : 0.0, f.overlap ? "on" : "off");
    std::printf(
        "  predicted: compute %.3f ms, communication %.3f ms (exposed %.3f ms, hidden %.3f ms, "
        "%.0f%% of it off the step), optimizer %.3f ms\n",
        pred.compute_us / 1e3, pred.comm_us / 1e3, pred.exposed_comm_us / 1e3,
        pred.hidden_comm_us / 1e3, pred.overlap_efficiency * 100, opt_us / 1e3);
    for (const auto& c : coll)
      std::printf(
          "  mesh dim %d %-14s %6.1f calls %12.0f bytes sent %9.3f ms per step (%.3f ms in "
          "flight)\n",
          c["mesh_dim"].get<int>(), c["kind"].get<std::string>().c_str(), c["calls"].get<double>(),
          c["bytes_sent"].get<double>(), c["ms"].get<double>(), c["in_flight_ms"].get<double>());
    std::printf("  peak memory per rank (max)   measured %s (%s)\n",
                apc::humanBytes(measured_peak).c_str(), memory_kind.c_str());
    if (agg[phase_at + 1] > 0)
      std::printf(
          "                               by phase: inputs %s, forward %s, loss %s, backward %s, "
          "optimizer %s\n",
          apc::humanBytes(agg[phase_at]).c_str(), apc::humanBytes(agg[phase_at + 1]).c_str(),
          apc::humanBytes(agg[phase_at + 2]).c_str(), apc::humanBytes(agg[phase_at + 3]).c_str(),
          apc::humanBytes(agg[phase_at + 4]).c_str());
    if (predicted_peak)
      std::printf("                               predicted %s (%s, peak in the %s, %+.1f%%)\n",
                  apc::humanBytes(static_cast<double>(predicted_peak->peak_bytes)).c_str(),
                  memory_optimizer.c_str(), predicted_peak->phase.c_str(),
                  measured_peak > 0
                      ? (static_cast<double>(predicted_peak->peak_bytes) - measured_peak) /
                            measured_peak * 100
                      : 0.0);
    if (predicted_peak && predicted_peak->forward > 0)
      std::printf(
          "                               predicted by phase: forward %s, loss %s, backward %s, "
          "optimizer %s\n",
          apc::humanBytes(static_cast<double>(predicted_peak->forward)).c_str(),
          apc::humanBytes(static_cast<double>(predicted_peak->loss)).c_str(),
          apc::humanBytes(static_cast<double>(predicted_peak->backward)).c_str(),
          apc::humanBytes(static_cast<double>(predicted_peak->step)).c_str());
  }
  std::fflush(stdout);
}

/// The model file the artifact in `dir` was lowered from (its manifest's model_path), when it is
/// there with the artifact's SHA-256; else empty, and `why` says what is missing.
std::string loweredModelFile(const std::string& dir, std::string* why) {
  auto manifest = apc::artifact::readManifest(dir);
  if (!manifest.ok() || manifest->model_path.empty()) {
    *why = "the artifact does not name its model file";
    return "";
  }
  if (!std::filesystem::is_regular_file(manifest->model_path)) {
    *why = "its model file " + manifest->model_path + " is not there";
    return "";
  }
  auto sha = apc::sha256File(manifest->model_path);
  if (!sha.ok() || *sha != manifest->model_hash) {
    *why = "its model file " + manifest->model_path + " changed since lowering";
    return "";
  }
  return manifest->model_path;
}

int run(Flags f) {
  at::set_num_threads(f.threads);
  // Before any tensor: CPU activations and gradients reuse their blocks from step to step
  // instead of faulting fresh pages in every step (apc/runtime/host_allocator.h).
  if (f.host_cache) apc::runtime::useCachingHostAllocator();
  if (f.warmup < 0) f.warmup = f.profile ? 2 : 0;
  if (f.json && !f.profile) return fail("--json needs --profile");
  if (f.profile_nodes && !f.profile) return fail("--profile-nodes needs --profile");
  // oneDNN's float32 convolution does not round as ATen's own kernels do: on an AVX-512 CPU the
  // float32 losses of a batch-8 resnet18 drift 8.7e-4 from float64 by step 2 with it, 7e-8
  // without (docs/TOOLCHAIN.md), and ATen picks oneDNN or its own kernel by shape. Sharded and
  // single runs see different local shapes, so the comparison would measure that kernel, not
  // the plan: with --compare-single both sides run ATen's kernels unless --onednn on.
  if (f.onednn == "off" || (f.onednn == "auto" && !f.compare_single.empty()))
    at::globalContext().setUserEnabledMkldnn(false);
  if (!apc::runtime::isKnownOptimizer(f.optimizer))
    return fail("--optimizer must be sgd or adamw, got '" + f.optimizer + "'");
  if (f.momentum != 0 && f.optimizer != "sgd") return fail("--momentum is SGD's (--optimizer sgd)");
  if (!f.resume.empty() && !f.compare_single.empty())
    return fail(
        "--resume cannot be combined with --compare-single (the checkpoint holds the sharded "
        "run's state, not the reference's)");
  if (f.save_every > 0 && f.save.empty()) return fail("--save-every needs --save DIR");
  if (f.device != "cpu" && f.device != "cuda")
    return fail("--device must be cpu or cuda, got '" + f.device + "'");
  apc::runtime::ParallelModuleOptions options;
  options.grad_bucket_bytes = static_cast<int64_t>(f.grad_bucket_mib * 1024 * 1024);
  options.first_grad_bucket_bytes = static_cast<int64_t>(f.first_grad_bucket_mib * 1024 * 1024);
  options.overlap = f.overlap;
  options.prefetch_params = f.prefetch;
  if (f.device == "cuda") {
    // isBuilt: libtorch_cuda is linked in; hasCUDA: a driver and at least one device answer.
    if (!at::detail::getCUDAHooks().isBuilt())
      return fail("--device cuda: this apc-train is built against a LibTorch without CUDA");
    if (!at::hasCUDA())
      return fail(
          "--device cuda: no CUDA device is available (no GPU or NVIDIA driver, or "
          "CUDA_VISIBLE_DEVICES hides them)");
    auto env = apc::runtime::launchEnvFromEnvironment();
    if (!env.ok()) return fail(env.error().message());
    const int devices = at::detail::getCUDAHooks().deviceCount();
    if (env->local_rank >= devices)
      return fail("--device cuda: LOCAL_RANK " + std::to_string(env->local_rank) +
                  " but this machine has " + std::to_string(devices) + " CUDA device" +
                  (devices == 1 ? "" : "s"));
    options.world.backend = apc::runtime::Backend::kNccl;
    options.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env->local_rank));
  }
  if (f.timeout_s > 0) {
    auto ms = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(f.timeout_s * 1000)));
    options.world.timeout = options.world.setup_timeout = ms;
    options.world.timeouts_from_environment = false;
  }
  const c10::Device device = options.device;
  apc::setActivity("loading the artifact " + apc::printable(f.dir));
  auto loaded = apc::runtime::ParallelModule::load(f.dir, options);
  if (!loaded.ok()) {
    // The rendezvous failed (peers missing, a port clash, another job's store): a failed
    // distributed run, exit 1; a bad artifact or environment is bad input, exit 2.
    fail(loaded.error().message());
    return loaded.error().code() == apc::ErrorCode::kIo ? 1 : 2;
  }
  apc::runtime::ParallelModule& pm = **loaded;
  const bool rank0 = pm.rank() == 0;

  std::string model_path = !f.model.empty() ? f.model : f.compare_single;
  if (model_path.empty() && f.resume.empty() && !f.random_init) {
    // The model the artifact was lowered from, loaded only when every rank finds it unchanged:
    // a rank without it (another node, a moved file) would otherwise start from other weights.
    std::string why;
    const std::string found = loweredModelFile(f.dir, &why);
    at::Tensor everywhere = at::full({1}, found.empty() ? 0.0 : 1.0, at::kFloat).to(device);
    if (pm.worldSize() > 1) pm.world().all().allReduce(everywhere, apc::mesh::ReduceOp::kMin);
    if (everywhere.item<float>() > 0) {
      model_path = found;
      if (rank0)
        std::fprintf(stderr,
                     "apc-train: weights from %s, the model the artifact was lowered from "
                     "(--random-init draws them)\n",
                     model_path.c_str());
    } else if (rank0) {
      std::fprintf(stderr,
                   "apc-train: note: %s: weights and buffers drawn from normal(0, 0.02) (give "
                   "--model for the model's own)\n",
                   found.empty() ? why.c_str() : "a rank cannot read the artifact's model file");
    }
  }
  // --compare-single: the unsharded model, and its float64 twin (the yardstick of rounding).
  std::vector<Reference> refs;
  if (!f.compare_single.empty() && rank0) {
    apc::train::ReferenceOptions ro;
    ro.device = device;
    for (const apc::runtime::PlacedTensor& spec : pm.inputSpecs()) {
      apc::frontend::InputSpec in;
      in.name = spec.name;
      in.dtype = apc::dtypeOf(spec.dtype);
      for (size_t d = 0; d < spec.global_shape.size(); ++d) {
        const int64_t size = d == 0 && f.batch > 0 ? f.batch : spec.global_shape[d];
        const std::string& sym = d < spec.symbols.size() ? spec.symbols[d] : std::string();
        in.shape.push_back(sym.empty() ? apc::ir::Dim::fixed(size)
                                       : apc::ir::Dim::symbolic(sym, size));
      }
      ro.inputs.push_back(std::move(in));
    }
    apc::setActivity("loading the single-device model " + apc::printable(f.compare_single));
    auto single = apc::train::loadSingleReference(f.compare_single, ro);
    if (!single.ok()) return fail("--compare-single: " + single.error().message());
    refs.emplace_back();
    refs.back().model = std::move(single).value();
    if (!f.no_f64_reference && refs.back().model->floatingDtype() != at::kDouble) {
      ro.widen = true;
      auto wide = apc::train::loadSingleReference(f.compare_single, ro);
      if (wide.ok()) {
        refs.emplace_back();
        refs.back().model = std::move(wide).value();
      } else {
        std::fprintf(stderr, "apc-train: note: no float64 reference (%s)\n",
                     wide.error().message().c_str());
      }
    }
  }
  // Random nodes (dropout in training, sampling ops): every rank and the single-device run draw
  // their own numbers, so --compare-single's losses agree in distribution only. Said up front:
  // a user comparing a model with dropout would otherwise read the difference as a sharding bug.
  std::map<std::string, int> random_ops;
  for (apc::ir::NodeId n : pm.randomNodes()) ++random_ops[pm.graph().node(n).qualifiedOp()];
  if (!refs.empty() && !random_ops.empty()) {
    const std::string ops = apc::joinMap(random_ops, ", ", [](const auto& kv) {
      return kv.first + (kv.second > 1 ? " x" + std::to_string(kv.second) : "");
    });
    std::fprintf(stderr,
                 "apc-train: note: the program draws random numbers (%s): the ranks and the "
                 "single-device run draw different ones, so their losses agree in distribution "
                 "only; export the model with dropout off (p=0 or eval mode) to compare number "
                 "for number\n",
                 ops.c_str());
  }
  if (!f.resume.empty()) {
    pm.to_empty(device);  // the checkpoint fills the shards below
  } else if (!model_path.empty()) {
    apc::setActivity("loading the weights of " + apc::printable(model_path));
    std::map<std::string, at::Tensor> full;
    const std::string ext = ".safetensors";
    if (model_path.size() > ext.size() &&
        model_path.compare(model_path.size() - ext.size(), ext.size(), ext) == 0) {
      // A full state dict saved by Python (safetensors.torch.save_file) or by `apc export`.
      auto state = apc::runtime::readSafetensors(model_path);
      if (!state.ok()) return fail(state.error().message());
      full = std::move(state).value();
    } else {
      auto state = apc::frontend::loadModelState(model_path);
      if (!state.ok()) return fail(model_path + ": " + state.error().message());
      for (const auto& [name, t] : *state) full[name] = t.detach();
    }
    apc::Status s = pm.load_full_state_dict(full);
    if (!s.ok()) return fail(model_path + ": " + s.error().message());
    if (model_path != f.compare_single) {
      // The references start from the same weights as the shards.
      at::NoGradGuard no_grad;
      for (Reference& r : refs) {
        for (const auto& [name, t] : r.model->namedParameters())
          if (auto it = full.find(name); it != full.end()) t.copy_(it->second);
        for (const auto& [name, t] : r.model->namedBuffers())
          if (auto it = full.find(name); it != full.end()) t.copy_(it->second);
      }
    }
  } else {
    pm.init_weights([&](const apc::runtime::PlacedTensor& spec, at::Tensor& local) {
      at::Generator g =
          at::detail::createCPUGenerator(f.seed + std::hash<std::string>{}(spec.name));
      at::Tensor full = at::randn(spec.global_shape, g, at::kFloat).mul_(0.02).to(spec.dtype);
      for (size_t d = 0; d < spec.local.size(); ++d)
        full = full.narrow(static_cast<int64_t>(d), spec.local[d].offset, spec.local[d].size);
      local.copy_(full);
    });
  }

  apc::runtime::OptimizerOptions opt_options;
  opt_options.kind = f.optimizer;
  opt_options.lr = f.lr;
  opt_options.momentum = f.momentum;
  apc::runtime::Optimizer opt(opt_options, pm.parameters());
  for (Reference& r : refs) {
    for (const auto& [name, t] : r.model->namedParameters()) r.params.push_back(t);
    r.opt.emplace(opt_options, r.params);
  }
  double max_single_diff = 0, max_rounding = 0;  // over the steps: |sharded - single|, |y - f64|
  double max_abs_loss = 0;                       // over the steps: |single|

  std::optional<apc::train::NodeProfiler> node_profile;
  if (f.profile && f.profile_nodes) {
    node_profile.emplace(pm.graph(), device);
    pm.setObserver(&*node_profile);
  }

  // Real data: each rank reads its piece of every batch (apc/runtime/data.h).
  std::unique_ptr<apc::runtime::DataSource> data;
  if (!f.data.empty()) {
    apc::setActivity("opening the data file " + apc::printable(f.data));
    apc::runtime::DataOptions dopts;
    dopts.token_dtype = f.data_dtype;
    dopts.seed = f.seed;
    dopts.batch = f.batch;
    auto opened = apc::runtime::DataSource::open(pm, f.data, dopts);
    if (!opened.ok()) return fail(opened.error().message());
    data = std::move(opened).value();
    if (rank0) std::fprintf(stderr, "apc-train: data %s\n", data->describe().c_str());
  }
  const std::string data_name = f.data.empty() ? "synthetic" : f.data;

  // Resume: the shards, the optimizer's state and the step from the checkpoint; the data of a step
  // depends on the seed and the step only, so the resumed steps see a straight run's data.
  int first_step = 0;
  if (!f.resume.empty()) {
    apc::setActivity("loading the checkpoint " + apc::printable(f.resume));
    auto found = apc::runtime::findCheckpoint(f.resume);
    if (!found.ok()) return fail("--resume: " + found.error().message());
    const double t0 = now(device);
    auto state = apc::runtime::loadCheckpoint(pm, &opt, *found);
    if (!state.ok()) return fail(state.error().message());
    const std::string seed = std::to_string(f.seed);
    if (auto it = state->trainer.find("seed"); it != state->trainer.end() && it->second != seed)
      return fail(*found + ": trained with --seed " + it->second + ", this run has --seed " + seed +
                  " (the data would differ from the run it resumes)");
    if (auto it = state->trainer.find("data");
        it != state->trainer.end() && (it->second == "synthetic") != f.data.empty())
      return fail(*found + ": trained on " +
                  (it->second == "synthetic" ? std::string("synthetic data")
                                             : "--data " + apc::printable(it->second)) +
                  ", this run has " +
                  (f.data.empty() ? std::string("no --data") : "--data " + apc::printable(f.data)));
    first_step = static_cast<int>(std::min<int64_t>(state->step, f.steps + f.warmup));
    if (rank0)
      std::fprintf(
          stderr,
          "apc-train: resumed from %s at step %d (%.3f s, rank 0 read %lld bytes of tensors)%s\n",
          found->c_str(), first_step, now(device) - t0, static_cast<long long>(state->bytes_read),
          state->plan_hash == pm.planHash()
              ? ""
              : (", resharded from plan " + state->plan_hash.substr(0, 16)).c_str());
  }
  const auto& specs = pm.inputSpecs();
  if (f.profile) {
    apc::runtime::setSynchronizedCommTiming(true);
    if (device.is_cuda()) at::accelerator::resetPeakStats(device.index());
  }
  std::vector<StepSample> samples;
  PhasePeaks peaks(device);
  const int total_steps = f.steps + f.warmup;
  double data_seconds = 0;  // in data->batch(), this rank
  apc::setActivity("training");
  for (int step = first_step; step < total_steps; ++step) {
    // With --data: this rank's piece of the step's batch and the batch's targets. Else full inputs,
    // the same on every rank, drawn from a generator of this step.
    std::optional<apc::runtime::Batch> batch;
    if (data) {
      const double d0 = now(device);
      auto b = data->batch(step);
      data_seconds += now(device) - d0;
      if (!b.ok()) return fail("step " + std::to_string(step) + ": " + b.error().message());
      batch = std::move(b).value();
    }
    at::Generator synthetic = at::detail::createCPUGenerator(mixSeed(f.seed, step, 1));
    std::vector<at::Tensor> full_inputs;
    for (size_t i = 0; i < specs.size() && !data; ++i) {
      std::vector<int64_t> shape = specs[i].global_shape;
      if (f.batch > 0 && !shape.empty()) shape[0] = f.batch;
      if (at::isFloatingType(specs[i].dtype))
        full_inputs.push_back(at::randn(shape, synthetic, at::kFloat).to(device, specs[i].dtype));
      else
        full_inputs.push_back(at::randint(0, pm.inputIndexBound(i), shape, synthetic, at::kLong)
                                  .to(device, specs[i].dtype));
    }
    const uint64_t loss_seed = f.seed * 1000003 + static_cast<uint64_t>(step);

    opt.zero_grad();
    // --profile: the ranks start each step together, as torch's benchmarks time a step (a barrier
    // before the clock starts), so a rank's lag from the last step (its printing, its inputs) is
    // not counted in the next step's first blocking collective. Not counted in the comm stats.
    if (f.profile && pm.worldSize() > 1) pm.world().all().barrier();
    pm.resetCommStats();
    // What came since the last step's optimizer (the loading and the warm-up before the first
    // measured step; the trainer's full-batch synthetic inputs): no phase of training, not
    // counted.
    if (f.profile) peaks.take(false);
    std::vector<c10::IValue> local_inputs;
    if (batch) local_inputs = batch->inputs;
    for (size_t i = 0; i < specs.size() && !batch; ++i)
      local_inputs.emplace_back(pm.shardInput(i, full_inputs[i]));
    if (node_profile) node_profile->setActive(step >= f.warmup);
    // The step's random numbers (dropout masks) from (--seed, step): a resumed run draws what the
    // uninterrupted one did.
    pm.seedRandom(mixSeed(f.seed, static_cast<uint64_t>(step), 2));
    const double t0 = f.profile ? now(device) : 0;
    const int64_t peak_inputs = f.profile ? peaks.take(step >= f.warmup) : 0;
    auto leaves = pm.forwardLeaves(local_inputs);
    if (!leaves.ok()) return fail("step " + std::to_string(step) + ": " + leaves.error().message());
    const double t1 = f.profile ? now(device) : 0;
    const int64_t peak_forward = f.profile ? peaks.take(step >= f.warmup) : 0;
    const std::vector<apc::runtime::CommStats> after_forward = pm.commStatsByMeshDim();
    // The loss on this rank's rows of the first output (apc/runtime/loss.h): only a class dim
    // split across ranks is gathered, never the whole output.
    at::Generator loss_gen = at::detail::createCPUGenerator(loss_seed);
    // Every rank holds the whole synthetic batch: its dynamic sizes need no collective.
    const std::map<std::string, int64_t> symbol_sizes =
        apc::runtime::inputSymbolSizes(pm, full_inputs);
    auto sharded =
        apc::runtime::shardedLoss(pm, leaves->at(0).toTensor(), batch ? &batch->targets : nullptr,
                                  &loss_gen, batch ? nullptr : &symbol_sizes);
    if (!sharded.ok())
      return fail("step " + std::to_string(step) + ": " + sharded.error().message());
    at::Tensor loss = sharded->share;
    const double t2 = f.profile ? now(device) : 0;
    const int64_t peak_loss = f.profile ? peaks.take(step >= f.warmup) : 0;
    const std::vector<apc::runtime::CommStats> after_gather = pm.commStatsByMeshDim();
    if (node_profile) node_profile->backwardStarts();
    loss.backward();
    if (node_profile) node_profile->backwardEnds();
    const double t3 = f.profile ? now(device) : 0;
    const int64_t peak_backward = f.profile ? peaks.take(step >= f.warmup) : 0;
    // The program's collectives only: not the trainer's output gather, not clipping.
    std::vector<apc::runtime::CommStats> by_dim = pm.commStatsByMeshDim();
    apc::runtime::CommStats program_comm, forward_comm;
    for (size_t m = 0; m < by_dim.size(); ++m) {
      apc::runtime::CommStats gather = after_gather[m];
      gather -= after_forward[m];
      by_dim[m] -= gather;
      program_comm += by_dim[m];
      forward_comm += after_forward[m];
    }
    if (f.clip > 0) pm.clip_grad_norm_(f.clip);
    opt.step();
    if (f.profile && step >= f.warmup) {
      const double t4 = now(device);
      StepSample s;
      s.peak_inputs = peak_inputs;
      s.peak_forward = peak_forward;
      s.peak_loss = peak_loss;
      s.peak_backward = peak_backward;
      s.peak_optimizer = peaks.take();
      s.forward = t1 - t0;
      s.loss = t2 - t1;
      s.backward = t3 - t2;
      s.optimizer = t4 - t3;
      s.forward_comm = forward_comm.seconds;
      s.backward_comm = program_comm.seconds - forward_comm.seconds;
      s.comm_in_flight = program_comm.busy_seconds;
      s.comm = std::move(by_dim);
      samples.push_back(std::move(s));
    }
    if (f.report_comm) {
      const apc::runtime::PricedComm priced = pm.pricedComm();
      std::fprintf(stderr,
                   "rank %d step %d comm calls %lld bytes_sent %lld | priced steps %lld+%lld "
                   "n %lld wire %lld\n",
                   pm.rank(), step, static_cast<long long>(program_comm.calls),
                   static_cast<long long>(program_comm.bytes_sent),
                   static_cast<long long>(priced.forward_steps),
                   static_cast<long long>(priced.backward_steps),
                   static_cast<long long>(priced.priced_bytes),
                   static_cast<long long>(priced.wire_bytes));
    }

    // Waited for here, after the backward it ran behind.
    const double loss_value = sharded->value();
    std::string line = "step " + std::to_string(step) + " loss " + number(loss_value);
    // With --data, rank 0 reads the whole batch for the references.
    std::optional<apc::runtime::Batch> whole;
    if (data && !refs.empty()) {
      auto b = data->fullBatch(step);
      if (!b.ok()) return fail("step " + std::to_string(step) + ": " + b.error().message());
      whole = std::move(b).value();
      for (const c10::IValue& x : whole->inputs) full_inputs.push_back(x.toTensor());
    }
    for (size_t k = 0; k < refs.size(); ++k) {
      auto sloss =
          referenceStep(refs[k], full_inputs, loss_seed, f.clip, whole ? &whole->targets : nullptr);
      if (!sloss.ok() && k > 0) {
        // The float64 twin only measures rounding, and some kernels have no float64 (CPU
        // _grouped_mm): the comparison goes on against the float32 model alone.
        std::fprintf(stderr,
                     "apc-train: note: no float64 reference from step %d on (%s); comparing "
                     "with the float32 single-device model only\n",
                     step, sloss.error().message().c_str());
        refs.erase(refs.begin() + 1, refs.end());
        break;
      }
      if (!sloss.ok()) return fail("step " + std::to_string(step) + ": " + sloss.error().message());
      line += (k == 0 ? " single " : " f64 ") + number(*sloss);
      if (k == 0) {
        refs[0].last_loss = *sloss;
        max_single_diff = std::max(max_single_diff, std::abs(loss_value - *sloss));
        max_abs_loss = std::max(max_abs_loss, std::abs(*sloss));
      } else {
        max_rounding = std::max(max_rounding, std::abs(refs[0].last_loss - *sloss));
      }
    }
    if (rank0 && !f.json) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    const int done = step + 1;
    if (!f.save.empty() &&
        (done == total_steps || (f.save_every > 0 && done % f.save_every == 0))) {
      apc::setActivity("saving a checkpoint under " + apc::printable(f.save));
      const double t0 = now(device);
      apc::runtime::TrainingState state;
      state.step = done;
      state.trainer = {{"seed", std::to_string(f.seed)}, {"data", data_name}};
      if (data) state.trainer["data_dtype"] = f.data_dtype;
      apc::runtime::CheckpointOptions copts;
      copts.keep_last = f.keep;
      auto saved = apc::runtime::saveCheckpoint(pm, &opt, state, f.save, copts);
      if (!saved.ok()) return fail(saved.error().message());
      if (rank0)
        std::fprintf(stderr, "apc-train: saved %s (%s, %.3f s)\n", saved->c_str(),
                     apc::humanBytes(static_cast<double>(directoryBytes(*saved))).c_str(),
                     now(device) - t0);
      apc::setActivity("training");
    }
  }
  if (refs.size() == 2) {
    // A mixed_precision plan: its parameters computed in a lower precision than stored.
    std::optional<at::ScalarType> mixed;
    for (const apc::runtime::PlacedTensor& p : pm.parameterSpecs())
      if (p.dtype != p.storage_dtype && (p.dtype == at::kBFloat16 || p.dtype == at::kHalf))
        mixed = p.dtype;
    reportRounding(max_single_diff, max_rounding, mixed, max_abs_loss, !random_ops.empty());
  }
  if (data && rank0 && total_steps > first_step)
    std::fprintf(stderr,
                 "apc-train: data: rank 0 read %lld bytes in %d batches, %.3f ms per batch\n",
                 static_cast<long long>(data->bytesRead()), total_steps - first_step,
                 data_seconds * 1e3 / (total_steps - first_step));
  if (node_profile && rank0) reportNodes(*node_profile, pm, f);
  if (f.profile) reportProfile(pm, f, samples, device, peaks.overall());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  apc::installOutOfMemoryHandler("apc-train");
  apc::setActivity("reading the command line");
  CLI::App app{
      "apc-train: trains an apc artifact on synthetic data or a --data file (one process per rank)",
      "apc-train"};
  Flags f;
  using apc::tool::integerIn;
  using apc::tool::nonEmptyPath;
  using apc::tool::numberIn;
  app.add_option("dir", f.dir,
                 "Artifact directory (manifest.json, rank_<r>.apcp); default: $APC_ARTIFACT, "
                 "which `apc run` sets")
      ->check(nonEmptyPath());
  app.add_option("--steps", f.steps, "Training steps")->check(integerIn(0, 1 << 30));
  app.add_option("--lr", f.lr, "Learning rate")->check(numberIn(0.0, 1e6));
  app.add_option("--optimizer", f.optimizer, "sgd or adamw");
  app.add_option("--momentum", f.momentum, "SGD's momentum (torch.optim.SGD's; default 0)")
      ->check(numberIn(0.0, 1.0));
  app.add_option("--save", f.save,
                 "Save checkpoints under this directory (DIR/step_<n>: one safetensors file per "
                 "rank and manifest.json), after the last step and every --save-every steps");
  app.add_option("--save-every", f.save_every, "Save a checkpoint every N steps (with --save)")
      ->check(integerIn(0, 1 << 30));
  app.add_option("--keep", f.keep, "Keep only the newest N checkpoints under --save (default: all)")
      ->check(integerIn(0, 1 << 30));
  app.add_option("--resume", f.resume,
                 "Resume from a checkpoint (its directory, or a --save directory: its newest "
                 "complete checkpoint); --steps stays the total, the run continues at the "
                 "checkpoint's step");
  app.add_option("--data", f.data,
                 "Train on this file, each rank reading its piece of every batch: token ids "
                 "(a flat binary file, nanoGPT's train.bin; see --data-dtype) for an input [B, T] "
                 "with next-token targets, or a .safetensors file with tensors \"inputs\" [N, ...] "
                 "and \"targets\" (or \"labels\") [N, ...]; batches drawn from (--seed, step)")
      ->check(nonEmptyPath());
  app.add_option("--data-dtype", f.data_dtype,
                 "Type of one token id in a --data token file (default uint16, as nanoGPT writes)")
      ->check(CLI::IsMember({"uint16", "uint32", "int32", "int64"}));
  app.add_option("--seed", f.seed,
                 "Seed of the synthetic data or of the --data batches (and of the weights "
                 "without --model)")
      ->check(integerIn(0, std::numeric_limits<int64_t>::max()));
  app.add_option("--batch", f.batch, "Batch size (dim 0 of every input); default: the artifact's")
      ->check(integerIn(1, int64_t{1} << 31));
  app.add_option("--model", f.model,
                 "Model (TorchScript .pt or exported .pt2) or full state dict (.safetensors) "
                 "whose weights initialize the shards")
      ->check(nonEmptyPath());
  app.add_flag("--random-init", f.random_init,
               "Draw the weights (and buffers) from normal(0, 0.02) even when the model the "
               "artifact was lowered from is at hand (by default its weights are loaded)");
  app.add_option("--compare-single", f.compare_single,
                 "Also train this unsharded model (.pt or .pt2) on rank 0 and print its loss, "
                 "and its float64 twin's (the float32 run's own rounding)")
      ->check(nonEmptyPath());
  app.add_flag("--no-f64-reference", f.no_f64_reference,
               "With --compare-single: skip the float64 twin of the unsharded model");
  app.add_option("--clip", f.clip, "Clip the global gradient norm to this value (0: no clipping)")
      ->check(numberIn(0.0, 1e30));
  app.add_flag("--report-comm", f.report_comm,
               "Print per rank and step the bytes its collectives sent next to the priced bytes");
  app.add_option("--grad-bucket-mib", f.grad_bucket_mib,
                 "Reduce replicated parameters' gradients together in buckets of at most this "
                 "many MiB at the end of backward, as DDP does (default 25); 0 reduces each "
                 "gradient on its own, as the plan priced it")
      ->check(numberIn(0.0, 1024.0 * 1024.0));
  app.add_option("--first-grad-bucket-mib", f.first_grad_bucket_mib,
                 "With overlap, the first bucket backward fills holds at most this many MiB, as "
                 "DDP's (default 1): its all-reduce starts early, behind the rest of backward; 0 "
                 "makes it as large as the others")
      ->check(numberIn(0.0, 1024.0 * 1024.0));
  app.add_flag("!--no-overlap", f.overlap,
               "Run every collective blocking: the gradient buckets at the end of backward, each "
               "parameter gather where it is used (default: buckets issued asynchronously as soon "
               "as their gradients are ready, parameter gathers --prefetch ahead)");
  app.add_option("--prefetch", f.prefetch,
                 "Parameter gathers issued this many ahead of their use in forward (default 1; 0: "
                 "none)")
      ->check(integerIn(0, 64));
  app.add_flag("!--no-host-cache", f.host_cache,
               "Allocate CPU tensors with malloc directly, not through apc's caching allocator "
               "(every step then pays fresh pages for its activations)");
  app.add_option("--threads", f.threads, "Intra-op threads per rank")->check(integerIn(1, 1024));
  app.add_option("--onednn", f.onednn,
                 "on, off or auto (default): oneDNN kernels off under --compare-single only")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_option("--timeout", f.timeout_s,
                 "Seconds the set-up waits for the other ranks and any collective for its peers "
                 "(default: APC_TIMEOUT_S, else 300)")
      ->check(numberIn(0.001, 604800.0));
  app.add_flag("--profile", f.profile,
               "After --warmup steps, measure --steps steps and print the median step time (split "
               "into forward, backward, optimizer and time blocked in collectives), the "
               "collectives per mesh dim and kind, and the peak memory, beside the plan's "
               "prediction");
  app.add_flag("--profile-nodes", f.profile_nodes,
               "With --profile: also time every node of the program, forward and backward, and "
               "print per op its nodes' time beside the plan's price for them (on CUDA each node "
               "synchronizes the device: the step times of such a run are not overlapped ones)");
  app.add_flag("--json", f.json,
               "With --profile: print only one JSON object (rank 0's stdout), no step lines");
  app.add_option("--warmup", f.warmup,
                 "Steps run before the measured ones (default 2 with --profile)")
      ->check(integerIn(0, 1 << 30));
  app.add_option("--device", f.device,
                 "cpu (Gloo) or cuda (NCCL, device LOCAL_RANK; needs a CUDA LibTorch build)");
  // Every flag that takes a number checks its range (tools/common/cli_checks.h).
  if (auto unchecked = apc::tool::uncheckedNumericFlags(app, "apc-train"); !unchecked.empty()) {
    std::cerr << "apc-train: internal error: " << unchecked.front()
              << " takes a number but has no range check\n";
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see apc-train --help)");
  }
  if (f.dir.empty()) {
    const char* env = std::getenv("APC_ARTIFACT");
    if (!env || !*env)
      return fail(
          "no artifact directory: give DIR, or run under `apc run DIR` (it sets "
          "APC_ARTIFACT)");
    f.dir = env;
  }
  try {
    return run(f);
  } catch (const std::exception& e) {
    if (apc::isOutOfMemory(e)) return apc::reportOutOfMemory("apc-train");
    std::fputs(("apc-train: error: " + apc::runtime::firstLine(e.what()) + "\n").c_str(), stderr);
    return 1;
  }
}
