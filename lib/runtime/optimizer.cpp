//===- lib/runtime/optimizer.cpp - SGD with momentum and AdamW over shards --===//
//
// The arithmetic is apc-train's from before this file, so that losses did not change: SGD
// subtracts g * lr; AdamW decays, updates its moments, and divides by the bias-corrected root.
// AdamW's moments of every parameter are made at its first step (zeros), as before; SGD's momentum
// buffer is the first gradient (torch.optim.SGD's rule).
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/optimizer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <utility>

namespace apc::runtime {

bool isKnownOptimizer(const std::string& kind) {
  return kind == "sgd" || kind == "adamw";
}

Optimizer::Optimizer(OptimizerOptions options, std::vector<at::Tensor> params)
    : options_(std::move(options)), params_(std::move(params)), state_(params_.size()) {}

void Optimizer::zero_grad() {
  for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
}

std::vector<std::string> Optimizer::stateNames() const {
  if (options_.kind == "adamw") return {"exp_avg", "exp_avg_sq"};
  if (options_.momentum != 0) return {"momentum_buffer"};
  return {};
}

void Optimizer::set_state(int64_t steps, std::vector<std::map<std::string, at::Tensor>> state) {
  steps_ = steps;
  state_ = std::move(state);
  state_.resize(params_.size());
}

void Optimizer::step() {
  at::NoGradGuard no_grad;
  ++steps_;
  const double lr = options_.lr;
  if (options_.kind == "adamw")
    for (size_t i = 0; i < params_.size(); ++i)
      if (state_[i].empty()) {
        state_[i]["exp_avg"] = at::zeros_like(params_[i]);
        state_[i]["exp_avg_sq"] = at::zeros_like(params_[i]);
      }
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (options_.kind == "sgd") {
      if (options_.momentum != 0) {
        auto it = state_[i].find("momentum_buffer");
        if (it == state_[i].end()) {
          it = state_[i].emplace("momentum_buffer", g.clone()).first;
        } else {
          it->second.mul_(options_.momentum).add_(g);
        }
        g = it->second;
      }
      p.sub_(g * lr);
      continue;
    }
    const double b1 = options_.beta1, b2 = options_.beta2;
    at::Tensor& m = state_[i]["exp_avg"];
    at::Tensor& v = state_[i]["exp_avg_sq"];
    p.mul_(1 - lr * options_.weight_decay);
    m.mul_(b1).add_(g, 1 - b1);
    v.mul_(b2).addcmul_(g, g, 1 - b2);
    const double c1 = 1 - std::pow(b1, static_cast<double>(steps_));
    const double c2 = 1 - std::pow(b2, static_cast<double>(steps_));
    at::Tensor denom = (v / c2).sqrt_().add_(options_.eps);
    p.addcdiv_(m, denom, -lr / c1);
  }
}

}  // namespace apc::runtime
