//===- apc/strategy/node_time.h - Keys of measured op nodes -----------------===//
//
// `apc calibrate --model M` times a model's op nodes as they run on a rank: each node with the
// local input shapes its strategies give it, forward and backward, through the runtime's
// interpreter and autograd. The times go into the cluster profile under a key that names what
// the node computes (its op, its inputs' local dtypes, shapes and whether they take a gradient,
// and its constant arguments) and nothing else: the same layer at the same shapes in another
// model, or repeated in this one, has the same key. Enumeration prices a strategy whose key the
// device has (cost::DeviceSpec::node_us) at the measured times instead of the model's curves.
//
// No LibTorch: the tool that times the samples runs them.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/strategy/strategy.h"

namespace apc::strategy {

/// The key of op node `n` of `g` run on local inputs of `local_inputs` sizes (per input, per
/// element: one for a tensor): "aten::conv2d(f32[8,72,16,16]g, f32[72,1,3,3]g, None, [2, 2],
/// [1, 1], [1, 1], 72)", a tensor as its dtype and local sizes with "g" where it takes a gradient,
/// a constant as ir::toString prints it; the overload after a dot ("aten::add.Tensor(...)").
/// nullopt where an input is neither a tensor nor a constant (a size computed in the graph), a
/// tensor list or a tensor literal: such a node is not measured.
std::optional<std::string> nodeTimeKey(const ir::Graph& g, const ir::Node& n,
                                       const std::vector<std::vector<std::vector<int64_t>>>& local);

/// One node to time: its local input sizes and its key.
struct NodeSample {
  ir::NodeId node;
  std::vector<std::vector<std::vector<int64_t>>> local_inputs;
  std::string key;
};

/// The distinct keys the strategies of `strategies` (enumerate's, of `g` on `mesh`) give the op
/// nodes that run a kernel (views excepted), one sample per key (its first node), sorted by key.
std::vector<NodeSample> nodeSamples(const ir::Graph& g, const mesh::DeviceMesh& mesh,
                                    const std::vector<NodeStrategies>& strategies,
                                    const Registry& registry = defaultRegistry());

}  // namespace apc::strategy
