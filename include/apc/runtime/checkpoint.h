//===- apc/runtime/checkpoint.h - Sharded training checkpoints -------------===//
//
// A trainer's whole state, saved by every rank at once and loaded again to resume exactly: the
// parameter and buffer shards, the optimizer's state (apc/runtime/optimizer.h: the step count,
// SGD's momentum buffers, AdamW's moments, in their dtypes) and the trainer's position (steps
// done, and any values of its own: seeds, a data offset).
//
//   auto saved = saveCheckpoint(*pm, &opt, {step + 1, {}}, "ckpt");   // ckpt/step_00000100
//   auto dir = findCheckpoint("ckpt");                                 // the newest complete one
//   auto state = loadCheckpoint(*pm, &opt, *dir);                      // resume at state->step
//
// On disk, a checkpoint is a directory of safetensors files, one per rank, and a manifest:
//   rank_<r>.safetensors  little-endian u64 header length, the JSON header (per tensor its dtype,
//                         shape and byte range; "__metadata__" names the format and rank), then
//                         the raw bytes. Keys: a parameter's or buffer's name (as named_parameters
//                         gives it) for its local piece, "optimizer/<state>/<parameter>" for the
//                         optimizer's. A piece replicated over some mesh dims is written once, by
//                         the rank at coordinate 0 of those dims (as clip_grad_norm_ counts it);
//                         empty pieces are not written.
//   manifest.json         {"format": "apc-checkpoint", "format_version": 1, "model_name",
//                         "model_hash", "plan_hash", "mesh": {"shape", "names"}, "world_size",
//                         "step", "trainer": {...}, "optimizer": {"kind", "steps", hyper-
//                         parameters}, "files": {"rank_0.safetensors": {"bytes", "sha256"}, ...},
//                         "tensors": {name: {"kind": "parameter"|"buffer"|"optimizer", "dtype",
//                         "shape", "placement", "pieces": [{"file", "key", "offsets", "sizes"}]}}}
// so Python reads it with safetensors (or torch and json alone): every full tensor is its pieces
// put at their offsets (docs/DESIGN.md, "Checkpoints", has the snippet).
//
// Atomic: each rank writes its file to a temporary name, syncs it and renames it; after every
// rank has, rank 0 writes manifest.json the same way, last. A directory without manifest.json (a
// save killed part way) is not a checkpoint: findCheckpoint passes over it and the next save of
// that step replaces it. A failed write on any rank (a full disk) fails the save on every rank
// and leaves no manifest.
//
// Loading checks everything it reads against the manifest (format, the model's and the plan's
// hash, each tensor's global shape and dtype, each file's size and SHA-256, each piece's header
// entry); an error is one line naming the file. A rank reads the parts of the saved pieces that
// overlap its own shard, whichever rank wrote them, and only those bytes (a piece is row-major:
// the overlap is a set of contiguous runs, each one pread): a checkpoint of one plan or mesh
// loads into another plan or mesh of the same model (resharding), parameters and optimizer state
// alike. The SHA-256 of each file is checked by one rank (file i by rank i mod world size) and
// the ranks agree on the outcome, so the whole checkpoint is verified once per load.
//
// The ranks must see one file system under the root (one machine, or a shared one): rank 0
// makes the directory and writes the manifest, and a rank may read another rank's file.
//
// save and load are collective: every rank calls them (they agree on success over the world
// group, so that a rank's failure is every rank's error, not a hang in the next collective).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "apc/runtime/optimizer.h"
#include "apc/runtime/parallel_module.h"
#include "apc/support/error.h"

namespace apc::runtime {

/// The trainer's position beside the weights and the optimizer.
struct TrainingState {
  int64_t step = 0;  // steps done: a resumed run starts at this step
  /// The trainer's own values (a data seed, a position in a data file), saved as given.
  std::map<std::string, std::string> trainer;
  /// Set by loadCheckpoint: the plan the checkpoint was saved under (another than the module's
  /// when it was resharded).
  std::string plan_hash;
  /// Set by loadCheckpoint: the bytes of tensor data this rank read (the byte ranges of the saved
  /// pieces that overlap its shards; the hash checks, each file by one rank, apart).
  int64_t bytes_read = 0;
};

struct CheckpointOptions {
  /// After a save: remove all but the newest `keep_last` complete checkpoints under the root, and
  /// incomplete ones older than the newest (0: keep everything).
  int keep_last = 0;
};

/// "step_00000100": the directory name of the checkpoint of a step under its root.
std::string checkpointDirName(int64_t step);

/// Saves this rank's shards of every parameter and buffer, the optimizer's state (when `opt` is
/// given; it must be over pm.parameters(), in order) and `state` into `root`/step_<state.step>,
/// and returns that directory. Collective. A checkpoint already there for that step is replaced.
Expected<std::string> saveCheckpoint(ParallelModule& pm, const Optimizer* opt,
                                     const TrainingState& state, const std::string& root,
                                     const CheckpointOptions& options = {});

/// The checkpoint to resume from at `path`: `path` itself when it holds a manifest.json, else
/// the complete checkpoint of the highest step among its step_<n> directories (those without a
/// manifest are ignored). kNotFound when there is none.
Expected<std::string> findCheckpoint(const std::string& path);

/// Loads the checkpoint in `dir` (a directory findCheckpoint returns) into this rank's shards
/// and, when `opt` is given, the optimizer (whose kind must be the checkpoint's); returns the
/// trainer's position. Collective. The checkpoint must be of this model (its model hash); it may
/// be of another plan or mesh (every tensor's global shape and dtype must then agree).
Expected<TrainingState> loadCheckpoint(ParallelModule& pm, Optimizer* opt, const std::string& dir);

/// Writes the full parameters and buffers of the checkpoint in `dir` (no optimizer state) to one
/// safetensors file `out`, under the model's names (as named_parameters and the model's
/// state_dict give them), for inference or Python. Not collective: one process reads every
/// file. The checks are loadCheckpoint's; the file is written atomically.
Status exportCheckpoint(const std::string& dir, const std::string& out);

/// The tensors of one safetensors file by name (what safetensors.torch.save_file writes of a
/// state dict, or exportCheckpoint), on the CPU. Every header entry is checked (known dtype,
/// shape, byte range inside the file); an error is one line naming the file. Not collective.
Expected<std::map<std::string, at::Tensor>> readSafetensors(const std::string& path);

}  // namespace apc::runtime
