//===- tests/spec/spec_test.cpp - The mesh and constraint spec --------------===//
//
// The spec parser against the shared cases of tests/spec/spec_cases.json (the same cases that
// check_schemas.py runs against the JSON Schemas), field values of parsed specs, round trips
// through toJson, JSON text errors (line and column, keys given twice), files, and the CLI sharding
// files. Checks against a model are in spec_graph_test.cpp.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "../common/placements.h"
#include "apc/spec/spec.h"
#include "apc/support/json_reader.h"

namespace apc::spec {
namespace {

using mesh::defaultLinks;
using nlohmann::json;

const std::string kSourceDir = APC_SOURCE_DIR;

json loadCases() {
  auto j = readJsonFile(kSourceDir + "/tests/spec/spec_cases.json");
  EXPECT_TRUE(j.ok()) << j.error().message();
  return j.ok() ? *j : json::object();
}

using testing::tuple;

Spec parseSpecOk(std::string_view text) {
  auto s = parseSpecText(text);
  EXPECT_TRUE(s.ok()) << s.error().message();
  return s.ok() ? *s : Spec{};
}

std::string errorOf(std::string_view text) {
  auto s = parseSpecText(text);
  EXPECT_FALSE(s.ok()) << text;
  return s.ok() ? std::string() : s.error().message();
}

// --- the shared cases ----------------------------------------------------------------------------

TEST(SpecCases, ParserAgreesWithEveryCase) {
  json cases = loadCases();
  ASSERT_GE(cases["spec"].size(), 60u);
  for (const json& c : cases["spec"]) {
    std::string name = c["name"];
    auto s = parseSpec(c["doc"]);
    if (c["parser_error"].is_null()) {
      EXPECT_TRUE(s.ok()) << name << ": " << s.error().message();
      EXPECT_TRUE(c["schema_valid"].get<bool>()) << name << ": parser accepts, schema must too";
    } else {
      ASSERT_FALSE(s.ok()) << name << ": parsed but expected " << c["parser_error"];
      std::string want = c["parser_error"];
      EXPECT_NE(s.error().message().find(want), std::string::npos)
          << name << "\n  got:  " << s.error().message() << "\n  want: " << want;
      EXPECT_EQ(s.error().message().rfind("$", 0), 0u) << name << ": errors start with the path";
      EXPECT_EQ(s.error().message().find('\n'), std::string::npos) << name << ": one line";
      EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument) << name;
    }
  }
}

TEST(SpecCases, GoodSpecsRoundTrip) {
  json cases = loadCases();
  int canonical = 0;
  for (const json& c : cases["spec"]) {
    if (!c["parser_error"].is_null()) continue;
    std::string name = c["name"];
    auto s = parseSpec(c["doc"]);
    ASSERT_TRUE(s.ok()) << name;
    json out = toJson(*s);
    auto back = parseSpec(out);
    ASSERT_TRUE(back.ok()) << name << ": " << back.error().message() << "\n" << out.dump();
    EXPECT_EQ(*back, *s) << name << "\n" << out.dump();
    EXPECT_EQ(toJson(*back), out) << name;
    if (c.value("canonical", false)) {
      ++canonical;
      EXPECT_EQ(out, c["doc"]) << name << "\n  got:  " << out.dump()
                               << "\n  want: " << c["doc"].dump();
    }
  }
  EXPECT_EQ(canonical, 3);
}

TEST(SpecCases, ClusterProfilesAgreeWithEveryCase) {
  json cases = loadCases();
  ASSERT_GE(cases["cluster"].size(), 8u);
  for (const json& c : cases["cluster"]) {
    std::string name = c["name"];
    auto p = parseClusterProfile(c["doc"]);
    if (c["parser_error"].is_null()) {
      ASSERT_TRUE(p.ok()) << name << ": " << p.error().message();
      EXPECT_TRUE(c["schema_valid"].get<bool>()) << name;
      // Round trip: what toJson writes reads back to the same profile.
      auto back = parseClusterProfile(toJson(*p));
      ASSERT_TRUE(back.ok()) << name << ": " << back.error().message();
      EXPECT_EQ(back->device, p->device);
      EXPECT_EQ(back->device_overrides, p->device_overrides);
      EXPECT_EQ(back->links, p->links);
      EXPECT_EQ(back->network, p->network);
      EXPECT_EQ(toJson(*back), c["doc"]) << name;
    } else {
      ASSERT_FALSE(p.ok()) << name << ": parsed but expected " << c["parser_error"];
      std::string want = c["parser_error"];
      EXPECT_NE(p.error().message().find(want), std::string::npos)
          << name << "\n  got:  " << p.error().message() << "\n  want: " << want;
      EXPECT_EQ(p.error().message().find('\n'), std::string::npos) << name << ": one line";
    }
  }
}

TEST(ClusterProfile, AppliesOneLinkToEveryDimOrOnePerDim) {
  auto p = parseClusterProfile(json::parse(R"({"apc_cluster_profile": 1, "device": {"kind": "cpu",
      "peak_tflops": {"f32": 0.04}, "kernel_floor_us": 2},
      "links": [{"bandwidth_gbps": 0.8, "latency_us": 180}],
      "network": [{"all-gather": {"bandwidth_gbps": 0.3, "latency_us": 250}}]})"));
  ASSERT_TRUE(p.ok()) << p.error().message();
  Spec s = parseSpecOk(R"({"mesh": {"shape": [2, 2]}, "device": "h100"})");
  ASSERT_TRUE(applyClusterProfile(*p, s).ok());
  EXPECT_EQ(s.device, "cpu");
  EXPECT_EQ(s.device_overrides.kernel_floor_us, 2.0);
  for (size_t m = 0; m < 2; ++m) {
    EXPECT_EQ(s.mesh.link(m).bandwidth_gbps, 0.8);
    EXPECT_EQ(s.mesh.link(m).latency_us, 180.0);
  }
  ASSERT_EQ(s.network.size(), 2u);
  EXPECT_EQ(s.network[1].by_kind[0]->bandwidth_gbps, 0.3);
  // The spec with the profile applied round-trips (a plan records it).
  auto back = parseSpec(toJson(s));
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, s);

  p->links.push_back({1.0, 1.0});
  p->network.push_back({});
  Spec three = parseSpecOk(R"({"mesh": {"shape": [2, 2, 2]}})");
  auto st = applyClusterProfile(*p, three);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("2 links but the mesh"), std::string::npos)
      << st.error().message();
}

TEST(ClusterProfile, FilesAreRead) {
  auto missing = readClusterProfile("/nonexistent/cluster.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("/nonexistent/cluster.json"), std::string::npos);
  const std::string path = ::testing::TempDir() + "/truncated_cluster.json";
  std::ofstream(path) << R"({"apc_cluster_profile": 1, "device": )";
  auto truncated = readClusterProfile(path);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.error().message().find(path), std::string::npos);
  EXPECT_EQ(truncated.error().message().find('\n'), std::string::npos);
}

TEST(SpecCases, OutShardingsAgreeWithEveryCase) {
  json cases = loadCases();
  ASSERT_GE(cases["out_shardings"].size(), 10u);
  for (const json& c : cases["out_shardings"]) {
    std::string name = c["name"];
    size_t ndim = c["mesh_ndim"];
    auto t = parseOutShardings(c["doc"], ndim);
    if (c["parser_error"].is_null()) {
      ASSERT_TRUE(t.ok()) << name << ": " << t.error().message();
      auto back = parseOutShardings(toJson(*t), ndim);
      ASSERT_TRUE(back.ok()) << name;
      EXPECT_EQ(*back, *t) << name;
      if (c.value("canonical", false)) {
        EXPECT_EQ(toJson(*t), c["doc"]) << name;
      }
    } else {
      ASSERT_FALSE(t.ok()) << name;
      std::string want = c["parser_error"];
      EXPECT_NE(t.error().message().find(want), std::string::npos)
          << name << "\n  got:  " << t.error().message() << "\n  want: " << want;
    }
  }
}

TEST(SpecCases, SampleSpecsParseAndRoundTrip) {
  int count = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(kSourceDir + "/sample_models/specs")) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    auto s = parseSpecFile(entry.path().string());
    ASSERT_TRUE(s.ok()) << s.error().message();
    auto back = parseSpec(toJson(*s));
    ASSERT_TRUE(back.ok()) << entry.path() << ": " << back.error().message();
    EXPECT_EQ(*back, *s) << entry.path();
  }
  EXPECT_GE(count, 5);
}

// --- field values --------------------------------------------------------------------------------

TEST(Spec, ReadsEveryField) {
  Spec s = parseSpecOk(R"j({
    "mesh": {"shape": [2, 4], "names": ["dp", "tp"], "bandwidth_gbps": [25, 900], "latency_us": [12.5, 0]},
    "device": {"kind": "h200", "peak_tflops": {"bf16": 989, "f32": 67}, "hbm_bandwidth_gbps": 4800},
    "world_size": 8,
    "inputs": {"x": ["S(0)", "R"], "mask": null},
    "outputs": [["S(0)", "S(1)"], null, {"loss": ["P", "R"]}],
    "memory_budget": {"low": 0.1, "high": 0.5},
    "mixed_precision": {"param_dtype": "bfloat16", "output_dtype": "f32"},
    "dynamic_batch": true,
    "shared_reads": true,
    "dynamic": [{"input": "x", "dim": 1, "max": 4096}],
    "pins": [{"node": "linear_1", "placements": ["R", "S(1)"]}, {"module": "layers.0", "placements": ["S(0)", "R"]}]
  })j");
  EXPECT_EQ(s.mesh.toString(), "2x4(dp,tp)");
  EXPECT_EQ(s.mesh.link(0), (LinkParams{25.0, 12.5}));
  EXPECT_EQ(s.mesh.link(1), (LinkParams{900.0, 0.0}));
  EXPECT_EQ(s.device, "h200");
  EXPECT_EQ(s.device_overrides.peak_tflops,
            (std::map<ir::DType, double>{{ir::DType::kBF16, 989.0}, {ir::DType::kF32, 67.0}}));
  EXPECT_EQ(s.device_overrides.hbm_bandwidth_gbps, 4800.0);
  EXPECT_EQ(s.world_size, 8);
  EXPECT_EQ(s.inputs, (std::map<std::string, PlacementTuple>{{"x", tuple("S(0),R")}}));
  EXPECT_EQ(s.outputs,
            OutputPlacementTree::makeSequence(
                {OutputPlacementTree::makeLeaf(tuple("S(0),S(1)")), OutputPlacementTree::makeFree(),
                 OutputPlacementTree::makeDict(
                     {{"loss", OutputPlacementTree::makeLeaf(tuple("P,R"))}})}));
  EXPECT_EQ(toString(s.outputs), "(S(0)S(1), *, {loss: PR})");
  EXPECT_EQ(s.memory_budget, (MemoryBudget{0.1, 0.5}));
  EXPECT_EQ(s.mixed_precision.param_dtype, ir::DType::kBF16);
  EXPECT_EQ(s.mixed_precision.reduce_dtype, std::nullopt);
  EXPECT_EQ(s.mixed_precision.output_dtype, ir::DType::kF32);
  EXPECT_TRUE(s.dynamic_batch);
  EXPECT_TRUE(s.shared_reads);
  ASSERT_EQ(s.dynamic.size(), 1u);
  EXPECT_EQ(s.dynamic[0], (DynamicDim{"x", 1, 1, 4096}));
  ASSERT_EQ(s.pins.size(), 2u);
  EXPECT_EQ(s.pins[0], (Pin{Pin::Target::kNode, "linear_1", tuple("R,S(1)")}));
  EXPECT_EQ(s.pins[1], (Pin{Pin::Target::kModule, "layers.0", tuple("S(0),R")}));
}

TEST(Spec, DefaultsWhenOnlyTheMeshIsGiven) {
  Spec s = parseSpecOk(R"j({"mesh": {"shape": [2, 2, 2]}})j");
  EXPECT_EQ(s.mesh.toString(), "2x2x2(d0,d1,d2)");
  EXPECT_EQ(s.mesh.link(0), defaultLinks(3)[0]);
  EXPECT_EQ(s.mesh.link(2), (LinkParams{450.0, 2.0}));
  EXPECT_EQ(s.device, "h100");
  EXPECT_TRUE(s.device_overrides.empty());
  EXPECT_EQ(s.world_size, std::nullopt);
  EXPECT_TRUE(s.inputs.empty());
  EXPECT_TRUE(s.outputs.isFree());
  EXPECT_EQ(s.memory_budget, MemoryBudget{});
  EXPECT_TRUE(s.mixed_precision.empty());
  EXPECT_FALSE(s.dynamic_batch);
  EXPECT_FALSE(s.shared_reads);
  EXPECT_TRUE(s.dynamic.empty());
  EXPECT_TRUE(s.pins.empty());
  // Only the bandwidth is overridden: the latencies keep their defaults.
  Spec bw = parseSpecOk(R"j({"mesh": {"shape": [2, 4], "bandwidth_gbps": [100, 200]}})j");
  EXPECT_EQ(bw.mesh.link(0), (LinkParams{100.0, 10.0}));
  EXPECT_EQ(bw.mesh.link(1), (LinkParams{200.0, 2.0}));
}

TEST(Spec, KnownDeviceKinds) {
  EXPECT_EQ(knownDeviceKinds(), (std::vector<std::string>{"h100", "h200", "a100", "b200", "cpu"}));
  for (const std::string& k : knownDeviceKinds()) {
    EXPECT_TRUE(isKnownDeviceKind(k));
    EXPECT_EQ(parseSpecOk(R"j({"mesh": {"shape": [2]}, "device": ")j" + k + "\"}").device, k);
  }
  EXPECT_FALSE(isKnownDeviceKind("H100"));
  EXPECT_FALSE(isKnownDeviceKind("tpu"));
}

TEST(Spec, BuiltInCodeRoundTrips) {
  Spec s;
  s.mesh = *DeviceMesh::create({4, 2}, {"dp", "tp"});
  s.mesh.setLink(0, LinkParams{12.5, 30});
  s.device = "b200";
  s.device_overrides.hbm_bandwidth_gbps = 8000;
  s.world_size = 8;
  s.inputs["tokens"] = tuple("S(0),R");
  s.outputs = OutputPlacementTree::makeDict(
      {{"z", OutputPlacementTree::makeLeaf(tuple("R,R"))}, {"a", OutputPlacementTree::makeFree()}});
  EXPECT_EQ(s.outputs.keys, (std::vector<std::string>{"a", "z"}));  // stored sorted
  s.memory_budget.high = 0.5;
  s.mixed_precision.reduce_dtype = ir::DType::kF32;
  s.dynamic.push_back({"tokens", 1, 2, std::nullopt});
  s.pins.push_back({Pin::Target::kModule, "layers.3", tuple("S(0),S(1)")});
  EXPECT_FALSE(toJson(s).contains("shared_reads"));  // the default is not written
  s.shared_reads = true;
  json j = toJson(s);
  EXPECT_EQ(j["shared_reads"], true);
  EXPECT_EQ(j["device"], (json{{"kind", "b200"}, {"hbm_bandwidth_gbps", 8000.0}}));
  EXPECT_EQ(j["memory_budget"], (json{{"low", 0.0}, {"high", 0.5}}));
  EXPECT_EQ(j["dynamic"], json::parse(R"j([{"input": "tokens", "dim": 1, "min": 2}])j"));
  EXPECT_EQ(j["outputs"], json::parse(R"j({"a": null, "z": ["R", "R"]})j"));
  EXPECT_FALSE(j.contains("dynamic_batch"));
  auto back = parseSpec(j);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, s);
  // Text round trip through dump().
  auto text = parseSpecText(j.dump(2));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, s);
}

TEST(Spec, OutputTreeTextForm) {
  EXPECT_EQ(toString(OutputPlacementTree::makeFree()), "*");
  EXPECT_EQ(toString(OutputPlacementTree::makeSequence({})), "()");
  EXPECT_EQ(toString(OutputPlacementTree::makeDict(
                {{"b", OutputPlacementTree::makeLeaf(tuple("R"))},
                 {"a", OutputPlacementTree::makeSequence({OutputPlacementTree::makeFree()})}})),
            "{a: (*), b: R}");
}

// --- JSON text and files -------------------------------------------------------------------------

TEST(SpecText, MalformedJsonNamesLineAndColumn) {
  auto s = parseSpecText("{\n  \"mesh\": {\"shape\": [2, 4]},\n  \"device\": h100\n}");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kParse);
  EXPECT_EQ(s.error().message().rfind("malformed JSON: parse error at line 3, column 13", 0), 0u)
      << s.error().message();
  EXPECT_EQ(s.error().message().find('\n'), std::string::npos) << s.error().message();
  EXPECT_EQ(s.error().message().find("[json.exception"), std::string::npos);
  std::string trailing = errorOf(R"j({"mesh": {"shape": [2]},})j");
  EXPECT_NE(trailing.find("malformed JSON: parse error at line 1, column 25"), std::string::npos)
      << trailing;
  EXPECT_NE(errorOf("").find("malformed JSON: parse error at line 1, column 1"), std::string::npos);
}

TEST(SpecText, KeysGivenTwiceAreErrors) {
  auto top = parseSpecText(R"j({"mesh": {"shape": [2]}, "mesh": {"shape": [4]}})j");
  ASSERT_FALSE(top.ok());
  EXPECT_EQ(top.error().code(), ErrorCode::kParse);
  EXPECT_EQ(top.error().message(), "$.mesh: key given twice in one object");
  EXPECT_EQ(errorOf(R"j({"mesh": {"shape": [2]}, "pins": [{"node": "a", "placements": ["R"]},
                       {"node": "b", "placements": ["R"], "node": "c"}]})j"),
            "$.pins[1].node: key given twice in one object");
  EXPECT_EQ(errorOf(R"j({"mesh": {"shape": [2]}, "outputs": [[null, {"k": ["R"], "k": null}]]})j"),
            "$.outputs[0][1].k: key given twice in one object");
  EXPECT_EQ(errorOf(R"j({"mesh": {"shape": [2]}, "inputs": {"a.b": ["R"], "a.b": ["R"]}})j"),
            "$.inputs[\"a.b\"]: key given twice in one object");
  // The same key in sibling objects is fine.
  parseSpecOk(R"j({"mesh": {"shape": [2]}, "pins": [{"node": "a", "placements": ["R"]},
             {"node": "b", "placements": ["R"]}]})j");
}

TEST(SpecText, NulBytesAndTrailingGarbageAreErrors) {
  std::string text = R"j({"mesh": {"shape": [2]}})j";
  text += std::string("\0", 1) + "garbage";
  auto s = parseSpecText(text);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kParse);
  EXPECT_EQ(s.error().message(),
            "malformed JSON: a NUL byte at byte 24 (JSON text holds no NUL bytes)");
  EXPECT_NE(errorOf(R"j({"mesh": {"shape": [2]}} garbage)j").find("malformed JSON"),
            std::string::npos);
}

TEST(SpecText, DeepNestingIsAnErrorNotACrash) {
  for (size_t n : {size_t{65}, size_t{30000}, size_t{100000}}) {
    std::string deep = std::string(n, '[') + "null" + std::string(n, ']');
    auto j = parseJsonText(deep);
    ASSERT_FALSE(j.ok()) << n;
    EXPECT_EQ(j.error().message(),
              "JSON nested deeper than 64 levels at byte 64 (apc reads at most 64)");
    auto out = parseOutShardings(json(nullptr), 1);  // the reader itself is fine with null
    EXPECT_TRUE(out.ok());
    std::string spec = R"j({"mesh": {"shape": [2]}, "outputs": )j" + deep + "}";
    EXPECT_NE(errorOf(spec).find("JSON nested deeper than 64 levels"), std::string::npos);
  }
  // 64 levels are fine; brackets inside strings do not count.
  std::string ok = std::string(64, '[') + "\"[[[[{{{{\"" + std::string(64, ']');
  EXPECT_TRUE(parseJsonText(ok).ok());
  std::string escaped = "[\"\\\"[[\"]";  // ["\"[["]
  EXPECT_TRUE(parseJsonText(escaped).ok()) << escaped;
}

TEST(SpecText, LongDynamicListsAreLinearAndCapped) {
  auto entries = [](size_t n) {
    std::string list = "[";
    for (size_t i = 0; i < n; ++i)
      list += (i ? "," : "") + std::string(R"j({"input": "x)j") + std::to_string(i) +
              R"j(", "dim": 0})j";
    return list + "]";
  };
  parseSpecOk(R"j({"mesh": {"shape": [2]}, "dynamic": )j" + entries(1024) + "}");
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(errorOf(R"j({"mesh": {"shape": [2]}, "dynamic": )j" + entries(100000) + "}"),
            "$.dynamic: a list of 100000 dynamic dims; at most 1024");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(SpecText, ControlCharactersInNamesAreEscaped) {
  std::string msg = errorOf(
      R"j({"mesh": {"shape": [2]}, "pins": [{"module": "a\nb", "placements": ["R"]},
                                           {"module": "a\nb", "placements": ["S(0)"]}]})j");
  EXPECT_EQ(msg,
            "$.pins[1]: module 'a\\nb' is pinned twice (first at $.pins[0] to R, here to S(0))");
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(SpecText, ParseJsonTextKeepsValues) {
  auto j = parseJsonText(R"j([1, {"a": [true, null]}, "s"])j");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(*j, json::parse(R"j([1, {"a": [true, null]}, "s"])j"));
}

class SpecFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(APC_BINARY_DIR) / "tests" / "mesh" / "spec_files";
    std::filesystem::create_directories(dir_);
  }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(SpecFiles, ErrorsArePrefixedByThePath) {
  std::string bad =
      write("bad.json", R"j({"mesh": {"shape": [2, 4], "bandwidth_gbps": [50, 0]}})j");
  auto s = parseSpecFile(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(),
            bad + ": $.mesh.bandwidth_gbps[1]: bandwidth (GB/s) must be in [0.001, 1e+06], got 0");
  std::string broken = write("broken.json", "{\"mesh\": ");
  auto b = parseSpecFile(broken);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code(), ErrorCode::kParse);
  EXPECT_EQ(b.error().message().rfind(broken + ": malformed JSON: parse error at line 1", 0), 0u)
      << b.error().message();
}

TEST_F(SpecFiles, MissingFileIsAnIoError) {
  std::string missing = (dir_ / "no_such_spec.json").string();
  auto s = parseSpecFile(missing);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIo);
  EXPECT_EQ(s.error().message(), "cannot read '" + missing + "': No such file or directory");
}

TEST_F(SpecFiles, ReadsAGoodFile) {
  std::string path =
      write("good.json", R"j({"mesh": {"shape": [4], "names": ["tp"]}, "device": "cpu"})j");
  auto s = parseSpecFile(path);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->mesh.toString(), "4(tp)");
  EXPECT_EQ(s->device, "cpu");
}

// --- CLI sharding files --------------------------------------------------------------------------

TEST(InShardings, ListForm) {
  auto s = parseInShardings(json::parse(R"j([["S(0)", "R"], null, ["R", "S(1)"]])j"), 2);
  ASSERT_TRUE(s.ok()) << s.error().message();
  ASSERT_EQ(s->by_position.size(), 3u);
  EXPECT_EQ(s->by_position[0], tuple("S(0),R"));
  EXPECT_EQ(s->by_position[1], std::nullopt);
  EXPECT_EQ(s->by_position[2], tuple("R,S(1)"));
  EXPECT_TRUE(s->by_name.empty());
  EXPECT_EQ(toJson(*s), json::parse(R"j([["S(0)", "R"], null, ["R", "S(1)"]])j"));
  auto empty = parseInShardings(json::array(), 2);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->by_position.empty());
}

TEST(InShardings, ObjectForm) {
  auto s = parseInShardings(json::parse(R"j({"x": ["S(0)"], "mask": null})j"), 1);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_TRUE(s->by_position.empty());
  EXPECT_EQ(s->by_name, (std::map<std::string, PlacementTuple>{{"x", tuple("S(0)")}}));
  EXPECT_EQ(toJson(*s), json::parse(R"j({"x": ["S(0)"]})j"));
}

TEST(InShardings, Errors) {
  struct Case {
    const char* doc;
    size_t ndim;
    const char* error;
  };
  for (const Case& c : {
           Case{R"j("S(0),R")j", 2,
                "$: expected a list with one placement list per input or an object by input "
                "name, got string \"S(0),R\""},
           Case{R"j([["S(0)", "R"], ["S(x)", "R"]])j", 2,
                "$[1][0]: unknown placement 'S(x)' (expected S(<dim>), R or P, like S(0), R, "
                "P(max))"},
           Case{R"j([["S(0)"]])j", 2,
                "$[0]: placement list S(0) has 1 entry but the mesh has 2 dims"},
           Case{R"j({"x": ["Q"]})j", 1,
                "$.x[0]: unknown placement 'Q' (expected S(<dim>), R or P, like S(0), R, P(max))"},
           Case{R"j({"x": "R"})j", 1,
                "$.x: expected a placement list like [\"S(0)\", \"R\"], got string \"R\""},
           Case{R"j([3])j", 1,
                "$[0]: expected a placement list like [\"S(0)\", \"R\"], got number 3"},
       }) {
    auto s = parseInShardings(json::parse(c.doc), c.ndim);
    ASSERT_FALSE(s.ok()) << c.doc;
    EXPECT_EQ(s.error().message(), c.error);
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  }
}

TEST_F(SpecFiles, ShardingFiles) {
  std::string in = write("in.json", R"j([["S(0)", "R"]])j");
  auto s = parseInShardingsFile(in, 2);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->by_position.at(0), tuple("S(0),R"));
  auto short_mesh = parseInShardingsFile(in, 1);
  ASSERT_FALSE(short_mesh.ok());
  EXPECT_EQ(short_mesh.error().message(),
            in + ": $[0]: placement list S(0)R has 2 entries but the mesh has 1 dim");
  std::string out = write("out.json", R"j({"logits": ["S(0)", "R"], "loss": null})j");
  auto t = parseOutShardingsFile(out, 2);
  ASSERT_TRUE(t.ok()) << t.error().message();
  EXPECT_EQ(toString(*t), "{logits: S(0)R, loss: *}");
  std::string bad = write("out_bad.json", R"j([["S(0)", "R"], ["S(0)", 1]])j");
  auto b = parseOutShardingsFile(bad, 2);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().message(),
            bad +
                ": $[1]: an array mixes placement strings with other values: a placement list "
                "holds only strings, a tuple of outputs only lists, objects and nulls");
  auto missing = parseOutShardingsFile((dir_ / "nope.json").string(), 2);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kIo);
}

// The one budget rule, as the spec reader, --memory-budget and the C++ API apply it.
TEST(MemoryBudget, OneRule) {
  EXPECT_FALSE(MemoryBudget{}.violation());
  EXPECT_FALSE((MemoryBudget{0.25, 0.25}).violation());
  auto low = MemoryBudget{-0.1, std::nullopt}.violation();
  ASSERT_TRUE(low);
  EXPECT_EQ(low->text(), "low: a budget fraction must be in [0, 1], got -0.1");
  auto high = MemoryBudget{0, 1.5}.violation();
  ASSERT_TRUE(high);
  EXPECT_EQ(high->text(), "high: a budget fraction must be in (0, 1], got 1.5");
  auto both = MemoryBudget{0.5, 0.25}.violation();
  ASSERT_TRUE(both);
  EXPECT_EQ(both->text(), "low 0.5 is greater than high 0.25");
  EXPECT_TRUE((MemoryBudget{std::nan(""), std::nullopt}).violation());
}

}  // namespace
}  // namespace apc::spec
