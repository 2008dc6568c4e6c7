//===- tests/runtime/comm_test.cpp - Gloo communicators on forked ranks ----===//
//
// Every collective on every group of meshes [4], [2,2] and [2,4] (4 and 8 forked processes), for
// f32 and bf16, with uneven and empty pieces: each rank builds every member's input from a fixed
// formula, computes the expected result locally and compares it with the collective's. Also the
// byte counters, the launch environment, one-process worlds, and the failures: a world size that
// differs from the mesh, a peer that exits before a collective, and a collective timeout.
//
//===----------------------------------------------------------------------===//
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <thread>

#include "apc/mesh/placement.h"
#include "apc/runtime/comm.h"
#include "comm_harness.h"

namespace apc::runtime {
namespace {

using apc::testing::expectAllPassed;
using apc::testing::runRanks;
using Clock = std::chrono::steady_clock;

/// Rank `rank`'s input of a given shape: a fixed formula, different per rank and salt.
at::Tensor data(int64_t rank, std::vector<int64_t> shape, int salt, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor t = at::arange(n, at::kFloat).mul(0.37).add(rank * 1.7 + salt * 0.13).sin().mul(3);
  return t.view(shape).to(dtype);
}

std::vector<int64_t> chunks(int64_t n, int64_t p) {
  std::vector<int64_t> v;
  for (int64_t q = 0; q < p; ++q) v.push_back(mesh::chunkSize(n, p, q));
  return v;
}

at::Tensor reduceAll(const std::vector<at::Tensor>& xs, mesh::ReduceOp op) {
  at::Tensor r = xs[0].to(at::kFloat);
  for (size_t i = 1; i < xs.size(); ++i) {
    at::Tensor x = xs[i].to(at::kFloat);
    switch (op) {
      case mesh::ReduceOp::kMax:
        r = at::maximum(r, x);
        break;
      case mesh::ReduceOp::kMin:
        r = at::minimum(r, x);
        break;
      default:
        r = r + x;
    }
  }
  if (op == mesh::ReduceOp::kAvg) r = r / static_cast<double>(xs.size());
  return r.to(xs[0].scalar_type());
}

/// `got` against `want` (the f32 reference rounded once to the dtype). `group` is the number of
/// members whose pieces were summed: 16-bit floats are reduced by the backend in their own
/// precision (Gloo adds them pairwise, rounding at each step, as torch.distributed does), so each
/// of the group-1 partial sums, of magnitude up to 3 * group here, may be off by half an ulp.
void expectClose(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                 int group = 1) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  double tol = 1e-5;
  if (got.scalar_type() == at::kBFloat16 || got.scalar_type() == at::kHalf) {
    const double half_ulp = got.scalar_type() == at::kBFloat16 ? 1.0 / 512 : 1.0 / 4096;
    tol = 2e-2 + (group - 1) * 3.0 * group * half_ulp;
  }
  EXPECT_TRUE(at::allclose(got.to(at::kFloat), want.to(at::kFloat), tol, tol))
      << what << ": max |got - want| "
      << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>() << " > " << tol;
}

/// Every collective of `c`, whose members are the global ranks `members` in index order.
void checkGroup(Communicator& c, const std::vector<int64_t>& members, at::ScalarType dtype) {
  const int p = c.size();
  const int k = c.index();
  ASSERT_EQ(p, static_cast<int>(members.size())) << c.name();
  const std::string tag = c.name() + " " + std::string(c10::toString(dtype));

  // all-gather: torch.chunk pieces (7, 2 and 0 give short and empty pieces) and arbitrary sizes.
  std::vector<std::vector<int64_t>> size_lists;
  for (int64_t n : {7, 2, 0, 8}) size_lists.push_back(chunks(n, p));
  std::vector<int64_t> odd;
  for (int j = 0; j < p; ++j) odd.push_back((j * 2) % 3);
  size_lists.push_back(odd);
  for (size_t li = 0; li < size_lists.size(); ++li) {
    const auto& sizes = size_lists[li];
    int salt = static_cast<int>(li);
    at::Tensor local = data(members[k], {3, sizes[k], 2}, salt, dtype);
    at::Tensor got = c.allGather(local, 1, sizes);
    std::vector<at::Tensor> parts;
    for (int j = 0; j < p; ++j) parts.push_back(data(members[j], {3, sizes[j], 2}, salt, dtype));
    expectClose(got, at::cat(parts, 1), tag + " all-gather list " + std::to_string(li));
  }

  // all-reduce, every op, also non-contiguous and empty tensors.
  for (mesh::ReduceOp op :
       {mesh::ReduceOp::kSum, mesh::ReduceOp::kMax, mesh::ReduceOp::kMin, mesh::ReduceOp::kAvg}) {
    std::vector<at::Tensor> all;
    for (int j = 0; j < p; ++j) all.push_back(data(members[j], {5, 3}, 10, dtype));
    at::Tensor t = all[k].clone();
    c.allReduce(t, op);
    expectClose(t, reduceAll(all, op), tag + " all-reduce " + mesh::reduceOpName(op), p);
    at::Tensor tt = all[k].clone().t();  // non-contiguous
    c.allReduce(tt, op);
    expectClose(tt, reduceAll(all, op).t(), tag + " all-reduce transposed", p);
  }
  at::Tensor empty = at::empty({0, 4}, at::TensorOptions().dtype(dtype));
  c.allReduce(empty, mesh::ReduceOp::kSum);
  EXPECT_EQ(empty.numel(), 0);

  // reduce-scatter along dim 1 and dim 0, uneven and empty pieces.
  for (int64_t n : {7, 2, 0, 8}) {
    for (mesh::ReduceOp op : {mesh::ReduceOp::kSum, mesh::ReduceOp::kMax, mesh::ReduceOp::kAvg}) {
      std::vector<at::Tensor> fulls;
      for (int j = 0; j < p; ++j) fulls.push_back(data(members[j], {4, n, 3}, 20 + n, dtype));
      at::Tensor got = c.reduceScatter(fulls[k], 1, op);
      at::Tensor want =
          reduceAll(fulls, op).narrow(1, mesh::chunkOffset(n, p, k), mesh::chunkSize(n, p, k));
      expectClose(got, want, tag + " reduce-scatter n=" + std::to_string(n), p);
    }
    std::vector<at::Tensor> fulls;
    for (int j = 0; j < p; ++j) fulls.push_back(data(members[j], {n, 2}, 30 + n, dtype));
    at::Tensor got = c.reduceScatter(fulls[k], 0, mesh::ReduceOp::kSum);
    at::Tensor want = reduceAll(fulls, mesh::ReduceOp::kSum)
                          .narrow(0, mesh::chunkOffset(n, p, k), mesh::chunkSize(n, p, k));
    expectClose(got, want, tag + " reduce-scatter dim 0 n=" + std::to_string(n), p);
  }

  // all-to-all S(0) -> S(1) and S(1) -> S(0), uneven and empty pieces on both sides.
  for (int64_t gathered : {5, 2}) {
    for (int64_t m : {7, 3, 0}) {
      std::vector<int64_t> gs = chunks(gathered, p);
      at::Tensor local = data(members[k], {gs[k], m, 2}, 40, dtype);
      at::Tensor got = c.allToAll(local, 0, 1, gs);
      std::vector<at::Tensor> parts;
      for (int j = 0; j < p; ++j)
        parts.push_back(data(members[j], {gs[j], m, 2}, 40, dtype)
                            .narrow(1, mesh::chunkOffset(m, p, k), mesh::chunkSize(m, p, k)));
      expectClose(
          got, at::cat(parts, 0),
          tag + " all-to-all 0<-1 g=" + std::to_string(gathered) + " m=" + std::to_string(m));
      // Back: S(1) -> S(0) restores the original local.
      at::Tensor back = c.allToAll(got, 1, 0, chunks(m, p));
      expectClose(back, local, tag + " all-to-all back");
    }
  }

  // broadcast from index 1 % p.
  int root = 1 % p;
  at::Tensor b = data(members[k], {6}, 50, dtype);
  c.broadcast(b, root);
  expectClose(b, data(members[root], {6}, 50, dtype), tag + " broadcast");
  c.barrier();
}

/// Other dtypes: integer reductions (avg floors), bool and int16 moved as bytes, f16 reduced,
/// f64 reduce-scatter.
void checkOtherDtypes(Communicator& c, const std::vector<int64_t>& members) {
  const int p = c.size();
  const int k = c.index();
  auto ints = [&](int64_t rank) { return at::arange(6, at::kLong).mul(rank + 1).add(rank % 3); };
  for (mesh::ReduceOp op : {mesh::ReduceOp::kSum, mesh::ReduceOp::kMax, mesh::ReduceOp::kAvg}) {
    at::Tensor t = ints(members[k]);
    c.allReduce(t, op);
    at::Tensor want = ints(members[0]);
    for (int j = 1; j < p; ++j)
      want = op == mesh::ReduceOp::kMax ? at::maximum(want, ints(members[j]))
                                        : want + ints(members[j]);
    if (op == mesh::ReduceOp::kAvg) want = want.div(p, "floor");
    EXPECT_TRUE(at::equal(t, want)) << c.name() << " int64 " << mesh::reduceOpName(op);
  }
  std::vector<int64_t> sizes;
  std::vector<at::Tensor> parts;
  for (int j = 0; j < p; ++j) {
    sizes.push_back(j % 2 + 1);
    parts.push_back(at::arange(sizes.back() * 2, at::kLong)
                        .add(members[j])
                        .remainder(3)
                        .eq(0)
                        .view({sizes.back(), 2}));
  }
  EXPECT_TRUE(at::equal(c.allGather(parts[k], 0, sizes), at::cat(parts, 0))) << c.name() << " bool";
  at::Tensor s16 = at::arange(5, at::kShort).add(static_cast<int16_t>(members[k] * 100));
  c.broadcast(s16, 0);
  EXPECT_TRUE(at::equal(s16, at::arange(5, at::kShort).add(static_cast<int16_t>(members[0] * 100))))
      << c.name() << " int16";
  std::vector<at::Tensor> halves;
  for (int j = 0; j < p; ++j) halves.push_back(data(members[j], {7}, 60, at::kHalf));
  at::Tensor h = halves[k].clone();
  c.allReduce(h, mesh::ReduceOp::kSum);
  expectClose(h, reduceAll(halves, mesh::ReduceOp::kSum), c.name() + " f16", p);
  std::vector<at::Tensor> doubles;
  for (int j = 0; j < p; ++j) doubles.push_back(data(members[j], {5, 3}, 70, at::kDouble));
  at::Tensor got = c.reduceScatter(doubles[k], 0, mesh::ReduceOp::kMin);
  at::Tensor want = doubles[0];
  for (int j = 1; j < p; ++j) want = at::minimum(want, doubles[j]);
  EXPECT_TRUE(at::equal(got, want.narrow(0, mesh::chunkOffset(5, p, k), mesh::chunkSize(5, p, k))))
      << c.name() << " f64";
}

/// The counted bytes follow the documented formulas (c10d_comm.cpp).
void checkBytes(Communicator& c) {
  const int64_t p = c.size();
  c.resetStats();
  at::Tensor local = at::ones({2, 4});
  std::vector<int64_t> sizes(p, 2);
  (void)c.allGather(local, 0, sizes);
  EXPECT_EQ(c.stats().bytes_sent, (p - 1) * 2 * 4 * 4) << c.name();
  c.resetStats();
  (void)c.reduceScatter(at::ones({p * 3, 2}), 0, mesh::ReduceOp::kSum);
  EXPECT_EQ(c.stats().bytes_sent, (p - 1) * 3 * 2 * 4) << c.name();
  c.resetStats();
  at::Tensor t = at::ones({p * 4});
  c.allReduce(t, mesh::ReduceOp::kSum);
  EXPECT_EQ(c.stats().bytes_sent, 2 * (p - 1) * 4 * 4) << c.name();
  c.resetStats();
  at::Tensor h = at::ones({p * 4}, at::kBFloat16);
  c.allReduce(h, mesh::ReduceOp::kSum);
  EXPECT_EQ(c.stats().bytes_sent, 2 * (p - 1) * 4 * 2) << c.name();
  c.resetStats();
  (void)c.allToAll(at::ones({3, p * 2}), 0, 1, std::vector<int64_t>(p, 3));
  EXPECT_EQ(c.stats().bytes_sent, (p - 1) * 3 * 2 * 4) << c.name();
  EXPECT_EQ(c.stats().calls, 1);
  c.resetStats();
}

void runMesh(std::vector<int64_t> shape, std::vector<std::string> names) {
  auto mesh = mesh::DeviceMesh::create(shape, names);
  ASSERT_TRUE(mesh.ok());
  int n = static_cast<int>(mesh->worldSize());
  auto outcomes = runRanks(n, std::chrono::seconds(60), [&](const LaunchEnv& env) {
    WorldOptions options;
    options.timeout = std::chrono::milliseconds(20'000);
    auto world = World::create(env, *mesh, options);
    ASSERT_TRUE(world.ok()) << world.error().message();
    World& w = **world;
    EXPECT_EQ(w.coordinate(), mesh->coordinate(env.rank));
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (size_t d = 0; d < mesh->ndim(); ++d) {
        EXPECT_EQ(w.dim(d).index(), mesh->coordinate(env.rank)[d]);
        checkGroup(w.dim(d), mesh->groupOf(env.rank, d), dtype);
      }
      std::vector<int64_t> all;
      for (int r = 0; r < n; ++r) all.push_back(r);
      checkGroup(w.all(), all, dtype);
    }
    for (size_t d = 0; d < mesh->ndim(); ++d)
      checkOtherDtypes(w.dim(d), mesh->groupOf(env.rank, d));
    EXPECT_GT(w.stats().calls, 0);
    EXPECT_GT(w.stats().bytes_sent, 0);
    for (size_t d = 0; d < mesh->ndim(); ++d) checkBytes(w.dim(d));
    checkBytes(w.all());
  });
  expectAllPassed(outcomes);
}

TEST(CommTest, Mesh4) {
  runMesh({4}, {"dp"});
}
TEST(CommTest, Mesh2x2) {
  runMesh({2, 2}, {"dp", "tp"});
}
TEST(CommTest, Mesh2x4) {
  runMesh({2, 4}, {"dp", "tp"});
}

TEST(CommTest, GroupNames) {
  auto mesh = mesh::DeviceMesh::create({2, 2}, {"dp", "tp"});
  ASSERT_TRUE(mesh.ok());
  auto outcomes = runRanks(4, std::chrono::seconds(30), [&](const LaunchEnv& env) {
    auto world = World::create(env, *mesh);
    ASSERT_TRUE(world.ok()) << world.error().message();
    if (env.rank == 3) {
      EXPECT_EQ((*world)->dim(0).name(), "mesh dim 0 (dp) ranks {1,3}");
      EXPECT_EQ((*world)->dim(1).name(), "mesh dim 1 (tp) ranks {2,3}");
      EXPECT_EQ((*world)->all().name(), "world ranks {0,1,2,3}");
    }
  });
  expectAllPassed(outcomes);
}

TEST(CommTest, SingleProcessWorld) {
  // Runs in a child: the parent stays free of torch threads for the forking tests.
  auto outcomes = runRanks(1, std::chrono::seconds(30), [](const LaunchEnv& env) {
    auto mesh = mesh::DeviceMesh::create({1, 1});
    ASSERT_TRUE(mesh.ok());
    auto world = World::create(env, *mesh);
    ASSERT_TRUE(world.ok()) << world.error().message();
    checkGroup((*world)->dim(0), {0}, at::kFloat);
    checkGroup((*world)->all(), {0}, at::kBFloat16);
    EXPECT_EQ((*world)->stats().bytes_sent, 0);
  });
  expectAllPassed(outcomes);
}

TEST(CommTest, WorldSizeMismatchIsOneLine) {
  auto mesh = mesh::DeviceMesh::create({2, 4}, {"dp", "tp"});
  ASSERT_TRUE(mesh.ok());
  LaunchEnv env;
  env.rank = 1;
  env.world_size = 4;
  auto world = World::create(env, *mesh);
  ASSERT_FALSE(world.ok());
  EXPECT_EQ(world.error().message(), "world size 4 but the mesh 2x4(dp,tp) has 8 ranks");
  EXPECT_EQ(world.error().code(), ErrorCode::kInvalidArgument);
}

TEST(CommTest, NcclWithoutCudaIsAnError) {
  auto mesh = mesh::DeviceMesh::create({1});
  ASSERT_TRUE(mesh.ok());
  WorldOptions options;
  options.backend = Backend::kNccl;
  auto world = World::create(LaunchEnv{}, *mesh, options);
  ASSERT_FALSE(world.ok());
  EXPECT_NE(world.error().message().find("NCCL"), std::string::npos) << world.error().message();
  EXPECT_EQ(world.error().message().find('\n'), std::string::npos);
}

TEST(CommTest, LaunchEnvironment) {
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("LOCAL_RANK");
  ::unsetenv("LOCAL_WORLD_SIZE");
  auto single = launchEnvFromEnvironment();
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(single->rank, 0);
  EXPECT_EQ(single->world_size, 1);
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "4", 1);
  ::setenv("MASTER_ADDR", "10.1.2.3", 1);
  ::setenv("MASTER_PORT", "12345", 1);
  auto env = launchEnvFromEnvironment();
  ASSERT_TRUE(env.ok()) << env.error().message();
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 1);
  EXPECT_EQ(env->local_world_size, 4);
  EXPECT_EQ(env->master_addr, "10.1.2.3");
  EXPECT_EQ(env->master_port, 12345);
  ::setenv("RANK", "8", 1);
  auto bad = launchEnvFromEnvironment();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "RANK=8 is outside [0, WORLD_SIZE=8)");
  ::setenv("RANK", "x1", 1);
  bad = launchEnvFromEnvironment();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "environment variable RANK='x1' is not an integer");
  ::unsetenv("WORLD_SIZE");
  bad = launchEnvFromEnvironment();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "RANK is set but WORLD_SIZE is not");
  for (const char* v :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})
    ::unsetenv(v);
}

/// Runs `fn` with fd 2 sent to a file; returns what was written there.
std::string captureStderr(const std::function<void()>& fn) {
  std::string path = "/tmp/apc_comm_stderr_" + std::to_string(::getpid());
  std::fflush(stderr);
  int saved = ::dup(2);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  ::unlink(path.c_str());
  return text;
}

TEST(RendezvousTest, MissingRanksAreNamedWhileWaiting) {
  auto mesh = mesh::DeviceMesh::create({2});
  ASSERT_TRUE(mesh.ok());
  // Rank 0 of 2 alone; APC_TIMEOUT_S (LaunchEnv::timeout) bounds the wait.
  auto outcomes = runRanks(1, std::chrono::seconds(30), [&](const LaunchEnv& given) {
    LaunchEnv env = given;
    env.world_size = 2;
    env.timeout = std::chrono::milliseconds(1500);
    WorldOptions options;
    options.progress_interval = std::chrono::milliseconds(300);
    Expected<std::shared_ptr<World>> world = internalError("not run");
    auto start = Clock::now();
    std::string err = captureStderr([&] { world = World::create(env, *mesh, options); });
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(6000));
    ASSERT_FALSE(world.ok());
    std::string where = "127.0.0.1:" + std::to_string(env.master_port);
    EXPECT_EQ(world.error().message(), "rank 0: rank 1 of 2 did not join the rendezvous at " +
                                           where + " within 1 s (job 'default')");
    EXPECT_EQ(world.error().code(), ErrorCode::kIo);
    EXPECT_NE(err.find("apc: rank 0: waiting for rank 1 (1 of 2 missing) at " + where +
                       ", job 'default', 0 s of 1 s\n"),
              std::string::npos)
        << err;
  });
  expectAllPassed(outcomes);
  // Rank 1 of 2 alone: no store to connect to.
  outcomes = runRanks(1, std::chrono::seconds(30), [&](const LaunchEnv& given) {
    LaunchEnv env = given;
    env.rank = 1;
    env.world_size = 2;
    WorldOptions options;
    options.setup_timeout = std::chrono::milliseconds(2000);
    options.progress_interval = std::chrono::milliseconds(500);
    options.job_id = "plan-1234";
    Expected<std::shared_ptr<World>> world = internalError("not run");
    std::string err = captureStderr([&] { world = World::create(env, *mesh, options); });
    ASSERT_FALSE(world.ok());
    std::string where = "127.0.0.1:" + std::to_string(env.master_port);
    EXPECT_EQ(world.error().message().rfind("rank 1: no rendezvous store at " + where +
                                                " after 2 s (job 'plan-1234'; is rank 0 running?)",
                                            0),
              0u)
        << world.error().message();
    EXPECT_EQ(world.error().message().find('\n'), std::string::npos);
    EXPECT_NE(err.find("apc: rank 1: waiting for rank 0's rendezvous store at " + where +
                       " (job 'plan-1234', "),
              std::string::npos)
        << err;
  });
  expectAllPassed(outcomes);
}

TEST(RendezvousTest, RanksOfAnotherJobAreTurnedAway) {
  auto mesh = mesh::DeviceMesh::create({2});
  ASSERT_TRUE(mesh.ok());
  // Processes 0 and 1 are job "a"; process 2 is rank 1 of job "b" on the same port.
  auto outcomes = runRanks(3, std::chrono::seconds(60), [&](const LaunchEnv& given) {
    LaunchEnv env = given;
    env.world_size = 2;
    env.job_id = given.rank == 2 ? "b" : "a";
    if (given.rank == 2) {
      env.rank = 1;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // after job a's store is up
    }
    WorldOptions options;
    options.setup_timeout = std::chrono::milliseconds(20'000);
    auto start = Clock::now();
    auto world = World::create(env, *mesh, options);
    if (given.rank < 2) {
      ASSERT_TRUE(world.ok()) << world.error().message();
      (*world)->all().barrier();
      std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // keep the store up
      return;
    }
    ASSERT_FALSE(world.ok());
    EXPECT_EQ(world.error().message(),
              "rank 1: the rendezvous store at 127.0.0.1:" + std::to_string(env.master_port) +
                  " belongs to job 'a', not to this job 'b': another job uses MASTER_PORT " +
                  std::to_string(env.master_port) +
                  " (give each job its own port, and all ranks of one job the same APC_JOB_ID)");
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(5000));
  });
  expectAllPassed(outcomes);
}

// Issue 32: ranks started on artifacts of different plans under one job id (as `apc run` sets it)
// met at the rendezvous and blocked in collectives until the timeout. Ranks compare their
// artifact's plan hash there: every rank fails at once with one line naming both hashes.
TEST(RendezvousTest, RanksOfDifferentArtifactsFailAtOnce) {
  auto mesh = mesh::DeviceMesh::create({4});
  ASSERT_TRUE(mesh.ok());
  auto outcomes = runRanks(4, std::chrono::seconds(60), [&](const LaunchEnv& given) {
    LaunchEnv env = given;
    env.job_id = "j";
    WorldOptions options;
    options.setup_timeout = std::chrono::milliseconds(20'000);
    options.timeout = std::chrono::milliseconds(20'000);
    options.artifact_hash = given.rank == 2 ? "bbbb" : "aaaa";
    if (given.rank == 2)  // the others are waiting when it comes
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto start = Clock::now();
    auto world = World::create(env, *mesh, options);
    ASSERT_FALSE(world.ok());
    EXPECT_EQ(world.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(world.error().message(),
              "rank " + std::to_string(given.rank) +
                  ": rank 2 loaded an artifact of plan hash bbbb, rank 0 one of plan hash aaaa "
                  "(job 'j'): every rank must load the same artifact");
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(5000));
  });
  expectAllPassed(outcomes);
  // One artifact: the ranks set up as before.
  outcomes = runRanks(2, std::chrono::seconds(60), [&](const LaunchEnv& given) {
    LaunchEnv env = given;
    env.world_size = 2;
    env.job_id = "k";
    WorldOptions options;
    options.setup_timeout = std::chrono::milliseconds(20'000);
    options.artifact_hash = "aaaa";
    auto two = mesh::DeviceMesh::create({2});
    ASSERT_TRUE(two.ok());
    auto world = World::create(env, *two, options);
    ASSERT_TRUE(world.ok()) << world.error().message();
    (*world)->all().barrier();
  });
  expectAllPassed(outcomes);
}

// Issue 32 (the last round): without a job id, ranks rendezvous under their artifact's plan hash,
// so a rank of another artifact met a store of "another job" and failed at once, while rank 0 and
// the ranks with it waited for it until the timeout. The odd rank tells them: every rank fails at
// once with the mismatch line (as under one job id). Here rank 2 loaded another artifact, and then
// rank 0 itself (its peers all tell it).
TEST(RendezvousTest, RanksOfDifferentArtifactsWithoutAJobIdFailAtOnce) {
  auto mesh = mesh::DeviceMesh::create({4});
  ASSERT_TRUE(mesh.ok());
  for (int odd : {2, 0}) {
    SCOPED_TRACE(odd);
    auto outcomes = runRanks(4, std::chrono::seconds(60), [&](const LaunchEnv& given) {
      LaunchEnv env = given;
      ASSERT_TRUE(env.job_id.empty());
      WorldOptions options;
      options.setup_timeout = std::chrono::milliseconds(20'000);
      options.timeout = std::chrono::milliseconds(20'000);
      options.artifact_hash = given.rank == odd ? "bbbbbbbbbbbbbbbbbbbb" : "aaaaaaaaaaaaaaaaaaaa";
      if (given.rank == 2)  // the others are waiting when it comes
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      auto start = Clock::now();
      auto world = World::create(env, *mesh, options);
      ASSERT_FALSE(world.ok());
      EXPECT_EQ(world.error().code(), ErrorCode::kInvalidArgument);
      const std::string rank0 = odd == 0 ? "bbbbbbbbbbbbbbbbbbbb" : "aaaaaaaaaaaaaaaaaaaa";
      const std::string other = odd == 0 ? "aaaaaaaaaaaaaaaaaaaa" : "bbbbbbbbbbbbbbbbbbbb";
      // Which rank of the other artifact wrote the line first is a race when there are several.
      const std::string& m = world.error().message();
      EXPECT_EQ(m.rfind("rank " + std::to_string(given.rank) + ": rank ", 0), 0u) << m;
      EXPECT_NE(m.find(" loaded an artifact of plan hash " + other + ", rank 0 one of plan hash " +
                       rank0 + " (no job id set): every rank must load the same artifact"),
                std::string::npos)
          << m;
      if (odd == 2) {
        EXPECT_EQ(m,
                  "rank " + std::to_string(given.rank) +
                      ": rank 2 loaded an artifact of plan hash bbbbbbbbbbbbbbbbbbbb, rank 0 one "
                      "of plan hash aaaaaaaaaaaaaaaaaaaa (no job id set): every rank must load "
                      "the same artifact");
      }
      EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(5000));
    });
    expectAllPassed(outcomes);
  }
  // One artifact, no job id: the ranks set up under its plan hash, as before.
  auto outcomes = runRanks(2, std::chrono::seconds(60), [&](const LaunchEnv& env) {
    WorldOptions options;
    options.setup_timeout = std::chrono::milliseconds(20'000);
    options.artifact_hash = "aaaaaaaaaaaaaaaaaaaa";
    auto two = mesh::DeviceMesh::create({2});
    ASSERT_TRUE(two.ok());
    auto world = World::create(env, *two, options);
    ASSERT_TRUE(world.ok()) << world.error().message();
    (*world)->all().barrier();
  });
  expectAllPassed(outcomes);
}

// Issue 32 (the last round): a MASTER_ADDR that does not resolve was retried until the set-up
// timeout, and failed 5 s after it. It is resolved first: one line naming it, at once, on every
// rank (rank 0 too: its peers cannot reach it by that name).
TEST(RendezvousTest, AMasterAddrThatDoesNotResolveFailsAtOnce) {
  auto mesh = mesh::DeviceMesh::create({2});
  ASSERT_TRUE(mesh.ok());
  auto outcomes = runRanks(2, std::chrono::seconds(60), [&](const LaunchEnv& given) {
    LaunchEnv env = given;
    env.master_addr = "no-such-host.invalid";
    env.job_id = "j";
    WorldOptions options;
    options.setup_timeout = std::chrono::milliseconds(30'000);
    auto start = Clock::now();
    auto world = World::create(env, *mesh, options);
    ASSERT_FALSE(world.ok());
    EXPECT_EQ(world.error().code(), ErrorCode::kInvalidArgument);
    const std::string& m = world.error().message();
    EXPECT_EQ(m.rfind("rank " + std::to_string(given.rank) +
                          ": MASTER_ADDR 'no-such-host.invalid' does not resolve (",
                      0),
              0u)
        << m;
    EXPECT_NE(m.find("); it names rank 0's host"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos);
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(3000));
  });
  expectAllPassed(outcomes);
}

TEST(RendezvousTest, PortClashAndDuplicateRanksFailFast) {
  auto mesh = mesh::DeviceMesh::create({2});
  ASSERT_TRUE(mesh.ok());
  // Two ranks 0 on one port: the second cannot serve. Two ranks 1 of one job: the second is
  // already registered. Exit codes: 0 joined, 10 the expected fast error, 11 a slow one.
  auto outcomes = runRanks(4, std::chrono::seconds(60), [&](const LaunchEnv& given) {
    LaunchEnv env = given;
    env.world_size = 2;
    env.job_id = "j";
    env.rank = given.rank % 2;
    if (given.rank >= 2) std::this_thread::sleep_for(std::chrono::milliseconds(700));
    WorldOptions options;
    options.setup_timeout = std::chrono::milliseconds(8000);
    auto start = Clock::now();
    auto world = World::create(env, *mesh, options);
    if (world.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // keep the store up
      ::_exit(0);
    }
    const std::string& m = world.error().message();
    bool fast = Clock::now() - start < std::chrono::milliseconds(4000);
    // Which of two duplicates loses depends on which starts first: the later one is delayed, but
    // on a loaded machine the earlier one may start later still.
    bool expected = env.rank == 0
                        ? m.find("rank 0: cannot serve the rendezvous store at") == 0
                        : m == "rank 1 of job 'j' is already registered at 127.0.0.1:" +
                                   std::to_string(env.master_port) +
                                   ": a rank started twice, or another job with the "
                                   "same job id on MASTER_PORT " +
                                   std::to_string(env.master_port) + " (set APC_JOB_ID per job)";
    if (!expected) std::cerr << "process " << given.rank << ": " << m << "\n";
    EXPECT_EQ(m.find('\n'), std::string::npos);
    ::_exit(expected && fast ? 10 : 11);
  });
  ASSERT_EQ(outcomes.size(), 4u);
  // Of each pair of duplicates (processes 0 and 2: rank 0; 1 and 3: rank 1) one joined and the
  // other failed fast with the expected message.
  for (int r : {0, 1}) {
    std::multiset<int> codes = {outcomes[static_cast<size_t>(r)].exit_code,
                                outcomes[static_cast<size_t>(r + 2)].exit_code};
    EXPECT_EQ(codes, (std::multiset<int>{0, 10})) << "rank " << r;
  }
}

TEST(RendezvousTest, JobIdAndTimeoutFromTheEnvironment) {
  for (const char* v : {"RANK", "WORLD_SIZE", "APC_JOB_ID", "TORCHELASTIC_RUN_ID", "APC_TIMEOUT_S"})
    ::unsetenv(v);
  auto plain = launchEnvFromEnvironment();
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->job_id, "");
  EXPECT_FALSE(plain->timeout.has_value());
  ::setenv("TORCHELASTIC_RUN_ID", "none", 1);
  EXPECT_EQ(launchEnvFromEnvironment()->job_id, "");
  ::setenv("TORCHELASTIC_RUN_ID", "elastic-7", 1);
  EXPECT_EQ(launchEnvFromEnvironment()->job_id, "elastic-7");
  ::setenv("APC_JOB_ID", "mine", 1);
  EXPECT_EQ(launchEnvFromEnvironment()->job_id, "mine");
  ::setenv("APC_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(launchEnvFromEnvironment()->timeout, std::chrono::milliseconds(2500));
  for (const char* bad : {"0", "-1", "soon", "1e9", "nan"}) {
    ::setenv("APC_TIMEOUT_S", bad, 1);
    auto e = launchEnvFromEnvironment();
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.error().message(),
              std::string("APC_TIMEOUT_S='") + bad + "' is not a number of seconds in (0, 604800]");
  }
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "65537", 1);
  ::unsetenv("APC_TIMEOUT_S");
  auto big = launchEnvFromEnvironment();
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().message(), "WORLD_SIZE=65537 is above 65536, the most apc supports");
  for (const char* v : {"RANK", "WORLD_SIZE", "APC_JOB_ID", "TORCHELASTIC_RUN_ID"}) ::unsetenv(v);
}

TEST(CommFailureTest, PeerThatExitedGivesCommError) {
  auto mesh = mesh::DeviceMesh::create({4}, {"dp"});
  ASSERT_TRUE(mesh.ok());
  auto outcomes = runRanks(4, std::chrono::seconds(30), [&](const LaunchEnv& env) {
    WorldOptions options;
    options.timeout = std::chrono::milliseconds(5000);
    options.setup_timeout = std::chrono::milliseconds(20'000);
    auto world = World::create(env, *mesh, options);
    ASSERT_TRUE(world.ok()) << world.error().message();
    (*world)->all().barrier();
    if (env.rank == 2) {
      world->reset();
      ::_exit(0);  // leaves before the all-reduce
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    at::Tensor t = at::ones({1000});
    auto start = Clock::now();
    try {
      (*world)->dim(0).allReduce(t, mesh::ReduceOp::kSum);
      ADD_FAILURE() << "rank " << env.rank << ": all-reduce with a dead peer succeeded";
    } catch (const CommError& e) {
      std::string what = e.what();
      EXPECT_EQ(what.rfind("mesh dim 0 (dp) ranks {0,1,2,3}: all-reduce ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      // Gloo's own words ("Connection closed by peer ... GLHF!") become one plain statement.
      EXPECT_EQ(what.find("GLHF"), std::string::npos) << what;
      if (what.find("timed out") == std::string::npos) {
        EXPECT_NE(what.find("a peer rank closed its connection"), std::string::npos) << what;
      }
    }
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(5000 + 2000));
  });
  expectAllPassed(outcomes);
}

TEST(CommFailureTest, CollectiveTimeoutNamesTheGroup) {
  auto mesh = mesh::DeviceMesh::create({2, 2}, {"dp", "tp"});
  ASSERT_TRUE(mesh.ok());
  auto outcomes = runRanks(4, std::chrono::seconds(30), [&](const LaunchEnv& env) {
    WorldOptions options;
    options.timeout = std::chrono::milliseconds(1500);
    options.setup_timeout = std::chrono::milliseconds(20'000);
    auto world = World::create(env, *mesh, options);
    ASSERT_TRUE(world.ok()) << world.error().message();
    Communicator& tp = (*world)->dim(1);
    at::Tensor local = at::ones({2, 3});
    if (env.rank == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(4000));  // past rank 2's timeout
      EXPECT_THROW((void)tp.allGather(local, 0, {2, 2}), CommError);
      return;
    }
    auto start = Clock::now();
    if (env.rank == 2) {
      try {
        (void)tp.allGather(local, 0, {2, 2});
        ADD_FAILURE() << "all-gather with a sleeping peer succeeded";
      } catch (const CommError& e) {
        EXPECT_STREQ(e.what(), "mesh dim 1 (tp) ranks {2,3}: all-gather timed out after 1500 ms");
      }
      auto elapsed = Clock::now() - start;
      EXPECT_GE(elapsed, std::chrono::milliseconds(1400));
      EXPECT_LT(elapsed, std::chrono::milliseconds(5000));  // loaded CI machines
    } else {
      EXPECT_EQ(tp.allGather(local, 0, {2, 2}).size(0), 4);  // group {0,1} is unaffected
    }
  });
  expectAllPassed(outcomes);
}

}  // namespace
}  // namespace apc::runtime
