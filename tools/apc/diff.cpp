//===- tools/apc/diff.cpp - `apc diff` -------------------------------------===//
//
// Compares two plans (lib/plan/diff.h): nodes whose placements differ with the cost delta of each
// and in total, parameters whose placement differs, and the parameter memory of each plan.
// Exit code 0 whether or not they differ (2 for unreadable plans).
//
//===----------------------------------------------------------------------===//
#include <memory>
#include <string>

#include "apc/plan/diff.h"
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
  return 0;
}

}  // namespace

Runner addDiffCommand(CLI::App& app) {
  auto f = std::make_shared<DiffFlags>();
  app.add_option("a", f->a, "First plan JSON")->required();
  app.add_option("b", f->b, "Second plan JSON")->required();
  app.add_option("--format", f->format, "text or json");
  return [f]() { return runDiff(*f); };
}

}  // namespace apc::tool
