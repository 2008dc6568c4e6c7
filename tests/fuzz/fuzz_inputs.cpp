//===- tests/fuzz/fuzz_inputs.cpp - libFuzzer target: model loaders' text ---===//
//
// The outer layers of the model loaders that read user or archive text without LibTorch: the
// --input shape spec ("x:f32[B=8,16]"), the sympy expressions of an exported program's symbolic
// dims (lib/frontend/sym_expr.h), evaluated with every free symbol bound, and a TorchScript
// archive's extra/apc_inputs.json (parseRecordedInputs; fuzz_pt reaches it through whole
// archives, at LibTorch's load speed).
//
//===----------------------------------------------------------------------===//
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "../../lib/frontend/sym_expr.h"
#include "apc/frontend/input_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = apc::frontend::parseInputSpec(text);
  if (spec.ok()) (void)apc::frontend::toString(*spec);
  auto e = apc::frontend::parseSymExpr(text);
  if (e.ok()) {
    std::map<std::string, int64_t> values;
    int64_t v = 1;
    for (const std::string& s : apc::frontend::freeSymbols(*e)) values[s] = (v += 3);
    (void)apc::frontend::evaluateSymExpr(*e, values);
  }
  // The argument names of the seed archives (tests/fuzz/seeds/pt) and a repeated one.
  static const std::vector<std::string> names = {"x", "tokens", "y", "x"};
  auto recorded = apc::frontend::parseRecordedInputs(text, names, "m.pt");
  if (recorded.ok())
    for (const auto& r : *recorded)
      if (r) (void)apc::frontend::toString(*r);
  return 0;
}
