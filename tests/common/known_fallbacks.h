//===- tests/common/known_fallbacks.h - Replicate-only ops allowed in tests -===//
//
// The tests that forbid Replicate-only fallbacks on the samples (strategy_validator, frontend's
// cli_test) allow exactly these, and only on the Hugging Face samples (hf_*): transformers builds
// its causal mask in the graph from [batch, seq] integer and bool tensors (cumsum, diff, and,
// new_ones) and its RoPE from a tuple; its index.Tensor with broadcasting indices has a rule
// (issue 31) and must not fall back. They are tiny and cheap replicated; rules for them
// belong to the real-models issue (11). Any other fallback, or one in another sample, fails.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <set>
#include <string>

namespace apc::testing {

/// True when `op` falling back to Replicate in sample `sample` is the known, allowed case.
inline bool isKnownFallback(const std::string& sample, const std::string& op) {
  static const std::set<std::string> kHfMaskOps = {
      "aten::__and__.Tensor", "aten::cumsum", "aten::diff", "aten::new_ones", "prim::TupleUnpack"};
  return sample.rfind("hf_", 0) == 0 && kHfMaskOps.count(op) > 0;
}

}  // namespace apc::testing
