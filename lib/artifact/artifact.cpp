//===- apc/artifact/artifact.h - Artifact directory: manifest + per-rank programs ===//
//
// manifest.json through nlohmann::json (sorted keys), programs through protobuf's deterministic
// serialization, SHA-256 through lib/plan's OpenSSL helper.
//
//===----------------------------------------------------------------------===//
#include "apc/artifact/artifact.h"

#include <algorithm>
#include <map>
#include <set>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apc/artifact/typed_proto.h"
#include "apc/mesh/device_mesh.h"
#include "apc/support/hash.h"
#include "apc/support/json_reader.h"

namespace apc::artifact {

namespace {

namespace fs = std::filesystem;

std::string serializeDeterministic(const proto::Program& p) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream raw(&out);
    google::protobuf::io::CodedOutputStream coded(&raw);
    coded.SetSerializationDeterministic(true);
    p.SerializeToCodedStream(&coded);
  }
  return out;
}

Status writeFile(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return ioError(path.string() + ": cannot open for writing");
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return ioError(path.string() + ": write failed");
  return Status::success();
}

Expected<std::string> readFile(const fs::path& path) {
  return readInputFile(path.string());
}

}  // namespace

std::string programFileName(int64_t rank) {
  return "rank_" + std::to_string(rank) + ".apcp";
}

Expected<ArtifactWriter> ArtifactWriter::create(const std::string& dir, int64_t world_size) {
  if (world_size < 1) return invalidArgument("no programs to write");
  // Written beside `dir` and swapped in as a whole: a reader sees the old artifact or the new one,
  // never new rank files beside old ones.
  APC_ASSIGN_OR_RETURN(StagedDirectory staged, StagedDirectory::create(dir, "manifest.json"));
  ArtifactWriter w;
  w.staged_.emplace(std::move(staged));
  w.world_size_ = world_size;
  return w;
}

Status ArtifactWriter::add(const proto::Program& p) {
  const int64_t r = next_rank_;
  if (r >= world_size_ || p.rank() != r || p.world_size() != world_size_)
    return invalidArgument("program " + std::to_string(r) + " has rank " +
                           std::to_string(p.rank()) + " of world size " +
                           std::to_string(p.world_size()) + ", expected rank " + std::to_string(r) +
                           " of " + std::to_string(world_size_));
  if (r == 0) {
    model_name_ = p.model_name();
    model_hash_ = p.model_hash();
    plan_hash_ = p.plan_hash();
    mesh_shape_.assign(p.mesh_shape().begin(), p.mesh_shape().end());
    mesh_names_.assign(p.mesh_names().begin(), p.mesh_names().end());
  }
  std::string bytes = serializeDeterministic(p);
  std::string name = programFileName(p.rank());
  APC_RETURN_IF_ERROR(writeFile(fs::path(staged_->path()) / name, bytes));
  files_[name] = sha256Hex(bytes);
  ++next_rank_;
  return Status::success();
}

void ArtifactWriter::setModelPath(const std::string& path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(path, ec);
  model_path_ = ec ? path : abs.lexically_normal().string();
}

Expected<StagedDirectory> ArtifactWriter::finish() {
  if (next_rank_ != world_size_)
    return invalidArgument("an artifact of " + std::to_string(world_size_) + " ranks got " +
                           std::to_string(next_rank_) + " programs");
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, sha] : files_) files[name] = sha;
  nlohmann::json j = {{"format_version", kManifestFormatVersion},
                      {"model_name", model_name_},
                      {"model_hash", model_hash_},
                      {"plan_hash", plan_hash_},
                      {"mesh", {{"shape", mesh_shape_}, {"names", mesh_names_}}},
                      {"world_size", world_size_},
                      {"files", files}};
  if (!model_path_.empty()) j["model_path"] = model_path_;
  APC_RETURN_IF_ERROR(writeFile(fs::path(staged_->path()) / "manifest.json", j.dump(2) + "\n"));
  StagedDirectory done = std::move(*staged_);
  staged_.reset();
  return done;
}

Expected<StagedDirectory> stageArtifact(const std::string& dir,
                                        const std::vector<proto::Program>& programs,
                                        const std::string& model_path) {
  if (programs.empty()) return invalidArgument("no programs to write");
  APC_ASSIGN_OR_RETURN(ArtifactWriter w,
                       ArtifactWriter::create(dir, static_cast<int64_t>(programs.size())));
  if (!model_path.empty()) w.setModelPath(model_path);
  for (const proto::Program& p : programs) APC_RETURN_IF_ERROR(w.add(p));
  return w.finish();
}

Status writeArtifact(const std::string& dir, const std::vector<proto::Program>& programs,
                     const std::string& model_path) {
  APC_ASSIGN_OR_RETURN(StagedDirectory staged, stageArtifact(dir, programs, model_path));
  return staged.commit();
}

/// A named namespace: its using-directive stays out of the files a unity build compiles after this.
namespace manifest_json {

using namespace apc::json_reader;  // NOLINT

/// The manifest's JSON (errors name the JSON path, `$.mesh.shape[1]: ...`).
Expected<Manifest> fromJson(const json& j) {
  APC_RETURN_IF_ERROR(checkObject(
      j, "$",
      {"files", "format_version", "mesh", "model_hash", "model_name", "plan_hash", "world_size"},
      {"model_path"}));
  Manifest m;
  APC_ASSIGN_OR_RETURN(int64_t version, readInt(j["format_version"], "$.format_version", true));
  if (version != kManifestFormatVersion)
    return at("$.format_version", "format version " + std::to_string(version) +
                                      ", this apc reads version " +
                                      std::to_string(kManifestFormatVersion));
  m.format_version = kManifestFormatVersion;
  APC_ASSIGN_OR_RETURN(m.model_name, readString(j["model_name"], "$.model_name"));
  APC_ASSIGN_OR_RETURN(m.model_hash, readString(j["model_hash"], "$.model_hash"));
  APC_ASSIGN_OR_RETURN(m.plan_hash, readString(j["plan_hash"], "$.plan_hash"));
  if (j.contains("model_path")) {
    APC_ASSIGN_OR_RETURN(m.model_path, readString(j["model_path"], "$.model_path"));
  }
  const json& mesh = j["mesh"];
  APC_RETURN_IF_ERROR(checkObject(mesh, "$.mesh", {"names", "shape"}));
  const json& shape = mesh["shape"];
  const json& names = mesh["names"];
  APC_RETURN_IF_ERROR(expectArray(shape, "$.mesh.shape"));
  if (shape.empty() || shape.size() > mesh::kMaxMeshDims)
    return at("$.mesh.shape", "expected 1 to " + std::to_string(mesh::kMaxMeshDims) +
                                  " sizes, got " + std::to_string(shape.size()));
  APC_RETURN_IF_ERROR(expectArray(names, "$.mesh.names"));
  if (names.size() != shape.size())
    return at("$.mesh.names", "expected one name per mesh dim (" + dims(shape.size()) + "), got " +
                                  std::to_string(names.size()));
  int64_t product = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const std::string path = indexPath("$.mesh.shape", i);
    APC_ASSIGN_OR_RETURN(int64_t size, readInt(shape[i], path, true));
    if (size < 1 || size > mesh::kMaxWorldSize)
      return at(path, "a mesh dim's size must be in [1, " + std::to_string(mesh::kMaxWorldSize) +
                          "], got " + std::to_string(size));
    product *= size;
    if (product > mesh::kMaxWorldSize)
      return at("$.mesh.shape",
                "mesh of more than " + std::to_string(mesh::kMaxWorldSize) + " devices");
    m.mesh_shape.push_back(size);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    APC_ASSIGN_OR_RETURN(std::string name, readString(names[i], indexPath("$.mesh.names", i)));
    m.mesh_names.push_back(std::move(name));
  }
  APC_ASSIGN_OR_RETURN(m.world_size, readInt(j["world_size"], "$.world_size", true));
  if (m.world_size != product)
    return at("$.world_size", "world_size " + std::to_string(m.world_size) +
                                  " does not match the mesh (" + std::to_string(product) +
                                  " devices)");
  const json& files = j["files"];
  APC_RETURN_IF_ERROR(expectObject(files, "$.files", "an object of SHA-256 by file name"));
  for (const auto& [name, sha] : files.items()) {
    APC_ASSIGN_OR_RETURN(std::string hex, readString(sha, keyPath("$.files", name)));
    m.files.emplace(name, std::move(hex));
  }
  for (int64_t r = 0; r < m.world_size; ++r)
    if (!m.files.count(programFileName(r)))
      return at("$.files", "no entry for " + programFileName(r));
  return m;
}

}  // namespace manifest_json

Expected<Manifest> readManifest(const std::string& dir) {
  const std::string where = (fs::path(dir) / "manifest.json").string();
  APC_ASSIGN_OR_RETURN(std::string text, readFile(where));
  auto j = parseJsonText(text);
  if (!j.ok()) return j.error().withContext(where);
  auto m = manifest_json::fromJson(*j);
  if (!m.ok()) return m.error().withContext(where);
  return m;
}

Expected<proto::Program> readProgram(const std::string& dir, const Manifest& m, int64_t rank) {
  if (rank < 0 || rank >= m.world_size)
    return invalidArgument("rank " + std::to_string(rank) + " outside the artifact's world size " +
                           std::to_string(m.world_size));
  std::string name = programFileName(rank);
  fs::path path = fs::path(dir) / name;
  const std::string where = path.string();
  APC_ASSIGN_OR_RETURN(std::string bytes, readFile(path));
  auto it = m.files.find(name);
  if (it == m.files.end()) return invalidArgument(where + ": not listed in manifest.json");
  if (sha256Hex(bytes) != it->second)
    return invalidArgument(where +
                           ": SHA-256 mismatch with manifest.json (file truncated or "
                           "edited, " +
                           std::to_string(bytes.size()) + " bytes)");
  proto::Program p;
  if (!p.ParseFromString(bytes)) return parseError(where + ": not a valid program (truncated?)");
  if (p.format_version() != kProgramFormatVersion)
    return invalidArgument(where + ": program format version " +
                           std::to_string(p.format_version()) + ", this apc reads version " +
                           std::to_string(kProgramFormatVersion) +
                           (p.format_version() < kProgramFormatVersion
                                ? " (written by an older apc: lower the plan again)"
                                : " (written by a newer apc)"));
  if (static_cast<int64_t>(p.rank()) != rank ||
      static_cast<int64_t>(p.world_size()) != m.world_size)
    return invalidArgument(where + ": holds rank " + std::to_string(p.rank()) + " of " +
                           std::to_string(p.world_size()) + ", expected rank " +
                           std::to_string(rank) + " of " + std::to_string(m.world_size));
  if (p.model_hash() != m.model_hash || p.plan_hash() != m.plan_hash)
    return invalidArgument(where + ": model or plan hash differs from manifest.json");
  if (Status s = checkProgramEnums(p); !s.ok())
    return parseError(where + ": " + s.error().message());
  return p;
}

Expected<proto::Program> readProgram(const std::string& dir, int64_t rank) {
  APC_ASSIGN_OR_RETURN(Manifest m, readManifest(dir));
  return readProgram(dir, m, rank);
}

std::vector<int> deferredGradParameters(const proto::Program& program) {
  std::vector<int> out(static_cast<size_t>(program.redistributions_size()), -1);
  std::map<uint32_t, int> param_of_value;
  for (int i = 0; i < program.parameters_size(); ++i)
    if (program.parameters(i).requires_grad()) param_of_value[program.parameters(i).value()] = i;
  const proto::Graph& g = program.graph();
  const int n = std::min(program.node_redistribution_size(), g.nodes_size());
  for (int i = 0; i < n; ++i) {
    const uint32_t r = program.node_redistribution(i);
    if (r == 0 || r > out.size() || g.nodes(i).inputs_size() < 1) continue;
    auto param = param_of_value.find(g.nodes(i).inputs(0));
    if (param == param_of_value.end()) continue;
    if (program.redistributions(static_cast<int>(r - 1)).bucketed_gradient())
      out[r - 1] = param->second;
  }
  return out;
}

namespace {

/// A parameter's layer: its name up to its first numeric component ("" when none).
std::string layerOf(const std::string& name) {
  size_t begin = 0;
  while (begin <= name.size()) {
    size_t end = name.find('.', begin);
    if (end == std::string::npos) end = name.size();
    const std::string part = name.substr(begin, end - begin);
    if (!part.empty() &&
        std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return name.substr(0, end);
    begin = end + 1;
  }
  return "";
}

bool stepDynamic(const proto::RedistStep& s, int32_t dim) {
  return dim >= 0 && dim < s.dynamic_size() && s.dynamic(dim);
}

}  // namespace

GatherGradientForm gatherGradientForm(const proto::Redistribution& red) {
  if (red.backward_size() == 1 && red.backward(0).kind() == proto::REDUCE_SCATTER &&
      !stepDynamic(red.backward(0), red.backward(0).shard_dim()))
    return GatherGradientForm::kReduceScatter;
  if (red.backward_size() == 2 && red.backward(0).kind() == proto::ALL_REDUCE &&
      red.backward(1).kind() == proto::LOCAL_SLICE &&
      red.backward(0).mesh_dim() == red.backward(1).mesh_dim() &&
      red.backward(1).shard_dim() >= 0 &&
      !stepDynamic(red.backward(1), red.backward(1).shard_dim()))
    return GatherGradientForm::kAllReduceSlice;
  bool collective = false;
  for (const proto::RedistStep& s : red.backward()) {
    switch (s.kind()) {
      case proto::ALL_REDUCE:
        collective = true;
        break;
      case proto::REDUCE_SCATTER:
        collective = true;
        [[fallthrough]];
      case proto::LOCAL_SLICE:
        if (s.shard_dim() < 0 || stepDynamic(s, s.shard_dim())) return GatherGradientForm::kOther;
        break;
      default:
        return GatherGradientForm::kOther;
    }
  }
  return collective && red.backward_size() >= 2 ? GatherGradientForm::kChain
                                                : GatherGradientForm::kOther;
}

bool isGatherChain(const proto::Redistribution& red) {
  if (red.forward_size() < 1) return false;
  for (const proto::RedistStep& f : red.forward())
    if (f.kind() != proto::ALL_GATHER || f.gather_dim() < 0 || stepDynamic(f, f.gather_dim()))
      return false;
  return true;
}

std::string gatherStepsKey(const proto::Redistribution& red) {
  std::string key;
  for (const proto::RedistStep& f : red.forward()) key += "g" + std::to_string(f.mesh_dim()) + ",";
  if (gatherGradientForm(red) == GatherGradientForm::kChain)
    for (const proto::RedistStep& b : red.backward())
      key += "b" + std::to_string(static_cast<int>(b.kind())) + "/" + std::to_string(b.mesh_dim()) +
             "/" + std::to_string(static_cast<int>(b.reduce_op())) + ",";
  return key;
}

std::vector<int> paramGatherGroups(const proto::Program& program, int64_t cap_bytes,
                                   int64_t min_bytes) {
  const proto::Graph& g = program.graph();
  std::vector<int> out(static_cast<size_t>(g.nodes_size()), -1);
  std::map<uint32_t, int> param_of_value;
  for (int i = 0; i < program.parameters_size(); ++i)
    param_of_value[program.parameters(i).value()] = i;
  std::set<uint32_t> sync;
  for (const proto::OpCollective& c : program.op_collectives()) sync.insert(c.node());
  // A gather inside a checkpoint segment is gathered again by the segment's recomputation, one
  // outside by the re-gather of backward: a group never mixes the two.
  auto checkpointed = [&](int node) {
    for (const proto::CheckpointSegment& c : program.checkpoints())
      if (static_cast<uint32_t>(node) >= c.first() && static_cast<uint32_t>(node) <= c.last())
        return true;
    return false;
  };
  // The candidates in program order, each with its group key.
  struct Candidate {
    int node;
    std::string key;
    std::string layer;
    int64_t bytes;
  };
  std::vector<Candidate> candidates;
  const int n = std::min(program.node_redistribution_size(), g.nodes_size());
  for (int i = 0; i < n; ++i) {
    const uint32_t r = program.node_redistribution(i);
    if (r == 0 || static_cast<int>(r) > program.redistributions_size() ||
        g.nodes(i).inputs_size() != 1 || sync.count(static_cast<uint32_t>(i)))
      continue;
    auto param = param_of_value.find(g.nodes(i).inputs(0));
    if (param == param_of_value.end()) continue;
    const proto::Redistribution& red = program.redistributions(static_cast<int>(r - 1));
    if (red.bucketed_gradient() || !isGatherChain(red)) continue;
    const proto::ProgramTensor& p = program.parameters(param->second);
    const GatherGradientForm form = gatherGradientForm(red);
    std::string backward = "other";
    // Both single-step forms join one group: a group with a member of each is reduced by ONE
    // all-reduce of the gradients concatenated, each then cut to this rank's chunk (the same sums
    // a reduce-scatter gives). Calibrated prices pick the form per tensor size, so a layer's small
    // and large parameters would otherwise break it into many groups. A chain's steps are in the
    // steps key.
    if (form == GatherGradientForm::kChain)
      backward = "chain/" + red.reduce_dtype();
    else if (form != GatherGradientForm::kOther)
      backward = "red" + std::to_string(static_cast<int>(red.backward(0).reduce_op())) + "/" +
                 std::to_string(red.backward(0).mesh_dim()) + "/" + red.reduce_dtype();
    const std::string key = gatherStepsKey(red) + "|" +
                            (p.storage_dtype().empty() ? p.dtype() : p.storage_dtype()) + "|" +
                            (red.requires_grad() ? "g" : "-") + (red.regather() ? "r" : "-") +
                            (checkpointed(i) ? "c" : "-") + "|" + backward;
    candidates.push_back(
        {i, key, layerOf(p.name()), red.forward(red.forward_size() - 1).priced_bytes()});
  }
  int groups = 0;
  for (size_t b = 0; b < candidates.size();) {
    size_t e = b + 1;
    int64_t bytes = candidates[b].bytes;
    // A layer boundary closes a group that holds min_bytes already (smaller layers join the next:
    // their gathers cost mostly the call's latency).
    while (e < candidates.size() && candidates[e].key == candidates[b].key &&
           bytes + candidates[e].bytes <= cap_bytes &&
           (candidates[e].layer == candidates[e - 1].layer || bytes < min_bytes))
      bytes += candidates[e++].bytes;
    if (e - b > 1) {
      for (size_t k = b; k < e; ++k) out[static_cast<size_t>(candidates[k].node)] = groups;
      ++groups;
    }
    b = e;
  }
  return out;
}

}  // namespace apc::artifact
