//===- apc/ir/printer.h - Text and JSON forms of a graph -------------------===//
//
// The text form lists one node per line:
//   #12 aten::linear  layers.0.attention.wq  %q = (%x, %layers.0.attention.wq.weight) ->
//   f32[8,128,64]
// The JSON form (used by `apc inspect --json`) carries the same facts plus totals.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "apc/ir/graph.h"

namespace apc::ir {

/// Totals over a graph.
struct GraphStats {
  int64_t num_nodes = 0;
  int64_t num_inputs = 0;
  int64_t num_parameters = 0;  // parameter tensors (tied ones once)
  int64_t total_params = 0;    // elements over parameter tensors
  int64_t param_bytes = 0;     // bytes over parameter tensors
  int64_t num_buffers = 0;
  int64_t buffer_bytes = 0;
  int64_t num_shape_nodes = 0;                 // op nodes whose outputs are all non-tensor
  std::map<std::string, int64_t> nodes_by_op;  // op nodes by qualified op name (sorted)
};

GraphStats computeStats(const Graph& g);

/// "%name" of a value, or its constant text for graph-level constants.
std::string valueRef(const Graph& g, ValueId v);
/// Text form of one value's type: "f32[8,128]", "int", "int[] = [8, 128]".
std::string valueTypeString(const Graph& g, ValueId v);

/// Prints every node, then the outputs and the totals.
void printGraph(const Graph& g, std::ostream& os);
void printStats(const GraphStats& s, std::ostream& os);

/// JSON form: {"name", "nodes": [...], "outputs": tree, totals...}.
nlohmann::json graphToJson(const Graph& g);

}  // namespace apc::ir
