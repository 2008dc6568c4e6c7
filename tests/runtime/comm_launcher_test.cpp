//===- tests/runtime/comm_launcher_test.cpp - `apc run` end to end ---------===//
//
// Drives the built `apc run` with the comm_worker rank program and plain shell commands: the
// torchrun variables, output tagging, the supervision of failing and killed ranks (the others are
// stopped and the failing rank is named), a peer that leaves before a collective (the others get
// a CommError naming the group), the overall timeout, and the one-line usage errors.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "../common/run_command.h"

namespace {

using apc::testing::CommandResult;
using apc::testing::expectOneLineError;
using apc::testing::kApc;
using apc::testing::runCommand;
using Clock = std::chrono::steady_clock;

const std::string kWorker = std::string(APC_BINARY_DIR) + "/tests/runtime/comm_worker";

std::string artifactDir() {
  auto dir = std::filesystem::temp_directory_path() / "apc_run_test_artifact";
  std::filesystem::create_directories(dir);
  return dir.string();
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(ApcRunTest, SetsTheTorchrunVariables) {
  std::string dir = artifactDir();
  CommandResult r = runCommand(
      kApc + " run " + dir + " --nproc 3 --tag-output -- sh -c " +
      "'echo $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$MASTER_ADDR/$APC_ARTIFACT; "
      "test -n \"$MASTER_PORT\"'");
  EXPECT_EQ(r.code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[rank " + std::to_string(rank) + "] " + std::to_string(rank) + "/3/" +
                       std::to_string(rank) + "/3/127.0.0.1/" + dir + "\n";
    EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  }
}

TEST(ApcRunTest, RanksCommunicate) {
  CommandResult r = runCommand(kApc + " run " + artifactDir() + " --nproc 4 -- " + kWorker + " ok");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST(ApcRunTest, FailingRankStopsTheOthers) {
  auto start = Clock::now();
  CommandResult r =
      runCommand(kApc + " run " + artifactDir() + " --nproc 4 -- " + kWorker + " fail 2 7");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(apc::testing::withoutProgress(r.err), "apc run: rank 2 exited with status 7\n");
  EXPECT_LT(secondsSince(start), 20);  // the others sleep 60 s unless stopped
}

TEST(ApcRunTest, KilledRankIsReported) {
  auto start = Clock::now();
  CommandResult r =
      runCommand(kApc + " run " + artifactDir() + " --nproc 3 -- " + kWorker + " kill 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(apc::testing::withoutProgress(r.err).rfind("apc run: rank 1 killed by signal 9", 0), 0u)
      << r.err;
  EXPECT_LT(secondsSince(start), 20);
}

TEST(ApcRunTest, PeerLeavingBeforeACollectiveGivesCommError) {
  auto start = Clock::now();
  CommandResult r =
      runCommand(kApc + " run " + artifactDir() + " --nproc 4 -- " + kWorker + " exit-early 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find(": CommError: mesh dim 0 (d0) ranks {0,1,2,3}: all-reduce "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.err.find("exited with status 3"), std::string::npos) << r.err;
  EXPECT_LT(secondsSince(start), 20);  // the collective timeout is 5 s
}

TEST(ApcRunTest, Timeout) {
  auto start = Clock::now();
  CommandResult r =
      runCommand(kApc + " run " + artifactDir() + " --nproc 2 --timeout 1 -- sleep 30");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(apc::testing::withoutProgress(r.err), "apc run: timed out after 1 s\n");
  EXPECT_LT(secondsSince(start), 10);
}

TEST(ApcRunTest, CommandThatCannotStart) {
  CommandResult r =
      runCommand(kApc + " run " + artifactDir() + " --nproc 2 -- /nonexistent/program");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot execute '/nonexistent/program'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exited with status 127"), std::string::npos) << r.err;
}

TEST(ApcRunTest, UsageErrors) {
  expectOneLineError(runCommand(kApc + " run " + artifactDir() + " --nproc 2"), "no command");
  expectOneLineError(runCommand(kApc + " run " + artifactDir() + " --nproc 2 --"), "no command");
  expectOneLineError(runCommand(kApc + " run /nonexistent/dir --nproc 2 -- true"),
                     "artifact directory '/nonexistent/dir' does not exist");
  expectOneLineError(runCommand(kApc + " run " + artifactDir() + " --nproc 0 -- true"),
                     "--nproc: must be an integer in [1, 1024], got '0'");
}

}  // namespace
