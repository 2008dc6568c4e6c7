//===- tests/runtime/overlap_test.cpp - Collectives overlapped with compute -===//
//
// Issue 30's acceptance for the asynchronous gradient buckets (ParallelModuleOptions::overlap),
// on forked ranks over Gloo:
//   - OverlapComm: an asynchronous all-reduce under an injected latency (setInjectedCommLatency, a
//     slow network) while the rank computes: the wait blocks for less than the latency by about
//     the compute that ran meanwhile, the time in flight covers the latency, the result is the
//     sum; the blocking call pays the whole latency. An asynchronous wait whose peer never issues
//     times out with the one-line CommError of a blocking call.
//   - OverlapLatency: a ddp plan with small buckets under an injected latency: with overlap the
//     buckets are issued during backward and their latencies run behind the rest of backward and
//     each other (exposed time well under one latency per bucket), the gradients equal the
//     single-process model's; without overlap every bucket blocks for the whole latency.
//   - FsdpGroups: a fsdp plan's gather groups: one all-gather, one re-gather and (with overlap) one
//     reduce-scatter per group, fewer calls than sharded parameters, the calls and bytes that
//     pricedComm counts, the single-process model's gradients.
//   - OverlapModels: sharded == single process (outputs, gradients, 3 SGD steps' losses) with
//     overlap on (small buckets: several issued asynchronously during backward; fsdp's parameter
//     gathers issued ahead of their use in forward and its re-gathers in backward, its gradient
//     reduce-scatters asynchronous in backward) and off (no asynchronous call).
//
//===----------------------------------------------------------------------===//
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "apc/artifact/artifact.h"
#include "apc/mesh/device_mesh.h"
#include "apc/runtime/comm.h"
#include "apc/runtime/host_allocator.h"
#include "apc/runtime/parallel_module.h"
#include "rank_harness.h"

// A namespace of its own: the files of runtime_test are compiled together (unity build).
namespace apc::runtime::overlap_test {
namespace {

using testing::ModelCase;
using testing::Reference;

constexpr int kSteps = 3;
constexpr double kLr = 0.5;
constexpr double kRtol = 1e-5;

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// A world of `ranks` ranks on a 1-d mesh from the torchrun variables runRanks sets.
std::shared_ptr<World> makeWorld(int ranks, std::chrono::milliseconds timeout,
                                 testing::RankLog& log) {
  auto env = launchEnvFromEnvironment();
  if (!env.ok()) {
    log.fail(env.error().message());
    return nullptr;
  }
  auto mesh = mesh::DeviceMesh::create({ranks}, {"dp"});
  if (!mesh.ok()) {
    log.fail(mesh.error().message());
    return nullptr;
  }
  WorldOptions options;
  options.timeout = timeout;
  options.timeouts_from_environment = false;
  auto world = World::create(*env, *mesh, options);
  if (!world.ok()) {
    log.fail(world.error().message());
    return nullptr;
  }
  return *world;
}

// --- the communicator -----------------------------------------------------------------------

constexpr double kLatency = 0.2;  // seconds injected per collective
constexpr double kCompute = 0.1;  // seconds of matmuls between issue and wait

TEST(OverlapComm, AsyncAllReduceHidesInjectedLatencyBehindCompute) {
  std::vector<std::string> failed = testing::runRanks(2, [](int rank) {
    testing::RankLog log(rank);
    at::set_num_threads(1);
    std::shared_ptr<World> world = makeWorld(2, std::chrono::milliseconds(60'000), log);
    if (!world) return 1;
    Communicator& comm = world->dim(0);
    setInjectedCommLatency(std::chrono::milliseconds(static_cast<int>(kLatency * 1000)));
    // Blocking: the whole latency is exposed.
    at::Tensor a = at::full({1000}, static_cast<double>(rank + 1), at::kFloat);
    comm.resetStats();
    comm.allReduce(a, mesh::ReduceOp::kSum);
    const CommStats sync = comm.stats();
    if (!a.eq(3).all().item<bool>()) log.fail("blocking all-reduce: wrong sum");
    if (sync.seconds < kLatency * 0.99)
      log.fail("blocking all-reduce exposed " + std::to_string(sync.seconds) + " s, under " +
               std::to_string(kLatency));
    if (std::abs(sync.in_flight_seconds - sync.seconds) > 1e-9 || sync.async_calls != 0)
      log.fail("a blocking call is in flight exactly while it blocks");
    // Asynchronous: compute for kCompute seconds between issue and wait.
    at::Tensor b = at::full({1000}, static_cast<double>(rank + 1), at::kFloat);
    comm.resetStats();
    std::unique_ptr<PendingCollective> pending = comm.allReduceAsync(b, mesh::ReduceOp::kSum);
    const auto c0 = std::chrono::steady_clock::now();
    at::Tensor m = at::rand({96, 96}, at::kFloat);
    at::Tensor acc = at::zeros({96, 96}, at::kFloat);
    int64_t matmuls = 0;
    while (secondsSince(c0) < kCompute) {
      acc.add_(at::mm(m, m));
      ++matmuls;
    }
    const double computed = secondsSince(c0);
    pending->wait();
    pending->wait();  // a second wait returns at once and counts nothing
    const CommStats async = comm.stats();
    if (!b.eq(3).all().item<bool>()) log.fail("asynchronous all-reduce: wrong sum");
    if (matmuls == 0 || !acc.isfinite().all().item<bool>()) log.fail("no compute ran");
    if (async.async_calls != 1 || async.calls != 1)
      log.fail("expected one asynchronous call, got " + std::to_string(async.async_calls));
    if (async.in_flight_seconds < kLatency * 0.99)
      log.fail("in flight " + std::to_string(async.in_flight_seconds) + " s, under the latency");
    if (std::abs(async.busy_seconds - async.in_flight_seconds) > 1e-6)
      log.fail("one call: busy while in flight");
    // The wait blocked for what the compute did not cover (plus scheduling slack on a loaded
    // machine; still under the latency).
    if (async.seconds > kLatency - computed + 0.08)
      log.fail("asynchronous all-reduce exposed " + std::to_string(async.seconds) + " s with " +
               std::to_string(computed) + " s of compute meanwhile (latency " +
               std::to_string(kLatency) + " s)");
    const double hidden = async.in_flight_seconds - async.seconds;
    if (hidden < computed - 0.08)
      log.fail("hidden " + std::to_string(hidden) + " s, the compute meanwhile took " +
               std::to_string(computed) + " s");
    setInjectedCommLatency(std::chrono::milliseconds(0));
    return log.exitCode();
  });
  for (const std::string& f : failed) ADD_FAILURE() << f;
}

// A collective frees what it allocated before it returns, on the caller's thread: Gloo marks a
// Work completed before its worker thread drops its own reference, and the Work's tensors were
// freed by whichever reference went last, the worker's now and then. The step's peak memory then
// changed from run to run (hf_llama_tiny's fsdp plan measured 3.15 or 3.56 MiB), apart from what
// the memory model predicts. Each kind, blocking and asynchronous, many times: once its result is
// dropped, the live bytes of apc's host allocator are those before the call.
TEST(OverlapComm, ACollectiveFreesItsBuffersWhenItReturns) {
  std::vector<std::string> failed = testing::runRanks(2, [](int rank) {
    testing::RankLog log(rank);
    at::set_num_threads(1);
    if (!useCachingHostAllocator()) {
      log.fail("the caching host allocator is not installed");
      return log.exitCode();
    }
    std::shared_ptr<World> world = makeWorld(2, std::chrono::milliseconds(60'000), log);
    if (!world) return 1;
    Communicator& comm = world->dim(0);
    const std::vector<int64_t> pieces = {16384, 16384};  // 64 KiB of f32 per rank
    using Kind = std::function<void(const at::Tensor&)>;
    const std::vector<std::pair<std::string, Kind>> kinds = {
        {"all-gather", [&](const at::Tensor& x) { (void)comm.allGather(x, 0, pieces); }},
        {"reduce-scatter",
         [&](const at::Tensor& x) {
           (void)comm.reduceScatter(at::cat({x, x}), 0, mesh::ReduceOp::kSum);
         }},
        {"asynchronous all-gather",
         [&](const at::Tensor& x) { (void)comm.allGatherAsync(x, 0, pieces)->wait(); }},
        {"asynchronous reduce-scatter",
         [&](const at::Tensor& x) {
           (void)comm.reduceScatterAsync(at::cat({x, x}), 0, mesh::ReduceOp::kSum)->wait();
         }},
        {"asynchronous all-reduce", [&](const at::Tensor& x) {
           at::Tensor y = x.clone();
           (void)comm.allReduceAsync(y, mesh::ReduceOp::kSum)->wait();
         }}};
    for (const auto& [name, run] : kinds) {
      int leaked = 0;
      int64_t most = 0;
      for (int i = 0; i < 100; ++i) {
        at::Tensor x = at::full({pieces[0]}, static_cast<double>(rank + i), at::kFloat);
        const int64_t before = hostAllocatorStats().allocated_bytes;
        run(x);
        const int64_t after = hostAllocatorStats().allocated_bytes;
        if (after != before) {
          ++leaked;
          most = std::max(most, after - before);
        }
      }
      if (leaked > 0)
        log.fail(name + ": " + std::to_string(leaked) + " of 100 calls returned with up to " +
                 std::to_string(most) + " bytes still held");
    }
    return log.exitCode();
  });
  for (const std::string& f : failed) ADD_FAILURE() << f;
}

TEST(OverlapComm, AsyncWaitTimesOutWithTheGroupNamed) {
  std::vector<std::string> failed = testing::runRanks(2, [](int rank) {
    testing::RankLog log(rank);
    std::shared_ptr<World> world = makeWorld(2, std::chrono::milliseconds(500), log);
    if (!world) return 1;
    if (rank == 1) {
      // Never issues: rank 0's wait must give up after the timeout, not hang.
      std::this_thread::sleep_for(std::chrono::seconds(4));
      return log.exitCode();
    }
    at::Tensor t = at::ones({16}, at::kFloat);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      std::unique_ptr<PendingCollective> pending =
          world->dim(0).allReduceAsync(t, mesh::ReduceOp::kSum);
      pending->wait();
      log.fail("the wait returned without the peer");
    } catch (const CommError& e) {
      const std::string what = e.what();
      if (what.find("mesh dim 0 (dp) ranks {0,1}: all-reduce timed out after 500 ms") ==
              std::string::npos ||
          what.find('\n') != std::string::npos)
        log.fail("unexpected error text: " + what);
    }
    if (secondsSince(t0) > 3.0)
      log.fail("the timeout took " + std::to_string(secondsSince(t0)) + " s");
    return log.exitCode();
  });
  for (const std::string& f : failed) ADD_FAILURE() << f;
}

// --- the gradient buckets -------------------------------------------------------------------

const ModelCase& mlpStack() {
  static const ModelCase m{"mlp_stack", {"x:f32[8,4,128]"}, 0, ""};
  return m;
}

const Reference& referenceFor(const ModelCase& m) {
  static std::map<std::string, Reference> cache;
  auto it = cache.find(m.model);
  if (it == cache.end())
    it = cache.emplace(m.model, testing::computeReference(m, kSteps, kLr)).first;
  return it->second;
}

bool haveSample(const ModelCase& m) {
  return std::filesystem::exists(testing::samplePath(m.model)) &&
         std::filesystem::exists(testing::samplePath(m.model, m.format));
}

/// What one rank's backward did with its all-reduces (the gradient buckets, in a ddp plan).
struct BackwardComm {
  CommStats all_reduce;  // by_kind[all-reduce] summed over mesh dims, as CommStats
  double backward_seconds = 0;
};

/// One rank: forward and backward once (under the current injected latency), the all-reduces of
/// the backward, then the gradients against the reference (latency off).
int latencyRank(int rank, const std::string& dir, const Reference& ref,
                const ParallelModuleOptions& options, double latency, BackwardComm& out,
                testing::RankLog& log) {
  std::shared_ptr<ParallelModule> pm = testing::loadRank(dir, ref.init, log, options);
  if (!pm) return 1;
  auto leaves = pm->forwardLeaves(testing::shardInputs(*pm, ref.inputs));
  if (!leaves.ok()) {
    log.fail("forward: " + leaves.error().message());
    return 1;
  }
  std::vector<at::Tensor> outs;
  for (size_t i = 0; i < leaves->size(); ++i)
    outs.push_back(pm->gatherOutput(i, (*leaves)[i].toTensor()));
  at::Tensor loss = testing::lossOf(outs, ref.loss_weights);
  setInjectedCommLatency(std::chrono::milliseconds(static_cast<int>(latency * 1000)));
  pm->resetCommStats();
  const auto t0 = std::chrono::steady_clock::now();
  loss.backward();
  out.backward_seconds = secondsSince(t0);
  setInjectedCommLatency(std::chrono::milliseconds(0));
  for (const CommStats& s : pm->commStatsByMeshDim()) {
    const CommKindStats& k = s.of(CommKind::kAllReduce);
    out.all_reduce.calls += k.calls;
    out.all_reduce.async_calls += k.async_calls;
    out.all_reduce.seconds += k.seconds;
    out.all_reduce.in_flight_seconds += k.in_flight_seconds;
  }
  testing::expectGradsMatch(*pm, ref.grads, kRtol, log);
  return log.exitCode();
}

TEST(OverlapLatency, BucketsIssuedDuringBackwardHideTheInjectedLatency) {
  const ModelCase& m = mlpStack();
  if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = testing::scratchDir("overlap", "latency_ddp_2");
  std::string err = testing::makeArtifact(m, "2", "ddp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const Reference& ref = referenceFor(m);
  constexpr double kBucketLatency = 0.15;
  for (bool overlap : {true, false}) {
    ParallelModuleOptions options;
    options.overlap = overlap;
    options.grad_bucket_bytes = 64 * 1024;  // mlp_stack's 128x128 weights: a bucket each
    std::vector<std::string> failed = testing::runRanks(2, [&](int rank) {
      testing::RankLog log(rank);
      BackwardComm bc;
      if (latencyRank(rank, dir.string(), ref, options, kBucketLatency, bc, log) != 0) return 1;
      const int64_t n = bc.all_reduce.calls;
      const double exposed = bc.all_reduce.seconds, flight = bc.all_reduce.in_flight_seconds;
      const std::string what = std::string(overlap ? "overlap on" : "overlap off") + ": " +
                               std::to_string(n) + " buckets, exposed " + std::to_string(exposed) +
                               " s, in flight " + std::to_string(flight) + " s, backward " +
                               std::to_string(bc.backward_seconds) + " s";
      std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
      if (n < 3) log.fail("expected at least 3 buckets: " + what);
      if (flight < static_cast<double>(n) * kBucketLatency * 0.99)
        log.fail("every bucket is in flight for the latency: " + what);
      if (overlap) {
        if (bc.all_reduce.async_calls != n) log.fail("every bucket asynchronous: " + what);
        // Issued while backward went on: the latencies ran behind it and each other.
        if (exposed > 0.5 * static_cast<double>(n) * kBucketLatency)
          log.fail("the buckets' latency was not hidden: " + what);
      } else {
        if (bc.all_reduce.async_calls != 0) log.fail("no asynchronous bucket: " + what);
        if (exposed < static_cast<double>(n) * kBucketLatency * 0.99)
          log.fail("each blocking bucket pays the latency: " + what);
      }
      return log.exitCode();
    });
    for (const std::string& f : failed) ADD_FAILURE() << f;
  }
  std::filesystem::remove_all(dir);
}

/// DDP's small first bucket (ParallelModuleOptions::first_grad_bucket_bytes): with the default
/// 25 MiB buckets, mlp_stack's gradients (about 1 MiB) are one bucket; a first bucket of 64 KiB
/// closes before the first 128x128 weight's gradient and the rest follow in a second, both
/// asynchronous; the gradients are the reference's either way.
TEST(OverlapLatency, TheFirstBucketIsSmallerAsDdpsIs) {
  const ModelCase& m = mlpStack();
  if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = testing::scratchDir("overlap", "first_bucket_ddp_2");
  std::string err = testing::makeArtifact(m, "2", "ddp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const Reference& ref = referenceFor(m);
  for (const int64_t first : {int64_t{0}, int64_t{64 * 1024}}) {
    ParallelModuleOptions options;
    options.first_grad_bucket_bytes = first;
    std::vector<std::string> failed = testing::runRanks(2, [&](int rank) {
      testing::RankLog log(rank);
      BackwardComm bc;
      if (latencyRank(rank, dir.string(), ref, options, 0.0, bc, log) != 0) return 1;
      const int64_t want = first == 0 ? 1 : 2;
      if (bc.all_reduce.calls != want || bc.all_reduce.async_calls != want)
        log.fail("first bucket " + std::to_string(first) +
                 " bytes: " + std::to_string(bc.all_reduce.calls) + " buckets (" +
                 std::to_string(bc.all_reduce.async_calls) + " asynchronous), expected " +
                 std::to_string(want));
      return log.exitCode();
    });
    for (const std::string& f : failed) ADD_FAILURE() << f;
  }
  std::filesystem::remove_all(dir);
}

// --- FSDP's grouped gathers and reduce-scatters ---------------------------------------------

/// One training step of `pm` on mlp_stack's reference batch, its gradients checked against the
/// single-process model's: the forward's and the backward's collectives, and how many parameters
/// the plan shards (ok false when the step failed; the failure is in `log`).
struct FsdpStep {
  bool ok = false;
  int64_t sharded = 0;
  CommStats forward, backward;
};
FsdpStep fsdpStep(ParallelModule& pm, const Reference& ref, testing::RankLog& log) {
  FsdpStep out;
  for (const PlacedTensor& p : pm.parameterSpecs())
    for (const mesh::Placement& pl : p.placement) out.sharded += pl.isShard() ? 1 : 0;
  pm.resetCommStats();
  auto leaves = pm.forwardLeaves(testing::shardInputs(pm, ref.inputs));
  if (!leaves.ok()) {
    log.fail("forward: " + leaves.error().message());
    return out;
  }
  out.forward = pm.commStats();
  at::Tensor loss = testing::checkedStepLoss(pm, *leaves, ref, 0, kRtol, log);
  if (!loss.defined()) return out;
  pm.resetCommStats();
  loss.backward();
  out.backward = pm.commStats();
  testing::expectGradsMatch(pm, ref.grads, kRtol, log);
  out.ok = true;
  return out;
}

/// What pricedComm counts is what ran: calls and bytes.
void expectPricedCommRan(const ParallelModule& pm, const FsdpStep& st, const std::string& what,
                         testing::RankLog& log) {
  const PricedComm priced = pm.pricedComm();
  if (st.forward.calls != priced.forward_steps || st.backward.calls != priced.backward_steps)
    log.fail(what + "calls forward " + std::to_string(st.forward.calls) + " backward " +
             std::to_string(st.backward.calls) + ", priced " +
             std::to_string(priced.forward_steps) + " + " + std::to_string(priced.backward_steps));
  if (st.forward.bytes_sent + st.backward.bytes_sent != priced.wire_bytes)
    log.fail(what + "bytes sent " + std::to_string(st.forward.bytes_sent + st.backward.bytes_sent) +
             ", priced " + std::to_string(priced.wire_bytes));
}

/// One training step of artifact `dir` on `ranks` ranks (fsdpStep: gradients checked against the
/// single-process model's), once with overlap and once without; each rank's step goes to `check`
/// (the module, the step, whether overlap was on, the prefix of its messages).
void stepWithOverlapOnAndOff(
    const std::string& dir, int ranks, const Reference& ref,
    const std::function<void(const ParallelModule&, const FsdpStep&, bool, const std::string&,
                             testing::RankLog&)>& check) {
  for (bool overlap : {true, false}) {
    std::vector<std::string> failed = testing::runRanks(ranks, [&](int rank) {
      testing::RankLog log(rank);
      ParallelModuleOptions options;
      options.overlap = overlap;
      std::shared_ptr<ParallelModule> pm = testing::loadRank(dir, ref.init, log, options);
      if (!pm) return 1;
      const FsdpStep st = fsdpStep(*pm, ref, log);
      if (!st.ok) return 1;
      check(*pm, st, overlap,
            "rank " + std::to_string(rank) + (overlap ? ", overlap on: " : ", overlap off: "), log);
      return log.exitCode();
    });
    for (const std::string& f : failed) ADD_FAILURE() << f;
  }
}

/// FSDP's grouped collectives in one step: the gathers, the re-gathers and the gradient
/// reductions each at most half as many calls as sharded placements (one call each on their
/// own), no asynchronous call without overlap, and the calls and bytes pricedComm counts.
void expectGroupedStep(const ParallelModule& pm, const FsdpStep& st, bool overlap,
                       const std::string& what, testing::RankLog& log) {
  const int64_t gathers = st.forward.of(CommKind::kAllGather).calls;
  const int64_t regathers = st.backward.of(CommKind::kAllGather).calls;
  const int64_t reduces =
      st.backward.of(CommKind::kAllReduce).calls + st.backward.of(CommKind::kReduceScatter).calls;
  const std::string counts = std::to_string(st.sharded) + " sharded placements, " +
                             std::to_string(gathers) + " gathers, " + std::to_string(regathers) +
                             " re-gathers, " + std::to_string(reduces) + " gradient reductions";
  std::fprintf(stderr, "%s%s\n", what.c_str(), counts.c_str());
  if (gathers == 0 || 2 * gathers > st.sharded)
    log.fail(what + "the gathers are not grouped: " + counts);
  if (regathers == 0 || 2 * regathers > st.sharded)
    log.fail(what + "the re-gathers are not grouped: " + counts);
  if (reduces == 0 || 2 * reduces > st.sharded)
    log.fail(what + "the gradient reductions are not grouped: " + counts);
  if (!overlap && st.forward.async_calls + st.backward.async_calls != 0)
    log.fail(what + "an asynchronous call without overlap");
  expectPricedCommRan(pm, st, what, log);
}

/// A fsdp plan of mlp_stack on 2 ranks: a gather group's parameters (blocks of 0.5 MiB: two per
/// group, artifact::kMinGatherGroupBytes) are gathered by ONE all-gather in forward and ONE in
/// backward (the re-gather), and their gradients reduced by ONE reduce-scatter, with overlap and
/// without (then blocking: no asynchronous call; before, each gradient was reduced on its own, and
/// mlp_stack's fsdp step took 39 ms against 16 with overlap): fewer calls per step than sharded
/// parameters; the calls and bytes measured are the ones pricedComm counts; outputs and gradients
/// equal the single-process model's.
TEST(FsdpGroups, OneGatherAndOneReduceScatterPerGroupWithTheSameGradients) {
  const ModelCase& m = mlpStack();
  if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = testing::scratchDir("overlap", "fsdp_groups_2");
  std::string err = testing::makeArtifact(m, "2", "fsdp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  stepWithOverlapOnAndOff(dir.string(), 2, referenceFor(m),
                          [](const ParallelModule& pm, const FsdpStep& st, bool overlap,
                             const std::string& what, testing::RankLog& log) {
                            if (st.sharded < 8)
                              log.fail(what + "expected mlp_stack's parameters sharded");
                            expectGroupedStep(pm, st, overlap, what, log);  // even shards
                          });
  std::filesystem::remove_all(dir);
}

/// Links that price a small gradient's all-reduce then slice below its reduce-scatter (a low
/// all-reduce latency) and a large one's above it (a narrow all-reduce link), as a calibrated CPU
/// cluster does on Gloo: an fsdp plan of mlp_stack then takes its biases' gradients by all-reduce
/// and its weights' by reduce-scatter, within one layer. Its gather groups still hold whole layers
/// (artifact::paramGatherGroups does not split them by gradient form), and a group holding both
/// forms reduces by ONE all-reduce (GroupedReduceScatter): grouped calls, the bytes pricedComm
/// counts, and gradients equal to the single-process model's.
TEST(FsdpGroups, AGroupOfBothGradientFormsReducesByOneAllReduce) {
  const ModelCase& m = mlpStack();
  if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = testing::scratchDir("overlap", "fsdp_mixed_2");
  const std::string spec = dir.string() + ".spec.json";
  {
    std::ofstream out(spec);
    out << R"({"mesh": {"shape": [2]}, "network": [{)"
           R"("all-reduce": {"bandwidth_gbps": 1, "latency_us": 100},)"
           R"("reduce-scatter": {"bandwidth_gbps": 100, "latency_us": 300}}]})";
  }
  ModelCase mixed = m;
  mixed.optimizer_flags = "--strategy fsdp --spec " + spec;
  std::string err = testing::makeArtifact(mixed, "2", "", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  // Both forms in one program, and in one group.
  auto prog = artifact::readProgram(dir.string(), 0);
  ASSERT_TRUE(prog.ok()) << prog.error().message();
  const std::vector<int> groups = artifact::paramGatherGroups(*prog);
  std::map<int, std::set<artifact::GatherGradientForm>> forms;
  for (size_t i = 0; i < groups.size(); ++i)
    if (groups[i] >= 0)
      forms[groups[i]].insert(artifact::gatherGradientForm(prog->redistributions(
          static_cast<int>(prog->node_redistribution(static_cast<int>(i)) - 1))));
  bool both = false;
  for (const auto& [g, f] : forms)
    both |= f.count(artifact::GatherGradientForm::kReduceScatter) &&
            f.count(artifact::GatherGradientForm::kAllReduceSlice);
  ASSERT_TRUE(both) << "the links should make a group of both gradient forms";
  const Reference& ref = referenceFor(m);
  std::vector<std::string> failed = testing::runRanks(2, [&](int rank) {
    testing::RankLog log(rank);
    std::shared_ptr<ParallelModule> pm = testing::loadRank(dir.string(), ref.init, log, {});
    if (!pm) return 1;
    const FsdpStep st = fsdpStep(*pm, ref, log);
    if (!st.ok) return 1;
    const int64_t sharded = st.sharded;
    const CommStats& forward = st.forward;
    const CommStats& backward = st.backward;
    const int64_t gathers = forward.of(CommKind::kAllGather).calls;
    const int64_t reduces =
        backward.of(CommKind::kAllReduce).calls + backward.of(CommKind::kReduceScatter).calls;
    const std::string counts = std::to_string(sharded) + " sharded parameters, " +
                               std::to_string(gathers) + " gathers, " + std::to_string(reduces) +
                               " gradient reductions";
    if (sharded < 8) log.fail("expected mlp_stack's parameters sharded: " + counts);
    if (gathers == 0 || 2 * gathers > sharded) log.fail("the gathers are not grouped: " + counts);
    if (reduces == 0 || 2 * reduces > sharded)
      log.fail("the gradient reductions are not grouped: " + counts);
    expectPricedCommRan(*pm, st, "", log);
    return log.exitCode();
  });
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(spec);
}

/// FSDP over both dims of a 2x2 mesh (every parameter Shard(0) on both, 4 ranks): each gather is
/// two all-gathers (one per mesh dim) and each gradient a chain of reductions and slices over both.
/// A gather group runs each step as ONE call for all its members (GroupedGather), in forward and
/// in the re-gather, and its gradients' chain one call per collective step (GroupedReduceScatter),
/// with overlap and without: before, every parameter ran its own steps, blocking
/// (hf_llama_tiny's 2x2 fsdp step: 126 calls, 220 ms; grouped: 42 calls, 69 ms). The calls and
/// bytes are the ones pricedComm counts; gradients equal the single-process model's.
TEST(FsdpGroups, GathersOverBothDimsOfA2dMeshRunOneCallPerStepPerGroup) {
  const ModelCase& m = mlpStack();
  if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = testing::scratchDir("overlap", "fsdp_groups_2x2");
  std::string err = testing::makeArtifact(m, "2x2", "fsdp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  // The groups hold gathers over both mesh dims, whose gradients are chains.
  auto prog = artifact::readProgram(dir.string(), 0);
  ASSERT_TRUE(prog.ok()) << prog.error().message();
  const std::vector<int> groups = artifact::paramGatherGroups(*prog);
  int64_t chained = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i] < 0) continue;
    const proto::Redistribution& red =
        prog->redistributions(static_cast<int>(prog->node_redistribution(static_cast<int>(i)) - 1));
    if (red.forward_size() == 2 &&
        artifact::gatherGradientForm(red) == artifact::GatherGradientForm::kChain)
      ++chained;
  }
  ASSERT_GE(chained, 4) << "expected grouped gathers over both mesh dims";
  stepWithOverlapOnAndOff(dir.string(), 4, referenceFor(m),
                          [](const ParallelModule& pm, const FsdpStep& st, bool overlap,
                             const std::string& what, testing::RankLog& log) {
                            if (st.sharded < 16)
                              log.fail(what + "expected every parameter sharded twice");
                            expectGroupedStep(pm, st, overlap, what, log);
                          });
  std::filesystem::remove_all(dir);
}

/// DDP over both dims of a 2x2 mesh (every parameter replicated, the batch sharded on both): each
/// gradient is an all-reduce on each mesh dim. They are bucketed as on one dim (a bucket's
/// all-reduce runs once per mesh dim), with overlap and without: before, such a gradient was no
/// bucketed edge and every parameter ran its own two blocking all-reduces (hf_llama_tiny's 2x2
/// ddp step: 42 calls, 96-104 ms on 4 CPU ranks). Gradients equal the single-process model's.
TEST(DdpBuckets, BothDimsOfA2dMeshReduceByBucket) {
  const ModelCase& m = mlpStack();
  if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir = testing::scratchDir("overlap", "ddp_2x2");
  std::string err = testing::makeArtifact(m, "2x2", "ddp", dir.string());
  ASSERT_TRUE(err.empty()) << err;
  auto prog = artifact::readProgram(dir.string(), 0);
  ASSERT_TRUE(prog.ok()) << prog.error().message();
  int64_t two_dims = 0;
  for (const proto::Redistribution& r : prog->redistributions())
    if (r.bucketed_gradient() && r.backward_size() == 2) ++two_dims;
  ASSERT_GE(two_dims, 8) << "expected gradients all-reduced on both mesh dims, bucketed";
  stepWithOverlapOnAndOff(dir.string(), 4, referenceFor(m),
                          [](const ParallelModule& pm, const FsdpStep& st, bool,
                             const std::string& what, testing::RankLog& log) {
                            const int64_t params = static_cast<int64_t>(pm.parameterSpecs().size());
                            const int64_t reduces = st.backward.of(CommKind::kAllReduce).calls;
                            const std::string counts = std::to_string(params) + " parameters, " +
                                                       std::to_string(reduces) +
                                                       " gradient all-reduces";
                            std::fprintf(stderr, "%s%s\n", what.c_str(), counts.c_str());
                            if (st.sharded != 0)
                              log.fail(what + "expected every parameter replicated: " + counts);
                            if (reduces == 0 || 4 * reduces > params)
                              log.fail(what + "the gradients are not bucketed: " + counts);
                          });
  std::filesystem::remove_all(dir);
}

/// Every repeated layer checkpointed (--checkpoint all), on 2 ranks: a segment's recomputation in
/// backward gathers its parameters by gather unit, as the plan prices them, and hands their
/// gradients to the same reductions as the forward's edges (counted by the segment's forward),
/// with overlap and without. fsdp: the backward gathers no more often than the forward (one call
/// per unit: before, every parameter's recompute gather and reduce-scatter ran on its own,
/// blocking: mlp_stack made 16 and 16 calls a step where the plan priced 2 and 2, and the step took
/// 65-75 ms against 20-28 without checkpointing), the calls and bytes pricedComm counts; no gather
/// group mixes gathers inside segments with gathers outside (the recomputation gathers the ones,
/// the re-gather the others: llama_tiny's embedding and head). ddp: the gradients go by the
/// buckets (a few calls, not one per parameter). Gradients equal the single-process model's.
TEST(FsdpGroups, CheckpointedLayersRecomputeByUnitsAndReduceAsTheForwardWould) {
  const ModelCase llama{"llama_tiny", {"tokens:i64[8,8]"}, 256, ""};
  const std::vector<std::pair<const ModelCase*, std::string>> cases = {
      {&mlpStack(), "fsdp"}, {&mlpStack(), "ddp"}, {&llama, "fsdp"}};
  for (const auto& [mc, strategy] : cases) {
    const ModelCase& m = *mc;
    if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
    const Reference& ref = referenceFor(m);
    std::filesystem::path dir = testing::scratchDir("overlap", "ckpt_" + m.model + "_" + strategy);
    std::string err =
        testing::makeArtifact(m, "2", strategy, dir.string(), "--checkpoint all --optimizer sgd");
    ASSERT_TRUE(err.empty()) << err;
    auto prog = artifact::readProgram(dir.string(), 0);
    ASSERT_TRUE(prog.ok()) << prog.error().message();
    ASSERT_GE(prog->checkpoints_size(), 2) << m.model << ": expected checkpointed layers";
    const std::vector<int> groups = artifact::paramGatherGroups(*prog);
    std::map<int, std::set<bool>> inside;  // per group: whether its gathers lie in segments
    for (size_t node = 0; node < groups.size(); ++node) {
      if (groups[node] < 0) continue;
      bool in = false;
      for (const proto::CheckpointSegment& c : prog->checkpoints())
        in = in || (node >= c.first() && node <= c.last());
      inside[groups[node]].insert(in);
    }
    for (const auto& [group, where] : inside)
      EXPECT_EQ(where.size(), 1u) << m.model << ": gather group " << group
                                  << " mixes gathers inside checkpoint segments and outside";
    for (bool overlap : {true, false}) {
      std::vector<std::string> failed = testing::runRanks(2, [&](int rank) {
        testing::RankLog log(rank);
        ParallelModuleOptions options;
        options.overlap = overlap;
        std::shared_ptr<ParallelModule> pm =
            testing::loadRank(dir.string(), ref.init, log, options);
        if (!pm) return 1;
        const std::string what =
            m.model + " " + strategy + (overlap ? ", overlap on: " : ", overlap off: ");
        const FsdpStep st = fsdpStep(*pm, ref, log);
        if (!st.ok) return 1;
        const int64_t params = static_cast<int64_t>(pm->parameterSpecs().size());
        const int64_t gathers = st.forward.of(CommKind::kAllGather).calls;
        const int64_t regathers = st.backward.of(CommKind::kAllGather).calls;
        const int64_t scatters = st.backward.of(CommKind::kReduceScatter).calls;
        const int64_t reduces = st.backward.of(CommKind::kAllReduce).calls;
        const std::string counts =
            std::to_string(params) + " parameters (" + std::to_string(st.sharded) + " sharded), " +
            std::to_string(gathers) + " gathers, " + std::to_string(regathers) +
            " backward gathers, " + std::to_string(scatters) + " reduce-scatters, " +
            std::to_string(reduces) + " all-reduces";
        std::fprintf(stderr, "rank %d: %s%s\n", rank, what.c_str(), counts.c_str());
        if (params < 8) log.fail(what + "expected 8 parameters or more: " + counts);
        if (strategy == "fsdp") {
          if (st.sharded < 8) log.fail(what + "expected the parameters sharded: " + counts);
          if (gathers == 0 || 2 * gathers > st.sharded)
            log.fail(what + "the gathers are not grouped: " + counts);
          if (regathers > gathers)
            log.fail(what + "the recomputations do not gather by the forward's units: " + counts);
          if (scatters + reduces == 0 || 2 * (scatters + reduces) > st.sharded)
            log.fail(what + "the gradient reductions are not grouped: " + counts);
          expectPricedCommRan(*pm, st, what, log);
        } else {
          if (st.sharded != 0) log.fail(what + "expected every parameter replicated: " + counts);
          if (reduces == 0 || 4 * reduces > params)
            log.fail(what + "the gradients are not bucketed: " + counts);
        }
        if (overlap && st.backward.async_calls == 0)
          log.fail(what + "no asynchronous reduction in backward: " + counts);
        if (!overlap && st.forward.async_calls + st.backward.async_calls != 0)
          log.fail(what + "an asynchronous call without overlap");
        return log.exitCode();
      });
      for (const std::string& f : failed) ADD_FAILURE() << f;
    }
    std::filesystem::remove_all(dir);
  }
}

// --- sharded == single process, overlap on and off ------------------------------------------

struct OverlapCase {
  std::string model;
  std::vector<std::string> inputs;
  int64_t index_bound = 0;
  std::string mesh;
  std::string strategy;
  bool overlap = true;
};

int trainRank(int rank, const std::string& dir, const Reference& ref, const OverlapCase& c) {
  testing::RankLog log(rank);
  ParallelModuleOptions options;
  options.overlap = c.overlap;
  options.grad_bucket_bytes = 64 * 1024;
  std::shared_ptr<ParallelModule> loaded = testing::loadRank(dir, ref.init, log, options);
  if (!loaded) return 1;
  ParallelModule& pm = *loaded;
  std::vector<at::Tensor> params = pm.parameters();
  for (int step = 0; step < kSteps; ++step) {
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
    std::vector<c10::IValue> inputs = testing::shardInputs(pm, ref.inputs);
    pm.resetCommStats();
    auto leaves = pm.forwardLeaves(inputs);
    if (!leaves.ok()) {
      log.fail("forward: " + leaves.error().message());
      return 1;
    }
    // FSDP's parameter gathers: issued ahead (prefetch) with overlap, blocking without.
    const CommKindStats gathers = pm.commStats().of(CommKind::kAllGather);
    if (step == 0 && c.strategy == "fsdp") {
      if (gathers.calls == 0) log.fail("an fsdp forward gathered no parameter");
      // On 2x2 a parameter's gather is two steps (one per mesh dim): not issued ahead.
      if (c.overlap && c.mesh == "2" && gathers.async_calls == 0)
        log.fail("no parameter gather was issued ahead");
      if (!c.overlap && gathers.async_calls != 0) log.fail("overlap off issued a gather ahead");
    }
    at::Tensor loss = testing::checkedStepLoss(pm, *leaves, ref, step, kRtol, log);
    if (!loss.defined()) return 1;
    pm.resetCommStats();
    loss.backward();
    const CommStats comm = pm.commStats();
    if (step == 0) {
      testing::expectGradsMatch(pm, ref.grads, kRtol, log);
      if (!c.overlap && comm.async_calls != 0)
        log.fail("overlap off issued " + std::to_string(comm.async_calls) + " asynchronous calls");
      // FSDP's gradient reduce-scatters: issued asynchronously in backward with overlap.
      const CommKindStats rs = comm.of(CommKind::kReduceScatter);
      if (c.strategy == "fsdp" && c.mesh == "2" && c.overlap &&
          (rs.calls == 0 || rs.async_calls != rs.calls))
        log.fail("overlap on: " + std::to_string(rs.async_calls) + " of " +
                 std::to_string(rs.calls) + " reduce-scatters asynchronous");
      // Its re-gathers in backward (reshard after forward): prefetched one ahead with overlap.
      const CommKindStats regathers = comm.of(CommKind::kAllGather);
      if (c.strategy == "fsdp" && c.mesh == "2" && c.overlap &&
          (regathers.calls == 0 || regathers.async_calls == 0))
        log.fail("overlap on: " + std::to_string(regathers.async_calls) + " of " +
                 std::to_string(regathers.calls) + " re-gathers in backward issued ahead");
      if (c.overlap && c.strategy == "ddp" && c.mesh == "2" && comm.async_calls < 2)
        log.fail("overlap on issued " + std::to_string(comm.async_calls) +
                 " asynchronous bucket(s), expected several");
    }
    at::NoGradGuard no_grad;
    for (at::Tensor& p : params)
      if (p.grad().defined()) p.sub_(p.grad() * ref.lr);
  }
  return log.exitCode();
}

class OverlapModels : public ::testing::TestWithParam<OverlapCase> {};

TEST_P(OverlapModels, ShardedMatchesSingleProcess) {
  const OverlapCase& c = GetParam();
  const ModelCase m{c.model, c.inputs, c.index_bound, ""};
  if (!haveSample(m)) GTEST_SKIP() << "run sample_models/generate.py";
  std::filesystem::path dir =
      testing::scratchDir("overlap", c.model + "_" + c.strategy + (c.overlap ? "_on" : "_off"));
  std::string err = testing::makeArtifact(m, c.mesh, c.strategy, dir.string());
  ASSERT_TRUE(err.empty()) << err;
  const Reference& ref = referenceFor(m);
  int world = 1;
  for (char ch : c.mesh)
    if (ch >= '2' && ch <= '9') world *= ch - '0';
  std::vector<std::string> failed =
      testing::runRanks(world, [&](int rank) { return trainRank(rank, dir.string(), ref, c); });
  for (const std::string& f : failed) ADD_FAILURE() << f;
  std::filesystem::remove_all(dir);
}

std::vector<OverlapCase> overlapCases() {
  std::vector<OverlapCase> cases;
  for (bool overlap : {true, false}) {
    cases.push_back({"mlp_stack", {"x:f32[8,4,128]"}, 0, "2", "ddp", overlap});
    cases.push_back({"mlp_stack", {"x:f32[8,4,128]"}, 0, "2", "fsdp", overlap});
    cases.push_back(
        {"gpt2_tiny_loss", {"idx:i64[8,8]", "targets:i64[8,8]"}, 50257, "2", "ddp", overlap});
    // On 2x2 a ddp gradient returns through two all-reduces: not bucketed, blocking either way.
    cases.push_back(
        {"gpt2_tiny_loss", {"idx:i64[8,8]", "targets:i64[8,8]"}, 50257, "2x2", "fsdp", overlap});
    cases.push_back({"llama_tiny", {"tokens:i64[8,8]"}, 256, "2", "", overlap});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Models, OverlapModels, ::testing::ValuesIn(overlapCases()),
                         [](const ::testing::TestParamInfo<OverlapCase>& info) {
                           return testing::paramName(
                               info.param.model + "_" + info.param.mesh + "_" +
                               (info.param.strategy.empty() ? "opt" : info.param.strategy) +
                               (info.param.overlap ? "_on" : "_off"));
                         });

}  // namespace
}  // namespace apc::runtime::overlap_test
