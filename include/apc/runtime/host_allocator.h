//===- apc/runtime/host_allocator.h - A caching allocator for CPU tensors --===//
//
// LibTorch's default CPU allocator hands every allocation to malloc and every free back to it.
// glibc serves blocks above its mmap threshold (at most 32 MiB) with fresh mmap'd pages and
// unmaps them on free, so a training step that allocates the same activations and gradients
// every step pays the kernel's page faults and page zeroing for all of them, every step: on this
// project's VM, half of gpt2_small's step on 2 CPU ranks was the kernel clearing pages
// (docs/TOOLCHAIN.md). CUDA has had a caching allocator from the start; this is its CPU analog,
// deliberately simple: blocks of at least kCachedMinBytes are kept after their tensor dies, keyed
// by their size rounded up to whole pages, and handed out again for the next request of that
// size (a training step's sizes repeat, so after the first step almost every request hits).
// Live and cached bytes together never exceed the peak of live bytes: a request that misses
// evicts cached blocks of other sizes until it fits (a varying sequence length cannot grow the
// cache without bound).
// Smaller blocks go straight to c10::alloc_cpu / free_cpu. An allocation that fails releases
// the cache and tries once more.
//
// Process-wide (c10::SetAllocator for kCPU): a trainer opts in once, before it builds its
// tensors; apc-train does (`--no-host-cache` to compare). Tensors allocated before keep their own
// deleters. The allocator also counts live and peak bytes of the CPU tensors it served, which
// `apc-train --profile` reports as the CPU peak memory.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>

namespace apc::runtime {

struct HostAllocatorStats {
  int64_t allocated_bytes = 0;       // live bytes of tensors served (page-rounded when cached)
  int64_t peak_allocated_bytes = 0;  // the most allocated_bytes since install or resetPeak
  int64_t cached_bytes = 0;          // freed blocks kept for reuse
  int64_t hits = 0;                  // requests served from the cache
  int64_t misses = 0;                // requests that allocated fresh memory
};

/// Blocks below this size are not cached (malloc keeps them in its heap without faults).
inline constexpr int64_t kCachedMinBytes = 64 * 1024;

/// Installs the caching allocator as LibTorch's CPU allocator (idempotent). Returns whether it
/// is installed after the call.
bool useCachingHostAllocator();

/// Whether useCachingHostAllocator has installed it.
bool cachingHostAllocatorInstalled();

HostAllocatorStats hostAllocatorStats();

/// Starts a new peak at the current allocated bytes.
void resetHostAllocatorPeak();

/// Frees every cached block; returns the bytes released.
int64_t releaseCachedHostMemory();

}  // namespace apc::runtime
