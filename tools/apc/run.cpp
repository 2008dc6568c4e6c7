//===- tools/apc/run.cpp - `apc run`: a local launcher for N ranks ---------===//
//
// `apc run DIR [--nproc N] [--timeout S] [--tag-output] -- CMD ARGS...` starts N copies of CMD on
// this host (N: the world size in DIR/manifest.json unless --nproc gives it; a DIR without a
// manifest needs --nproc) with the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<a free port>, GROUP_RANK=0,
// OMP_NUM_THREADS=1 unless set) and APC_ARTIFACT=<DIR, absolute> (an argument `{artifact}` of CMD
// is replaced by the same path), then supervises them. Ranks that reach the runtime's rendezvous
// are reported on stderr as they connect ("apc run: rank 2 connected (3/4, 1.4 s)", through files
// in a scratch directory named by APC_RUN_STATUS_DIR; lib/runtime/world.cpp writes them). Output
// passes through, or with
// --tag-output each line is prefixed "[rank r] ". When a rank exits non-zero or is killed, the
// others are stopped (SIGTERM, SIGKILL 3 s later) and the first failure is reported, as
// "apc run: rank 2 exited with status 1" or "apc run: rank 2 killed by signal 9 (Killed)", exit 1;
// a rank that exited 0 while its peers ran on, and ranks stopped (SIGSTOP: each reported as it
// stops), are named beside it ("(rank 1 had exited with status 0 2.0 s before)"), since the
// first rank to fail is then a victim, not the cause.
// --timeout S stops everything after S seconds ("apc run: timed out after S s"), exit 1. SIGINT
// and SIGTERM of the launcher stop the ranks too. Each rank runs in its own process group, so
// stopping a rank stops what it started. A launcher killed outright (SIGKILL, the OOM killer)
// takes its ranks with it twice over: each rank gets SIGKILL from the kernel (PR_SET_PDEATHSIG),
// and a guard process (forked first, in its own session, deaf to SIGINT/SIGTERM/SIGHUP) that
// learns every rank's process group through a socket kills those groups when it closes
// without the launcher's "done": so a rank command that is a wrapper (a shell that does not exec)
// leaves no children training on. Usage errors are one line and exit 2.
//
// For tests and demos on one machine; real clusters use torchrun, which sets the same variables.
//
//===----------------------------------------------------------------------===//
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "apc/artifact/artifact.h"
#include "commands.h"

namespace apc::tool {
namespace {

volatile sig_atomic_t g_stop_signal = 0;

void onStopSignal(int sig) {
  g_stop_signal = sig;
}

/// A loopback TCP port that was free a moment ago (0 when none could be had).
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

/// The guard of the ranks' process groups: a process forked before the ranks that reads their pids
/// (one int32 each) from `watch_fd`, its end of a socket pair only the launcher writes to. On end
/// of file without a 0 record before it (the launcher died without finishing), it SIGKILLs every
/// group; after a 0 (the launcher is done) it exits quietly. Runs between fork and _exit with
/// async-signal-safe calls only (the launcher may have threads).
[[noreturn]] void guardRankGroups(int watch_fd) {
  ::setsid();  // out of the launcher's process group and session: `kill -9 -PGID` misses it
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &ignore, nullptr);
  int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0)
    for (int fd : {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO}) ::dup2(null_fd, fd);
  constexpr int kMaxPids = 1024;
  int32_t pids[kMaxPids];
  int count = 0;
  bool done = false;
  unsigned char record[sizeof(int32_t)];
  size_t have = 0;
  for (;;) {
    ssize_t got = ::read(watch_fd, record + have, sizeof record - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += static_cast<size_t>(got);
    if (have < sizeof record) continue;
    have = 0;
    int32_t pid;
    std::memcpy(&pid, record, sizeof pid);
    if (pid == 0)
      done = true;
    else if (pid > 0 && count < kMaxPids)
      pids[count++] = pid;
  }
  if (!done)
    for (int i = 0; i < count; ++i) ::kill(-pids[i], SIGKILL);
  ::_exit(0);
}

/// Tells the guard one record (a rank's pid, or 0: done). A guard that is gone is no error (the
/// socket's MSG_NOSIGNAL: no SIGPIPE).
void tellGuard(int fd, int32_t value) {
  if (fd < 0) return;
  const char* p = reinterpret_cast<const char*>(&value);
  size_t left = sizeof value;
  while (left > 0) {
    ssize_t n = ::send(fd, p, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

/// Longest line --tag-output holds back waiting for its newline: output without newlines is
/// passed on in pieces of this size, each tagged as a line, so the launcher's memory stays bounded.
constexpr size_t kMaxTaggedLine = 64 * 1024;

/// One rank's output stream when tagging: the pipe's read end and the unfinished line.
struct TaggedStream {
  int fd = -1;
  int rank = 0;
  FILE* to = nullptr;
  std::string partial;
};

void flushLines(TaggedStream& s, bool all) {
  size_t start = 0, nl;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    std::fprintf(s.to, "[rank %d] %.*s\n", s.rank, static_cast<int>(nl - start),
                 s.partial.data() + start);
    start = nl + 1;
  }
  // A line longer than kMaxTaggedLine goes out in tagged pieces.
  while (s.partial.size() - start >= kMaxTaggedLine) {
    std::fprintf(s.to, "[rank %d] %.*s\n", s.rank, static_cast<int>(kMaxTaggedLine),
                 s.partial.data() + start);
    start += kMaxTaggedLine;
  }
  s.partial.erase(0, start);
  if (all && !s.partial.empty()) {
    std::fprintf(s.to, "[rank %d] %s\n", s.rank, s.partial.c_str());
    s.partial.clear();
  }
  std::fflush(s.to);
}

struct RunOptions {
  std::string dir;
  int nproc = 0;
  double timeout_s = 0;
  bool tag_output = false;
  std::vector<std::string> command;
};

int runLauncher(const RunOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(o.dir, ec))
    return report(invalidArgument("artifact directory '" + o.dir + "' does not exist"));
  int nproc = o.nproc;
  if (fs::exists(fs::path(o.dir) / "manifest.json", ec)) {
    auto m = artifact::readManifest(o.dir);
    if (!m.ok()) return report(m.error());
    if (nproc == 0) {
      if (m->world_size > 1024)
        return report(invalidArgument("the artifact's world size is " +
                                      std::to_string(m->world_size) +
                                      "; apc run starts at most 1024 local ranks"));
      nproc = static_cast<int>(m->world_size);
    } else if (nproc != m->world_size) {
      return report(invalidArgument("--nproc " + std::to_string(nproc) + " but " + o.dir +
                                    " was lowered for " + std::to_string(m->world_size) +
                                    " ranks; leave out --nproc to use the artifact's"));
    }
  } else if (nproc == 0) {
    return report(invalidArgument("'" + o.dir +
                                  "' has no manifest.json to take the world size from; give "
                                  "--nproc N"));
  }
  if (nproc < 1)
    return report(invalidArgument("--nproc must be at least 1, got " + std::to_string(nproc)));
  if (o.command.empty())
    return report(invalidArgument("no command to run (apc run DIR [--nproc N] -- CMD ARGS...)"));
  if (o.timeout_s < 0) return report(invalidArgument("--timeout must not be negative"));
  int port = freePort();
  if (port == 0) return report(ioError("no free TCP port on 127.0.0.1 for MASTER_PORT"));
  std::string artifact = fs::absolute(o.dir, ec).lexically_normal().string();
  // One job id per launch (unless the caller gave one): ranks of another job that meet this
  // job's store are turned away (lib/runtime/world.cpp).
  const char* given_job = std::getenv("APC_JOB_ID");
  std::string job =
      given_job && *given_job
          ? std::string(given_job)
          : "run-" + std::to_string(::getpid()) + "-" + std::to_string(port) + "-" +
                std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());

  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);

  std::vector<std::string> command = o.command;
  for (std::string& a : command)
    for (size_t pos; (pos = a.find("{artifact}")) != std::string::npos;)
      a.replace(pos, 10, artifact);
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  // The ranks' runtime drops `rank_<r>` here once it has joined the rendezvous.
  std::string status_dir;
  {
    std::string templ = (fs::temp_directory_path(ec) / "apc_run_XXXXXX").string();
    if (::mkdtemp(templ.data())) status_dir = templ;
  }
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code e;
      if (!dir.empty()) fs::remove_all(dir, e);
    }
  } remove_status_dir{status_dir};

  // The guard, forked before any rank, so that it holds no rank's pipe. Its connection is a socket
  // pair (a pipe that only the launcher writes); the launcher's end is close-on-exec, so only the
  // launcher holds it and its death closes it.
  int guard_fd = -1;
  pid_t guard = -1;
  {
    int watch[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, watch) != 0)
      return report(ioError(std::string("socketpair: ") + std::strerror(errno)));
    guard = ::fork();
    if (guard == 0) {
      ::close(watch[1]);
      guardRankGroups(watch[0]);
    }
    ::close(watch[0]);
    if (guard < 0) {
      ::close(watch[1]);
      return report(ioError(std::string("fork: ") + std::strerror(errno)));
    }
    guard_fd = watch[1];
  }
  struct EndGuard {
    int fd;
    pid_t pid;
    ~EndGuard() {
      tellGuard(fd, 0);  // every path out of runLauncher: the ranks are stopped or done
      ::close(fd);
      int status;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  } end_guard{guard_fd, guard};

  const int n = nproc;
  const pid_t launcher = ::getpid();
  std::vector<pid_t> pids(n, -1);
  std::vector<TaggedStream> streams;
  std::cout.flush();
  std::cerr.flush();
  for (int r = 0; r < n; ++r) {
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (o.tag_output && (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0))
      return report(ioError(std::string("pipe: ") + std::strerror(errno)));
    pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "apc run: fork failed: " << std::strerror(errno) << "\n";
      for (int q = 0; q < r; ++q) ::kill(-pids[q], SIGKILL);
      return 1;
    }
    if (pid == 0) {
      ::setpgid(0, 0);
      // Ranks live in their own process groups, out of reach of the terminal and of whoever
      // kills the launcher: let the kernel stop them when the launcher dies.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(1);
      ::sigaction(SIGINT, &old_int, nullptr);
      ::sigaction(SIGTERM, &old_term, nullptr);
      if (o.tag_output) {
        ::dup2(out_pipe[1], STDOUT_FILENO);
        ::dup2(err_pipe[1], STDERR_FILENO);
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        ::close(err_pipe[0]);
        ::close(err_pipe[1]);
      }
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("GROUP_RANK", "0", 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("APC_ARTIFACT", artifact.c_str(), 1);
      ::setenv("APC_JOB_ID", job.c_str(), 1);
      if (!status_dir.empty()) ::setenv("APC_RUN_STATUS_DIR", status_dir.c_str(), 1);
      ::setenv("OMP_NUM_THREADS", "1", 0);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "apc run: rank %d: cannot execute '%s': %s\n", r, argv[0],
                   std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so the group exists before any kill(-pid)
    pids[r] = pid;
    tellGuard(guard_fd, static_cast<int32_t>(pid));
    if (o.tag_output) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      streams.push_back({out_pipe[0], r, stdout, {}});
      streams.push_back({err_pipe[0], r, stderr, {}});
    }
  }

  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  std::vector<bool> running(n, true);
  int left = n;
  std::optional<std::string> failure;
  std::optional<Clock::time_point> stopping;  // when the ranks were sent SIGTERM
  bool killed = false;
  auto stopAll = [&](int sig) {
    for (int r = 0; r < n; ++r)
      if (running[r]) {
        ::kill(-pids[r], sig);
        if (sig == SIGTERM) ::kill(-pids[r], SIGCONT);  // a stopped rank acts on it only then
      }
  };
  // What may have made a rank fail, named beside it: a rank that left early (exit 0 while its
  // peers ran on, so they lost it in a collective) and ranks stopped (SIGSTOP, a debugger).
  std::optional<std::pair<int, Clock::time_point>> first_left;
  std::vector<int> stopped_by(n, 0);
  auto culprits = [&](int failed_rank) {
    std::string why;
    if (first_left && first_left->first != failed_rank) {
      char text[128];
      std::snprintf(text, sizeof text, "rank %d had exited with status 0 %.1f s before",
                    first_left->first,
                    std::chrono::duration<double>(Clock::now() - first_left->second).count());
      why += text;
    }
    for (int r = 0; r < n; ++r)
      if (stopped_by[r] && r != failed_rank)
        why += (why.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " is stopped (signal " +
                                            std::to_string(stopped_by[r]) + ")");
    return why.empty() ? why : " (" + why + ")";
  };
  std::vector<bool> connected(n, false);
  int num_connected = 0;
  auto reportConnections = [&] {
    if (status_dir.empty() || num_connected == n) return;
    for (int r = 0; r < n; ++r) {
      if (connected[r] || !fs::exists(fs::path(status_dir) / ("rank_" + std::to_string(r)), ec))
        continue;
      connected[r] = true;
      ++num_connected;
      char text[96];
      std::snprintf(text, sizeof text, "apc run: progress: rank %d connected (%d/%d, %.1f s)\n", r,
                    num_connected, n, std::chrono::duration<double>(Clock::now() - start).count());
      std::fputs(text, stderr);
      std::fflush(stderr);
    }
  };
  std::fprintf(stderr, "apc run: progress: started %d rank%s of %s\n", n, n == 1 ? "" : "s",
               command[0].c_str());
  std::fflush(stderr);
  while (left > 0 || !streams.empty()) {
    reportConnections();
    // Output (when tagging), or a short sleep.
    std::vector<pollfd> fds;
    for (const TaggedStream& s : streams) fds.push_back({s.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t got = ::read(streams[i].fd, buf, sizeof buf);
      if (got > 0) {
        streams[i].partial.append(buf, static_cast<size_t>(got));
        flushLines(streams[i], false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        flushLines(streams[i], true);
        ::close(streams[i].fd);
        streams[i].fd = -1;
      }
    }
    std::erase_if(streams, [](const TaggedStream& s) { return s.fd < 0; });
    // Exits, stops and continues.
    int status = 0;
    pid_t pid;
    while (left > 0 && (pid = ::waitpid(-1, &status, WNOHANG | WUNTRACED | WCONTINUED)) > 0) {
      for (int r = 0; r < n; ++r) {
        if (pids[r] != pid || !running[r]) continue;
        if (WIFSTOPPED(status)) {
          stopped_by[r] = WSTOPSIG(status);
          std::fprintf(stderr, "apc run: rank %d was stopped by signal %d (%s)\n", r, stopped_by[r],
                       ::strsignal(stopped_by[r]));
          std::fflush(stderr);
          continue;
        }
        if (WIFCONTINUED(status)) {
          stopped_by[r] = 0;
          continue;
        }
        running[r] = false;
        --left;
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (!failed && !first_left && left > 0)  // its peers run on without it
          first_left = std::pair{r, Clock::now()};
        if (failed && !failure && !stopping)
          failure = "rank " + std::to_string(r) + " " + describeStatus(status) + culprits(r);
      }
    }
    if (left == 0) {
      // Grandchildren may still hold the pipes: stop waiting for output soon after.
      if (!stopping) stopping = Clock::now();
      if (Clock::now() - *stopping > std::chrono::seconds(3)) break;
      continue;
    }
    if (g_stop_signal && !failure)
      failure = std::string("interrupted by signal ") + std::to_string(g_stop_signal);
    if (o.timeout_s > 0 && !failure &&
        Clock::now() - start > std::chrono::duration<double>(o.timeout_s)) {
      char text[64];
      std::snprintf(text, sizeof text, "timed out after %g s", o.timeout_s);
      failure = text + culprits(-1);
    }
    if (failure && !stopping) {
      stopping = Clock::now();
      stopAll(SIGTERM);
    }
    if (stopping && !killed && Clock::now() - *stopping > std::chrono::seconds(3)) {
      killed = true;
      stopAll(SIGKILL);
    }
  }
  reportConnections();
  for (TaggedStream& s : streams) {
    flushLines(s, true);
    ::close(s.fd);
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  if (failure) {
    std::cerr << "apc run: " << *failure << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

Runner addRunCommand(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  app.add_option("dir", o->dir, "Artifact directory (passed to the ranks as APC_ARTIFACT)")
      ->required()
      ->check(nonEmptyPath());
  app.add_option("--nproc", o->nproc,
                 "Number of ranks to start (at most 1024); default: the world size in the "
                 "artifact's manifest.json")
      ->check(integerIn(1, 1024));
  app.add_option("--timeout", o->timeout_s, "Stop every rank after this many seconds (0: never)")
      ->check(numberIn(0.0, 1e7));
  app.add_flag("--tag-output", o->tag_output, "Prefix each output line with [rank r]");
  app.add_option("command", o->command,
                 "The command of every rank, after --; an argument {artifact} becomes the "
                 "artifact's absolute path (also in $APC_ARTIFACT)");
  app.footer(
      "Example: apc run out/ -- build/tools/apc-train --steps 20   (apc-train reads the "
      "artifact from $APC_ARTIFACT; the world size comes from out/manifest.json)");
  return [o] { return runLauncher(*o); };
}

}  // namespace apc::tool
