//===- tests/runtime/data_test.cpp - Training data read per rank ------------===//
//
// apc/runtime/data.h and apc-train --data:
//  - DataSource on forked ranks: each rank's batch is exactly ParallelModule::shardInput of the
//    whole batch (fullBatch), the gathered targets are the whole batch's, every row of a token
//    batch is a window of the file (inputs = its first T ids, targets = its last T), batches are a
//    function of (seed, step), and a rank read exactly the bytes of its rows (half the batch under
//    a batch-sharded input, all of it under a replicated one);
//  - apc-train --data on 2 ranks against the unsharded model trained on the same batches
//    (--compare-single: equal losses), and an exact resume (2 steps, save, resume, 2 steps = 4
//    straight, with the data file);
//  - bad files: one line naming the file, every rank exits 2.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/run_command.h"
#include "apc/runtime/data.h"
#include "apc/runtime/parallel_module.h"
#include "rank_harness.h"

namespace apc::runtime::data_test {  // its own: the runtime tests are one unity build
namespace {

namespace fs = std::filesystem;
using testing::ModelCase;

const ModelCase kLlama{"llama_tiny", {"tokens:i64[8,8]"}, 256, ""};
const ModelCase kMlp{"mlp_stack", {"x:f32[8,4,128]"}, 0, ""};

fs::path scratch(const std::string& name) {
  return testing::scratchDir("data", name);
}

bool haveSample(const ModelCase& m) {
  return fs::exists(testing::samplePath(m.model));
}

/// `n` uint16 token ids below `vocab` (a fixed generator) written as nanoGPT does (np.uint16).
at::Tensor writeTokens(const fs::path& path, int64_t n, int64_t vocab) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = at::randint(0, vocab, {n}, g, at::kLong);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<uint16_t>(ids[i].item<int64_t>());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * 2));
  return ids;
}

/// A safetensors file of `tensors` (contiguous CPU F32 or I64), as safetensors.torch.save_file
/// writes it.
void writeSafetensors(const fs::path& path, const std::map<std::string, at::Tensor>& tensors) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  int64_t off = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t n = static_cast<int64_t>(t.nbytes());
    h[name] = {{"dtype", t.scalar_type() == at::kFloat ? "F32" : "I64"},
               {"shape", t.sizes().vec()},
               {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << text;
  for (const auto& [name, t] : tensors)
    out.write(static_cast<const char*>(t.contiguous().const_data_ptr()),
              static_cast<std::streamsize>(t.nbytes()));
}

struct PieceCase {
  std::string strategy;
  bool batch_sharded;  // the input is S(0) on the mesh: each rank reads half the rows
};

class DataSourceRanks : public ::testing::TestWithParam<PieceCase> {};

TEST_P(DataSourceRanks, EachRankReadsItsPieceOfTheBatchAndOnlyIt) {
  if (!haveSample(kLlama)) GTEST_SKIP() << "run sample_models/generate.py";
  const PieceCase& c = GetParam();
  const fs::path art = scratch("pieces_" + c.strategy), tokens = scratch("tokens.bin");
  std::string err = testing::makeArtifact(kLlama, "2", c.strategy, art.string());
  ASSERT_TRUE(err.empty()) << err;
  const at::Tensor ids = writeTokens(tokens, 5000, 256);
  const at::Tensor windows = ids.unfold(0, 9, 1);  // every window of T + 1 = 9 ids
  auto failed = testing::runRanks(2, [&](int rank) {
    testing::RankLog log(rank);
    at::set_num_threads(1);
    auto pm = ParallelModule::load(art.string());
    if (!pm.ok()) return log.fail(pm.error().message()), 1;
    auto data = DataSource::open(**pm, tokens.string(), {"uint16", /*seed=*/3, 0});
    if (!data.ok()) return log.fail(data.error().message()), 1;
    for (int64_t step = 0; step < 3; ++step) {
      auto b = (*data)->batch(step);
      auto whole = (*data)->fullBatch(step);
      if (!b.ok() || !whole.ok()) return log.fail("batch failed"), 1;
      const at::Tensor x = whole->inputs[0].toTensor(), y = whole->targets;
      if (!b->inputs[0].toTensor().equal((*pm)->shardInput(0, x)))
        log.fail("step " + std::to_string(step) + ": the piece is not shardInput's");
      if (!b->targets.equal(y)) log.fail("the gathered targets are not the batch's");
      for (int64_t r = 0; r < x.size(0); ++r) {
        const at::Tensor w = at::cat({x[r].slice(0, 0, 1), y[r]});
        if (!windows.eq(w).all(1).any().item<bool>())
          log.fail("row " + std::to_string(r) + " is not a window of the file");
        if (!x[r].slice(0, 1).equal(y[r].slice(0, 0, 7))) log.fail("targets are not shifted");
      }
      auto again = (*data)->fullBatch(step);
      if (!again->inputs[0].toTensor().equal(x)) log.fail("a step's batch changed");
    }
    auto b0 = (*data)->fullBatch(0), b1 = (*data)->fullBatch(1);
    if (b0->inputs[0].toTensor().equal(b1->inputs[0].toTensor())) log.fail("steps share a batch");
    // 3 steps of (B rows on this rank) windows of 9 uint16 ids.
    const int64_t rows = c.batch_sharded ? 4 : 8;
    if ((*data)->bytesRead() != 3 * rows * 9 * 2)
      log.fail("read " + std::to_string((*data)->bytesRead()) + " bytes, want " +
               std::to_string(3 * rows * 9 * 2));
    return log.exitCode();
  });
  EXPECT_TRUE(failed.empty()) << failed.front();
  fs::remove_all(art);
  fs::remove(tokens);
}

INSTANTIATE_TEST_SUITE_P(Data, DataSourceRanks,
                         ::testing::Values(PieceCase{"fsdp", true}, PieceCase{"tp", false}),
                         [](const ::testing::TestParamInfo<PieceCase>& info) {
                           return info.param.strategy;
                         });

// A tensor file: rows of inputs and class labels; the pieces are shardInput's, the labels the
// batch's rows.
TEST(DataSource, TensorFileRowsArePiecesOfTheBatch) {
  if (!haveSample(kMlp)) GTEST_SKIP() << "run sample_models/generate.py";
  const fs::path art = scratch("rows_art"), file = scratch("rows.safetensors");
  std::string err = testing::makeArtifact(kMlp, "2", "fsdp", art.string());
  ASSERT_TRUE(err.empty()) << err;
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor inputs = at::randn({40, 4, 128}, g), labels = at::randint(0, 128, {40, 4}, g);
  writeSafetensors(file, {{"inputs", inputs}, {"labels", labels}});
  auto failed = testing::runRanks(2, [&](int rank) {
    testing::RankLog log(rank);
    at::set_num_threads(1);
    auto pm = ParallelModule::load(art.string());
    if (!pm.ok()) return log.fail(pm.error().message()), 1;
    auto data = DataSource::open(**pm, file.string(), {"uint16", 5, 0});
    if (!data.ok()) return log.fail(data.error().message()), 1;
    auto b = (*data)->batch(2);
    auto whole = (*data)->fullBatch(2);
    const at::Tensor x = whole->inputs[0].toTensor();
    if (!b->inputs[0].toTensor().equal((*pm)->shardInput(0, x))) log.fail("not shardInput's piece");
    if (!b->targets.equal(whole->targets)) log.fail("targets differ from the batch's");
    for (int64_t r = 0; r < x.size(0); ++r) {
      // The file's row that holds this input row carries this row's labels.
      const at::Tensor match = inputs.eq(x[r]).flatten(1).all(1).nonzero();
      if (match.numel() == 0) {
        log.fail("row " + std::to_string(r) + " is not a row of the file");
        continue;
      }
      if (!labels[match[0][0].item<int64_t>()].equal(whole->targets[r])) log.fail("labels differ");
    }
    const int64_t want = 4 * (4 * 128 * 4 + 4 * 8);  // 4 rows of inputs (f32) and labels (i64)
    if ((*data)->bytesRead() != want)
      log.fail("read " + std::to_string((*data)->bytesRead()) + ", want " + std::to_string(want));
    return log.exitCode();
  });
  EXPECT_TRUE(failed.empty()) << failed.front();
  fs::remove_all(art);
  fs::remove(file);
}

// --- apc-train --data ----------------------------------------------------------------------------

std::string trainBinary() {
  return std::string(APC_BINARY_DIR) + "/tools/apc-train";
}

apc::testing::CommandResult train(const fs::path& artifact, const std::string& flags) {
  return apc::testing::runCommand(testing::apcBinary() + " run " + artifact.string() +
                                  " --nproc 2 --timeout 300 -- " + trainBinary() + " " +
                                  artifact.string() + " " + flags);
}

std::vector<std::string> stepLines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("step ", 0) == 0) lines.push_back(line);
  return lines;
}

/// Every "step n loss x single y" line: x equals y within `rtol`; returns the number of lines.
size_t expectLossesMatchSingle(const std::string& out, double rtol) {
  size_t n = 0;
  for (const std::string& l : stepLines(out)) {
    int step = -1;
    double x = 0, y = 0;
    EXPECT_EQ(std::sscanf(l.c_str(), "step %d loss %lf single %lf", &step, &x, &y), 3) << l;
    EXPECT_NEAR(x, y, rtol * std::abs(y)) << l;
    ++n;
  }
  return n;
}

TEST(DataTrain, TokenFileTrainsAsTheSingleModelAndResumesExactly) {
  if (!haveSample(kLlama)) GTEST_SKIP() << "run sample_models/generate.py";
  const fs::path art = scratch("train_art"), tokens = scratch("train.bin"), a = scratch("ckpt_a"),
                 b = scratch("ckpt_b");
  std::string err = testing::makeArtifact(kLlama, "2", "fsdp", art.string());
  ASSERT_TRUE(err.empty()) << err;
  writeTokens(tokens, 20000, 256);
  const std::string data = " --data " + tokens.string() + " --lr 0.01 --optimizer adamw";
  auto single =
      train(art, "--steps 3 --compare-single " + testing::samplePath(kLlama.model) + data);
  ASSERT_EQ(single.code, 0) << single.err;
  EXPECT_EQ(expectLossesMatchSingle(single.out, 1e-4), 3u) << single.out;
  EXPECT_NE(single.err.find("20000 uint16 token ids"), std::string::npos) << single.err;

  auto straight = train(art, "--steps 4 --save " + a.string() + data);
  ASSERT_EQ(straight.code, 0) << straight.err;
  auto first = train(art, "--steps 2 --save " + b.string() + data);
  ASSERT_EQ(first.code, 0) << first.err;
  auto second = train(art, "--steps 4 --resume " + b.string() + " --save " + b.string() + data);
  ASSERT_EQ(second.code, 0) << second.err;
  std::vector<std::string> got = stepLines(first.out);
  for (const std::string& l : stepLines(second.out)) got.push_back(l);
  EXPECT_EQ(got, stepLines(straight.out)) << straight.out << first.out << second.out;
  EXPECT_EQ(got.size(), 4u);
  // Synthetic data resumed with --data (or the reverse) is refused: the batches would differ.
  auto mixed = train(art, "--steps 4 --resume " + b.string() + " --lr 0.01 --optimizer adamw");
  EXPECT_NE(mixed.code, 0);
  EXPECT_NE(mixed.err.find("this run has no --data"), std::string::npos) << mixed.err;
  for (const fs::path& d : {art, a, b}) fs::remove_all(d);
  fs::remove(tokens);
}

TEST(DataTrain, TensorFileTrainsAsTheSingleModel) {
  if (!haveSample(kMlp)) GTEST_SKIP() << "run sample_models/generate.py";
  const fs::path art = scratch("tensor_art"), file = scratch("train.safetensors");
  std::string err = testing::makeArtifact(kMlp, "2", "ddp", art.string());
  ASSERT_TRUE(err.empty()) << err;
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(2);
  writeSafetensors(
      file, {{"inputs", at::randn({64, 4, 128}, g)}, {"targets", at::randint(0, 128, {64, 4}, g)}});
  auto r = train(art, "--steps 3 --lr 0.1 --data " + file.string() + " --compare-single " +
                          testing::samplePath(kMlp.model));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(expectLossesMatchSingle(r.out, 1e-4), 3u) << r.out;
  fs::remove_all(art);
  fs::remove(file);
}

/// A bad data file: apc-train fails on every rank with exit 2 and one line naming the file and
/// containing `what`.
class DataErrors : public ::testing::Test {
 protected:
  void expectOneLineError(const ModelCase& m, const fs::path& file, const std::string& what,
                          const std::string& flags = "") {
    if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
    const fs::path art = scratch("err_art_" + m.model);
    if (!fs::exists(art / "manifest.json")) {
      std::string err = testing::makeArtifact(m, "2", "fsdp", art.string());
      ASSERT_TRUE(err.empty()) << err;
    }
    auto r = train(art, "--steps 2 --data " + file.string() + " " + flags);
    EXPECT_NE(r.code, 0);
    EXPECT_TRUE(stepLines(r.out).empty()) << r.out;
    EXPECT_NE(r.err.find("exited with status 2"), std::string::npos) << r.err;
    std::istringstream in(r.err);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      if (line.rfind("apc-train: error: ", 0) != 0) continue;
      ++lines;
      EXPECT_NE(line.find(file.string()), std::string::npos) << r.err;
      EXPECT_NE(line.find(what), std::string::npos) << r.err;
    }
    EXPECT_GE(lines, 1) << r.err;
  }
};

TEST_F(DataErrors, TooShortForOneWindow) {
  const fs::path f = scratch("short.bin");
  writeTokens(f, 8, 256);  // T = 8 needs 9
  expectOneLineError(kLlama, f, "too few for one window of 9");
}

TEST_F(DataErrors, NotAWholeNumberOfIds) {
  const fs::path f = scratch("odd.bin");
  writeTokens(f, 1000, 256);
  fs::resize_file(f, 1999);
  expectOneLineError(kLlama, f, "1999 bytes is not a whole number of uint16 token ids");
  expectOneLineError(kLlama, f, "not a whole number of int32", "--data-dtype int32");
}

TEST_F(DataErrors, IdsBeyondTheEmbedding) {
  const fs::path f = scratch("vocab.bin");
  writeTokens(f, 1000, 60000);
  expectOneLineError(kLlama, f, "is not below the 256 rows of the embedding");
}

TEST_F(DataErrors, MissingTensorNamesAndShapes) {
  const fs::path f = scratch("names.safetensors");
  writeSafetensors(f, {{"x", at::zeros({4, 4, 128})}, {"y", at::zeros({4, 4}, at::kLong)}});
  expectOneLineError(kMlp, f,
                     "needs tensors \"inputs\" and \"targets\" (or \"labels\"); it has x, y");
  writeSafetensors(f,
                   {{"inputs", at::zeros({4, 4, 64})}, {"labels", at::zeros({4, 4}, at::kLong)}});
  expectOneLineError(kMlp, f, "inputs is [4, 4, 64]");
  writeSafetensors(f, {{"inputs", at::zeros({4, 4, 128})}, {"labels", at::zeros({3}, at::kLong)}});
  expectOneLineError(kMlp, f, "labels is [3]");
  // A token file for a model whose input is not token ids.
  const fs::path t = scratch("tokens_for_mlp.bin");
  writeTokens(t, 1000, 256);
  expectOneLineError(kMlp, t, "a token file feeds one integer input [B, T]");
}

}  // namespace
}  // namespace apc::runtime::data_test
