//===- lib/lower/artifact.cpp - Artifact directory io ----------------------===//
//
// manifest.json through nlohmann::json (sorted keys), programs through protobuf's deterministic
// serialization, SHA-256 through lib/plan's OpenSSL helper.
//
//===----------------------------------------------------------------------===//
#include "apc/lower/artifact.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apc/lower/lower.h"
#include "apc/plan/hash.h"

namespace apc::lower {

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
  std::error_code ec;
  if (!fs::exists(path, ec)) return notFound(path.string() + ": no such file");
  std::ifstream f(path, std::ios::binary);
  if (!f) return ioError(path.string() + ": cannot open");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::string programFileName(int64_t rank) {
  return "rank_" + std::to_string(rank) + ".apcp";
}

Status writeArtifact(const std::string& dir, const std::vector<proto::Program>& programs) {
  if (programs.empty()) return invalidArgument("no programs to write");
  const proto::Program& first = programs.front();
  for (size_t r = 0; r < programs.size(); ++r)
    if (programs[r].rank() != r || programs[r].world_size() != programs.size())
      return invalidArgument("program " + std::to_string(r) + " has rank " +
                             std::to_string(programs[r].rank()) + " of world size " +
                             std::to_string(programs[r].world_size()) + ", expected rank " +
                             std::to_string(r) + " of " + std::to_string(programs.size()));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ioError(dir + ": cannot create directory (" + ec.message() + ")");
  nlohmann::json files = nlohmann::json::object();
  for (const proto::Program& p : programs) {
    std::string bytes = serializeDeterministic(p);
    std::string name = programFileName(p.rank());
    APC_RETURN_IF_ERROR(writeFile(fs::path(dir) / name, bytes));
    files[name] = plan::sha256Hex(bytes);
  }
  nlohmann::json j = {
      {"format_version", kManifestFormatVersion},
      {"model_name", first.model_name()},
      {"model_hash", first.model_hash()},
      {"plan_hash", first.plan_hash()},
      {"mesh",
       {{"shape", std::vector<int64_t>(first.mesh_shape().begin(), first.mesh_shape().end())},
        {"names", std::vector<std::string>(first.mesh_names().begin(), first.mesh_names().end())}}},
      {"world_size", first.world_size()},
      {"files", files}};
  return writeFile(fs::path(dir) / "manifest.json", j.dump(2) + "\n");
}

Expected<Manifest> readManifest(const std::string& dir) {
  fs::path path = fs::path(dir) / "manifest.json";
  APC_ASSIGN_OR_RETURN(std::string text, readFile(path));
  const std::string where = path.string();
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return parseError(where + ": not a JSON object");
  Manifest m;
  try {
    if (!j.contains("format_version") || !j["format_version"].is_number_integer())
      return parseError(where + ": no integer format_version");
    m.format_version = j["format_version"].get<int>();
    if (m.format_version != kManifestFormatVersion)
      return invalidArgument(where + ": format version " + std::to_string(m.format_version) +
                             ", this apc reads version " + std::to_string(kManifestFormatVersion));
    m.model_name = j.at("model_name").get<std::string>();
    m.model_hash = j.at("model_hash").get<std::string>();
    m.plan_hash = j.at("plan_hash").get<std::string>();
    m.mesh_shape = j.at("mesh").at("shape").get<std::vector<int64_t>>();
    m.mesh_names = j.at("mesh").at("names").get<std::vector<std::string>>();
    m.world_size = j.at("world_size").get<int64_t>();
    m.files = j.at("files").get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    return parseError(where + ": " + what.substr(0, what.find('\n')));
  }
  int64_t product = 1;
  for (int64_t s : m.mesh_shape) product *= s;
  if (m.world_size < 1 || product != m.world_size)
    return invalidArgument(where + ": world_size " + std::to_string(m.world_size) +
                           " does not match the mesh");
  for (int64_t r = 0; r < m.world_size; ++r)
    if (!m.files.count(programFileName(r)))
      return invalidArgument(where + ": no entry for " + programFileName(r));
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
  if (plan::sha256Hex(bytes) != it->second)
    return invalidArgument(where +
                           ": SHA-256 mismatch with manifest.json (file truncated or "
                           "edited, " +
                           std::to_string(bytes.size()) + " bytes)");
  proto::Program p;
  if (!p.ParseFromString(bytes)) return parseError(where + ": not a valid program (truncated?)");
  if (p.format_version() != kProgramFormatVersion)
    return invalidArgument(where + ": program format version " +
                           std::to_string(p.format_version()) + ", this apc reads version " +
                           std::to_string(kProgramFormatVersion));
  if (static_cast<int64_t>(p.rank()) != rank ||
      static_cast<int64_t>(p.world_size()) != m.world_size)
    return invalidArgument(where + ": holds rank " + std::to_string(p.rank()) + " of " +
                           std::to_string(p.world_size()) + ", expected rank " +
                           std::to_string(rank) + " of " + std::to_string(m.world_size));
  if (p.model_hash() != m.model_hash || p.plan_hash() != m.plan_hash)
    return invalidArgument(where + ": model or plan hash differs from manifest.json");
  return p;
}

Expected<proto::Program> readProgram(const std::string& dir, int64_t rank) {
  APC_ASSIGN_OR_RETURN(Manifest m, readManifest(dir));
  return readProgram(dir, m, rank);
}

}  // namespace apc::lower
