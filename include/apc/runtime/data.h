//===- apc/runtime/data.h - Training batches read from a file, per rank ----===//
//
// Real data for a C++ trainer over an apc artifact: every step, each rank reads from the file only
// its own piece of the batch (the rows, and columns, its input placement assigns it; pread at
// computed offsets, never the whole file), and gets the batch's targets for the loss.
//
//   auto data = DataSource::open(*pm, "train.bin", {"uint16", /*seed=*/0});
//   auto batch = (*data)->batch(step);                       // collective
//   auto out = pm->forwardLeaves(batch->inputs);
//   auto loss = shardedLoss(*pm, (*out)[0].toTensor(), &batch->targets, nullptr);  // loss.h
//   loss->share.backward();
//
// Two kinds of file, told apart by the name:
//  - a flat binary file of token ids (any name not ending in .safetensors), as nanoGPT's
//    prepare.py writes it (np.uint16 ids, concatenated documents): DataOptions::token_dtype says
//    the id type (uint16, uint32, int32 or int64, little-endian). The artifact must take one
//    integer input [B, T] and return per-token logits [B, T, V] first; a batch is B windows of
//    T + 1 consecutive tokens: the input is a window's first T, the targets its last T (the next
//    token of each position), and the loss is cross-entropy. Ids must be below the embedding's
//    rows (and V).
//  - a .safetensors file with a tensor "inputs" [N, ...] (dims after the first as the artifact's
//    input) and a tensor "targets" (or "labels") [N, ...]: integer class ids, one per position of
//    the output's dims but the last ([N] for logits [B, C]; cross-entropy), or floating values
//    shaped as the output's rows (mean squared error). A batch is B rows.
//
// Batch selection is a function of (seed, step) alone: rows (window starts) are drawn uniformly,
// with replacement, from a generator seeded with both, identically on every rank, so a resumed
// run (apc/runtime/checkpoint.h) sees the batches of a straight one. The targets are read by each
// rank for its own rows too and gathered over the ranks (one small all-gather of the targets);
// the loss (apc/runtime/loss.h) takes each rank's rows' piece of them.
//
// Errors are one line naming the file: not a file, too short for one window, a size that is not a
// whole number of ids, ids beyond the embedding's rows (found in the rows read; every rank fails
// with the same line), missing tensor names, shapes that do not fit the artifact's input.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "apc/runtime/parallel_module.h"
#include "apc/support/error.h"

namespace apc::runtime {

struct DataOptions {
  /// Flat token files: the type of one id: "uint16" (nanoGPT's), "uint32", "int32" or "int64".
  std::string token_dtype = "uint16";
  /// Seed of the batch selection (rows drawn from (seed, step)).
  uint64_t seed = 0;
  /// Rows per batch (dim 0 of the input); 0: the artifact's.
  int64_t batch = 0;
};

/// One step's data on this rank.
struct Batch {
  /// This rank's piece of every program input (as ParallelModule::shardInput cuts a full input),
  /// in the input's storage dtype, on the module's device; fullBatch: the full inputs.
  std::vector<c10::IValue> inputs;
  /// The full targets of the batch, the same on every rank, on the module's device: int64 token
  /// ids [B, T], class ids, or floating values (see the file comment).
  at::Tensor targets;
};

class DataSource {
 public:
  /// Opens `path` for training `pm` (which must outlive the source) and checks it against the
  /// artifact's input and first output. Not collective (every rank checks the same things alike).
  static Expected<std::unique_ptr<DataSource>> open(ParallelModule& pm, const std::string& path,
                                                    const DataOptions& options = {});
  ~DataSource();
  DataSource(const DataSource&) = delete;
  DataSource& operator=(const DataSource&) = delete;

  /// This rank's batch of step `step`. Collective: the targets are gathered from the ranks'
  /// pieces, and a bad id any rank read is every rank's error.
  Expected<Batch> batch(int64_t step);
  /// The whole batch of step `step` (full inputs and targets), read by this rank alone: for a
  /// single-device reference. Not collective.
  Expected<Batch> fullBatch(int64_t step);

  /// One line: the file, its kind and size ("train.bin: 1000000 uint16 token ids, windows of
  /// 129 tokens").
  std::string describe() const;
  /// Bytes of the file batch() read on this rank so far (headers and fullBatch apart).
  int64_t bytesRead() const;

 private:
  struct Impl;
  explicit DataSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The loss of a full output against a batch's targets: integer targets: cross-entropy over the
/// output's last dim (mean over the other positions); floating targets: mean squared error.
at::Tensor dataLoss(const at::Tensor& output, const at::Tensor& targets);

/// True when `path` names a tensor file (ends in .safetensors), else it is read as token ids.
bool isTensorDataFile(const std::string& path);

}  // namespace apc::runtime
