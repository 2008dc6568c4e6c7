//===- lib/runtime/parallel_module_reader.cpp - Reading a rank's program ----===//
//
// lib/lower's artifact reader (manifest format version, file hashes, program format version, rank,
// model and plan hashes) plus the runtime's own check: the world size of this run.
//
//===----------------------------------------------------------------------===//
#include "parallel_module_reader.h"

#include "apc/artifact/artifact.h"

namespace apc::runtime {

Expected<proto::Program> readRankProgram(const std::string& dir, int rank, int world_size,
                                         bool check_hashes) {
  (void)check_hashes;  // lib/lower's reader always checks them
  APC_ASSIGN_OR_RETURN(artifact::Manifest manifest, artifact::readManifest(dir));
  if (manifest.world_size != world_size)
    return invalidArgument(dir + ": the artifact is for world size " +
                           std::to_string(manifest.world_size) +
                           ", this run has WORLD_SIZE=" + std::to_string(world_size));
  return artifact::readProgram(dir, manifest, rank);
}

}  // namespace apc::runtime
