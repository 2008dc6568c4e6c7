//===- lib/report/comm.cpp - The collectives of a plan, as lowered ---------===//
#include "apc/report/comm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "apc.pb.h"
#include "apc/artifact/typed_proto.h"
#include "apc/lower/lower.h"
#include "apc/report/explain.h"
#include "apc/report/report.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

std::string dimName(const mesh::DeviceMesh& mesh, uint32_t d) {
  if (d < mesh.names().size() && !mesh.names()[d].empty()) return mesh.names()[d];
  return "mesh dim " + std::to_string(d);
}

// The program was lowered here and now: its enums are valid (typed_proto checks anyway).
Expected<std::vector<CommStep>> stepsOf(
    const google::protobuf::RepeatedPtrField<proto::RedistStep>& in) {
  std::vector<CommStep> out;
  for (const proto::RedistStep& s : in) {
    APC_ASSIGN_OR_RETURN(layout::StepKind kind, artifact::stepKindFromProto(s.kind()));
    if (kind == layout::StepKind::kLocalSlice) continue;
    out.push_back({kind, s.mesh_dim(), s.priced_bytes()});
  }
  return out;
}

Expected<std::string> compactText(const artifact::PlacementField& t) {
  APC_ASSIGN_OR_RETURN(mesh::PlacementTuple p, artifact::placementFromProto(t));
  return mesh::toCompactString(p);
}

const char* shortKind(layout::StepKind kind) {
  switch (kind) {
    case layout::StepKind::kAllGather:
      return "AG";
    case layout::StepKind::kAllReduce:
      return "AR";
    case layout::StepKind::kReduceScatter:
      return "RS";
    case layout::StepKind::kAllToAll:
      return "A2A";
    case layout::StepKind::kLocalSlice:
      break;
  }
  return "?";
}

}  // namespace

Expected<std::vector<EdgeComm>> edgeComms(const ir::Graph& g, const plan::Plan& p) {
  APC_ASSIGN_OR_RETURN(proto::Program prog, lower::lowerRank(g, p, 0));
  std::map<uint32_t, const plan::PlanNode*> by_graph_node;
  for (const plan::PlanNode& n : p.nodes)
    if (n.graph_node) by_graph_node[*n.graph_node] = &n;
  std::vector<EdgeComm> out;
  for (const proto::Redistribution& r : prog.redistributions()) {
    EdgeComm e;
    e.edge = r.edge();
    APC_ASSIGN_OR_RETURN(e.forward, stepsOf(r.forward()));
    APC_ASSIGN_OR_RETURN(e.backward, stepsOf(r.backward()));
    if (e.forward.empty() && e.backward.empty()) continue;
    APC_ASSIGN_OR_RETURN(e.from, compactText(r.from()));
    APC_ASSIGN_OR_RETURN(e.to, compactText(r.to()));
    e.forward_us = r.priced_forward_us();
    e.backward_us = r.priced_backward_us();
    e.regather = r.regather();
    e.bucketed = r.bucketed_gradient();
    // "%v -> aten::op #<graph node> (input <i>)"
    if (size_t hash = e.edge.rfind(" #"); hash != std::string::npos) {
      e.graph_node = static_cast<uint32_t>(std::strtoul(e.edge.c_str() + hash + 2, nullptr, 10));
      if (size_t in = e.edge.find("(input ", hash); in != std::string::npos)
        e.input = static_cast<uint32_t>(std::strtoul(e.edge.c_str() + in + 7, nullptr, 10));
      // Named as the plan names the consumer (what explain --node takes).
      if (auto it = by_graph_node.find(*e.graph_node); it != by_graph_node.end()) {
        size_t arrow = e.edge.find(" -> ");
        e.edge = e.edge.substr(0, arrow) + " -> " + plan::displayName(*it->second) + " (" +
                 it->second->op + ", input " + std::to_string(e.input) + ")";
      }
    }
    if (!e.graph_node)
      if (size_t arrow = e.edge.find(" -> output");
          arrow != std::string::npos && !e.edge.empty() && e.edge[0] == '%')
        e.sink = "output " + e.edge.substr(0, arrow);
    out.push_back(std::move(e));
  }
  return out;
}

std::string stepsText(const std::vector<CommStep>& steps, const mesh::DeviceMesh& mesh) {
  if (steps.empty()) return "-";
  std::string out;
  for (const CommStep& s : steps)
    out += (out.empty() ? "" : " + ") + std::string(layout::stepKindName(s.kind)) + "(" +
           dimName(mesh, s.mesh_dim) + ", " + humanBytes(static_cast<double>(s.bytes)) + ")";
  return out;
}

std::string edgeCommText(const EdgeComm& e, const mesh::DeviceMesh& mesh) {
  // The backward's price holds what backward runs for the edge: the gradient's steps, at their
  // share of a bucket when bucketed, and the forward's again when re-gathered.
  return e.edge + " " + e.from + " -> " + e.to + ": fwd " + stepsText(e.forward, mesh) +
         (e.regather ? " (again in backward)" : "") + " | bwd " + stepsText(e.backward, mesh) +
         (e.bucketed ? " (bucketed: priced without its latency)" : "") + " [" +
         plan::formatMicros(e.forward_us) + " + " + plan::formatMicros(e.backward_us) + "]";
}

nlohmann::json toJson(const EdgeComm& e, const mesh::DeviceMesh& mesh) {
  auto steps = [&](const std::vector<CommStep>& in) {
    nlohmann::json a = nlohmann::json::array();
    for (const CommStep& s : in)
      a.push_back({{"kind", layout::stepKindName(s.kind)},
                   {"mesh_dim", s.mesh_dim},
                   {"mesh_dim_name", dimName(mesh, s.mesh_dim)},
                   {"bytes", s.bytes}});
    return a;
  };
  return {{"edge", e.edge},
          {"node", e.graph_node ? nlohmann::json(*e.graph_node) : nlohmann::json(nullptr)},
          {"input", e.input},
          {"from", e.from},
          {"to", e.to},
          {"forward", steps(e.forward)},
          {"backward", steps(e.backward)},
          {"forward_us", e.forward_us},
          {"backward_us", e.backward_us},
          {"regather", e.regather},
          {"bucketed_gradient", e.bucketed}};
}

namespace {

std::string shortLabel(const EdgeComm& e, const mesh::DeviceMesh& mesh) {
  std::string label;
  auto add = [&](const std::vector<CommStep>& steps, const char* dir) {
    for (const CommStep& s : steps)
      label += (label.empty() ? "" : "\n") + std::string(dir) + shortKind(s.kind) + "(" +
               dimName(mesh, s.mesh_dim) + ") " + humanBytes(static_cast<double>(s.bytes));
  };
  add(e.forward, "");
  add(e.backward, "bwd ");
  return label + "\n" + plan::formatMicros(e.forward_us + e.backward_us);
}

}  // namespace

std::map<std::string, std::string> sinkLabels(const std::vector<EdgeComm>& comms,
                                              const mesh::DeviceMesh& mesh) {
  std::map<std::string, std::string> out;
  for (const EdgeComm& e : comms)
    if (!e.sink.empty()) out[e.sink] = shortLabel(e, mesh);
  return out;
}

std::map<std::pair<uint32_t, uint32_t>, std::string> edgeLabels(const std::vector<EdgeComm>& comms,
                                                                const mesh::DeviceMesh& mesh) {
  std::map<std::pair<uint32_t, uint32_t>, std::string> out;
  for (const EdgeComm& e : comms) {
    if (!e.graph_node) continue;
    out[{*e.graph_node, e.input}] = shortLabel(e, mesh);
  }
  return out;
}

std::string commSection(const std::vector<EdgeComm>& comms, const mesh::DeviceMesh& mesh,
                        const std::vector<uint32_t>* graph_nodes) {
  std::string body;
  size_t n = 0;
  for (const EdgeComm& e : comms) {
    if (graph_nodes && (!e.graph_node || std::find(graph_nodes->begin(), graph_nodes->end(),
                                                   *e.graph_node) == graph_nodes->end()))
      continue;
    body += "  " + edgeCommText(e, mesh) + "\n";
    ++n;
  }
  if (n == 0)
    return graph_nodes ? "communication: none into these nodes\n" : "communication: none\n";
  return "communication (rank 0's program; forward | backward collectives, mesh dim, bytes; "
         "[priced forward + backward]): " +
         std::to_string(n) + " edge" + (n == 1 ? "" : "s") + "\n" + body;
}

std::string commSectionOrWhy(const std::vector<EdgeComm>& comms, const std::string& why_not,
                             const mesh::DeviceMesh& mesh,
                             const std::vector<uint32_t>* graph_nodes) {
  if (!why_not.empty()) return "\ncommunication: not shown (" + why_not + ")\n";
  return "\n" + commSection(comms, mesh, graph_nodes);
}

std::string nodeExplanationText(const Plan& p, const NodeExplanation& e, const ir::Graph& g) {
  std::vector<uint32_t> shown;
  if (e.node < p.nodes.size() && p.nodes[e.node].graph_node)
    shown.push_back(*p.nodes[e.node].graph_node);
  auto comms = edgeComms(g, p);
  return explanationText(p, e) +
         (comms.ok() ? commSectionOrWhy(*comms, "", p.spec.mesh, &shown)
                     : commSectionOrWhy({}, comms.error().message(), p.spec.mesh, &shown));
}

}  // namespace apc::plan
