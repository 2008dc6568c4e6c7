//===- apc/support/parallel.h - A parallel loop over independent items ------===//
//
// The planner is single-threaded except where one loop dominates on large meshes (pricing the
// rows of an edge table, the min-plus products of an elimination): those loops hand their items to
// parallelFor. Each item writes only its own outputs and reads nothing another item writes, so
// the result does not depend on the number of threads (plans stay byte-identical).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace apc {

/// Threads for parallelFor: the machine's, at most 8.
inline size_t parallelThreads() {
  static const size_t n = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  return n;
}

/// body(i) for every i in [0, n), on up to parallelThreads() threads (the calling one included);
/// in order on the calling thread when n < 2 or `serial` is set (too little work to pay for
/// threads).
template <class Body>
void parallelFor(size_t n, const Body& body, bool serial = false) {
  const size_t threads = serial ? 1 : std::min(parallelThreads(), n);
  if (threads < 2) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  std::vector<std::thread> pool;
  for (size_t k = 1; k < threads; ++k) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
}

}  // namespace apc
