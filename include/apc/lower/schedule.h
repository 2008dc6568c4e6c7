#pragma once
// The runtime's overlap schedule of one training step, predicted (issue 30 item 2: what the
// prediction and the planner take off for overlap is what the runtime overlaps).
//
// simulateStep replays a rank's lowered program as ParallelModule runs it with overlap on (its
// default) on two kinds of resource: the rank's compute, one op after another, and one channel
// per mesh dim on which collectives run in issue order (a c10d process group per mesh-dim slice
// runs its collectives in order). What runs asynchronously is what the runtime issues
// asynchronously:
// - FSDP's parameter gathers, by unit (artifact::paramGatherGroups: a gather group is one
//   all-gather), `prefetch` units ahead in forward: reaching unit u issues units up to u+prefetch
//   and waits for u;
// - their re-gathers in backward (Redistribution.regather), when backward first reaches a reader
//   of a member, with the previous unit prefetched;
// - their gradients' reduce-scatters (a group's as one, AsyncGrads), issued when the unit's last
//   gradient arrives, waited for at the end of backward;
// - DDP's gradient buckets (artifact::deferredGradParameters, laid out as lowering's prediction
//   lays them out: per mesh dim, op and dtype, parameters in reverse order, the first bucket at
//   most kFirstGradBucketBytes), each issued once all its gradients arrived, in layout order.
// Everything else (every other redistribution, forward and backward) blocks the rank: it starts
// when the rank reaches it and its channels are free. A node's compute is the plan's (the
// prediction's node_compute_us), split into forward and backward by its op's backward multiplier;
// a checkpointed segment's forward runs again where backward reaches its last node.
// Torch-free (planner core).

#include "apc.pb.h"
#include "apc/cost/cost_model.h"
#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/support/error.h"

namespace apc::lower {

struct StepSchedule {
  /// Every item of the schedule one after another: the step without overlap, with the runtime's
  /// grouped gathers and gradient buckets.
  double serial_us = 0;
  /// The schedule's length with the runtime's overlap: the end of backward, after the waits for
  /// every asynchronous collective.
  double overlapped_us = 0;
  /// serial_us - overlapped_us: communication the schedule runs behind compute (or behind other
  /// communication on another mesh dim).
  double hidden_us = 0;
  /// Time the rank waits for collectives in the overlapped schedule (blocked in a blocking one,
  /// or in a wait for an asynchronous one).
  double exposed_comm_us = 0;
};

/// `graph` is the program's local graph (program.graph() as an ir::Graph), `program` its proto
/// with node_redistribution, redistributions and prediction().node_compute_us filled; `model`
/// and `mesh` are the plan's. `prefetch`: ParallelModuleOptions::prefetch_params (0: no gather is
/// issued ahead).
StepSchedule simulateStep(const ir::Graph& graph, const proto::Program& program,
                          const cost::CostModel& model, const mesh::DeviceMesh& mesh,
                          int prefetch = 1);
/// The same on a program alone (its graph read with ir::deserializeProgramGraph).
Expected<StepSchedule> simulateProgram(const proto::Program& program, const cost::CostModel& model,
                                       const mesh::DeviceMesh& mesh, int prefetch = 1);

}  // namespace apc::lower
