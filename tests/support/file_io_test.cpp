//===- tests/support/file_io_test.cpp - JSON pre-scan, atomic writes --------===//
//
// checkJsonText (NUL bytes, nesting), printable, checkNotInput, StagedFile (temporary beside the
// target, renamed over it; nothing left behind on failure) and StagedDirectory (swapped in as a
// whole; refuses to replace a non-empty directory without the marker).
//
//===----------------------------------------------------------------------===//
#include "apc/support/file_io.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
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

}  // namespace
}  // namespace apc
