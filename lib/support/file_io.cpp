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

}  // namespace

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
