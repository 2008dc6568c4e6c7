//===- lib/frontend/pt2_archive.cpp - Reading torch.export archives --------===//
#include "pt2_archive.h"

#include <filesystem>

#include <caffe2/serialize/inline_container.h>

#include "apc/support/activity.h"
#include "apc/support/file_io.h"
#include "apc/support/json_reader.h"
#include "apc/support/strings.h"
#include "torch_types.h"

namespace apc::frontend {

const nlohmann::json& member(const nlohmann::json& j, const std::string& key) {
  static const nlohmann::json null_json;
  if (!j.is_object()) return null_json;
  auto it = j.find(key);
  return it == j.end() ? null_json : *it;
}

std::string payloadIdentity(const nlohmann::json& meta) {
  if (!meta.is_object() || meta.value("use_pickle", false)) return "";
  auto path = meta.find("path_name");
  auto tm = meta.find("tensor_meta");
  if (path == meta.end() || !path->is_string() || tm == meta.end() || !tm->is_object()) return "";
  nlohmann::json key = {
      *path, tm->value("dtype", nlohmann::json()), tm->value("sizes", nlohmann::json()),
      tm->value("strides", nlohmann::json()), tm->value("storage_offset", nlohmann::json())};
  return key.dump();
}

Status checkModelPath(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return notFound("model file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec))
    return invalidArgument("model path '" + path + "' is a directory, not a model archive");
  return checkRegularFile(path);  // a FIFO or a device: the zip reader would block or misread
}

Expected<Pt2Archive> Pt2Archive::open(const std::string& path) {
  APC_RETURN_IF_ERROR(checkModelPath(path));
  Pt2Archive a;
  a.path_ = path;
  std::error_code ec;
  a.file_size_ = std::filesystem::file_size(path, ec);
  if (ec) return ioError("cannot read '" + path + "': " + ec.message());
  try {
    a.reader_ = std::make_shared<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return parseError("'" + path + "' is not a readable model archive (" + torchErrorLine(e) + ")");
  }
  return a;
}

bool Pt2Archive::has(const std::string& record) const {
  try {
    return reader_->hasRecord(record);
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return false;
  }
}

bool Pt2Archive::isExportedProgram() const {
  if (has(kArchiveFormatRecord)) {
    auto t = text(kArchiveFormatRecord);
    if (t.ok() && trim(*t) == "pt2") return true;
  }
  return has(kModelJsonRecord);
}

Expected<std::pair<at::DataPtr, size_t>> Pt2Archive::bytes(const std::string& record,
                                                           uint64_t max_bytes) const {
  if (!has(record)) return parseError("'" + path_ + "' has no record " + record);
  try {
    // getRecord allocates the declared size before inflating: check it first.
    const uint64_t declared = reader_->getRecordSize(record);
    const uint64_t deflate_bound =
        file_size_ > UINT64_MAX / kMaxDeflateRatio ? UINT64_MAX : file_size_ * kMaxDeflateRatio;
    if (declared > max_bytes)
      return invalidArgument("'" + path_ + "': " + record + " declares " +
                             std::to_string(declared) + " bytes, more than the " +
                             byteSizeText(max_bytes) + " apc reads of such a record");
    if (declared > deflate_bound)
      return invalidArgument("'" + path_ + "': " + record + " declares " +
                             std::to_string(declared) + " bytes, more than deflate can expand a " +
                             std::to_string(file_size_) + "-byte archive to");
    auto [data, size] = reader_->getRecord(record);
    return std::make_pair(std::move(data), size);
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return parseError("'" + path_ + "': cannot read " + record + " (" + torchErrorLine(e) + ")");
  }
}

Expected<std::string> Pt2Archive::text(const std::string& record) const {
  APC_ASSIGN_OR_RETURN(auto b, bytes(record, kMaxInputFileBytes));
  return std::string(static_cast<const char*>(b.first.get()), b.second);
}

Expected<nlohmann::json> Pt2Archive::json(const std::string& record) const {
  APC_ASSIGN_OR_RETURN(std::string t, text(record));
  // Nesting is checked before parsing: the importer walks the records recursively.
  if (Status s = checkJsonText(t); !s.ok())
    return s.error().withContext("'" + path_ + "': " + record);
  auto j = parseJsonText(t);
  if (!j.ok())
    return parseError("'" + path_ + "': " + record + " is not valid JSON: " + j.error().message());
  return j;
}

}  // namespace apc::frontend
