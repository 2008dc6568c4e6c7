//===- apc/artifact/artifact.h - Artifact directory: manifest + per-rank programs ===//
//
// An artifact directory holds what `apc lower` writes and the runtime loads:
//   manifest.json   {"format_version": 1, "model_name", "model_hash", "plan_hash",
//                    "mesh": {"shape": [2, 2], "names": ["dp", "tp"]}, "world_size": 4,
//                    "files": {"rank_0.apcp": "<sha256 hex>", ...},
//                    "model_path": "/abs/model.pt2"}  (optional: the model file lowered, where
//                    a trainer finds the weights the model starts from; model_hash is its SHA-256)
//   rank_<r>.apcp   proto::Program of rank r, binary protobuf (deterministic serialization)
// Its own library (lib/artifact, apc_artifact: proto, support, mesh; no planner), which the
// runtime links. Writing is deterministic: the same programs give byte-identical files (sorted JSON
// keys, no timestamps). Reading checks the manifest's format version, that the file's SHA-256
// equals the manifest's, that it parses, and that its format version, rank, world size and hashes
// agree with the manifest. Every error is one line naming the file.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apc.pb.h"
#include "apc/support/error.h"
#include "apc/support/file_io.h"

namespace apc::artifact {

/// The manifest.json format_version written and accepted.
inline constexpr int kManifestFormatVersion = 1;
/// The Program.format_version written and accepted.
/// 2: Redistribution.reduce_dtype (before, the runtime reduced every gradient in the program's
/// reduce_dtype). 3: Program.divisible (dynamic dims that must split evenly, checked per forward)
/// and Redistribution.regather (parameters re-gathered in backward). 4: placements, step kinds
/// and reduce ops as enums (proto::Placement, proto::StepKind, proto::ReduceOp), not text. 5: an
/// op's internal collective as Program.op_collectives (node, mesh dims and the op's local graph)
/// in place of the batch_norm-only Program.sync_norms. 6: a vocab-parallel embedding's masked
/// lookup as its local graph in Program.op_collectives (without mesh dims) in place of
/// the by-name vocab masks (Program field 17, now reserved), and Prediction.overlap_efficiency
/// (which an older program lacks: it would read as 0, nothing hidden is free).
inline constexpr uint32_t kProgramFormatVersion = 6;

/// The runtime's default gradient bucket (ParallelModuleOptions::grad_bucket_bytes) and the one
/// lowering's prediction assumes: DDP's 25 MiB.
inline constexpr int64_t kDefaultGradBucketBytes = 25 * 1024 * 1024;
/// The first gradient bucket's size (ParallelModuleOptions::first_grad_bucket_bytes), as DDP's
/// (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES, 1 MiB): the gradients backward produces first
/// are reduced early, behind the rest of backward.
inline constexpr int64_t kFirstGradBucketBytes = 1024 * 1024;

struct Manifest {
  int format_version = kManifestFormatVersion;
  std::string model_name;
  std::string model_hash;  // SHA-256 of the model file
  std::string plan_hash;   // the plan's content_hash
  std::string model_path;  // the model file's absolute path when lowered; empty: not recorded
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_names;
  int64_t world_size = 0;
  std::map<std::string, std::string> files;  // file name -> SHA-256 (lowercase hex)
};

/// "rank_3.apcp".
std::string programFileName(int64_t rank);

/// An artifact written one rank program at a time into a staging directory beside `dir`, so that
/// lowering needs one program in memory, not every rank's (65,536 ranks of a large model are tens
/// of GB). add() the programs in rank order (rank 0 first, each of world size `world_size`, the
/// same model and plan as rank 0's); finish() writes manifest.json once all have come and returns
/// the staged directory, whose commit() swaps it in for `dir`. Fails as stageArtifact does.
class ArtifactWriter {
 public:
  static Expected<ArtifactWriter> create(const std::string& dir, int64_t world_size);
  /// Serializes and writes `program` (rank_<r>.apcp) and forgets it.
  Status add(const proto::Program& program);
  /// Records the model file the programs were lowered from (made absolute) in the manifest, where
  /// a trainer finds the model's initial weights and buffers (apc-train does).
  void setModelPath(const std::string& path);
  /// manifest.json; an error unless every rank was added.
  Expected<StagedDirectory> finish();

 private:
  ArtifactWriter() = default;
  std::optional<StagedDirectory> staged_;
  int64_t world_size_ = 0;
  int64_t next_rank_ = 0;
  std::string model_name_, model_hash_, plan_hash_, model_path_;
  std::vector<int64_t> mesh_shape_;
  std::vector<std::string> mesh_names_;
  std::map<std::string, std::string> files_;  // file name -> SHA-256
};

/// Writes manifest.json and rank_<r>.apcp for every program (programs[r].rank() == r, all with
/// the same world size == programs.size()) into a staging directory beside `dir`; the result's
/// commit() swaps it in for `dir` as a whole. Fails when `dir` is a file, or a non-empty
/// directory that is not an artifact (no manifest.json). Manifest fields come from the programs,
/// and model_path from `model_path` (empty: not recorded; see ArtifactWriter::setModelPath).
Expected<StagedDirectory> stageArtifact(const std::string& dir,
                                        const std::vector<proto::Program>& programs,
                                        const std::string& model_path = "");
/// stageArtifact, then commit: `dir` holds the old artifact or the new one, never a mix.
Status writeArtifact(const std::string& dir, const std::vector<proto::Program>& programs,
                     const std::string& model_path = "");

/// Reads and checks `dir`/manifest.json (format version, fields, one file per rank).
Expected<Manifest> readManifest(const std::string& dir);

/// Reads rank `rank`'s program: checks its SHA-256 against the manifest, parses it, checks its
/// format version, rank, world size, model and plan hash.
/// Per redistribution of `program`: the index (into program.parameters()) of the parameter whose
/// gradient the runtime buckets on that edge, -1 for none: the edges lowering marked
/// bucketed_gradient (a parameter read where it lies whose gradient returns through one
/// all-reduce, as the planner priced it) whose input is a parameter that takes a gradient.
/// readProgram checks that every marked edge has that shape.
std::vector<int> deferredGradParameters(const proto::Program& program);

/// How a parameter gather's gradient comes back, as a gather group reduces it (paramGatherGroups,
/// the runtime's GroupedReduceScatter, lowering's prediction): one reduce-scatter along a static
/// dim, an all-reduce then a local slice along a static dim on the same mesh dim, a chain of such
/// steps over several mesh dims (all-reduces, reduce-scatters and local slices along static dims,
/// the transpose of a gather over several mesh dims: a group of members with the same chain runs
/// it step by step, one call per collective step), or another way (reduced on its own).
enum class GatherGradientForm { kOther, kReduceScatter, kAllReduceSlice, kChain };
GatherGradientForm gatherGradientForm(const proto::Redistribution& red);

/// Whether `red`'s forward is one or more all-gathers along static dims (a parameter's gather over
/// one mesh dim, or over several: FSDP over both dims of a 2-d mesh), the gathers a gather group
/// holds.
bool isGatherChain(const proto::Redistribution& red);

/// The steps of `red`'s forward (kind and mesh dim each) and, for a kChain gradient, its backward
/// (kind, mesh dim and reduce op each), as text: the members of a gather group agree on it.
std::string gatherStepsKey(const proto::Redistribution& red);

/// A gather group smaller than this runs on past a layer boundary (paramGatherGroups).
inline constexpr int64_t kMinGatherGroupBytes = 1024 * 1024;

/// FSDP's grouped parameter gathers (ParallelModule runs them; lowering prices them so). Per node
/// of `program`'s graph: the index of its gather group, -1 for none. A candidate is a
/// redistribute node whose input is a parameter and whose forward is one or more all-gathers along
/// static dims (isGatherChain; not a bucketed edge, not an op collective): the gathers the runtime
/// issues ahead (a group of gathers over several mesh dims runs one call per step).
/// Candidates in program order are grouped while they are consecutive among the candidates and
/// agree on the steps (gatherStepsKey), the parameter's stored dtype, requires_grad, regather,
/// whether the gather lies inside a checkpoint segment (Program.checkpoints: recomputed there, not
/// re-gathered), the backward (one reduce-scatter along a static dim, or an all-reduce then a local
/// slice on its mesh dim, with the same op, mesh dim and reduce dtype: a group holding both is
/// reduced by one all-reduce; or anything else), as FSDP2's fully_shard per layer: a change of
/// layer (the parameter's name up to its first numeric component, "layers.3" of
/// "layers.3.attn.q.weight"; "" for the root's parameters) closes a group that holds `min_bytes` of
/// gathered (priced) bytes already (smaller layers run on into the next: their gathers cost mostly
/// a call's latency); a group holds at most `cap_bytes`. A group of one is no group (-1). Groups
/// are numbered in program order. Every rank's program has the same nodes and edges, so every rank
/// groups alike.
std::vector<int> paramGatherGroups(const proto::Program& program,
                                   int64_t cap_bytes = kDefaultGradBucketBytes,
                                   int64_t min_bytes = kMinGatherGroupBytes);

Expected<proto::Program> readProgram(const std::string& dir, int64_t rank);
/// The same with a manifest already read.
Expected<proto::Program> readProgram(const std::string& dir, const Manifest& manifest,
                                     int64_t rank);

}  // namespace apc::artifact
