//===- tests/runtime/comm_harness.h - Fork N ranks of a test ---------------===//
//
// Multi-process tests of the communicators: runRanks forks `n` children of the test process, each
// running `body(env)` with its own LaunchEnv (RANK = child index, a fresh free MASTER_PORT), and
// waits for all of them with a deadline (then kills the rest). A child exits 0 when the body
// returned without a gtest failure, 1 after a failure (gtest prints it from the child), 3 after an
// uncaught exception. The parent must not have started threads (no torch work before forking).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "apc/runtime/comm.h"

namespace apc::testing {

/// A TCP port that was free a moment ago (bound to port 0, then released).
inline int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

struct RankOutcome {
  int exit_code = -1;  // -1 when killed by a signal or by the deadline
  int signal = 0;
  bool timed_out = false;
};

inline std::vector<RankOutcome> runRanks(
    int n, std::chrono::seconds deadline,
    const std::function<void(const runtime::LaunchEnv&)>& body) {
  int port = freePort();
  std::vector<pid_t> pids(n, -1);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < n; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      runtime::LaunchEnv env;
      env.rank = r;
      env.world_size = n;
      env.local_rank = r;
      env.local_world_size = n;
      env.master_port = port;
      int code = 0;
      try {
        body(env);
        code = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        std::cerr << "rank " << r << ": uncaught exception: " << e.what() << "\n";
        code = 3;
      }
      std::cout.flush();
      std::cerr.flush();
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids[r] = pid;
  }
  std::vector<RankOutcome> out(n);
  std::vector<bool> done(n, false);
  int left = n;
  auto until = std::chrono::steady_clock::now() + deadline;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        if (WIFEXITED(status)) out[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) out[r].signal = WTERMSIG(status);
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > until) {
      for (int r = 0; r < n; ++r) {
        if (done[r]) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        out[r].timed_out = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

/// Expects every rank to have exited 0.
inline void expectAllPassed(const std::vector<RankOutcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    EXPECT_FALSE(outcomes[r].timed_out) << "rank " << r << " hit the test deadline";
    EXPECT_EQ(outcomes[r].signal, 0) << "rank " << r << " was killed by a signal";
    EXPECT_EQ(outcomes[r].exit_code, 0) << "rank " << r << " failed (see its output above)";
  }
}

}  // namespace apc::testing
