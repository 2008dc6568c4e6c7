//===- lib/plan/memory.cpp - Predicted memory per rank over a training step -===//
//
// See apc/plan/memory.h for the model. Storages: every value maps to the storage it lives in (a
// view's is its base's); a consumer that reads a value in another placement than its producer's
// (a redistribution), or a parameter in another dtype (mixed precision's cast), reads a copy: one
// storage per (value, placement) made at its first reader and freed after its last. A copy of a
// parameter is never kept for backward (the runtime gathers it again), so it is transient.
//
//===----------------------------------------------------------------------===//
#include "apc/plan/memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <unordered_set>
#include <utility>

#include "apc/cost/cost_model.h"
#include "apc/cost/edge.h"
#include "apc/cost/redistribute.h"
#include "apc/layout/layout.h"
#include "apc/strategy/sync_norm.h"
#include "apc/support/strings.h"

namespace apc::plan {

bool MemoryParts::operator==(const MemoryParts&) const = default;
bool MemoryEstimate::operator==(const MemoryEstimate&) const = default;

const std::vector<std::string>& memoryOptimizers() {
  static const std::vector<std::string> kNames = {"sgd", "momentum", "adamw"};
  return kNames;
}

Expected<int> optimizerStateFactor(std::string_view optimizer) {
  if (optimizer == "sgd") return 0;
  if (optimizer == "momentum") return 1;
  if (optimizer == "adamw") return 2;
  return invalidArgument("unknown optimizer '" + std::string(optimizer) +
                         "' (the memory model knows sgd, momentum and adamw)");
}

namespace {

std::string_view bareOp(const ir::Node& n) {
  std::string_view op = n.op;
  if (op.substr(0, 6) == "aten::") op.remove_prefix(6);
  return op;
}

/// Ops whose outputs are views of their first input (they share its storage).
bool isViewOp(std::string_view op) {
  static const std::unordered_set<std::string_view> kViews = {
      "view",     "_unsafe_view",     "reshape", "permute",    "transpose",    "t",
      "expand",   "expand_as",        "slice",   "select",     "unsqueeze",    "squeeze",
      "split",    "split_with_sizes", "chunk",   "unbind",     "unflatten",    "flatten",
      "alias",    "detach",           "view_as", "narrow",     "as_strided",   "movedim",
      "diagonal", "numpy_T",          "mT",      "lift_fresh", "tensor_split", "swapaxes"};
  return kViews.count(op) > 0;
}

/// What an op saves for backward (when it records autograd): input indices and output indices.
struct Saves {
  std::vector<size_t> inputs;
  std::vector<size_t> outputs;
};

/// The simplified table of ATen's derivatives.yaml (see the header). `grad(i)`: input i is a
/// tensor that takes a gradient.
template <typename GradFn>
Saves savedBy(std::string_view op, size_t num_inputs, size_t num_outputs, const GradFn& grad) {
  static const std::unordered_set<std::string_view> kNothing = {"add",
                                                                "sub",
                                                                "rsub",
                                                                "neg",
                                                                "sum",
                                                                "mean",
                                                                "cat",
                                                                "concat",
                                                                "stack",
                                                                "clone",
                                                                "contiguous",
                                                                "to",
                                                                "_to_copy",
                                                                "type_as",
                                                                "zeros_like",
                                                                "ones_like",
                                                                "full_like",
                                                                "empty_like",
                                                                "fill",
                                                                "copy",
                                                                "repeat",
                                                                "tile",
                                                                "pad",
                                                                "constant_pad_nd",
                                                                "roll",
                                                                "flip",
                                                                "cumsum",
                                                                "arange",
                                                                "full",
                                                                "zeros",
                                                                "ones",
                                                                "empty",
                                                                "new_zeros",
                                                                "new_ones",
                                                                "new_empty",
                                                                "scalar_tensor",
                                                                "slice_scatter",
                                                                "select_scatter",
                                                                "index_put",
                                                                "upsample_nearest2d",
                                                                "_assert_scalar",
                                                                "sym_size",
                                                                "dropout",
                                                                "feature_dropout",
                                                                "lift_fresh_copy",
                                                                "expand_copy",
                                                                "view_copy",
                                                                "permute_copy",
                                                                "transpose_copy",
                                                                "squeeze_copy",
                                                                "unsqueeze_copy",
                                                                "split_copy"};
  static const std::unordered_set<std::string_view> kOutput = {
      "relu",        "relu_",        "sigmoid", "tanh", "exp",        "softmax", "_softmax",
      "log_softmax", "_log_softmax", "rsqrt",   "sqrt", "reciprocal", "elu"};
  static const std::unordered_set<std::string_view> kFirstInput = {
      "gelu",
      "silu",
      "pow",
      "abs",
      "sin",
      "cos",
      "log",
      "log1p",
      "erf",
      "mish",
      "leaky_relu",
      "hardswish",
      "hardsigmoid",
      "softplus",
      "clamp",
      "clip",
      "square",
      "avg_pool2d",
      "adaptive_avg_pool2d",
      "adaptive_avg_pool1d",
      "avg_pool1d",
      "hardtanh",
      "relu6",
      "layer_norm",
      "native_layer_norm",
      "rms_norm",
      "_fused_rms_norm",
      "group_norm",
      "native_group_norm",
      "batch_norm",
      "_native_batch_norm_legit",
      "_native_batch_norm_legit_no_training",
      "_native_batch_norm_legit_functional",
      "instance_norm",
      "var",
      "std",
      "var_mean",
      "gelu_"};
  static const std::unordered_set<std::string_view> kInputAndOutput = {
      "max",        "amax",
      "min",        "amin",
      "norm",       "linalg_vector_norm",
      "max_pool2d", "max_pool2d_with_indices",
      "max_pool1d", "max_pool3d",
      "topk",       "sort"};
  static const std::unordered_set<std::string_view> kProducts = {
      "mul",    "matmul", "mm",          "bmm",          "linear",  "conv1d",
      "conv2d", "conv3d", "convolution", "_convolution", "bilinear"};
  Saves s;
  auto all_inputs = [&] {
    for (size_t i = 0; i < num_inputs; ++i) s.inputs.push_back(i);
  };
  if (kNothing.count(op)) return s;
  if (kOutput.count(op)) {
    s.outputs.push_back(0);
    return s;
  }
  if (kFirstInput.count(op)) {
    s.inputs.push_back(0);
    return s;
  }
  if (kInputAndOutput.count(op)) {
    s.inputs.push_back(0);
    for (size_t o = 0; o < num_outputs; ++o) s.outputs.push_back(o);
    return s;
  }
  if (kProducts.count(op) && num_inputs >= 2) {
    // Each factor is saved for the other's gradient.
    if (grad(1)) s.inputs.push_back(0);
    if (grad(0)) s.inputs.push_back(1);
    return s;
  }
  if ((op == "addmm" || op == "baddbmm" || op == "addbmm") && num_inputs >= 3) {
    if (grad(2)) s.inputs.push_back(1);
    if (grad(1)) s.inputs.push_back(2);
    return s;
  }
  if (op == "div" && num_inputs >= 2) {
    s.inputs.push_back(1);
    if (grad(1)) s.inputs.push_back(0);
    return s;
  }
  if (op == "embedding" && num_inputs >= 2) {
    s.inputs.push_back(1);
    return s;
  }
  if ((op == "index_select" || op == "gather" || op == "scatter" || op == "scatter_add" ||
       op == "index_add") &&
      num_inputs >= 3) {
    s.inputs.push_back(2);
    return s;
  }
  if (op == "index" && num_inputs >= 2) {
    s.inputs.push_back(1);
    return s;
  }
  if (op == "where" && num_inputs >= 1) {
    s.inputs.push_back(0);
    return s;
  }
  if (op == "masked_fill" && num_inputs >= 2) {
    s.inputs.push_back(1);
    return s;
  }
  if (op == "native_dropout" && num_outputs >= 2) {
    s.outputs.push_back(1);
    return s;
  }
  if (op.find("scaled_dot_product") != std::string_view::npos ||
      op.find("cross_entropy") != std::string_view::npos || op.find("nll_loss") == 0 ||
      op == "mse_loss" || op == "l1_loss" || op == "smooth_l1_loss" || op == "einsum") {
    all_inputs();
    if (op.find("scaled_dot_product") != std::string_view::npos)
      for (size_t o = 0; o < num_outputs; ++o) s.outputs.push_back(o);
    return s;
  }
  all_inputs();  // unknown: assume every input is saved
  return s;
}

enum class StorageKind : uint8_t { kParameter, kBuffer, kInput, kDynamic };

struct Storage {
  StorageKind kind = StorageKind::kDynamic;
  int64_t bytes = 0;
  bool parameter_copy = false;  // a parameter's redistributed or cast copy: never kept
  int64_t alloc = 0;            // the op position that makes it (-1: before the forward)
  int64_t last_use = -1;        // the last op position that reads it
  bool kept = false;            // saved for backward (or a forward output)
  int64_t first_saver = std::numeric_limits<int64_t>::max();  // the earliest op that saved it
  std::string param;                                          // kParameter: the parameter's name
  // A parameter redistributed for its readers (FSDP's gather): its gradient, at this copy's
  // size, is reduced asynchronously and waited for at the end of backward (the runtime's overlap),
  // so it is held from its last reader's backward to the end of backward.
  bool gathered_param = false;
  int64_t first_read = -1;  // a gathered parameter's first reader (alloc moves to its group's)
  // Activation checkpointing: saved inside checkpointed segment `recompute` (an index into
  // segments_), so held only from that segment's backward (its recompute) on, not in forward.
  int recompute = -1;
  int group = -1;  // a gathered parameter's gather group (an index into the model's groups)
};

class Model {
 public:
  Model(const ir::Graph& g, const Plan& p, const std::vector<GatherGroup>& groups)
      : g_(g), cg_(cost::computeGraph(g, p.spec.mixed_precision)), p_(p), groups_(groups) {}

  /// The estimate without optimizer state (it adds the same bytes at every point of the step).
  Expected<MemoryEstimate> run() {
    // The cost model decides which parameters' gradients the runtime buckets
    // (unbucketedGradientBytes); a spec it cannot price leaves every where-it-lies gradient
    // bucketed.
    if (auto m = cost::costModelFor(p_.spec); m.ok()) model_ = std::move(m).value();
    APC_RETURN_IF_ERROR(mapPlan());
    for (const std::string& module : p_.checkpoint) {
      const std::optional<ir::NodeRange> r = ir::checkpointRange(g_, module);
      if (!r)
        return invalidArgument("the plan checkpoints module '" + module +
                               "', which cannot be recomputed (ir::checkpointRange)");
      segments_.push_back({*r, -1, -1});
    }
    MemoryEstimate e;
    // Persistent parts.
    int64_t largest_param = 0;
    for (const PlanParameter& pp : p_.parameters) {
      persistent_.parameters += pp.bytes_per_rank;
      largest_param = std::max(largest_param, pp.bytes_per_rank);
    }

    // Storages of the leaves and op outputs, and the op order.
    value_storage_.assign(g_.numValues(), -1);
    producer_pos_.assign(g_.numValues(), -1);
    for (const ir::Node& n : g_.nodes()) {
      if (n.kind == ir::NodeKind::kOp) {
        if (g_.isShapeNode(n.id)) continue;
        const int64_t pos = static_cast<int64_t>(ops_.size());
        ops_.push_back(n.id);
        segment_of_.push_back(-1);
        for (size_t k = 0; k < segments_.size(); ++k) {
          Segment& sg = segments_[k];
          if (n.id.v < sg.range.first || n.id.v > sg.range.last) continue;
          segment_of_.back() = static_cast<int>(k);
          if (sg.first_pos < 0) sg.first_pos = pos;
          sg.last_pos = pos;
        }
        for (size_t k = 0; k < n.outputs.size(); ++k) producer_pos_[n.outputs[k].v] = pos;
        continue;
      }
      if (n.outputs.empty()) continue;
      const ir::ValueId v = n.outputs[0];
      if (!isTensorLike(v)) continue;
      const StorageKind kind = n.kind == ir::NodeKind::kParameter ? StorageKind::kParameter
                               : n.kind == ir::NodeKind::kBuffer  ? StorageKind::kBuffer
                                                                  : StorageKind::kInput;
      // Parameters in their stored dtype; the rest as the compute graph has them.
      const int64_t bytes =
          valueBytes(kind == StorageKind::kParameter ? g_ : cg_, v, producerPlacement(v));
      if (kind == StorageKind::kBuffer) persistent_.buffers += bytes;
      // apc-train's synthetic batch is made whole on every rank and each rank takes its piece
      // (a view of it for a batch cut on dim 0): the whole input is held.
      if (kind == StorageKind::kInput)
        persistent_.inputs += cg_.value(v).tensor ? cg_.value(v).tensor->bytes() : bytes;
      value_storage_[v.v] = newStorage(kind, bytes, -1);
      if (kind == StorageKind::kParameter) storages_.back().param = n.name;
    }
    for (size_t pos = 0; pos < ops_.size(); ++pos) placeOp(static_cast<int64_t>(pos));
    const Grouped grouped = placeGroups();
    // Forward outputs stay until backward starts (and the loss through it).
    for (ir::ValueId v : g_.outputs().leaves()) {
      if (!v.valid() || value_storage_[v.v] < 0) continue;
      Storage& s = storages_[static_cast<size_t>(value_storage_[v.v])];
      if (s.kind != StorageKind::kDynamic) continue;
      s.kept = true;
      s.first_saver = std::min(s.first_saver, producer_pos_[v.v]);
    }

    const int64_t persistent = persistent_.parameters + persistent_.buffers + persistent_.inputs +
                               persistent_.optimizer_state;
    e.persistent_bytes = persistent;
    enum Phase { kForward, kLoss, kBackward, kOptimizer };
    static constexpr const char* kPhaseNames[] = {"forward", "loss", "backward", "optimizer"};
    int64_t* const phase_peaks[] = {&e.forward_peak, &e.loss_peak, &e.backward_peak,
                                    &e.optimizer_peak};
    auto consider = [&](const MemoryParts& parts, Phase phase, const std::string& at) {
      *phase_peaks[phase] = std::max(*phase_peaks[phase], parts.total());
      if (parts.total() > e.peak_bytes || e.phase.empty()) {
        e.peak_bytes = parts.total();
        e.phase = kPhaseNames[phase];
        e.at = at;
        e.at_peak = parts;
      }
    };

    // Forward: a sweep of allocations and frees over op positions.
    const int64_t num_ops = static_cast<int64_t>(ops_.size());
    std::vector<int64_t> add(static_cast<size_t>(num_ops) + 1, 0), drop(add);
    std::vector<int64_t> add_saved(add);
    std::map<std::string, int64_t> saved_by_op;
    for (const Storage& s : storages_) {
      if (s.kind != StorageKind::kDynamic) continue;
      const int64_t a = std::max<int64_t>(s.alloc, 0);
      const bool kept = s.kept && !s.parameter_copy;
      const int64_t end = std::max(s.last_use, a);
      add[static_cast<size_t>(a)] += s.bytes;
      if (!kept) drop[static_cast<size_t>(end)] += s.bytes;
      if (kept) {
        e.saved_activations += s.bytes;
        if (s.first_saver >= 0 && s.first_saver < num_ops)
          saved_by_op[g_.node(ops_[static_cast<size_t>(s.first_saver)]).qualifiedOp()] += s.bytes;
        // Counted as an activation from the op that saves it (before: a live value).
        const int64_t from = std::min(std::max(s.first_saver, a), end);
        add_saved[static_cast<size_t>(from)] += s.bytes;
      }
    }
    int64_t live = 0, saved = 0, in_flight = 0;
    for (int64_t pos = 0; pos < num_ops; ++pos) {
      live += add[static_cast<size_t>(pos)];
      saved += add_saved[static_cast<size_t>(pos)];
      in_flight += grouped.forward_add[static_cast<size_t>(pos)];
      MemoryParts parts = persistent_;
      parts.activations = saved;
      parts.transient = live - saved + in_flight;
      consider(parts, kForward, opName(pos));
      live -= drop[static_cast<size_t>(pos)];
      in_flight -= grouped.forward_drop[static_cast<size_t>(pos)];
    }

    for (const auto& [op, bytes] : saved_by_op) e.saved_by_op.emplace_back(op, bytes);
    std::stable_sort(e.saved_by_op.begin(), e.saved_by_op.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });

    // The loss, as apc-train computes it outside the program (apc/runtime/loss.h): on the first
    // output leaf, this rank's rows of it (the mesh dims that split rows stay split) with the
    // class dim gathered when split (a new tensor), the cross entropy of a floating output of rank
    // >= 2 (its log_softmax, the rows' size, saved; the whole batch's int64 targets drawn, this
    // rank's piece taken) or the mean square (pow saves the rows); a one-element output is
    // gathered whole. Every output leaf stays local.
    const std::vector<ir::ValueId> leaves = g_.outputs().leaves();
    int64_t gathered = 0, loss_saved = 0, loss_grads = 0, outputs_local = 0;
    // The gather's temporaries while it runs: the all-gather's buffer of the pieces laid out by
    // rank, which is then moved into place (the gathered dim is not the first), and on the CPU
    // Gloo's own flat output and the input's flat copy (measured: gpt2_tiny's logits split by
    // vocab on 2 CPU ranks hold 3.5 times the logits while gathered, 2 once gathered). And what
    // stays gathered after the loss is taken: a cross-entropy's log_softmax saves its output, not
    // its input, so the gathered rows go; a mean square's pow keeps them.
    int64_t gather_temp = 0, gathered_held = 0;
    const bool gloo = p_.spec.device == "cpu";
    for (size_t i = 0; i < leaves.size(); ++i) {
      const ir::ValueId v = leaves[i];
      if (!v.valid() || !cg_.value(v).tensor) continue;
      const ir::TensorMeta& t = *cg_.value(v).tensor;
      const std::optional<mesh::PlacementTuple> pl = producerPlacement(v);
      outputs_local += valueBytes(cg_, v, pl);
      if (i != 0) continue;
      if (t.numel() == 1) {
        gathered += t.bytes();
        gathered_held += t.bytes();
        continue;
      }
      const bool classes = ir::isFloating(t.dtype) && t.rank() >= 2;
      const int row_dims = static_cast<int>(classes ? t.rank() - 1 : t.rank());
      // The rows' placement: shards of row dims kept, the rest undone.
      mesh::PlacementTuple keep(p_.spec.mesh.ndim(), mesh::Placement::replicate());
      bool undone = false;
      // Only the class dim split besides the rows (vocab-parallel logits): the runtime's cross
      // entropy takes the split logits as they are (loss.h), so nothing is gathered.
      bool vocab_parallel = classes && !t.shape.back().isSymbolic();
      if (pl && pl->size() == keep.size())
        for (size_t m = 0; m < keep.size(); ++m) {
          if ((*pl)[m].isShard() && (*pl)[m].dim() < row_dims) {
            keep[m] = (*pl)[m];
          } else if (!(*pl)[m].isReplicate()) {
            undone = true;
            vocab_parallel = vocab_parallel && (*pl)[m].isShard() && (*pl)[m].dim() == row_dims;
          }
        }
      vocab_parallel = vocab_parallel && undone;
      if (vocab_parallel) {
        // This rank's rows and classes: exp(x - max) is saved (x - max a temporary beside it while
        // computed), f32 copies of low-precision logits too (the target's gather saves them);
        // per row a few numbers, the whole batch's int64 targets drawn and this rank's piece.
        const int64_t local = valueBytes(cg_, v, pl);
        const int64_t elem = std::max<int64_t>(ir::dtypeBytes(t.dtype), 1);
        const int64_t f32 = elem < 4 ? local / elem * 4 : local;
        const int64_t local_rows =
            valueBytes(cg_, v, keep) / elem / std::max<int64_t>(t.shape.back().size, 1);
        const int64_t all_rows = t.numel() / std::max<int64_t>(t.shape.back().size, 1);
        loss_saved = f32 + (elem < 4 ? f32 : 0) + local_rows * 8 * 4 + all_rows * 8;
        gather_temp = f32;  // x - max while exp runs
        loss_grads = 2 * f32;
        continue;
      }
      const int64_t rows = valueBytes(cg_, v, keep);
      if (undone) {
        gathered += rows;
        gather_temp = gloo ? 2 * rows + valueBytes(cg_, v, pl) : rows;
        if (!classes) gathered_held = rows;
      }
      if (classes) {
        const int64_t elem = std::max<int64_t>(ir::dtypeBytes(t.dtype), 1);
        const int64_t local_rows = rows / elem / std::max<int64_t>(t.shape.back().size, 1);
        const int64_t all_rows = t.numel() / std::max<int64_t>(t.shape.back().size, 1);
        loss_saved = rows + local_rows * 8 + all_rows * 8;
        loss_grads = 2 * rows;  // log_softmax's input gradient, then the rows'
      } else {
        loss_grads = rows;
      }
    }
    {
      MemoryParts parts = persistent_;
      parts.activations = e.saved_activations;
      parts.transient = gathered + gather_temp;
      consider(parts, kLoss, "");
      parts.transient = gathered + loss_saved;
      consider(parts, kLoss, "");
      // The vocab-parallel cross entropy's x - max beside its exp (gather_temp, gathered 0).
      parts.transient = loss_saved + (gathered == 0 ? gather_temp : 0);
      consider(parts, kLoss, "");
      parts.transient = gathered_held + loss_saved + loss_grads;
      consider(parts, kBackward, "the loss");
    }

    // Backward, in reverse. Saved storages are released after the backward of their first saver;
    // parameter gradients appear at the backward of a parameter's last reader; an activation's
    // gradient is held from its last reader's backward to its producer's.
    // The forward's outputs stay with apc-train until the step ends.
    std::vector<bool> output_storage(storages_.size(), false);
    int64_t outputs_held = 0;
    for (ir::ValueId v : leaves)
      if (v.valid() && value_storage_[v.v] >= 0 &&
          !output_storage[static_cast<size_t>(value_storage_[v.v])]) {
        output_storage[static_cast<size_t>(value_storage_[v.v])] = true;
        const Storage& s = storages_[static_cast<size_t>(value_storage_[v.v])];
        if (s.kind == StorageKind::kDynamic) outputs_held += s.bytes;
      }
    std::vector<int64_t> release_at(static_cast<size_t>(num_ops) + 1, 0);
    // A checkpointed segment's backward runs its forward again: what its ops save is held from
    // its last op's backward to each saver's (then released as without checkpointing).
    std::vector<int64_t> recompute_at(static_cast<size_t>(num_ops) + 1, 0);
    for (const Storage& s : storages_) {
      if (s.kind != StorageKind::kDynamic || s.recompute < 0 || s.kept || s.parameter_copy)
        continue;
      const Segment& sg = segments_[static_cast<size_t>(s.recompute)];
      if (sg.last_pos < 0) continue;
      recompute_at[static_cast<size_t>(sg.last_pos)] += s.bytes;
      const int64_t at = std::clamp<int64_t>(s.first_saver, sg.first_pos, sg.last_pos);
      release_at[static_cast<size_t>(at)] += s.bytes;
    }
    int64_t held = 0;
    for (size_t k = 0; k < storages_.size(); ++k) {
      const Storage& s = storages_[k];
      if (s.kind != StorageKind::kDynamic || !s.kept || s.parameter_copy) continue;
      held += s.bytes;
      if (output_storage[k]) continue;
      const int64_t at = std::clamp<int64_t>(s.first_saver, 0, std::max<int64_t>(num_ops - 1, 0));
      release_at[static_cast<size_t>(at)] += s.bytes;
    }
    std::vector<int64_t> grad_start(static_cast<size_t>(num_ops) + 1, 0), grad_end(grad_start);
    std::vector<int64_t> param_grad_at(grad_start);
    for (const ir::Node& n : g_.nodes()) {
      if (n.kind != ir::NodeKind::kParameter || n.outputs.empty()) continue;
      const int64_t last = last_reader_[n.outputs[0].v];
      if (last < 0) continue;
      auto it = param_bytes_.find(n.name);
      if (it != param_bytes_.end()) param_grad_at[static_cast<size_t>(last)] += it->second;
    }
    std::vector<bool> is_leaf(g_.numValues(), false);
    for (ir::ValueId v : leaves)
      if (v.valid()) is_leaf[v.v] = true;
    for (uint32_t v = 0; v < g_.numValues(); ++v) {
      const int64_t prod = producer_pos_[v];
      if (prod < 0 || !requiresGrad(ir::ValueId{v}) || view_output_[v]) continue;
      // An output's gradient comes from the loss, before every node's backward.
      const int64_t last = is_leaf[v] ? num_ops - 1 : last_reader_[v];
      if (last <= prod) continue;
      const int64_t bytes = valueBytes(cg_, ir::ValueId{v}, producerPlacement(ir::ValueId{v}));
      grad_start[static_cast<size_t>(last)] += bytes;
      grad_end[static_cast<size_t>(prod)] += bytes;
    }
    // A pending reduce-scatter (or a group's all-reduce) holds one full-size buffer until the
    // work is waited for: NCCL's input; on the CPU the communicator's own copy that it
    // all-reduces in place (c10d_comm.cpp; the caller's input is dropped once issued). Gloo's
    // own reduce-scatter held two, its clone and the input (-26% on mlp_stack's FSDP plan with one
    // counted then); resnet_bottleneck's FSDP plan measures one since the communicator's own.
    std::vector<int64_t> reducing_at(static_cast<size_t>(num_ops) + 1, 0);
    // A gather group's gradients are reduced together (placeGroups): its flat buffer from the
    // last member's gradient on, in place of each member's.
    for (const Storage& s : storages_)
      if (s.gathered_param && s.group < 0 && s.last_use >= 0 && s.last_use < num_ops)
        reducing_at[static_cast<size_t>(s.last_use)] += s.bytes;
    for (size_t i = 0; i < reducing_at.size(); ++i) reducing_at[i] += grouped.reduce_at[i];
    int64_t grads = 0, pending = 0, reducing = 0, regathered = 0;
    for (int64_t pos = num_ops - 1; pos >= 0; --pos) {
      const size_t i = static_cast<size_t>(pos);
      grads += param_grad_at[i];
      pending += grad_start[i];
      held += recompute_at[i];
      reducing += reducing_at[i];
      regathered += grouped.backward_add[i];
      MemoryParts parts = persistent_;
      parts.activations = held;
      parts.gradients = grads;
      // A reader's gradient of a redistributed input is made at the copy's placement first.
      parts.transient = pending + copy_grad_bytes_[i] + gathered_held + reducing + regathered;
      consider(parts, kBackward, opName(pos));
      held -= release_at[i];
      pending -= grad_end[i];
      regathered -= grouped.backward_drop[i];
    }

    // The gradient buckets' flush at the end of backward (lib/runtime/parallel_module.cpp): the
    // gradients of replicated parameters that their readers take as they are (DDP's all-reduce)
    // were deferred; they are concatenated into buckets of at most grad_bucket_bytes_, reduced,
    // and copied into the parameters' gradients, so the deferred gradients, one bucket and every
    // gradient are held at once.
    int64_t bucketed = 0;
    for (const PlanParameter& pp : p_.parameters) {
      bool replicated = false;
      for (size_t d = 0; d < pp.placement.size() && d < p_.spec.mesh.ndim(); ++d)
        replicated |= pp.placement[d].isReplicate() && p_.spec.mesh.size(d) > 1;
      // Only a gradient that is reduced goes to the buckets (with a replicated batch every rank
      // has the whole one). A parameter read inside checkpointed segments is bucketed too: the
      // recompute hands its gradient to the buckets, which the segment's forward counted.
      if (replicated && reduced_params_.count(pp.name) && !redistributed_params_.count(pp.name) &&
          !unbucketed_params_.count(pp.name))
        bucketed += pp.bytes_per_rank;
    }
    if (bucketed > 0) {
      MemoryParts parts = persistent_;
      parts.activations = outputs_held;
      parts.gradients = persistent_.parameters;
      parts.transient =
          bucketed + std::min(bucketed, grad_bucket_bytes_) + gathered_held + reducing;
      consider(parts, kBackward, "the gradient buckets");
    }
    if (reducing > 0) {
      // The end of backward: every gradient made, the gathered ones still being reduced.
      MemoryParts parts = persistent_;
      parts.activations = outputs_held;
      parts.gradients = persistent_.parameters;
      parts.transient = reducing + gathered_held;
      consider(parts, kBackward, "the gradient reductions");
    }

    // The optimizer step: every gradient, the state, one temporary of the largest parameter.
    MemoryParts step = persistent_;
    step.gradients = persistent_.parameters;
    // apc-train still holds the step's outputs until the step ends (the loss's tensors are gone).
    step.transient = largest_param + outputs_local;
    consider(step, kOptimizer, "");
    // The phases before the optimizer step hold no gradients of an earlier step (apc-train sets
    // them to none), so the forward's peak is the one a step starts with.
    return e;
  }

 private:
  /// What the gather groups add over the step, by op position: forward transients (added at a
  /// position, dropped after one), backward ones (added when backward reaches a position, dropped
  /// after it), and the groups' flat gradient buffers from where they are issued on.
  struct Grouped {
    std::vector<int64_t> forward_add, forward_drop, backward_add, backward_drop, reduce_at;
  };

  /// The runtime's grouped FSDP collectives (GatherGroup; lib/runtime/parallel_module.cpp,
  /// redistribute.cpp), per group of gathered parameter copies:
  ///   forward: the members are gathered together at the first member's reader, where the gather
  ///     is waited (the flat output beside the members cut from it; their copies live from there
  ///     to each one's last reader). It was issued at the previous gather unit's wait (the
  ///     prefetch of one unit): its flat input and output are in flight from there, and on the
  ///     CPU Gloo's flat copy of the output is made while that wait blocks. A unit issued where it
  ///     is waited (the first) is in flight, with that copy, before its members are cut;
  ///   backward (re-gathered groups): the members come back together when backward reaches the
  ///     last of their readers (the gather's results beside the refilled members there, or the
  ///     gather in flight when no later group issued it ahead) and live to each member's first
  ///     reader's backward (where its redistribution's backward frees it); the previous group's
  ///     re-gather is issued there, in flight until its turn (Gloo's copy of it: a race with the
  ///     results' free, half counted);
  ///   gradients (reduced together): each member's full gradient is held from its last reader's
  ///     backward until the last member's arrives (at the members' earliest reader), where the
  ///     group's flat buffer is issued and held to the end of backward.
  Grouped placeGroups() {
    const size_t n = ops_.size() + 1;
    Grouped out;
    for (std::vector<int64_t>* v : {&out.forward_add, &out.forward_drop, &out.backward_add,
                                    &out.backward_drop, &out.reduce_at})
      v->assign(n, 0);
    if (groups_.empty()) return out;
    std::map<std::string, int> group_of;
    for (size_t k = 0; k < groups_.size(); ++k)
      for (const std::string& name : groups_[k].params) group_of[name] = static_cast<int>(k);
    struct Timeline {
      int64_t first = std::numeric_limits<int64_t>::max();   // the gather's wait
      int64_t restore = -1;                                  // the re-gather
      int64_t reduce = std::numeric_limits<int64_t>::max();  // the last member's gradient
      int64_t full = 0;                                      // the members' gathered bytes
      std::vector<size_t> members;
    };
    std::vector<Timeline> t(groups_.size());
    // The gather units in forward order: a group, or a parameter gathered on its own (a copy
    // larger than the parameter's shard), by first reader.
    std::vector<std::pair<int64_t, int>> units;  // (first reader, group or -1)
    for (size_t k = 0; k < storages_.size(); ++k) {
      Storage& s = storages_[k];
      if (!s.gathered_param || s.first_read < 0) continue;
      auto it = group_of.find(s.param);
      if (it == group_of.end()) {
        auto b = param_bytes_.find(s.param);
        if (b != param_bytes_.end() && s.bytes > b->second) units.emplace_back(s.first_read, -1);
        continue;
      }
      s.group = it->second;
      Timeline& tl = t[static_cast<size_t>(it->second)];
      tl.first = std::min(tl.first, s.first_read);
      tl.restore = std::max(tl.restore, s.last_use);
      tl.reduce = std::min(tl.reduce, s.first_read);
      tl.full += s.bytes;
      tl.members.push_back(k);
    }
    for (size_t k = 0; k < t.size(); ++k)
      if (!t[k].members.empty()) units.emplace_back(t[k].first, static_cast<int>(k));
    std::sort(units.begin(), units.end());
    // Gloo (CPU) gathers into a flat copy of the output on its own thread (the input is a view).
    const bool gloo = p_.spec.device == "cpu";
    auto groupAt = [&](size_t u) { return u < units.size() ? units[u].second : -1; };
    for (size_t u = 0; u < units.size(); ++u) {
      if (units[u].second < 0) continue;
      const GatherGroup& def = groups_[static_cast<size_t>(units[u].second)];
      Timeline& tl = t[static_cast<size_t>(units[u].second)];
      const size_t first = static_cast<size_t>(tl.first);
      const size_t issue = static_cast<size_t>(u > 0 ? units[u - 1].first : tl.first);
      const int64_t flight = inFlight(def), gloo_copy = gloo ? def.gather_bytes : 0;
      for (size_t m : tl.members) storages_[m].alloc = tl.first;
      // Waited at the first member's reader: the flat output beside the members cut from it.
      out.forward_add[first] += def.gather_bytes;
      out.forward_drop[first] += def.gather_bytes;
      if (issue < first) {
        // In flight from the previous unit's wait, where Gloo's copy is made while this rank
        // blocks in that wait.
        out.forward_add[issue] += flight;
        out.forward_drop[first - 1] += flight;
        out.forward_add[issue] += gloo_copy;
        out.forward_drop[issue] += gloo_copy;
      } else {
        // Issued where it is waited: in flight (with Gloo's copy) before the members are cut.
        const int64_t before =
            std::max<int64_t>(0, flight + gloo_copy - def.gather_bytes - tl.full);
        out.forward_add[first] += before;
        out.forward_drop[first] += before;
      }
      if (def.regather && tl.restore >= 0) {
        const size_t restore = static_cast<size_t>(tl.restore);
        for (size_t m : tl.members) {
          const Storage& s = storages_[m];
          out.backward_add[restore] += s.bytes;
          out.backward_drop[static_cast<size_t>(s.first_read)] += s.bytes;
        }
        // The gather's results, copied into the members. Then this group's re-gather issues the
        // previous unit's when that is a re-gathered group (its flat input and output in flight
        // until backward reaches that group) as the results are freed. Gloo's copy of it is made
        // on Gloo's thread as this one frees the results, a race that goes either way (mlp_stack's
        // fsdp plan measures 8.9 or 10.4 MiB): half of it is counted.
        int64_t results = tl.full, prev_flight = 0;
        if (const int prev = groupAt(u - 1); u > 0 && prev >= 0) {
          const GatherGroup& pd = groups_[static_cast<size_t>(prev)];
          const Timeline& pt = t[static_cast<size_t>(prev)];
          if (pd.regather && pt.restore >= 0 && pt.restore < tl.restore) {
            prev_flight = inFlight(pd);
            out.backward_add[restore] += prev_flight;
            out.backward_drop[static_cast<size_t>(pt.restore) + 1] += prev_flight;
            if (gloo) results += pd.gather_bytes / 2;
          }
        }
        // Not issued ahead by the next unit's re-gather: gathered here, in flight (with Gloo's
        // copy) before the results and the members, when that is more.
        const int next = groupAt(u + 1);
        const bool ahead = next >= 0 && groups_[static_cast<size_t>(next)].regather &&
                           t[static_cast<size_t>(next)].restore > tl.restore;
        if (!ahead) results = std::max(results, flight + gloo_copy - tl.full - prev_flight);
        out.backward_add[restore] += results;
        out.backward_drop[restore] += results;
      }
      if (def.reduce_bytes > 0) {
        for (size_t m : tl.members) {
          const Storage& s = storages_[m];
          if (s.last_use < 0) continue;
          out.backward_add[static_cast<size_t>(s.last_use)] += s.bytes;
          out.backward_drop[static_cast<size_t>(tl.reduce)] += s.bytes;
        }
        out.reduce_at[static_cast<size_t>(tl.reduce)] += def.reduce_bytes;
      } else {
        // Reduced one by one: as a parameter on its own.
        for (size_t m : tl.members) storages_[m].group = -1;
      }
    }
    return out;
  }

  /// A grouped gather in flight: its flat input (this rank's slots) and output (every rank's).
  static int64_t inFlight(const GatherGroup& def) {
    return def.gather_bytes + def.gather_bytes / std::max<int64_t>(def.ranks, 1);
  }

  bool isTensorLike(ir::ValueId v) const {
    const ir::Value& val = g_.value(v);
    return val.type == ir::ValueType::kTensor || val.type == ir::ValueType::kTensorList;
  }

  bool requiresGrad(ir::ValueId v) const {
    const ir::Value& val = cg_.value(v);
    if (val.tensor) return val.tensor->requires_grad;
    for (const ir::TensorMeta& t : val.elements)
      if (t.requires_grad) return true;
    return false;
  }

  Status mapPlan() {
    plan_of_.assign(g_.numNodes(), -1);
    for (size_t i = 0; i < p_.nodes.size(); ++i) {
      const PlanNode& pn = p_.nodes[i];
      if (!pn.graph_node) continue;
      if (*pn.graph_node >= g_.numNodes())
        return invalidArgument("plan node '" + pn.name + "' names graph node " +
                               std::to_string(*pn.graph_node) + ", beyond the graph's " +
                               std::to_string(g_.numNodes()));
      plan_of_[*pn.graph_node] = static_cast<int64_t>(i);
    }
    for (const PlanParameter& pp : p_.parameters) param_bytes_[pp.name] = pp.bytes_per_rank;
    last_reader_.assign(g_.numValues(), -1);
    view_output_.assign(g_.numValues(), false);
    return Status::success();
  }

  /// The placement of output `k` of v's producer, if the plan places it.
  std::optional<mesh::PlacementTuple> producerPlacement(ir::ValueId v) const {
    const ir::Value& val = g_.value(v);
    if (!val.producer.valid()) return std::nullopt;
    const int64_t pi = plan_of_[val.producer.v];
    if (pi < 0) return std::nullopt;
    const ir::Node& n = g_.node(val.producer);
    const PlanNode& pn = p_.nodes[static_cast<size_t>(pi)];
    for (size_t k = 0; k < n.outputs.size() && k < pn.outputs.size(); ++k)
      if (n.outputs[k] == v) return pn.outputs[k];
    return std::nullopt;
  }

  /// The local bytes of `v` (as `graph` types it) under `placement` (none: whole).
  int64_t valueBytes(const ir::Graph& graph, ir::ValueId v,
                     const std::optional<mesh::PlacementTuple>& placement) const {
    const ir::Value& val = graph.value(v);
    auto local = [&](const ir::TensorMeta& t, const std::optional<mesh::PlacementTuple>& pl) {
      if (!pl || pl->size() != p_.spec.mesh.ndim()) return t.bytes();
      int64_t numel = 1;
      for (int64_t s : layout::maxLocalSizes(t, *pl, p_.spec.mesh)) numel *= s;
      return numel * ir::dtypeBytes(t.dtype);
    };
    if (val.tensor) return local(*val.tensor, placement);
    int64_t sum = 0;
    for (const ir::TensorMeta& t : val.elements) {
      if (!placement) {
        sum += t.bytes();
        continue;
      }
      std::vector<int64_t> sizes;
      for (const ir::Dim& d : t.shape) sizes.push_back(d.size);
      sum += local(t, layout::elementPlacement(*placement, sizes));
    }
    return sum;
  }

  /// Storage `sid` (and the elements of a list it packs) is read at `pos`.
  void use(int64_t sid, int64_t pos) {
    Storage& s = storages_[static_cast<size_t>(sid)];
    s.last_use = std::max(s.last_use, pos);
    for (int64_t m : members_[static_cast<size_t>(sid)]) {
      Storage& e = storages_[static_cast<size_t>(m)];
      e.last_use = std::max(e.last_use, pos);
    }
  }

  /// For parameter value `v` read where it lies (at `at`) by plan node `pi`, whose gradient goes
  /// back by something else than one all-reduce: what its collectives hold beside the gradient
  /// while they run (0 for the others). Lowering buckets exactly the gradients whose plan is one
  /// all-reduce (cost::bucketedGradientUs); the cost model may prefer a reduce-scatter and an
  /// all-gather (large tensors on the CPU device), run as the gradient arrives, never held for the
  /// end-of-backward buckets. Their temporaries (each step's output, beside its input; on the CPU
  /// Gloo's flat copy of an all-gather's output and the reduce-scatter's own buffer) are counted as
  /// the largest step's: its input piece, its output and, on Gloo, one more full copy.
  /// The placement the gradient that plan node `pi` gives a value read at `at` comes back in,
  /// and the one it must end in (Partial sums reduced).
  std::pair<mesh::PlacementTuple, mesh::PlacementTuple> gradientPlacements(
      int64_t pi, const mesh::PlacementTuple& at) const {
    const PlanNode& pn = p_.nodes[static_cast<size_t>(pi)];
    const std::vector<bool> split =
        cost::opSplit(pn.input_placements, pn.outputs, p_.spec.mesh.ndim());
    return {cost::gradientPlacement(at, split), cost::partialAsReplicate(at)};
  }

  /// Whether the gradient that plan node `pi` gives parameter value `v`, read where it lies at
  /// `at`, must be reduced across ranks (a Partial sum: the readers' pieces of a batch-sharded
  /// input); not when every rank computes the whole gradient (a replicated batch). Without a plan
  /// node or placement: assumed reduced.
  bool gradientReduced(int64_t pi, ir::ValueId v,
                       const std::optional<mesh::PlacementTuple>& at) const {
    const std::optional<ir::TensorMeta>& t = cg_.value(v).tensor;
    if (t && (!t->requires_grad || !ir::isFloating(t->dtype))) return false;
    if (pi < 0 || !at) return true;
    const auto [from, to] = gradientPlacements(pi, *at);
    return !(from == to);
  }

  int64_t unbucketedGradientBytes(int64_t pi, ir::ValueId v,
                                  const std::optional<mesh::PlacementTuple>& at) const {
    if (!model_ || pi < 0 || !at) return 0;
    const std::optional<ir::TensorMeta>& t = cg_.value(v).tensor;
    if (!t || !t->requires_grad || !ir::isFloating(t->dtype)) return 0;
    const auto [from, to] = gradientPlacements(pi, *at);
    if (from == to) return 0;
    auto bwd = cost::planRedistribution(*t, from, to, p_.spec.mesh, *model_);
    if (!bwd.ok() || !bwd->feasible || bwd->steps.empty() || cost::bucketsGradient(*bwd)) return 0;
    const bool gloo = p_.spec.device == "cpu";
    int64_t most = 0;
    for (const cost::RedistributionStep& st : bwd->steps) {
      const int64_t full = st.full_bytes, piece = full / std::max<int64_t>(st.group_size, 1);
      most = std::max(most, piece + full + (gloo ? full : 0));
    }
    return std::max<int64_t>(most, 1);
  }

  int64_t newStorage(StorageKind kind, int64_t bytes, int64_t alloc) {
    Storage s;
    s.kind = kind;
    s.bytes = bytes;
    s.alloc = alloc;
    storages_.push_back(s);
    members_.emplace_back();
    return static_cast<int64_t>(storages_.size()) - 1;
  }

  /// The storage op `pos` reads for its input `i` (a copy when it redistributes or casts).
  int64_t readStorage(int64_t pos, const ir::Node& n, size_t i) {
    const ir::ValueId v = n.inputs[i];
    if (!isTensorLike(v) || value_storage_[v.v] < 0) return -1;
    const int64_t pi = plan_of_[n.id.v];
    std::optional<mesh::PlacementTuple> want;
    if (pi >= 0 && i < p_.nodes[static_cast<size_t>(pi)].input_placements.size())
      want = p_.nodes[static_cast<size_t>(pi)].input_placements[i];
    const std::optional<mesh::PlacementTuple> have = producerPlacement(v);
    const int64_t base = value_storage_[v.v];
    const Storage& bs = storages_[static_cast<size_t>(base)];
    const bool is_param = bs.kind == StorageKind::kParameter;
    const ir::Value& stored = g_.value(v);
    const bool cast = is_param && stored.tensor && cg_.value(v).tensor &&
                      stored.tensor->dtype != cg_.value(v).tensor->dtype;
    const bool moved = want && have && !(*want == *have);
    if (moved && is_param) redistributed_params_.insert(bs.param);
    if (!moved && is_param && gradientReduced(pi, v, want ? want : have))
      reduced_params_.insert(bs.param);
    if (!moved && is_param)
      if (const int64_t temp = unbucketedGradientBytes(pi, v, want ? want : have); temp > 0) {
        unbucketed_params_.insert(bs.param);
        copy_grad_bytes_[static_cast<size_t>(pos)] += temp;
      }
    if (!moved && !cast) return base;
    const std::string key = std::to_string(v.v) + "|" + (want ? mesh::toString(*want) : "");
    auto it = copies_.find(key);
    if (it != copies_.end()) return it->second;
    const int64_t bytes = valueBytes(cg_, v, moved ? want : have);
    // What the copy takes from its base, read before newStorage grows storages_ (and moves bs).
    const bool base_copy = bs.parameter_copy;
    const std::string param = bs.param;
    const int64_t id = newStorage(StorageKind::kDynamic, bytes, pos);
    storages_[static_cast<size_t>(id)].parameter_copy = is_param || base_copy;
    copies_.emplace(key, id);
    if (moved && is_param) {
      Storage& c = storages_[static_cast<size_t>(id)];
      c.gathered_param = true;
      c.param = param;
      c.first_read = pos;
    } else if (moved && requiresGrad(v))
      copy_grad_bytes_[static_cast<size_t>(pos)] += bytes;  // its gradient, before the way back
    return id;
  }

  void placeOp(int64_t pos) {
    const ir::Node& n = g_.node(ops_[static_cast<size_t>(pos)]);
    if (copy_grad_bytes_.size() < ops_.size()) copy_grad_bytes_.assign(ops_.size(), 0);
    std::vector<int64_t> reads(n.inputs.size(), -1);
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      reads[i] = readStorage(pos, n, i);
      if (reads[i] < 0) continue;
      use(reads[i], pos);
      last_reader_[n.inputs[i].v] = std::max(last_reader_[n.inputs[i].v], pos);
    }
    // A checkpointed segment keeps every tensor it reads from outside (its recompute's inputs)
    // until its backward: the value itself, not a redistributed copy (the segment makes those).
    if (const int seg = segment_of_[static_cast<size_t>(pos)]; seg >= 0) {
      const int64_t first = segments_[static_cast<size_t>(seg)].first_pos;
      for (ir::ValueId v : n.inputs) {
        if (!isTensorLike(v) || value_storage_[v.v] < 0) continue;
        const int64_t sid = value_storage_[v.v];
        std::vector<int64_t> parts = members_[static_cast<size_t>(sid)];
        parts.push_back(sid);
        for (int64_t m : parts) {
          Storage& e = storages_[static_cast<size_t>(m)];
          if (e.kind != StorageKind::kDynamic || e.alloc >= first) continue;
          e.kept = true;
          e.first_saver = std::min(e.first_saver, first);
        }
      }
    }
    const std::string_view op = bareOp(n);
    const bool view = isViewOp(op) && !n.inputs.empty() && reads[0] >= 0;
    // A list or tuple a prim op builds holds its elements (no storage of its own, no autograd).
    const bool pack = op.substr(0, 6) == "prim::";
    for (ir::ValueId o : n.outputs) {
      if (!isTensorLike(o)) continue;
      if (view) {
        value_storage_[o.v] = reads[0];
        view_output_[o.v] = true;
        continue;
      }
      if (pack) {
        const int64_t id = newStorage(StorageKind::kDynamic, 0, pos);
        for (int64_t r : reads)
          if (r >= 0) members_[static_cast<size_t>(id)].push_back(r);
        value_storage_[o.v] = id;
        view_output_[o.v] = true;
        continue;
      }
      const int64_t bytes = valueBytes(cg_, o, producerPlacement(o));
      value_storage_[o.v] = newStorage(StorageKind::kDynamic, bytes, pos);
      storages_[static_cast<size_t>(value_storage_[o.v])].last_use = pos;
    }
    if (view || pack) return;  // saves nothing: its backward needs sizes only
    // Saved tensors, when the op records autograd.
    bool records = false;
    for (ir::ValueId o : n.outputs)
      if (isTensorLike(o) && requiresGrad(o)) records = true;
    if (!records) return;
    auto grad = [&](size_t i) {
      return i < n.inputs.size() && isTensorLike(n.inputs[i]) && requiresGrad(n.inputs[i]);
    };
    const Saves saves = savedBy(op, n.inputs.size(), n.outputs.size(), grad);
    // Inside a checkpointed segment an op saves nothing in forward (the segment runs without
    // autograd; its inputs are kept above): what it saves is held from the recompute on.
    const int seg = segment_of_[static_cast<size_t>(pos)];
    auto mark = [&](Storage& e) {
      if (e.kind != StorageKind::kDynamic) return;
      if (seg >= 0 && e.alloc >= segments_[static_cast<size_t>(seg)].first_pos) {
        e.recompute = seg;
      } else {
        e.kept = true;
      }
      e.first_saver = std::min(e.first_saver, pos);
    };
    auto keep = [&](int64_t sid) {
      if (sid < 0) return;
      for (int64_t m : members_[static_cast<size_t>(sid)]) mark(storages_[static_cast<size_t>(m)]);
      mark(storages_[static_cast<size_t>(sid)]);
    };
    // A batch-sharded training batch_norm runs as SyncBatchNorm does (apc/strategy/sync_norm.h),
    // in autograd ops that save x - mean and the normalized x: two tensors of the input's size in
    // place of the input.
    const int64_t pi = plan_of_[n.id.v];
    if (pi >= 0 && !reads.empty() && reads[0] >= 0 && strategy::isTrainingBatchNorm(g_, n) &&
        !p_.nodes[static_cast<size_t>(pi)].input_placements.empty() &&
        p_.nodes[static_cast<size_t>(pi)].input_placements[0] &&
        !strategy::syncNormMeshDims(*p_.nodes[static_cast<size_t>(pi)].input_placements[0])
             .empty()) {
      const int64_t bytes = storages_[static_cast<size_t>(reads[0])].bytes;
      for (int k = 0; k < 2; ++k) {
        const int64_t id = newStorage(StorageKind::kDynamic, bytes, pos);
        storages_[static_cast<size_t>(id)].last_use = pos;
        keep(id);
      }
      return;
    }
    // max_pool saves its input and the int64 indices of its output (max_pool2d computes them
    // through max_pool2d_with_indices), not its values.
    if (op.substr(0, 8) == "max_pool" && !n.outputs.empty() && cg_.value(n.outputs[0]).tensor) {
      if (!reads.empty()) keep(reads[0]);
      const int64_t out = valueBytes(cg_, n.outputs[0], producerPlacement(n.outputs[0]));
      const int64_t elem = ir::dtypeBytes(cg_.value(n.outputs[0]).tensor->dtype);
      const int64_t id =
          newStorage(StorageKind::kDynamic, out / std::max<int64_t>(elem, 1) * 8, pos);
      storages_[static_cast<size_t>(id)].last_use = pos;
      keep(id);
      return;
    }
    for (size_t i : saves.inputs)
      if (i < reads.size()) keep(reads[i]);
    for (size_t o : saves.outputs)
      if (o < n.outputs.size() && isTensorLike(n.outputs[o])) keep(value_storage_[n.outputs[o].v]);
  }

  std::string opName(int64_t pos) const {
    const ir::NodeId id = ops_[static_cast<size_t>(pos)];
    const int64_t pi = plan_of_[id.v];
    if (pi >= 0) return p_.nodes[static_cast<size_t>(pi)].name;
    const ir::Node& n = g_.node(id);
    return n.outputs.empty() ? n.op : g_.value(n.outputs[0]).debug_name;
  }

  /// A checkpointed module: its node range and its first and last op positions (-1: none).
  struct Segment {
    ir::NodeRange range;
    int64_t first_pos = -1;
    int64_t last_pos = -1;
  };

  const ir::Graph& g_;
  ir::Graph cg_;
  const Plan& p_;
  const std::vector<GatherGroup>& groups_;
  std::vector<Segment> segments_;
  std::vector<int> segment_of_;  // per op position: its segment, or -1
  MemoryParts persistent_;
  std::vector<int64_t> plan_of_;
  std::map<std::string, int64_t> param_bytes_;
  std::vector<ir::NodeId> ops_;
  std::vector<Storage> storages_;
  std::vector<std::vector<int64_t>> members_;  // per storage: the elements a packed list holds
  std::vector<int64_t> value_storage_;
  std::vector<int64_t> producer_pos_;
  std::vector<int64_t> last_reader_;
  std::vector<bool> view_output_;
  std::vector<int64_t> copy_grad_bytes_;
  std::map<std::string, int64_t> copies_;
  std::set<std::string> redistributed_params_;  // parameters a reader takes in another placement
  std::set<std::string> unbucketed_params_;     // read where they lie, gradient not one all-reduce
  std::set<std::string>
      reduced_params_;  // read where they lie by a reader whose gradient is reduced
  std::optional<cost::CostModel> model_;  // the plan's spec's (unbucketedGradientBytes)
  int64_t grad_bucket_bytes_ = kGradBucketBytes;
};

/// `base` (no optimizer state) with `optimizer`'s state added everywhere.
Expected<MemoryEstimate> withOptimizer(MemoryEstimate e, std::string_view optimizer) {
  APC_ASSIGN_OR_RETURN(const int factor, optimizerStateFactor(optimizer));
  const int64_t state = factor * e.at_peak.parameters;
  e.optimizer = std::string(optimizer);
  e.at_peak.optimizer_state = state;
  e.peak_bytes += state;
  e.persistent_bytes += state;
  for (int64_t* phase : {&e.forward_peak, &e.loss_peak, &e.backward_peak, &e.optimizer_peak})
    *phase += state;
  return e;
}

}  // namespace

Expected<MemoryEstimate> predictMemory(const ir::Graph& g, const Plan& p,
                                       std::string_view optimizer,
                                       const std::vector<GatherGroup>& groups) {
  APC_RETURN_IF_ERROR(optimizerStateFactor(optimizer));
  Model m(g, p, groups);
  APC_ASSIGN_OR_RETURN(MemoryEstimate base, m.run());
  return withOptimizer(std::move(base), optimizer);
}

Expected<std::vector<MemoryEstimate>> predictMemoryAll(const ir::Graph& g, const Plan& p,
                                                       const std::vector<GatherGroup>& groups) {
  Model m(g, p, groups);
  APC_ASSIGN_OR_RETURN(MemoryEstimate base, m.run());
  std::vector<MemoryEstimate> out;
  for (const std::string& name : memoryOptimizers()) {
    APC_ASSIGN_OR_RETURN(MemoryEstimate e, withOptimizer(base, name));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace apc::plan
