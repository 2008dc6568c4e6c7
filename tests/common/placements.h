//===- tests/common/placements.h - Placement tuples from text, for tests ---===//
//
// One helper for the many tests that write placements as text ("S(0),R"): files of one test
// binary are compiled together in a unity build, so a helper each would collide.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <gtest/gtest.h>

#include <string_view>

#include "apc/mesh/placement.h"

namespace apc::testing {

/// The tuple `text` names ("S(0),R", "[S(1), P]"); text that does not parse fails the test and
/// gives an empty tuple.
inline mesh::PlacementTuple tuple(std::string_view text) {
  auto t = mesh::parsePlacementTuple(text);
  EXPECT_TRUE(t.ok()) << text << ": " << (t.ok() ? "" : t.error().message());
  return t.ok() ? *t : mesh::PlacementTuple{};
}

}  // namespace apc::testing
