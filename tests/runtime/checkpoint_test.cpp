//===- tests/runtime/checkpoint_test.cpp - Sharded checkpoints end to end ---===//
//
// apc-train under `apc run` on 2 ranks, saving and resuming (apc/runtime/checkpoint.h):
//  - exact resume: 4 steps straight, or 2 steps, save, a new process resumes, 2 more steps; the
//    step lines are equal as text (bit-exact losses on CPU) and the checkpoints after step 4 are
//    byte-identical files (weights, optimizer state, manifest). SGD with momentum and AdamW, on
//    mlp_stack and llama_tiny, under ddp and fsdp; and random_ops (dropout in training) under
//    fsdp, whose resumed run draws the straight run's masks.
//  - a damaged or mismatched checkpoint is a one-line error per rank naming the file;
//  - resharding: a checkpoint of one plan or mesh resumed under another (fsdp on [4] into the
//    optimizer's plan on 2x2, 2x2 into ddp on [2], tp on [2] into fsdp+tp on 2x2) continues the
//    run: the same loss, and the same full weights and momentum after one more step;
//    rank 0 reads exactly the bytes of its own shards (byte ranges of the saved pieces);
//  - a save killed part way (a step directory without manifest.json) is passed over; a save on a
//    full disk (a file size limit: EFBIG) is one line per rank, exit 2, and leaves the previous
//    checkpoint the newest complete one;
//  - Python reads the checkpoints with safetensors, and with torch and json alone
//    (read_checkpoint.py): the full tensors of a ddp and an fsdp run of the same training are
//    equal, under the model's own names and shapes, and equal to what `apc export` writes; a
//    state dict Python saved with safetensors initializes the shards like the model file.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/run_command.h"
#include "apc/runtime/checkpoint.h"
#include "rank_harness.h"

namespace apc::runtime {
namespace {

namespace fs = std::filesystem;
using testing::ModelCase;

const ModelCase kMlp{"mlp_stack", {"x:f32[8,4,128]"}, 0, ""};
const ModelCase kLlama{"llama_tiny", {"tokens:i64[8,8]"}, 256, ""};
// Dropout in training (p 0.5): a resumed run draws the masks the straight one drew (apc-train
// seeds each step's random streams from --seed and the step).
const ModelCase kRandomOps{"random_ops", {"x:f32[8,16]"}, 0, ""};

fs::path scratch(const std::string& name) {
  return testing::scratchDir("ckpt", name);
}

std::string trainBinary() {
  return std::string(APC_BINARY_DIR) + "/tools/apc-train";
}

/// apc-train on the artifact's ranks with `flags`.
apc::testing::CommandResult train(const fs::path& artifact, const std::string& flags,
                                  int nproc = 2) {
  return apc::testing::runCommand(testing::apcBinary() + " run " + artifact.string() + " --nproc " +
                                  std::to_string(nproc) + " --timeout 300 -- " + trainBinary() +
                                  " " + artifact.string() + " " + flags);
}

std::vector<std::string> stepLines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("step ", 0) == 0) lines.push_back(line);
  return lines;
}

std::string fileBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

/// The `apc-train: error:` lines of `err`.
std::vector<std::string> errorLines(const std::string& err) {
  std::vector<std::string> lines;
  std::istringstream in(err);
  std::string line;
  while (std::getline(in, line))
    if (line.find("error") != std::string::npos) lines.push_back(line);
  return lines;
}

bool haveSample(const ModelCase& m) {
  return fs::exists(testing::samplePath(m.model));
}

struct ResumeCase {
  std::string name;
  ModelCase model;
  std::string strategy;
  std::string flags;
};

void PrintTo(const ResumeCase& c, std::ostream* os) {
  *os << c.name;
}

class ExactResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ExactResume, HalfThenResumeEqualsStraight) {
  const ResumeCase& c = GetParam();
  if (!haveSample(c.model)) GTEST_SKIP() << "run sample_models/generate.py";
  const fs::path art = scratch(c.name + "_art"), a = scratch(c.name + "_a"),
                 b = scratch(c.name + "_b");
  std::string err = testing::makeArtifact(c.model, "2", c.strategy, art.string());
  ASSERT_TRUE(err.empty()) << err;
  // Straight: 4 steps, a checkpoint after 2 and after 4.
  auto straight = train(art, "--steps 4 --save " + a.string() + " --save-every 2 " + c.flags);
  ASSERT_EQ(straight.code, 0) << straight.err;
  // Two processes: 2 steps and a save; then a resume to 4.
  auto first = train(art, "--steps 2 --save " + b.string() + " " + c.flags);
  ASSERT_EQ(first.code, 0) << first.err;
  auto second =
      train(art, "--steps 4 --resume " + b.string() + " --save " + b.string() + " " + c.flags);
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_NE(second.err.find("resumed from " + (b / "step_00000002").string() + " at step 2"),
            std::string::npos)
      << second.err;

  const std::vector<std::string> want = stepLines(straight.out);
  ASSERT_EQ(want.size(), 4u) << straight.out;
  std::vector<std::string> got = stepLines(first.out);
  for (const std::string& l : stepLines(second.out)) got.push_back(l);
  EXPECT_EQ(got, want) << "straight:\n" << straight.out << "resumed:\n" << first.out << second.out;
  EXPECT_NE(want.front(), want.back()) << "the loss did not move";

  // The state after step 4: every file byte for byte.
  for (const char* f : {"rank_0.safetensors", "rank_1.safetensors", "manifest.json"}) {
    const fs::path x = a / "step_00000004" / f, y = b / "step_00000004" / f;
    ASSERT_TRUE(fs::exists(x) && fs::exists(y)) << x << " " << y;
    EXPECT_TRUE(fileBytes(x) == fileBytes(y)) << f << " differs between " << x << " and " << y;
  }
  // The optimizer's state is in the checkpoint, in the parameters' dtype.
  const std::string manifest = fileBytes(a / "step_00000004" / "manifest.json");
  if (c.flags.find("adamw") != std::string::npos) {
    EXPECT_NE(manifest.find("\"optimizer/exp_avg_sq/"), std::string::npos);
  } else {
    EXPECT_NE(manifest.find("\"optimizer/momentum_buffer/"), std::string::npos);
  }
  EXPECT_NE(manifest.find("\"steps\": 4"), std::string::npos) << manifest;
  for (const fs::path& d : {art, a, b}) fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoint, ExactResume,
    ::testing::Values(
        ResumeCase{"mlp_ddp_sgd", kMlp, "ddp", "--lr 0.1 --momentum 0.9"},
        ResumeCase{"mlp_fsdp_adamw", kMlp, "fsdp", "--optimizer adamw --lr 0.01"},
        ResumeCase{"llama_fsdp_adamw", kLlama, "fsdp", "--optimizer adamw --lr 0.01 --clip 1.0"},
        ResumeCase{"llama_ddp_sgd", kLlama, "ddp", "--lr 0.1 --momentum 0.9"},
        ResumeCase{"dropout_fsdp_sgd", kRandomOps, "fsdp", "--lr 0.1 --momentum 0.9"}),
    [](const ::testing::TestParamInfo<ResumeCase>& info) { return info.param.name; });

/// A checkpoint of mlp_stack (fsdp on 2 ranks, SGD with momentum) to damage in each test.
class CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!haveSample(kMlp)) GTEST_SKIP() << "run sample_models/generate.py";
    art_ = scratch("err_art");
    root_ = scratch("err_ckpt");
    std::string err = testing::makeArtifact(kMlp, "2", "fsdp", art_.string());
    ASSERT_TRUE(err.empty()) << err;
    auto r = train(art_, "--steps 2 --momentum 0.9 --save " + root_.string());
    ASSERT_EQ(r.code, 0) << r.err;
    dir_ = root_ / "step_00000002";
    ASSERT_TRUE(fs::exists(dir_ / "manifest.json"));
  }
  void TearDown() override {
    fs::remove_all(art_);
    fs::remove_all(root_);
  }
  /// Resumes; expects exit 2 and every error line (one per rank that saw it) to contain `what`
  /// and `file`.
  void expectOneLineError(const std::string& file, const std::string& what,
                          const std::string& flags = "--momentum 0.9",
                          const fs::path& artifact = {}) {
    auto r = train(artifact.empty() ? art_ : artifact,
                   "--steps 3 --resume " + root_.string() + " " + flags);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_TRUE(stepLines(r.out).empty()) << r.out;
    const std::vector<std::string> lines = errorLines(r.err);
    ASSERT_FALSE(lines.empty()) << r.err;
    for (const std::string& l : lines) {
      if (l.find("apc run") != std::string::npos) continue;  // the launcher's summary
      EXPECT_NE(l.find("apc-train: error: "), std::string::npos) << r.err;
      EXPECT_NE(l.find(file), std::string::npos) << r.err;
      EXPECT_NE(l.find(what), std::string::npos) << r.err;
    }
  }
  fs::path art_, root_, dir_;
};

TEST_F(CheckpointErrors, AFlippedByteIsAHashMismatchNamingTheFile) {
  const fs::path f = dir_ / "rank_1.safetensors";
  std::string bytes = fileBytes(f);
  bytes[bytes.size() - 3] = static_cast<char>(bytes[bytes.size() - 3] ^ 0x10);
  std::ofstream(f, std::ios::binary) << bytes;
  expectOneLineError(f.string(), "differs from the SHA-256");
  // apc export reads every file: the same line, exit 2.
  auto r = apc::testing::runCommand(testing::apcBinary() + " export " + root_.string() + " -o " +
                                    (root_ / "full.safetensors").string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(f.string() + ": content differs from the SHA-256"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(root_ / "full.safetensors"));
}

TEST_F(CheckpointErrors, ATruncatedFileNamesItsSize) {
  const fs::path f = dir_ / "rank_0.safetensors";
  fs::resize_file(f, fs::file_size(f) / 2);
  expectOneLineError(f.string(), "bytes, but the checkpoint's manifest.json says");
}

TEST_F(CheckpointErrors, AMissingFileIsNamed) {
  fs::remove(dir_ / "rank_1.safetensors");
  expectOneLineError((dir_ / "rank_1.safetensors").string(), "No such file");
}

TEST_F(CheckpointErrors, AManifestThatIsNotJson) {
  std::ofstream(dir_ / "manifest.json") << "{\"format\": \"apc-checkpoint\", ";
  expectOneLineError((dir_ / "manifest.json").string(), "not valid JSON");
}

// A key given twice (JSON parsers keep the last silently) names its path.
TEST_F(CheckpointErrors, AManifestWithAKeyGivenTwice) {
  std::ofstream(dir_ / "manifest.json")
      << R"({"format": "apc-checkpoint", "format_version": 1, "format_version": 2})";
  expectOneLineError((dir_ / "manifest.json").string(), "$.format_version: key given twice");
}

TEST_F(CheckpointErrors, AnotherOptimizerIsRefused) {
  expectOneLineError((dir_ / "manifest.json").string(), "holds the state of optimizer sgd",
                     "--optimizer adamw");
  expectOneLineError((dir_ / "manifest.json").string(), "holds optimizer state", "");
}

TEST_F(CheckpointErrors, AnotherModelIsRefused) {
  if (!haveSample(kLlama)) GTEST_SKIP() << "run sample_models/generate.py";
  const fs::path llama = scratch("err_art_llama");
  std::string err = testing::makeArtifact(kLlama, "2", "fsdp", llama.string());
  ASSERT_TRUE(err.empty()) << err;
  expectOneLineError((dir_ / "manifest.json").string(), "a checkpoint of another model",
                     "--momentum 0.9", llama);
  fs::remove_all(llama);
}

// A save killed part way leaves a step directory without manifest.json (the manifest is written
// last): a resume from the root takes the newest complete checkpoint, and the next save of that
// step replaces the partial directory.
TEST_F(CheckpointErrors, APartialSaveIsPassedOver) {
  const fs::path partial = root_ / "step_00000003";
  fs::create_directory(partial);
  fs::copy_file(dir_ / "rank_0.safetensors", partial / "rank_0.safetensors");
  std::ofstream(partial / ".rank_1.safetensors.tmp") << "half";
  auto r = train(art_, "--steps 4 --momentum 0.9 --resume " + root_.string() + " --save " +
                           root_.string() + " --save-every 1 --keep 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resumed from " + dir_.string() + " at step 2"), std::string::npos) << r.err;
  EXPECT_EQ(stepLines(r.out).size(), 2u) << r.out;  // steps 2 and 3
  // --keep 2: steps 3 and 4 remain, 3 complete now.
  EXPECT_FALSE(fs::exists(dir_));
  EXPECT_TRUE(fs::exists(partial / "manifest.json"));
  EXPECT_FALSE(fs::exists(partial / ".rank_1.safetensors.tmp"));
  EXPECT_TRUE(fs::exists(root_ / "step_00000004" / "manifest.json"));
}

// kill -9 while saving: the job (apc run, whose ranks die with it) saves after every step and is
// killed at a moment after its third checkpoint, often inside a save (by hand, 2 of 8 kills left a
// step directory empty or with temporary files only). A resume from the root takes the newest
// complete checkpoint, whatever the kill left, and continues exactly as a straight run.
TEST_F(CheckpointErrors, KillDuringSaveLeavesTheLastCompleteCheckpoint) {
  const fs::path root = scratch("kill_ckpt");
  auto straight = train(art_, "--steps 40 --momentum 0.9");
  ASSERT_EQ(straight.code, 0) << straight.err;
  const std::vector<std::string> want = stepLines(straight.out);
  ASSERT_EQ(want.size(), 40u);
  for (int round = 0; round < 2; ++round) {
    fs::remove_all(root);
    const std::string job = testing::apcBinary() + " run " + art_.string() +
                            " --nproc 2 --timeout 300 -- " + trainBinary() + " " + art_.string() +
                            " --steps 40 --momentum 0.9 --save " + root.string() +
                            " --save-every 1";
    auto k = apc::testing::runCommand(
        "(" + job + " >/dev/null 2>&1 & pid=$!; n=0; while [ ! -f " +
        (root / "step_00000003" / "manifest.json").string() +
        " ] && [ $n -lt 3000 ]; do sleep 0.01; n=$((n+1)); done; sleep " +
        (round == 0 ? "0.03" : "0.11") + "; kill -9 $pid; wait $pid; sleep 0.5)");
    (void)k;
    auto found = findCheckpoint(root.string());
    ASSERT_TRUE(found.ok()) << found.error().message();
    long long step = 0;
    ASSERT_EQ(std::sscanf(fs::path(*found).filename().string().c_str(), "step_%lld", &step), 1);
    ASSERT_GE(step, 3);
    ASSERT_LT(step, 40) << "the job ended before it was killed";
    auto r = train(art_, "--steps 40 --momentum 0.9 --resume " + root.string());
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(stepLines(r.out), std::vector<std::string>(want.begin() + step, want.end()))
        << "resumed at " << step;
  }
  fs::remove_all(root);
}

// A full disk, made here without root by a file size limit (prlimit --fsize, SIGXFSZ ignored: a
// write past the limit fails with EFBIG as one on a full disk fails with ENOSPC; the same path).
// The run resumes at step 2 and trains steps 2 and 3; its save of step 4 fails: one line per rank
// naming the rank's file, exit 2, no manifest and no temporary left. The previous checkpoint is
// still the newest complete one, and a resume from it runs steps 2 and 3 as the failed run did.
TEST_F(CheckpointErrors, AFullDiskFailsTheSaveAndKeepsThePreviousCheckpoint) {
  if (apc::testing::runCommand("prlimit --version").code != 0) GTEST_SKIP() << "no prlimit";
  const auto limit = fs::file_size(dir_ / "rank_0.safetensors") / 2;
  const std::string job = testing::apcBinary() + " run " + art_.string() +
                          " --nproc 2 --timeout 300 -- " + trainBinary() + " " + art_.string() +
                          " --steps 4 --momentum 0.9 --resume " + root_.string() + " --save " +
                          root_.string();
  auto full = apc::testing::runCommand(
      "sh -c 'trap \"\" XFSZ; exec prlimit --fsize=" + std::to_string(limit) + " " + job + "'");
  EXPECT_NE(full.code, 0) << full.out;
  EXPECT_NE(full.err.find("exited with status 2"), std::string::npos) << full.err;
  EXPECT_EQ(stepLines(full.out).size(), 2u) << full.out;
  int lines = 0;
  for (const std::string& l : errorLines(full.err)) {
    if (l.find("apc run") != std::string::npos) continue;  // the launcher's summary
    ++lines;
    EXPECT_NE(l.find("apc-train: error: " + (root_ / "step_00000004" / "rank_").string()),
              std::string::npos)
        << full.err;
    EXPECT_NE(l.find(".safetensors: write failed (File too large)"), std::string::npos) << full.err;
  }
  EXPECT_GE(lines, 1) << full.err;
  const fs::path failed = root_ / "step_00000004";
  EXPECT_FALSE(fs::exists(failed / "manifest.json"));
  if (fs::exists(failed)) {
    for (const auto& e : fs::directory_iterator(failed))
      EXPECT_NE(e.path().filename().string()[0], '.') << "temporary left: " << e.path();
  }
  auto found = findCheckpoint(root_.string());
  ASSERT_TRUE(found.ok()) << found.error().message();
  EXPECT_EQ(fs::path(*found), dir_);
  auto again = train(art_, "--steps 4 --momentum 0.9 --resume " + root_.string());
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(stepLines(again.out), stepLines(full.out));
}

// --- resharding: a checkpoint of one plan or mesh resumed under another -------------------------

/// The bytes of tensor data in a safetensors file (its size less the header).
int64_t tensorBytes(const fs::path& p) {
  const std::string bytes = fileBytes(p);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes.at(i));
  return static_cast<int64_t>(bytes.size() - 8 - header);
}

/// The bytes rank 0 read loading a checkpoint, from apc-train's "resumed from" line, or -1.
int64_t bytesReadOnResume(const std::string& err) {
  const std::string key = "rank 0 read ";
  const size_t at = err.find(key);
  return at == std::string::npos ? -1 : std::stoll(err.substr(at + key.size()));
}

struct ReshardCase {
  std::string name;
  std::string from_strategy, from_mesh;
  int from_ranks;
  std::string to_strategy, to_mesh;
  int to_ranks;
};

void PrintTo(const ReshardCase& c, std::ostream* os) {
  *os << c.name;
}

/// The loss of `step` in apc-train's output, or NaN.
double lossAt(const std::string& out, int step) {
  for (const std::string& l : stepLines(out)) {
    int s = -1;
    double x = 0;
    if (std::sscanf(l.c_str(), "step %d loss %lf", &s, &x) == 2 && s == step) return x;
  }
  return std::nan("");
}

class Reshard : public ::testing::TestWithParam<ReshardCase> {};

// Plan A trains 3 steps (checkpoints after 2 and 3); plan B resumes A's step-2 checkpoint and runs
// step 2. Step 2's loss under B (the forward of the resharded weights) equals A's, and the full
// weights and momentum buffers after step 3 (read by Python from both checkpoints) agree: the
// resharded shards and optimizer state are A's.
TEST_P(Reshard, ResumeUnderAnotherPlanContinuesTheRun) {
  const ReshardCase& c = GetParam();
  if (!haveSample(kMlp)) GTEST_SKIP() << "run sample_models/generate.py";
  const std::string python = APC_PYTHON;
  const bool have_python =
      apc::testing::runCommand(python + " -c 'import safetensors, torch'").code == 0;
  const fs::path art_a = scratch(c.name + "_art_a"), art_b = scratch(c.name + "_art_b"),
                 a = scratch(c.name + "_a"), b = scratch(c.name + "_b");
  std::string err = testing::makeArtifact(kMlp, c.from_mesh, c.from_strategy, art_a.string());
  ASSERT_TRUE(err.empty()) << err;
  err = testing::makeArtifact(kMlp, c.to_mesh, c.to_strategy, art_b.string());
  ASSERT_TRUE(err.empty()) << err;
  const std::string flags = " --lr 0.1 --momentum 0.9 --model " + testing::samplePath(kMlp.model);
  auto ra =
      train(art_a, "--steps 3 --save " + a.string() + " --save-every 2" + flags, c.from_ranks);
  ASSERT_EQ(ra.code, 0) << ra.err;
  auto rb = train(
      art_b,
      "--steps 3 --resume " + (a / "step_00000002").string() + " --save " + b.string() + flags,
      c.to_ranks);
  ASSERT_EQ(rb.code, 0) << rb.err;
  EXPECT_NE(rb.err.find("resharded from plan"), std::string::npos) << rb.err;
  // Rank 0 read exactly the bytes of its own shards (the overlaps of A's pieces with them), no
  // more: as many as it wrote of them into B's checkpoint (rank 0, at coordinate 0 of every mesh
  // dim, writes a piece of every tensor: its own).
  EXPECT_EQ(bytesReadOnResume(rb.err), tensorBytes(b / "step_00000003" / "rank_0.safetensors"))
      << rb.err;
  ASSERT_EQ(stepLines(rb.out).size(), 1u) << rb.out;
  const double want = lossAt(ra.out, 2), got = lossAt(rb.out, 2);
  EXPECT_NEAR(got, want, 1e-5 * std::abs(want)) << ra.out << rb.out;
  if (have_python) {
    auto r = apc::testing::runCommand(
        python + " " + APC_SOURCE_DIR + "/tests/runtime/read_checkpoint.py " +
        (a / "step_00000003").string() + " " + (b / "step_00000003").string() + " " +
        testing::samplePath(kMlp.model));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("ok:"), std::string::npos) << r.out << r.err;
  }
  for (const fs::path& d : {art_a, art_b, a, b}) fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(
    Checkpoint, Reshard,
    ::testing::Values(ReshardCase{"fsdp4_to_opt2x2", "fsdp", "4", 4, "", "2x2", 4},
                      ReshardCase{"opt2x2_to_ddp2", "", "2x2", 4, "ddp", "2", 2},
                      ReshardCase{"tp2_to_fsdptp2x2", "tp", "2", 2, "fsdp+tp", "2x2", 4}),
    [](const ::testing::TestParamInfo<ReshardCase>& info) { return info.param.name; });

// Python reads what C++ wrote with safetensors alone: read_checkpoint.py puts every tensor's
// pieces together and compares the full weights of a ddp and an fsdp run of the same training
// (2 SGD steps from the model's own weights), and checks they moved from the initial weights; the
// file `apc export` writes of the fsdp checkpoint holds exactly those full tensors. The reverse: a
// state dict Python saved with safetensors initializes the shards as the model file does (the
// same losses).
TEST(CheckpointPython, SafetensorsReadsTheFullTensorsAndWritesInitialWeights) {
  if (!haveSample(kMlp)) GTEST_SKIP() << "run sample_models/generate.py";
  const std::string python = APC_PYTHON;
  if (apc::testing::runCommand(python + " -c 'import safetensors, torch'").code != 0)
    GTEST_SKIP() << python << " cannot import safetensors and torch";
  std::vector<fs::path> roots, arts;
  for (const char* strategy : {"ddp", "fsdp"}) {
    const fs::path art = scratch(std::string("py_art_") + strategy),
                   root = scratch(std::string("py_ckpt_") + strategy);
    std::string err = testing::makeArtifact(kMlp, "2", strategy, art.string());
    ASSERT_TRUE(err.empty()) << err;
    auto r = train(art, "--steps 2 --lr 0.1 --model " + testing::samplePath(kMlp.model) +
                            " --save " + root.string());
    ASSERT_EQ(r.code, 0) << r.err;
    roots.push_back(root / "step_00000002");
    arts.push_back(art);
  }
  const fs::path exported = scratch("py_exported.safetensors");
  auto e = apc::testing::runCommand(testing::apcBinary() + " export " +
                                    roots[1].parent_path().string() + " -o " + exported.string());
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_NE(e.out.find("wrote " + exported.string()), std::string::npos) << e.out;
  auto r = apc::testing::runCommand(
      python + " " + APC_SOURCE_DIR + "/tests/runtime/read_checkpoint.py " + roots[0].string() +
      " " + roots[1].string() + " " + testing::samplePath(kMlp.model) + " " + exported.string());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ok:"), std::string::npos) << r.out << r.err;

  // Python -> C++: the model's state dict saved by safetensors.torch.save_file.
  const fs::path saved = scratch("py_state_dict.safetensors");
  auto w = apc::testing::runCommand(
      python +
      " -c 'import sys, torch; from safetensors.torch import save_file; "
      "save_file({k: v.contiguous() for k, v in torch.jit.load(sys.argv[1])"
      ".state_dict().items()}, sys.argv[2])' " +
      testing::samplePath(kMlp.model) + " " + saved.string());
  ASSERT_EQ(w.code, 0) << w.err;
  auto from_pt = train(arts[1], "--steps 2 --lr 0.1 --model " + testing::samplePath(kMlp.model));
  auto from_st = train(arts[1], "--steps 2 --lr 0.1 --model " + saved.string());
  ASSERT_EQ(from_pt.code, 0) << from_pt.err;
  ASSERT_EQ(from_st.code, 0) << from_st.err;
  EXPECT_EQ(stepLines(from_st.out), stepLines(from_pt.out));
  EXPECT_EQ(stepLines(from_st.out).size(), 2u) << from_st.out;
  for (const fs::path& p : roots) fs::remove_all(p.parent_path());
  for (const fs::path& p : arts) fs::remove_all(p);
  fs::remove(exported);
  fs::remove(saved);
}

}  // namespace
}  // namespace apc::runtime
