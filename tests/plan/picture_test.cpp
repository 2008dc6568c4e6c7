//===- tests/plan/picture_test.cpp - dot / SVG / HTML pictures -------------===//
//
// Issue 35, item 5: a placement has one colour in every plan and every picture (a function of
// its text, not of the other placements of the plan); the legend explains every mark; collective
// labels are wrapped, never clipped; modules come in model order; a run of repeated layers placed
// alike is one drawn layer and one collapsed box that counts the rest, and the cost chart has one
// row for a run of layers of equal cost.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <set>
#include <vector>

#include <map>
#include <regex>
#include <string>

#include "apc/report/explain.h"
#include "plan_fixtures.h"

namespace apc::plan {
namespace {

using mesh::Placement;
using mesh::PlacementTuple;

/// dot's legend: placement -> fill colour.
std::map<std::string, std::string> dotLegend(const std::string& dot) {
  static const std::regex entry("legend\\d+ \\[label=\"([^\"]*)\", fillcolor=\"(#[0-9a-f]{6})\"");
  std::map<std::string, std::string> out;
  for (auto it = std::sregex_iterator(dot.begin(), dot.end(), entry); it != std::sregex_iterator();
       ++it)
    out[(*it)[1].str()] = (*it)[2].str();
  return out;
}

TEST(Picture, APlacementHasOneColourInEveryPlan) {
  // Two plans with different sets of placements (the default budget shards the weights, high = 1
  // replicates them): the placements both draw have the same colour in both.
  ir::Graph g = ir::testing_graphs::toyBlock(512);
  spec::Spec fsdp = testing::toySpec8();
  spec::Spec ddp = testing::toySpec8();
  ddp.memory_budget.high = 1.0;
  auto a = dotLegend(dotGraph(testing::planOf(g, fsdp).result.plan));
  auto b = dotLegend(dotGraph(testing::planOf(g, ddp).result.plan));
  ASSERT_NE(a, b);  // the legends differ: the check below is not vacuous
  size_t shared = 0;
  for (const auto& [placement, colour] : a) {
    EXPECT_EQ(colour, placementColour(placement)) << placement;
    if (auto it = b.find(placement); it != b.end()) {
      ++shared;
      EXPECT_EQ(it->second, colour) << placement;
    }
  }
  EXPECT_GT(shared, 0u);
  for (const auto& [placement, colour] : b) EXPECT_EQ(colour, placementColour(placement));
  // Replicated grey, none white; every other placement of a 2-d mesh (tensor dims 0-3, partial
  // sums) has a colour of its own, and so has every 1-d one.
  EXPECT_EQ(placementColour("RR"), "#d9d9d9");
  EXPECT_EQ(placementColour("-"), "#ffffff");
  const std::vector<std::string> entries = {"R", "S(0)", "S(1)", "S(2)", "S(3)", "P"};
  std::map<std::string, std::string> owner;  // colour -> the placement that has it
  for (const std::string& a : entries)
    for (const std::string& b : entries) {
      if (a == "R" && b == "R") continue;
      const std::string colour = placementColour(a + b);
      auto [it, fresh] = owner.emplace(colour, a + b);
      EXPECT_TRUE(fresh) << a + b << " and " << it->second << " share " << colour;
      EXPECT_NE(colour, "#d9d9d9") << a + b;
    }
  EXPECT_EQ(owner.size(), 35u);
  EXPECT_EQ(placementColour("P(max)R"), placementColour("PR"));  // a partial sum or maximum
  std::set<std::string> one_d;
  for (const std::string& a : entries)
    if (a != "R") one_d.insert(placementColour(a));
  EXPECT_EQ(one_d.size(), entries.size() - 1);
}

/// A hand-made plan: `layers` repeated layers of one linear each (placed alike), then a head.
Plan layeredPlan(int layers, bool alike = true) {
  Plan p;
  p.spec = testing::specFor({2, 4}, {"dp", "tp"});
  p.model.model_name = "stack";
  for (int i = 0; i < layers; ++i) {
    PlanNode n;
    n.name = "linear_" + std::to_string(i);
    n.kind = "op";
    n.op = "aten::linear";
    n.module_path = "layers." + std::to_string(i) + ".lin";
    const PlacementTuple out = {Placement::shard(0),
                                (alike || i != 2) ? Placement::shard(1) : Placement::replicate()};
    n.outputs = {out};
    n.input_placements = {out};
    n.strategy = mesh::toCompactString(out) + " -> " + mesh::toCompactString(out);
    n.compute_us = 10;
    n.cost_us = 10;
    p.nodes.push_back(n);
  }
  PlanNode head;
  head.name = "head";
  head.kind = "op";
  head.op = "aten::linear";
  head.module_path = "head";
  head.outputs = {PlacementTuple{Placement::replicate(), Placement::replicate()}};
  head.strategy = "RR -> RR";
  p.nodes.push_back(head);
  return p;
}

TEST(Picture, RepeatedLayersPlacedAlikeAreOneLayerAndACountInTheSvg) {
  const std::string svg = svgPicture(layeredPlan(12));
  EXPECT_NE(svg.find("layers.1-11: 11 more layers placed like layers.0 (collapsed)"),
            std::string::npos)
      << svg;
  EXPECT_NE(svg.find(">%linear_0<"), std::string::npos);
  EXPECT_EQ(svg.find(">%linear_5<"), std::string::npos);  // not drawn: counted in the box
  // The cost chart: layers of equal cost are one row, not twelve.
  EXPECT_NE(svg.find(">layers.0-11 (12 alike, each)<"), std::string::npos) << svg;
  EXPECT_EQ(svg.find(">layers.5<"), std::string::npos);
  // A layer placed otherwise breaks the run: layers.0-1 alike, 2 alone, 3-11 alike.
  const std::string broken = svgPicture(layeredPlan(12, false));
  EXPECT_NE(broken.find("layers.1-1: 1 more layers placed like layers.0"), std::string::npos)
      << broken;
  EXPECT_NE(broken.find(">%linear_2<"), std::string::npos);
  EXPECT_NE(broken.find("layers.4-11: 8 more layers placed like layers.3"), std::string::npos)
      << broken;
}

TEST(Picture, ModulesInModelOrderInDot) {
  const std::string dot = dotGraph(layeredPlan(12));
  const size_t two = dot.find("label=\"layers.2\""), ten = dot.find("label=\"layers.10\"");
  ASSERT_NE(two, std::string::npos);
  ASSERT_NE(ten, std::string::npos);
  EXPECT_LT(two, ten);  // model order, not text order
  EXPECT_LT(dot.find("label=\"layers\""), dot.find("label=\"head\""));
}

TEST(Picture, TheLegendExplainsEveryMarkAndCollectivesAreNotClipped) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto planned = testing::planOf(g, testing::toySpec2x4());
  const Plan& p = planned.result.plan;
  PictureOptions o;
  const PlanNode& linear = p.nodes[3];
  ASSERT_TRUE(linear.graph_node.has_value());
  const std::string label =
      "AG(dp) 1.00 MiB + AG(tp) 4.00 MiB\nbwd RS(dp) 1.00 MiB + RS(tp) 4.00 MiB\n33.476 us";
  o.edge_labels[{*linear.graph_node, 0}] = label;
  for (const std::string& picture : {svgPicture(p, o), htmlPicture(p, o)}) {
    for (const char* mark : {"AG all-gather", "AR all-reduce", "RS reduce-scatter",
                             "A2A all-to-all", "S(d): tensor dim d", "R: replicated", "P: partial"})
      EXPECT_NE(picture.find(mark), std::string::npos) << mark;
    // Every word of the label is drawn (wrapped over lines, none cut with '~').
    for (const char* word : {"AG(tp)", "4.00", "RS(tp)", "33.476"})
      EXPECT_NE(picture.find(word), std::string::npos) << word;
    EXPECT_EQ(picture.find("MiB~"), std::string::npos);
  }
  std::string dot = dotGraph(p);
  for (const char* mark : {"AG all-gather", "A2A all-to-all", "R: replicated"})
    EXPECT_NE(dot.find(mark), std::string::npos) << mark;
}

}  // namespace
}  // namespace apc::plan
