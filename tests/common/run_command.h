//===- tests/common/run_command.h - Run a command, capture its output ------===//
//
// Shared by the tests that drive the built `apc` binary end to end: runs a shell command, returns
// its exit code, standard output and standard error, and checks the one-line error convention
// (exit code 2, exactly one line on stderr naming the problem).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace apc::testing {

struct CommandResult {
  int code = -1;  // exit code; -1 when the command did not exit normally
  std::string out;
  std::string err;
};

/// Runs `cmd` through the shell; stderr goes through a temporary file.
inline CommandResult runCommand(const std::string& cmd) {
  static int counter = 0;
  std::filesystem::path err =
      std::filesystem::temp_directory_path() /
      ("apc_cmd_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".err");
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>" + err.string()).c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err);
  r.err.assign((std::istreambuf_iterator<char>(e)), {});
  std::error_code ec;
  std::filesystem::remove(err, ec);
  return r;
}

/// `err` without the progress lines of long phases (`apc: progress: ...`) and of `apc run`
/// (`apc run: progress: started 4 ranks ...`, `... rank 2 connected (3/4, 1.4 s)`).
inline std::string withoutProgress(const std::string& err) {
  std::string out;
  size_t pos = 0;
  while (pos < err.size()) {
    size_t end = err.find('\n', pos);
    end = end == std::string::npos ? err.size() : end + 1;
    if (err.compare(pos, 15, "apc: progress: ") != 0 &&
        err.compare(pos, 19, "apc run: progress: ") != 0)
      out.append(err, pos, end - pos);
    pos = end;
  }
  return out;
}

/// Exit code 2 and exactly one line on stderr, `apc: error: ...`, that contains `needle`
/// (progress lines of long phases aside).
inline void expectOneLineError(const CommandResult& full, const std::string& needle) {
  CommandResult r = full;
  r.err = withoutProgress(full.err);
  EXPECT_EQ(r.code, 2) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line: " << r.err;
  EXPECT_EQ(r.err.rfind("apc: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

/// The binaries of this build and the sample models' directory (ending in '/'): one definition
/// for every end-to-end test file (the files of a test binary compile together in a unity build).
inline const std::string kApc = std::string(APC_BINARY_DIR) + "/tools/apc";
inline const std::string kApcTrain = std::string(APC_BINARY_DIR) + "/tools/apc-train";
inline const std::string kSamples = std::string(APC_SOURCE_DIR) + "/sample_models/out/";

/// A whole file's bytes ("" when it cannot be read).
inline std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return out;
}

/// Writes `text` as the whole file.
inline void writeFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace apc::testing
