//===- apc/runtime/optimizer.h - Elementwise optimizers over local shards ---===//
//
// The optimizers apc-train offers, for any C++ trainer: SGD (with torch.optim.SGD's momentum,
// dampening 0) and AdamW (decoupled weight decay, PyTorch's defaults). Both are elementwise, so a
// step over a rank's local shards equals, element for element, a step over the full tensors:
// sharded and single-device training agree, and the optimizer needs no communication.
//
//   apc::runtime::Optimizer opt({"adamw", 1e-3}, pm->parameters());
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Its state (the step count and, per parameter, SGD's momentum_buffer or AdamW's exp_avg and
// exp_avg_sq, in the parameter's dtype) is what a checkpoint saves beside the shards
// (apc/runtime/checkpoint.h): state() and set_state() hand it out and back.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace apc::runtime {

struct OptimizerOptions {
  std::string kind = "sgd";  // "sgd" or "adamw"
  double lr = 0.01;
  double momentum = 0;  // SGD: torch.optim.SGD's momentum (0: none, no state)
  double beta1 = 0.9;   // AdamW's betas, eps and decoupled weight decay (PyTorch's defaults)
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class Optimizer {
 public:
  /// An optimizer over `params` (the local shards, as ParallelModule::parameters() gives them).
  /// The kind is checked by the caller (see isKnownOptimizer).
  Optimizer(OptimizerOptions options, std::vector<at::Tensor> params);

  /// Drops every gradient.
  void zero_grad();
  /// One step over every parameter with a gradient.
  void step();

  const OptimizerOptions& options() const { return options_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  /// Steps taken (AdamW's bias correction counts them).
  int64_t steps() const { return steps_; }
  /// Per parameter, its state tensors by name ("momentum_buffer"; "exp_avg", "exp_avg_sq"); empty
  /// before the parameter's first step.
  const std::vector<std::map<std::string, at::Tensor>>& state() const { return state_; }
  /// Restores a saved state: the step count and, per parameter, its tensors (copied in; the names
  /// stateNames() lists for this kind, shaped and typed as the parameter).
  void set_state(int64_t steps, std::vector<std::map<std::string, at::Tensor>> state);
  /// The state tensors a parameter of this kind holds after its first step.
  std::vector<std::string> stateNames() const;

 private:
  OptimizerOptions options_;
  std::vector<at::Tensor> params_;
  std::vector<std::map<std::string, at::Tensor>> state_;
  int64_t steps_ = 0;
};

/// True for "sgd" and "adamw".
bool isKnownOptimizer(const std::string& kind);

}  // namespace apc::runtime
