//===- apc/strategy/rules.h - Registration of the rule families -----------===//
//
// One function per rule family, each registering the single-mesh-dim rules of its ops into a
// Registry. They are called explicitly (no static initializers, which the linker may drop) by
// registerAllRules, which builds defaultRegistry(); a tool or a test can build its own registry
// from a subset or override single ops with Registry::add.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "apc/strategy/strategy.h"

namespace apc::strategy {

/// Elementwise ops with broadcasting: unary, binary, comparisons, activations, casts, dropout,
/// masked_fill, where (lib/strategy/pointwise.cpp).
void registerPointwiseRules(Registry& r);
/// Contractions from einsum-style dim roles: linear, matmul, mm, bmm, addmm, baddbmm, mv, dot,
/// einsum, scaled_dot_product_attention (lib/strategy/matrix.cpp).
void registerMatrixRules(Registry& r);
/// sum, mean, amax, amin, max/min, var/std, logsumexp (lib/strategy/reduction.cpp).
void registerReductionRules(Registry& r);
/// view, reshape, flatten, unflatten, squeeze, unsqueeze, transpose, t, permute, expand
/// (lib/strategy/view.cpp).
void registerViewRules(Registry& r);
/// layer_norm, native_layer_norm, rms_norm, group_norm, batch_norm and its core-ATen forms
/// _native_batch_norm_legit_functional / _no_training (lib/strategy/normalization.cpp).
void registerNormalizationRules(Registry& r);
/// softmax, log_softmax (lib/strategy/softmax.cpp).
void registerSoftmaxRules(Registry& r);
/// embedding (lib/strategy/embedding.cpp).
void registerEmbeddingRules(Registry& r);
/// cross_entropy_loss, nll_loss (lib/strategy/loss.cpp).
void registerLossRules(Registry& r);
/// cat, stack, split, chunk, unbind, slice, select, index_select, triu/tril, list construct and
/// unpack, factory ops (full, ones, zeros, empty, arange, *_like, NumToTensor)
/// (lib/strategy/tensor_ops.cpp).
void registerTensorOpRules(Registry& r);
/// convolution, max/avg pooling, upsample_bilinear2d / upsample_nearest2d
/// (lib/strategy/conv.cpp).
void registerConvRules(Registry& r);
/// Mixture-of-experts routing and expert ops: topk, sort, argsort, gather, scatter_add, index_add,
/// bincount, histc, repeat_interleave, _grouped_mm (lib/strategy/routing.cpp).
void registerRoutingRules(Registry& r);
/// For every registered aten op `aten::f[.o]` without an in-place rule, `aten::f_[.o]`: the
/// out-of-place strategies whose output 0 is placed as input 0 (call after the others).
void registerInPlaceVariants(Registry& r);

/// Every family above.
void registerAllRules(Registry& r);

}  // namespace apc::strategy
