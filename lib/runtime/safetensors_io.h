//===- lib/runtime/safetensors_io.h - Reading safetensors files by ranges --===//
//
// The safetensors reader that checkpoints (checkpoint.cpp) and training data (data.cpp) share:
// a little-endian u64 header length, the JSON header (per tensor its dtype, shape and byte range
// in the data section), then the raw row-major bytes. A file is opened once (its header parsed
// and checked: known dtypes, every byte range inside the file and of its shape's size); tensors
// are then read whole or as a box (a start and a size per dim) with pread, touching only the
// bytes of the box: a box is a set of contiguous runs of its innermost partial dim.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apc/support/error.h"

namespace apc::runtime::st {

/// safetensors' dtype names ("F32", "BF16", "I64", ...) and back.
Expected<std::string> dtypeName(at::ScalarType t);
std::optional<at::ScalarType> dtypeOf(const std::string& name);

/// One tensor of a safetensors header.
struct Tensor {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte range in the data section
};

/// An opened safetensors file: its header, checked.
struct File {
  std::string path;
  int64_t data_start = 0;  // byte offset of the data section in the file
  std::map<std::string, Tensor> tensors;
};

/// Reads `n` bytes of `fd` at `offset` completely; a short file is an error naming `path`.
Status preadAll(int fd, void* out, size_t n, int64_t offset, const std::string& path);

/// Opens a safetensors file and checks its header. `want_bytes` >= 0: the file must have that size;
/// a non-empty `want_sha`: its SHA-256 (the whole file is read) must be that hex digest. Errors
/// are one line naming the file.
Expected<File> open(const std::string& path, int64_t want_bytes = -1,
                    const std::string& want_sha = "");

/// The SHA-256 (hex) of a whole file, or an error naming it.
Expected<std::string> sha256OfFile(const std::string& path);

/// Reads the box [lo, lo + size) of a row-major array of `shape` with `elem`-byte elements that
/// starts at byte `base` of the open file `fd` into `out` (prod(size) * elem bytes, packed
/// row-major): one pread per contiguous run. Returns the bytes read. Unchecked preconditions:
/// the box lies inside the shape.
Expected<int64_t> readBox(int fd, const std::string& path, int64_t base,
                          const std::vector<int64_t>& shape, size_t elem,
                          const std::vector<int64_t>& lo, const std::vector<int64_t>& size,
                          void* out);

/// The tensor `key` of `f`, whole, or the box [lo, lo + size) of it (contiguous, CPU). An
/// unknown key is an error naming the file.
Expected<at::Tensor> readTensor(const File& f, const std::string& key);
Expected<at::Tensor> readTensorBox(const File& f, const std::string& key,
                                   const std::vector<int64_t>& lo,
                                   const std::vector<int64_t>& size);

/// An owned file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace apc::runtime::st
