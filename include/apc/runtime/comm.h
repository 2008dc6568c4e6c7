//===- apc/runtime/comm.h - Collectives on the groups of one mesh dim -------===//
//
// The runtime talks to other ranks only through this interface. A Communicator is the group of
// ranks that differ from this rank only in the coordinate of one mesh dim (DeviceMesh::group), with
// this rank's index in it = its coordinate along that dim. The collectives are exactly the steps of
// apc/cost/redistribute.h, with torch.chunk semantics for uneven pieces (a piece may be empty):
//
//   allGather(local, dim, sizes)     S(dim) -> R: concatenation of the members' locals along dim;
//                                    sizes[k] is member k's size along dim
//   allReduce(t, op)                 P(op) -> R, in place
//   reduceScatter(full, dim, op)     P(op) -> S(dim): reduce, keep torch.chunk piece `index()`
//   allToAll(local, gather_dim, shard_dim, gather_sizes)
//                                    S(gather_dim) -> S(shard_dim): cut local along shard_dim into
//                                    size() torch.chunk pieces, send piece q to member q,
//                                    concatenate arrivals along gather_dim (gather_sizes[k]: member
//                                    k's size along gather_dim)
//
// Both backends run through one implementation over c10d's process groups (ProcessGroupGloo on
// CPU tensors, ProcessGroupNCCL on CUDA tensors with a CUDA LibTorch). Every call waits at most
// the configured timeout; a peer that died or never arrives raises a CommError naming the group,
// never hangs. allReduceAsync / allGatherAsync / reduceScatterAsync issue a collective and return a
// PendingCollective (c10d's Work handle) to wait on later, with the same timeout: the gradient
// buckets overlap their reductions with the rest of backward, FSDP's gradient reduce-scatters run
// behind the rest of backward, and the forward gathers parameters ahead of their use, this way
// (ParallelModuleOptions::overlap). The stats keep, per kind,
// the time this rank was blocked (exposed) and the time the calls were in flight. Counters record
// the bytes this rank sent, for the benchmark that compares them with what the plan priced (the
// formula per collective is in lib/runtime/c10d_comm.cpp; for even pieces it is that of
// apc/cost/collectives.h).
//
// Contract: every member calls the same collectives in the same order with consistent sizes;
// inputs may be non-contiguous; results never alias inputs. Failures are exceptions of type
// CommError (the collectives run inside autograd functions, where exceptions are the only
// channel), one line: "mesh dim 1 (tp) ranks {2,3}: all-gather timed out after 1500 ms", or
// "... all-reduce failed: Connection closed by peer [127.0.0.1]:4242". After a CommError the
// group is unusable: report and exit. Not thread-safe: one thread per World.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/support/error.h"

namespace apc::runtime {

/// A failed or timed-out collective: one line naming the group and what failed.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The collectives a Communicator runs, for per-kind counters.
enum class CommKind : uint8_t {
  kAllGather,
  kAllReduce,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kBarrier,
};
inline constexpr size_t kNumCommKinds = 6;
/// "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "broadcast", "barrier".
const char* commKindName(CommKind kind);

/// Counters of one collective kind.
struct CommKindStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;
  double seconds = 0;  // wall time this rank was blocked in these calls (exposed)
  /// Wall time these calls were in flight, from issue to completion; equal to `seconds` for a
  /// blocking call, larger for an asynchronous one whose wait came later (the difference ran
  /// behind this rank's other work: hidden).
  double in_flight_seconds = 0;
  int64_t async_calls = 0;  // of `calls`, those issued asynchronously (the *Async calls)
};

struct CommStats {
  int64_t calls = 0;
  int64_t bytes_sent = 0;  // payload bytes this rank put on the wire (its share of each collective)
  /// Wall time this rank spent blocked in collectives (start to completed wait). With
  /// setSynchronizedCommTiming(true) a CUDA collective is timed from a synchronized device to its
  /// completion on the device; otherwise the time until the backend's wait returns.
  double seconds = 0;
  /// Issue to completion, summed over the calls (CommKindStats::in_flight_seconds): with
  /// asynchronous calls, in_flight_seconds - seconds is the communication hidden behind other work.
  double in_flight_seconds = 0;
  int64_t async_calls = 0;
  /// Wall time during which at least one of the calls was in flight (the union of their issue to
  /// completion intervals, per communicator; summed over communicators by operator+=). Calls in
  /// flight together count once: busy_seconds - seconds is the communication that ran while this
  /// rank did something else (computed), the hidden time.
  double busy_seconds = 0;
  std::array<CommKindStats, kNumCommKinds> by_kind{};

  CommKindStats& of(CommKind k) { return by_kind[static_cast<size_t>(k)]; }
  const CommKindStats& of(CommKind k) const { return by_kind[static_cast<size_t>(k)]; }
  /// Adds every counter of `o`.
  CommStats& operator+=(const CommStats& o);
  /// Subtracts every counter of `o` (an earlier reading of the same communicators).
  CommStats& operator-=(const CommStats& o);
};

/// When on (profiling), collectives on CUDA tensors synchronize the device before they start and
/// after their wait, so that CommStats::seconds is the collective's own time (NCCL's wait only
/// orders streams). Off by default: it serializes compute and communication. Process-wide.
void setSynchronizedCommTiming(bool on);
bool synchronizedCommTiming();

/// A test hook that simulates a slow network: every collective of this process completes no
/// earlier than `latency` after it was issued (a blocking call sleeps out the rest after its wait;
/// an asynchronous one at its wait, so work done between issue and wait hides it). Zero (the
/// default) turns it off. Process-wide.
void setInjectedCommLatency(std::chrono::milliseconds latency);
std::chrono::milliseconds injectedCommLatency();

/// A collective issued by one of Communicator's *Async calls. wait() blocks until it completes
/// (at most the communicator's timeout, then CommError as for a blocking call) and returns the
/// result (allReduceAsync: the tensor it reduced in place; allGatherAsync: the gathered tensor);
/// its time is then in the communicator's stats; a second wait() returns the result at once. The
/// Communicator must outlive it. Destroying it unwaited leaves the collective to finish on its own
/// (the buffers stay alive); its time is then not counted.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual at::Tensor wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank's index in the group (its coordinate along the mesh dim).
  virtual int index() const = 0;
  virtual int size() const = 0;
  /// "mesh dim 1 (tp) ranks {4,5,6,7}".
  virtual const std::string& name() const = 0;

  virtual at::Tensor allGather(const at::Tensor& local, int64_t dim,
                               const std::vector<int64_t>& sizes) = 0;
  virtual void allReduce(at::Tensor& t, mesh::ReduceOp op) = 0;
  virtual at::Tensor reduceScatter(const at::Tensor& full, int64_t dim, mesh::ReduceOp op) = 0;
  virtual at::Tensor allToAll(const at::Tensor& local, int64_t gather_dim, int64_t shard_dim,
                              const std::vector<int64_t>& gather_sizes) = 0;
  virtual void broadcast(at::Tensor& t, int root_index) = 0;
  virtual void barrier() = 0;
  /// allReduce issued without waiting: `t` (contiguous; it must stay untouched until then) holds
  /// the result after the handle's wait(). Every member issues the same collectives in the same
  /// order, asynchronous or not. The default runs allReduce at once and returns a done handle.
  virtual std::unique_ptr<PendingCollective> allReduceAsync(at::Tensor& t, mesh::ReduceOp op);
  /// allGather issued without waiting (`local` must stay unmodified until the wait); wait()
  /// returns the gathered tensor. The default runs allGather at once.
  virtual std::unique_ptr<PendingCollective> allGatherAsync(const at::Tensor& local, int64_t dim,
                                                            const std::vector<int64_t>& sizes);
  /// reduceScatter issued without waiting (`full` must stay unmodified until the wait); wait()
  /// returns this member's piece. The default runs reduceScatter at once.
  virtual std::unique_ptr<PendingCollective> reduceScatterAsync(const at::Tensor& full, int64_t dim,
                                                                mesh::ReduceOp op);

  const CommStats& stats() const { return stats_; }
  void resetStats() {
    stats_ = {};
    busy_.clear();
  }
  /// Puts back counters read before: checks the runtime makes of its own (input sizes) are not
  /// the program's traffic.
  void restoreStats(const CommStats& s) { stats_ = s; }

 protected:
  /// A call was in flight from `issued` to `done`: adds what it adds to the union of the intervals
  /// to stats_.busy_seconds.
  void markBusy(std::chrono::steady_clock::time_point issued,
                std::chrono::steady_clock::time_point done);

  CommStats stats_;

 private:
  /// The union of the intervals since the last reset, disjoint and sorted (past 4096 the oldest
  /// half is forgotten, its time kept in busy_seconds).
  std::vector<
      std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>>
      busy_;
};

/// The torchrun environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT (`apc run` sets the same variables).
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // also the CUDA device of the NCCL backend
  int local_world_size = 1;  // ranks on this host
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  /// The job's id, from APC_JOB_ID, else TORCHELASTIC_RUN_ID (torchrun; "none" counts as unset);
  /// empty when neither is set. Rendezvous keys live under it, so that ranks of another job on the
  /// same MASTER_PORT cannot join this one.
  std::string job_id;
  /// APC_TIMEOUT_S (seconds, in (0, 604800]): replaces both WorldOptions timeouts when set.
  std::optional<std::chrono::milliseconds> timeout;
};

/// Reads the torchrun variables; a missing RANK/WORLD_SIZE means a single process (rank 0 of 1).
/// LOCAL_RANK defaults to RANK, LOCAL_WORLD_SIZE to WORLD_SIZE, MASTER_ADDR to 127.0.0.1,
/// MASTER_PORT to 29500; also APC_JOB_ID / TORCHELASTIC_RUN_ID and APC_TIMEOUT_S. Errors:
/// malformed numbers, only one of RANK/WORLD_SIZE set, rank outside [0, world_size), a world size
/// above mesh::kMaxWorldSize, local rank outside [0, local_world_size), a port outside 1..65535,
/// a timeout that is not a positive number of seconds (at most a week).
Expected<LaunchEnv> launchEnvFromEnvironment();

enum class Backend { kGloo, kNccl };

struct WorldOptions {
  Backend backend = Backend::kGloo;
  /// The longest any collective waits for its peers (then CommError).
  std::chrono::milliseconds timeout{300'000};
  /// The longest World::create waits for the other ranks (store connection, each group's
  /// rendezvous); separate so that a short collective timeout survives slow process start-up.
  std::chrono::milliseconds setup_timeout{300'000};
  /// When set (the default), LaunchEnv::timeout (APC_TIMEOUT_S) replaces both timeouts; a trainer
  /// whose own flag gave them clears it.
  bool timeouts_from_environment = true;
  /// The job id when the environment names none (LaunchEnv::job_id). Empty: "plan-" and the
  /// first 16 characters of artifact_hash when that is set (ParallelModule::load sets it), else
  /// "default".
  std::string job_id;
  /// What every rank must have loaded (ParallelModule::load: the artifact's plan hash); empty: not
  /// checked. A rank whose hash is not rank 0's fails at the rendezvous, and so does every rank
  /// waiting for it: one line naming both hashes (kInvalidArgument), at once, not at the timeout.
  std::string artifact_hash;
  /// While waiting for peers, a line on stderr this often names the missing ranks and the store.
  std::chrono::milliseconds progress_interval{10'000};
};

/// This rank's view of the mesh: one Communicator per mesh dim (its group along that dim) and one
/// for the whole world, all rendezvoused through one c10d TCPStore at MASTER_ADDR:MASTER_PORT
/// (rank 0 serves it). A world of one process opens no store. Groups of one rank communicate
/// nothing. Set-up waits at most options.setup_timeout for the other ranks, printing a line every
/// progress_interval that names the missing ranks and the store's address. Every key lives under
/// the job id; a store of another job (its id differs), a rank that joins twice and a port that
/// another process holds are errors at once, on every rank that meets them; ranks of different
/// artifacts (WorldOptions::artifact_hash) are errors at once on every rank, with or without a job
/// id; a MASTER_ADDR that does not resolve is an error at once.
class World {
 public:
  /// Errors: env.world_size != mesh.worldSize(), a non-positive timeout, kNccl without CUDA or
  /// without NCCL built in, store or group set-up failures (one line naming the store address or
  /// the group).
  static Expected<std::shared_ptr<World>> create(const LaunchEnv& env, const mesh::DeviceMesh& mesh,
                                                 const WorldOptions& options = {});
  virtual ~World() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  virtual const mesh::DeviceMesh& mesh() const = 0;
  virtual std::vector<int64_t> coordinate() const = 0;
  /// The group of mesh dim `dim`.
  virtual Communicator& dim(size_t dim) = 0;
  /// Every rank ("world ranks {...}"); on a 1-d mesh the same communicator as dim(0).
  virtual Communicator& all() = 0;
  /// Sum of the stats of every communicator.
  virtual CommStats stats() const = 0;
  virtual void resetStats() = 0;
};

}  // namespace apc::runtime
