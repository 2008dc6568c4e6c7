//===- lib/runtime/safetensors_io.cpp - Reading safetensors files by ranges -===//
//
// See safetensors_io.h. The header is checked before any tensor is read; boxes are read with one
// pread per contiguous run (the dims after the innermost partial dim of the box are whole, so a
// run spans the box's extent on that dim times the elements of the whole dims after it).
//
//===----------------------------------------------------------------------===//
#include "safetensors_io.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "apc/support/file_io.h"
#include "apc/support/hash.h"
#include "apc/support/json_reader.h"

namespace apc::runtime::st {

namespace {

/// The largest safetensors header read (safetensors itself allows 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

const std::vector<std::pair<at::ScalarType, const char*>>& dtypeNames() {
  static const std::vector<std::pair<at::ScalarType, const char*>> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},  {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"}};
  return names;
}

int64_t numelOf(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string errnoText(int err) {
  return std::strerror(err);
}

Expected<Fd> openForReading(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return ioError("cannot read '" + printable(path) + "': " + errnoText(errno));
  return fd;
}

}  // namespace

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

Expected<std::string> dtypeName(at::ScalarType t) {
  for (const auto& [type, name] : dtypeNames())
    if (type == t) return std::string(name);
  return unsupported(std::string("safetensors files here do not store dtype ") + c10::toString(t));
}

std::optional<at::ScalarType> dtypeOf(const std::string& name) {
  for (const auto& [type, n] : dtypeNames())
    if (name == n) return type;
  return std::nullopt;
}

Status preadAll(int fd, void* out, size_t n, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset) + done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ioError(printable(path) + ": read error (" + errnoText(errno) + ")");
    if (r == 0) return parseError(printable(path) + ": ends early (truncated)");
    done += static_cast<size_t>(r);
  }
  return Status::success();
}

Expected<std::string> sha256OfFile(const std::string& path) {
  APC_ASSIGN_OR_RETURN(Fd fd, openForReading(path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return ioError("cannot read '" + printable(path) + "': " + errnoText(errno));
  const int64_t size = static_cast<int64_t>(st.st_size);
  Sha256Stream hash;
  std::vector<char> buf(size_t{1} << 20);
  for (int64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(size - off, buf.size()));
    APC_RETURN_IF_ERROR(preadAll(fd.get(), buf.data(), n, off, path));
    hash.update(std::string_view(buf.data(), n));
    off += static_cast<int64_t>(n);
  }
  return hash.hexDigest();
}

Expected<File> open(const std::string& path, int64_t want_bytes, const std::string& want_sha) {
  using nlohmann::ordered_json;
  APC_RETURN_IF_ERROR(checkRegularFile(path));
  APC_ASSIGN_OR_RETURN(Fd fd, openForReading(path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    return ioError("cannot read '" + printable(path) + "': " + errnoText(errno));
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (want_bytes >= 0 && size != want_bytes)
    return parseError(printable(path) + ": " + std::to_string(size) +
                      " bytes, but the checkpoint's manifest.json says " +
                      std::to_string(want_bytes) + " (truncated or replaced)");
  // The whole file against the manifest's SHA-256: a flipped bit anywhere is an error.
  if (!want_sha.empty()) {
    APC_ASSIGN_OR_RETURN(std::string sha, sha256OfFile(path));
    if (sha != want_sha)
      return parseError(printable(path) +
                        ": content differs from the SHA-256 in the checkpoint's manifest.json "
                        "(damaged or replaced)");
  }
  unsigned char len[8];
  if (size < 8) return parseError(printable(path) + ": not a safetensors file (too short)");
  APC_RETURN_IF_ERROR(preadAll(fd.get(), len, 8, 0, path));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len[i];
  if (header_len > kMaxHeaderBytes || header_len > static_cast<uint64_t>(size - 8))
    return parseError(printable(path) + ": safetensors header length " +
                      std::to_string(header_len) + " exceeds the file");
  std::string text(header_len, '\0');
  APC_RETURN_IF_ERROR(preadAll(fd.get(), text.data(), text.size(), 8, path));
  auto parsed = parseOrderedJsonText(text);
  if (!parsed.ok())
    return parseError(printable(path) + ": safetensors header: " + parsed.error().message());
  const ordered_json& h = *parsed;
  if (!h.is_object())
    return parseError(printable(path) + ": safetensors header is not a JSON object");
  File f;
  f.path = path;
  f.data_start = 8 + static_cast<int64_t>(header_len);
  const int64_t data_bytes = size - f.data_start;
  for (const auto& [key, v] : h.items()) {
    if (key == "__metadata__") continue;
    const std::string& name = key;  // clang 14 cannot capture a structured binding
    auto bad = [&](const std::string& why) {
      return parseError(printable(path) + ": tensor '" + printable(name) + "': " + why);
    };
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      return bad("needs dtype, shape and data_offsets");
    Tensor t;
    std::optional<at::ScalarType> dt = dtypeOf(v["dtype"].get<std::string>());
    if (!dt) return bad("unknown dtype " + printable(v["dtype"].get<std::string>()));
    t.dtype = *dt;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad("bad shape");
      t.shape.push_back(d.get<int64_t>());
    }
    if (!v["data_offsets"][0].is_number_integer() || !v["data_offsets"][1].is_number_integer())
      return bad("bad data_offsets");
    t.begin = v["data_offsets"][0].get<int64_t>();
    t.end = v["data_offsets"][1].get<int64_t>();
    const int64_t want = numelOf(t.shape) * static_cast<int64_t>(c10::elementSize(t.dtype));
    if (t.begin < 0 || t.end > data_bytes || t.end - t.begin != want)
      return bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                 ") do not hold its " + std::to_string(want) + " bytes inside the file");
    f.tensors[key] = std::move(t);
  }
  return f;
}

Expected<int64_t> readBox(int fd, const std::string& path, int64_t base,
                          const std::vector<int64_t>& shape, size_t elem,
                          const std::vector<int64_t>& lo, const std::vector<int64_t>& size,
                          void* out) {
  const size_t ndim = shape.size();
  if (numelOf(size) == 0) return int64_t{0};
  if (ndim == 0) {
    APC_RETURN_IF_ERROR(preadAll(fd, out, elem, base, path));
    return static_cast<int64_t>(elem);
  }
  // k: the innermost dim the box does not cover whole (0 when it covers every dim after 0).
  size_t k = ndim - 1;
  while (k > 0 && lo[k] == 0 && size[k] == shape[k]) --k;
  std::vector<int64_t> stride(ndim, 1);
  for (size_t d = ndim - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  const size_t run = static_cast<size_t>(size[k] * stride[k]) * elem;
  std::vector<int64_t> idx(k, 0);  // position in the box's dims before k
  char* dst = static_cast<char*>(out);
  int64_t bytes = 0;
  while (true) {
    int64_t off = lo[k] * stride[k];
    for (size_t d = 0; d < k; ++d) off += (lo[d] + idx[d]) * stride[d];
    APC_RETURN_IF_ERROR(preadAll(fd, dst, run, base + off * static_cast<int64_t>(elem), path));
    dst += run;
    bytes += static_cast<int64_t>(run);
    size_t d = k;
    while (d > 0 && ++idx[d - 1] == size[d - 1]) idx[--d] = 0;
    if (d == 0) break;
  }
  return bytes;
}

Expected<at::Tensor> readTensorBox(const File& f, const std::string& key,
                                   const std::vector<int64_t>& lo,
                                   const std::vector<int64_t>& size) {
  auto it = f.tensors.find(key);
  if (it == f.tensors.end())
    return parseError(printable(f.path) + ": no tensor '" + printable(key) +
                      "', which the checkpoint's manifest.json places there");
  const Tensor& t = it->second;
  at::Tensor out = at::empty(size, at::TensorOptions().dtype(t.dtype));
  APC_ASSIGN_OR_RETURN(Fd fd, openForReading(f.path));
  APC_ASSIGN_OR_RETURN(int64_t bytes,
                       readBox(fd.get(), f.path, f.data_start + t.begin, t.shape,
                               c10::elementSize(t.dtype), lo, size, out.mutable_data_ptr()));
  (void)bytes;
  return out;
}

Expected<at::Tensor> readTensor(const File& f, const std::string& key) {
  auto it = f.tensors.find(key);
  if (it == f.tensors.end()) return readTensorBox(f, key, {}, {});  // the error
  return readTensorBox(f, key, std::vector<int64_t>(it->second.shape.size(), 0), it->second.shape);
}

}  // namespace apc::runtime::st
