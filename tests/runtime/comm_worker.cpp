//===- tests/runtime/comm_worker.cpp - A rank program for launcher tests and benchmarks ---===//
//
// Run under `apc run` (or torchrun): reads the torchrun variables and does one of
//   comm_worker ok                   all-reduce on mesh [WORLD_SIZE], check the sum, exit 0
//   comm_worker fail R CODE          rank R exits with CODE at once, the others sleep 60 s
//   comm_worker kill R               rank R kills itself with SIGKILL, the others sleep 60 s
//   comm_worker exit-early R         rank R exits 0 after set-up; the others' all-reduce must
//                                    fail with a CommError (printed), then they exit 3
//   comm_worker bench MESH MIB ITERS times World set-up and each collective on MIB MiB of f32
//                                    per rank on every mesh dim; rank 0 prints one line each
//
//===----------------------------------------------------------------------===//
#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include "apc/runtime/comm.h"

using namespace apc;
using namespace apc::runtime;
using Clock = std::chrono::steady_clock;

namespace {

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::shared_ptr<World> makeWorld(const LaunchEnv& env, const std::string& shape,
                                 std::chrono::milliseconds timeout) {
  auto mesh = mesh::DeviceMesh::parse(shape);
  if (!mesh) throw std::runtime_error(mesh.error().message());
  WorldOptions options;
  options.timeout = timeout;
  options.setup_timeout = std::chrono::milliseconds(60'000);
  auto world = World::create(env, *mesh, options);
  if (!world) throw std::runtime_error(world.error().message());
  return *world;
}

int bench(const LaunchEnv& env, const std::string& shape, double mib, int iters) {
  auto start = Clock::now();
  auto world = makeWorld(env, shape, std::chrono::milliseconds(120'000));
  double setup_ms = msSince(start);
  world->all().barrier();
  int64_t numel = static_cast<int64_t>(mib * 1024 * 1024 / 4);
  if (env.rank == 0)
    std::printf("mesh %s: World::create %.0f ms (rank 0)\n", world->mesh().toString().c_str(),
                setup_ms);
  for (size_t d = 0; d < world->mesh().ndim(); ++d) {
    Communicator& c = world->dim(d);
    int64_t p = c.size();
    at::Tensor t = at::ones({numel});
    at::Tensor piece = at::ones({numel / p});
    std::vector<int64_t> sizes(p, numel / p);
    // n: the full tensor as the cost model sees it (apc/cost/collectives.h), in MiB.
    auto time = [&](const char* what, double n_mib, auto&& fn) {
      fn();  // warm-up
      c.barrier();
      c.resetStats();
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) fn();
      double ms = msSince(t0) / iters;
      double sent = static_cast<double>(c.stats().bytes_sent) / iters / (1024 * 1024);
      if (env.rank == 0)
        std::printf("  %-32s %-16s n = %7.2f MiB: %8.2f ms, %7.2f MiB sent per rank\n",
                    c.name().c_str(), what, n_mib, ms, sent);
    };
    time("all-reduce f32", mib, [&] { c.allReduce(t, mesh::ReduceOp::kSum); });
    at::Tensor h = at::ones({numel}, at::kBFloat16);
    time("all-reduce bf16", mib / 2, [&] { c.allReduce(h, mesh::ReduceOp::kSum); });
    time("all-gather", mib, [&] { (void)c.allGather(piece, 0, sizes); });
    time("reduce-scatter", mib, [&] { (void)c.reduceScatter(t, 0, mesh::ReduceOp::kSum); });
    at::Tensor local = at::ones({numel / (p * p), p});
    std::vector<int64_t> rows(p, numel / (p * p));
    time("all-to-all", mib, [&] { (void)c.allToAll(local, 0, 1, rows); });
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr
        << "usage: comm_worker ok | fail R CODE | kill R | exit-early R | bench MESH MIB ITERS\n";
    return 2;
  }
  auto env = launchEnvFromEnvironment();
  if (!env) {
    std::cerr << "comm_worker: " << env.error().message() << "\n";
    return 2;
  }
  const std::string& mode = args[0];
  int r = env->rank;
  try {
    if (mode == "ok") {
      auto world = makeWorld(*env, std::to_string(env->world_size), std::chrono::seconds(20));
      at::Tensor t = at::full({4}, static_cast<double>(r + 1));
      world->all().allReduce(t, mesh::ReduceOp::kSum);
      double want = env->world_size * (env->world_size + 1) / 2.0;
      if (t[0].item<double>() != want) {
        std::cerr << "rank " << r << ": wrong sum\n";
        return 1;
      }
      return 0;
    }
    if ((mode == "fail" && args.size() == 3) || (mode == "kill" && args.size() == 2)) {
      if (r == std::stoi(args[1])) {
        if (mode == "kill") ::raise(SIGKILL);
        return std::stoi(args[2]);
      }
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return 0;
    }
    if (mode == "exit-early" && args.size() == 2) {
      auto world = makeWorld(*env, std::to_string(env->world_size), std::chrono::seconds(5));
      world->all().barrier();
      if (r == std::stoi(args[1])) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      at::Tensor t = at::ones({1024});
      try {
        world->all().allReduce(t, mesh::ReduceOp::kSum);
      } catch (const CommError& e) {
        std::cout << "rank " << r << ": CommError: " << e.what() << std::endl;
        return 3;
      }
      std::cout << "rank " << r << ": all-reduce succeeded" << std::endl;
      return 0;
    }
    if (mode == "bench" && args.size() == 4)
      return bench(*env, args[1], std::stod(args[2]), std::stoi(args[3]));
  } catch (const std::exception& e) {
    std::cerr << "rank " << r << ": " << e.what() << "\n";
    return 1;
  }
  std::cerr << "comm_worker: bad arguments\n";
  return 2;
}
