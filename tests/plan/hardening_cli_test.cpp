//===- tests/plan/hardening_cli_test.cpp - Adversarial input to the apc CLI ===//
//
// Each case of issue 13 through the real binary: deeply nested JSON, huge or tiny link numbers,
// oversized meshes, outputs that would overwrite an input, -o with --artifact, long dynamic lists,
// trailing garbage, bad flag values, conflicting pins, Partial inputs, broken manifests; and of
// issue 32, plans edited after apc plan wrote them (a placement flipped, the hash changed) and
// inputs that are FIFOs, devices, directories or over the 1 GiB read cap, running out of memory,
// numeric flags out of range (nan, inf, negative), outputs onto devices or onto directories that
// hold an input, interrupted writes, `apc run` killed outright, and --tag-output without newlines.
// Every bad input is one line on stderr and exit 2, and nothing is written over an input.
// Skipped when the tool is not built (APC_WITH_TORCH=OFF).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
#ifdef APC_SANITIZE
  GTEST_SKIP() << "an address-space limit stops ASan itself (it reserves terabytes of shadow)";
#endif
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

// Issue 32: `--time-limit nan` wrote a plan apc could not read back, and `--lr nan`, `--clip -5`
// and `-o ""` were accepted. Every flag that takes a number is a finite number in its range (one
// validator, tools/common/cli_checks.h; a numeric flag without it stops the tool at start), and a
// path flag is not empty: one line naming the flag and the value, exit 2.
TEST_F(Hardening, NumericFlagsAreRangeChecked) {
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json")).code, 0);
  const std::string plan = "plan " + kMlp + " --mesh 2 -o " + tmp("x.json") + " ";
  const std::pair<std::string, std::string> cases[] = {
      {plan + "--time-limit nan",
       "--time-limit: must be a finite number in (0, 10000000], got 'nan'"},
      {plan + "--time-limit inf",
       "--time-limit: must be a finite number in (0, 10000000], got 'inf'"},
      {plan + "--time-limit -5", "got '-5'"},
      {plan + "--time-limit 0", "got '0'"},
      {plan + "--time-limit 1e400", "got '1e400'"},
      {plan + "--time-limit 5s", "got '5s'"},
      {plan + "--threads 0", "--threads: must be an integer in [1, 1024], got '0'"},
      {plan + "--threads 1.5", "--threads: must be an integer in [1, 1024], got '1.5'"},
      {plan + "--threads 1e30", "got '1e30'"},
      {plan + "--prefetch-discount nan", "--prefetch-discount: must be a finite number in [0, 1]"},
      {plan + "--world-size 1e30", "--world-size: must be an integer in [1, 65536], got '1e30'"},
      {"plan " + kMlp + " --mesh 2 -o ''", "--output: must name a path, got ''"},
      {"plan " + kMlp + " --mesh 2 --artifact ''", "--artifact: must name a path, got ''"},
      {"plan " + kMlp + " --spec ''", "--spec: must name a path, got ''"},
      {"explain " + tmp("p.json") + " --top nan", "--top: must be an integer in [0, 1073741824]"},
      {"explain " + tmp("p.json") + " --collapse-depth -1", "--collapse-depth: must be an integer"},
      {"inspect " + kMlp + " --top 0", "--top: must be an integer in [1, 1073741824], got '0'"},
      {"lower " + tmp("p.json") + " -o ''", "--output: must name a path, got ''"},
      {"run " + dir_.string() + " --timeout nan -- true", "--timeout: must be a finite number"},
      {"run " + dir_.string() + " --nproc -2 -- true", "--nproc: must be an integer in [1, 1024]"},
      {"calibrate -o ''", "--output: must name a path, got ''"},
      {"calibrate -o " + tmp("c.json") + " --max-mib inf", "--max-mib: must be a finite number"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args);
    expectOneLineError(apc(args), message);
  }
  EXPECT_FALSE(fs::exists(tmp("x.json")));
  // The same checks in apc-train (before it reads the artifact).
  const std::pair<std::string, std::string> train_cases[] = {
      {"--lr nan", "--lr: must be a finite number in [0, 1000000], got 'nan'"},
      {"--lr -0.1", "--lr: must be a finite number in [0, 1000000], got '-0.1'"},
      {"--clip -5", "--clip: must be a finite number in [0, 1e+30], got '-5'"},
      {"--clip inf", "--clip: must be a finite number in [0, 1e+30], got 'inf'"},
      {"--steps -1", "--steps: must be an integer in [0, 1073741824], got '-1'"},
      {"--seed -1", "--seed: must be an integer"},
      {"--batch 0.5", "--batch: must be an integer in [1, 2147483648], got '0.5'"},
      {"--timeout nan", "--timeout: must be a finite number in [0.001, 604800], got 'nan'"},
      {"--grad-bucket-mib -1", "--grad-bucket-mib: must be a finite number"},
      {"--warmup 1e9999", "--warmup: must be an integer"},
      {"--model ''", "--model: must name a path, got ''"},
      {"--data ''", "--data: must name a path, got ''"},
      {"--data-dtype uint8", "--data-dtype: uint8 not in {uint16,uint32,int32,int64}"},
  };
  for (const auto& [args, message] : train_cases) {
    SCOPED_TRACE(args);
    Result r = apc::testing::runCommand(apc::testing::kApcTrain + " " + dir_.string() + " " + args);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_EQ(r.err.rfind("apc-train: error: ", 0), 0u) << r.err;
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  // Values at the ends of the ranges are taken.
  Result ok = apc(plan + "--time-limit 1e7 --threads 1024 --prefetch-discount 0 --quiet");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// Issue 32: `-o` onto a device node replaced it with a regular file (as root, -o /dev/null would
// have replaced the machine's /dev/null), and an --artifact (or apc lower -o) directory that held
// the command's own input was replaced whole, deleting the input with exit 0.
TEST_F(Hardening, OutputsNeverReplaceDevicesOrInputs) {
  ASSERT_EQ(::mkfifo(tmp("fifo").c_str(), 0600), 0);
  expectOneLineError(apc("plan " + kMlp + " --mesh 2 -o /dev/null"),
                     "/dev/null: is a character device; apc writes only regular files "
                     "(refusing to replace it)");
  expectOneLineError(apc("plan " + kMlp + " --mesh 2 -o " + tmp("fifo")),
                     tmp("fifo") + ": is a FIFO; apc writes only regular files");
  expectOneLineError(
      apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --timings-json /dev/null"),
      "/dev/null: is a character device");
  EXPECT_FALSE(fs::exists(tmp("p.json")));  // refused before the plan was written
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  fs::create_directories(tmp("d"));
  expectOneLineError(apc("plan " + kMlp + " --mesh 2 -o " + tmp("d")),
                     tmp("d") + ": is a directory, cannot write a file there");
  // An artifact directory that holds the model, the spec, or the plan being lowered.
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --artifact " + tmp("a")).code,
            0);
  fs::copy_file(kMlp, tmp("a/m.pt"));
  write("a/spec.json", R"j({"mesh": {"shape": [2]}})j");
  fs::copy_file(tmp("p.json"), tmp("a/p.json"));
  const std::string model = read(tmp("a/m.pt"));
  expectOneLineError(
      apc("plan " + tmp("a/m.pt") + " --mesh 2 -o " + tmp("q.json") + " --artifact " + tmp("a")),
      "--artifact " + tmp("a") + " holds the input " + tmp("a/m.pt") +
          ", and is replaced as a whole; refusing to delete an input");
  expectOneLineError(apc("plan " + kMlp + " --spec " + tmp("a/spec.json") + " -o " + tmp("q.json") +
                         " --artifact " + tmp("a") + "/"),
                     "holds the input " + tmp("a/spec.json"));
  expectOneLineError(apc("plan " + tmp("a/m.pt") + " --mesh 2 -o " + tmp("q.json") +
                         " --artifact " + dir_.string()),
                     "holds the input " + tmp("a/m.pt"));
  expectOneLineError(apc("lower " + tmp("a/p.json") + " -o " + tmp("a")),
                     "-o " + tmp("a") + " holds the input " + tmp("a/p.json"));
  // -o inside the artifact directory would be deleted with the old artifact.
  expectOneLineError(
      apc("plan " + kMlp + " --mesh 2 -o " + tmp("a/new.json") + " --artifact " + tmp("a")),
      "-o " + tmp("a/new.json") + " is inside --artifact " + tmp("a"));
  EXPECT_EQ(read(tmp("a/m.pt")), model);
  EXPECT_EQ(entries(tmp("a")),
            (std::vector<std::string>{"m.pt", "manifest.json", "p.json", "rank_0.apcp",
                                      "rank_1.apcp", "spec.json"}));
  EXPECT_FALSE(fs::exists(tmp("q.json")));
}

// Issue 32: SIGINT or SIGTERM during `apc plan` left the hidden temporary of -o, and during an
// artifact write a staging directory with every rank file. Interrupted at many moments (import,
// solve, lowering, writing), apc ends by the signal or finishes, and leaves no hidden entry.
TEST_F(Hardening, InterruptedPlansLeaveNoTemporaries) {
  const std::string model = apc::testing::kSamples + "llama3_8b.pt2";
  const std::string out = tmp("out");
  fs::create_directories(out);
  int interrupted = 0;
  for (int i = 0; i < 8; ++i) {
    const double delay = 0.3 + 0.4 * i;
    const int sig = i % 2 ? SIGTERM : SIGINT;
    SCOPED_TRACE("signal " + std::to_string(sig) + " after " + std::to_string(delay) + " s");
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Default actions, whatever this test inherited (a background job ignores SIGINT).
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      const std::string plan = out + "/p.json", art = out + "/art";
      ::execl(kApc.c_str(), kApc.c_str(), "plan", model.c_str(), "--mesh", "8x8", "--quiet", "-o",
              plan.c_str(), "--artifact", art.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::usleep(static_cast<useconds_t>(delay * 1e6));
    ::kill(pid, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status)) {
      EXPECT_EQ(WTERMSIG(status), sig);
      ++interrupted;
    } else {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    for (const std::string& name : entries(out)) {
      EXPECT_NE(name.front(), '.') << name;
    }
    if (fs::exists(out + "/art")) {
      for (const std::string& name : entries(out + "/art")) {
        EXPECT_NE(name.front(), '.') << name;
      }
    }
  }
  EXPECT_GT(interrupted, 0);
}

// Issue 32: `apc run` killed with SIGKILL (or by the OOM killer) left its ranks' children running
// when the rank command was a wrapper that does not exec: PR_SET_PDEATHSIG reaches the direct
// child only. The launcher's guard kills every rank's process group.
TEST_F(Hardening, KilledLauncherTakesItsRanksChildrenAlong) {
  const std::string d = dir_.string();
  pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    // Each rank: a shell that starts a long sleep and waits for it (no exec).
    const std::string rank = "sleep 300 & echo $! > " + d + "/child_$RANK; wait";
    ::execl(kApc.c_str(), kApc.c_str(), "run", d.c_str(), "--nproc", "2", "--", "sh", "-c",
            rank.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::vector<pid_t> children;
  for (int i = 0; i < 300 && children.size() < 2; ++i) {
    ::usleep(100000);
    children.clear();
    for (int r = 0; r < 2; ++r) {
      std::string text = read(tmp("child_" + std::to_string(r)));
      if (!text.empty() && text.back() == '\n') children.push_back(std::stoi(text));
    }
  }
  ASSERT_EQ(children.size(), 2u) << "the ranks did not start";
  ASSERT_EQ(::kill(launcher, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  // Gone (or a zombie waiting for its reaper) within 10 s.
  auto alive = [](pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return false;
    size_t paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
  };
  for (pid_t child : children) {
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      gone = !alive(child);
      if (!gone) ::usleep(100000);
    }
    EXPECT_TRUE(gone) << "rank child " << child << " still runs";
    if (!gone) ::kill(child, SIGKILL);
  }
}

// Issue 32: `apc run --tag-output` kept a rank's output without newlines in memory until the
// newline came. A line is passed on in tagged pieces of at most 64 KiB.
TEST_F(Hardening, TaggedOutputWithoutNewlinesIsPassedOnInPieces) {
  Result r = apc::testing::runCommand(kApc + " run " + dir_.string() +
                                      " --nproc 1 --tag-output -- sh -c "
                                      "'head -c 300000 /dev/zero | tr \"\\\\0\" x'");
  ASSERT_EQ(r.code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  size_t count = 0, bytes = 0;
  while (std::getline(lines, line)) {
    ++count;
    ASSERT_EQ(line.rfind("[rank 0] ", 0), 0u) << line.substr(0, 40);
    EXPECT_LE(line.size(), 9u + 64 * 1024);
    bytes += line.size() - 9;
  }
  EXPECT_EQ(count, 5u);  // 4 pieces of 64 KiB and the rest
  EXPECT_EQ(bytes, 300000u);
}

// Issue 32: a rank whose MASTER_ADDR:PORT accepted the connection but never answered (rank 0
// stopped after starting its store) waited forever, silently, whatever APC_TIMEOUT_S said:
// c10d's client handshake has no bound. Here the port is a socket that listens and never accepts;
// then, closed, a port where nobody listens (c10d printed a warning with a stack trace per retry).
TEST_F(Hardening, AStoreThatNeverAnswersFailsTheRankAfterTheTimeout) {
  ASSERT_EQ(apc("plan " + kMlp + " --mesh 2 -o " + tmp("p.json") + " --artifact " + tmp("a")).code,
            0);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  auto t0 = std::chrono::steady_clock::now();
  Result r =
      apc::testing::runCommand("RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
                               " APC_JOB_ID=silent APC_TIMEOUT_S=3 timeout 60 " +
                               apc::testing::kApcTrain + " " + tmp("a") + " --steps 1");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "apc-train hung: " << r.err;
  EXPECT_LT(took, 30.0);
  EXPECT_NE(r.err.find("apc-train: error: rank 1: no answer from the rendezvous store at "
                       "127.0.0.1:" +
                       port + " within 3 s (job 'silent'"),
            std::string::npos)
      << r.err;
  // Nobody on the port: the rank's own lines only, not c10d's warning and stack trace per retry.
  Result refused = apc::testing::runCommand(
      "env -u TORCH_CPP_LOG_LEVEL RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
      " APC_JOB_ID=silent APC_TIMEOUT_S=3 timeout 60 " + apc::testing::kApcTrain + " " + tmp("a") +
      " --steps 1");
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("apc-train: error: rank 1: no rendezvous store at 127.0.0.1:" + port +
                             " after 3 s"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.err.find("[c10d]"), std::string::npos) << refused.err;
  EXPECT_EQ(refused.err.find("frame #"), std::string::npos) << refused.err;
  // Issue 32 (the last round): a MASTER_ADDR that does not resolve failed only after the timeout
  // and 5 s more. It is resolved first: one line naming it, at once (the timeout here is 60 s).
  t0 = std::chrono::steady_clock::now();
  Result unresolved = apc::testing::runCommand(
      "RANK=1 WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=" + port +
      " APC_JOB_ID=nowhere APC_TIMEOUT_S=60 timeout 120 " + apc::testing::kApcTrain + " " +
      tmp("a") + " --steps 1");
  const double unresolved_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(unresolved.code, 0);
  EXPECT_NE(unresolved.code, 124) << "apc-train hung: " << unresolved.err;
  EXPECT_NE(unresolved.err.find("apc-train: error: rank 1: MASTER_ADDR 'no-such-host.invalid' does "
                                "not resolve ("),
            std::string::npos)
      << unresolved.err;
  EXPECT_EQ(unresolved.err.find("waiting for"), std::string::npos) << unresolved.err;
  EXPECT_LT(unresolved_s, 20.0);  // apc-train's start included (seconds under the sanitizers)
}

// Issue 32: `apc run` named a victim: the first rank to fail, not the one that exited early (its
// peers then failed in a collective) or that was stopped. Those are named beside it.
TEST_F(Hardening, LauncherNamesTheRankThatLeftOrStopped) {
  Result left = apc("run " + dir_.string() +
                    " --nproc 2 -- sh -c 'if [ $RANK = 1 ]; then exit 0; fi; sleep 2; exit 1'");
  EXPECT_EQ(left.code, 1) << left.err;
  EXPECT_NE(left.err.find("apc run: rank 0 exited with status 1 (rank 1 had exited with status 0 "),
            std::string::npos)
      << left.err;
  Result stopped = apc("run " + dir_.string() +
                       " --nproc 3 -- sh -c 'if [ $RANK = 2 ]; then kill -STOP $$; fi; sleep 1; "
                       "exit 3'");
  EXPECT_EQ(stopped.code, 1) << stopped.err;
  EXPECT_NE(stopped.err.find("apc run: rank 2 was stopped by signal " + std::to_string(SIGSTOP)),
            std::string::npos)
      << stopped.err;
  // Rank 0 or rank 1 fails first; either names the stopped rank 2.
  EXPECT_NE(stopped.err.find(" exited with status 3 (rank 2 is stopped (signal " +
                             std::to_string(SIGSTOP) + "))"),
            std::string::npos)
      << stopped.err;
  // A stopped rank also makes a timeout, and is stopped itself (SIGTERM, then SIGCONT).
  auto t0 = std::chrono::steady_clock::now();
  Result timed = apc("run " + dir_.string() +
                     " --nproc 2 --timeout 2 -- sh -c 'if [ $RANK = 1 ]; then kill -STOP $$; fi; "
                     "sleep 100'");
  EXPECT_EQ(timed.code, 1) << timed.err;
  EXPECT_NE(timed.err.find("apc run: timed out after 2 s (rank 1 is stopped (signal "),
            std::string::npos)
      << timed.err;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

// Issue 32: lowering built every rank's program in memory before writing any (past 18 GB for
// 65,536 ranks). Programs are written as they are lowered: 4,096 ranks of mlp_stack lower under a
// 1 GB address-space limit (apc's peak RSS 123 MB; 781 MB before, which ran out of memory there).
TEST_F(Hardening, LoweringHoldsOneRankProgramAtATime) {
#ifdef APC_SANITIZE
  GTEST_SKIP() << "an address-space limit stops ASan itself (it reserves terabytes of shadow)";
#endif
  Result plan = apc("plan " + kMlp + " --mesh 64x64 --quiet -o " + tmp("p.json"));
  ASSERT_EQ(plan.code, 0) << plan.err;
  Result r = apc::testing::runCommand("ulimit -v 1000000; " + kApc + " lower " + tmp("p.json") +
                                      " -o " + tmp("a"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote artifact " + tmp("a") + ": 4096 rank programs"), std::string::npos)
      << r.out;
  auto manifest = nlohmann::json::parse(read(tmp("a/manifest.json")));
  EXPECT_EQ(manifest["world_size"], 4096);
  EXPECT_EQ(manifest["files"].size(), 4096u);
  EXPECT_TRUE(fs::exists(tmp("a/rank_4095.apcp")));
}

}  // namespace
