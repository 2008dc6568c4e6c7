//===- tools/apc/diff.cpp - `apc diff` -------------------------------------===//
//
// Compares two plans (apc/report/diff.h): nodes whose placements differ with the cost delta of each
// and in total, parameters whose placement differs, and the parameter memory of each plan.
// Exit codes follow `git diff --exit-code`: 0 when no node or parameter placement differs, 1 when
// one does (cost-only changes are 0), 2 for unreadable plans or bad flags.
//
//===----------------------------------------------------------------------===//
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apc/report/diff.h"
#include "commands.h"

namespace apc::tool {

namespace {

struct DiffFlags {
  std::string a, b;
  std::string format = "text";
};

int runDiff(const DiffFlags& f) {
  if (f.format != "text" && f.format != "json")
    return report(invalidArgument("--format: expected text or json, got '" + f.format + "'"));
  auto a = plan::readPlanFile(f.a);
  if (!a.ok()) return report(a.error());
  auto b = plan::readPlanFile(f.b);
  if (!b.ok()) return report(b.error());
  plan::PlanDiff d = plan::diffPlans(*a, *b);
  if (f.format == "json")
    std::cout << plan::canonicalText(plan::toJson(d));
  else
    std::cout << plan::diffText(d);
  return d.empty() ? 0 : 1;
}

}  // namespace

Runner addDiffCommand(CLI::App& app) {
  auto f = std::make_shared<DiffFlags>();
  app.add_option("a", f->a, "First plan JSON")->required()->check(nonEmptyPath());
  app.add_option("b", f->b, "Second plan JSON")->required()->check(nonEmptyPath());
  app.add_option("--format", f->format, "text or json");
  app.footer(
      "Exit status (as git diff --exit-code): 0 when the placements are equal, 1 when a node's or "
      "a parameter's placement differs, 2 when a plan cannot be read.");
  return [f]() { return runDiff(*f); };
}

}  // namespace apc::tool
