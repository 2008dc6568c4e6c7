//===- apc/runtime/loss.h - A training loss on this rank's rows of the output ---===//
//
// A trainer's loss over a sharded output without gathering the whole output on every rank: the
// rows (every dim but the class dim of a cross-entropy; every dim of a mean square) stay where the
// plan's output placement put them, and each rank takes the loss of its own rows, scaled by the
// whole batch's row count. A class dim split across ranks (vocab-parallel logits) is not gathered
// either: the cross entropy is Megatron's vocab-parallel one (per row the classes' maximum, the
// sum of exponentials and the target's logit, each all-reduced over the mesh dims that split the
// classes, with an identity backward); only a placement with other splits (Partial) is gathered.
// What PyTorch's DDP and FSDP do (each rank's loss on its own batch piece), and what apc-train
// runs:
//
//   share = sum over this rank's rows of the per-row loss / rows of the whole batch
//
// Every rank calls backward on its share. The gradient of this rank's rows is then the same as
// the whole loss's: ranks that hold the same rows (the output replicated on a mesh dim) hold the
// same share and the same gradient, as a Replicate tensor's gradient is. The loss of the whole
// batch (`value()`) is the shares summed over the mesh dims that split the rows (one small
// all-reduce of a double per such dim, the first issued asynchronously so that it runs behind the
// backward, waited for by value()), the same on every rank. The whole batch's row count is the
// output's static shape; only a dynamic row dim takes a collective (its local sizes summed, a
// blocking all-reduce), and none where the caller passes its symbol's size (a trainer that holds
// the whole batch: 0.5-1.5 ms a step on 2 CPU Gloo ranks, a quarter of a small model's). The
// output's peak memory is this rank's rows with the whole class dim, not the whole output
// (apc/plan/memory.h models this).
//
// The cross-entropy's targets are the full batch's (synthetic: drawn as apc-train always drew
// them, `classes` ids over the whole batch from the generator, so the values do not depend on the
// placement); each rank takes its rows' piece.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apc/runtime/parallel_module.h"
#include "apc/support/error.h"

namespace apc::runtime {

struct ShardedLoss {
  at::Tensor share;  // this rank's part of the loss: call backward on it on every rank
  /// The loss of the whole batch, the same on every rank: the first call waits for the shares'
  /// sum (with the collective timeout; CommError past it) and every rank must call it once per
  /// loss, after the same collectives (call it after backward to keep the wait off the step).
  double value();

  /// shardedLoss's: the sum still to be waited for (empty once value() has run).
  std::function<double()> resolve;
  std::optional<double> resolved;
};

/// The loss of output leaf 0, `local` this rank's piece of it (forwardLeaves' first leaf):
/// - a one-element output: itself (gathered whole; every rank's share is the whole loss);
/// - a floating output of rank >= 2: cross-entropy over its last dim against `targets` (integer
///   class ids shaped as the output's dims but the last, the full batch's), or, without targets,
///   against ids drawn from `gen` (`gen` required then);
/// - else the mean square: of the output, or of output - `targets` (floating, shaped as the
///   output, the full batch's).
/// Collective over the mesh dims that split the rows. A dynamic row dim's whole size is summed
/// over them (a blocking all-reduce) unless `symbol_sizes` holds its symbol (the whole batch's
/// sizes, from inputSymbolSizes where the caller holds the whole batch: no collective then).
/// Errors: targets whose shape does not fit; a symbol size below this rank's rows.
Expected<ShardedLoss> shardedLoss(ParallelModule& pm, const at::Tensor& local,
                                  const at::Tensor* targets, at::Generator* gen,
                                  const std::map<std::string, int64_t>* symbol_sizes = nullptr);

/// The size of every dynamic dim of the program's inputs, by its symbol (ParallelModule::
/// inputSpecs), in `full_inputs`, the whole batch's inputs in the program's order (the first
/// size seen of a symbol).
std::map<std::string, int64_t> inputSymbolSizes(const ParallelModule& pm,
                                                const std::vector<at::Tensor>& full_inputs);

}  // namespace apc::runtime
