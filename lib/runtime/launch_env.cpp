//===- lib/runtime/launch_env.cpp - The torchrun environment ---------------===//
//
// Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as set by
// torchrun and by `apc run`, and apc's own APC_JOB_ID (else torchrun's TORCHELASTIC_RUN_ID) and
// APC_TIMEOUT_S. Without RANK and WORLD_SIZE the process is rank 0 of 1.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "apc/runtime/comm.h"
#include "apc/support/file_io.h"
#include "apc/support/strings.h"

namespace apc::runtime {
namespace {

/// The integer value of variable `name`, `fallback` when unset or empty.
Expected<int> intVar(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  std::string_view s(text);
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size())
    return invalidArgument(std::string("environment variable ") + name + "='" + printable(text) +
                           "' is not an integer");
  return value;
}

}  // namespace

Expected<LaunchEnv> launchEnvFromEnvironment() {
  LaunchEnv env;
  bool has_rank = std::getenv("RANK") && *std::getenv("RANK");
  bool has_world = std::getenv("WORLD_SIZE") && *std::getenv("WORLD_SIZE");
  if (has_rank != has_world)
    return invalidArgument(has_rank ? "RANK is set but WORLD_SIZE is not"
                                    : "WORLD_SIZE is set but RANK is not");
  auto rank = intVar("RANK", 0);
  if (!rank) return rank.error();
  auto world = intVar("WORLD_SIZE", 1);
  if (!world) return world.error();
  env.rank = *rank;
  env.world_size = *world;
  if (env.world_size < 1)
    return invalidArgument("WORLD_SIZE=" + std::to_string(env.world_size) + " is not positive");
  if (env.world_size > mesh::kMaxWorldSize)
    return invalidArgument("WORLD_SIZE=" + std::to_string(env.world_size) + " is above " +
                           std::to_string(mesh::kMaxWorldSize) + ", the most apc supports");
  if (env.rank < 0 || env.rank >= env.world_size)
    return invalidArgument("RANK=" + std::to_string(env.rank) +
                           " is outside [0, WORLD_SIZE=" + std::to_string(env.world_size) + ")");
  auto local = intVar("LOCAL_RANK", env.rank);
  if (!local) return local.error();
  env.local_rank = *local;
  auto local_world = intVar("LOCAL_WORLD_SIZE", env.world_size);
  if (!local_world) return local_world.error();
  env.local_world_size = *local_world;
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size)
    return invalidArgument(
        "LOCAL_RANK=" + std::to_string(env.local_rank) +
        " is outside [0, LOCAL_WORLD_SIZE=" + std::to_string(env.local_world_size) + ")");
  if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) env.master_addr = addr;
  auto port = intVar("MASTER_PORT", env.master_port);
  if (!port) return port.error();
  if (*port < 1 || *port > 65535)
    return invalidArgument("MASTER_PORT=" + std::to_string(*port) + " is not a TCP port");
  env.master_port = *port;
  for (const char* name : {"APC_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    const char* id = std::getenv(name);
    if (id && *id && std::string_view(id) != "none") {
      env.job_id = id;
      break;
    }
  }
  if (const char* t = std::getenv("APC_TIMEOUT_S"); t && *t) {
    std::optional<double> s = parseDouble(t);
    if (!s || !(*s > 0) || *s > 604800)
      return invalidArgument(std::string("APC_TIMEOUT_S='") + printable(t) +
                             "' is not a number of seconds in (0, 604800]");
    env.timeout = std::chrono::milliseconds(std::max<int64_t>(1, std::llround(*s * 1000)));
  }
  return env;
}

}  // namespace apc::runtime
