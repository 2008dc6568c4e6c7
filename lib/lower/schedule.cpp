// The runtime's overlap schedule of one training step, predicted: see apc/lower/schedule.h.

#include "apc/lower/schedule.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "apc/artifact/artifact.h"
#include "apc/cost/compute.h"
#include "apc/ir/proto_io.h"
#include "apc/strategy/strategy.h"

namespace apc::lower {

namespace {

/// The mesh dims a redistribution's steps run on (its forward's or its backward's).
std::vector<uint32_t> stepDims(const google::protobuf::RepeatedPtrField<proto::RedistStep>& steps) {
  std::set<uint32_t> dims;
  for (const proto::RedistStep& s : steps)
    if (s.kind() != proto::LOCAL_SLICE) dims.insert(s.mesh_dim());
  return {dims.begin(), dims.end()};
}

/// The rank's compute and one collective channel per mesh dim, in time.
class Timeline {
 public:
  explicit Timeline(size_t ndim) : channel_(ndim, 0.0) {}

  void compute(double us) {
    t_ += us;
    serial_ += us;
  }
  /// A collective on `dims` issued now: it starts when its channels are free and holds them
  /// until it ends. Returns its end; a blocking one makes the rank wait for it.
  double issue(const std::vector<uint32_t>& dims, double us, bool blocking) {
    serial_ += us;
    double start = t_;
    for (uint32_t d : dims)
      if (d < channel_.size()) start = std::max(start, channel_[d]);
    const double end = start + us;
    for (uint32_t d : dims)
      if (d < channel_.size()) channel_[d] = end;
    if (blocking) waitFor(end);
    return end;
  }
  void waitFor(double end) {
    if (end > t_) {
      exposed_ += end - t_;
      t_ = end;
    }
  }
  /// The end of the step: every channel drained.
  void drain() {
    for (double c : channel_) waitFor(c);
  }
  double now() const { return t_; }
  double serial() const { return serial_; }
  double exposed() const { return exposed_; }

 private:
  double t_ = 0, serial_ = 0, exposed_ = 0;
  std::vector<double> channel_;
};

}  // namespace

StepSchedule simulateStep(const ir::Graph& graph, const proto::Program& program,
                          const cost::CostModel& model, const mesh::DeviceMesh& mesh,
                          int prefetch) {
  const size_t n_nodes = graph.numNodes();
  const strategy::Registry& registry = strategy::defaultRegistry();
  auto redOf = [&](size_t node) -> const proto::Redistribution* {
    if (node >= static_cast<size_t>(program.node_redistribution_size())) return nullptr;
    const uint32_t r = program.node_redistribution(static_cast<int>(node));
    return r == 0 ? nullptr : &program.redistributions(static_cast<int>(r - 1));
  };
  auto redIndex = [&](size_t node) {
    return static_cast<int>(program.node_redistribution(static_cast<int>(node))) - 1;
  };

  // Compute per node, forward and backward (the plan's, split by the op's backward multiplier).
  std::vector<double> fwd(n_nodes, 0.0), bwd(n_nodes, 0.0);
  for (const ir::Node& n : graph.nodes()) {
    const size_t i = n.id.v;
    if (n.kind != ir::NodeKind::kOp || redOf(i) ||
        i >= static_cast<size_t>(program.prediction().node_compute_us_size()))
      continue;
    const double us = program.prediction().node_compute_us(static_cast<int>(i));
    fwd[i] = us * registry.forwardShare(graph, n);
    bwd[i] = us - fwd[i];
  }

  // FSDP's gather units, as ParallelModule issues them: the redistributions of a parameter whose
  // forward is one all-gather along a static dim, in program order; a run of members of one gather
  // group (artifact::paramGatherGroups) is one unit, any other such gather a unit of its own.
  const std::vector<int> deferred = artifact::deferredGradParameters(program);
  const std::vector<int> groups = artifact::paramGatherGroups(program);
  // A unit's steps: the mesh dim and the bytes of each collective step (a gather over several mesh
  // dims, a gradient chain: one call per step, run back to back).
  struct Unit {
    std::vector<uint32_t> dims, grad_dims;
    std::vector<double> bytes, grad_bytes;
    size_t members = 0;
    std::vector<cost::CollectiveKind> grad_kinds;
    bool regather = false, async_grads = true;
    double gather_us = 0, grad_us = 0;
    size_t arrived = 0;         // members whose gradient arrived in backward
    double regather_done = -1;  // the re-gather's end, once issued
    bool regathered = false;    // backward waited for it
  };
  std::map<int, Unit> units;
  std::vector<int> unit_of(n_nodes, -1);
  std::optional<size_t> last;  // the last candidate so far
  for (size_t i = 0; i < n_nodes; ++i) {
    const proto::Redistribution* red = redOf(i);
    const ir::Node& n = graph.node(ir::NodeId(static_cast<uint32_t>(i)));
    if (!red || n.inputs.size() != 1) continue;
    const int ri = redIndex(i);
    if (static_cast<size_t>(ri) < deferred.size() && deferred[static_cast<size_t>(ri)] >= 0)
      continue;
    const ir::NodeId prod = graph.value(n.inputs[0]).producer;
    if (!prod.valid() || graph.node(prod).kind != ir::NodeKind::kParameter) continue;
    // One all-gather, or a gather group's all-gathers over several mesh dims (ParallelModule's
    // prefetch nodes).
    const int group = i < groups.size() ? groups[i] : -1;
    if (!artifact::isGatherChain(*red) || (red->forward_size() != 1 && group < 0)) continue;
    const bool joins = last && group >= 0 && *last < groups.size() && groups[*last] == group;
    unit_of[i] = joins ? unit_of[*last] : static_cast<int>(units.size());
    last = i;
    Unit& u = units[unit_of[i]];
    u.dims.resize(static_cast<size_t>(red->forward_size()));
    u.bytes.resize(u.dims.size());
    for (int j = 0; j < red->forward_size(); ++j) {
      u.dims[static_cast<size_t>(j)] = red->forward(j).mesh_dim();
      u.bytes[static_cast<size_t>(j)] += static_cast<double>(red->forward(j).priced_bytes());
    }
    u.regather = red->regather();
    ++u.members;
    const artifact::GatherGradientForm form = artifact::gatherGradientForm(*red);
    if (!red->requires_grad() || form == artifact::GatherGradientForm::kOther) {
      u.async_grads = false;
    } else {
      // One all-reduce for the unit when any member takes one (GroupedReduceScatter); a chain's
      // collective steps one call each.
      size_t j = 0;
      for (const proto::RedistStep& st : red->backward()) {
        if (st.kind() == proto::LOCAL_SLICE) continue;
        const cost::CollectiveKind kind = st.kind() == proto::ALL_REDUCE
                                              ? cost::CollectiveKind::kAllReduce
                                              : cost::CollectiveKind::kReduceScatter;
        if (u.grad_dims.size() <= j) {
          u.grad_dims.push_back(st.mesh_dim());
          u.grad_kinds.push_back(kind);
          u.grad_bytes.push_back(0);
        }
        if (kind == cost::CollectiveKind::kAllReduce) u.grad_kinds[j] = kind;
        u.grad_bytes[j++] += static_cast<double>(st.priced_bytes());
      }
    }
  }
  std::vector<double> member_blocking_bwd(n_nodes, 0.0);  // a member's own backward collectives
  for (auto& [id, u] : units) {
    for (size_t j = 0; j < u.dims.size(); ++j)
      u.gather_us += model.collectiveUs(cost::CollectiveKind::kAllGather, u.dims[j],
                                        mesh.size(u.dims[j]), u.bytes[j]);
    // A lone gather whose gradient is not one reduce-scatter reduces it blocking (only a
    // reduce-scatter, or a group, goes through AsyncGrads).
    if (u.members == 1 &&
        (u.grad_kinds.size() != 1 || u.grad_kinds.front() != cost::CollectiveKind::kReduceScatter))
      u.async_grads = false;
    if (u.async_grads)
      for (size_t j = 0; j < u.grad_dims.size(); ++j)
        u.grad_us += model.collectiveUs(u.grad_kinds[j], u.grad_dims[j], mesh.size(u.grad_dims[j]),
                                        u.grad_bytes[j]);
  }
  for (size_t i = 0; i < n_nodes; ++i) {
    if (unit_of[i] < 0 || units.at(unit_of[i]).async_grads) continue;
    const proto::Redistribution& red = *redOf(i);
    if (!red.requires_grad()) continue;
    // What the plan priced for the backward, less the re-gather the unit does.
    double regather = 0;
    if (red.regather())
      for (const proto::RedistStep& f : red.forward())
        regather +=
            model.collectiveUs(cost::CollectiveKind::kAllGather, f.mesh_dim(),
                               mesh.size(f.mesh_dim()), static_cast<double>(f.priced_bytes()));
    member_blocking_bwd[i] = std::max(0.0, red.priced_backward_us() - regather);
  }

  // DDP's gradient buckets, laid out as lowering's prediction lays them out (one all-reduce per
  // mesh dim of the key).
  using Key = std::tuple<std::vector<uint32_t>, int, std::string>;
  std::map<Key, std::map<int, double>> bytes_by_param;
  std::map<int, int> edges_left;  // parameter -> deferred edges whose gradient has not arrived
  for (size_t r = 0; r < deferred.size(); ++r) {
    if (deferred[r] < 0) continue;
    const proto::Redistribution& red = program.redistributions(static_cast<int>(r));
    const proto::RedistStep& st = red.backward(0);
    double& b = bytes_by_param[{stepDims(red.backward()), static_cast<int>(st.reduce_op()),
                                red.reduce_dtype()}][deferred[r]];
    b = std::max(b, static_cast<double>(st.priced_bytes()));
    ++edges_left[deferred[r]];
  }
  struct Bucket {
    std::vector<uint32_t> dims;
    double us = 0;
    size_t waiting = 0;  // parameters whose gradient has not arrived
    bool issued = false;
  };
  std::vector<std::vector<Bucket>> buckets;            // per key, in layout order
  std::map<int, std::pair<size_t, size_t>> bucket_of;  // parameter -> (key, bucket)
  for (const auto& [key, params] : bytes_by_param) {
    const std::vector<uint32_t>& dims = std::get<0>(key);
    std::vector<Bucket> list;
    double bytes = 0;
    std::vector<int> members;
    auto close = [&] {
      if (members.empty()) return;
      Bucket b;
      b.dims = dims;
      for (uint32_t dim : dims)
        b.us += model.collectiveUs(cost::CollectiveKind::kAllReduce, dim, mesh.size(dim), bytes);
      b.waiting = members.size();
      for (int m : members) bucket_of[m] = {buckets.size(), list.size()};
      list.push_back(b);
      bytes = 0;
      members.clear();
    };
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      const double cap = static_cast<double>(list.empty() ? artifact::kFirstGradBucketBytes
                                                          : artifact::kDefaultGradBucketBytes);
      if (!members.empty() && bytes + it->second > cap) close();
      bytes += it->second;
      members.push_back(it->first);
    }
    close();
    buckets.push_back(std::move(list));
  }

  Timeline tl(mesh.ndim());
  // Forward.
  std::map<int, double> gather_done;  // unit -> its forward gather's end
  int issued = 0;                     // units below it are issued
  const int n_units = static_cast<int>(units.size());
  for (size_t i = 0; i < n_nodes; ++i) {
    const ir::Node& n = graph.node(ir::NodeId(static_cast<uint32_t>(i)));
    const proto::Redistribution* red = redOf(i);
    if (!red) {
      tl.compute(fwd[i]);
      continue;
    }
    const int ri = redIndex(i);
    if (static_cast<size_t>(ri) < deferred.size() && deferred[static_cast<size_t>(ri)] >= 0)
      continue;  // an identity forward
    if (unit_of[i] >= 0) {
      const int u = unit_of[i];
      const int end = std::min(n_units, u + 1 + std::max(0, prefetch));
      for (; issued < end; ++issued) {
        const Unit& un = units.at(issued);
        gather_done[issued] = tl.issue(un.dims, un.gather_us, false);
      }
      tl.waitFor(gather_done.at(u));
      continue;
    }
    (void)n;
    tl.issue(stepDims(red->forward()), red->priced_forward_us(), true);
  }

  // Backward, in reverse program order.
  std::map<uint32_t, uint32_t> segment_end;  // last node -> first node of a checkpointed segment
  for (const proto::CheckpointSegment& cs : program.checkpoints())
    segment_end[cs.last()] = cs.first();
  auto regather = [&](int u) {
    Unit& un = units.at(u);
    if (un.regathered) return;
    if (un.regather_done < 0) un.regather_done = tl.issue(un.dims, un.gather_us, false);
    // The previous unit tracked for a re-gather is issued ahead.
    if (prefetch > 0)
      for (int v = u - 1; v >= 0; --v) {
        Unit& prev = units.at(v);
        if (!prev.regather) continue;
        if (prev.regather_done < 0) prev.regather_done = tl.issue(prev.dims, prev.gather_us, false);
        break;
      }
    tl.waitFor(un.regather_done);
    un.regathered = true;
  };
  for (size_t k = n_nodes; k-- > 0;) {
    const ir::Node& n = graph.node(ir::NodeId(static_cast<uint32_t>(k)));
    if (auto seg = segment_end.find(static_cast<uint32_t>(k)); seg != segment_end.end())
      for (size_t j = seg->second; j <= k; ++j)
        if (!redOf(j)) tl.compute(fwd[j]);
    const proto::Redistribution* red = redOf(k);
    if (!red) {
      if (n.kind != ir::NodeKind::kOp) continue;
      for (ir::ValueId v : n.inputs) {
        const ir::NodeId prod = graph.value(v).producer;
        if (!prod.valid() || prod.v >= n_nodes || unit_of[prod.v] < 0) continue;
        if (units.at(unit_of[prod.v]).regather) regather(unit_of[prod.v]);
      }
      tl.compute(bwd[k]);
      continue;
    }
    if (!red->requires_grad()) continue;
    const int ri = redIndex(k);
    if (static_cast<size_t>(ri) < deferred.size() && deferred[static_cast<size_t>(ri)] >= 0) {
      const int param = deferred[static_cast<size_t>(ri)];
      if (--edges_left[param] > 0) continue;
      const auto [key, b] = bucket_of.at(param);
      --buckets[key][b].waiting;
      for (Bucket& bk : buckets[key]) {  // issued strictly in layout order
        if (bk.issued) continue;
        if (bk.waiting > 0) break;
        tl.issue(bk.dims, bk.us, false);
        bk.issued = true;
      }
      continue;
    }
    if (unit_of[k] >= 0) {
      Unit& un = units.at(unit_of[k]);
      if (un.regather && !un.regathered) regather(unit_of[k]);
      if (!un.async_grads) {
        tl.issue(stepDims(red->backward()), member_blocking_bwd[k], true);
      } else if (++un.arrived == un.members) {
        tl.issue(un.grad_dims, un.grad_us, false);
      }
      continue;
    }
    tl.issue(stepDims(red->backward()), red->priced_backward_us(), true);
  }
  // The end of backward: buckets still waiting are issued, then every collective waited for.
  for (std::vector<Bucket>& list : buckets)
    for (Bucket& bk : list)
      if (!bk.issued) tl.issue(bk.dims, bk.us, false);
  for (auto& [id, un] : units)
    if (un.async_grads && un.arrived > 0 && un.arrived < un.members)
      tl.issue(un.grad_dims, un.grad_us, false);
  tl.drain();

  StepSchedule s;
  s.serial_us = tl.serial();
  s.overlapped_us = tl.now();
  s.hidden_us = std::max(0.0, s.serial_us - s.overlapped_us);
  s.exposed_comm_us = tl.exposed();
  return s;
}

Expected<StepSchedule> simulateProgram(const proto::Program& program, const cost::CostModel& model,
                                       const mesh::DeviceMesh& mesh, int prefetch) {
  APC_ASSIGN_OR_RETURN(const ir::Graph graph,
                       ir::deserializeProgramGraph(program.graph().SerializeAsString()));
  return simulateStep(graph, program, model, mesh, prefetch);
}

}  // namespace apc::lower
