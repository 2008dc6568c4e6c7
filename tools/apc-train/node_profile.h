//===- tools/apc-train/node_profile.h - Per-node times of a training step -*- C++ -*-===//
//
// apc-train --profile-nodes: the measured time of every node of the rank's program, forward and
// backward, beside what the plan priced for it (PredictedStep::node_compute_us), summed per op
// name, to find which ops the cost model misprices.
//
// Forward: the node's wall time between the interpreter's before and after (ParallelModule::
// setObserver). Backward: a pre-hook on the autograd node behind each output of the node marks
// when the node's backward starts; the node's backward time runs from there to the next mark
// (the engine runs an op's own autograd nodes before those of the ops it read) or to the end of
// the backward. On CUDA every mark synchronizes the device first, so a node's time is its
// kernels' plus its dispatch, serialized: not the overlapped step (the step time is measured
// apart, without these synchronizations).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "apc/runtime/interpreter.h"

namespace apc::train {

class NodeProfiler : public runtime::Interpreter::Observer {
 public:
  NodeProfiler(const ir::Graph& graph, c10::Device device);

  /// Timing on (the measured steps) or off (warm-up).
  void setActive(bool on) { active_ = on; }
  /// Call right before loss.backward() and right after it.
  void backwardStarts();
  void backwardEnds();

  void before(const ir::Node& node, const std::vector<c10::IValue>& args) override;
  void after(const ir::Node& node, const std::vector<c10::IValue>& outputs,
             const std::vector<c10::IValue>& live) override;

  struct OpTotals {
    std::string op;
    int64_t nodes = 0;        // program nodes of this op
    double forward_ms = 0;    // per step, summed over those nodes
    double backward_ms = 0;   // per step
    double predicted_ms = 0;  // the plan's compute of those nodes (forward and backward)
  };
  /// Per op name, per measured step (divided by `steps`), costliest first; `predicted_us` per
  /// graph node (PredictedStep::node_compute_us; may be empty).
  std::vector<OpTotals> totals(int steps, const std::vector<double>& predicted_us) const;

  struct NodeRow {
    uint32_t node = 0;        // graph node id
    std::string op;           // "aten::conv2d"
    std::string module_path;  // "features.3.block.0.0"; may be empty
    std::string inputs;       // the tensor inputs' local metas, "f32[4,16,32,32] f32[16,16,3,3]"
    double forward_ms = 0;    // per step
    double backward_ms = 0;   // per step
    double predicted_ms = 0;  // the plan's compute of the node
  };
  /// Every op node, in program order, per measured step: where an op's total in totals() comes
  /// from, to find which shapes the model misprices.
  std::vector<NodeRow> perNode(int steps, const std::vector<double>& predicted_us) const;

 private:
  double now() const;
  void mark(uint32_t node);

  const ir::Graph& graph_;
  c10::Device device_;
  bool active_ = false;
  double t_before_ = 0;
  std::set<const void*> input_fns_;  // autograd nodes behind the running node's inputs
  std::vector<double> forward_s_;    // per node, summed over steps
  std::vector<double> backward_s_;   // per node
  struct Mark {
    double t;
    uint32_t node;
  };
  std::vector<Mark> marks_;           // this backward's, in the order they fired
  std::vector<int64_t> marked_step_;  // per node: the backward it last marked (one mark each)
  int64_t backward_index_ = 0;
  double backward_start_ = 0;
};

}  // namespace apc::train
