//===- lib/runtime/parallel_module_reader.h - Reading a rank's program ------===//
//
// The one place where ParallelModule reads an artifact directory: this rank's Program from
// `rank_<r>.apcp`, checked against `manifest.json` (format version, world size, file hashes).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>

#include "apc.pb.h"
#include "apc/support/error.h"

namespace apc::runtime {

/// Reads and checks the program of `rank`. Errors are one line naming the directory and the check
/// that failed (missing file, hash mismatch, format version, world size).
Expected<proto::Program> readRankProgram(const std::string& dir, int rank, int world_size,
                                         bool check_hashes);

}  // namespace apc::runtime
