//===- lib/runtime/checkpoint.cpp - Sharded checkpoints: save, find, load ---===//
//
// The format and its guarantees are in apc/runtime/checkpoint.h. Here:
//  - the safetensors writer (a u64 little-endian header length, the JSON header padded with
//    spaces to a multiple of 8 bytes as safetensors writes it, the tensors' bytes packed in header
//    order) with POSIX writes: temporary name, fsync, rename, fsync of the directory (the reader is
//    safetensors_io.h, shared with training data);
//  - the manifest, which rank 0 builds from the program's placements alone (every rank's piece is
//    layout::localPiece of its coordinate), plus each file's size and SHA-256 that the ranks
//    exchange in one all-reduce;
//  - loading by regions: a rank's shard is filled from every saved piece that overlaps it (box
//    intersections, and only the intersection's bytes are read), and the elements copied must be
//    exactly the shard's; each file's SHA-256 is checked by one rank.
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "apc/layout/layout.h"
#include "apc/runtime/interpreter.h"
#include "apc/support/activity.h"
#include "apc/support/file_io.h"
#include "apc/support/hash.h"
#include "apc/support/json_reader.h"
#include "safetensors_io.h"

namespace apc::runtime {

namespace {
namespace ckpt {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

constexpr const char* kFormat = "apc-checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kManifest = "manifest.json";

std::string errnoText(int err) {
  return std::strerror(err);
}

std::string rankFileName(int64_t rank) {
  return "rank_" + std::to_string(rank) + ".safetensors";
}

std::string optimizerKey(const std::string& state, const std::string& param) {
  return "optimizer/" + state + "/" + param;
}

int64_t numelOf(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// --- files ---------------------------------------------------------------------------------------

/// Makes the entries of directory `path` (renames into it) durable; "" is the current directory
/// (the parent of a bare file name such as `-o model.safetensors`).
Status syncDirectory(const std::string& path) {
  const std::string dir = path.empty() ? std::string(".") : path;
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ioError(printable(dir) + ": cannot open to sync (" + errnoText(errno) + ")");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL)
    return ioError(printable(dir) + ": cannot sync (" + errnoText(err) + ")");
  return Status::success();
}

/// A file written through a temporary beside it: write() appends and hashes, commit() syncs,
/// renames it over the target and syncs the directory. Destroyed uncommitted: the temporary is
/// removed.
class AtomicWriter {
 public:
  static Expected<AtomicWriter> open(const std::string& path) {
    AtomicWriter w;
    w.target_ = path;
    const fs::path p(path);
    w.temp_ = (p.parent_path() / ("." + p.filename().string() + ".tmp")).string();
    w.fd_ = ::open(w.temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (w.fd_ < 0)
      return ioError(printable(path) + ": cannot open for writing (" + errnoText(errno) + ")");
    return w;
  }
  AtomicWriter(AtomicWriter&& o) noexcept
      : target_(std::move(o.target_)),
        temp_(std::exchange(o.temp_, {})),
        fd_(std::exchange(o.fd_, -1)),
        bytes_(o.bytes_),
        hash_(std::move(o.hash_)) {}
  AtomicWriter& operator=(AtomicWriter&&) = delete;
  AtomicWriter(const AtomicWriter&) = delete;
  AtomicWriter& operator=(const AtomicWriter&) = delete;
  ~AtomicWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!temp_.empty()) ::unlink(temp_.c_str());
  }

  Status write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    hash_.update(std::string_view(p, n));
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd_, p + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        return ioError(printable(target_) + ": write failed (" + errnoText(w < 0 ? errno : ENOSPC) +
                       ")");
      done += static_cast<size_t>(w);
    }
    bytes_ += static_cast<int64_t>(n);
    return Status::success();
  }

  /// Syncs, closes, renames over the target, syncs the directory; returns the SHA-256 hex.
  Expected<std::string> commit() {
    if (::fsync(fd_) != 0 && errno != EINVAL)
      return ioError(printable(target_) + ": write failed (" + errnoText(errno) + ")");
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return ioError(printable(target_) + ": write failed (" + errnoText(errno) + ")");
    if (::rename(temp_.c_str(), target_.c_str()) != 0)
      return ioError(printable(target_) + ": cannot rename into place (" + errnoText(errno) + ")");
    temp_.clear();
    APC_RETURN_IF_ERROR(syncDirectory(fs::path(target_).parent_path().string()));
    return hash_.hexDigest();
  }
  int64_t bytes() const { return bytes_; }

 private:
  AtomicWriter() = default;
  std::string target_, temp_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  Sha256Stream hash_;
};

struct Entry {
  std::string key;
  at::Tensor tensor;  // CPU, contiguous
};

/// Writes a safetensors file; returns its size and SHA-256.
Expected<std::pair<int64_t, std::string>> writeSafetensors(
    const std::string& path, const std::vector<Entry>& entries,
    const std::map<std::string, std::string>& metadata) {
  ordered_json header = ordered_json::object();
  header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const Entry& e : entries) {
    APC_ASSIGN_OR_RETURN(std::string dtype, st::dtypeName(e.tensor.scalar_type()));
    const int64_t n = static_cast<int64_t>(e.tensor.nbytes());
    header[e.key] = {{"dtype", dtype},
                     {"shape", e.tensor.sizes().vec()},
                     {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
  APC_ASSIGN_OR_RETURN(AtomicWriter w, AtomicWriter::open(path));
  APC_RETURN_IF_ERROR(w.write(len, sizeof len));
  APC_RETURN_IF_ERROR(w.write(text.data(), text.size()));
  for (const Entry& e : entries)
    APC_RETURN_IF_ERROR(w.write(e.tensor.const_data_ptr(), e.tensor.nbytes()));
  const int64_t bytes = w.bytes();
  APC_ASSIGN_OR_RETURN(std::string sha, w.commit());
  return std::make_pair(bytes, sha);
}

// --- collectives ---------------------------------------------------------------------------------

/// All-reduces (sum) `t` over the world; a failed collective is an error.
Status sumOverWorld(ParallelModule& pm, at::Tensor& t, const std::string& what) {
  if (pm.worldSize() == 1) return Status::success();
  try {
    pm.world().all().allReduce(t, mesh::ReduceOp::kSum);
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return ioError(what + ": " + firstLine(e.what()));
  }
  return Status::success();
}

/// Longest error message a rank hands to the others.
constexpr int64_t kMaxMessage = 480;

/// Every rank's outcome: this rank's error when it failed, else the error of the first rank that
/// did (its message, so that every rank prints the line naming the file), else success.
/// Collective: one all-reduce of [failed, code, message bytes] per rank.
Status agree(ParallelModule& pm, const Status& local, const std::string& what) {
  at::Tensor t = at::zeros({pm.worldSize(), 2 + kMaxMessage}, at::kLong);
  if (!local.ok()) {
    const std::string& m = local.error().message();
    t[pm.rank()][0] = 1;
    t[pm.rank()][1] = static_cast<int64_t>(local.error().code());
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(m.size()), kMaxMessage);
    auto acc = t.accessor<int64_t, 2>();
    for (int64_t i = 0; i < n; ++i)
      acc[pm.rank()][2 + i] = static_cast<unsigned char>(m[static_cast<size_t>(i)]);
  }
  APC_RETURN_IF_ERROR(sumOverWorld(pm, t, what));
  if (!local.ok()) return local;
  auto acc = t.accessor<int64_t, 2>();
  for (int64_t r = 0; r < pm.worldSize(); ++r) {
    if (acc[r][0] == 0) continue;
    std::string m;
    for (int64_t i = 0; i < kMaxMessage && acc[r][2 + i] != 0; ++i)
      m += static_cast<char>(acc[r][2 + i]);
    if (m.empty()) m = what + ": rank " + std::to_string(r) + " failed";
    return Error(static_cast<ErrorCode>(acc[r][1]), m);
  }
  return Status::success();
}

// --- the manifest --------------------------------------------------------------------------------

/// A rank writes a tensor's piece when it is the first holder of that piece: coordinate 0 on
/// every mesh dim that does not shard it.
bool writesPiece(const mesh::PlacementTuple& placement, const std::vector<int64_t>& coord) {
  for (size_t m = 0; m < placement.size(); ++m)
    if (!placement[m].isShard() && coord[m] != 0) return false;
  return true;
}

/// A tensor of the checkpoint: its spec (global shape, placement) and this rank's piece.
struct Saved {
  std::string name;
  std::string kind;  // parameter, buffer, optimizer
  const PlacedTensor* spec = nullptr;
  at::Tensor local;
};

ordered_json piecesJson(const Saved& s, const mesh::DeviceMesh& mesh) {
  ordered_json pieces = ordered_json::array();
  for (int64_t r = 0; r < mesh.worldSize(); ++r) {
    const std::vector<int64_t> coord = mesh.coordinate(r);
    if (!writesPiece(s.spec->placement, coord)) continue;
    const std::vector<layout::DimPiece> piece =
        layout::localPiece(s.spec->global_shape, s.spec->placement, mesh, coord);
    std::vector<int64_t> offsets, sizes;
    for (const layout::DimPiece& d : piece) {
      offsets.push_back(d.offset);
      sizes.push_back(d.size);
    }
    if (numelOf(sizes) == 0) continue;
    pieces.push_back(
        {{"file", rankFileName(r)}, {"key", s.name}, {"offsets", offsets}, {"sizes", sizes}});
  }
  return pieces;
}

/// The tensors this rank saves, in a fixed order (parameters, buffers, optimizer states).
/// `state_present[i]`: whether any rank holds state of parameter i (zeros stand in where this
/// rank has none: for SGD's momentum and AdamW's moments zeros and no state step alike).
Expected<std::vector<Saved>> savedTensors(ParallelModule& pm, const Optimizer* opt,
                                          const std::vector<bool>& state_present) {
  std::vector<Saved> out;
  const auto& params = pm.parameterSpecs();
  const std::vector<at::Tensor> ptensors = pm.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    out.push_back({params[i].name, "parameter", &params[i], ptensors[i].detach()});
  const std::map<std::string, at::Tensor> sd = pm.state_dict();
  for (const PlacedTensor& b : pm.bufferSpecs())
    out.push_back({b.name, "buffer", &b, sd.at(b.name).detach()});
  if (opt)
    for (size_t i = 0; i < params.size(); ++i) {
      if (!state_present[i]) continue;
      for (const std::string& name : opt->stateNames()) {
        auto it = opt->state()[i].find(name);
        at::Tensor t = it != opt->state()[i].end() ? it->second.detach()
                                                   : at::zeros_like(ptensors[i].detach());
        out.push_back({optimizerKey(name, params[i].name), "optimizer", &params[i], t});
      }
    }
  for (const Saved& s : out)
    for (const mesh::Placement& p : s.spec->placement)
      if (p.isPartial())
        return unsupported("cannot checkpoint " + s.name + ": it is placed " +
                           mesh::toCompactString(s.spec->placement) + " (a partial sum)");
  return out;
}

Expected<ordered_json> readManifestJson(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  APC_ASSIGN_OR_RETURN(std::string text, readInputFile(path));
  auto parsed = parseOrderedJsonText(text);
  if (!parsed.ok())
    return parseError(printable(path) + ": not valid JSON: " + parsed.error().message());
  ordered_json j = std::move(parsed).value();
  if (!j.is_object() || j.value("format", "") != kFormat)
    return parseError(printable(path) + ": not an apc checkpoint manifest (no \"format\": \"" +
                      kFormat + "\")");
  if (!j.contains("format_version") || !j["format_version"].is_number_integer() ||
      j["format_version"].get<int>() != kFormatVersion)
    return parseError(printable(path) + ": format_version " +
                      (j.contains("format_version") ? j["format_version"].dump() : "missing") +
                      ", this apc reads " + std::to_string(kFormatVersion));
  return j;
}

bool isStepDirName(const std::string& name, int64_t* step) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return false;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 58)) return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
  return true;
}

/// step -> directory of every step_<n> under `root`, and which hold a manifest.
std::map<int64_t, std::pair<fs::path, bool>> stepDirs(const std::string& root) {
  std::map<int64_t, std::pair<fs::path, bool>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step = 0;
    if (!it->is_directory(ec) || !isStepDirName(it->path().filename().string(), &step)) continue;
    out[step] = {it->path(), fs::is_regular_file(it->path() / kManifest, ec)};
  }
  return out;
}

void prune(const std::string& root, int keep_last) {
  if (keep_last <= 0) return;
  auto dirs = stepDirs(root);
  int complete_seen = 0;
  bool after_newest_complete = false;
  std::error_code ec;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    const auto& [path, complete] = it->second;
    if (complete) {
      after_newest_complete = true;
      if (++complete_seen <= keep_last) continue;
      // Incomplete first (the manifest), so a crash part way leaves no checkpoint taken for whole.
      fs::remove(path / kManifest, ec);
      fs::remove_all(path, ec);
    } else if (after_newest_complete) {
      fs::remove_all(path, ec);
    }
  }
}

/// The number at `key` of `j`, or an error naming the manifest.
Expected<int64_t> intField(const ordered_json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || !j[key].is_number_integer())
    return parseError(printable(path) + ": \"" + key + "\" must be an integer");
  return j[key].get<int64_t>();
}

/// The safetensors files of a checkpoint, each opened on first use: its size checked against the
/// manifest's "files", its header parsed and checked, and with `verify_hashes` its SHA-256 (the
/// whole file read). loadCheckpoint verifies the hashes apart (verifyFileHashes: each file by one
/// rank) so that a rank reads of the other files only the byte ranges it needs.
class FileCache {
 public:
  FileCache(std::string dir, const ordered_json& files, bool verify_hashes)
      : dir_(std::move(dir)), files_(files), verify_hashes_(verify_hashes) {}
  Expected<const st::File*> get(const std::string& name) {
    if (auto it = open_.find(name); it != open_.end()) return &it->second;
    const std::string mpath = (fs::path(dir_) / kManifest).string();
    if (!files_.contains(name) || !files_[name].is_object() || !files_[name].contains("bytes") ||
        !files_[name]["bytes"].is_number_integer() || !files_[name].contains("sha256") ||
        !files_[name]["sha256"].is_string())
      return parseError(printable(mpath) + ": \"files\" has no bytes and sha256 of " +
                        printable(name));
    APC_ASSIGN_OR_RETURN(
        st::File f,
        st::open((fs::path(dir_) / name).string(), files_[name]["bytes"].get<int64_t>(),
                 verify_hashes_ ? files_[name]["sha256"].get<std::string>() : std::string()));
    return &open_.emplace(name, std::move(f)).first->second;
  }

 private:
  std::string dir_;
  const ordered_json& files_;
  bool verify_hashes_;
  std::map<std::string, st::File> open_;
};

/// Checks the size and SHA-256 of this rank's share of the checkpoint's files: the files in the
/// manifest's order whose index is the rank's modulo the world size. Together the ranks read every
/// file once; loadCheckpoint agrees on the outcome, so a damaged file is every rank's error.
Status verifyFileHashes(const std::string& dir, const ordered_json& files, int rank, int world) {
  const std::string mpath = (fs::path(dir) / kManifest).string();
  int index = 0;
  for (const auto& [name, f] : files.items()) {
    if (index++ % world != rank) continue;
    if (name.find('/') != std::string::npos || name.empty() || name[0] == '.')
      return parseError(printable(mpath) + ": file " + printable(name) +
                        " is not a file of the checkpoint");
    if (!f.is_object() || !f.contains("bytes") || !f["bytes"].is_number_integer() ||
        !f.contains("sha256") || !f["sha256"].is_string())
      return parseError(printable(mpath) + ": \"files\" has no bytes and sha256 of " +
                        printable(name));
    APC_ASSIGN_OR_RETURN(st::File opened,
                         st::open((fs::path(dir) / name).string(), f["bytes"].get<int64_t>(),
                                  f["sha256"].get<std::string>()));
    (void)opened;
  }
  return Status::success();
}

/// The manifest's "files" and "tensors" objects, or an error naming it.
Status checkManifestTables(const ordered_json& j, const std::string& mpath) {
  if (!j.contains("files") || !j["files"].is_object() || !j.contains("tensors") ||
      !j["tensors"].is_object())
    return parseError(printable(mpath) + ": needs \"files\" and \"tensors\" objects");
  return Status::success();
}

/// Fills `dst` (this rank's piece `region` of the manifest tensor `mt`) from the saved pieces that
/// overlap it.
Status fillRegion(const std::string& dir, const std::string& name, const ordered_json& mt,
                  const std::vector<layout::DimPiece>& region, at::Tensor dst,
                  const std::function<Expected<const st::File*>(const std::string&)>& file,
                  int64_t* bytes_read) {
  const std::string mpath = (fs::path(dir) / kManifest).string();
  int64_t want = 1;
  for (const layout::DimPiece& d : region) want *= d.size;
  if (want == 0) return Status::success();
  int64_t covered = 0;
  at::NoGradGuard no_grad;
  for (const ordered_json& p : mt["pieces"]) {
    if (!p.is_object() || !p.contains("file") || !p["file"].is_string() || !p.contains("key") ||
        !p["key"].is_string() || !p.contains("offsets") || !p["offsets"].is_array() ||
        !p.contains("sizes") || !p["sizes"].is_array() || p["offsets"].size() != region.size() ||
        p["sizes"].size() != region.size())
      return parseError(printable(mpath) + ": tensor " + name + ": a piece needs file, key and " +
                        std::to_string(region.size()) + " offsets and sizes");
    std::vector<int64_t> lo(region.size()), hi(region.size()), poff(region.size()),
        psize(region.size());
    bool overlaps = true;
    for (size_t d = 0; d < region.size(); ++d) {
      if (!p["offsets"][d].is_number_integer() || !p["sizes"][d].is_number_integer())
        return parseError(printable(mpath) + ": tensor " + name +
                          ": offsets and sizes must be "
                          "integers");
      poff[d] = p["offsets"][d].get<int64_t>();
      psize[d] = p["sizes"][d].get<int64_t>();
      lo[d] = std::max(poff[d], region[d].offset);
      hi[d] = std::min(poff[d] + psize[d], region[d].offset + region[d].size);
      if (hi[d] <= lo[d]) overlaps = false;
    }
    if (!overlaps) continue;
    const std::string fname = p["file"].get<std::string>();
    if (fname.find('/') != std::string::npos || fname.empty() || fname[0] == '.')
      return parseError(printable(mpath) + ": tensor " + name + ": file " + printable(fname) +
                        " is not a file of the checkpoint");
    APC_ASSIGN_OR_RETURN(const st::File* f, file(fname));
    const std::string key = p["key"].get<std::string>();
    auto entry = f->tensors.find(key);
    if (entry == f->tensors.end())
      return parseError(printable(f->path) + ": no tensor '" + printable(key) +
                        "', which the checkpoint's manifest.json places there");
    if (entry->second.shape != psize)
      return parseError(printable(f->path) + ": tensor '" + printable(key) + "' has shape " +
                        c10::str(at::IntArrayRef(entry->second.shape)) +
                        ", the checkpoint's manifest.json says " +
                        c10::str(at::IntArrayRef(psize)));
    if (entry->second.dtype != dst.scalar_type())
      return parseError(printable(f->path) + ": tensor '" + printable(key) + "' is " +
                        c10::toString(entry->second.dtype) + ", expected " +
                        c10::toString(dst.scalar_type()));
    // Only the overlap's bytes: the box [lo, hi) in the saved piece's coordinates.
    std::vector<int64_t> box_lo(region.size()), box_size(region.size());
    at::Tensor t = dst;
    int64_t n = 1;
    for (size_t d = 0; d < region.size(); ++d) {
      box_lo[d] = lo[d] - poff[d];
      box_size[d] = hi[d] - lo[d];
      t = t.narrow(static_cast<int64_t>(d), lo[d] - region[d].offset, hi[d] - lo[d]);
      n *= hi[d] - lo[d];
    }
    APC_ASSIGN_OR_RETURN(at::Tensor src, st::readTensorBox(*f, key, box_lo, box_size));
    t.copy_(src);
    covered += n;
    if (bytes_read) *bytes_read += static_cast<int64_t>(src.nbytes());
  }
  if (covered != want)
    return parseError(printable(mpath) + ": tensor " + name + ": the pieces cover " +
                      std::to_string(covered) + " of the " + std::to_string(want) +
                      " elements of this rank's shard");
  return Status::success();
}

}  // namespace ckpt
}  // namespace

std::string checkpointDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

Expected<std::string> saveCheckpoint(ParallelModule& pm, const Optimizer* opt,
                                     const TrainingState& state, const std::string& root,
                                     const CheckpointOptions& options) {
  namespace fs = std::filesystem;
  using ckpt::ordered_json;
  const std::string dir = (fs::path(root) / checkpointDirName(state.step)).string();
  const std::string what = "saving checkpoint " + printable(dir);
  const std::vector<at::Tensor> params = pm.parameters();
  if (params.size() != pm.parameterSpecs().size())
    return invalidArgument(what +
                           ": the module's shards are not allocated (to_empty, "
                           "init_weights or load_full_state_dict first)");
  if (opt) {
    bool same = opt->params().size() == params.size();
    for (size_t i = 0; same && i < params.size(); ++i)
      same = opt->params()[i].unsafeGetTensorImpl() == params[i].unsafeGetTensorImpl();
    if (!same)
      return invalidArgument(what + ": the optimizer is not over this module's parameters()");
  }
  // Rank 0 makes an empty directory (a checkpoint of this step saved before is replaced: its
  // manifest goes first, so it is never complete with new files in it).
  Status made;
  if (pm.rank() == 0) {
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) {
      made = ioError(printable(root) + ": cannot create directory (" + ec.message() + ")");
    } else {
      fs::remove(fs::path(dir) / ckpt::kManifest, ec);
      fs::remove_all(dir, ec);
      if (!fs::create_directory(dir, ec) || ec)
        made = ioError(printable(dir) + ": cannot create directory (" +
                       (ec ? ec.message() : std::string("exists")) + ")");
      else
        made = ckpt::syncDirectory(root);
    }
  }
  APC_RETURN_IF_ERROR(ckpt::agree(pm, made, what));

  // Which parameters have optimizer state on any rank.
  std::vector<bool> present(params.size(), false);
  if (opt) {
    at::Tensor t = at::zeros({static_cast<int64_t>(params.size()) + 1}, at::kLong);
    for (size_t i = 0; i < params.size(); ++i)
      if (!opt->state()[i].empty()) t[static_cast<int64_t>(i)] = 1;
    APC_RETURN_IF_ERROR(ckpt::sumOverWorld(pm, t, what));
    for (size_t i = 0; i < params.size(); ++i)
      present[i] = t[static_cast<int64_t>(i)].item<int64_t>() > 0;
  }

  // This rank's file.
  const std::vector<int64_t> coord = pm.mesh().coordinate(pm.rank());
  int64_t bytes = 0;
  std::string sha;
  Status wrote = [&]() -> Status {
    APC_ASSIGN_OR_RETURN(std::vector<ckpt::Saved> saved, ckpt::savedTensors(pm, opt, present));
    std::vector<ckpt::Entry> entries;
    for (const ckpt::Saved& s : saved) {
      if (!ckpt::writesPiece(s.spec->placement, coord) || s.local.numel() == 0) continue;
      entries.push_back({s.name, s.local.to(at::kCPU).contiguous()});
    }
    const std::map<std::string, std::string> metadata = {
        {"format", "pt"},
        {"apc_checkpoint", std::to_string(ckpt::kFormatVersion)},
        {"rank", std::to_string(pm.rank())},
        {"step", std::to_string(state.step)}};
    APC_ASSIGN_OR_RETURN(auto written, ckpt::writeSafetensors(
                                           (fs::path(dir) / ckpt::rankFileName(pm.rank())).string(),
                                           entries, metadata));
    bytes = written.first;
    sha = written.second;
    if (sha.size() != 64)
      return internalError("SHA-256 of " + ckpt::rankFileName(pm.rank()) + " failed");
    return Status::success();
  }();

  // Every rank's outcome, then its file's size and SHA-256: [unused, bytes, 32 digest bytes].
  const int64_t world = pm.worldSize();
  at::Tensor info = at::zeros({world, 34}, at::kLong);
  if (wrote.ok()) {
    info[pm.rank()][1] = bytes;
    for (int64_t i = 0; i < 32; ++i)
      info[pm.rank()][2 + i] =
          static_cast<int64_t>(std::stoi(sha.substr(static_cast<size_t>(2 * i), 2), nullptr, 16));
  }
  APC_RETURN_IF_ERROR(ckpt::agree(pm, wrote, what));
  APC_RETURN_IF_ERROR(ckpt::sumOverWorld(pm, info, what));

  // Rank 0 writes the manifest, last.
  Status manifest_written;
  if (pm.rank() == 0) {
    manifest_written = [&]() -> Status {
      APC_ASSIGN_OR_RETURN(std::vector<ckpt::Saved> saved, ckpt::savedTensors(pm, opt, present));
      ordered_json j;
      j["format"] = ckpt::kFormat;
      j["format_version"] = ckpt::kFormatVersion;
      j["model_name"] = pm.modelName();
      j["model_hash"] = pm.modelHash();
      j["plan_hash"] = pm.planHash();
      j["mesh"] = {{"shape", pm.mesh().shape()}, {"names", pm.mesh().names()}};
      j["world_size"] = world;
      j["step"] = state.step;
      j["trainer"] = state.trainer;
      if (opt) {
        const OptimizerOptions& o = opt->options();
        j["optimizer"] = {{"kind", o.kind},
                          {"steps", opt->steps()},
                          {"lr", o.lr},
                          {"momentum", o.momentum},
                          {"beta1", o.beta1},
                          {"beta2", o.beta2},
                          {"eps", o.eps},
                          {"weight_decay", o.weight_decay},
                          {"state", opt->stateNames()}};
      } else {
        j["optimizer"] = nullptr;
      }
      ordered_json files = ordered_json::object();
      for (int64_t r = 0; r < world; ++r) {
        std::string hex;
        static const char* kDigits = "0123456789abcdef";
        for (int64_t i = 0; i < 32; ++i) {
          const int64_t b = info[r][2 + i].item<int64_t>();
          hex += kDigits[(b >> 4) & 15];
          hex += kDigits[b & 15];
        }
        files[ckpt::rankFileName(r)] = {{"bytes", info[r][1].item<int64_t>()}, {"sha256", hex}};
      }
      j["files"] = files;
      ordered_json tensors = ordered_json::object();
      for (const ckpt::Saved& s : saved) {
        APC_ASSIGN_OR_RETURN(std::string dtype, st::dtypeName(s.local.scalar_type()));
        ordered_json t = {{"kind", s.kind},
                          {"dtype", dtype},
                          {"shape", s.spec->global_shape},
                          {"placement", mesh::toString(s.spec->placement)},
                          {"pieces", ckpt::piecesJson(s, pm.mesh())}};
        if (s.kind == "optimizer") t["parameter"] = s.spec->name;
        tensors[s.name] = std::move(t);
      }
      j["tensors"] = std::move(tensors);
      APC_RETURN_IF_ERROR(
          writeFileAtomic((fs::path(dir) / ckpt::kManifest).string(), j.dump(1) + "\n"));
      APC_RETURN_IF_ERROR(ckpt::syncDirectory(dir));
      ckpt::prune(root, options.keep_last);
      return Status::success();
    }();
  }
  APC_RETURN_IF_ERROR(ckpt::agree(pm, manifest_written, what));
  return dir;
}

Expected<std::string> findCheckpoint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(fs::path(path) / ckpt::kManifest, ec)) return path;
  if (!fs::is_directory(path, ec))
    return notFound("no checkpoint at " + printable(path) + " (no such directory)");
  auto dirs = ckpt::stepDirs(path);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it)
    if (it->second.second) return it->second.first.string();
  return notFound("no checkpoint in " + printable(path) +
                  " (no manifest.json, and no step_<n> directory with one)");
}

Expected<TrainingState> loadCheckpoint(ParallelModule& pm, Optimizer* opt, const std::string& dir) {
  namespace fs = std::filesystem;
  using ckpt::ordered_json;
  const std::string what = "loading checkpoint " + printable(dir);
  const std::string mpath = (fs::path(dir) / ckpt::kManifest).string();
  // Shards not allocated yet: allocate them (uninitialized; the checkpoint fills them).
  if (pm.parameters().size() != pm.parameterSpecs().size())
    pm.init_weights([](const PlacedTensor&, at::Tensor&) {});
  TrainingState state;
  Status loaded = [&]() -> Status {
    APC_ASSIGN_OR_RETURN(ordered_json j, ckpt::readManifestJson(dir));
    auto stringField = [&](const char* key) -> Expected<std::string> {
      if (!j.contains(key) || !j[key].is_string())
        return parseError(printable(mpath) + ": \"" + key + "\" must be a string");
      return j[key].get<std::string>();
    };
    APC_ASSIGN_OR_RETURN(std::string model_hash, stringField("model_hash"));
    APC_ASSIGN_OR_RETURN(state.plan_hash, stringField("plan_hash"));
    if (model_hash != pm.modelHash())
      return invalidArgument(printable(mpath) + ": a checkpoint of another model (model hash " +
                             model_hash.substr(0, 16) + ", this artifact's is " +
                             pm.modelHash().substr(0, 16) + ")");
    // Another plan or mesh of the same model reshards: every shard is filled from the saved
    // pieces that overlap it, whatever placements wrote them.
    APC_ASSIGN_OR_RETURN(state.step, ckpt::intField(j, "step", mpath));
    if (state.step < 0) return parseError(printable(mpath) + ": \"step\" is negative");
    if (j.contains("trainer")) {
      if (!j["trainer"].is_object())
        return parseError(printable(mpath) + ": \"trainer\" must be an object of strings");
      for (const auto& [k, v] : j["trainer"].items()) {
        if (!v.is_string())
          return parseError(printable(mpath) + ": \"trainer\" must be an object of strings");
        state.trainer[k] = v.get<std::string>();
      }
    }
    APC_RETURN_IF_ERROR(ckpt::checkManifestTables(j, mpath));
    const ordered_json& jtensors = j["tensors"];
    // Each file's SHA-256 by one rank; then every rank reads of any file only the byte ranges of
    // the pieces that overlap its shards.
    APC_RETURN_IF_ERROR(ckpt::verifyFileHashes(dir, j["files"], pm.rank(), pm.worldSize()));
    ckpt::FileCache cache(dir, j["files"], /*verify_hashes=*/false);
    auto file = [&](const std::string& name) { return cache.get(name); };
    // One tensor of the manifest into `dst`, this rank's piece of the spec.
    auto load = [&](const std::string& name, const char* kind, const PlacedTensor& spec,
                    at::Tensor dst) -> Status {
      if (!jtensors.contains(name))
        return parseError(printable(mpath) + ": no " + kind + " " + name);
      const ordered_json& mt = jtensors[name];
      if (!mt.is_object() || mt.value("kind", "") != kind || !mt.contains("shape") ||
          !mt["shape"].is_array() || !mt.contains("dtype") || !mt["dtype"].is_string() ||
          !mt.contains("pieces") || !mt["pieces"].is_array())
        return parseError(printable(mpath) + ": tensor " + name + " needs kind \"" + kind +
                          "\", dtype, shape and pieces");
      std::vector<int64_t> shape;
      for (const auto& d : mt["shape"]) {
        if (!d.is_number_integer())
          return parseError(printable(mpath) + ": tensor " + name + ": shape must be integers");
        shape.push_back(d.get<int64_t>());
      }
      if (shape != spec.global_shape)
        return invalidArgument(printable(mpath) + ": tensor " + name + " has shape " +
                               c10::str(at::IntArrayRef(shape)) + ", the model's is " +
                               c10::str(at::IntArrayRef(spec.global_shape)));
      APC_ASSIGN_OR_RETURN(std::string want_dtype, st::dtypeName(dst.scalar_type()));
      if (mt["dtype"].get<std::string>() != want_dtype)
        return invalidArgument(printable(mpath) + ": tensor " + name + " is " +
                               printable(mt["dtype"].get<std::string>()) + ", this run holds " +
                               want_dtype);
      if (dst.device().is_cpu())
        return ckpt::fillRegion(dir, name, mt, spec.local, dst, file, &state.bytes_read);
      at::Tensor host = at::empty(dst.sizes(), dst.options().device(at::kCPU));
      APC_RETURN_IF_ERROR(
          ckpt::fillRegion(dir, name, mt, spec.local, host, file, &state.bytes_read));
      at::NoGradGuard no_grad;
      dst.copy_(host);
      return Status::success();
    };
    const auto& pspecs = pm.parameterSpecs();
    const std::vector<at::Tensor> params = pm.parameters();
    for (size_t i = 0; i < pspecs.size(); ++i)
      APC_RETURN_IF_ERROR(load(pspecs[i].name, "parameter", pspecs[i], params[i].detach()));
    const std::map<std::string, at::Tensor> sd = pm.state_dict();
    for (const PlacedTensor& b : pm.bufferSpecs())
      APC_RETURN_IF_ERROR(load(b.name, "buffer", b, sd.at(b.name)));
    if (!opt) return Status::success();
    if (!j.contains("optimizer") || !j["optimizer"].is_object())
      return invalidArgument(printable(mpath) + ": holds no optimizer state");
    const ordered_json& jo = j["optimizer"];
    const std::string kind = jo.value("kind", "");
    if (kind != opt->options().kind)
      return invalidArgument(printable(mpath) + ": holds the state of optimizer " +
                             printable(kind) + ", this run uses " + opt->options().kind);
    APC_ASSIGN_OR_RETURN(int64_t steps, ckpt::intField(jo, "steps", mpath));
    if (jo.value("state", ordered_json::array()) != ordered_json(opt->stateNames()))
      return invalidArgument(printable(mpath) + ": holds optimizer state " +
                             jo.value("state", ordered_json::array()).dump() + ", this " +
                             opt->options().kind + " keeps " +
                             ordered_json(opt->stateNames()).dump() +
                             (opt->options().kind == "sgd" ? " (SGD keeps momentum_buffer when "
                                                             "its momentum is not 0)"
                                                           : ""));
    std::vector<std::map<std::string, at::Tensor>> opt_state(params.size());
    for (size_t i = 0; i < pspecs.size(); ++i)
      for (const std::string& s : opt->stateNames()) {
        const std::string key = ckpt::optimizerKey(s, pspecs[i].name);
        if (!jtensors.contains(key)) continue;  // no state yet (no gradient so far)
        at::Tensor t = at::empty_like(params[i].detach());
        APC_RETURN_IF_ERROR(load(key, "optimizer", pspecs[i], t));
        opt_state[i][s] = t;
      }
    opt->set_state(steps, std::move(opt_state));
    return Status::success();
  }();
  APC_RETURN_IF_ERROR(ckpt::agree(pm, loaded, what));
  return state;
}

Status exportCheckpoint(const std::string& dir, const std::string& out) {
  namespace fs = std::filesystem;
  using ckpt::ordered_json;
  const std::string mpath = (fs::path(dir) / ckpt::kManifest).string();
  APC_ASSIGN_OR_RETURN(ordered_json j, ckpt::readManifestJson(dir));
  APC_RETURN_IF_ERROR(ckpt::checkManifestTables(j, mpath));
  ckpt::FileCache cache(dir, j["files"], /*verify_hashes=*/true);
  auto file = [&](const std::string& name) { return cache.get(name); };
  std::vector<ckpt::Entry> entries;
  for (const auto& [name, mt] : j["tensors"].items()) {
    const std::string kind = mt.is_object() ? mt.value("kind", "") : "";
    if (kind != "parameter" && kind != "buffer") continue;
    std::optional<at::ScalarType> dtype;
    if (mt.contains("dtype") && mt["dtype"].is_string())
      dtype = st::dtypeOf(mt["dtype"].get<std::string>());
    if (!dtype || !mt.contains("shape") || !mt["shape"].is_array() || !mt.contains("pieces") ||
        !mt["pieces"].is_array())
      return parseError(printable(mpath) + ": tensor " + name +
                        " needs a known dtype, a shape and pieces");
    std::vector<layout::DimPiece> whole;
    std::vector<int64_t> shape;
    for (const auto& d : mt["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return parseError(printable(mpath) + ": tensor " + name + ": bad shape");
      shape.push_back(d.get<int64_t>());
      whole.push_back({0, d.get<int64_t>()});
    }
    at::Tensor full = at::empty(shape, at::TensorOptions().dtype(*dtype));
    APC_RETURN_IF_ERROR(ckpt::fillRegion(dir, name, mt, whole, full, file, nullptr));
    entries.push_back({name, full});
  }
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
  for (const char* key : {"model_name", "model_hash", "plan_hash"})
    if (j.contains(key) && j[key].is_string()) metadata[std::string("apc_") + key] = j[key];
  if (j.contains("step") && j["step"].is_number_integer())
    metadata["apc_step"] = std::to_string(j["step"].get<int64_t>());
  APC_ASSIGN_OR_RETURN(auto written, ckpt::writeSafetensors(out, entries, metadata));
  (void)written;
  return Status::success();
}

Expected<std::map<std::string, at::Tensor>> readSafetensors(const std::string& path) {
  APC_ASSIGN_OR_RETURN(st::File f, st::open(path));
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, t] : f.tensors) {
    APC_ASSIGN_OR_RETURN(at::Tensor x, st::readTensor(f, key));
    out[key] = std::move(x);
  }
  return out;
}

}  // namespace apc::runtime
