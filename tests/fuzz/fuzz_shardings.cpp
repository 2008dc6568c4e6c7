//===- tests/fuzz/fuzz_shardings.cpp - libFuzzer target: sharding files ----===//
//
// Any bytes as an --in-shardings or --out-shardings file, for a mesh of 1 to 4 dims (the first
// byte picks it): the readers return a value or an error, never crash.
//
//===----------------------------------------------------------------------===//
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "apc/mesh/placement.h"
#include "apc/spec/spec.h"
#include "apc/support/json_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  size_t ndim = 1 + data[0] % 4;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  (void)apc::mesh::parsePlacementTuple(text);
  auto j = apc::parseJsonText(text);
  if (!j.ok()) return 0;
  auto in = apc::spec::parseInShardings(*j, ndim);
  if (in.ok()) (void)apc::spec::toJson(*in);
  auto out = apc::spec::parseOutShardings(*j, ndim);
  if (out.ok()) {
    (void)apc::spec::toString(*out);
    (void)apc::spec::toJson(*out);
  }
  return 0;
}
