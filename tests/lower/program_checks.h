//===- tests/lower/program_checks.h - Well-formedness of lowered programs --===//
//
// Torch-free checks of the programs lowerPlan writes for a graph and its plan (used by lower_test
// on hand-built graphs and by lower_exec_test on the sample models):
//   - every placed tensor (input, parameter, buffer, output) has this rank's localPiece, and its
//     program value has the piece's sizes;
//   - every redistribution's forward steps chain from `from` to `to` (and the backward steps from
//     `grad_from` to `grad_to`), each step's local_in is the previous local_out, and its node's
//     input and output values have the first local_in and the last local_out;
//   - every op node's tensor inputs have the local shape of the placement its strategy requires,
//     and when the producer's placement differs, the input comes from a redistribute node whose
//     `to` is that placement;
//   - no output is Partial;
//   - the pieces of every parameter over all ranks tile the global tensor exactly.
// Each check adds a gtest failure naming the rank and the node or tensor.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "apc.pb.h"
#include "apc/artifact/typed_proto.h"
#include "apc/ir/graph.h"
#include "apc/layout/layout.h"
#include "apc/lower/lower.h"
#include "apc/plan/plan.h"

namespace apc::lower::testing {

inline std::vector<int64_t> valueShape(const proto::Program& p, uint32_t v) {
  std::vector<int64_t> s;
  for (const proto::Dim& d : p.graph().values(static_cast<int>(v)).tensor().shape())
    s.push_back(d.size());
  return s;
}

/// The typed tuple of a program's placement field (it must be valid).
inline mesh::PlacementTuple tupleOf(const artifact::PlacementField& t) {
  auto p = artifact::placementFromProto(t);
  EXPECT_TRUE(p.ok()) << p.error().message();
  return p.ok() ? *p : mesh::PlacementTuple{};
}

inline std::vector<int64_t> sizesOf(const google::protobuf::RepeatedField<int64_t>& f) {
  return {f.begin(), f.end()};
}

/// Steps chain from `from` to `to` with consistent local shapes; returns the failure or "".
inline std::string checkChain(const google::protobuf::RepeatedPtrField<proto::RedistStep>& steps,
                              const artifact::PlacementField& from,
                              const artifact::PlacementField& to) {
  mesh::PlacementTuple cur = tupleOf(from);
  std::vector<int64_t> local;
  for (int i = 0; i < steps.size(); ++i) {
    const proto::RedistStep& s = steps[i];
    if (tupleOf(s.before()) != cur)
      return "step " + std::to_string(i) + " does not start where the previous ended";
    if (i > 0 && sizesOf(s.local_in()) != local)
      return "step " + std::to_string(i) + " local_in differs from the previous local_out";
    cur = tupleOf(s.after());
    local = sizesOf(s.local_out());
  }
  if (cur != tupleOf(to)) return "steps do not end at `to`";
  return "";
}

inline void checkPlacedTensor(const proto::Program& prog, const proto::ProgramTensor& t,
                              const mesh::DeviceMesh& mesh, const std::string& what) {
  std::vector<int64_t> global;
  for (const proto::Dim& d : t.global_shape()) global.push_back(d.size());
  std::vector<int64_t> coord(prog.coordinate().begin(), prog.coordinate().end());
  auto pieces = layout::localPiece(global, tupleOf(t.placement()), mesh, coord);
  ASSERT_EQ(static_cast<size_t>(t.local_size()), pieces.size()) << what;
  std::vector<int64_t> sizes;
  for (size_t d = 0; d < pieces.size(); ++d) {
    EXPECT_EQ(t.local(static_cast<int>(d)).offset(), pieces[d].offset) << what << " dim " << d;
    EXPECT_EQ(t.local(static_cast<int>(d)).size(), pieces[d].size) << what << " dim " << d;
    sizes.push_back(pieces[d].size);
  }
  EXPECT_EQ(valueShape(prog, t.value()), sizes) << what << ": program value shape";
}

/// All checks of the file comment over the programs of every rank.
inline void checkPrograms(const ir::Graph& g, const plan::Plan& p,
                          const std::vector<proto::Program>& programs) {
  const mesh::DeviceMesh& mesh = p.spec.mesh;
  ASSERT_EQ(static_cast<int64_t>(programs.size()), mesh.worldSize());
  std::map<uint32_t, const plan::PlanNode*> plan_of;
  for (const plan::PlanNode& n : p.nodes)
    if (n.graph_node) plan_of[*n.graph_node] = &n;
  // parameter name -> distinct boxes (offset, size per dim)
  std::map<std::string, std::set<std::vector<std::pair<int64_t, int64_t>>>> boxes;
  std::map<std::string, int64_t> numel;
  for (const proto::Program& prog : programs) {
    const std::string rk = "rank " + std::to_string(prog.rank());
    ASSERT_EQ(prog.format_version(), artifact::kProgramFormatVersion);
    const proto::Graph& pg = prog.graph();
    ASSERT_EQ(prog.node_redistribution_size(), pg.nodes_size()) << rk;
    ASSERT_EQ(prog.source_node_size(), pg.nodes_size()) << rk;
    for (const auto& t : prog.inputs()) checkPlacedTensor(prog, t, mesh, rk + " input " + t.name());
    for (const auto& t : prog.buffers())
      checkPlacedTensor(prog, t, mesh, rk + " buffer " + t.name());
    for (const auto& t : prog.parameters()) {
      checkPlacedTensor(prog, t, mesh, rk + " parameter " + t.name());
      std::vector<std::pair<int64_t, int64_t>> box;
      int64_t n = 1;
      for (int d = 0; d < t.local_size(); ++d) {
        box.emplace_back(t.local(d).offset(), t.local(d).size());
        n *= t.global_shape(d).size();
      }
      boxes[t.name()].insert(box);
      numel[t.name()] = n;
    }
    for (const auto& t : prog.outputs()) {
      if (t.placement_size() == 0) continue;
      checkPlacedTensor(prog, t, mesh, rk + " output " + t.name());
      for (const mesh::Placement& s : tupleOf(t.placement()))
        EXPECT_FALSE(s.isPartial()) << rk << " output " << t.name();
    }
    // producer of each program value
    std::vector<int> producer(static_cast<size_t>(pg.values_size()), -1);
    for (int i = 0; i < pg.nodes_size(); ++i)
      for (uint32_t o : pg.nodes(i).outputs()) producer[o] = i;
    for (int i = 0; i < pg.nodes_size(); ++i) {
      const proto::Node& node = pg.nodes(i);
      uint32_t r = prog.node_redistribution(i);
      if (node.kind() == "redistribute") {
        ASSERT_GT(r, 0u) << rk << " node " << i;
        const proto::Redistribution& red = prog.redistributions(static_cast<int>(r - 1));
        EXPECT_EQ(checkChain(red.forward(), red.from(), red.to()), "") << rk << " " << red.edge();
        if (red.requires_grad()) {
          EXPECT_EQ(checkChain(red.backward(), red.grad_from(), red.grad_to()), "")
              << rk << " " << red.edge() << " (backward)";
        }
        EXPECT_NE(red.forward_size() + red.backward_size(), 0) << rk << " " << red.edge();
        ASSERT_EQ(node.inputs_size(), 1);
        ASSERT_EQ(node.outputs_size(), 1);
        if (red.forward_size() > 0) {
          EXPECT_EQ(valueShape(prog, node.inputs(0)), sizesOf(red.forward(0).local_in()))
              << rk << " " << red.edge();
          EXPECT_EQ(valueShape(prog, node.outputs(0)),
                    sizesOf(red.forward(red.forward_size() - 1).local_out()))
              << rk << " " << red.edge();
        } else {
          EXPECT_EQ(valueShape(prog, node.inputs(0)), valueShape(prog, node.outputs(0)));
        }
        continue;
      }
      EXPECT_EQ(r, 0u);
      int32_t src = prog.source_node(i);
      if (src < 0) {  // only the output casts of mixed precision have no graph node
        EXPECT_EQ(node.op(), "aten::to") << rk << " node " << i;
        continue;
      }
      auto it = plan_of.find(static_cast<uint32_t>(src));
      if (it == plan_of.end() || node.kind() != "op") continue;
      const plan::PlanNode& pn = *it->second;
      const ir::Node& gn = g.node(ir::NodeId(static_cast<uint32_t>(src)));
      if (static_cast<size_t>(node.inputs_size()) != gn.inputs.size()) continue;  // arange.start
      std::vector<int64_t> coord(prog.coordinate().begin(), prog.coordinate().end());
      for (size_t k = 0; k < gn.inputs.size(); ++k) {
        const ir::Value& gv = g.value(gn.inputs[k]);
        if (!gv.isTensor() || !gv.tensor || !pn.input_placements[k] || !gv.producer.valid())
          continue;
        const mesh::PlacementTuple& want = *pn.input_placements[k];
        std::vector<int64_t> sizes;
        for (const auto& d : layout::localPiece(ir::hintSizes(gv.tensor->shape), want, mesh, coord))
          sizes.push_back(d.size);
        uint32_t lv = node.inputs(static_cast<int>(k));
        std::string where = rk + " " + gn.qualifiedOp() + " #" + std::to_string(src) + " input " +
                            std::to_string(k);
        EXPECT_EQ(valueShape(prog, lv), sizes) << where;
        auto pit = plan_of.find(gv.producer.v);
        if (pit == plan_of.end()) continue;
        const auto& src_t = pit->second->outputs.at(gv.producer_output);
        if (!src_t) continue;
        const mesh::PlacementTuple& have = *src_t;
        if (have == want) continue;
        // A mesh dim of one rank holds the whole tensor under any placement: nothing to move.
        auto onManyRanks = [&](mesh::PlacementTuple t) {
          for (size_t d = 0; d < t.size(); ++d)
            if (mesh.size(d) == 1) t[d] = mesh::Placement::replicate();
          return t;
        };
        if (onManyRanks(have) == onManyRanks(want)) continue;
        int prod = producer[lv];
        ASSERT_GE(prod, 0) << where;
        ASSERT_EQ(pg.nodes(prod).kind(), "redistribute")
            << where << ": placements differ (" << mesh::toString(have) << " -> "
            << mesh::toString(want) << ") without a redistribute node";
        const proto::Redistribution& red =
            prog.redistributions(static_cast<int>(prog.node_redistribution(prod) - 1));
        EXPECT_EQ(tupleOf(red.to()), onManyRanks(want)) << where;
        EXPECT_EQ(tupleOf(red.from()), onManyRanks(have)) << where;
      }
    }
  }
  for (const auto& [name, set] : boxes) {
    // Distinct boxes must be pairwise disjoint and their volumes sum to the whole tensor.
    int64_t volume = 0;
    std::vector<std::vector<std::pair<int64_t, int64_t>>> list(set.begin(), set.end());
    for (size_t a = 0; a < list.size(); ++a) {
      int64_t v = 1;
      for (const auto& [off, size] : list[a]) v *= size;
      volume += v;
      for (size_t b = a + 1; b < list.size(); ++b) {
        bool overlap = v > 0;
        for (size_t d = 0; d < list[a].size(); ++d) {
          auto [o1, s1] = list[a][d];
          auto [o2, s2] = list[b][d];
          overlap = overlap && s2 > 0 && o1 < o2 + s2 && o2 < o1 + s1;
        }
        EXPECT_FALSE(overlap) << "parameter " << name << ": pieces overlap";
      }
    }
    EXPECT_EQ(volume, numel[name]) << "parameter " << name << ": pieces do not tile it";
  }
}

}  // namespace apc::lower::testing
