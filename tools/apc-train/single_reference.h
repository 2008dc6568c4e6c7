//===- tools/apc-train/single_reference.h - The unsharded model of --compare-single -===//
//
// What `apc-train --compare-single MODEL` trains beside the shards, from the same weights and
// data, on rank 0:
// - a TorchScript .pt runs as LibTorch's own module (torch::jit::Module), the executor torch
//   users trust;
// - an exported .pt2, which LibTorch cannot run, runs as its imported graph through apc's
//   interpreter on one device (the executor the shards use, without a plan: every op on the
//   whole tensors), imported at the sizes of the run (its symbolic dims set to the run's batch)
//   and started from the weights the .pt2 holds;
// - either, in float64 (`widen`): the imported graph with every floating dtype widened, the
//   yardstick of the float32 run's own rounding that --compare-single prints beside the sharded
//   difference, so that a user can tell rounding from a bug.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "apc/frontend/input_spec.h"
#include "apc/support/error.h"

namespace apc::train {

class SingleReference {
 public:
  virtual ~SingleReference() = default;
  /// Parameters (one entry per distinct tensor) and buffers by name; the optimizer updates the
  /// parameters in place.
  virtual std::vector<std::pair<std::string, at::Tensor>> namedParameters() = 0;
  virtual std::vector<std::pair<std::string, at::Tensor>> namedBuffers() = 0;
  /// The output leaves of a forward on full inputs (cast to the reference's floating dtype by
  /// the caller).
  virtual Expected<std::vector<at::Tensor>> forward(const std::vector<c10::IValue>& inputs) = 0;
  /// The floating dtype it computes in.
  virtual at::ScalarType floatingDtype() const = 0;
};

struct ReferenceOptions {
  c10::Device device = c10::kCPU;
  /// The inputs of the run, full sizes (a .pt2's symbolic dims are imported at these sizes).
  std::vector<frontend::InputSpec> inputs;
  /// Run the imported graph in float64 (any model format).
  bool widen = false;
};

/// Loads `path` (.pt or .pt2) as above. Errors are one line naming the file.
Expected<std::unique_ptr<SingleReference>> loadSingleReference(const std::string& path,
                                                               const ReferenceOptions& options);

}  // namespace apc::train
