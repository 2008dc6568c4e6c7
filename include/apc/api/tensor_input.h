//===- apc/api/tensor_input.h - Input specs from sample tensors ------------===//
//
// For C++ trainers that hold sample tensors (Python's `input_fn` / `sample_inputs`): the shape and
// dtype of an at::Tensor as a frontend::InputSpec for AutoParallel and auto_parallel. Only the
// metadata is read; the tensor may live on the meta device. Kept apart from auto_parallel.h so that
// only the files that use it include LibTorch's headers.
//
//   at::Tensor x = at::empty({512, 128, 1024}, at::device(at::kMeta));
//   apc::AutoParallel ap("model.pt", {apc::sampleInput(x)}, mesh);   // first forward input
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "apc/frontend/input_spec.h"
#include "apc/ir/torch_dtype.h"
#include "apc/ir/types.h"

namespace apc {

/// The spec of a sample input: its sizes (static) and dtype. Without a name it stands for the
/// forward argument at its position in the input list.
inline frontend::InputSpec sampleInput(const at::Tensor& t, std::string name = {}) {
  frontend::InputSpec s;
  s.name = std::move(name);
  s.dtype = dtypeOf(t.scalar_type());
  s.shape = ir::makeShape(std::vector<int64_t>(t.sizes().begin(), t.sizes().end()));
  return s;
}

}  // namespace apc
