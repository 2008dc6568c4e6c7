//===- tests/plan/cli_usability_test.cpp - The command line as users expect ===//
//
// Issue 15, tried as a new user would from the README and the design card: sharding flags as
// files or inline JSON (a list of one for a single output, a whole spec with a note), the default
// plan file, nameless --input, `apc diff` exit codes, --quiet / --json / progress lines, explain
// --node ordering, `apc run DIR -- cmd` with the world size from the manifest and the artifact
// passed to the ranks (reported as they connect), the batch-size check of a static artifact,
// apc-train --compare-single under mixed precision, `apc validate` and the README's torchrun line.
// Each test names the finding it covers. Skipped when the tool is not built.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/run_command.h"

namespace {

namespace fs = std::filesystem;

using Result = apc::testing::CommandResult;
using apc::testing::expectOneLineError;

using apc::testing::kApc;
using apc::testing::kSamples;
using apc::testing::readFile;
using apc::testing::writeFile;
const std::string& kTrain = apc::testing::kApcTrain;

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1))
    ++n;
  return n;
}

class Usability : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef APC_HAVE_CLI
    GTEST_SKIP() << "the apc tool is not built (APC_WITH_TORCH=OFF)";
#endif
    if (!fs::exists(kSamples + "toy_block.pt")) GTEST_SKIP() << "run sample_models/generate.py";
    dir_ = fs::temp_directory_path() /
           ("apc_usability_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  std::string tmp(const std::string& name) const {
    return (dir_ / name).string();
  }
  Result apc(const std::string& args) const {
    return apc::testing::runCommand(kApc + " " + args);
  }
  /// The toy block planned on `mesh` into plan.json and the artifact dir `art`.
  void planToyArtifact(const std::string& mesh, const std::string& extra = "") {
    Result r = apc("plan " + kSamples + "toy_block.pt --mesh " + mesh + " -o " + tmp("plan.json") +
                   " --artifact " + tmp("art") + " --quiet " + extra);
    ASSERT_EQ(r.code, 0) << r.err;
  }

  fs::path dir_;
};

// Finding 1: inline JSON, a list of one for the single output, the README's form.
TEST_F(Usability, ShardingsInlineAndAListOfOneForASingleOutput) {
  Result r = apc("plan " + kSamples +
                 "toy_block.pt --mesh 2x4 --in-shardings '[[\"S(0)\",\"R\"]]' "
                 "--out-shardings '[[\"S(0)\",\"R\"]]' -o " +
                 tmp("p.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto p = nlohmann::json::parse(readFile(tmp("p.json")));
  EXPECT_EQ(p["spec"]["inputs"]["x"], nlohmann::json({"S(0)", "R"})) << p["spec"].dump();
  EXPECT_EQ(p["spec"]["outputs"], nlohmann::json({"S(0)", "R"})) << p["spec"].dump();
  // The same from files, and the bare placement list for the single output.
  writeFile(tmp("in.json"), "[[\"S(0)\", \"R\"]]");
  writeFile(tmp("out.json"), "[\"S(0)\", \"R\"]");
  ASSERT_EQ(apc("plan " + kSamples + "toy_block.pt --mesh 2x4 --in-shardings " + tmp("in.json") +
                " --out-shardings " + tmp("out.json") + " -o " + tmp("q.json"))
                .code,
            0);
  auto q = nlohmann::json::parse(readFile(tmp("q.json")));
  EXPECT_EQ(p["content_hash"], q["content_hash"]);
  // Malformed inline JSON names the flag; a list of two for one output is refused.
  expectOneLineError(
      apc("plan " + kSamples + "toy_block.pt --mesh 2x4 --in-shardings '[[\"S(0)\"'"),
      "--in-shardings (inline JSON)");
  expectOneLineError(
      apc("plan " + kSamples +
          "toy_block.pt --mesh 2x4 --out-shardings '[[\"S(0)\",\"R\"],[\"R\",\"R\"]]'"),
      "sequence of 2");
}

// Finding 1: a whole spec given as --out-shardings is used, with a note.
TEST_F(Usability, WholeSpecAsShardingsIsUsedWithANote) {
  writeFile(tmp("spec.json"),
            R"js({"mesh": {"shape": [2, 4], "names": ["dp", "tp"]}, "inputs": {"x": ["S(0)", "R"]},
                  "outputs": ["S(0)", "R"], "memory_budget": {"high": 0.5}})js");
  Result r = apc("plan " + kSamples + "toy_block.pt --mesh 2x4 --out-shardings " +
                 tmp("spec.json") + " -o " + tmp("p.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("apc: note: --out-shardings " + tmp("spec.json") + " is a whole spec"),
            std::string::npos)
      << r.err;
  auto p = nlohmann::json::parse(readFile(tmp("p.json")));
  EXPECT_EQ(p["spec"]["outputs"], nlohmann::json({"S(0)", "R"}));
  EXPECT_EQ(p["spec"]["inputs"]["x"], nlohmann::json({"S(0)", "R"}));
  EXPECT_EQ(p["spec"]["memory_budget"]["high"], 0.5);
  // With --spec as well, only its outputs are taken.
  writeFile(tmp("base.json"), R"js({"mesh": {"shape": [2, 4]}})js");
  Result s = apc("plan " + kSamples + "toy_block.pt --spec " + tmp("base.json") +
                 " --out-shardings " + tmp("spec.json") + " -o " + tmp("s.json"));
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_NE(s.err.find("only its outputs are used"), std::string::npos) << s.err;
  auto sp = nlohmann::json::parse(readFile(tmp("s.json")));
  EXPECT_EQ(sp["spec"]["outputs"], nlohmann::json({"S(0)", "R"}));
  EXPECT_FALSE(sp["spec"].contains("memory_budget")) << sp["spec"].dump();
}

// Finding 1: without -o the plan goes to <stem>.plan.json, and the summary says so; a nameless
// --input is the forward's argument at that position.
TEST_F(Usability, DefaultPlanFileAndNamelessInput) {
  Result r = apc::testing::runCommand("cd " + dir_.string() + " && " + kApc + " plan " + kSamples +
                                      "toy_block.pt --mesh 2x4 --input 'f32[16,128,1024]'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("wrote toy_block.plan.json"), std::string::npos) << r.out;
  ASSERT_TRUE(fs::exists(dir_ / "toy_block.plan.json"));
  auto p = nlohmann::json::parse(readFile(dir_ / "toy_block.plan.json"));
  EXPECT_EQ(p["model"]["inputs"], nlohmann::json({"x:f32[16,128,1024]"}));
  Result i = apc("inspect " + kSamples + "toy_block.pt --input 'f32[4,128,1024]'");
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("[4,128,1024]"), std::string::npos);
  expectOneLineError(apc("inspect " + kSamples +
                         "toy_block.pt --input 'f32[4,128,1024]' "
                         "--input 'f32[2]'"),
                     "has no name and is argument 1");
}

// Issue 35: a plan the reductions decided whole says so, instead of "0 variables, 0
// constraints" (which reads as broken); one that needed the ILP still counts its variables.
TEST_F(Usability, SolverLineSaysWhenReductionsDecidedEverything) {
  Result r = apc("plan " + kSamples + "toy_block.pt --mesh 2 -o " + (dir_ / "t.json").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("no integer program left (the reductions decided every choice)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("0 variables, 0 constraints"), std::string::npos) << r.out;
  Result ilp =
      apc("plan " + kSamples + "hf_llama_tiny.pt2 --mesh 2 -o " + (dir_ / "l.json").string());
  ASSERT_EQ(ilp.code, 0) << ilp.err;
  EXPECT_NE(ilp.out.find(" variables, "), std::string::npos) << ilp.out;
}

// Issue 35: mixed precision from the command line (the spec's mixed_precision, checked by the
// same rules), and the summary states what the plan assumed: the inputs with their placements
// and dynamic dims, and the precision.
TEST_F(Usability, MixedPrecisionFlagAndTheSummarysInputsAndPrecision) {
  const std::string plan = (dir_ / "mp.json").string();
  Result r = apc("plan " + kSamples + "mlp_stack.pt --mesh 2x2 --mixed-precision " +
                 "param=bf16,reduce=f32 -o " + plan);
  ASSERT_EQ(r.code, 0) << r.err;
  auto p = nlohmann::json::parse(readFile(plan));
  EXPECT_EQ(p["spec"]["mixed_precision"],
            nlohmann::json({{"param_dtype", "bf16"}, {"reduce_dtype", "f32"}}));
  EXPECT_NE(r.out.find("mixed precision: parameters bf16, gradient reductions f32"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("inputs: x:f32[8,64,128] RR\n"), std::string::npos) << r.out;
  Result d = apc("plan " + kSamples + "hf_llama_tiny.pt2 --mesh 2x2 --strategy ddp -o " + plan);
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("inputs: input_ids:i64[s72=8,32] S(0)S(0)\n"), std::string::npos) << d.out;
  EXPECT_EQ(d.out.find("mixed precision:"), std::string::npos) << d.out;
  for (const auto& [flag, named] : {std::pair<std::string, std::string>{"param=i64", "i64"},
                                    {"foo=bf16", "unknown key 'foo'"},
                                    {"param", "is not KEY=DTYPE"},
                                    {"param=bf16,param=f32", "given twice"}})
    expectOneLineError(apc("plan " + kSamples + "mlp_stack.pt --mesh 2 --mixed-precision '" + flag +
                           "' -o " + plan),
                       named);
}

// Issue 35: a deep model's summary lists a repeated layer once (llama3_8b on 8x8: 591 lines
// before, 26 now): the layers placed alike under one heading with their count, names relative to
// the layer.
TEST_F(Usability, SummaryListsRepeatedLayersOnce) {
  Result r = apc("plan " + kSamples + "llama_tiny.pt --mesh 2x4 -o " + (dir_ / "l.json").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("  layers.0-1 (2 layers placed alike, each)\n"), std::string::npos) << r.out;
  const size_t first = r.out.find("    attention.wq.weight ");
  ASSERT_NE(first, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("    attention.wq.weight ", first + 1), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("layers.1.attention.wq"), std::string::npos) << r.out;
  // Modules outside the layers keep their own heading.
  EXPECT_NE(r.out.find("  tok_embeddings\n    weight "), std::string::npos) << r.out;
  // explain --by module: the stack of layers is one row.
  Result e = apc("explain " + (dir_ / "l.json").string() + " --by module --top 3");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("costliest 3 modules"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("  layers.0-1 "), std::string::npos) << e.out;
  expectOneLineError(apc("explain " + (dir_ / "l.json").string() + " --by layer"),
                     "--by: expected node or module");
}

// Finding 5: diff exits like `git diff --exit-code`; --threads leaves the hash alone.
TEST_F(Usability, DiffExitCodeAndThreadsKeepTheHash) {
  std::string base = "plan " + kSamples + "toy_block.pt --mesh 2x4 --quiet -o ";
  ASSERT_EQ(apc(base + tmp("a.json")).code, 0);
  ASSERT_EQ(apc(base + tmp("t.json") + " --threads 2").code, 0);
  ASSERT_EQ(apc(base + tmp("b.json") + " --strategy ddp").code, 0);
  EXPECT_EQ(nlohmann::json::parse(readFile(tmp("a.json")))["content_hash"],
            nlohmann::json::parse(readFile(tmp("t.json")))["content_hash"]);
  EXPECT_EQ(apc("diff " + tmp("a.json") + " " + tmp("t.json")).code, 0);
  Result d = apc("diff " + tmp("a.json") + " " + tmp("b.json"));
  EXPECT_EQ(d.code, 1) << d.out << d.err;
  expectOneLineError(apc("diff " + tmp("a.json") + " " + tmp("missing.json")), "missing.json");
}

// Finding 6: --quiet prints nothing, --json one document, long phases report progress on stderr.
TEST_F(Usability, QuietJsonAndProgress) {
  std::string base = "plan " + kSamples + "toy_block.pt --mesh 2x4 -o ";
  Result q = apc(base + tmp("q.json") + " --quiet");
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_EQ(q.out, "");
  EXPECT_EQ(q.err, "");
  EXPECT_TRUE(fs::exists(tmp("q.json")));
  Result j = apc(base + tmp("j.json") + " --json");
  ASSERT_EQ(j.code, 0) << j.err;
  auto s = nlohmann::json::parse(j.out);
  auto plan = nlohmann::json::parse(readFile(tmp("j.json")));
  EXPECT_EQ(s["plan"], tmp("j.json"));
  EXPECT_EQ(s["content_hash"], plan["content_hash"]);
  EXPECT_EQ(s["status"], "optimal");
  EXPECT_GT(s["step_us"]["total"].get<double>(), 0);
  // APC_PROGRESS_AFTER_S=0 reports every phase (the default waits a second).
  Result p =
      apc::testing::runCommand("APC_PROGRESS_AFTER_S=0 " + kApc + " " + base + tmp("p.json"));
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.err.find("apc: progress: solving"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("apc: progress: solving done ("), std::string::npos) << p.err;
  EXPECT_EQ(p.out.find("apc: progress"), std::string::npos);
}

// Finding 6: `explain --node` prints the node first; the costliest table only with --top.
TEST_F(Usability, ExplainNodeComesFirst) {
  ASSERT_EQ(apc("plan " + kSamples + "toy_block.pt --mesh 2x4 --quiet -o " + tmp("e.json")).code,
            0);
  Result r = apc("explain " + tmp("e.json") + " --node up.weight");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("costliest"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CHOSEN"), std::string::npos) << r.out;
  Result t = apc("explain " + tmp("e.json") + " --node up.weight --top 3");
  ASSERT_EQ(t.code, 0) << t.err;
  ASSERT_NE(t.out.find("costliest 3"), std::string::npos) << t.out;
  EXPECT_LT(t.out.find("CHOSEN"), t.out.find("costliest 3")) << t.out;
}

// Finding 7: `apc run DIR -- cmd` takes the world size from the manifest and gives the ranks
// the artifact ($APC_ARTIFACT and {artifact}); --nproc that disagrees is refused.
TEST_F(Usability, RunTakesWorldSizeFromTheManifest) {
  planToyArtifact("2x2");
  const std::string art = fs::absolute(tmp("art")).lexically_normal().string();
  Result r = apc("run " + tmp("art") +
                 " -- sh -c 'echo \"rank $RANK of $WORLD_SIZE in $APC_ARTIFACT at $1\"' sh "
                 "{artifact}");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.out.find("rank " + std::to_string(rank) + " of 4 in " + art + " at " + art),
              std::string::npos)
        << r.out;
  EXPECT_NE(r.err.find("apc run: progress: started 4 ranks"), std::string::npos) << r.err;
  expectOneLineError(apc("run " + tmp("art") + " --nproc 2 -- true"), "lowered for 4 ranks");
  fs::create_directories(tmp("empty"));
  expectOneLineError(apc("run " + tmp("empty") + " -- true"), "give --nproc N");
  // The old form still works.
  EXPECT_EQ(apc("run " + tmp("art") + " --nproc 4 -- true").code, 0);
}

#ifdef APC_HAVE_TRAIN
// Findings 6 and 7: apc-train under `apc run DIR --` finds the artifact by itself, and the
// launcher reports every rank as it joins the rendezvous.
TEST_F(Usability, RunReportsRanksAsTheyConnect) {
  planToyArtifact("2x2", "--input x:f32[8,4,1024]");
  Result r = apc("run " + tmp("art") + " -- " + kTrain + " --steps 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("step 0 loss"), std::string::npos) << r.out;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.err.find("apc run: progress: rank " + std::to_string(rank) + " connected ("),
              std::string::npos)
        << r.err;
  EXPECT_NE(r.err.find("(4/4, "), std::string::npos) << r.err;
}

// Finding 2: a static artifact run at another batch fails with the planned size and the hint.
TEST_F(Usability, StaticArtifactAtAnotherBatchNamesThePlannedSize) {
  planToyArtifact("2", "--strategy ddp --input x:f32[8,4,1024]");
  Result r = apc("run " + tmp("art") + " -- " + kTrain + " --steps 1 --batch 6");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("input 'x' has size 6 in dim 0 but the artifact was planned for 8 "
                       "(x:f32[8,4,1024]); to run at other batch sizes plan a dynamic batch: "
                       "apc plan --input 'x:f32[B=8,4,1024]'"),
            std::string::npos)
      << r.err;
}

// Finding 3: --compare-single on a mixed-precision artifact trains beside the f32 reference.
TEST_F(Usability, CompareSingleUnderMixedPrecision) {
  writeFile(tmp("mp.json"), R"js({"mesh": {"shape": [2]},
      "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "f32"}})js");
  Result p =
      apc("plan " + kSamples + "toy_block.pt --spec " + tmp("mp.json") +
          " --input x:f32[4,4,1024] --quiet -o " + tmp("plan.json") + " --artifact " + tmp("art"));
  ASSERT_EQ(p.code, 0) << p.err;
  Result r = apc("run " + tmp("art") + " -- " + kTrain + " --steps 2 --compare-single " + kSamples +
                 "toy_block.pt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count(r.out, " single "), 2u) << r.out;
}

// Finding 8: the README's torchrun line, as written (skipped without the venv's torchrun).
TEST_F(Usability, TorchrunLineOfTheReadme) {
  const std::string torchrun = std::string(APC_SOURCE_DIR) + "/.venv/bin/torchrun";
  if (!fs::exists(torchrun)) GTEST_SKIP() << "no " << torchrun;
  planToyArtifact("2x2", "--input x:f32[8,4,1024]");
  Result r = apc::testing::runCommand("cd " + std::string(APC_BINARY_DIR) + "/.. && " + torchrun +
                                      " --no-python --nproc-per-node 4 " + kTrain + " " +
                                      tmp("art") + " --steps 1");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("step 0 loss"), std::string::npos) << r.out;
}
#endif

// Finding 4: an infeasible budget names the smallest feasible high as a fraction and in bytes,
// and that budget plans.
TEST_F(Usability, InfeasibleBudgetNamesTheSmallestFeasibleHigh) {
  const std::string base = "plan " + kSamples + "cnn_small.pt --mesh 4 --quiet -o " + tmp("c.json");
  Result r = apc(base + " --memory-budget 0,0.25");
  expectOneLineError(r, "the smallest feasible high is 0.");
  EXPECT_NE(r.err.find("B per rank of "), std::string::npos) << r.err;
  const std::string key = "use --memory-budget 0,";
  size_t at = r.err.find(key);
  ASSERT_NE(at, std::string::npos) << r.err;
  std::string high = r.err.substr(at + key.size());
  high = high.substr(0, high.find(' '));
  EXPECT_GT(std::stod(high), 0.25);
  Result ok = apc(base + " --memory-budget 0," + high);
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// Finding 4: --verbose and explain (text, JSON, dot) name each communicating edge's
// collectives, mesh dims, bytes and time; dot draws parameters and module clusters.
TEST_F(Usability, CollectivesAreNamed) {
  writeFile(tmp("in.json"), "[[\"S(0)\", \"R\"]]");
  Result v = apc("plan " + kSamples + "toy_block.pt --mesh 2x4 --mesh-names dp,tp --in-shardings " +
                 tmp("in.json") + " -o " + tmp("v.json") + " --verbose");
  ASSERT_EQ(v.code, 0) << v.err;
  EXPECT_NE(v.out.find("communication (rank 0's program"), std::string::npos) << v.out;
  EXPECT_TRUE(v.out.find("(tp, ") != std::string::npos || v.out.find("(dp, ") != std::string::npos)
      << v.out;
  EXPECT_NE(v.out.find(" us]"), std::string::npos) << v.out;
  Result t = apc("explain " + tmp("v.json") + " --top 50");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("communication (rank 0's program"), std::string::npos) << t.out;
  Result j = apc("explain " + tmp("v.json") + " --top 50 --format json");
  ASSERT_EQ(j.code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out);
  ASSERT_TRUE(doc["communication"].is_array()) << j.out;
  ASSERT_FALSE(doc["communication"].empty()) << j.out;
  bool named = false;
  for (const auto& e : doc["communication"])
    for (const char* dir : {"forward", "backward"})
      for (const auto& step : e[dir]) {
        EXPECT_TRUE(step["mesh_dim_name"] == "dp" || step["mesh_dim_name"] == "tp") << step;
        EXPECT_GT(step["bytes"].get<int64_t>(), 0);
        named = true;
      }
  EXPECT_TRUE(named) << j.out;
  Result d = apc("explain " + tmp("v.json") + " --format dot");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("subgraph cluster_"), std::string::npos);
  EXPECT_NE(d.out.find("label=\"up\""), std::string::npos) << d.out;  // the module `up`
  EXPECT_NE(d.out.find("up.weight"), std::string::npos);              // a parameter
  EXPECT_TRUE(d.out.find("AG(") != std::string::npos || d.out.find("AR(") != std::string::npos ||
              d.out.find("RS(") != std::string::npos)
      << d.out;
  Result c = apc("explain " + tmp("v.json") + " --format dot --collapse-depth 1 --no-parameters");
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.out.find("up.weight"), std::string::npos);
}

// Item 4's picture: SVG and HTML with the per-module chart, modules, parameters and collectives.
TEST_F(Usability, PictureSvgAndHtml) {
  writeFile(tmp("in.json"), "[[\"S(0)\", \"R\"]]");
  ASSERT_EQ(apc("plan " + kSamples + "toy_block.pt --mesh 2x4 --mesh-names dp,tp --in-shardings " +
                tmp("in.json") + " --quiet -o " + tmp("v.json"))
                .code,
            0);
  Result svg = apc("explain " + tmp("v.json") + " --format svg");
  ASSERT_EQ(svg.code, 0) << svg.err;
  EXPECT_EQ(svg.out.rfind("<svg ", 0), 0u) << svg.out.substr(0, 200);
  EXPECT_NE(svg.out.find("Cost per module"), std::string::npos);
  EXPECT_NE(svg.out.find(">up: "), std::string::npos);               // the module `up` as a box
  EXPECT_NE(svg.out.find(">up.weight<"), std::string::npos);         // a parameter as a node
  EXPECT_NE(svg.out.find("stroke=\"#d62728\""), std::string::npos);  // a communicating edge
  EXPECT_EQ(svg.out.substr(svg.out.size() - 7), "</svg>\n");
  Result html = apc("explain " + tmp("v.json") + " --format html");
  ASSERT_EQ(html.code, 0) << html.err;
  EXPECT_EQ(html.out.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.out.find("<details"), std::string::npos);
  EXPECT_EQ(count(html.out, "<details"), count(html.out, "</details>"));
  EXPECT_NE(html.out.find("up.weight"), std::string::npos);
}

// Finding 8: `apc validate` makes lower's checks and writes nothing.
TEST_F(Usability, ValidateChecksAPlanAgainstItsModelAndSpec) {
  writeFile(tmp("spec.json"), R"js({"mesh": {"shape": [2, 4], "names": ["dp", "tp"]}})js");
  ASSERT_EQ(apc("plan " + kSamples + "toy_block.pt --spec " + tmp("spec.json") + " --quiet -o " +
                tmp("p.json"))
                .code,
            0);
  Result ok = apc("validate " + tmp("p.json") + " " + kSamples + "toy_block.pt");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.out.rfind("ok: ", 0), 0u) << ok.out;
  EXPECT_EQ(apc("validate " + tmp("p.json") + " --spec " + tmp("spec.json")).code, 0);
  expectOneLineError(apc("validate " + tmp("p.json") + " " + kSamples + "mlp_stack.pt"),
                     "SHA-256 differs");
  expectOneLineError(apc("validate " + tmp("p.json") + " --mesh 4x2"),
                     "differs from --mesh in 'mesh'");
  // A plan edited by hand to another mesh no longer fits its strategies.
  auto p = nlohmann::json::parse(readFile(tmp("p.json")));
  p["spec"]["mesh"]["shape"] = {8};
  p["spec"]["mesh"]["names"] = {"dp"};
  writeFile(tmp("bad.json"), p.dump());
  Result bad = apc("validate " + tmp("bad.json"));
  EXPECT_EQ(bad.code, 2) << bad.out << bad.err;
}

}  // namespace
