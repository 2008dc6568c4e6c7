//===- apc/runtime/output_leaves.h - The tensors of a forward's output -----===//
//
// A forward returns a tensor, or tuples, lists and dicts of them (a TorchScript module's IValue,
// a ParallelModule's output tree). outputLeaves walks that structure once for every caller: the
// trainer's loss, the single-device reference, the profilers and the tests.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

namespace apc::runtime {

/// The tensors inside `v` in order: `v` itself when it is a tensor, else the leaves of each
/// element of a tuple, a list or a tensor list, and of each value of a dict (in the dict's order),
/// depth first. Values of other types (None, ints, strings) hold no leaves.
std::vector<at::Tensor> outputLeaves(const c10::IValue& v);

}  // namespace apc::runtime
