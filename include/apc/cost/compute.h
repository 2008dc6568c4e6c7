//===- apc/cost/compute.h - Compute roofline and backward multiples -------===//
//
// The compute cost of one node under one strategy: a roofline on the local shard,
//   time = max(flops / (peak(dtype) * compute_efficiency), bytes / (hbm * memory_efficiency)),
// never below the device's per-kernel floor, in microseconds. The strategy rules count the flops
// and the bytes read and written on the LOCAL shard (localNumel gives the largest local piece, the
// rank that finishes last); this file only prices them. The backward of a node is priced as a
// multiple of its forward time, per op family (backwardMultiplier documents each value).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>

#include "apc/cost/device.h"
#include "apc/ir/types.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"

namespace apc::cost {

/// Op families as far as the cost model distinguishes them.
enum class OpFamily : uint8_t {
  kContraction,    // matmul, mm, bmm, linear, addmm, baddbmm, einsum
  kConvolution,    // conv1d/2d/3d, convolution, their transposes (priced as contractions unless
                   // a measured convolution curve exists)
  kAttention,      // scaled_dot_product_attention (fused)
  kPointwise,      // unary / binary elementwise, activations, dropout, casts
  kReduction,      // sum, mean, amax over dims
  kNormalization,  // layer_norm, rms_norm, batch/group norm
  kSoftmax,        // softmax, log_softmax
  kView,           // view, reshape, transpose, permute, expand, squeeze, slicing views
  kEmbedding,      // embedding lookup
  kIndex,          // gather, index_select, scatter, cat, copying slices
  kLoss,           // cross_entropy, nll_loss
  kFactory,        // zeros, ones, arange, full: no inputs that take gradients
  kOther,          // anything else
};

/// "contraction", "pointwise", ...
const char* opFamilyName(OpFamily family);

/// Backward time as a multiple of forward time:
///   contraction 2.0    grad of each operand is one matmul of the forward's size
///   attention   2.5    fused attention backward: 5 matmuls (one recomputed) vs 2, as
///   FlashAttention pointwise   1.0    reads grad and saved inputs, writes grad: about the
///   forward's traffic reduction   1.0    broadcast of the grad back to the input's size
///   normalization 2.0  grad of input plus grad of weight/bias, two passes over the input
///   softmax     1.0    reads output and grad, writes grad
///   view        0.0    no kernel
///   embedding   1.0    scatter-add of the output grad into the weight grad
///   index       1.0    scatter/gather of the grad
///   loss        1.0    softmax-like pass over the logits
///   factory     0.0    nothing to differentiate
///   other       1.0
double backwardMultiplier(OpFamily family);
/// Kernels the backward of an op of `family` launches, each dispatched on its own: 2 for a
/// contraction (the gradients of both operands), 0 for a view or factory, 1 otherwise (a fused
/// backward kernel: convolution_backward, softmax's, a norm's). Ops whose autograd formula runs
/// more say so in their registry entry (strategy::OpInfo::backward_kernels).
int backwardKernels(OpFamily family);

/// Roofline time in microseconds of a kernel doing `flops` operations and moving `bytes` bytes in
/// `dtype` on `device`. Zero work (flops <= 0 and bytes <= 0) costs 0 (no kernel, as for views);
/// otherwise the result is at least device.kernel_floor_us.
double computeCostUs(const DeviceSpec& device, double flops, double bytes, ir::DType dtype);

/// backwardMultiplier(family) * forward_us.
double backwardComputeUs(OpFamily family, double forward_us);

/// Number of elements of the largest local piece of `global` under `placements` on `mesh`: the
/// product over dims of ceil(size / shardFactor(dim)) (see apc/layout/layout.h for the nested
/// torch.chunk semantics). Symbolic dims use their hints. Preconditions (unchecked):
/// placements.size() == mesh.ndim() and shard dims < global.rank().
double localNumel(const ir::TensorMeta& global, const mesh::PlacementTuple& placements,
                  const mesh::DeviceMesh& mesh);

}  // namespace apc::cost
