//===- tests/lower/cli_lower_test.cpp - `apc lower` and `apc plan --artifact` ===//
//
// End to end through the real binary (built when APC_WITH_TORCH): `apc plan --artifact` and
// `apc lower` write byte-identical artifacts for the same plan, and a model that is not the
// plan's, a missing plan or an unwritable directory give one line on stderr and exit 2.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../common/run_command.h"

namespace apc::lower {
namespace {

namespace fs = std::filesystem;

std::string bytesOf(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(CliLower, PlanArtifactEqualsLower) {
  const std::string apc = std::string(APC_BINARY_DIR) + "/tools/apc";
  const std::string model = std::string(APC_SOURCE_DIR) + "/sample_models/out/mlp_stack.pt";
  fs::path dir = fs::temp_directory_path() / ("apc_cli_lower_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto planned = apc::testing::runCommand(apc + " plan " + model + " --mesh 2x2 -o " +
                                          (dir / "plan.json").string() + " --artifact " +
                                          (dir / "a").string());
  ASSERT_EQ(planned.code, 0) << planned.err;
  auto lowered = apc::testing::runCommand(apc + " lower " + (dir / "plan.json").string() + " " +
                                          model + " -o " + (dir / "b").string());
  ASSERT_EQ(lowered.code, 0) << lowered.err;
  EXPECT_NE(lowered.out.find("4 rank programs"), std::string::npos) << lowered.out;
  for (const char* f :
       {"manifest.json", "rank_0.apcp", "rank_1.apcp", "rank_2.apcp", "rank_3.apcp"})
    EXPECT_EQ(bytesOf(dir / "a" / f), bytesOf(dir / "b" / f)) << f;

  std::string other = std::string(APC_SOURCE_DIR) + "/sample_models/out/toy_block.pt";
  apc::testing::expectOneLineError(
      apc::testing::runCommand(apc + " lower " + (dir / "plan.json").string() + " " + other +
                               " -o " + (dir / "c").string()),
      "not the one the plan was made from");
  apc::testing::expectOneLineError(
      apc::testing::runCommand(apc + " lower " + (dir / "nope.json").string() + " -o " +
                               (dir / "c").string()),
      "nope.json");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace apc::lower
