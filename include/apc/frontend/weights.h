//===- apc/frontend/weights.h - A model file's parameters and buffers ------===//
//
// The tensors behind the Parameter and Buffer nodes of an imported graph, by the same names, so
// that an artifact planned from a model file trains from that file's weights. Includes LibTorch:
// only the runtime, the tools and tests use it; the planner never does.
//
// - TorchScript (.pt): named_parameters() (tied parameters once, under their first name, as
//   importTorchScript names them), then named_buffers(), then the tensor literals of the inlined
//   forward under the importer's names ("__constant.<name>").
// - Exported program (.pt2): the signature's parameters, buffers and lifted tensor constants, in
//   that order, from the archive's raw weight records (data/weights, data/constants) with the
//   recorded dtype, sizes, strides and storage offset. Tensors that share a record share storage
//   (tied weights); zero-stride stub weights stay stubs (a few bytes of storage), never
//   materialized; a record written empty (a fake tensor at save time) becomes a zero-stride zero
//   stub. Parameters have requires_grad as recorded. Pickled payloads (tensor subclasses) are a
//   kUnsupported error.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "apc/support/error.h"

namespace apc::frontend {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// Parameters, buffers and tensor constants of the model at `path` (either kind; see above).
Expected<NamedTensors> loadModelState(const std::string& path);

}  // namespace apc::frontend
