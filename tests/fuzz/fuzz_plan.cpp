//===- tests/fuzz/fuzz_plan.cpp - libFuzzer target: the plan reader ---------===//
//
// Any bytes as a plan file (one refused for its content hash alone is read again with the hash of
// its content), then what `apc explain` and `apc diff` do with a plan they could read: the
// costliest nodes (text, JSON), the Graphviz graph, node and module lookup, the diff of the plan
// with itself (which must be empty of node changes) and, for a plan that carries its graph, the
// problem rebuilt from that graph and one node's alternatives (apc explain --node).
//
//===----------------------------------------------------------------------===//
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "apc/plan/plan.h"
#include "apc/planner/pipeline.h"
#include "apc/report/diff.h"
#include "apc/report/explain.h"
#include "apc/spec/spec.h"
#include "apc/support/json_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto j = apc::parseJsonText(text);
  if (!j.ok()) return 0;
  auto p = apc::plan::planFromJson(*j);
  // An edited plan is refused by its content hash (checked last). So that mutated plans still
  // reach what explain and diff do, a plan refused for its hash alone is read again with the hash
  // of its content, which the reader's message names.
  const std::string_view changed = "$.content_hash: the plan's content hashes to ";
  if (!p.ok() && p.error().message().rfind(changed, 0) == 0 && j->is_object()) {
    (*j)["content_hash"] = p.error().message().substr(changed.size(), 64);
    p = apc::plan::planFromJson(*j);
  }
  if (!p.ok()) return 0;
  (void)apc::plan::topNodesText(*p, 20);
  (void)apc::plan::explainJson(*p, 20, nullptr);
  (void)apc::plan::dotGraph(*p);
  if (!p->nodes.empty()) {
    (void)apc::plan::findNode(*p, p->nodes.front().name);
    (void)apc::plan::findModuleNode(*p, p->nodes.front().module_path);
  }
  apc::plan::PlanDiff d = apc::plan::diffPlans(*p, *p);
  (void)apc::plan::diffText(d);
  (void)apc::plan::toJson(d);
  (void)apc::plan::toJsonText(*p);
  if (p->graph_bytes.empty() || p->nodes.empty()) return 0;
  auto g = apc::plan::plannedGraph(*p);
  if (!g.ok()) return 0;
  auto built = apc::plan::rebuildProblem(*g, *p);
  if (!built.ok()) return 0;
  (void)apc::plan::explainNode(*p, built->gp, 0, &*g);
  return 0;
}
