//===- tests/plan/hardening_cli_test.cpp - Adversarial input to the apc CLI ===//
//
// Each case of issue 13 through the real binary: deeply nested JSON, huge or tiny link numbers,
// oversized meshes, outputs that would overwrite an input, -o with --artifact, long dynamic lists,
// trailing garbage, bad flag values, conflicting pins, Partial inputs, broken manifests; and of
// issue 32, plans edited after apc plan wrote them (a placement flipped, the hash changed) and
// inputs that are FIFOs, devices, directories or over the 1 GiB read cap, and running out of
// memory. Every
// one is one line on stderr and exit 2, and nothing is written over an input.
// Skipped when the tool is not built (APC_WITH_TORCH=OFF).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/run_command.h"
#include "apc/ir/proto_io.h"
#include "apc/support/base64.h"

namespace {

namespace fs = std::filesystem;

using Result = apc::testing::CommandResult;
using apc::testing::expectOneLineError;

using apc::testing::kApc;
const std::string kMlp = std::string(APC_SOURCE_DIR) + "/sample_models/out/mlp_stack.pt";

class Hardening : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef APC_HAVE_CLI
    GTEST_SKIP() << "the apc tool is not built (APC_WITH_TORCH=OFF)";
#endif
    dir_ = fs::temp_directory_path() /
           ("apc_hardening_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string tmp(const std::string& name) const {
    return (dir_ / name).string();
  }
  static Result apc(const std::string& args) {
    return apc::testing::runCommand(kApc + " " + args);
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::string p = tmp(name);
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::vector<std::string> entries(const std::string& d) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

std::string deep(size_t n) {
  return std::string(n, '[') + "null" + std::string(n, ']');
}

TEST_F(Hardening, DeeplyNestedJsonIsOneLine) {
  std::string out = write("deep.json", deep(100000));
  expectOneLineError(
      apc("plan " + kMlp + " --mesh 2 --out-shardings " + out + " -o " + tmp("x.json")),
      "JSON nested deeper than 64 levels");
  std::string spec =
      write("deep_spec.json", "{\"mesh\": {\"shape\": [2]}, \"outputs\": " + deep(30000) + "}");
  expectOneLineError(apc("plan " + kMlp + " --spec " + spec), "JSON nested deeper than 64 levels");
  // A plan whose spec.outputs nests deeply.
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json")).code, 0);
  std::string plan = read(tmp("p.json"));
  size_t at = plan.find("\"spec\": {");
  ASSERT_NE(at, std::string::npos);
  plan.insert(at + 9, "\"outputs\": " + deep(100000) + ", ");
  write("deep_plan.json", plan);
  expectOneLineError(apc("explain " + tmp("deep_plan.json")), "JSON nested deeper than 64 levels");
  expectOneLineError(apc("diff " + tmp("deep_plan.json") + " " + tmp("p.json")),
                     "JSON nested deeper than 64 levels");
  EXPECT_FALSE(fs::exists(tmp("x.json")));
}

TEST_F(Hardening, LinkNumbersHaveSaneRanges) {
  std::string lat = write("lat.json", R"j({"mesh": {"shape": [2], "latency_us": [1e308]}})j");
  expectOneLineError(apc("plan " + kMlp + " --spec " + lat),
                     "$.mesh.latency_us[0]: latency (us) must be in [0, 1e+06]");
  std::string bw = write("bw.json", R"j({"mesh": {"shape": [2], "bandwidth_gbps": [5e-324]}})j");
  expectOneLineError(apc("plan " + kMlp + " --spec " + bw),
                     "$.mesh.bandwidth_gbps[0]: bandwidth (GB/s) must be in [0.001, 1e+06]");
  // The extremes of the ranges plan.
  std::string slow = write(
      "slow.json", R"j({"mesh": {"shape": [2], "latency_us": [1e6], "bandwidth_gbps": [0.001]}})j");
  Result r = apc("plan " + kMlp + " --spec " + slow + " --quiet -o " + tmp("slow_plan.json"));
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(Hardening, MeshesAreCapped) {
  expectOneLineError(apc("plan " + kMlp + " --mesh 4611686018427387904x2"),
                     "a device mesh has at most 65536 devices");
  std::string many = "2";
  for (int i = 1; i < 62; ++i) many += "x2";
  expectOneLineError(apc("plan " + kMlp + " --mesh " + many + " --memory-budget 0,1"),
                     "a device mesh has at most 4 dims, got 62");
  expectOneLineError(apc("plan " + kMlp + " --mesh 2147483648"),
                     "a device mesh has at most 65536 devices");
  // A plan edited to a mesh of 2^31 devices is refused by lower and explain.
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json")).code, 0);
  auto plan = nlohmann::json::parse(read(tmp("p.json")));
  plan["spec"]["mesh"]["shape"] = {2147483648LL};
  write("big.json", plan.dump());
  expectOneLineError(apc("lower " + tmp("big.json") + " " + kMlp + " -o " + tmp("art")),
                     "at most 65536 devices");
  expectOneLineError(apc("explain " + tmp("big.json")), "at most 65536 devices");
}

TEST_F(Hardening, NothingIsWrittenOverAnInput) {
  fs::copy_file(kMlp, tmp("m.pt"));
  std::string before = read(tmp("m.pt"));
  expectOneLineError(apc("plan " + tmp("m.pt") + " --mesh 2 -o " + tmp("m.pt")),
                     "refusing to write over an input");
  expectOneLineError(apc("plan " + tmp("m.pt") + " --mesh 2 -o " + tmp("./m.pt")),
                     "refusing to write over an input");
  std::string spec = write("s.json", R"j({"mesh": {"shape": [2]}})j");
  expectOneLineError(apc("plan " + tmp("m.pt") + " --spec " + spec + " -o " + spec),
                     "refusing to write over an input");
  expectOneLineError(apc("plan " + tmp("m.pt") + " --mesh 2 --timings-json " + tmp("m.pt")),
                     "refusing to write over an input");
  EXPECT_EQ(read(tmp("m.pt")), before);
  ASSERT_EQ(apc("plan " + tmp("m.pt") + " --mesh 2 -o " + tmp("p.json")).code, 0);
  std::string plan = read(tmp("p.json"));
  expectOneLineError(apc("lower " + tmp("p.json") + " " + tmp("m.pt") + " -o " + tmp("p.json")),
                     "refusing to write over an input");
  EXPECT_EQ(read(tmp("p.json")), plan);
  EXPECT_EQ(read(tmp("m.pt")), before);
}

TEST_F(Hardening, PlanAndArtifactSucceedOrFailTogether) {
  // --artifact at a regular file: fails before anything is written.
  write("file", "mine");
  expectOneLineError(
      apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --artifact " + tmp("file")),
      "exists and is not a directory");
  EXPECT_FALSE(fs::exists(tmp("p.json")));
  EXPECT_EQ(read(tmp("file")), "mine");
  // --artifact into a non-empty directory that is not an artifact: refused, untouched.
  fs::create_directories(tmp("home"));
  write("home/notes.txt", "mine");
  expectOneLineError(
      apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --artifact " + tmp("home")),
      "refusing to replace it");
  EXPECT_FALSE(fs::exists(tmp("p.json")));
  EXPECT_EQ(entries(tmp("home")), std::vector<std::string>{"notes.txt"});
  // An artifact of 4 ranks replaced by one of 2: no stale rank files.
  Result four = apc("plan " + kMlp + " --mesh 2x2 -o " + tmp("p.json") + " --artifact " + tmp("a"));
  ASSERT_EQ(four.code, 0) << four.err;
  Result two = apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --artifact " + tmp("a"));
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_EQ(entries(tmp("a")),
            (std::vector<std::string>{"manifest.json", "rank_0.apcp", "rank_1.apcp"}));
  // No temporaries or staging directories left beside the outputs.
  EXPECT_EQ(entries(dir_.string()), (std::vector<std::string>{"a", "file", "home", "p.json"}));
  expectOneLineError(apc("plan " + kMlp + " --mesh 2 -o " + tmp("a") + " --artifact " + tmp("a")),
                     "-o and --artifact name the same path");
}

TEST_F(Hardening, LongDynamicListsAreQuickErrors) {
  std::string list = "[";
  for (int i = 0; i < 100000; ++i)
    list += (i ? "," : "") + std::string("{\"input\": \"x\", \"dim\": ") + std::to_string(i % 3) +
            ", \"min\": " + std::to_string(i / 3 + 1) + "}";
  std::string spec = write("dyn.json", "{\"mesh\": {\"shape\": [2]}, \"dynamic\": " + list + "]}");
  auto t0 = std::chrono::steady_clock::now();
  expectOneLineError(apc("plan " + kMlp + " --spec " + spec),
                     "$.dynamic: a list of 100000 dynamic dims; at most 1024");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

TEST_F(Hardening, SilentAcceptancesAreErrors) {
  std::string nul = tmp("nul.json");
  {
    std::ofstream f(nul, std::ios::binary);
    f << R"j({"mesh": {"shape": [2]}})j";
    f.put('\0');
    f << "garbage";
  }
  expectOneLineError(apc("plan " + kMlp + " --spec " + nul), "a NUL byte at byte 24");
  expectOneLineError(apc("plan " + kMlp + " --mesh 2 --world-size -3"), "--world-size");
  expectOneLineError(apc("inspect " + kMlp + " --input x:f32[8,64] --input x:f32[4,64]"),
                     "--input: input 'x' is given twice");
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json")).code, 0);
  expectOneLineError(apc("explain " + tmp("p.json") + " --top -1"), "--top");
  std::string dyn = write("dyn.json", R"j({"mesh": {"shape": [2]}, "dynamic": [{"input": "x",
      "dim": 0, "min": 9223372036854775807, "max": 9223372036854775807}]})j");
  expectOneLineError(apc("plan " + kMlp + " --spec " + dyn), "$.dynamic[0].min: min must be in");
  std::string pins = write("pins.json", R"j({"mesh": {"shape": [2]}, "pins": [
      {"node": "x", "placements": ["S(0)"]}, {"node": "x", "placements": ["R"]}]})j");
  expectOneLineError(apc("plan " + kMlp + " --spec " + pins),
                     "$.pins[1]: node 'x' is pinned twice (first at $.pins[0] to S(0), here to R)");
  expectOneLineError(apc("run " + dir_.string() + " --nproc 100000 -- true"), "--nproc");
}

TEST_F(Hardening, MisleadingErrorsNameTheProblem) {
  std::string in = write("in.json", R"j([["P"]])j");
  expectOneLineError(apc("plan " + kMlp + " --mesh 2 --in-shardings " + in),
                     "P is not a placement for an input");
  std::string spec = write("p_in.json", R"j({"mesh": {"shape": [2]}, "inputs": {"x": ["P"]}})j");
  expectOneLineError(apc("plan " + kMlp + " --spec " + spec), "never Partial");
  std::string ctl = write("ctl.json",
                          "{\"mesh\": {\"shape\": [2]}, \"pins\": [{\"module\": "
                          "\"lay\\u0001ers\\n0\", \"placements\": [\"R\"]}]}");
  Result r = apc("plan " + kMlp + " --spec " + ctl);
  expectOneLineError(r, "spec pins module 'lay\\x01ers\\n0'");
  // A shape function that fails inside TorchScript code: its cause, not the interpreter's header.
  Result shape = apc("inspect " + kMlp + " --input x:f32[8,64,7]");
  expectOneLineError(shape, "The size of tensor a 7 must match the size of tensor b (128)");
  EXPECT_EQ(shape.err.find("TorchScript interpreter"), std::string::npos) << shape.err;
}

TEST_F(Hardening, BrokenManifestsAreOneLine) {
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --artifact " + tmp("a")).code,
            0);
  std::string manifest = read(tmp("a/manifest.json"));
  auto j = nlohmann::json::parse(manifest);
  j.erase("files");
  write("a/manifest.json", j.dump());
  std::string train = std::string(APC_BINARY_DIR) + "/tools/apc-train";
  Result no_files = apc::testing::runCommand(train + " " + tmp("a") + " --steps 1");
  EXPECT_EQ(no_files.code, 2) << no_files.err;
  EXPECT_NE(no_files.err.find("missing key 'files'"), std::string::npos) << no_files.err;
  EXPECT_EQ(no_files.err.find("json.exception"), std::string::npos) << no_files.err;
  write("a/manifest.json", manifest.substr(0, manifest.size() / 2));
  Result truncated = apc::testing::runCommand(train + " " + tmp("a") + " --steps 1");
  EXPECT_EQ(truncated.code, 2) << truncated.err;
  EXPECT_NE(truncated.err.find("malformed JSON"), std::string::npos) << truncated.err;
}

// Issue 32: an edited plan (a node's output placement changed from P to R in the JSON) passed
// `apc validate` and `apc lower` and trained to other losses. Plans are verified: placements
// against each node's chosen strategy, the content against its content_hash.
TEST_F(Hardening, EditedPlansAreRefused) {
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2x2 -o " + tmp("p.json")).code, 0);
  const std::string text = read(tmp("p.json"));
  Result ok = apc("validate " + tmp("p.json") + " " + kMlp);
  ASSERT_EQ(ok.code, 0) << ok.err;
  Result lowered = apc("lower " + tmp("p.json") + " -o " + tmp("art"));
  ASSERT_EQ(lowered.code, 0) << lowered.err;
  const nlohmann::json plan = nlohmann::json::parse(text);
  // The first op whose output is Partial: flipped to R on that mesh dim.
  nlohmann::json flipped = plan;
  std::string name;
  size_t index = 0;
  for (size_t i = 0; i < flipped["nodes"].size() && name.empty(); ++i) {
    nlohmann::json& n = flipped["nodes"][i];
    if (n["kind"] != "op") continue;
    for (auto& p : n["output_placements"])
      if (p == "P") {
        p = "R";
        name = n["name"];
        index = i;
      }
    if (!name.empty() && n.contains("outputs")) n["outputs"][0] = n["output_placements"];
  }
  ASSERT_FALSE(name.empty()) << "no Partial output in the plan";
  write("flipped.json", flipped.dump(2));
  const std::string where = "$.nodes[" + std::to_string(index) + "] '" + name + "' (aten::";
  for (const std::string& cmd : {"validate " + tmp("flipped.json") + " " + kMlp,
                                 "lower " + tmp("flipped.json") + " -o " + tmp("art_flipped")}) {
    SCOPED_TRACE(cmd);
    Result r = apc(cmd);
    expectOneLineError(r, where);
    EXPECT_NE(r.err.find("): outputs placed "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("but its strategy "), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(tmp("art_flipped")));
  // The hash changed, or a strategy index changed without it: refused by every reader.
  nlohmann::json rehashed = plan;
  rehashed["content_hash"] = std::string(64, 'f');
  write("hash.json", rehashed.dump(2));
  nlohmann::json chosen = plan;
  for (auto& n : chosen["nodes"])
    if (n["kind"] == "op" && n["num_strategies"].get<int>() > 1) {
      n["strategy_index"] = (n["strategy_index"].get<int>() + 1) % n["num_strategies"].get<int>();
      break;
    }
  write("chosen.json", chosen.dump(2));
  for (const std::string& file : {tmp("hash.json"), tmp("chosen.json")})
    for (const std::string& cmd : {"validate " + file + " " + kMlp,
                                   "lower " + file + " -o " + tmp("art_hash"), "explain " + file})
      expectOneLineError(apc(cmd), "$.content_hash: the plan's content hashes to ");
  EXPECT_FALSE(fs::exists(tmp("art_hash")));
  // The graph the plan carries (which apc lower lowers; the hash does not cover it) must be the
  // model's import: a relu turned into a gelu is refused by apc validate.
  auto bytes = apc::base64Decode(plan["graph"].get<std::string>());
  ASSERT_TRUE(bytes.ok());
  auto graph = apc::ir::deserializeGraph(*bytes);
  ASSERT_TRUE(graph.ok());
  bool changed = false;
  for (const apc::ir::Node& n : graph->nodes())
    if (!changed && n.op == "aten::relu") {
      graph->node(n.id).op = "aten::gelu";
      changed = true;
    }
  ASSERT_TRUE(changed);
  nlohmann::json regraphed = plan;
  regraphed["graph"] = apc::base64Encode(apc::ir::serializeGraph(*graph));
  write("graph.json", regraphed.dump(2));
  expectOneLineError(apc("validate " + tmp("graph.json") + " " + kMlp),
                     "the graph the plan carries is not " + kMlp +
                         " imported at the plan's input "
                         "shapes");
}

// Issue 32: an input path naming a FIFO blocked apc until a writer came (forever, in a script),
// /dev/zero grew the reader's buffer until memory ran out, and a file of gigabytes was read
// whole. Every JSON input, plan, manifest and model is read only when it is a regular file, and
// at most 1 GiB. `timeout` turns a hang into a failure.
TEST_F(Hardening, InputsThatAreNotRegularFilesAreRefused) {
  ASSERT_EQ(::mkfifo(tmp("fifo").c_str(), 0600), 0);
  const std::string fifo = tmp("fifo");
  const std::string is_fifo = "cannot read '" + fifo + "': is a FIFO, not a regular file";
  const std::string is_zero = "cannot read '/dev/zero': is a character device, not a regular file";
  auto timed = [](const std::string& args) {
    return apc::testing::runCommand("timeout 60 " + kApc + " " + args);
  };
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --artifact " + tmp("a")).code,
            0);
  for (const std::string& input : {fifo, std::string("/dev/zero")}) {
    SCOPED_TRACE(input);
    const std::string& message = input == fifo ? is_fifo : is_zero;
    expectOneLineError(timed("plan " + kMlp + " --spec " + input), message);
    expectOneLineError(timed("plan " + kMlp + " --mesh 2 --cluster " + input), message);
    expectOneLineError(timed("plan " + kMlp + " --mesh 2 --in-shardings " + input), message);
    expectOneLineError(timed("plan " + kMlp + " --mesh 2 --out-shardings " + input), message);
    expectOneLineError(timed("explain " + input), message);
    expectOneLineError(timed("diff " + tmp("p.json") + " " + input), message);
    expectOneLineError(timed("lower " + input + " " + kMlp + " -o " + tmp("art")), message);
    expectOneLineError(timed("validate " + input + " " + kMlp), message);
    expectOneLineError(timed("inspect " + input), message);
  }
  expectOneLineError(timed("explain " + dir_.string()),
                     "cannot read '" + dir_.string() + "': is a directory, not a regular file");
  // An artifact whose manifest is a FIFO: apc-train refuses it at once.
  fs::remove(tmp("a/manifest.json"));
  ASSERT_EQ(::mkfifo(tmp("a/manifest.json").c_str(), 0600), 0);
  Result train = apc::testing::runCommand("timeout 60 " + apc::testing::kApcTrain + " " + tmp("a") +
                                          " --steps 1");
  EXPECT_EQ(train.code, 2) << train.err;
  EXPECT_NE(
      train.err.find("cannot read '" + tmp("a/manifest.json") + "': is a FIFO, not a regular file"),
      std::string::npos)
      << train.err;
  // A regular file over the 1 GiB cap (sparse: no disk used) is refused before it is read.
  std::string huge = tmp("huge.json");
  write("huge.json", "{");
  fs::resize_file(huge, (uint64_t{1} << 30) + 1);
  auto t0 = std::chrono::steady_clock::now();
  expectOneLineError(
      apc("plan " + kMlp + " --spec " + huge),
      "cannot read '" + huge + "': is 1073741825 bytes, more than the 1 GiB apc reads");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  EXPECT_FALSE(fs::exists(tmp("art")));
}

// Issue 32: running out of memory ended as "apc: internal error: std::bad_alloc" (exit 1) or as
// an abort ("terminate called after throwing an instance of 'std::bad_alloc'": nlohmann::json's
// destructor allocates while unwinding from the first bad_alloc). It is one line naming what apc
// was doing, exit 2. Here: a spec of 40 million numbers under a 1 GB address-space limit.
TEST_F(Hardening, OutOfMemoryIsOneLine) {
  std::string text = "{\"mesh\": {\"shape\": [2]}, \"x\": [";
  text.reserve(80'000'100);
  for (int i = 0; i < 40'000'000; ++i) text += "0,";
  text += "0]}";
  std::string spec = write("big.json", text);
  text.clear();
  text.shrink_to_fit();
  Result r = apc::testing::runCommand("ulimit -v 1000000; " + kApc + " plan " + kMlp + " --spec " +
                                      spec + " -o " + tmp("p.json"));
  expectOneLineError(r, "apc: error: out of memory while reading the spec " + spec);
  EXPECT_FALSE(fs::exists(tmp("p.json")));
}

}  // namespace
