//===- tests/plan/cli_test.cpp - `apc plan`, `explain`, `diff` end to end --===//
//
// Runs the built `apc` binary on the sample models: planning twice gives identical bytes, the plan
// validates against schemas/plan.schema.json (system python with jsonschema), explain and diff
// print what they promise, and each bad input gives exactly one line on stderr and exit code 2.
// Skipped when the tool is not built (APC_WITH_TORCH=OFF).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
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

/// A scratch directory per test binary run, removed at exit.
const fs::path& scratch() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("apc_plan_cli_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  static const struct Cleanup {
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup;
  return dir;
}

std::string tmp(const std::string& name) {
  return (scratch() / name).string();
}

Result run(const std::string& cmd) {
  return apc::testing::runCommand(cmd);
}

using apc::testing::kApc;
using apc::testing::kSamples;

Result runApc(const std::string& args) {
  return run(kApc + " " + args);
}

using apc::testing::readFile;
using apc::testing::writeFile;

class PlanCli : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef APC_HAVE_CLI
    GTEST_SKIP() << "the apc tool is not built (APC_WITH_TORCH=OFF)";
#endif
    writeFile(tmp("in.json"), "[[\"S(0)\", \"R\"]]\n");
    writeFile(tmp("out.json"), "[\"S(0)\", \"R\"]\n");
  }

  /// `apc plan` of the toy block on 2x4 with the given extra flags, into `out`.
  Result planToy(const std::string& out, const std::string& extra = "") {
    return runApc("plan " + kSamples +
                  "toy_block.pt --mesh 2x4 --mesh-names dp,tp --in-shardings " + tmp("in.json") +
                  " --out-shardings " + tmp("out.json") + " -o " + out + " " + extra);
  }
};

TEST_F(PlanCli, PlanPrintsTheSummaryAndWritesThePlan) {
  Result r = planToy(tmp("toy.json"), "--verbose --timings-json " + tmp("times.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* needle :
       {"placement=", "cost=(comm ", "total: comm", "estimated step time:", "communication",
        "parameters: 2 in 2 modules", "  up\n", "problem: ", "after reduction",
        "solver: optimal, objective", "bound", "time: import", "wrote "})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  auto plan = nlohmann::json::parse(readFile(tmp("toy.json")));
  EXPECT_EQ(plan["model"]["name"], "toy_block");
  EXPECT_EQ(plan["spec"]["inputs"]["x"], nlohmann::json({"S(0)", "R"}));
  EXPECT_EQ(plan["nodes"].back()["kind"], "output");
  EXPECT_EQ(plan["nodes"].back()["output_placements"], nlohmann::json({"S(0)", "R"}));
  EXPECT_TRUE(plan["solver"]["seconds"].is_null());
  auto times = nlohmann::json::parse(readFile(tmp("times.json")));
  EXPECT_TRUE(times.contains("solve_s"));
  EXPECT_EQ(times["content_hash"], plan["content_hash"]);
}

// Issue 12: a time limit shorter than construction (a four-dim mesh) still ends with a plan:
// the restricted one, status time_limit with its gap, a note on stderr and in --json.
TEST_F(PlanCli, TimeLimitShorterThanConstructionGivesTheRestrictedPlan) {
  Result r = runApc("plan " + kSamples + "llama_tiny.pt2 --mesh 2x2x4x8 --time-limit 1 --json -o " +
                    tmp("limited.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("apc: note: the time limit passed"), std::string::npos) << r.err;
  // Issue 35: an unproven plan is said on stderr, with its status and gap.
  EXPECT_NE(r.err.find("apc: warning: the plan is not proven optimal (solver status time_limit, "
                       "proven gap "),
            std::string::npos)
      << r.err;
  auto summary = nlohmann::json::parse(r.out);
  EXPECT_NE(summary["note"].get<std::string>().find("cheapest strategies"), std::string::npos);
  auto plan = nlohmann::json::parse(readFile(tmp("limited.json")));
  EXPECT_EQ(plan["solver"]["status"], "time_limit");
  ASSERT_TRUE(plan["solver"]["gap"].is_number());
  EXPECT_GT(plan["solver"]["gap"].get<double>(), 0.0);
  EXPECT_LE(plan["solver"]["bound"].get<double>(), plan["solver"]["objective"].get<double>());
}

// Issue 31: a classic data-parallel plan on more ranks than the batch has rows replicates the
// batch's compute on that mesh dim; apc plan says so instead of calling it ddp silently.
TEST_F(PlanCli, ABatchTooSmallForTheDataParallelRanksIsSaid) {
  Result small = runApc("plan " + kSamples + "mlp_stack.pt --input 'x:f32[4,16,128]' --mesh 8 " +
                        "--strategy ddp --quiet -o " + tmp("ddp8.json"));
  ASSERT_EQ(small.code, 0) << small.err;
  EXPECT_NE(small.err.find("apc: note: ddp: input 'x' (batch 4) is not cut on mesh dim 0 (8 "
                           "ranks): every rank there computes the whole batch"),
            std::string::npos)
      << small.err;
  Result two = runApc("plan " + kSamples + "mlp_stack.pt --input 'x:f32[4,16,128]' --mesh 2x4 " +
                      "--strategy fsdp --quiet -o " + tmp("fsdp24.json"));
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_NE(two.err.find("is not cut on mesh dim 1 (4 ranks)"), std::string::npos) << two.err;
  Result fits = runApc("plan " + kSamples + "mlp_stack.pt --input 'x:f32[8,16,128]' --mesh 8 " +
                       "--strategy ddp --quiet -o " + tmp("ddp8b.json"));
  ASSERT_EQ(fits.code, 0) << fits.err;
  EXPECT_EQ(fits.err.find("is not cut"), std::string::npos) << fits.err;
}

// explain names what an edge's backward price holds: a bucketed gradient is priced without its
// latency, and says so, in text and JSON.
TEST_F(PlanCli, ExplainSaysWhichGradientsAreBucketed) {
  ASSERT_EQ(runApc("plan " + kSamples + "mlp_stack.pt --mesh 2 --strategy ddp --quiet -o " +
                   tmp("ddp2.json"))
                .code,
            0);
  Result r = runApc("explain " + tmp("ddp2.json") + " --top 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("| bwd all-reduce(d0, 256.00 KiB) (bucketed: priced without its latency)"),
            std::string::npos)
      << r.out;
  Result fsdp = runApc("plan " + kSamples + "mlp_stack.pt --mesh 2 --strategy fsdp --quiet -o " +
                       tmp("fsdp2.json"));
  ASSERT_EQ(fsdp.code, 0) << fsdp.err;
  r = runApc("explain " + tmp("fsdp2.json") + " --top 3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("(bucketed"), std::string::npos) << r.out;  // reduce-scatters
  EXPECT_NE(r.out.find("(again in backward)"), std::string::npos) << r.out;
}

TEST_F(PlanCli, SameInputsGiveIdenticalBytes) {
  Result first = planToy(tmp("a.json"));
  ASSERT_EQ(first.code, 0);
  EXPECT_EQ(first.err.find("warning"), std::string::npos) << first.err;  // proven optimal
  ASSERT_EQ(planToy(tmp("b.json")).code, 0);
  EXPECT_EQ(readFile(tmp("a.json")), readFile(tmp("b.json")));
  // A different budget is a different content hash.
  ASSERT_EQ(planToy(tmp("c.json"), "--memory-budget 0,1").code, 0);
  EXPECT_NE(nlohmann::json::parse(readFile(tmp("a.json")))["content_hash"],
            nlohmann::json::parse(readFile(tmp("c.json")))["content_hash"]);
  // Issue 15 finding 5: --threads does not change the plan here, nor its hash.
  ASSERT_EQ(planToy(tmp("t2.json"), "--threads 2 --time-limit 30").code, 0);
  auto a = nlohmann::json::parse(readFile(tmp("a.json")));
  auto t2 = nlohmann::json::parse(readFile(tmp("t2.json")));
  EXPECT_EQ(a["parameters"], t2["parameters"]);
  EXPECT_EQ(a["content_hash"], t2["content_hash"]);
  EXPECT_EQ(runApc("diff " + tmp("a.json") + " " + tmp("t2.json")).code, 0);
  // llama_tiny: many nodes, repeated layers, reduction.
  std::string llama = "plan " + kSamples + "llama_tiny.pt --mesh 2x4 -o ";
  Result l1 = runApc(llama + tmp("l1.json"));
  ASSERT_EQ(l1.code, 0) << l1.err;
  Result l2 = runApc(llama + tmp("l2.json"));
  ASSERT_EQ(l2.code, 0) << l2.err;
  EXPECT_EQ(readFile(tmp("l1.json")), readFile(tmp("l2.json")));
}

// --shared-reads: the spec records it, the plan's totals are its objective (each shared
// redistribution paid once, on the first reader's edge), it is cheaper than the default plan
// priced the same way, the same inputs give the same bytes, and apc lower takes it.
TEST_F(PlanCli, SharedReadsArePaidOnceAndPlannedDeterministically) {
  std::string plan = "plan " + kSamples + "llama_tiny.pt --mesh 4 --quiet -o ";
  ASSERT_EQ(runApc(plan + tmp("each.json")).code, 0);
  Result first = runApc(plan + tmp("s1.json") + " --shared-reads");
  ASSERT_EQ(first.code, 0) << first.err;
  ASSERT_EQ(runApc(plan + tmp("s2.json") + " --shared-reads").code, 0);
  EXPECT_EQ(readFile(tmp("s1.json")), readFile(tmp("s2.json")));
  auto each = nlohmann::json::parse(readFile(tmp("each.json")));
  auto shared = nlohmann::json::parse(readFile(tmp("s1.json")));
  EXPECT_FALSE(each["spec"].contains("shared_reads"));
  EXPECT_EQ(shared["spec"]["shared_reads"], true);
  EXPECT_NE(each["content_hash"], shared["content_hash"]);
  const double objective = shared["solver"]["objective"].get<double>();
  EXPECT_NEAR(shared["totals"]["total_us"].get<double>(), objective, 1e-6 * objective);
  double edges = 0;
  for (const auto& n : shared["nodes"])
    for (const auto& e : n["in_edges"]) edges += e["cost_us"].get<double>();
  EXPECT_NEAR(edges, shared["totals"]["comm_us"].get<double>(), 1e-6 * objective);
  // llama_tiny on [4]: q, k and v (and gate and up) share one all-reduce of their input's
  // gradient; priced once, the plan is cheaper than the default one, which pays it per reader.
  EXPECT_LT(objective, each["solver"]["objective"].get<double>());
  Result lowered = runApc("lower " + tmp("s1.json") + " -o " + tmp("s1_art"));
  EXPECT_EQ(lowered.code, 0) << lowered.err;
}

// Issue 29: a budget that binds in part (the README's llama_tiny example at 0,0.5) is proven
// optimal by the memory search (lib/solver/memory_search.h), which the plan records and the summary
// names; the same plan twice is the same bytes; a plan whose record is malformed is one line.
TEST_F(PlanCli, APartlyBindingBudgetIsProvenByTheMemorySearch) {
  std::string args = "plan " + kSamples +
                     "llama_tiny.pt --mesh 2x4 --in-shardings '[[\"S(0)\",\"R\"]]' "
                     "--out-shardings '[[\"S(0)\",\"R\"]]' --memory-budget 0,0.5 -o ";
  Result r = runApc(args + tmp("m1.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("solver: optimal"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the memory row by Lagrangian relaxation and branch and bound ("),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  auto plan = nlohmann::json::parse(readFile(tmp("m1.json")));
  const auto& search = plan["solver"]["problem"]["memory_search"];
  ASSERT_TRUE(search.is_object()) << plan["solver"].dump();
  EXPECT_GE(search["subproblems"].get<int>(), 1);
  EXPECT_GE(search["branches"].get<int>(), 1);
  EXPECT_LE(plan["totals"]["param_memory_fraction"].get<double>(), 0.5 + 1e-9);
  ASSERT_EQ(runApc(args + tmp("m2.json")).code, 0);
  EXPECT_EQ(readFile(tmp("m1.json")), readFile(tmp("m2.json")));
  // The record reads back (explain), and a malformed one is refused in one line.
  EXPECT_EQ(runApc("explain " + tmp("m1.json") + " --top 1").code, 0);
  plan["solver"]["problem"]["memory_search"]["subproblems"] = 0;
  {
    std::ofstream f(tmp("m3.json"));
    f << plan.dump(2);
  }
  Result bad = runApc("explain " + tmp("m3.json") + " --top 1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("memory_search.subproblems"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("must be at least 1"), std::string::npos) << bad.err;
}

TEST_F(PlanCli, DefaultBudgetIsReachableWithUnevenParameters) {
  // cnn_small's classifier bias has 10 elements: sharded on 4 ranks its largest piece is
  // ceil(10 / 4) = 3, so exactly 1/4 of the parameter bytes is unreachable; the default high
  // becomes the least footprint any plan has.
  Result r = runApc("plan " + kSamples + "cnn_small.pt --mesh 4 -o " + tmp("cnn.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  auto totals = nlohmann::json::parse(readFile(tmp("cnn.json")))["totals"];
  double total = totals["param_bytes_total"].get<double>();
  double per_rank = totals["param_bytes_per_rank"].get<double>();
  EXPECT_GT(per_rank, total / 4);
  EXPECT_GT(totals["memory_high"].get<double>(), 0.25);
  EXPECT_LE(totals["param_memory_fraction"].get<double>(), totals["memory_high"].get<double>());
  // An explicit 1/4 is the user's bound and stays infeasible, with a one-line error.
  expectOneLineError(runApc("plan " + kSamples + "cnn_small.pt --mesh 4 --memory-budget 0,0.25"),
                     "memory");
}

// Issue 29: with a named device and no budget the plan is the fastest that fits the device's
// memory (the datasheet's, or what calibration measured); an unnamed device, the datasheet's
// cpu (no memory) and an explicit --memory-budget keep the fractional parameter budget.
TEST_F(PlanCli, ANamedDevicesMemoryIsTheDefaultBudget) {
  auto planOf = [&](const std::string& flags, const std::string& out) {
    Result r = runApc("plan " + kSamples + "mlp_stack.pt --mesh 4 -o " + tmp(out) + " " + flags);
    EXPECT_EQ(r.code, 0) << r.err;
    return std::pair{nlohmann::json::parse(readFile(tmp(out))), r.err};
  };
  auto [unnamed, unnamed_err] = planOf("", "d0.json");
  EXPECT_FALSE(unnamed["spec"].contains("device_memory")) << unnamed["spec"].dump();
  EXPECT_LE(unnamed["totals"]["param_memory_fraction"].get<double>(), 0.25 + 1e-9);
  EXPECT_EQ(unnamed_err.find("planning to fit"), std::string::npos) << unnamed_err;

  auto [h100, h100_err] = planOf("--device h100", "d1.json");
  ASSERT_TRUE(h100["spec"].contains("device_memory")) << h100["spec"].dump();
  EXPECT_EQ(h100["spec"]["device_memory"].get<int64_t>(), int64_t{80'000'000'000});
  EXPECT_NE(h100_err.find("apc: note: planning to fit 74.51 GiB per rank, the memory of the named "
                          "device h100"),
            std::string::npos)
      << h100_err;
  // mlp_stack fits many times over: the fastest plan, no parameter sharded, and never slower
  // than the fractional budget's plan.
  EXPECT_EQ(h100["totals"]["param_memory_fraction"].get<double>(), 1.0);
  EXPECT_LE(h100["totals"]["total_us"].get<double>(), unnamed["totals"]["total_us"].get<double>());

  for (const std::string flags : {"--device h100 --memory-budget 0,", "--device cpu"}) {
    auto [p, err] = planOf(flags, "d2.json");
    EXPECT_FALSE(p["spec"].contains("device_memory")) << flags << ": " << p["spec"].dump();
    EXPECT_LE(p["totals"]["param_memory_fraction"].get<double>(), 0.25 + 1e-9) << flags;
  }

  // A calibrated profile's measured memory per rank, here too small for the fastest plan (h100's,
  // everything replicated): the plan fits it, by sharding parameters or by recomputing
  // activations, whichever the profile's prices make cheaper.
  std::ofstream(tmp("cluster.json")) << R"({"apc_cluster_profile": 1, "device": "cpu",
      "links": [{"bandwidth_gbps": 1, "latency_us": 100}], "device_memory": 12000000})";
  auto [small, small_err] = planOf("--cluster " + tmp("cluster.json"), "d3.json");
  ASSERT_TRUE(small["spec"].contains("device_memory")) << small["spec"].dump();
  EXPECT_EQ(small["spec"]["device_memory"].get<int64_t>(), 12'000'000);
  EXPECT_NE(small_err.find("the measured memory of the named device cpu"), std::string::npos)
      << small_err;
  EXPECT_GT(h100["memory"]["adamw"]["peak_bytes"].get<double>(), 12e6);
  EXPECT_LE(small["memory"]["adamw"]["peak_bytes"].get<double>(), 12e6) << small["memory"].dump();
  EXPECT_TRUE(small["totals"]["param_memory_fraction"].get<double>() < 1.0 ||
              small["totals"].value("recompute_us", 0.0) > 0)
      << small["totals"].dump();
  std::ofstream(tmp("bad_cluster.json")) << R"({"apc_cluster_profile": 1, "device": "cpu",
      "links": [{"bandwidth_gbps": 1, "latency_us": 100}], "device_memory": 0})";
  expectOneLineError(
      runApc("plan " + kSamples + "mlp_stack.pt --mesh 4 --cluster " + tmp("bad_cluster.json")),
      "$.device_memory: bytes per rank must be in [1, 2^62), got 0");
}

TEST_F(PlanCli, PlanValidatesAgainstTheSchema) {
  ASSERT_EQ(planToy(tmp("s1.json")).code, 0);
  ASSERT_EQ(runApc("plan " + kSamples + "multi_output.pt --mesh 4 -o " + tmp("s2.json")).code, 0);
  Result r = run("/usr/bin/python3 " + std::string(APC_SOURCE_DIR) +
                 "/tests/plan/check_plan_schema.py " + tmp("s1.json") + " " + tmp("s2.json"));
  if (r.code == 77) GTEST_SKIP() << r.out;
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(PlanCli, ExplainListsAlternativesWithStatuses) {
  ASSERT_EQ(planToy(tmp("e.json")).code, 0);
  auto plan = nlohmann::json::parse(readFile(tmp("e.json")));
  std::string linear;
  for (const auto& n : plan["nodes"])
    if (n["op"] == "aten::linear") {
      linear = n["name"];
      break;
    }
  ASSERT_FALSE(linear.empty());
  Result top = runApc("explain " + tmp("e.json") + " --top 3");
  ASSERT_EQ(top.code, 0) << top.err;
  EXPECT_NE(top.out.find("costliest 3 of"), std::string::npos) << top.out;
  Result r = runApc("explain " + tmp("e.json") + " --node " + linear);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("CHOSEN"), std::string::npos) << r.out;
  Result j = runApc("explain " + tmp("e.json") + " --module up --format json");
  ASSERT_EQ(j.code, 0) << j.err;
  auto ex = nlohmann::json::parse(j.out);
  int chosen = 0, others = 0;
  for (const auto& a : ex["node"]["alternatives"]) {
    if (a["status"] == "CHOSEN")
      ++chosen;
    else
      ++others;
  }
  EXPECT_EQ(chosen, 1);
  EXPECT_GT(others, 0);
  EXPECT_EQ(ex["node"]["alternatives"][0]["status"], "CHOSEN");
  Result dot = runApc("explain " + tmp("e.json") + " --format dot");
  ASSERT_EQ(dot.code, 0) << dot.err;
  EXPECT_EQ(dot.out.rfind("digraph plan {", 0), 0u);
}

// Issue 35: --target over the whole graph and --matrix for one input, in text and JSON; the
// target in the printed notation; misuse is one line.
TEST_F(PlanCli, ExplainTargetAndMatrix) {
  ASSERT_EQ(planToy(tmp("t.json")).code, 0);
  auto plan = nlohmann::json::parse(readFile(tmp("t.json")));
  Result text = runApc("explain " + tmp("t.json") + " --target 'S(0)R'");
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out.rfind("target S(0)R: ", 0), 0u) << text.out;
  EXPECT_NE(text.out.find("node-local"), std::string::npos) << text.out;
  Result json = runApc("explain " + tmp("t.json") + " --target 'S(0),R' --format json");
  ASSERT_EQ(json.code, 0) << json.err;
  auto t = nlohmann::json::parse(json.out);
  EXPECT_EQ(t["target"], "S(0)R");
  ASSERT_EQ(t["nodes"].size(), plan["nodes"].size());
  double current = 0;
  for (size_t i = 0; i < t["nodes"].size(); ++i) {
    const auto& row = t["nodes"][i];
    EXPECT_NEAR(row["current_us"].get<double>(), plan["nodes"][i]["cost_us"].get<double>(),
                1e-6 * (1 + plan["nodes"][i]["cost_us"].get<double>()));
    current += row["current_us"].get<double>();
    if (row["already"].get<bool>()) {
      EXPECT_NEAR(row["delta_us"].get<double>(), 0, 1e-9);
    }
  }
  EXPECT_NEAR(current, plan["totals"]["total_us"].get<double>(), 1e-6 * current);
  expectOneLineError(runApc("explain " + tmp("t.json") + " --target 'S(0)'"),
                     "has 1 entry but the mesh");
  expectOneLineError(runApc("explain " + tmp("t.json") + " --target 'Q(0)R'"), "--target:");
  // The matrix of every input of the first linear that has a producer.
  std::string linear;
  nlohmann::json edges;
  for (const auto& n : plan["nodes"])
    if (n["op"] == "aten::linear") {
      linear = n["name"];
      edges = n["in_edges"];
      break;
    }
  ASSERT_FALSE(linear.empty());
  ASSERT_FALSE(edges.empty());
  for (const auto& e : edges) {
    const std::string input = std::to_string(e["input"].get<int>());
    Result m = runApc("explain " + tmp("t.json") + " --node " + linear + " --matrix --input " +
                      input + " --format json");
    ASSERT_EQ(m.code, 0) << m.err;
    auto mj = nlohmann::json::parse(m.out);
    const auto& chosen = mj["chosen"];
    EXPECT_NEAR(mj["us"][chosen["row"].get<size_t>()][chosen["column"].get<size_t>()].get<double>(),
                e["cost_us"].get<double>(), 1e-9 * (1 + e["cost_us"].get<double>()))
        << m.out;
    EXPECT_EQ(mj["producer"]["index"], e["from"]);
  }
  Result mt = runApc("explain " + tmp("t.json") + " --node " + linear + " --matrix");
  ASSERT_EQ(mt.code, 0) << mt.err;
  EXPECT_NE(mt.out.find("redistribution into input 0 of"), std::string::npos) << mt.out;
  EXPECT_NE(mt.out.find("*"), std::string::npos) << mt.out;
  expectOneLineError(runApc("explain " + tmp("t.json") + " --matrix"), "--matrix needs --node");
  expectOneLineError(runApc("explain " + tmp("t.json") + " --node " + linear + " --input 1"),
                     "--input goes with --matrix");
}

TEST_F(PlanCli, DiffAgainstItselfIsEmptyAndAgainstAnotherBudgetListsChanges) {
  // 1-d mesh, large batch: the default budget shards the weights (FSDP-like), 0,1 replicates
  // them (DDP-like).
  writeFile(tmp("in1.json"), "[[\"S(0)\"]]\n");
  std::string base = "plan " + kSamples + "toy_block.pt --input x:f32[512,128,1024] --mesh 8 " +
                     "--in-shardings " + tmp("in1.json");
  ASSERT_EQ(runApc(base + " -o " + tmp("fsdp.json")).code, 0);
  ASSERT_EQ(runApc(base + " --memory-budget 0,1 -o " + tmp("ddp.json")).code, 0);
  Result same = runApc("diff " + tmp("fsdp.json") + " " + tmp("fsdp.json"));
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_NE(same.out.find("no differences in placements"), std::string::npos) << same.out;
  Result d = runApc("diff " + tmp("fsdp.json") + " " + tmp("ddp.json"));
  // Issue 15 finding 5: like `git diff --exit-code`, 1 when the placements differ.
  ASSERT_EQ(d.code, 1) << d.err;
  EXPECT_NE(d.out.find("with different placements"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("up.weight"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("parameter memory per rank"), std::string::npos) << d.out;
  Result j = runApc("diff " + tmp("fsdp.json") + " " + tmp("ddp.json") + " --format json");
  ASSERT_EQ(j.code, 1) << j.err;
  auto dj = nlohmann::json::parse(j.out);
  EXPECT_FALSE(dj["identical_placements"].get<bool>());
  EXPECT_EQ(dj["parameters"].size(), 2u);
}

// Activation checkpointing end to end: `--checkpoint all` on llama_tiny checkpoints its layers
// (the summary says so, the plan validates, explain and diff show it, lowering writes the
// segments), a module that is not a candidate is one line naming it, and the same flags give the
// same bytes.
TEST_F(PlanCli, CheckpointingIsPlannedShownAndLowered) {
  const std::string base =
      "plan " + kSamples + "llama_tiny.pt2 --mesh 2 --device cpu --checkpoint ";
  Result r = runApc(base + "all -o " + tmp("ck.json") + " --artifact " + tmp("ck_art"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("activation checkpointing: 2 modules recomputed in backward (layers.0 ... "
                       "layers.1)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("recompute "), std::string::npos) << r.out;
  ASSERT_EQ(runApc(base + "all -o " + tmp("ck2.json")).code, 0);
  EXPECT_EQ(readFile(tmp("ck.json")), readFile(tmp("ck2.json")));
  Result schema = run("/usr/bin/python3 " + std::string(APC_SOURCE_DIR) +
                      "/tests/plan/check_plan_schema.py " + tmp("ck.json"));
  if (schema.code != 77) {
    EXPECT_EQ(schema.code, 0) << schema.out << schema.err;
  }
  ASSERT_EQ(runApc(base + "none -o " + tmp("ck0.json")).code, 0);
  Result d = runApc("diff " + tmp("ck0.json") + " " + tmp("ck.json"));
  EXPECT_NE(d.out.find("activation checkpointing differs: modules recomputed none vs 2"),
            std::string::npos)
      << d.out << d.err;
  Result e = runApc("explain " + tmp("ck.json"));
  EXPECT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("recompute "), std::string::npos) << e.out;
  EXPECT_TRUE(fs::exists(tmp("ck_art") + "/rank_1.apcp"));
  expectOneLineError(runApc(base + "layers.0,layers.7 -o " + tmp("x.json")), "'layers.7'");
  expectOneLineError(runApc("plan " + kSamples + "toy_block.pt --mesh 2 --checkpoint all"),
                     "no module to checkpoint");
}

TEST_F(PlanCli, BadInputIsOneLineAndExitTwo) {
  // Infeasible: no placement of the weights fits in 1% of their bytes per rank.
  expectOneLineError(planToy(tmp("x.json"), "--memory-budget 0,0.01"), "memory budget");
  // Budget low > high.
  expectOneLineError(planToy(tmp("x.json"), "--memory-budget 0.5,0.25"), "greater than high");
  expectOneLineError(planToy(tmp("x.json"), "--memory-budget lots"), "--memory-budget");
  // Unknown node in a pin.
  writeFile(tmp("pin.json"),
            "{\"mesh\": {\"shape\": [2, 4]}, \"pins\": [{\"node\": \"nope\", \"placements\": "
            "[\"R\", \"R\"]}]}\n");
  expectOneLineError(runApc("plan " + kSamples + "toy_block.pt --spec " + tmp("pin.json")),
                     "spec pins node 'nope'");
  // Malformed files.
  writeFile(tmp("broken.json"), "[[\"S(0)\", \n");
  expectOneLineError(
      runApc("plan " + kSamples + "toy_block.pt --mesh 2x4 --in-shardings " + tmp("broken.json")),
      "broken.json");
  expectOneLineError(
      runApc("plan " + kSamples + "toy_block.pt --mesh 2x4 --out-shardings " + tmp("missing.json")),
      "missing.json");
  writeFile(tmp("wrong_len.json"), "[[\"S(0)\"]]\n");
  expectOneLineError(runApc("plan " + kSamples + "toy_block.pt --mesh 2x4 --in-shardings " +
                            tmp("wrong_len.json")),
                     "wrong_len.json");
  expectOneLineError(runApc("plan " + kSamples + "toy_block.pt --mesh 2x4 --device tpu"),
                     "unknown device 'tpu'");
  expectOneLineError(runApc("plan " + kSamples + "toy_block.pt"), "no mesh given");
  expectOneLineError(runApc("explain " + tmp("broken.json")), "broken.json");
  writeFile(tmp("not_a_plan.json"), "{\"nodes\": []}\n");
  expectOneLineError(runApc("explain " + tmp("not_a_plan.json")), "missing key");
  ASSERT_EQ(planToy(tmp("ok.json")).code, 0);
  expectOneLineError(runApc("explain " + tmp("ok.json") + " --node no_such_node"),
                     "no node named 'no_such_node'");
  expectOneLineError(runApc("explain " + tmp("ok.json") + " --format png"), "--format");
  expectOneLineError(runApc("diff " + tmp("ok.json") + " " + tmp("missing.json")), "missing.json");
}

TEST_F(PlanCli, ExplainChecksTheModelHash) {
  ASSERT_EQ(planToy(tmp("h.json")).code, 0);
  auto plan = nlohmann::json::parse(readFile(tmp("h.json")));
  plan["model"]["path"] = kSamples + "llama_tiny.pt";  // another model under the stored hash
  // The plan carries its graph: the model path is not read, a --model given is checked.
  writeFile(tmp("h2.json"), plan.dump());
  Result own = runApc("explain " + tmp("h2.json") + " --node x");
  EXPECT_EQ(own.code, 0) << own.err;
  expectOneLineError(
      runApc("explain " + tmp("h2.json") + " --node x --model " + kSamples + "llama_tiny.pt"),
      "SHA-256 differs");
  // Without the graph (a plan of apc 0.1) the model is imported again and its hash checked.
  plan.erase("graph");
  writeFile(tmp("h3.json"), plan.dump());
  expectOneLineError(runApc("explain " + tmp("h3.json") + " --node x"), "SHA-256 differs");
  // --model points at the right file again.
  Result ok =
      runApc("explain " + tmp("h3.json") + " --node x --model " + kSamples + "toy_block.pt");
  EXPECT_EQ(ok.code, 0) << ok.err;
}

TEST_F(PlanCli, ExplainAndLowerNeedNoModelFile) {
  // A plan of a model copied away and deleted: explain (alternatives and collectives) and lower
  // work from the graph in the plan, and lower gives the same artifact as from the model.
  const std::string model = tmp("gone.pt2");
  writeFile(model, readFile(kSamples + "mlp_stack.pt2"));
  ASSERT_EQ(
      runApc("plan " + model + " --mesh 2 -o " + tmp("g.json") + " --artifact " + tmp("g_art"))
          .code,
      0);
  auto plan = nlohmann::json::parse(readFile(tmp("g.json")));
  ASSERT_TRUE(plan.contains("graph"));
  std::string node;
  for (const auto& n : plan["nodes"])
    if (n["kind"] == "op") {
      node = n["name"];
      break;
    }
  std::remove(model.c_str());
  Result e = runApc("explain " + tmp("g.json") + " --node " + node);
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("CHOSEN"), std::string::npos) << e.out;
  EXPECT_EQ(e.err.find("not shown"), std::string::npos) << e.err;
  Result l = runApc("lower " + tmp("g.json") + " -o " + tmp("g_art2"));
  ASSERT_EQ(l.code, 0) << l.err;
  for (const char* f : {"manifest.json", "rank_0.apcp", "rank_1.apcp"})
    EXPECT_EQ(readFile(tmp("g_art2") + "/" + f), readFile(tmp("g_art") + "/" + f)) << f;
  // A damaged graph is a one-line error naming the field.
  std::string text = plan["graph"];
  plan["graph"] = text.substr(0, text.size() / 2) + "!" + text.substr(text.size() / 2 + 1);
  writeFile(tmp("g_bad.json"), plan.dump());
  expectOneLineError(runApc("lower " + tmp("g_bad.json") + " -o " + tmp("g_art3")), "$.graph");
}

TEST_F(PlanCli, ClassicPlansArePricedByTheSameModel) {
  // toy_block on [8] with a large batch. FSDP shards every weight on dim 0 (4096 and 1024 both
  // divide by 8) at 1/8 of the bytes, which is the optimizer's default budget: with the same
  // (batch-sharded) input the optimizer can choose FSDP, so it is never dearer.
  writeFile(tmp("in8.json"), "[[\"S(0)\"]]\n");
  std::string toy = "plan " + kSamples + "toy_block.pt --input x:f32[512,128,1024] --mesh 8 ";
  Result fsdp = runApc(toy + "--strategy fsdp -o " + tmp("b_fsdp.json"));
  ASSERT_EQ(fsdp.code, 0) << fsdp.err;
  EXPECT_NE(fsdp.out.find("solver: baseline fsdp"), std::string::npos) << fsdp.out;
  auto b = nlohmann::json::parse(readFile(tmp("b_fsdp.json")));
  EXPECT_EQ(b["solver"]["status"], "baseline fsdp");
  EXPECT_EQ(b["solver"]["baseline"], "fsdp");
  EXPECT_EQ(b["spec"]["inputs"]["x"], nlohmann::json({"S(0)"}));  // data parallel input
  ASSERT_EQ(b["parameters"].size(), 2u);
  for (const auto& prm : b["parameters"])
    EXPECT_EQ(prm["placement"], nlohmann::json({"S(0)"})) << prm["name"];
  ASSERT_EQ(runApc(toy + "--in-shardings " + tmp("in8.json") + " -o " + tmp("b_opt.json")).code, 0);
  auto opt = nlohmann::json::parse(readFile(tmp("b_opt.json")));
  EXPECT_LE(opt["solver"]["objective"].get<double>(),
            b["solver"]["objective"].get<double>() * (1 + 1e-9));
  EXPECT_NE(opt["content_hash"], b["content_hash"]);

  // DDP: every weight replicated; diff against the optimizer's plan and explain work on it.
  ASSERT_EQ(runApc(toy + "--strategy ddp -o " + tmp("b_ddp.json")).code, 0);
  auto ddp = nlohmann::json::parse(readFile(tmp("b_ddp.json")));
  for (const auto& prm : ddp["parameters"]) EXPECT_EQ(prm["placement"], nlohmann::json({"R"}));
  Result d = runApc("diff " + tmp("b_opt.json") + " " + tmp("b_ddp.json"));
  ASSERT_EQ(d.code, 1) << d.err;
  EXPECT_NE(d.out.find("up.weight"), std::string::npos) << d.out;
  Result e = runApc("explain " + tmp("b_ddp.json") + " --node up.weight");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("CHOSEN"), std::string::npos) << e.out;

  // tp on a 1-d mesh is Megatron on that dim with replicated inputs; fsdp+tp needs 2 dims.
  ASSERT_EQ(runApc(toy + "--strategy tp -o " + tmp("b_tp.json")).code, 0);
  auto tp = nlohmann::json::parse(readFile(tmp("b_tp.json")));
  EXPECT_EQ(tp["spec"]["inputs"]["x"], nlohmann::json({"R"}));
  EXPECT_EQ(tp["parameters"][0]["placement"], nlohmann::json({"S(0)"}));  // up: column-parallel
  EXPECT_EQ(tp["parameters"][1]["placement"], nlohmann::json({"S(1)"}));  // down: row-parallel
  Result two_d = runApc("plan " + kSamples + "toy_block.pt --mesh 2x4 --strategy fsdp+tp -o " +
                        tmp("b_2d.json"));
  ASSERT_EQ(two_d.code, 0) << two_d.err;
  Result r = run("/usr/bin/python3 " + std::string(APC_SOURCE_DIR) +
                 "/tests/plan/check_plan_schema.py " + tmp("b_fsdp.json") + " " + tmp("b_2d.json"));
  if (r.code != 77) {
    EXPECT_EQ(r.code, 0) << r.out << r.err;
  }

  expectOneLineError(runApc(toy + "--strategy zero9"), "unknown baseline 'zero9'");
  expectOneLineError(runApc(toy + "--strategy fsdp+tp"), "needs a mesh of 2 or more dims");
  expectOneLineError(runApc(toy + "--strategy ddp --memory-budget 0,1"), "--memory-budget");
}

TEST_F(PlanCli, PinsAreAppliedAndInfeasiblePinsNamed) {
  // Pin the first linear's output replicated: the plan honours it and shows the pin's sink.
  writeFile(tmp("pins.json"),
            "{\"mesh\": {\"shape\": [8]}, \"inputs\": {\"x\": [\"S(0)\"]}, \"pins\": "
            "[{\"node\": \"up.weight\", \"placements\": [\"S(1)\"]}]}\n");
  Result ok = runApc("plan " + kSamples + "toy_block.pt --spec " + tmp("pins.json") + " -o " +
                     tmp("pinned.json"));
  ASSERT_EQ(ok.code, 0) << ok.err;
  auto plan = nlohmann::json::parse(readFile(tmp("pinned.json")));
  EXPECT_EQ(plan["parameters"][0]["name"], "up.weight");
  EXPECT_EQ(plan["parameters"][0]["placement"], nlohmann::json({"S(1)"}));
  bool sink = false;
  for (const auto& n : plan["nodes"])
    sink =
        sink || (n["kind"] == "pin" && n["name"] == "pin %up.weight" && n["pin_group"] == "pins");
  EXPECT_TRUE(sink);
  Result r = run("/usr/bin/python3 " + std::string(APC_SOURCE_DIR) +
                 "/tests/plan/check_plan_schema.py " + tmp("pinned.json"));
  if (r.code != 77) {
    EXPECT_EQ(r.code, 0) << r.out << r.err;
  }
  // The same parameter pinned two ways is a spec error, before any solve.
  writeFile(tmp("bad_pins.json"),
            "{\"mesh\": {\"shape\": [8]}, \"pins\": [{\"node\": \"up.weight\", "
            "\"placements\": [\"S(1)\"]}, {\"node\": \"up.weight\", \"placements\": "
            "[\"S(0)\"]}]}\n");
  expectOneLineError(runApc("plan " + kSamples + "toy_block.pt --spec " + tmp("bad_pins.json")),
                     "$.pins[1]: node 'up.weight' is pinned twice (first at $.pins[0] to S(1), "
                     "here to S(0))");
}

}  // namespace
