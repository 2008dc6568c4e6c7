//===- tests/fuzz/fuzz_spec.cpp - libFuzzer target: the spec parser ---------===//
//
// Any bytes as a spec file: parseSpecText must return a value or an error, never crash, hang or
// throw. A spec it accepts must survive toJson and parse again to the same spec.
//
//===----------------------------------------------------------------------===//
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "apc/spec/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = apc::spec::parseSpecText(text);
  if (!spec.ok()) return 0;
  (void)apc::spec::toString(spec->outputs);
  auto again = apc::spec::parseSpec(apc::spec::toJson(*spec));
  if (!again.ok() || !(*again == *spec)) std::abort();  // a round trip must hold
  return 0;
}
