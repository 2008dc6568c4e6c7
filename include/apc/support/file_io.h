//===- apc/support/file_io.h - Safe reading and writing of user files -------===//
//
// What every reader and writer of user files shares, so that no input crashes a reader and no
// write leaves a half-written or clobbered file:
//  - checkJsonText: a linear pre-scan of JSON text before it is parsed. It rejects NUL bytes (the
//    JSON parser would stop at one and ignore what follows) and nesting deeper than a limit (a
//    deep tree overflows the stack of every recursive walker and destructor; nlohmann's parser
//    itself is iterative).
//  - readInputFile / checkRegularFile: an input file is read only when it is a regular file (a
//    FIFO would block the reader, /dev/zero would grow its buffer without end) and at most
//    kMaxInputFileBytes long.
//  - printable: a user-given string as it may appear in a one-line message (control characters
//    escaped, long strings shortened).
//  - checkNotInput / checkNoInputWithin: an output path is none of the command's input files, and
//    a directory to be replaced as a whole holds none of them.
//  - StagedFile / writeFileAtomic: a file is written to a temporary beside it and renamed over the
//    target, so readers see the old or the new content, never a mix or a truncated file. Only a
//    regular file (or nothing) is replaced: never a device, a FIFO or a socket.
//  - StagedDirectory: a directory (an artifact) is built beside its target and swapped in as a
//    whole; a directory is only replaced when it is empty or carries a marker file (so that a
//    mistyped path never deletes someone's folder).
//  - removeTemporariesOnSignal: SIGINT, SIGTERM or SIGHUP while a StagedFile or StagedDirectory
//    is uncommitted removes its temporary before the process ends (any number of them), and puts
//    back a directory that a two-rename swap had moved aside.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apc/support/error.h"

namespace apc {

/// Deepest nesting of arrays and objects that apc's JSON readers accept (specs, sharding files,
/// plans, manifests). Real files nest fewer than 10 levels.
inline constexpr size_t kMaxJsonDepth = 64;

/// Checks JSON text before parsing: no NUL byte, nesting at most `max_depth`. The error names the
/// byte offset. Does not check the syntax otherwise (the parser does).
Status checkJsonText(std::string_view text, size_t max_depth = kMaxJsonDepth);

/// Largest input file apc reads whole into memory: specs, sharding files, cluster profiles, plans,
/// manifests, rank programs, graph files, and each JSON record of a .pt2 archive. 1 GiB; the plan
/// of an 8-billion-parameter model is a few MB.
inline constexpr uint64_t kMaxInputFileBytes = uint64_t{1} << 30;

/// Fails unless `path` (symlinks followed) is an existing regular file. Errors read "cannot read
/// 'PATH': WHY": kNotFound for a missing file ("No such file or directory"), kInvalidArgument
/// for a directory, a FIFO, a socket, a character or block device ("is a FIFO, not a regular
/// file"), kIo when it cannot be examined (permissions).
Status checkRegularFile(const std::string& path);

/// The whole content of the regular file `path` (checkRegularFile's errors), at most `max_bytes`:
/// a longer file is refused (kInvalidArgument, "is N bytes, more than the 1 GiB apc reads")
/// before anything is read, and a file that grows past the cap while it is read is refused too.
/// The file is opened without blocking, so a FIFO swapped in after the check cannot hang it.
Expected<std::string> readInputFile(const std::string& path,
                                    uint64_t max_bytes = kMaxInputFileBytes);

/// "1 GiB", "64 MiB", "4096 bytes": a byte cap as messages name it.
std::string byteSizeText(uint64_t bytes);

/// `s` for a one-line message: control characters and backslashes escaped (\n, \t, \x01), cut to
/// `max_chars` with "..." when longer.
std::string printable(std::string_view s, size_t max_chars = 80);

/// Fails when `output` (about to be written, named `flag` in the message, like "-o") is the same
/// file as one of `inputs` (existing files compared by device and inode; empty paths skipped).
Status checkNotInput(const std::string& output, const std::string& flag,
                     const std::vector<std::string>& inputs);

/// Fails when the directory `output_dir` (about to be replaced as a whole, named `flag` in the
/// message, like "--artifact") is one of `inputs` or holds one at any depth, symlinks resolved:
/// replacing it would delete the input. Empty paths and inputs that do not exist are skipped.
Status checkNoInputWithin(const std::string& output_dir, const std::string& flag,
                          const std::vector<std::string>& inputs);

/// Whether `path` is `dir` or lies under it, both resolved (symlinks followed; a part that does
/// not exist yet compared as written).
bool isWithinDirectory(const std::string& path, const std::string& dir);

/// Installs handlers of SIGINT, SIGTERM and SIGHUP that remove the temporaries of every
/// uncommitted StagedFile and StagedDirectory of the process, then end it by that signal as the
/// default action would (exit status 128 + signal in a shell). A signal that is ignored when this
/// is called (a background job's SIGINT) stays ignored. Idempotent; for tools, called once at the
/// start of main. Later handlers (apc run's) replace these while they are installed.
void removeTemporariesOnSignal();

/// A file being written: bytes go to a temporary in the target's directory; commit() renames it
/// over the target (atomic on POSIX). Destroying an uncommitted StagedFile removes the temporary,
/// and so does a signal once removeTemporariesOnSignal() is installed.
class StagedFile {
 public:
  /// Opens the temporary for `path`; fails when `path` is an existing directory, a device, a FIFO
  /// or a socket (only regular files are replaced), its directory does not exist, or its absolute
  /// path is too long for the signal handler to remove it.
  static Expected<StagedFile> create(const std::string& path);
  StagedFile(StagedFile&& other) noexcept;
  StagedFile& operator=(StagedFile&& other) noexcept;
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  ~StagedFile();

  /// Writes all of `bytes` to the temporary and flushes it to disk.
  Status write(std::string_view bytes);
  /// Renames the temporary over the target.
  Status commit();
  const std::string& target() const { return target_; }

 private:
  StagedFile() = default;
  void discard();
  std::string target_;
  std::string temp_;
  int slot_ = -1;  // its entry in the signal handler's list of temporaries
};

/// Writes `bytes` to `path` through a StagedFile.
Status writeFileAtomic(const std::string& path, std::string_view bytes);

/// A directory being built beside its target `dir` (a hidden sibling); commit() swaps it in for
/// `dir` as a whole. Destroying an uncommitted StagedDirectory removes the staging directory, and
/// so does a signal once removeTemporariesOnSignal() is installed.
class StagedDirectory {
 public:
  /// Fails when `dir` exists and is not a directory, or is a non-empty directory without the file
  /// `marker` (so not one that this kind of writer made).
  static Expected<StagedDirectory> create(const std::string& dir, const std::string& marker);
  StagedDirectory(StagedDirectory&& other) noexcept;
  StagedDirectory& operator=(StagedDirectory&& other) noexcept;
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;
  ~StagedDirectory();

  /// The staging directory to write into.
  const std::string& path() const { return staging_; }
  const std::string& target() const { return target_; }
  /// Replaces the target with the staging directory: one exchange of the two names (Linux
  /// renameat2 RENAME_EXCHANGE), or, only where the file system or kernel refuses the exchange,
  /// two renames (the old directory aside, the new one in: a signal between them puts the old one
  /// back); then removes the old content.
  Status commit();

 private:
  StagedDirectory() = default;
  void discard();
  std::string target_;
  std::string staging_;
  int slot_ = -1;  // its entry in the signal handler's list of temporaries
};

namespace detail {

/// For tests of StagedDirectory::commit's fallback: with `force` set, commit() swaps by two
/// renames even where the exchange works, and calls `between` (unless null) after the old
/// directory was moved aside, before the new one is moved in. Not for production code.
void setTwoRenameSwapForTesting(bool force, void (*between)());

}  // namespace detail

}  // namespace apc
