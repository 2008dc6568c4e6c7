//===- tests/plan/memory_measured_test.cpp - Predicted against measured peaks -===//
//
// The plan's predicted peak memory per rank (apc/plan/memory.h) against the peak apc-train
// --profile measures on 2 CPU ranks (apc's host caching allocator counts the tensor bytes), for
// plans that hold memory differently: DDP (replicated parameters, bucketed gradients), FSDP
// (sharded parameters gathered and freed), and the optimizer's plan of a LLaMA-like decoder. The
// issue's target is 10% (scripts/bench_memory.sh prints the figures); the test allows 20%, so
// that allocator noise does not fail it, while a model that misses a whole class of tensors (the
// optimizer state, the saved activations, the gradients) does. It also checks that the
// artifact carries the plan's estimates.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "../common/run_command.h"

namespace {

namespace fs = std::filesystem;
using apc::testing::kApc;
using apc::testing::kApcTrain;
using apc::testing::kSamples;
using apc::testing::runCommand;

class MeasuredMemory : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(APC_HAVE_CLI) || !defined(APC_HAVE_TRAIN)
    GTEST_SKIP() << "apc and apc-train are not built (APC_WITH_TORCH=OFF)";
#endif
    if (!fs::exists(kSamples + "mlp_stack.pt")) GTEST_SKIP() << "run sample_models/generate.py";
    dir_ = fs::temp_directory_path() /
           ("apc_memory_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  /// Plans `model` on 2 ranks with `flags`, trains 2 steps with --profile --json under
  /// `optimizer` (and `train_flags`), and checks the predicted peak against the measured one.
  void check(const std::string& model, const std::string& flags, const std::string& optimizer,
             const std::string& train_flags = "", double tolerance = 0.2) {
    const std::string art = (dir_ / "art").string(), plan = (dir_ / "plan.json").string();
    auto p = runCommand(kApc + " plan " + kSamples + model + " --mesh 2 --device cpu -q -o " +
                        plan + " --artifact " + art + " " + flags);
    ASSERT_EQ(p.code, 0) << p.err;
    auto r = runCommand(kApc + " run " + art + " -- " + kApcTrain + " " + art +
                        " --steps 2 --profile --json --threads 1 --optimizer " + optimizer + " " +
                        train_flags);
    ASSERT_EQ(r.code, 0) << r.err;
    const size_t brace = r.out.rfind("\n{");
    const std::string line = r.out.substr(brace == std::string::npos ? 0 : brace + 1);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    ASSERT_TRUE(j["predicted_peak_memory_bytes"].is_number()) << line;
    const double measured = j["peak_memory_bytes"].get<double>();
    const double predicted = j["predicted_peak_memory_bytes"].get<double>();
    ASSERT_GT(measured, 0) << line;
    EXPECT_LE(std::abs(predicted - measured) / measured, tolerance)
        << model << " " << flags << " " << optimizer << ": predicted " << predicted
        << " bytes, measured " << measured << "\n"
        << line;
    // Every phase was measured and predicted.
    for (const char* phase : {"forward", "loss", "backward", "optimizer"}) {
      EXPECT_GT(j["peak_memory_by_phase_bytes"][phase].get<double>(), 0) << phase;
      EXPECT_GT(j["predicted_peak_memory_by_phase_bytes"][phase].get<double>(), 0) << phase;
    }
  }

  fs::path dir_;
};

TEST_F(MeasuredMemory, DdpWithAdamW) {
  check("mlp_stack.pt", "--strategy ddp", "adamw");
}

// The runtime gathers, re-gathers and reduce-scatters FSDP's parameters by group
// (artifact::paramGatherGroups: here two groups of two layers), which the model follows
// (plan::GatherGroup, given by lowering): predicted 9.4 MiB against 8.9 measured (+5%); 17% to
// 29% below before the model followed the groups. The measured peak was 8.9 or 10.4 MiB from run
// to run until the communicator freed each collective's buffers on the caller's thread before
// returning (c10d_comm.cpp, releaseWork). Allowed 10%.
TEST_F(MeasuredMemory, FsdpWithSgd) {
  check("mlp_stack.pt", "--strategy fsdp", "sgd", "", 0.10);
}

// On the CPU device the cost model sends the gradients of resnet_bottleneck's 1 MiB convolution
// weights back by a reduce-scatter and an all-gather (cheaper than Gloo's all-reduce there), so
// lowering does not bucket them: they are reduced as they arrive. The model held them for the
// end-of-backward buckets as every replicated parameter's: predicted 46.2 MiB against 41.9
// measured (+10.2%); -1.4% since it asks the cost model which gradients are one all-reduce and
// counts the others' collectives' temporaries. Allowed 5%.
TEST_F(MeasuredMemory, DdpWithGradientsReducedOutsideTheBuckets) {
  check("resnet_bottleneck.pt", "--strategy ddp", "sgd", "", 0.05);
}

// resnet_bottleneck's FSDP plan on the CPU device reduces each block's gradients by one all-reduce
// of their concatenation, held until the end of backward: one buffer per block (Gloo all-reduces
// in place, and the communicator's reduce-scatter is an all-reduce of its own copy), where the
// model counted two, Gloo's own reduce-scatter's: predicted 51.1 MiB against 41.4 measured
// (+23%), now 42.3 (+2.1%). Allowed 10%: the forward's gathers are issued ahead, and Gloo makes
// its flat copy of one (up to 3.6 MB here) on its own thread while the step computes.
TEST_F(MeasuredMemory, FsdpHoldsOneBufferPerPendingReduction) {
  check("resnet_bottleneck.pt", "--strategy fsdp", "sgd", "", 0.10);
}

// Every repeated layer checkpointed: a segment's recomputation hands its replicated parameters'
// gradients to the end-of-backward buckets (ddp) and gathers and reduces its sharded ones by
// gather group (fsdp), as the forward's edges would. The model counted the checkpointed ddp
// gradients as reduced one by one during the recompute, which the runtime did until then:
// predicted 5.76 MiB against 8.41 measured once the runtime bucketed them (-32%), -0.3% since.
// Allowed 5% and 10%.
TEST_F(MeasuredMemory, DdpWithCheckpointedLayers) {
  check("mlp_stack.pt", "--strategy ddp --checkpoint all", "sgd", "", 0.05);
}

TEST_F(MeasuredMemory, FsdpWithCheckpointedLayers) {
  check("mlp_stack.pt", "--strategy fsdp --checkpoint all", "sgd", "", 0.10);
}

TEST_F(MeasuredMemory, OptimizersPlanOfADecoder) {
  check("llama_tiny.pt", "", "adamw");
}

}  // namespace
