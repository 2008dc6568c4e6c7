//===- lib/runtime/data.cpp - Training batches read from a file, per rank ---===//
//
// See apc/runtime/data.h. A rank's piece of the batch is layout::localPiece of the batch's shape
// under the input's placement (the cut ParallelModule::shardInput makes of a full input); the rows
// of the piece are read with one pread each (safetensors_io.h's readBox: a row's piece is a set of
// contiguous runs), the targets of the same rows likewise, then gathered over the ranks.
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "apc/layout/layout.h"
#include "apc/runtime/redistribute.h"
#include "apc/support/file_io.h"
#include "apc/support/hash.h"
#include "safetensors_io.h"

namespace apc::runtime {

namespace data_internal {

/// The type of one id in a flat token file (outside the anonymous namespace: DataSource::Impl
/// holds one).
struct TokenType {
  const char* name;
  size_t bytes;
  bool is_signed;
};

}  // namespace data_internal

namespace {

using data_internal::TokenType;

constexpr TokenType kTokenTypes[] = {
    {"uint16", 2, false}, {"uint32", 4, false}, {"int32", 4, true}, {"int64", 8, true}};

/// The seed of a step's row selection.
uint64_t mixSeed(uint64_t seed, uint64_t step) {
  return mixSeeds(seed, step, 0x5DA7A);
}

/// `count` ids of `type` at `src` as int64.
void idsToLong(const char* src, int64_t count, const TokenType& type, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    const char* p = src + static_cast<size_t>(i) * type.bytes;
    if (type.bytes == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      out[i] = v;
    } else if (type.bytes == 4 && type.is_signed) {
      int32_t v;
      std::memcpy(&v, p, 4);
      out[i] = v;
    } else if (type.bytes == 4) {
      uint32_t v;
      std::memcpy(&v, p, 4);
      out[i] = v;
    } else {
      int64_t v;
      std::memcpy(&v, p, 8);
      out[i] = v;
    }
  }
}

/// The first element of an integer tensor outside [0, bound): its flat index and value.
std::optional<std::pair<int64_t, int64_t>> firstOutOfRange(const at::Tensor& ids, int64_t bound) {
  at::Tensor flat = ids.to(at::kLong).contiguous().reshape({-1});
  at::Tensor bad = flat.lt(0).logical_or(flat.ge(bound)).nonzero();
  if (bad.numel() == 0) return std::nullopt;
  const int64_t i = bad[0][0].item<int64_t>();
  return std::make_pair(i, flat[i].item<int64_t>());
}

std::string shapeText(const std::vector<int64_t>& s) {
  return c10::str(at::IntArrayRef(s));
}

/// The batch's targets placement: the input's shards of dim 0 (rows), replicated elsewhere.
mesh::PlacementTuple rowPlacement(const mesh::PlacementTuple& input) {
  mesh::PlacementTuple out;
  for (const mesh::Placement& p : input)
    out.push_back(p.isShard(0) ? mesh::Placement::shard(0) : mesh::Placement::replicate());
  return out;
}

constexpr int64_t kMaxMessage = 400;

}  // namespace

struct DataSource::Impl {
  ParallelModule* pm = nullptr;
  std::string path;
  DataOptions options;
  int64_t batch = 0;  // B
  int64_t bytes_read = 0;
  st::Fd fd{-1};
  // Token files.
  bool tokens = true;
  data_internal::TokenType type{"uint16", 2, false};
  int64_t n_tokens = 0;
  int64_t seq = 0;    // T
  int64_t bound = 0;  // ids below this (the embedding's rows and the logits' V)
  // Tensor files.
  st::File file;
  std::string target_key;
  int64_t rows = 0;
  int64_t input_bound = 0;  // integer inputs: below this (0: floating inputs)
  int64_t classes = 0;      // integer targets: below this (0: floating targets)

  const PlacedTensor& input() const { return pm->inputSpecs()[0]; }
  std::vector<int64_t> coordinate() const { return pm->mesh().coordinate(pm->rank()); }

  at::Tensor drawRows(int64_t step, int64_t count) const {
    at::Generator g =
        at::detail::createCPUGenerator(mixSeed(options.seed, static_cast<uint64_t>(step)));
    return at::randint(0, count, {batch}, g, at::kLong);
  }

  /// Every rank's error (the first failing rank's line) or success; collective.
  Status agree(const std::string& local) {
    if (pm->worldSize() == 1) return local.empty() ? Status::success() : invalidArgument(local);
    at::Tensor t = at::zeros({pm->worldSize(), kMaxMessage}, at::kLong);
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(local.size()), kMaxMessage);
    for (int64_t i = 0; i < n; ++i)
      t[pm->rank()][i] = static_cast<unsigned char>(local[static_cast<size_t>(i)]);
    at::Tensor d = t.to(pm->device());
    pm->world().all().allReduce(d, mesh::ReduceOp::kSum);
    t = d.to(at::kCPU);
    auto acc = t.accessor<int64_t, 2>();
    for (int64_t r = 0; r < pm->worldSize(); ++r) {
      if (acc[r][0] == 0) continue;
      std::string m;
      for (int64_t i = 0; i < kMaxMessage && acc[r][i] != 0; ++i) m += static_cast<char>(acc[r][i]);
      return invalidArgument(m);
    }
    return Status::success();
  }

  /// Windows [rows piece] x [cols piece + 1] of the token file (int64), the bad-id line or "".
  at::Tensor readWindows(const at::Tensor& starts, layout::DimPiece rows, layout::DimPiece cols,
                         std::string* bad, int64_t* bytes) {
    at::Tensor win = at::empty({rows.size, cols.size + 1}, at::kLong);
    if (cols.size == 0 || rows.size == 0) return win;
    std::vector<char> buf(static_cast<size_t>(cols.size + 1) * type.bytes);
    int64_t* out = win.data_ptr<int64_t>();
    const int64_t* first = starts.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < rows.size; ++i) {
      auto read = st::readBox(fd.get(), path, 0, {n_tokens}, type.bytes,
                              {first[rows.offset + i] + cols.offset}, {cols.size + 1}, buf.data());
      if (!read.ok()) {
        *bad = read.error().message();
        return win;
      }
      *bytes += *read;
      idsToLong(buf.data(), cols.size + 1, type, out + i * (cols.size + 1));
    }
    if (auto oor = firstOutOfRange(win, bound)) {
      const int64_t row = oor->first / (cols.size + 1), col = oor->first % (cols.size + 1);
      *bad = printable(path) + ": token id " + std::to_string(oor->second) + " (token " +
             std::to_string(first[rows.offset + row] + cols.offset + col) +
             " of the file) is not below the " + std::to_string(bound) +
             " rows of the embedding it indexes (ids of another vocabulary, or not --data-dtype " +
             type.name + "?)";
    }
    return win;
  }

  /// Rows `idx[rows]` of tensor `key` of the tensor file, each its box `piece[1:]`.
  at::Tensor readRows(const std::string& key, const at::Tensor& idx,
                      const std::vector<layout::DimPiece>& piece, std::string* bad,
                      int64_t* bytes) {
    const st::Tensor& t = file.tensors.at(key);
    std::vector<int64_t> sizes;
    for (const layout::DimPiece& d : piece) sizes.push_back(d.size);
    at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(t.dtype));
    if (out.numel() == 0) return out;
    const int64_t row_bytes = static_cast<int64_t>(out.nbytes()) / sizes[0];
    char* dst = static_cast<char*>(out.mutable_data_ptr());
    std::vector<int64_t> lo, size;
    for (const layout::DimPiece& d : piece) {
      lo.push_back(d.offset);
      size.push_back(d.size);
    }
    size[0] = 1;
    const int64_t* rows_at = idx.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < piece[0].size; ++i) {
      lo[0] = rows_at[piece[0].offset + i];
      auto read = st::readBox(fd.get(), path, file.data_start + t.begin, t.shape,
                              c10::elementSize(t.dtype), lo, size, dst + i * row_bytes);
      if (!read.ok()) {
        *bad = read.error().message();
        return out;
      }
      *bytes += *read;
    }
    return out;
  }

  /// The rows' out-of-range line for the tensor file ("" when none).
  std::string checkRows(const std::string& key, const at::Tensor& x, const at::Tensor& idx,
                        int64_t offset, int64_t limit, const char* what) const {
    if (limit <= 0 || x.numel() == 0) return "";
    auto oor = firstOutOfRange(x, limit);
    if (!oor) return "";
    const int64_t per_row = x.numel() / x.size(0);
    const int64_t row = idx[offset + oor->first / per_row].item<int64_t>();
    return printable(path) + ": " + key + " row " + std::to_string(row) + " holds " +
           std::to_string(oor->second) + ", not below " + std::to_string(limit) + " (" + what + ")";
  }

  /// The batch of `step`: this rank's piece (full = false: collective) or all of it.
  Expected<Batch> read(int64_t step, bool full) {
    const PlacedTensor& in = input();
    const c10::Device device = pm->device();
    Batch b;
    std::string bad;
    int64_t bytes = 0;
    if (tokens) {
      const at::Tensor starts = drawRows(step, n_tokens - seq);
      const std::vector<int64_t> shape = {batch, seq};
      std::vector<layout::DimPiece> piece = {{0, batch}, {0, seq}};
      if (!full) piece = layout::localPiece(shape, in.placement, pm->mesh(), coordinate());
      at::Tensor win = readWindows(starts, piece[0], piece[1], &bad, &bytes);
      if (full && !bad.empty()) return invalidArgument(bad);
      if (!full) APC_RETURN_IF_ERROR(agree(bad));
      b.inputs.emplace_back(win.narrow(1, 0, piece[1].size).to(device, in.storage_dtype));
      at::Tensor targets = win.narrow(1, 1, piece[1].size).contiguous().to(device);
      b.targets = full ? targets : gatherTensor(targets, in.placement, shape, pm->world());
    } else {
      const at::Tensor idx = drawRows(step, rows);
      std::vector<int64_t> shape = file.tensors.at("inputs").shape;
      shape[0] = batch;
      std::vector<layout::DimPiece> piece;
      for (int64_t s : shape) piece.push_back({0, s});
      if (!full) piece = layout::localPiece(shape, in.placement, pm->mesh(), coordinate());
      at::Tensor x = readRows("inputs", idx, piece, &bad, &bytes);
      if (bad.empty())
        bad = checkRows("inputs", x, idx, piece[0].offset, input_bound,
                        "the rows of the embedding the input indexes");
      std::vector<int64_t> tshape = file.tensors.at(target_key).shape;
      tshape[0] = batch;
      const mesh::PlacementTuple tplace = rowPlacement(in.placement);
      std::vector<layout::DimPiece> tpiece;
      for (int64_t s : tshape) tpiece.push_back({0, s});
      if (!full) tpiece = layout::localPiece(tshape, tplace, pm->mesh(), coordinate());
      at::Tensor y;
      if (bad.empty()) y = readRows(target_key, idx, tpiece, &bad, &bytes);
      if (bad.empty())
        bad = checkRows(target_key, y, idx, tpiece[0].offset, classes,
                        "the classes of the output's last dim");
      if (full && !bad.empty()) return invalidArgument(bad);
      if (!full) APC_RETURN_IF_ERROR(agree(bad));
      b.inputs.emplace_back(x.to(device, in.storage_dtype));
      if (classes > 0) y = y.to(at::kLong);
      y = y.to(device);
      b.targets = full ? y : gatherTensor(y, tplace, tshape, pm->world());
    }
    if (!full) bytes_read += bytes;
    return b;
  }
};

DataSource::DataSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataSource::~DataSource() = default;

bool isTensorDataFile(const std::string& path) {
  const std::string ext = ".safetensors";
  return path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
}

Expected<std::unique_ptr<DataSource>> DataSource::open(ParallelModule& pm, const std::string& path,
                                                       const DataOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->pm = &pm;
  impl->path = path;
  impl->options = options;
  const std::string p = printable(path);
  const auto& inputs = pm.inputSpecs();
  if (inputs.size() != 1)
    return invalidArgument(p + ": a data file feeds one input, the artifact takes " +
                           std::to_string(inputs.size()));
  const PlacedTensor& in = inputs[0];
  if (in.global_shape.empty())
    return invalidArgument(p + ": the artifact's input " + in.name + " is a scalar (no batch dim)");
  impl->batch = options.batch > 0 ? options.batch : in.global_shape[0];
  const auto& outputs = pm.outputSpecs();
  if (outputs.empty()) return invalidArgument(p + ": the artifact has no output to train");
  const PlacedTensor& out = outputs[0];
  const bool float_out = at::isFloatingType(out.dtype);
  APC_RETURN_IF_ERROR(checkRegularFile(path));
  impl->fd = st::Fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (impl->fd.get() < 0)
    return ioError("cannot read '" + p + "': " + std::string(std::strerror(errno)));

  if (!isTensorDataFile(path)) {
    const TokenType* type = nullptr;
    for (const TokenType& t : kTokenTypes)
      if (options.token_dtype == t.name) type = &t;
    if (!type)
      return invalidArgument("token dtype must be uint16, uint32, int32 or int64, got '" +
                             printable(options.token_dtype) + "'");
    impl->type = *type;
    if (at::isFloatingType(in.dtype) || in.global_shape.size() != 2)
      return invalidArgument(p + ": a token file feeds one integer input [B, T]; the artifact's " +
                             in.name + " is " + c10::toString(in.dtype) +
                             shapeText(in.global_shape) +
                             " (a tensor file, .safetensors, feeds other inputs)");
    impl->seq = in.global_shape[1];
    if (!float_out || out.global_shape.size() != 3 || out.global_shape[1] != impl->seq)
      return invalidArgument(p + ": a token file trains next-token logits [B, T, V]; the " +
                             "artifact's first output is " + c10::toString(out.dtype) +
                             shapeText(out.global_shape));
    struct stat st {};
    if (::fstat(impl->fd.get(), &st) != 0)
      return ioError("cannot read '" + p + "': " + std::string(std::strerror(errno)));
    const int64_t size = static_cast<int64_t>(st.st_size);
    if (size % static_cast<int64_t>(type->bytes) != 0)
      return invalidArgument(p + ": " + std::to_string(size) + " bytes is not a whole number of " +
                             type->name + " token ids (" + std::to_string(type->bytes) +
                             " bytes each; see the token dtype flag)");
    impl->n_tokens = size / static_cast<int64_t>(type->bytes);
    if (impl->n_tokens < impl->seq + 1)
      return invalidArgument(
          p + ": " + std::to_string(impl->n_tokens) + " " + type->name +
          " token ids, too few for one window of " + std::to_string(impl->seq + 1) +
          " (the input's T = " + std::to_string(impl->seq) + ", plus the next token)");
    impl->bound = std::min(pm.inputIndexBound(0), out.global_shape[2]);
    impl->tokens = true;
    return std::unique_ptr<DataSource>(new DataSource(std::move(impl)));
  }

  impl->tokens = false;
  APC_ASSIGN_OR_RETURN(impl->file, st::open(path));
  const auto& tensors = impl->file.tensors;
  std::string names;
  for (const auto& [name, t] : tensors) names += (names.empty() ? "" : ", ") + name;
  if (names.empty()) names = "none";
  for (const char* key : {"targets", "labels"})
    if (tensors.count(key)) {
      impl->target_key = key;
      break;
    }
  if (!tensors.count("inputs") || impl->target_key.empty())
    return invalidArgument(p +
                           ": a tensor data file needs tensors \"inputs\" and \"targets\" (or " +
                           "\"labels\"); it has " + names);
  const st::Tensor& x = tensors.at("inputs");
  const st::Tensor& y = tensors.at(impl->target_key);
  const std::vector<int64_t> row_shape(in.global_shape.begin() + 1, in.global_shape.end());
  if (x.shape.size() != in.global_shape.size() ||
      std::vector<int64_t>(x.shape.begin() + 1, x.shape.end()) != row_shape)
    return invalidArgument(p + ": inputs is " + shapeText(x.shape) + ", the artifact's input " +
                           in.name + " " + shapeText(in.global_shape) + " takes rows of " +
                           shapeText(row_shape));
  if (at::isFloatingType(in.dtype) != at::isFloatingType(x.dtype))
    return invalidArgument(p + ": inputs is " + c10::toString(x.dtype) + ", the artifact's input " +
                           in.name + " is " + c10::toString(in.dtype));
  if (!at::isFloatingType(in.dtype)) impl->input_bound = pm.inputIndexBound(0);
  impl->rows = x.shape[0];
  if (impl->rows == 0) return invalidArgument(p + ": inputs has no rows");
  if (y.shape.empty() || y.shape[0] != impl->rows)
    return invalidArgument(p + ": " + impl->target_key + " is " + shapeText(y.shape) +
                           ", one row per row of inputs " + shapeText(x.shape) + " expected");
  const std::vector<int64_t> target_rows(y.shape.begin() + 1, y.shape.end());
  const std::vector<int64_t> out_rows(
      out.global_shape.begin() + std::min<size_t>(1, out.global_shape.size()),
      out.global_shape.end());
  if (!float_out || out.global_shape.empty())
    return invalidArgument(p + ": the artifact's first output is " + c10::toString(out.dtype) +
                           shapeText(out.global_shape) + ", not a batch of floating values");
  if (at::isFloatingType(y.dtype)) {
    if (target_rows != out_rows)
      return invalidArgument(p + ": " + impl->target_key + " is " + shapeText(y.shape) +
                             ", the artifact's first output has rows of " + shapeText(out_rows));
  } else {
    if (out_rows.empty() ||
        target_rows != std::vector<int64_t>(out_rows.begin(), out_rows.end() - 1))
      return invalidArgument(p + ": " + impl->target_key + " holds class ids " +
                             shapeText(y.shape) + "; the artifact's first output " +
                             shapeText(out.global_shape) +
                             " takes one id per position of its dims but the last");
    impl->classes = out.global_shape.back();
  }
  return std::unique_ptr<DataSource>(new DataSource(std::move(impl)));
}

Expected<Batch> DataSource::batch(int64_t step) {
  return impl_->read(step, /*full=*/false);
}

Expected<Batch> DataSource::fullBatch(int64_t step) {
  return impl_->read(step, /*full=*/true);
}

std::string DataSource::describe() const {
  const Impl& i = *impl_;
  if (i.tokens)
    return i.path + ": " + std::to_string(i.n_tokens) + " " + i.type.name +
           " token ids, batches of " + std::to_string(i.batch) + " windows of " +
           std::to_string(i.seq + 1) + " tokens";
  return i.path + ": " + std::to_string(i.rows) + " rows of inputs and " + i.target_key +
         ", batches of " + std::to_string(i.batch);
}

int64_t DataSource::bytesRead() const {
  return impl_->bytes_read;
}

at::Tensor dataLoss(const at::Tensor& output, const at::Tensor& targets) {
  const at::Tensor t = targets.to(output.device());
  if (at::isFloatingType(t.scalar_type()))
    return (output - t.to(output.scalar_type())).pow(2).mean();
  const int64_t classes = output.size(-1);
  return at::cross_entropy_loss(output.reshape({-1, classes}), t.reshape({-1}).to(at::kLong));
}

}  // namespace apc::runtime
