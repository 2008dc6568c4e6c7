//===- lib/runtime/output_leaves.cpp - The tensors of a forward's output ---===//
//
// outputLeaves (apc/runtime/output_leaves.h).
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/output_leaves.h"

namespace apc::runtime {

namespace {

void collectLeaves(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) out.push_back(t);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) collectLeaves(e, out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) collectLeaves(e, out);
  } else if (v.isGenericDict()) {
    for (const auto& kv : v.toGenericDict()) collectLeaves(kv.value(), out);
  }
}

}  // namespace

std::vector<at::Tensor> outputLeaves(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  collectLeaves(v, out);
  return out;
}

}  // namespace apc::runtime
