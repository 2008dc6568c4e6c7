//===- tests/runtime/rank_harness.h - Forked ranks and single-process refs -===//
//
// What the multi-process runtime tests share:
// - makeArtifact: plans a sample model with the built `apc` binary (`apc plan --artifact`), at
//   small input shapes, with the optimizer or a classic strategy;
// - Reference: the unsharded TorchScript model trained in this process (forward output leaves,
//   every parameter gradient after the first backward, the loss of each SGD step), from inputs and
//   loss weights drawn from a fixed seed;
// - runRanks: forks one process per rank with the torchrun variables set (RANK, WORLD_SIZE,
//   LOCAL_RANK, MASTER_ADDR, MASTER_PORT on a free port), runs a function in each and collects
//   their exit codes; the children inherit the reference, so nothing is recomputed per rank.
//   A rank that does not finish within the timeout is killed and reported.
// - a rank's side: RankLog (failures as "rank <r>: ..." lines), loadRank (program + full
//   weights), shardInputs, expectGradsMatch (every parameter's gathered gradient), scratchDir.
//
// The loss of a step is sum_i mean(out_i * w_i) over the output leaves, with w_i random.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

namespace apc::runtime {
class ParallelModule;
struct ParallelModuleOptions;
}  // namespace apc::runtime

namespace apc::runtime::testing {

/// sample_models/out/<model>.<ext>; ext "pt" (TorchScript) or "pt2" (exported program). An
/// absolute `model` ("/tmp/.../gn_small", a model a test wrote) is <model>.<ext>.
std::string samplePath(const std::string& model, const std::string& ext = "pt");
std::string apcBinary();

struct ModelCase {
  std::string model;
  std::vector<std::string> inputs;  // "x:f32[2,4,128]"
  int64_t index_bound = 0;          // integer inputs are drawn in [0, bound)
  std::string optimizer_flags;      // extra `apc plan` flags for the optimizer's plan
  // "pt2": plan the exported program (<model>.pt2) and start the ranks from the weights it holds
  // (apc::frontend::loadModelState); the reference is still the TorchScript module of the same
  // sample (<model>.pt, written from the same weights), the only unsharded executor LibTorch has.
  std::string format = "pt";
};

/// Plans `c` on `mesh` ("2x2") with `strategy` ("" for the optimizer, else ddp|fsdp|tp|fsdp+tp)
/// and writes the artifact to `dir`, with `extra_flags` added to apc plan's command line
/// ("--checkpoint all"). Returns "" or the command's error output.
std::string makeArtifact(const ModelCase& c, const std::string& mesh, const std::string& strategy,
                         const std::string& dir, const std::string& extra_flags = "");

struct Reference {
  std::vector<at::Tensor> inputs;           // full inputs
  std::map<std::string, at::Tensor> init;   // initial parameters and buffers (copies)
  std::vector<at::Tensor> outputs;          // output leaves of step 0
  std::vector<at::Tensor> loss_weights;     // w_i per leaf
  std::map<std::string, at::Tensor> grads;  // parameter gradients of step 0
  std::vector<double> losses;               // per SGD step
  std::vector<double> loss_scales;          // sum_i mean(|out_i * w_i|) per step
  double lr = 0;
};

/// Trains the unsharded model `steps` SGD steps with learning rate `lr`.
Reference computeReference(const ModelCase& c, int steps, double lr);

/// The loss of output leaves (see the file comment).
at::Tensor lossOf(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& weights);

/// "" when |got - want| <= rtol * max|want| (+1e-30) everywhere, else a one-line description.
std::string compareTensors(const at::Tensor& got, const at::Tensor& want, double rtol);

/// Forks `world` ranks running `body(rank)`, whose return value is the exit code (0 = pass). The
/// returned strings hold one line per failed rank ("rank 2 exited 1", "rank 1 timed out").
std::vector<std::string> runRanks(int world, const std::function<int(int rank)>& body,
                                  int timeout_s = 120);

/// A fresh path `name` under <tmp>/apc_<test>_<pid>/ (removed if present; its parent created).
std::filesystem::path scratchDir(const std::string& test, const std::string& name);

/// One rank's failures, each printed to stderr as "rank <r>: <what>".
class RankLog {
 public:
  explicit RankLog(int rank) : rank_(rank) {}
  void fail(const std::string& what);
  int failures() const { return failures_; }
  int exitCode() const { return failures_ == 0 ? 0 : 1; }

 private:
  int rank_;
  int failures_ = 0;
};

/// This rank's ParallelModule from the artifact `dir`, holding the full weights `init`; nullptr
/// (the failure logged) when either step fails. Sets one intra-op thread (ranks share the cores).
std::shared_ptr<ParallelModule> loadRank(const std::string& dir,
                                         const std::map<std::string, at::Tensor>& init,
                                         RankLog& log);
/// The same with load options (overlap, buckets).
std::shared_ptr<ParallelModule> loadRank(const std::string& dir,
                                         const std::map<std::string, at::Tensor>& init,
                                         RankLog& log, const ParallelModuleOptions& options);

/// This rank's piece of every full input.
std::vector<c10::IValue> shardInputs(const ParallelModule& pm, const std::vector<at::Tensor>& full);

/// Every parameter's full gradient (gathered, collective) against `want` within `rtol`.
void expectGradsMatch(ParallelModule& pm, const std::map<std::string, at::Tensor>& want,
                      double rtol, RankLog& log);

/// The number of ranks of a mesh written "2x4".
int worldOf(const std::string& mesh);

/// `text` as a GoogleTest parameter name: every character but letters and digits becomes '_'.
std::string paramName(std::string text);

/// Training step `step` of a rank against the reference: gathers the forward's output `leaves`,
/// compares them with the reference's at step 0, and takes lossOf with the reference's weights,
/// compared with the reference's loss of that step; failures go to `log`. Returns the loss (call
/// backward on it), undefined when the program's output leaves are not the model's (logged).
at::Tensor checkedStepLoss(ParallelModule& pm, const std::vector<c10::IValue>& leaves,
                           const Reference& ref, int step, double rtol, RankLog& log);

}  // namespace apc::runtime::testing
