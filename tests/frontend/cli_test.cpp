//===- tests/frontend/cli_test.cpp - `apc inspect` end to end --------------===//
//
// Runs the built `apc` binary: good runs print the graph; each bad input gives exactly one line on
// stderr naming the problem and exit code 2.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../common/run_command.h"
#include "../common/samples.h"

namespace {

namespace fs = std::filesystem;

using Result = apc::testing::CommandResult;
using apc::testing::expectOneLineError;

Result runApc(const std::string& args) {
  return apc::testing::runCommand(std::string(APC_BINARY_DIR) + "/tools/apc " + args);
}

const std::string kSamples = apc::testing::samplesDir().string() + "/";

TEST(Cli, InspectPrintsNodesAndTotals) {
  Result r = runApc("inspect " + kSamples + "llama_tiny.pt --input tokens:i64[8,128]");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("layers.1.attention.wq"), std::string::npos);
  EXPECT_NE(r.out.find("aten::embedding"), std::string::npos);
  EXPECT_NE(r.out.find("f32[8,128,256]"), std::string::npos);
  EXPECT_NE(r.out.find("parameters: "), std::string::npos);
  EXPECT_NE(r.out.find("nodes by op:"), std::string::npos);
}

TEST(Cli, InspectJsonHasTotalParams) {
  Result r = runApc("inspect " + kSamples + "llama3_8b.pt --input tokens:i64[8,128] --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["total_params"].get<int64_t>(), 8030261248LL);
  EXPECT_GT(j["nodes"].size(), 3000u);
}

TEST(Cli, InspectUsesRecordedInputShapesByDefault) {
  Result r = runApc("inspect " + kSamples + "toy_block.pt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("%x: f32[8,128,1024]"), std::string::npos) << r.out;
}

TEST(Cli, HelpDescribesFlags) {
  Result top = runApc("--help");
  EXPECT_EQ(top.code, 0);
  EXPECT_NE(top.out.find("inspect"), std::string::npos);
  Result r = runApc("inspect --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--input"), std::string::npos);
  EXPECT_NE(r.out.find("--json"), std::string::npos);
}

TEST(Cli, BadInputsAreOneLineAndExitTwo) {
  expectOneLineError(runApc("inspect /nonexistent/model.pt"), "does not exist");
  expectOneLineError(runApc("inspect " + std::string(APC_SOURCE_DIR) + "/README.md"),
                     "not a readable TorchScript archive");
  expectOneLineError(runApc("inspect " + kSamples + "toy_block.pt --input y:f32[8,128,1024]"),
                     "unknown input 'y'");
  expectOneLineError(runApc("inspect " + kSamples + "toy_block.pt --input x:f32[8,1024]"), "rank");
  expectOneLineError(runApc("inspect " + kSamples + "toy_block.pt --input x:i64[8,128,1024]"),
                     "dtype");
  expectOneLineError(runApc("inspect " + kSamples + "toy_block.pt --input x:f32[8,-1]"),
                     "bad input spec");
  expectOneLineError(runApc("inspect " + kSamples + "toy_block.pt --bogus"), "bogus");
  expectOneLineError(runApc("inspect " + kSamples + "control_flow.pt"), "prim::If");
}

// fuzz_pt's finding: an archive whose code quotes LibTorch's allocator phrase ("...
// DefaultCPUAllocator: can't allocate memory...") in a type name or a token. LibTorch's error
// quotes it back; taken for out of memory, it ended as "out of memory while importing" (and, in
// the fuzzer, as an exception out of the importer).
TEST(Cli, AnArchiveQuotingTheAllocatorsPhraseIsNotOutOfMemory) {
  for (const char* name : {"oom_phrase_in_type_name.pt", "oom_phrase_in_token.pt"}) {
    Result r = runApc("inspect " + std::string(APC_SOURCE_DIR) + "/tests/fuzz/seeds/pt/" + name);
    expectOneLineError(r, "not a readable TorchScript archive");
    EXPECT_EQ(r.err.find("out of memory"), std::string::npos) << r.err;
  }
}

TEST(Cli, TruncatedArchiveIsOneLine) {
  fs::path tmp = fs::temp_directory_path() / ("apc_trunc_" + std::to_string(::getpid()) + ".pt");
  std::ifstream in(kSamples + "gpt2_tiny.pt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(tmp, std::ios::binary) << bytes.substr(0, bytes.size() * 2 / 3);
  expectOneLineError(runApc("inspect " + tmp.string()), "not a readable TorchScript archive");
  fs::remove(tmp);
}

}  // namespace

namespace {

TEST(Cli, StrategiesOnLlama3_8bOn8x8) {
  Result r =
      runApc("inspect " + kSamples + "llama3_8b.pt --mesh 8x8 --mesh-names dp,tp --strategies");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("replicate-only fallbacks: 0\n"), std::string::npos)
      << r.out.substr(r.out.size() - 300);
  EXPECT_NE(r.out.find("total strategies: "), std::string::npos);
  EXPECT_NE(r.out.find("enumerate: "), std::string::npos);
  EXPECT_NE(r.out.find("layers.31.feed_forward.w2"), std::string::npos);
}

TEST(Cli, NoSampleFallsBackToReplicateOnly) {
  std::ifstream f(kSamples + "manifest.json");
  auto manifest = nlohmann::json::parse(f);
  int checked = 0;
  for (const auto& s : manifest["samples"]) {
    if (!s.value("importable", true)) continue;
    for (const char* mesh : {"2x4"}) {  // other meshes: tests/strategy_validator
      Result r = runApc("inspect " + kSamples + s["file"].get<std::string>() + " --mesh " + mesh +
                        " --strategies --json");
      ASSERT_EQ(r.code, 0) << s["name"] << " " << mesh << ": " << r.err;
      auto j = nlohmann::json::parse(r.out);
      const nlohmann::json& fallbacks = j["replicate_only_fallbacks"];
      EXPECT_TRUE(fallbacks.empty()) << s["name"] << " " << mesh << ": " << fallbacks;
      EXPECT_GT(j["total_strategies"].get<int64_t>(), 0);
      ++checked;
    }
  }
  EXPECT_GE(checked, 12);
}

TEST(Cli, BadMeshInputsAreOneLineAndExitTwo) {
  std::string toy = kSamples + "toy_block.pt";
  expectOneLineError(runApc("inspect " + toy + " --mesh 2x4 --world-size 6 --strategies"),
                     "world size is 6");
  expectOneLineError(runApc("inspect " + toy + " --strategies"), "needs a mesh");
  expectOneLineError(runApc("inspect " + toy + " --mesh 2xq --strategies"), "bad mesh shape");
  expectOneLineError(runApc("inspect " + toy + " --mesh 2x4 --mesh-names dp --strategies"),
                     "1 name was given");
  fs::path spec = fs::temp_directory_path() / ("apc_spec_" + std::to_string(::getpid()) + ".json");
  std::ofstream(spec) << R"J({"mesh": {"shape": [2, 4]}, "inputs": {"tokens": ["S(0)", "R"]}})J";
  expectOneLineError(runApc("inspect " + toy + " --spec " + spec.string() + " --strategies"),
                     "tokens");
  std::ofstream(spec) << R"J({"mesh": {"shape": [2, 4], "bandwidth_gbps": [50, 0]}})J";
  expectOneLineError(runApc("inspect " + toy + " --spec " + spec.string()), "bandwidth_gbps[1]");
  std::ofstream(spec) << R"J({"mesh": {"shape": [2, 4]}, "inputs": {"x": ["S(x)", "R"]}})J";
  expectOneLineError(runApc("inspect " + toy + " --spec " + spec.string()), "S(x)");
  std::ofstream(spec) << R"J({"mesh": {"shape": [2, 4]}, "inputs": {"x": ["S(3)", "R"]}})J";
  expectOneLineError(runApc("inspect " + toy + " --spec " + spec.string()), "S(3)");
  fs::remove(spec);
}

}  // namespace

// --- exported programs (.pt2) --------------------------------------------------------------------

namespace {

/// (TorchScript file, exported file) of the samples the manifest lists with an exported program
/// ("exported": {"file": ...}), importable samples only.
std::vector<std::pair<std::string, std::string>> exportedFiles() {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream f(kSamples + "manifest.json");
  if (!f) return out;
  auto manifest = nlohmann::json::parse(f);
  for (const auto& s : manifest["samples"])
    if (s.value("importable", true) && s.contains("exported") && s["exported"].is_object() &&
        s["exported"].value("file", nlohmann::json()).is_string())
      out.emplace_back(s["file"].get<std::string>(), s["exported"]["file"].get<std::string>());
  return out;
}

std::set<std::string> fallbacks(const std::string& file) {
  Result r = runApc("inspect " + kSamples + file + " --mesh 2x4 --strategies --json");
  EXPECT_EQ(r.code, 0) << file << ": " << r.err;
  std::set<std::string> out;
  if (r.code != 0) return out;
  // The parsed document must outlive the loop (a range-for over a member of a temporary reads
  // freed memory: found by the ASan build).
  nlohmann::json doc = nlohmann::json::parse(r.out);
  for (const auto& op : doc["replicate_only_fallbacks"]) out.insert(op.get<std::string>());
  return out;
}

TEST(Cli, ExportedProgramsInspectAndPlan) {
  auto files = exportedFiles();
  if (files.empty()) GTEST_SKIP() << "no exported samples in the manifest";
  fs::path plan = fs::temp_directory_path() / ("apc_plan_" + std::to_string(::getpid()) + ".json");
  for (const auto& [ts, file] : files) {
    SCOPED_TRACE(file);
    // Exporting adds no op without a sharding rule.
    std::set<std::string> ts_fallbacks = fallbacks(ts);
    for (const std::string& op : fallbacks(file)) EXPECT_TRUE(ts_fallbacks.count(op)) << op;
    if (file.find("llama3_8b") != std::string::npos ||
        file.find("llama3_405b") != std::string::npos)
      continue;
    Result p = runApc("plan " + kSamples + file + " --mesh 2x2 -o " + plan.string());
    ASSERT_EQ(p.code, 0) << p.err;
    EXPECT_NE(p.out.find("estimated step time"), std::string::npos);
  }
  fs::remove(plan);
}

TEST(Cli, ExportedProgramBadInputsAreOneLine) {
  auto files = exportedFiles();
  if (files.empty()) GTEST_SKIP() << "no exported samples in the manifest";
  std::string toy = kSamples + "toy_block.pt2";
  if (!fs::exists(toy)) toy = kSamples + files.front().second;
  fs::path tmp = fs::temp_directory_path() / ("apc_trunc_" + std::to_string(::getpid()) + ".pt2");
  std::ifstream in(toy, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(tmp, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expectOneLineError(runApc("inspect " + tmp.string()), "not a readable model archive");
  fs::remove(tmp);
  expectOneLineError(runApc("inspect /nonexistent/model.pt2"), "does not exist");
  if (toy == kSamples + "toy_block.pt2") {
    expectOneLineError(runApc("inspect " + toy + " --input x:f32[B=8,128,512]"), "static");
    expectOneLineError(runApc("inspect " + toy + " --input y:f32[8,128,1024]"), "unknown input");
  }
}

}  // namespace
