//===- tests/support/file_io_test.cpp - JSON pre-scan, atomic writes --------===//
//
// checkJsonText (NUL bytes, nesting), printable, checkNotInput, StagedFile (temporary beside the
// target, renamed over it; nothing left behind on failure or on SIGINT/SIGTERM; never over a
// device or FIFO) and StagedDirectory (swapped in as a whole; refuses to replace a non-empty
// directory without the marker), checkNoInputWithin and isWithinDirectory.
//
//===----------------------------------------------------------------------===//
#include "apc/support/file_io.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace apc {
namespace {

namespace fs = std::filesystem;

class FileIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("apc_file_io_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static void write(const std::string& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
  }
  /// Names in the directory (hidden temporaries included).
  std::vector<std::string> entries(const fs::path& d) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST(CheckJsonText, NestingAndNulBytes) {
  EXPECT_TRUE(checkJsonText("{\"a\": [1, {\"b\": []}]}").ok());
  EXPECT_TRUE(checkJsonText(std::string(64, '[') + std::string(64, ']')).ok());
  Status deep = checkJsonText(std::string(65, '{'));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.error().code(), ErrorCode::kParse);
  EXPECT_EQ(deep.error().message(),
            "JSON nested deeper than 64 levels at byte 64 (apc reads at most 64)");
  EXPECT_FALSE(checkJsonText("[[[", 2).ok());
  // Brackets in strings, escaped quotes.
  EXPECT_TRUE(checkJsonText("[\"[[[[\\\"[[[\"]", 1).ok());
  Status nul = checkJsonText(std::string("{}\0x", 4));
  ASSERT_FALSE(nul.ok());
  EXPECT_EQ(nul.error().message(),
            "malformed JSON: a NUL byte at byte 2 (JSON text holds no NUL bytes)");
  // A million levels: linear, no recursion.
  EXPECT_FALSE(checkJsonText(std::string(1000000, '[')).ok());
}

TEST(Printable, EscapesControlCharactersAndShortens) {
  EXPECT_EQ(printable("layers.0"), "layers.0");
  EXPECT_EQ(printable("a\nb\tc\x01\\"), "a\\nb\\tc\\x01\\\\");
  EXPECT_EQ(printable(std::string(100, 'x'), 10), std::string(10, 'x') + "...");
}

TEST_F(FileIo, AtomicWriteReplacesAndLeavesNoTemporary) {
  std::string p = path("plan.json");
  write(p, "old");
  ASSERT_TRUE(writeFileAtomic(p, "new content").ok());
  EXPECT_EQ(read(p), "new content");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"plan.json"});
  // A directory or a missing parent: an error, nothing written.
  fs::create_directories(path("sub"));
  Status into_dir = writeFileAtomic(path("sub"), "x");
  ASSERT_FALSE(into_dir.ok());
  EXPECT_NE(into_dir.error().message().find("is a directory"), std::string::npos);
  Status missing = writeFileAtomic(path("nope/plan.json"), "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("does not exist"), std::string::npos);
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"plan.json", "sub"}));
}

TEST_F(FileIo, UncommittedStagedFileLeavesTheTargetAlone) {
  std::string p = path("plan.json");
  write(p, "old");
  {
    auto f = StagedFile::create(p);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->write("half").ok());
    EXPECT_EQ(entries(dir_).size(), 2u);  // the target and the temporary
  }
  EXPECT_EQ(read(p), "old");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"plan.json"});
}

TEST_F(FileIo, CheckNotInputComparesFilesNotNames) {
  std::string model = path("m.pt");
  write(model, "model");
  fs::create_symlink(model, path("link.pt"));
  EXPECT_TRUE(checkNotInput(path("other.json"), "-o", {model}).ok());
  Status same = checkNotInput(path("./m.pt"), "-o", {model});
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.error().message().find("refusing to write over an input"), std::string::npos);
  EXPECT_FALSE(checkNotInput(path("link.pt"), "-o", {"", model}).ok());
}

TEST_F(FileIo, StagedDirectoryIsSwappedInAsAWhole) {
  std::string art = path("art");
  fs::create_directories(art);
  write(art + "/manifest.json", "old");
  write(art + "/rank_3.apcp", "stale");
  {
    auto d = StagedDirectory::create(art + "/", "manifest.json");
    ASSERT_TRUE(d.ok()) << d.error().message();
    write(d->path() + "/manifest.json", "new");
    write(d->path() + "/rank_0.apcp", "r0");
    EXPECT_EQ(read(art + "/manifest.json"), "old");  // nothing visible before commit
    ASSERT_TRUE(d->commit().ok());
  }
  EXPECT_EQ(entries(art), (std::vector<std::string>{"manifest.json", "rank_0.apcp"}));
  EXPECT_EQ(read(art + "/manifest.json"), "new");
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"art"});
  // A fresh directory, including missing parents.
  {
    auto d = StagedDirectory::create(path("a/b/c"), "manifest.json");
    ASSERT_TRUE(d.ok());
    write(d->path() + "/manifest.json", "m");
    ASSERT_TRUE(d->commit().ok());
  }
  EXPECT_EQ(read(path("a/b/c/manifest.json")), "m");
  // Uncommitted: removed, target untouched.
  {
    auto d = StagedDirectory::create(art, "manifest.json");
    ASSERT_TRUE(d.ok());
    write(d->path() + "/manifest.json", "never");
  }
  EXPECT_EQ(read(art + "/manifest.json"), "new");
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"a", "art"}));
}

TEST_F(FileIo, StagedDirectoryRefusesFilesAndForeignDirectories) {
  write(path("file"), "x");
  auto file = StagedDirectory::create(path("file"), "manifest.json");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.error().message().find("exists and is not a directory"), std::string::npos);
  fs::create_directories(path("home"));
  write(path("home/notes.txt"), "mine");
  auto foreign = StagedDirectory::create(path("home"), "manifest.json");
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.error().message().find("without manifest.json; refusing to replace it"),
            std::string::npos);
  EXPECT_EQ(read(path("home/notes.txt")), "mine");
  fs::create_directories(path("empty"));
  EXPECT_TRUE(StagedDirectory::create(path("empty"), "manifest.json").ok());
}

// Issue 32: a spec, plan or manifest path naming a FIFO blocked the reader until a writer came;
// /dev/zero grew its buffer until memory ran out. Only regular files are read, and at most a cap.
TEST_F(FileIo, ReadInputFileReadsOnlyBoundedRegularFiles) {
  std::string p = path("spec.json");
  write(p, "{\"mesh\": {}}");
  auto ok = readInputFile(p);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(*ok, "{\"mesh\": {}}");
  // Through a symlink: the file it names.
  fs::create_symlink(p, path("link.json"));
  EXPECT_TRUE(readInputFile(path("link.json")).ok());

  auto expectRefused = [](const std::string& file, ErrorCode code, const std::string& message) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = readInputFile(file);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    ASSERT_FALSE(r.ok()) << file;
    EXPECT_EQ(r.error().code(), code) << r.error().message();
    EXPECT_EQ(r.error().message(), message);
    if (message.find("more than") == std::string::npos) {
      EXPECT_FALSE(checkRegularFile(file).ok()) << file;
    }
  };
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0) << std::strerror(errno);
  expectRefused(path("fifo"), ErrorCode::kInvalidArgument,
                "cannot read '" + path("fifo") + "': is a FIFO, not a regular file");
  fs::create_symlink(path("fifo"), path("fifo_link"));
  expectRefused(path("fifo_link"), ErrorCode::kInvalidArgument,
                "cannot read '" + path("fifo_link") + "': is a FIFO, not a regular file");
  expectRefused("/dev/zero", ErrorCode::kInvalidArgument,
                "cannot read '/dev/zero': is a character device, not a regular file");
  fs::create_directories(path("dir"));
  expectRefused(path("dir"), ErrorCode::kInvalidArgument,
                "cannot read '" + path("dir") + "': is a directory, not a regular file");
  expectRefused(path("nope.json"), ErrorCode::kNotFound,
                "cannot read '" + path("nope.json") + "': No such file or directory");
  int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string sock_path = path("sock");
  ASSERT_LT(sock_path.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock_path.c_str(), sock_path.size() + 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  expectRefused(sock_path, ErrorCode::kInvalidArgument,
                "cannot read '" + sock_path + "': is a socket, not a regular file");
  ::close(sock);

  // The cap: a file of 11 bytes read with a cap of 10.
  write(path("big.json"), "01234567890");
  auto big = readInputFile(path("big.json"), 10);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(big.error().message(), "cannot read '" + path("big.json") +
                                       "': is 11 bytes, more than the 10 bytes apc reads");
  EXPECT_TRUE(readInputFile(path("big.json"), 11).ok());
  EXPECT_EQ(byteSizeText(kMaxInputFileBytes), "1 GiB");
  EXPECT_EQ(byteSizeText(64 << 10), "64 KiB");
}

// Issue 32: -o onto a device node replaced the node with a regular file (as root, -o /dev/null
// would replace the machine's /dev/null). Only regular files are replaced.
TEST_F(FileIo, StagedFilesReplaceOnlyRegularFiles) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  for (const std::string& target : {path("fifo"), std::string("/dev/null")}) {
    SCOPED_TRACE(target);
    auto f = StagedFile::create(target);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(f.error().message().find("apc writes only regular files (refusing to replace it)"),
              std::string::npos)
        << f.error().message();
  }
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"fifo"});
  // A symlink to a regular file is written through the rename (the link is replaced).
  write(path("plan.json"), "old");
  fs::create_symlink(path("plan.json"), path("link.json"));
  EXPECT_TRUE(writeFileAtomic(path("link.json"), "new").ok());
}

TEST_F(FileIo, DirectoriesThatHoldAnInputAreNotReplaced) {
  fs::create_directories(path("art/sub"));
  write(path("art/model.pt"), "m");
  write(path("art/sub/spec.json"), "{}");
  write(path("other.json"), "{}");
  EXPECT_TRUE(isWithinDirectory(path("art/model.pt"), path("art")));
  EXPECT_TRUE(isWithinDirectory(path("art"), path("art/")));
  EXPECT_TRUE(isWithinDirectory(path("art/sub/../model.pt"), path("./art")));
  EXPECT_FALSE(isWithinDirectory(path("artifact/x"), path("art")));
  EXPECT_FALSE(isWithinDirectory(path("other.json"), path("art")));
  fs::create_directory_symlink(path("art"), path("alias"));
  EXPECT_TRUE(isWithinDirectory(path("alias/model.pt"), path("art")));
  Status s = checkNoInputWithin(path("art"), "--artifact",
                                {path("other.json"), path("alias/sub/spec.json")});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.error().message(), "--artifact " + path("art") + " holds the input " +
                                     path("alias/sub/spec.json") +
                                     ", and is replaced as a whole; refusing to delete an input "
                                     "(write the output elsewhere)");
  EXPECT_FALSE(checkNoInputWithin(path("art"), "-o", {path("art")}).ok());
  EXPECT_TRUE(checkNoInputWithin(path("new"), "-o", {path("other.json"), ""}).ok());
  EXPECT_TRUE(checkNoInputWithin("", "-o", {path("art/model.pt")}).ok());
}

// Issue 32: SIGINT or SIGTERM while an output was written left the hidden temporary of -o, and
// during an artifact write a staging directory with every rank file. A child process stages a
// file and a directory (with a subdirectory), then gets the signal: it ends by that signal and
// leaves nothing but the untouched old target.
TEST_F(FileIo, SignalsRemoveTemporaries) {
  write(path("plan.json"), "old");
  for (int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      removeTemporariesOnSignal();
      auto f = StagedFile::create(path("plan.json"));
      auto d = StagedDirectory::create(path("art"), "manifest.json");
      if (!f.ok() || !d.ok() || !f->write("half").ok()) ::_exit(3);
      fs::create_directories(fs::path(d->path()) / "sub" / "deeper");
      write((fs::path(d->path()) / "rank_0.apcp").string(), "r0");
      write((fs::path(d->path()) / "sub" / "deeper" / "x").string(), "x");
      // A committed file is kept.
      if (!writeFileAtomic(path("kept.json"), "k").ok()) ::_exit(4);
      ::raise(sig);
      ::_exit(5);  // not reached: the handler ends the process by the signal
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
    EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_EQ(entries(dir_), (std::vector<std::string>{"kept.json", "plan.json"}));
    EXPECT_EQ(read(path("plan.json")), "old");
    fs::remove(path("kept.json"));
  }
  // An ignored signal stays ignored (a background job's SIGINT).
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGINT, SIG_IGN);
    removeTemporariesOnSignal();
    ::raise(SIGINT);
    ::_exit(7);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << status;
}

}  // namespace
}  // namespace apc
