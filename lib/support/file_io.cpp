//===- lib/support/file_io.cpp - Safe reading and writing of user files ----===//
//
// Temporaries are hidden siblings of their target (".NAME.apc-tmp-PID-N"), so that the final
// rename stays within one file system and is atomic.
//
//===----------------------------------------------------------------------===//
#include "apc/support/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace apc {

namespace fs = std::filesystem;

namespace {

std::string errnoText(int err) {
  return std::strerror(err);
}

/// A fresh name for a hidden sibling of `target`: ".NAME.apc-KIND-PID-N".
fs::path siblingName(const fs::path& target, const char* kind) {
  static std::atomic<unsigned> counter{0};
  fs::path parent = target.parent_path();
  std::string name = "." + target.filename().string() + ".apc-" + kind + "-" +
                     std::to_string(::getpid()) + "-" + std::to_string(counter++);
  return parent.empty() ? fs::path(name) : parent / name;
}

/// `path` without trailing separators ("out/" -> "out"), so that filename() names the target.
fs::path normalizedTarget(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

/// What a path that is not a regular file is, for "is a FIFO, not a regular file".
const char* fileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

Error cannotRead(ErrorCode code, const std::string& path, const std::string& why) {
  return {code, "cannot read '" + printable(path) + "': " + why};
}

Status checkRegular(const std::string& path, const struct stat& st) {
  if (S_ISREG(st.st_mode)) return Status::success();
  return cannotRead(ErrorCode::kInvalidArgument, path,
                    std::string("is ") + fileKind(st.st_mode) + ", not a regular file");
}

Error tooLarge(const std::string& path, const std::string& size, uint64_t max_bytes) {
  return cannotRead(ErrorCode::kInvalidArgument, path,
                    "is " + size + ", more than the " + byteSizeText(max_bytes) + " apc reads");
}

}  // namespace

std::string byteSizeText(uint64_t bytes) {
  if (bytes != 0 && bytes % (uint64_t{1} << 30) == 0) return std::to_string(bytes >> 30) + " GiB";
  if (bytes != 0 && bytes % (uint64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes != 0 && bytes % (uint64_t{1} << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

Status checkRegularFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    return cannotRead(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, path, errnoText(err));
  }
  return checkRegular(path, st);
}

Expected<std::string> readInputFile(const std::string& path, uint64_t max_bytes) {
  APC_RETURN_IF_ERROR(checkRegularFile(path));
  // O_NONBLOCK: were the path swapped for a FIFO since the check, opening it must not wait for a
  // writer (fstat below then refuses it). Reads of a regular file ignore the flag.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    return cannotRead(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo, path, errnoText(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return cannotRead(ErrorCode::kIo, path, errnoText(errno));
  APC_RETURN_IF_ERROR(checkRegular(path, st));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) return tooLarge(path, std::to_string(size) + " bytes", max_bytes);
  std::string out;
  out.reserve(static_cast<size_t>(size));
  std::string buf(size_t{1} << 16, '\0');
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return cannotRead(ErrorCode::kIo, path, errnoText(errno));
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes)  // grew while being read
      return tooLarge(path, "over " + std::to_string(max_bytes) + " bytes", max_bytes);
    out.append(buf.data(), static_cast<size_t>(n));
  }
  return out;
}

Status checkJsonText(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\0')
      return parseError("malformed JSON: a NUL byte at byte " + std::to_string(i) +
                        " (JSON text holds no NUL bytes)");
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth)
          return parseError("JSON nested deeper than " + std::to_string(max_depth) +
                            " levels at byte " + std::to_string(i) + " (apc reads at most " +
                            std::to_string(max_depth) + ")");
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return Status::success();
}

std::string printable(std::string_view s, size_t max_chars) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

Status checkNotInput(const std::string& output, const std::string& flag,
                     const std::vector<std::string>& inputs) {
  if (output.empty()) return Status::success();
  struct stat out_st;
  if (::stat(output.c_str(), &out_st) != 0) return Status::success();  // not there yet
  for (const std::string& in : inputs) {
    if (in.empty()) continue;
    struct stat in_st;
    if (::stat(in.c_str(), &in_st) != 0) continue;
    if (in_st.st_dev == out_st.st_dev && in_st.st_ino == out_st.st_ino)
      return invalidArgument(flag + " " + printable(output) + " is the input file " +
                             printable(in) + "; refusing to write over an input");
  }
  return Status::success();
}

// --- StagedFile ----------------------------------------------------------------------------------

Expected<StagedFile> StagedFile::create(const std::string& path) {
  if (path.empty()) return invalidArgument("empty output path");
  fs::path target = normalizedTarget(path);
  std::error_code ec;
  if (fs::is_directory(target, ec))
    return ioError(printable(path) + ": is a directory, cannot write a file there");
  fs::path parent = target.parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    return ioError(printable(path) + ": cannot write: directory " + printable(parent.string()) +
                   " does not exist");
  StagedFile f;
  f.target_ = target.string();
  fs::path temp = siblingName(target, "tmp");
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0)
    return ioError(printable(path) + ": cannot open for writing (" + errnoText(errno) + ")");
  ::close(fd);
  f.temp_ = temp.string();
  return f;
}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : target_(std::move(other.target_)), temp_(std::exchange(other.temp_, {})) {}

StagedFile& StagedFile::operator=(StagedFile&& other) noexcept {
  if (this != &other) {
    discard();
    target_ = std::move(other.target_);
    temp_ = std::exchange(other.temp_, {});
  }
  return *this;
}

StagedFile::~StagedFile() {
  discard();
}

void StagedFile::discard() {
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

Status StagedFile::write(std::string_view bytes) {
  if (temp_.empty()) return internalError(target_ + ": staged file already committed");
  int fd = ::open(temp_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return ioError(printable(target_) + ": cannot write (" + errnoText(errno) + ")");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      return ioError(printable(target_) + ": write failed (" + errnoText(err) + ")");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {
    int err = errno;
    ::close(fd);
    return ioError(printable(target_) + ": write failed (" + errnoText(err) + ")");
  }
  if (::close(fd) != 0)
    return ioError(printable(target_) + ": write failed (" + errnoText(errno) + ")");
  return Status::success();
}

Status StagedFile::commit() {
  if (temp_.empty()) return internalError(target_ + ": staged file already committed");
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    return ioError(printable(target_) + ": cannot replace (" + errnoText(errno) + ")");
  temp_.clear();
  return Status::success();
}

Status writeFileAtomic(const std::string& path, std::string_view bytes) {
  APC_ASSIGN_OR_RETURN(StagedFile f, StagedFile::create(path));
  APC_RETURN_IF_ERROR(f.write(bytes));
  return f.commit();
}

// --- StagedDirectory -----------------------------------------------------------------------------

Expected<StagedDirectory> StagedDirectory::create(const std::string& dir,
                                                  const std::string& marker) {
  if (dir.empty()) return invalidArgument("empty output directory");
  fs::path target = normalizedTarget(dir);
  std::error_code ec;
  fs::file_status st = fs::status(target, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) return ioError(printable(dir) + ": exists and is not a directory");
    bool empty = fs::is_empty(target, ec);
    if (ec) return ioError(printable(dir) + ": cannot read (" + ec.message() + ")");
    if (!empty && !fs::exists(target / marker, ec))
      return ioError(printable(dir) + ": a non-empty directory without " + marker +
                     "; refusing to replace it (give a new or empty directory)");
  }
  fs::path parent = target.parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec)
      return ioError(printable(parent.string()) + ": cannot create directory (" + ec.message() +
                     ")");
  }
  StagedDirectory d;
  d.target_ = target.string();
  fs::path staging = siblingName(target, "staging");
  if (::mkdir(staging.c_str(), 0777) != 0)
    return ioError(printable(dir) + ": cannot create a directory beside it (" + errnoText(errno) +
                   ")");
  d.staging_ = staging.string();
  return d;
}

StagedDirectory::StagedDirectory(StagedDirectory&& other) noexcept
    : target_(std::move(other.target_)), staging_(std::exchange(other.staging_, {})) {}

StagedDirectory& StagedDirectory::operator=(StagedDirectory&& other) noexcept {
  if (this != &other) {
    discard();
    target_ = std::move(other.target_);
    staging_ = std::exchange(other.staging_, {});
  }
  return *this;
}

StagedDirectory::~StagedDirectory() {
  discard();
}

void StagedDirectory::discard() {
  if (staging_.empty()) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
  staging_.clear();
}

Status StagedDirectory::commit() {
  if (staging_.empty()) return internalError(target_ + ": staged directory already committed");
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(target_, ec))) {
    if (::rename(staging_.c_str(), target_.c_str()) != 0)
      return ioError(printable(target_) + ": cannot create (" + errnoText(errno) + ")");
    staging_.clear();
    return Status::success();
  }
#ifdef RENAME_EXCHANGE
  // One atomic swap: readers see the old directory or the new one. The staging name then holds
  // the old content, which discard() removes.
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    discard();
    return Status::success();
  }
#endif
  // No exchange on this file system: move the old directory aside, then the new one in.
  fs::path old = siblingName(fs::path(target_), "old");
  if (::rename(target_.c_str(), old.c_str()) != 0)
    return ioError(printable(target_) + ": cannot replace (" + errnoText(errno) + ")");
  if (::rename(staging_.c_str(), target_.c_str()) != 0) {
    int err = errno;
    ::rename(old.c_str(), target_.c_str());
    return ioError(printable(target_) + ": cannot replace (" + errnoText(err) + ")");
  }
  staging_.clear();
  fs::remove_all(old, ec);
  return Status::success();
}

}  // namespace apc
