//===- apc/strategy/sync_norm.h - Batch-sharded training-mode BatchNorm ---===//
//
// A training-mode batch_norm normalizes with the statistics of the whole batch. When a strategy
// shards its input along a dim other than the channel dim 1 (the batch, or a spatial dim) on some
// mesh dims, every rank holds part of each channel's population: the statistics are reduced
// across those mesh dims, as torch.nn.SyncBatchNorm does, so that the sharded layer equals the
// single-device one:
//   forward   sum(x) all-reduced -> mean;  sum((x - mean)^2) all-reduced -> biased var;
//             y = (x - mean) / sqrt(var + eps) * weight + bias; the running stats are updated from
//             the global mean and the unbiased global var, identically on every rank (in place
//             for batch_norm; returned as outputs, with the saved mean and rstd, by the core-ATen
//             _native_batch_norm_legit_functional);
//   backward  the transposes of the two all-reduces (all-reduces of the statistics' gradients),
//             which autograd derives; weight and bias gradients are Partial like any replicated
//             parameter of a sharded op.
// This header is the one definition of when that happens and what it costs; the batch_norm
// entries of the registry declare it as their OpInfo::collective (lib/strategy/normalization.cpp),
// through which the enumerator prices it into the node's cost, and their OpInfo::collective_local
// (the rank's computation as local ops around the two all-reduces, apc/ir/op_collective.h), which
// lowering records with the mesh dims (proto::OpCollective) and the runtime runs without knowing
// the op.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstddef>
#include <vector>

#include "apc/cost/cost_model.h"
#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"

namespace apc::strategy {

/// True for aten::batch_norm and its core-ATen form aten::_native_batch_norm_legit_functional
/// (the same first eight arguments) whose `training` argument is the constant true.
bool isTrainingBatchNorm(const ir::Graph& g, const ir::Node& n);

/// The mesh dims over which a training-mode batch_norm whose input is placed `input` reduces its
/// statistics: those that shard a tensor dim other than the channel dim 1.
std::vector<size_t> syncNormMeshDims(const mesh::PlacementTuple& input);

/// The time of those reductions for `channels` statistics of `elem_bytes` each: two all-reduces
/// forward and, with `backward`, two more, on each mesh dim of `dims`.
double syncNormUs(const cost::CostModel& model, const mesh::DeviceMesh& mesh,
                  const std::vector<size_t>& dims, int64_t channels, int64_t elem_bytes,
                  bool backward);

}  // namespace apc::strategy
