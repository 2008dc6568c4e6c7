// A C++ trainer over an apc artifact, built against the installed package (CMakeLists.txt here).
// One process per rank: `apc run DIR -- ./trainer DIR 5`, or torchrun --no-python.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <apc/runtime/parallel_module.h>
#include <cstdio>
#include <functional>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: trainer ARTIFACT_DIR [STEPS]\n"), 2;
  auto loaded = apc::runtime::ParallelModule::load(argv[1]);  // RANK, WORLD_SIZE, MASTER_ADDR...
  if (!loaded.ok()) return std::fprintf(stderr, "%s\n", loaded.error().message().c_str()), 2;
  apc::runtime::ParallelModule& pm = **loaded;
  // Weights drawn per piece of each tensor, so replicated pieces agree on every rank.
  pm.init_weights([](const apc::runtime::PlacedTensor& t, at::Tensor& local) {
    size_t seed = std::hash<std::string>{}(t.name);
    for (const auto& piece : t.local) seed = seed * 31 + piece.offset;
    local.normal_(0, 0.02, at::make_generator<at::CPUGeneratorImpl>(seed));
  });
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(0);  // the same on every rank
  std::vector<c10::IValue> inputs;  // one batch, trained on repeatedly: the loss must fall
  for (size_t i = 0; i < pm.inputSpecs().size(); ++i) {
    const apc::runtime::PlacedTensor& in = pm.inputSpecs()[i];
    at::Tensor full = at::isFloatingType(in.dtype)
                          ? at::randn(in.global_shape, data).to(in.dtype)
                          : at::randint(pm.inputIndexBound(i), in.global_shape, data);
    inputs.emplace_back(pm.shardInput(i, full));
  }
  for (int step = 0; step < (argc > 2 ? std::stoi(argv[2]) : 3); ++step) {
    auto out = pm.forwardLeaves(inputs);
    if (!out.ok()) return std::fprintf(stderr, "%s\n", out.error().message().c_str()), 1;
    at::Tensor loss = pm.gatherOutput(0, (*out)[0].toTensor()).to(at::kFloat).pow(2).mean();
    loss.backward();
    at::NoGradGuard no_grad;
    for (at::Tensor& p : pm.parameters())
      if (p.grad().defined()) p.sub_(p.grad() * 0.1), p.mutable_grad().reset();
    if (pm.rank() == 0) std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }
}
