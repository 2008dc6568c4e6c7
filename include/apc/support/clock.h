//===- apc/support/clock.h - Elapsed wall time ------------------------------===//
#pragma once

#include <chrono>

namespace apc {

/// Seconds of steady-clock time since `t0`.
inline double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace apc
