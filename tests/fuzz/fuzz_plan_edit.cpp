//===- tests/fuzz/fuzz_plan_edit.cpp - libFuzzer target: edited plans ------===//
//
// Issue 32: an edited plan (one output placement changed from P to R) passed apc validate and apc
// lower. Byte mutations of a plan file rarely get past the JSON syntax and the content hash, so
// this target edits a valid plan that carries its graph (APC_FUZZ_PLAN_BASE, toy_block on 2x2)
// structurally: the input is a list of 4-byte edits [what, a, b, c] (a node's strategy index,
// one of its output or input placements, its kind, op or name, its num_strategies, a
// parameter's placement, a mesh dim, a node removed or two swapped). The edited plan's content
// hash is recomputed (the reader names it), so every edit reaches what apc lower does: the reader,
// plannedGraph, verifyPlan, then the programs of rank 0 and of the last rank. Errors are fine
// (one line each); a crash, a sanitizer report, an uncaught exception, a hang or an internal
// error of lowering a plan verifyPlan accepted is a finding.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>

#include "apc/lower/lower.h"
#include "apc/plan/plan.h"
#include "apc/planner/pipeline.h"
#include "apc/planner/verify.h"
#include "apc/spec/spec.h"
#include "apc/support/json_reader.h"

namespace {

const nlohmann::json& basePlan() {
  static const nlohmann::json base = [] {
    std::ifstream in(APC_FUZZ_PLAN_BASE, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto j = apc::parseJsonText(text);
    if (!j.ok()) {
      std::fprintf(stderr, "fuzz_plan_edit: cannot read %s\n", APC_FUZZ_PLAN_BASE);
      std::abort();
    }
    return *j;
  }();
  return base;
}

const char* const kPlacements[] = {"R",    "P",     "S(0)",  "S(1)", "S(2)",
                                   "S(3)", "S(-1)", "S(99)", "",     "Q"};
constexpr size_t kNumPlacements = sizeof kPlacements / sizeof kPlacements[0];
const char* const kKinds[] = {"op", "input", "parameter", "buffer", "output", "x"};
const char* const kOps[] = {"aten::linear", "aten::relu", "aten::gelu", "aten::add",
                            "aten::view",   "input",      "parameter",  "aten::nope"};

/// `list[i % size]` of a JSON array, or null when it is not a non-empty array.
nlohmann::json* pick(nlohmann::json& list, uint8_t i) {
  if (!list.is_array() || list.empty()) return nullptr;
  return &list[i % list.size()];
}

void applyEdit(nlohmann::json& plan, const uint8_t* e) {
  nlohmann::json& nodes = plan["nodes"];
  nlohmann::json* node = pick(nodes, e[1]);
  if (!node || !node->is_object()) return;
  const uint8_t b = e[2], c = e[3];
  switch (e[0] % 12) {
    case 0: {  // another strategy (sometimes one past the end)
      int64_t n = (*node)["num_strategies"].is_number_integer()
                      ? (*node)["num_strategies"].get<int64_t>()
                      : 1;
      n = std::clamp<int64_t>(n, 0, 1 << 20);  // an earlier edit may have made it -1
      (*node)["strategy_index"] = static_cast<int64_t>(b) % (n + 1);
      break;
    }
    case 1:  // one output placement
      if (nlohmann::json* p = pick((*node)["output_placements"], b))
        *p = kPlacements[c % kNumPlacements];
      break;
    case 2:  // one placement of one input
      if (nlohmann::json* in = pick((*node)["input_placements"], b); in && in->is_array())
        if (nlohmann::json* p = pick(*in, c >> 4)) *p = kPlacements[c % kNumPlacements];
      break;
    case 3:  // the output placement list grows or shrinks
      if ((*node)["output_placements"].is_array()) {
        if (b % 2)
          (*node)["output_placements"].push_back(kPlacements[c % kNumPlacements]);
        else if (!(*node)["output_placements"].empty())
          (*node)["output_placements"].erase((*node)["output_placements"].size() - 1);
      }
      break;
    case 4:  // kind
      (*node)["kind"] = kKinds[b % 6];
      break;
    case 5:  // op
      (*node)["op"] = kOps[b % 8];
      break;
    case 6:  // num_strategies
      (*node)["num_strategies"] = static_cast<int64_t>(b) - 1;
      break;
    case 7:  // a parameter's placement
      if (nlohmann::json* param = pick(plan["parameters"], b); param && param->is_object())
        if (nlohmann::json* p = pick((*param)["placement"], c >> 4))
          *p = kPlacements[c % kNumPlacements];
      break;
    case 8: {  // a mesh dim (kept small: lowering runs two ranks, but builds per-rank state)
      nlohmann::json& shape = plan["spec"]["mesh"]["shape"];
      if (nlohmann::json* d = pick(shape, b)) *d = static_cast<int64_t>(c % 5);
      break;
    }
    case 9:  // a node removed
      nodes.erase(static_cast<size_t>(e[1] % nodes.size()));
      break;
    case 10:  // two nodes swapped
      std::swap(*node, nodes[static_cast<size_t>(b % nodes.size())]);
      break;
    case 11:  // graph_node or an in-edge's source
      if (c % 2)
        (*node)["graph_node"] = static_cast<int64_t>(b) - 2;
      else if (nlohmann::json* edge = pick((*node)["in_edges"], b); edge && edge->is_object())
        (*edge)["from"] = static_cast<int64_t>(c / 2) - 1;
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = basePlan();
  for (size_t at = 0; at + 4 <= size && at < 4 * 16; at += 4) applyEdit(j, data + at);
  auto p = apc::plan::planFromJson(j);
  // The edit changed the content: read it again with the hash the reader names.
  const std::string_view changed = "$.content_hash: the plan's content hashes to ";
  if (!p.ok() && p.error().message().rfind(changed, 0) == 0) {
    j["content_hash"] = p.error().message().substr(changed.size(), 64);
    p = apc::plan::planFromJson(j);
  }
  if (!p.ok() || p->graph_bytes.empty()) return 0;
  auto g = apc::plan::plannedGraph(*p);
  if (!g.ok()) return 0;
  if (!apc::plan::verifyPlan(*g, *p).ok()) return 0;
  // A verified plan lowers, or fails with a one-line error that is not an internal one.
  const int64_t world = p->spec.mesh.worldSize();
  for (int64_t rank : {int64_t{0}, world - 1}) {
    auto program = apc::lower::lowerRank(*g, *p, rank);
    if (!program.ok() && program.error().code() == apc::ErrorCode::kInternal) {
      std::fprintf(stderr, "fuzz_plan_edit: a verified plan failed to lower: %s\n",
                   program.error().message().c_str());
      std::abort();
    }
  }
  return 0;
}
