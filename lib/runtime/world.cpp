//===- lib/runtime/world.cpp - Process groups of a device mesh -------------===//
//
// World::create: one c10d TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 serves it and waits for all
// ranks), then, in the same order on every rank, one group per mesh dim (the ranks that differ from
// this rank only in that dim's coordinate) and one for the world, each rendezvoused through a
// PrefixStore named after its ranks. Every rank creates only its own groups; since all ranks walk
// the dims in the same order, each group is set up by all its members at the same step. A group of
// one rank needs no communication (a local communicator); on a 1-d mesh the world group is the
// group of dim 0. A single process (world size 1) opens no store at all. A closing store barrier
// ends the set-up: no rank returns (and may exit) while a peer is still connecting to it.
//
// Rendezvous: rank 0 serves the store without waiting for the others in its constructor (a port
// that another process holds fails at once) and writes the job id under "apc/owner"; every other
// rank connects in attempts of one progress interval, then checks that owner: a store of another
// job is an error at once. Every key lives under "apc/<job>/". Each rank registers under
// "rank/<r>" (a second registration of one rank is an error) and all wait, polling a counter,
// until every rank has arrived, printing a line every progress interval that names the missing
// ranks, the store's address and the job.
//
// Artifacts: rank 0 writes its WorldOptions::artifact_hash (the plan hash of the artifact it
// loaded) under "artifact" before the owner; every other rank compares its own with it right
// after the owner check. A rank with another hash writes the mismatch under "mismatch" and fails;
// the waiting ranks look for that key at every poll and fail too (rank 0, serving the store,
// last), naming both hashes, instead of waiting for a rank that never arrives (or, under one job
// id, running collectives of different programs until the timeout). Without a job id in the
// environment or the options, ranks rendezvous under their artifact's plan hash ("plan-<16 hex>"),
// so a rank of another artifact meets a store of another job: when both ids are such plan ids and
// the world sizes agree, it is a rank of this launch with another artifact, and it writes the
// mismatch under rank 0's job, as above (rank 0 would otherwise wait for it until the timeout).
//
// MASTER_ADDR is resolved (getaddrinfo) before anything connects: a name that does not resolve is
// one line at once, not the set-up timeout of connection attempts.
//
// The process ignores SIGPIPE (when it was left at the default action): Gloo writes to sockets
// whose peer may have died, and the error must become a CommError rather than kill the process.
//
//===----------------------------------------------------------------------===//
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>

#include <ATen/Context.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "apc/support/activity.h"
#include "apc/support/file_io.h"
#include "comm_internal.h"

namespace apc::runtime {
namespace {

void ignoreSigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
}

/// Fails at once, in one line naming it, when MASTER_ADDR does not resolve: the store connection
/// would otherwise retry it until the set-up timeout.
Status checkMasterAddr(const LaunchEnv& env) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
  if (rc == 0) {
    ::freeaddrinfo(found);
    return Status::success();
  }
  const std::string why = rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
  return invalidArgument("rank " + std::to_string(env.rank) + ": MASTER_ADDR '" +
                         printable(env.master_addr) + "' does not resolve (" + why +
                         "); it names rank 0's host, by a name this host resolves or an address");
}

/// Whether something accepts TCP connections at MASTER_ADDR:MASTER_PORT now (one attempt per
/// resolved address, each bounded by `timeout`). Asked when a client's store connection outlasts
/// its bound: c10d's client may retry a refused port past its own timeout (its backoff, a loaded
/// host), and then the rank's error must say "nobody there", not "no answer".
bool somethingListens(const LaunchEnv& env, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(env.master_port);
  if (::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &found) != 0) return false;
  bool accepted = false;
  for (addrinfo* a = found; a && !accepted; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      accepted = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      accepted = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
                 ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return accepted;
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
    rethrowIfOutOfMemory(e);
    throw CommError(
        detail::describeFailure(name, "group set-up", e.what_without_backtrace(), timeout));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    throw CommError(detail::describeFailure(name, "group set-up", e.what(), timeout));
  }
}

/// The closing barrier of World::create: no rank returns before every rank has set up all its
/// groups, and rank 0, which serves the store, returns last. Without it a rank that finished early
/// and exited (or went on to fail) closed its sockets under a peer whose Gloo handshake with it was
/// still in flight ("Connection closed by peer" in connectFullMesh). Two counters, so the store
/// holds O(1) keys at any world size.
void awaitSetupDone(c10d::Store& store, const std::string& prefix, int rank, int size,
                    std::chrono::milliseconds timeout) {
  const std::string name = "world set-up";
  try {
    if (store.add(prefix + "ready", 1) == size)
      store.set(prefix + "ready/all", std::vector<uint8_t>{1});
    store.wait({prefix + "ready/all"}, timeout);
    if (rank != 0) {
      if (store.add(prefix + "left", 1) == size - 1)
        store.set(prefix + "left/all", std::vector<uint8_t>{1});
    } else {
      store.wait({prefix + "left/all"}, timeout);
    }
  } catch (const c10::Error& e) {
    rethrowIfOutOfMemory(e);
    throw CommError(
        detail::describeFailure(name, "closing barrier", e.what_without_backtrace(), timeout));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    throw CommError(detail::describeFailure(name, "closing barrier", e.what(), timeout));
  }
}

using Clock = std::chrono::steady_clock;

/// The job id of ranks that name none: this prefix and the artifact's plan hash (16 characters).
constexpr const char* kPlanJobPrefix = "plan-";

void note(int rank, const std::string& line) {
  std::cerr << "apc: rank " << rank << ": " << line << std::endl;
}

std::string seconds(Clock::duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + " s";
}

std::string text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

/// What the "mismatch" key holds: rank `rank` loaded an artifact of plan hash `hash` where rank 0
/// loaded one of `rank0_hash`. Every rank's message starts "rank <its rank>: " and goes on so.
std::string artifactMismatch(int rank, const std::string& hash, const std::string& rank0_hash,
                             const std::string& job_text) {
  return "rank " + std::to_string(rank) + " loaded an artifact of plan hash " + printable(hash) +
         ", rank 0 one of plan hash " + printable(rank0_hash) + " (" + job_text +
         "): every rank must load the same artifact";
}

/// After an artifact mismatch every rank counts itself out under "mismatch/left"; rank 0, which
/// serves the store, returns only when all others have (at most 10 s), so that no rank loses the
/// store before it has read the mismatch.
void leaveAfterMismatch(c10d::Store& store, const std::string& prefix, const LaunchEnv& env,
                        const WorldOptions& options) {
  try {
    int64_t left = store.add(prefix + "mismatch/left", 1);
    if (env.rank != 0) return;
    const auto deadline =
        Clock::now() + std::min(options.setup_timeout, std::chrono::milliseconds(10'000));
    while (left < env.world_size && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      left = store.add(prefix + "mismatch/left", 0);
    }
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    // The mismatch is the error to report; a store that went away meanwhile changes nothing.
  }
}

Expected<c10::intrusive_ptr<c10d::Store>> connectClient(const LaunchEnv& env,
                                                        const std::string& job,
                                                        bool job_from_artifact,
                                                        const WorldOptions& options);

/// While alive, c10d's own log lines below FATAL are off (FLAGS_caffe2_log_level), unless the user
/// set TORCH_CPP_LOG_LEVEL: a client retrying a store that is not there yet printed a warning and
/// an error with a stack trace per attempt (hundreds over a long timeout, for one nonsense
/// MASTER_ADDR), where the rank's own progress lines and its one-line error say what happened.
class QuietC10dLog {
 public:
  QuietC10dLog() {
    const char* env = std::getenv("TORCH_CPP_LOG_LEVEL");
    if (env && *env) return;
    saved_ = FLAGS_caffe2_log_level;
    FLAGS_caffe2_log_level = std::max(saved_, 3);  // 3: FATAL only
    active_ = true;
  }
  ~QuietC10dLog() {
    if (active_) FLAGS_caffe2_log_level = saved_;
  }
  QuietC10dLog(const QuietC10dLog&) = delete;
  QuietC10dLog& operator=(const QuietC10dLog&) = delete;

 private:
  int saved_ = 0;
  bool active_ = false;
};

/// The store of `env`: served by rank 0, connected to by the others, retried with a progress line
/// every `options.progress_interval` until `options.setup_timeout`. Then the owner check.
///
/// A client's connection runs on a helper thread, waited for at most the set-up timeout (and a
/// few seconds' grace): c10d's TCPStore client blocks without a bound in its handshake (ping) when
/// the address accepts the connection but never answers (rank 0 stopped after it started serving,
/// or another program on the port). Past the bound the rank fails with one line; the helper is
/// left blocked, detached, and ends with the process.
Expected<c10::intrusive_ptr<c10d::Store>> connectStore(const LaunchEnv& env, const std::string& job,
                                                       bool job_from_artifact,
                                                       const WorldOptions& options) {
  if (env.rank == 0) return connectClient(env, job, job_from_artifact, options);
  struct Attempt {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Expected<c10::intrusive_ptr<c10d::Store>>> result;
  };
  auto attempt = std::make_shared<Attempt>();
  std::thread([attempt, env, job, job_from_artifact, options] {
    Expected<c10::intrusive_ptr<c10d::Store>> r = ioError("no store");
    try {
      r = connectClient(env, job, job_from_artifact, options);
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      r = ioError("rank " + std::to_string(env.rank) +
                  ": cannot connect to the rendezvous store: " + detail::firstLine(e.what()));
    }
    std::lock_guard<std::mutex> lock(attempt->mu);
    attempt->result.emplace(std::move(r));
    attempt->cv.notify_all();
  }).detach();
  const auto start = Clock::now();
  const auto deadline = start + options.setup_timeout + std::chrono::seconds(5);
  std::unique_lock<std::mutex> lock(attempt->mu);
  while (!attempt->result) {
    const auto next = std::min(deadline, Clock::now() + options.progress_interval);
    if (attempt->cv.wait_until(lock, next, [&] { return attempt->result.has_value(); })) break;
    if (Clock::now() >= deadline) {
      if (!somethingListens(env, std::chrono::milliseconds(1000)))
        return ioError("rank " + std::to_string(env.rank) + ": no rendezvous store at " +
                       env.master_addr + ":" + std::to_string(env.master_port) + " after " +
                       seconds(options.setup_timeout) + " (job '" + printable(job) +
                       "'; is rank 0 running?): nothing accepts connections there");
      return ioError("rank " + std::to_string(env.rank) +
                     ": no answer from the rendezvous store at " + env.master_addr + ":" +
                     std::to_string(env.master_port) + " within " + seconds(options.setup_timeout) +
                     " (job '" + printable(job) +
                     "'; is MASTER_ADDR right, and rank 0 running, not stopped, on MASTER_PORT?)");
    }
    note(env.rank, "waiting for an answer from rank 0's rendezvous store at " + env.master_addr +
                       ":" + std::to_string(env.master_port) + " (job '" + printable(job) + "', " +
                       seconds(Clock::now() - start) + " of " + seconds(options.setup_timeout) +
                       ")");
  }
  return std::move(*attempt->result);
}

/// connectStore's work: rank 0 serves, the others connect (retried) and check the owner.
Expected<c10::intrusive_ptr<c10d::Store>> connectClient(const LaunchEnv& env,
                                                        const std::string& job,
                                                        bool job_from_artifact,
                                                        const WorldOptions& options) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const std::string job_text = "job '" + printable(job) + "'";
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(env.master_port);
  store_options.numWorkers = env.world_size;
  store_options.waitWorkers = false;
  c10::intrusive_ptr<c10d::Store> store;
  if (env.rank == 0) {
    store_options.isServer = true;
    store_options.timeout = options.setup_timeout;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
      store->set("apc/" + job + "/world_size", bytes(std::to_string(env.world_size)));
      store->set("apc/" + job + "/artifact", bytes(options.artifact_hash));
      store->set("apc/owner", bytes(job));
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      std::string why = detail::firstLine(e.what());
      if (auto* c = dynamic_cast<const c10::Error*>(&e))
        why = detail::firstLine(c->what_without_backtrace());
      return ioError(
          "rank 0: cannot serve the rendezvous store at " + where + " (" + job_text + "): " + why +
          (why.find("EADDRINUSE") != std::string::npos ||
                   why.find("address already in use") != std::string::npos
               ? " (another process holds MASTER_PORT " + std::to_string(env.master_port) + ")"
               : ""));
    }
    return store;
  }
  const auto start = Clock::now();
  bool first_failure = true;
  QuietC10dLog quiet;  // this loop says what it waits for; c10d's retries are not the user's news
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(options.setup_timeout -
                                                                      (Clock::now() - start));
    store_options.isServer = false;
    store_options.timeout =
        std::max(std::chrono::milliseconds(1), std::min(left, options.progress_interval));
    std::string why;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
      break;
    } catch (const c10::Error& e) {
      rethrowIfOutOfMemory(e);
      why = detail::firstLine(e.what_without_backtrace());
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      why = detail::firstLine(e.what());
    }
    // One attempt may outlast the whole window (c10d's client retries with a random backoff of
    // up to about 2 s inside its timeout): the first failure is always noted, so a rank that
    // gives up has said what it waited for.
    const bool expired = Clock::now() - start >= options.setup_timeout;
    if (!expired || first_failure)
      note(env.rank, "waiting for rank 0's rendezvous store at " + where + " (" + job_text + ", " +
                         seconds(Clock::now() - start) + " of " + seconds(options.setup_timeout) +
                         ")");
    first_failure = false;
    if (expired)
      return ioError("rank " + std::to_string(env.rank) + ": no rendezvous store at " + where +
                     " after " + seconds(options.setup_timeout) + " (" + job_text +
                     "; is rank 0 running?): " + why);
  }
  try {
    // Rank 0 writes the owner right after it starts serving: a short wait suffices.
    store->setTimeout(std::min(options.setup_timeout, std::chrono::milliseconds(30'000)));
    std::string owner = text(store->get("apc/owner"));
    // Both job ids made from plan hashes (no job id set), one world size: rank 0 of this launch
    // loaded another artifact. It hears of the mismatch, as under one job id.
    if (owner != job && job_from_artifact && owner.rfind(kPlanJobPrefix, 0) == 0 &&
        text(store->get("apc/" + owner + "/world_size")) == std::to_string(env.world_size)) {
      const std::string rank0_prefix = "apc/" + owner + "/";
      std::string mismatch =
          artifactMismatch(env.rank, options.artifact_hash,
                           text(store->get(rank0_prefix + "artifact")), "no job id set");
      store->set(rank0_prefix + "mismatch", bytes(mismatch));
      leaveAfterMismatch(*store, rank0_prefix, env, options);
      return invalidArgument("rank " + std::to_string(env.rank) + ": " + mismatch);
    }
    if (owner != job)
      return ioError("rank " + std::to_string(env.rank) + ": the rendezvous store at " + where +
                     " belongs to job '" + printable(owner) + "', not to this " + job_text +
                     ": another job uses MASTER_PORT " + std::to_string(env.master_port) +
                     " (give each job its own port, and all ranks of one job the same APC_JOB_ID)");
    std::string world = text(store->get("apc/" + job + "/world_size"));
    if (world != std::to_string(env.world_size))
      return ioError("rank " + std::to_string(env.rank) +
                     ": WORLD_SIZE=" + std::to_string(env.world_size) + " but rank 0 of " +
                     job_text + " at " + where + " has WORLD_SIZE=" + printable(world));
    // Rank 0 wrote its artifact's hash before the owner. A rank of another artifact tells the
    // waiting ranks (it never arrives) and fails.
    std::string rank0_hash = text(store->get("apc/" + job + "/artifact"));
    if (!options.artifact_hash.empty() && !rank0_hash.empty() &&
        rank0_hash != options.artifact_hash) {
      std::string mismatch =
          artifactMismatch(env.rank, options.artifact_hash, rank0_hash, job_text);
      store->set("apc/" + job + "/mismatch", bytes(mismatch));
      leaveAfterMismatch(*store, "apc/" + job + "/", env, options);
      return invalidArgument("rank " + std::to_string(env.rank) + ": " + mismatch);
    }
  } catch (const c10::Error& e) {
    rethrowIfOutOfMemory(e);
    return ioError(
        "rank " + std::to_string(env.rank) + ": the store at " + where +
        " is not an apc rendezvous (no job id): " + detail::firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return ioError("rank " + std::to_string(env.rank) + ": the store at " + where +
                   " is not an apc rendezvous (no job id): " + detail::firstLine(e.what()));
  }
  store->setTimeout(options.setup_timeout);
  return store;
}

/// Registers this rank under the job and waits until every rank has, naming the missing ones
/// every progress interval.
Status awaitAllRanks(c10d::Store& store, const LaunchEnv& env, const std::string& job,
                     const WorldOptions& options) {
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const std::string prefix = "apc/" + job + "/";
  const std::string job_text = "job '" + printable(job) + "'";
  auto rankKey = [&](int r) { return prefix + "rank/" + std::to_string(r); };
  auto missing = [&]() {
    std::vector<int> out;
    for (int r = 0; r < env.world_size; ++r)
      if (!store.check({rankKey(r)})) out.push_back(r);
    return out;
  };
  auto list = [](const std::vector<int>& ranks) {
    std::string s;
    for (size_t i = 0; i < ranks.size() && i < 16; ++i)
      s += (i ? ", " : "") + std::to_string(ranks[i]);
    if (ranks.size() > 16) s += ", ...";
    return s;
  };
  try {
    if (store.add(rankKey(env.rank), 1) > 1)
      return ioError("rank " + std::to_string(env.rank) + " of " + job_text +
                     " is already registered at " + where +
                     ": a rank started twice, or another job with the same job id on MASTER_PORT " +
                     std::to_string(env.master_port) + " (set APC_JOB_ID per job)");
    store.add(prefix + "arrived", 1);
    // Under `apc run`, tell the launcher that this rank has joined (it reports ranks as they
    // connect); best effort.
    if (const char* dir = std::getenv("APC_RUN_STATUS_DIR"); dir && *dir)
      std::ofstream(std::string(dir) + "/rank_" + std::to_string(env.rank)) << "connected\n";
    const auto start = Clock::now();
    auto next_note = start + options.progress_interval;
    while (store.add(prefix + "arrived", 0) < env.world_size) {
      // A rank of another artifact never arrives: fail with what it found.
      if (store.check({prefix + "mismatch"})) {
        std::string mismatch = text(store.get(prefix + "mismatch"));
        leaveAfterMismatch(store, prefix, env, options);
        return invalidArgument("rank " + std::to_string(env.rank) + ": " + mismatch);
      }
      auto now = Clock::now();
      if (now - start >= options.setup_timeout) {
        std::string who;
        if (env.rank == 0 || env.world_size <= 64) {
          std::vector<int> absent = missing();
          who = "rank" + std::string(absent.size() == 1 ? " " : "s ") + list(absent);
        } else {
          who = std::to_string(env.world_size - store.add(prefix + "arrived", 0)) + " ranks";
        }
        return ioError("rank " + std::to_string(env.rank) + ": " + who + " of " +
                       std::to_string(env.world_size) + " did not join the rendezvous at " + where +
                       " within " + seconds(options.setup_timeout) + " (" + job_text + ")");
      }
      if (now >= next_note) {
        // Naming the missing ranks costs a store query per rank: rank 0 always names them, the
        // others only in small worlds (else they give the count).
        std::string who;
        if (env.rank == 0 || env.world_size <= 64) {
          std::vector<int> absent = missing();
          who = "rank" + std::string(absent.size() == 1 ? " " : "s ") + list(absent) + " (" +
                std::to_string(absent.size()) + " of " + std::to_string(env.world_size) +
                " missing)";
        } else {
          who = std::to_string(env.world_size - store.add(prefix + "arrived", 0)) + " of " +
                std::to_string(env.world_size) + " ranks";
        }
        note(env.rank, "waiting for " + who + " at " + where + ", " + job_text + ", " +
                           seconds(now - start) + " of " + seconds(options.setup_timeout));
        next_note = now + options.progress_interval;
      }
      // Polls of the arrival counter: every 50 ms in small worlds, less often in large ones, so
      // that rank 0's store serves at most a few thousand queries a second.
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1000, 50 + env.world_size)));
    }
  } catch (const c10::Error& e) {
    rethrowIfOutOfMemory(e);
    return ioError("rank " + std::to_string(env.rank) + ": rendezvous at " + where + ": " +
                   detail::firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return ioError("rank " + std::to_string(env.rank) + ": rendezvous at " + where + ": " +
                   detail::firstLine(e.what()));
  }
  return Status::success();
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
    auto add = [&](const Communicator& c) { total += c.stats(); };
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
                                               const WorldOptions& given) {
  WorldOptions options = given;
  if (options.timeouts_from_environment && env.timeout)
    options.timeout = options.setup_timeout = *env.timeout;
  if (options.progress_interval.count() <= 0) options.progress_interval = std::chrono::seconds(10);
  // Without a job id, ranks of one artifact rendezvous under its plan hash.
  const bool job_from_artifact =
      env.job_id.empty() && options.job_id.empty() && !options.artifact_hash.empty();
  const std::string job = !env.job_id.empty()       ? env.job_id
                          : !options.job_id.empty() ? options.job_id
                          : job_from_artifact ? kPlanJobPrefix + options.artifact_hash.substr(0, 16)
                                              : "default";
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
  APC_RETURN_IF_ERROR(checkMasterAddr(env));
  auto store = connectStore(env, job, job_from_artifact, options);
  if (!store.ok()) return store.error();
  world->store_ = std::move(store).value();
  APC_RETURN_IF_ERROR(awaitAllRanks(*world->store_, env, job, options));
  try {
    std::shared_ptr<gloo::transport::Device> device;
    auto make = [&](int dim, const std::vector<int64_t>& ranks) -> std::unique_ptr<Communicator> {
      std::string name = detail::groupName(mesh, dim, ranks);
      if (ranks.size() == 1) return detail::makeLocalCommunicator(std::move(name));
      int index = static_cast<int>(
          std::find(ranks.begin(), ranks.end(), static_cast<int64_t>(env.rank)) - ranks.begin());
      std::string prefix = "apc/" + job +
                           (dim < 0 ? std::string("/world/") : "/dim" + std::to_string(dim) + "/") +
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
    awaitSetupDone(*world->store_, "apc/" + job + "/setup/", env.rank, env.world_size,
                   options.setup_timeout);
  } catch (const CommError& e) {
    return ioError(e.what());
  }
  return std::shared_ptr<World>(world);
}

}  // namespace apc::runtime
