//===- lib/support/file_io.cpp - Safe reading and writing of user files ----===//
//
// Temporaries are hidden siblings of their target (".NAME.apc-tmp-PID-N"), so that the final
// rename stays within one file system and is atomic. Uncommitted temporaries are listed in a table
// that the signal handler of removeTemporariesOnSignal walks with async-signal-safe calls only
// (unlink, lstat, rename, openat, getdents64, unlinkat). The table grows by chunks that are never
// freed (a chunk is linked in whole, with a release store, so the handler walks only whole
// chunks): any number of temporaries is listed, none is left to its owner alone.
//
// A directory is swapped in by one renameat2(RENAME_EXCHANGE). Where the file system refuses the
// exchange, the old directory is moved aside and the new one in: the handler knows the directory
// set aside, and puts it back when the signal came before the new one was in (else removes it).
//
//===----------------------------------------------------------------------===//
#include "apc/support/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

namespace apc {

namespace fs = std::filesystem;

namespace {

std::string errnoText(int err) {
  return std::strerror(err);
}

/// A path as messages name it: escaped, and shortened only past 1024 characters (a path cut at
/// 80 no longer says which file).
std::string pathText(std::string_view path) {
  return printable(path, 1024);
}

// --- Temporaries the signal handler removes ------------------------------------------------------

enum TempKind : int {
  kNoTemp = 0,
  kTempFile = 1,
  kTempDirectory = 2,
  kAsideDirectory = 3,  // an old directory moved aside from `target` while a new one is swapped in
};

/// One uncommitted temporary: `kind` is set (release) after the paths are written, and cleared
/// before the slot is reused, so the handler reads only whole paths.
struct TempSlot {
  std::atomic<int> kind{kNoTemp};
  char path[PATH_MAX];
  char target[PATH_MAX];  // kAsideDirectory: where `path` was moved from
};
constexpr int kSlotsPerChunk = 16;
struct TempChunk {
  std::array<TempSlot, kSlotsPerChunk> slots;
  std::atomic<TempChunk*> next{nullptr};
};
TempChunk g_temps;      // the first chunk; more are linked behind it as needed, never freed
std::mutex g_temps_mu;  // registration (not the handler)

/// The slot of index `index` (chunk index / kSlotsPerChunk, slot index % kSlotsPerChunk).
TempSlot& slotAt(int index) {
  TempChunk* c = &g_temps;
  for (int i = index / kSlotsPerChunk; i > 0; --i) c = c->next.load(std::memory_order_acquire);
  return c->slots[static_cast<size_t>(index % kSlotsPerChunk)];
}

/// `path` made absolute, for the handler (which may run after a chdir); an error when it cannot be
/// (the handler could not remove it).
Expected<std::string> absoluteForHandler(const fs::path& path) {
  std::error_code ec;
  std::string abs = fs::absolute(path, ec).string();
  if (ec)
    return ioError(pathText(path.string()) + ": cannot make the path absolute (" + ec.message() +
                   ")");
  if (abs.size() >= PATH_MAX)
    return ioError(pathText(path.string()) + ": the absolute path is " +
                   std::to_string(abs.size()) + " bytes, more than the " +
                   std::to_string(PATH_MAX - 1) + " the system takes");
  return abs;
}

/// Lists `path` for the handler (with `target`, the directory it was moved from, for an aside
/// directory) and returns its slot's index. The table grows as needed.
Expected<int> registerTemp(const fs::path& path, TempKind kind, const fs::path& target = {}) {
  APC_ASSIGN_OR_RETURN(std::string abs, absoluteForHandler(path));
  std::string abs_target;
  if (kind == kAsideDirectory) {
    APC_ASSIGN_OR_RETURN(abs_target, absoluteForHandler(target));
  }
  std::lock_guard<std::mutex> lock(g_temps_mu);
  TempChunk* c = &g_temps;
  for (int base = 0;; base += kSlotsPerChunk) {
    for (int i = 0; i < kSlotsPerChunk; ++i) {
      TempSlot& s = c->slots[static_cast<size_t>(i)];
      if (s.kind.load(std::memory_order_acquire) != kNoTemp) continue;
      std::memcpy(s.path, abs.c_str(), abs.size() + 1);
      std::memcpy(s.target, abs_target.c_str(), abs_target.size() + 1);
      s.kind.store(kind, std::memory_order_release);
      return base + i;
    }
    TempChunk* next = c->next.load(std::memory_order_acquire);
    if (!next) {
      next = new TempChunk;  // reachable from g_temps for the life of the process
      c->next.store(next, std::memory_order_release);
    }
    c = next;
  }
}

void unregisterTemp(int& slot) {
  if (slot >= 0) slotAt(slot).kind.store(kNoTemp, std::memory_order_release);
  slot = -1;
}

/// For tests (detail::setTwoRenameSwapForTesting).
std::atomic<bool> g_force_two_renames{false};
std::atomic<void (*)()> g_between_renames{nullptr};

/// Removes the directory `name` under `parent_fd` (AT_FDCWD: `name` is a path) and what it holds,
/// at most `depth` levels deep, with async-signal-safe calls only.
void removeTreeSignalSafe(int parent_fd, const char* name, int depth) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return;
    if (depth <= 0) return;
    int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    alignas(8) char buf[4096];
    for (;;) {
      long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
        unsigned short reclen;
        std::memcpy(&reclen, buf + off + 16, sizeof reclen);
        const unsigned char type = static_cast<unsigned char>(buf[off + 18]);
        const char* entry = buf + off + 19;
        off += reclen;
        if (std::strcmp(entry, ".") == 0 || std::strcmp(entry, "..") == 0) continue;
        if (type == DT_DIR)
          removeTreeSignalSafe(fd, entry, depth - 1);
        else if (::unlinkat(fd, entry, 0) != 0 && errno == EISDIR)
          removeTreeSignalSafe(fd, entry, depth - 1);
      }
    }
    ::close(fd);
  }
}

void removeTemporariesAndDie(int sig) {
  const int saved = errno;
  for (TempChunk* c = &g_temps; c; c = c->next.load(std::memory_order_acquire)) {
    for (TempSlot& s : c->slots) {
      const int kind = s.kind.load(std::memory_order_acquire);
      if (kind == kTempFile) ::unlink(s.path);
      if (kind == kTempDirectory) removeTreeSignalSafe(AT_FDCWD, s.path, 8);
      if (kind == kAsideDirectory) {
        // Moved aside, the new directory not in yet: the old one goes back. Else the new one
        // is in, and the old one goes.
        struct stat st;
        if (::lstat(s.target, &st) != 0 && errno == ENOENT)
          ::rename(s.path, s.target);
        else
          removeTreeSignalSafe(AT_FDCWD, s.path, 8);
      }
    }
  }
  // The default action, once this handler returns (the signal is blocked until then).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  errno = saved;
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

namespace {

/// `path` resolved as far as it exists (symlinks followed), the rest appended as written.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(path), ec);
  if (ec) abs = fs::path(path);
  fs::path r = fs::weakly_canonical(abs, ec);
  return ec ? abs.lexically_normal() : r;
}

}  // namespace

bool isWithinDirectory(const std::string& path, const std::string& dir) {
  if (path.empty() || dir.empty()) return false;
  const fs::path p = resolved(path), d = resolved(dir);
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

Status checkNoInputWithin(const std::string& output_dir, const std::string& flag,
                          const std::vector<std::string>& inputs) {
  if (output_dir.empty()) return Status::success();
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (in.empty() || !fs::exists(in, ec)) continue;
    if (isWithinDirectory(in, output_dir))
      return invalidArgument(flag + " " + pathText(output_dir) + " holds the input " +
                             pathText(in) +
                             ", and is replaced as a whole; refusing to delete an input (write "
                             "the output elsewhere)");
  }
  return Status::success();
}

void removeTemporariesOnSignal() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
      struct sigaction sa {};
      sa.sa_handler = removeTemporariesAndDie;
      sigemptyset(&sa.sa_mask);
      // Every stop signal blocked while one handler runs: one pass over the table.
      for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, s);
      ::sigaction(sig, &sa, nullptr);
    }
  });
}

// --- StagedFile ----------------------------------------------------------------------------------

Expected<StagedFile> StagedFile::create(const std::string& path) {
  if (path.empty()) return invalidArgument("empty output path");
  fs::path target = normalizedTarget(path);
  std::error_code ec;
  if (fs::is_directory(target, ec))
    return ioError(pathText(path) + ": is a directory, cannot write a file there");
  // rename() would replace a device node, a FIFO or a socket by a regular file (as root, -o
  // /dev/null would replace the machine's /dev/null).
  struct stat st;
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return invalidArgument(pathText(path) + ": is " + fileKind(st.st_mode) +
                           "; apc writes only regular files (refusing to replace it)");
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
  Expected<int> slot = registerTemp(temp, kTempFile);
  if (!slot.ok()) return slot.error();  // f's destructor removes the temporary
  f.slot_ = *slot;
  return f;
}

StagedFile::StagedFile(StagedFile&& other) noexcept
    : target_(std::move(other.target_)),
      temp_(std::exchange(other.temp_, {})),
      slot_(std::exchange(other.slot_, -1)) {}

StagedFile& StagedFile::operator=(StagedFile&& other) noexcept {
  if (this != &other) {
    discard();
    target_ = std::move(other.target_);
    temp_ = std::exchange(other.temp_, {});
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

StagedFile::~StagedFile() {
  discard();
}

void StagedFile::discard() {
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  unregisterTemp(slot_);
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
  unregisterTemp(slot_);  // (a signal before this line unlinks a name that is gone: harmless)
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
  Expected<int> slot = registerTemp(staging, kTempDirectory);
  if (!slot.ok()) return slot.error();  // d's destructor removes the staging directory
  d.slot_ = *slot;
  return d;
}

StagedDirectory::StagedDirectory(StagedDirectory&& other) noexcept
    : target_(std::move(other.target_)),
      staging_(std::exchange(other.staging_, {})),
      slot_(std::exchange(other.slot_, -1)) {}

StagedDirectory& StagedDirectory::operator=(StagedDirectory&& other) noexcept {
  if (this != &other) {
    discard();
    target_ = std::move(other.target_);
    staging_ = std::exchange(other.staging_, {});
    slot_ = std::exchange(other.slot_, -1);
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
  unregisterTemp(slot_);
}

Status StagedDirectory::commit() {
  if (staging_.empty()) return internalError(target_ + ": staged directory already committed");
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(target_, ec))) {
    if (::rename(staging_.c_str(), target_.c_str()) != 0)
      return ioError(printable(target_) + ": cannot create (" + errnoText(errno) + ")");
    staging_.clear();
    unregisterTemp(slot_);
    return Status::success();
  }
#ifdef RENAME_EXCHANGE
  // One atomic swap: readers see the old directory or the new one, and a signal at any point
  // leaves one of them whole. The staging name then holds the old content, which discard()
  // removes.
  if (!g_force_two_renames.load()) {
    if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
      discard();
      return Status::success();
    }
    // Only a file system (or kernel) without the exchange falls back to two renames.
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != EOPNOTSUPP)
      return ioError(printable(target_) + ": cannot replace (" + errnoText(err) + ")");
  }
#endif
  // No exchange on this file system: move the old directory aside, then the new one in. The
  // directory set aside is listed first, so that a signal between the two renames puts it back.
  fs::path old = siblingName(fs::path(target_), "old");
  APC_ASSIGN_OR_RETURN(int aside_slot, registerTemp(old, kAsideDirectory, fs::path(target_)));
  if (::rename(target_.c_str(), old.c_str()) != 0) {
    int err = errno;
    unregisterTemp(aside_slot);
    return ioError(printable(target_) + ": cannot replace (" + errnoText(err) + ")");
  }
  if (auto between = g_between_renames.load()) between();
  if (::rename(staging_.c_str(), target_.c_str()) != 0) {
    int err = errno;
    ::rename(old.c_str(), target_.c_str());
    unregisterTemp(aside_slot);
    return ioError(printable(target_) + ": cannot replace (" + errnoText(err) + ")");
  }
  staging_.clear();
  unregisterTemp(slot_);
  fs::remove_all(old, ec);
  unregisterTemp(aside_slot);
  return Status::success();
}

namespace detail {

void setTwoRenameSwapForTesting(bool force, void (*between)()) {
  g_force_two_renames.store(force);
  g_between_renames.store(between);
}

}  // namespace detail

}  // namespace apc
