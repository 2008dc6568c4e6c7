//===- lib/runtime/world.cpp - Process groups of a device mesh -------------===//
//
// World::create: one c10d TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it and waits for all
// ranks), then, in the same order on every rank, one group per mesh dim (the ranks that differ from
// this rank only in that dim's coordinate) and one for the world, each rendezvoused through a
// PrefixStore named after its ranks. Every rank creates only its own groups; since all ranks walk
// the dims in the same order, each group is set up by all its members at the same step. A group of
// one rank needs no communication (a local communicator); on a 1-d mesh the world group is the
// group of dim 0. A single process (world size 1) opens no store at all.
//
// The process ignores SIGPIPE (when it was left at the default action): Gloo writes to sockets
// whose peer may have died, and the error must become a CommError rather than kill the process.
//
//===----------------------------------------------------------------------===//
#include <signal.h>

#include <algorithm>
#include <chrono>

#include <ATen/Context.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm_internal.h"

namespace apc::runtime {
namespace {

void ignoreSigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
}

std::string joinRanks(const std::vector<int64_t>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

/// A store barrier of the group's members, waited on with the set-up timeout, so that the
/// backend's own rendezvous (bounded by the collective timeout) starts with every member present.
void waitForMembers(c10d::Store& store, const std::string& name, int index, int size,
                    std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  for (int i = 0; i < size; ++i) keys.push_back("arrived/" + std::to_string(i));
  try {
    store.set(keys[index], std::vector<uint8_t>{1});
    store.wait(keys, timeout);
  } catch (const c10::Error& e) {
    throw CommError(
        detail::describeFailure(name, "group set-up", e.what_without_backtrace(), timeout));
  } catch (const std::exception& e) {
    throw CommError(detail::describeFailure(name, "group set-up", e.what(), timeout));
  }
}

class WorldImpl final : public World {
 public:
  WorldImpl(const LaunchEnv& env, mesh::DeviceMesh mesh)
      : rank_(env.rank), world_size_(env.world_size), mesh_(std::move(mesh)) {}
  ~WorldImpl() override {
    // Groups before the store they rendezvoused through.
    world_group_.reset();
    dims_.clear();
    store_.reset();
  }

  int rank() const override { return rank_; }
  int worldSize() const override { return world_size_; }
  const mesh::DeviceMesh& mesh() const override { return mesh_; }
  std::vector<int64_t> coordinate() const override { return mesh_.coordinate(rank_); }
  Communicator& dim(size_t d) override { return *dims_.at(d); }
  Communicator& all() override { return world_group_ ? *world_group_ : *dims_.at(0); }
  CommStats stats() const override {
    CommStats total;
    auto add = [&](const Communicator& c) {
      total.calls += c.stats().calls;
      total.bytes_sent += c.stats().bytes_sent;
    };
    for (const auto& c : dims_) add(*c);
    if (world_group_) add(*world_group_);
    return total;
  }
  void resetStats() override {
    for (auto& c : dims_) c->resetStats();
    if (world_group_) world_group_->resetStats();
  }

  int rank_;
  int world_size_;
  mesh::DeviceMesh mesh_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::vector<std::unique_ptr<Communicator>> dims_;
  std::unique_ptr<Communicator> world_group_;  // null on a 1-d mesh (dim 0 is the world)
};

}  // namespace

Expected<std::shared_ptr<World>> World::create(const LaunchEnv& env, const mesh::DeviceMesh& mesh,
                                               const WorldOptions& options) {
  if (env.world_size != mesh.worldSize())
    return invalidArgument("world size " + std::to_string(env.world_size) + " but the mesh " +
                           mesh.toString() + " has " + std::to_string(mesh.worldSize()) + " ranks");
  if (env.rank < 0 || env.rank >= env.world_size)
    return invalidArgument("rank " + std::to_string(env.rank) + " outside [0, " +
                           std::to_string(env.world_size) + ")");
  if (options.timeout.count() <= 0 || options.setup_timeout.count() <= 0)
    return invalidArgument("timeouts must be positive, got " +
                           std::to_string(options.timeout.count()) + " ms and " +
                           std::to_string(options.setup_timeout.count()) + " ms");
  if (options.backend == Backend::kNccl) {
#ifndef APC_HAVE_NCCL
    return unsupported("the NCCL backend is not built in (configure with CUDA and NCCL found)");
#else
    if (!at::hasCUDA())
      return unsupported("the NCCL backend needs a CUDA device, and none is available");
#endif
  }
  auto world = std::make_shared<WorldImpl>(env, mesh);
  std::vector<int64_t> all_ranks(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all_ranks[r] = r;
  if (env.world_size == 1) {
    for (size_t d = 0; d < mesh.ndim(); ++d)
      world->dims_.push_back(
          detail::makeLocalCommunicator(detail::groupName(mesh, static_cast<int>(d), {0})));
    if (mesh.ndim() != 1)
      world->world_group_ = detail::makeLocalCommunicator(detail::groupName(mesh, -1, {0}));
    return std::shared_ptr<World>(world);
  }
  ignoreSigpipe();
  std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<uint16_t>(env.master_port);
    store_options.isServer = env.rank == 0;
    store_options.numWorkers = env.world_size;
    store_options.waitWorkers = true;
    store_options.timeout = options.setup_timeout;
    world->store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const c10::Error& e) {
    return ioError("rendezvous store at " + where + ": " +
                   detail::firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return ioError("rendezvous store at " + where + ": " + detail::firstLine(e.what()));
  }
  try {
    std::shared_ptr<gloo::transport::Device> device;
    auto make = [&](int dim, const std::vector<int64_t>& ranks) -> std::unique_ptr<Communicator> {
      std::string name = detail::groupName(mesh, dim, ranks);
      if (ranks.size() == 1) return detail::makeLocalCommunicator(std::move(name));
      int index = static_cast<int>(
          std::find(ranks.begin(), ranks.end(), static_cast<int64_t>(env.rank)) - ranks.begin());
      std::string prefix =
          (dim < 0 ? std::string("apc/world/") : "apc/dim" + std::to_string(dim) + "/") +
          joinRanks(ranks);
      auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, world->store_);
      int size = static_cast<int>(ranks.size());
      waitForMembers(*store, name, index, size, options.setup_timeout);
#ifdef APC_HAVE_NCCL
      if (options.backend == Backend::kNccl)
        return detail::makeNcclCommunicator(std::move(name), store, index, size, env.local_rank,
                                            options.timeout, options.setup_timeout);
#endif
      if (!device) device = detail::makeGlooDevice(env.master_addr);
      return detail::makeGlooCommunicator(std::move(name), store, index, size, device,
                                          options.timeout);
    };
    for (size_t d = 0; d < mesh.ndim(); ++d)
      world->dims_.push_back(make(static_cast<int>(d), mesh.groupOf(env.rank, d)));
    if (mesh.ndim() != 1) world->world_group_ = make(-1, all_ranks);
  } catch (const CommError& e) {
    return ioError(e.what());
  }
  return std::shared_ptr<World>(world);
}

}  // namespace apc::runtime
