//===- tests/plan/notation_test.cpp - One placement notation in every printer ===//
//
// Issue 35: every printer of a plan (the summary, the optimizer log, explain's tables, diff, the
// dot graph, the SVG and HTML pictures) writes a tensor's placement as its mesh-dim placements
// concatenated (`S(0)R`), and an op's strategy as the plan JSON's strategy string does
// (`S(0)R,RS(1) -> S(0)S(1)`). On a 2-d mesh every placement in any printer's text must then have
// exactly two entries; the other notation (`S(0),R`) shows as runs of one entry and fails.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "apc/report/diff.h"
#include "apc/report/explain.h"
#include "apc/report/report.h"
#include "apc/support/strings.h"
#include "plan_fixtures.h"

namespace apc::plan {
namespace {

using mesh::Placement;
using mesh::PlacementTuple;

/// Every placement written in `text` whose number of mesh-dim entries is not `ndim`, with a little
/// context: a placement is a maximal run of S(<d>), P(<op>), P and R standing as a word of its own
/// (not inside a longer name; dot's "\\n" separates). The one exception is what one mesh dim
/// holds, which the redistribution messages write "mesh dim 1: a R value ...", and a legend's
/// definition of one mark ("R: replicated").
std::vector<std::string> notationViolations(const std::string& raw, size_t ndim) {
  std::string text = raw;
  for (size_t at = text.find("\\n"); at != std::string::npos; at = text.find("\\n", at))
    text.replace(at, 2, " ");
  static const std::regex run(
      "(^|[^A-Za-z0-9_.)])((?:S\\(\\d+\\)|P\\((?:sum|max|min|avg)\\)|P|R)+)(?=[^A-Za-z0-9_(]|$)");
  static const std::regex entry("S\\(\\d+\\)|P\\((?:sum|max|min|avg)\\)|P|R");
  std::vector<std::string> bad;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), run); it != std::sregex_iterator();
       ++it) {
    const std::string placement = (*it)[2].str();
    const auto n = std::distance(std::sregex_iterator(placement.begin(), placement.end(), entry),
                                 std::sregex_iterator());
    const size_t at = static_cast<size_t>(it->position(2));
    const bool one_mesh_dim = n == 1 && at >= 2 && text.compare(at - 2, 2, "a ") == 0 &&
                              text.compare(at + placement.size(), 6, " value") == 0;
    // A legend's definition of one mark: "R: replicated".
    const bool defined = n == 1 && text.compare(at + placement.size(), 2, ": ") == 0;
    if (static_cast<size_t>(n) != ndim && !one_mesh_dim && !defined) {
      const size_t from = at > 30 ? at - 30 : 0;
      bad.push_back("'" + placement + "' in ..." + text.substr(from, 70) + "...");
    }
  }
  return bad;
}

TEST(Notation, TheCheckerCatchesTheOtherNotation) {
  // What the test below relies on: the old summary form and the list form are caught, the
  // notation itself and prose are not.
  EXPECT_EQ(notationViolations("up.weight f32 [64,16] S(0),S(1) 1 KiB/rank", 2).size(), 2u);
  EXPECT_EQ(notationViolations("placement=(S(0)R, RS(1)) -> [S(0), R]", 2).size(), 2u);
  EXPECT_TRUE(notationViolations("placement=S(0)R,RS(1) -> S(0)S(1) PR P(max)R RR", 2).empty());
  EXPECT_TRUE(notationViolations("Replicate Partial RELU S(d) SP RPC, AR, RS, A2A", 2).empty());
  EXPECT_TRUE(notationViolations("mesh dim 1: a R value cannot become partial", 2).empty());
  EXPECT_EQ(notationViolations("label=\"%x\\nS(0),R\"", 2).size(), 2u);  // dot's line break
}

TEST(Notation, TuplesAndStrategiesPrintOneWayAndParseBack) {
  const PlacementTuple t = {Placement::shard(0), Placement::partial(mesh::ReduceOp::kMax),
                            Placement::replicate(), Placement::partial()};
  EXPECT_EQ(mesh::toCompactString(t), "S(0)P(max)RP");
  for (const char* text : {"S(0)P(max)RP", "S(0),P(max),R,P", "[S(0), P(max), R, P]"}) {
    auto back = mesh::parsePlacementTuple(text);
    ASSERT_TRUE(back.ok()) << text << ": " << back.error().message();
    EXPECT_EQ(*back, t) << text;
  }
  auto both = mesh::parsePlacementTuple("S(0)R,RS(1)");  // two pieces, each of two entries
  ASSERT_TRUE(both.ok()) << both.error().message();
  EXPECT_EQ(both->size(), 4u);
  EXPECT_FALSE(mesh::parsePlacementTuple("S(0)X").ok());
  EXPECT_FALSE(mesh::parsePlacementTuple("S(0").ok());
  strategy::Strategy s;
  s.inputs = {PlacementTuple{Placement::shard(0), Placement::replicate()}, std::nullopt,
              PlacementTuple{Placement::replicate(), Placement::shard(1)}};
  s.outputs = {PlacementTuple{Placement::shard(0), Placement::shard(1)}};
  EXPECT_EQ(s.toString(), "S(0)R,RS(1) -> S(0)S(1)");
  EXPECT_EQ(mesh::toSignatureString(s.inputs, s.outputs), s.toString());
}

TEST(Notation, EveryPrinterWritesOnePlacementPerTensorOnA2dMesh) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  spec::Spec fsdp = testing::toySpec2x4();
  spec::Spec ddp = testing::toySpec2x4();
  ddp.memory_budget.high = 1.0;
  testing::Planned a = testing::planOf(g, fsdp);
  testing::Planned b = testing::planOf(g, ddp);
  const Plan& p = a.result.plan;
  ASSERT_FALSE(p.nodes.empty());
  ASSERT_FALSE(p.parameters.empty());

  // The plan's strategy strings are the notation for strategies.
  for (const PlanNode& n : p.nodes)
    EXPECT_EQ(n.strategy, trim(mesh::toSignatureString(n.input_placements, n.outputs))) << n.name;

  std::vector<std::pair<std::string, std::string>> printed = {
      {"summary", summaryText(p, nullptr)},
      {"optimizer log", optimizerLog(p)},
      {"top nodes", topNodesText(p, 100)},
      {"top modules", topModulesText(p, 100)},
      {"diff", diffText(diffPlans(a.result.plan, b.result.plan))},
      {"dot", dotGraph(p)},
      {"svg", svgPicture(p)},
      {"html", htmlPicture(p)},
  };
  for (uint32_t v = 0; v < p.nodes.size(); ++v) {
    auto e = explainNode(p, a.built.gp, v, &g);
    ASSERT_TRUE(e.ok()) << e.error().message();
    printed.emplace_back("explain " + p.nodes[v].name, explanationText(p, *e));
  }
  for (const auto& [printer, text] : printed) {
    ASSERT_FALSE(text.empty()) << printer;
    for (const std::string& bad : notationViolations(text, 2))
      ADD_FAILURE() << printer << ": " << bad;
  }
  // The summary's parameter lines and inputs line, and the log's strategy, in the notation.
  const std::string summary = summaryText(p, nullptr);
  EXPECT_NE(summary.find(" S(0)R\n"), std::string::npos) << summary;  // x's input placement
  EXPECT_NE(optimizerLog(p).find("placement=" + p.nodes.back().strategy + "  cost="),
            std::string::npos)
      << optimizerLog(p);
}

}  // namespace
}  // namespace apc::plan
