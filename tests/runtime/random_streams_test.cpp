//===- tests/runtime/random_streams_test.cpp - Random nodes on forked ranks ===//
//
// Every random node draws from a stream of (seed, forward, plan node, this rank's piece of its
// output) (ParallelModule::seedRandom, proto::Program::random_pieces). On the random_ops sample
// (dropout on a batch-split activation and on a hidden dim that tp splits; a DropConnect dropout
// of a weight, returned as output leaf 1), planned ddp, fsdp+tp and by the optimizer, on forked
// ranks:
// - the dropped weight, gathered to full on every rank, is the same on every rank and is a dropout
//   of the weight (each element 0 or twice the weight's). Before the streams every rank drew from
//   its default generator: on ddp with 5 rows on 2 ranks the first dropout drew 3 x 32 numbers on
//   one rank and 2 x 32 on the other, so the replicated second dropout drew different masks;
// - of every dropout, ranks whose programs record the same piece of its output drew the same
//   mask, and ranks with different pieces different masks (before, every piece had the same mask
//   as every other: ddp's rows of the first dropout on 8 rows);
// - seedRandom(s, 0) again redraws the first forward's numbers exactly, and the second forward
//   draws new ones.
//
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>

#include <filesystem>
#include <string>
#include <vector>

#include "apc/artifact/artifact.h"
#include "apc/runtime/parallel_module.h"
#include "rank_harness.h"

// A namespace of its own: the files of runtime_test are compiled together (unity build).
namespace apc::runtime::random_streams_test {
namespace {

using testing::ModelCase;
using testing::Reference;

/// Records the output of every aten::dropout node, in program order.
struct DropoutOutputs : Interpreter::Observer {
  std::vector<at::Tensor> outputs;
  void before(const ir::Node&, const std::vector<c10::IValue>&) override {}
  void after(const ir::Node& n, const std::vector<c10::IValue>& out,
             const std::vector<c10::IValue>&) override {
    if (n.op == "aten::dropout" && !out.empty() && out[0].isTensor())
      outputs.push_back(out[0].toTensor().detach().clone());
  }
};

struct StreamCase {
  std::string mesh;
  std::string strategy;  // "" for the optimizer's plan
  int64_t batch = 8;
};

void PrintTo(const StreamCase& c, std::ostream* os) {
  *os << c.mesh << " " << (c.strategy.empty() ? "optimizer" : c.strategy) << " batch " << c.batch;
}

std::string caseName(const StreamCase& c) {
  return testing::paramName(c.mesh + "_" + (c.strategy.empty() ? "opt" : c.strategy) + "_b" +
                            std::to_string(c.batch));
}

class RandomStreams : public ::testing::TestWithParam<StreamCase> {};

/// One forward's dropout outputs and output leaves (leaf 1, the dropped weight, gathered).
struct Forward {
  std::vector<at::Tensor> dropouts;
  at::Tensor logits;
  at::Tensor weight;
};

int runRank(int rank, const std::string& dir, const Reference& ref,
            const std::filesystem::path& out) {
  testing::RankLog log(rank);
  std::shared_ptr<ParallelModule> pm = testing::loadRank(dir, ref.init, log);
  if (!pm) return 1;
  DropoutOutputs watch;
  pm->setObserver(&watch);
  const std::vector<c10::IValue> inputs = testing::shardInputs(*pm, ref.inputs);
  auto forward = [&](Forward& f) {
    watch.outputs.clear();
    auto leaves = pm->forwardLeaves(inputs);
    if (!leaves.ok() || leaves->size() != 2) {
      log.fail("forward: " +
               (leaves.ok() ? std::string("not 2 output leaves") : leaves.error().message()));
      return false;
    }
    f.dropouts = watch.outputs;
    f.logits = (*leaves)[0].toTensor().detach();
    f.weight = pm->gatherOutput(1, (*leaves)[1].toTensor()).detach();
    return true;
  };
  Forward first, second, again;
  pm->seedRandom(11, 0);
  if (!forward(first) || !forward(second)) return 1;
  pm->seedRandom(11, 0);
  if (!forward(again)) return 1;
  pm->setObserver(nullptr);
  if (first.dropouts.size() != 2) {
    log.fail("the program ran " + std::to_string(first.dropouts.size()) + " dropouts, not 2");
    return 1;
  }
  if (!first.logits.equal(again.logits) || !first.weight.equal(again.weight))
    log.fail("seedRandom(11, 0) again did not redraw the first forward's numbers");
  if (first.weight.equal(second.weight) || first.dropouts[0].eq(0).equal(second.dropouts[0].eq(0)))
    log.fail("the second forward drew the first one's masks");
  // A dropout of the weight: every element 0 or weight / (1 - p).
  const at::Tensor mix = ref.init.at("mix");
  const at::Tensor kept = first.weight.ne(0);
  if (!first.weight.masked_select(kept).allclose(mix.masked_select(kept) * 2, 1e-6, 1e-7))
    log.fail("the dropped weight is not a dropout of the weight");
  const double dropped = 1.0 - kept.to(at::kDouble).mean().item<double>();
  if (dropped < 0.2 || dropped > 0.8)
    log.fail("the weight's dropout dropped " + std::to_string(dropped) + " of it at p = 0.5");
  // The pieces this rank's program records for its random nodes (the dropouts, in order).
  Expected<proto::Program> program = artifact::readProgram(dir, rank);
  if (!program.ok() || program->random_pieces_size() != 2) {
    log.fail("the program does not record 2 random pieces");
    return 1;
  }
  const at::Tensor pieces = at::tensor({static_cast<int64_t>(program->random_pieces(0)),
                                        static_cast<int64_t>(program->random_pieces(1))});
  torch::save(std::vector<at::Tensor>{first.weight, pieces, first.dropouts[0].eq(0),
                                      first.dropouts[1].eq(0)},
              (out / ("rank" + std::to_string(rank) + ".pt")).string());
  return log.exitCode();
}

TEST_P(RandomStreams, ReplicasDrawAlikePiecesApartAndSeedsRepeat) {
  const StreamCase& c = GetParam();
  const ModelCase model{"random_ops", {"x:f32[" + std::to_string(c.batch) + ",16]"}, 0, ""};
  if (!std::filesystem::exists(testing::samplePath(model.model)))
    GTEST_SKIP() << "run sample_models/generate.py";
  const std::filesystem::path dir = testing::scratchDir("rng", caseName(GetParam()));
  const std::string err = testing::makeArtifact(model, c.mesh, c.strategy, dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const Reference ref = testing::computeReference(model, 1, 0.0);
  const std::filesystem::path out = testing::scratchDir("rng", caseName(GetParam()) + "_out");
  std::filesystem::create_directories(out);
  const int world = testing::worldOf(c.mesh);
  for (const std::string& f :
       testing::runRanks(world, [&](int rank) { return runRank(rank, dir.string(), ref, out); }))
    ADD_FAILURE() << f;
  std::vector<std::vector<at::Tensor>> saved(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::filesystem::path file = out / ("rank" + std::to_string(r) + ".pt");
    if (!std::filesystem::exists(file)) return;  // that rank failed (reported above)
    torch::load(saved[static_cast<size_t>(r)], file.string());
  }
  int cut = 0;  // rank pairs holding different pieces of a dropout's output
  for (size_t r = 0; r < saved.size(); ++r) {
    EXPECT_TRUE(saved[r][0].equal(saved[0][0]))
        << "rank " << r << "'s dropped weight differs from rank 0's";
    for (size_t q = 0; q < r; ++q)
      for (int64_t k = 0; k < 2; ++k) {
        const at::Tensor& a = saved[q][static_cast<size_t>(2 + k)];
        const at::Tensor& b = saved[r][static_cast<size_t>(2 + k)];
        const bool same_mask = a.sizes() == b.sizes() && a.equal(b);
        if (saved[q][1][k].item<int64_t>() == saved[r][1][k].item<int64_t>()) {
          EXPECT_TRUE(same_mask) << "dropout " << k << ": ranks " << q << " and " << r
                                 << " hold the same piece and drew different masks";
        } else {
          ++cut;
          EXPECT_FALSE(same_mask) << "dropout " << k << ": ranks " << q << " and " << r
                                  << " hold different pieces and drew the same mask";
        }
      }
  }
  // Every case here cuts a dropout's output (the batch, on the data-parallel dims).
  EXPECT_GT(cut, 0) << "no dropout output was cut: the case shows nothing about pieces";
}

INSTANTIATE_TEST_SUITE_P(RandomOps, RandomStreams,
                         ::testing::Values(StreamCase{"2", "ddp", 5}, StreamCase{"2", "ddp", 8},
                                           StreamCase{"2x2", "", 8},
                                           StreamCase{"2x2", "fsdp+tp", 8}),
                         [](const ::testing::TestParamInfo<StreamCase>& i) {
                           return caseName(i.param);
                         });

}  // namespace
}  // namespace apc::runtime::random_streams_test
