//===- lib/frontend/pt2_archive.h - Reading torch.export archives ----------===//
//
// A thin layer over LibTorch's zip reader (caffe2::serialize::PyTorchStreamReader, which reads
// the layout torch.export.save writes and strips its top folder) that turns its exceptions into
// one-line errors, plus the names of the records apc reads. Private to lib/frontend.
//
// Records are bounded before they are inflated: the reader allocates a record's declared size at
// once, so a size is checked first (JSON and text records at most kMaxInputFileBytes, any record
// at most what deflate can expand the archive's bytes to), and JSON records get the pre-scan of
// every apc JSON reader (checkJsonText: no NUL byte, at most 64 levels of nesting).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include <c10/core/Allocator.h>
#include <nlohmann/json.hpp>

#include "apc/support/error.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace apc::frontend {

// Record names (torch/csrc/export/pt2_archive_constants.h), for the default model name "model".
inline constexpr const char* kArchiveFormatRecord = "archive_format";
inline constexpr const char* kModelJsonRecord = "models/model.json";
inline constexpr const char* kWeightsConfigRecord = "data/weights/model_weights_config.json";
inline constexpr const char* kConstantsConfigRecord = "data/constants/model_constants_config.json";
inline constexpr const char* kWeightsDir = "data/weights/";
inline constexpr const char* kConstantsDir = "data/constants/";
inline constexpr const char* kByteOrderRecord = "byteorder";

/// The member `key` of a JSON object, or a null value when `j` is not an object or has no such
/// member (the archive's JSON records are read field by field, each checked where it is used).
const nlohmann::json& member(const nlohmann::json& j, const std::string& key);

/// The storage identity of a weights/constants payload entry (PayloadMeta JSON): its record,
/// dtype, sizes, strides and storage offset. Tied parameters (saved once, under several names)
/// have the same identity. Empty for pickled or malformed entries.
std::string payloadIdentity(const nlohmann::json& payload_meta);

/// "'path' does not exist" (kNotFound) / "is a directory" (kInvalidArgument) / checkRegularFile's
/// error for a FIFO, socket or device, or success.
Status checkModelPath(const std::string& path);

/// The most a deflated record can expand its stored bytes (deflate's limit is 1032:1): a record
/// that declares more inflated bytes than this times the archive's size is not a real record.
inline constexpr uint64_t kMaxDeflateRatio = 1032;

class Pt2Archive {
 public:
  /// Opens the zip at `path`. Errors: checkModelPath's, and kParse for a file that is not a
  /// readable zip (not an archive, truncated).
  static Expected<Pt2Archive> open(const std::string& path);

  const std::string& path() const { return path_; }
  bool has(const std::string& record) const;
  /// True when the `archive_format` record reads "pt2" or the archive has models/model.json.
  bool isExportedProgram() const;
  /// A record's bytes (kParse when missing, corrupt, or unreadable; kInvalidArgument when its
  /// declared size is over `max_bytes` or over kMaxDeflateRatio times the archive's size).
  Expected<std::pair<at::DataPtr, size_t>> bytes(const std::string& record,
                                                 uint64_t max_bytes = UINT64_MAX) const;
  /// A text record, at most kMaxInputFileBytes.
  Expected<std::string> text(const std::string& record) const;
  /// A JSON record, at most kMaxInputFileBytes (kParse when malformed, nested deeper than
  /// kMaxJsonDepth or holding a NUL byte, naming the record).
  Expected<nlohmann::json> json(const std::string& record) const;

 private:
  std::string path_;
  uint64_t file_size_ = 0;
  std::shared_ptr<caffe2::serialize::PyTorchStreamReader> reader_;
};

}  // namespace apc::frontend
