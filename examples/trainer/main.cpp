// A C++ trainer over an apc artifact, built against the installed package (CMakeLists.txt here).
// One process per rank: `apc run DIR -- ./trainer DIR STEPS [DATA [CKPT]]`, or torchrun
// --no-python.
//   DATA  token ids (nanoGPT's train.bin, uint16) or a .safetensors file of "inputs" and "targets"
//         (apc/runtime/data.h): each rank reads its piece of every batch; "-": one synthetic batch.
//   CKPT  resume from its newest complete checkpoint, if any, and save one after every step.
#include <ATen/ATen.h>
#include <apc/runtime/checkpoint.h>
#include <apc/runtime/data.h>
#include <apc/runtime/optimizer.h>
#include <apc/runtime/parallel_module.h>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

using namespace apc::runtime;

int fail(const apc::Error& e) {
  std::fprintf(stderr, "trainer: %s\n", e.message().c_str());
  return 2;
}

/// One batch drawn once, the same on every rank (no DATA): SGD on it must lower the loss.
Batch syntheticBatch(const ParallelModule& pm) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(0);
  Batch b;
  for (size_t i = 0; i < pm.inputSpecs().size(); ++i) {
    const PlacedTensor& in = pm.inputSpecs()[i];
    b.inputs.emplace_back(
        pm.shardInput(i, at::isFloatingType(in.dtype)
                             ? at::randn(in.global_shape, gen).to(in.dtype)
                             : at::randint(pm.inputIndexBound(i), in.global_shape, gen)));
  }
  return b;
}

int main(int argc, char** argv) {
  if (argc < 3) return std::fprintf(stderr, "usage: trainer ARTIFACT_DIR STEPS [DATA [CKPT]]\n"), 2;
  const int steps = std::stoi(argv[2]);
  const std::string data_path = argc > 3 ? argv[3] : "-", ckpt = argc > 4 ? argv[4] : "";

  // 1. This rank's program (RANK, WORLD_SIZE, MASTER_ADDR... from the launcher), its weights
  //    (drawn per piece, so replicated pieces agree on every rank) and an optimizer over its
  //    shards.
  auto loaded = ParallelModule::load(argv[1]);
  if (!loaded.ok()) return fail(loaded.error());
  ParallelModule& pm = **loaded;
  pm.init_weights([](const PlacedTensor& t, at::Tensor& local) {
    size_t seed = std::hash<std::string>{}(t.name);
    for (const auto& piece : t.local) seed = seed * 31 + static_cast<size_t>(piece.offset);
    local.normal_(0, 0.02, at::make_generator<at::CPUGeneratorImpl>(seed));
  });
  Optimizer opt({"sgd", 0.1}, pm.parameters());

  // 2. The data: batch(step) reads this rank's rows of the step's batch (drawn from seed and step).
  std::unique_ptr<DataSource> data;
  if (data_path != "-") {
    auto opened = DataSource::open(pm, data_path, DataOptions{"uint16", /*seed=*/0});
    if (!opened.ok()) return fail(opened.error());
    data = std::move(opened).value();
  }
  const Batch fixed = data ? Batch{} : syntheticBatch(pm);

  // 3. Resume: shards, optimizer state and step from the newest complete checkpoint.
  int64_t step = 0;
  if (auto dir = findCheckpoint(ckpt); !ckpt.empty() && dir.ok()) {  // none yet: a fresh run
    auto state = loadCheckpoint(pm, &opt, *dir);
    if (!state.ok()) return fail(state.error());
    step = state->step;
  }

  // 4. Train: forward on the local pieces, the loss on the gathered output, backward, step, save.
  for (; step < steps; ++step) {
    apc::Expected<Batch> batch = data ? data->batch(step) : apc::Expected<Batch>(fixed);
    if (!batch.ok()) return fail(batch.error());
    auto out = pm.forwardLeaves(batch->inputs);
    if (!out.ok()) return fail(out.error());
    at::Tensor full = pm.gatherOutput(0, (*out)[0].toTensor());
    at::Tensor loss = data ? dataLoss(full, batch->targets) : full.to(at::kFloat).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (pm.rank() == 0) std::printf("step %lld loss %.6f\n", (long long)step, loss.item<double>());
    if (!ckpt.empty()) {
      auto saved = saveCheckpoint(pm, &opt, TrainingState{step + 1}, ckpt);
      if (!saved.ok()) return fail(saved.error());
    }
  }
}
