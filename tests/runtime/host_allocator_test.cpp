//===- tests/runtime/host_allocator_test.cpp - The caching CPU allocator ---===//
//
// apc/runtime/host_allocator.h: a freed block of a cached size comes back for the next request of
// that size, small blocks are not cached, the counters follow live and peak bytes, the cache can
// be released, raw allocations work, and tensors computed through it are right.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>

#include "apc/runtime/host_allocator.h"

namespace apc::runtime::host_allocator_test {
namespace {

TEST(HostAllocator, ReusesFreedBlocksOfTheSameSizeAndCountsLiveAndPeakBytes) {
  ASSERT_TRUE(useCachingHostAllocator());
  ASSERT_TRUE(cachingHostAllocatorInstalled());
  releaseCachedHostMemory();
  const HostAllocatorStats before = hostAllocatorStats();
  constexpr int64_t kFloats = 1 << 20;  // 4 MiB
  void* first = nullptr;
  {
    at::Tensor t = at::empty({kFloats}, at::kFloat);
    first = t.data_ptr();
    const HostAllocatorStats live = hostAllocatorStats();
    EXPECT_EQ(live.allocated_bytes - before.allocated_bytes, kFloats * 4);
    EXPECT_GE(live.peak_allocated_bytes, live.allocated_bytes);
  }
  const HostAllocatorStats freed = hostAllocatorStats();
  EXPECT_EQ(freed.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(freed.cached_bytes, kFloats * 4);
  at::Tensor again = at::empty({kFloats}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(hostAllocatorStats().hits, freed.hits + 1);
  EXPECT_EQ(hostAllocatorStats().cached_bytes, 0);
  // Another size does not take it.
  at::Tensor other = at::empty({kFloats + 4096}, at::kFloat);
  EXPECT_NE(other.data_ptr(), first);
  EXPECT_EQ(hostAllocatorStats().misses, freed.misses + 1);
}

TEST(HostAllocator, SmallBlocksAreNotCachedAndReleaseEmptiesTheCache) {
  ASSERT_TRUE(useCachingHostAllocator());
  releaseCachedHostMemory();
  { at::Tensor small = at::empty({16}, at::kFloat); }
  EXPECT_EQ(hostAllocatorStats().cached_bytes, 0);
  { at::Tensor big = at::empty({kCachedMinBytes / 4 + 1}, at::kFloat); }
  const int64_t cached = hostAllocatorStats().cached_bytes;
  EXPECT_EQ(cached % 4096, 0);  // whole pages
  EXPECT_GE(cached, kCachedMinBytes + 4);
  EXPECT_EQ(releaseCachedHostMemory(), cached);
  EXPECT_EQ(hostAllocatorStats().cached_bytes, 0);
}

TEST(HostAllocator, SizesThatChangeEveryStepDoNotGrowTheCache) {
  ASSERT_TRUE(useCachingHostAllocator());
  releaseCachedHostMemory();
  resetHostAllocatorPeak();
  const int64_t base = hostAllocatorStats().allocated_bytes;
  // A "step" of one activation whose length changes every step (a new sequence length).
  for (int64_t step = 0; step < 50; ++step) {
    at::Tensor t = at::empty({(1 << 18) + step * 1024}, at::kFloat);  // ~1 MiB, never the same
    t.fill_(1.0f);
  }
  const HostAllocatorStats s = hostAllocatorStats();
  EXPECT_EQ(s.allocated_bytes, base);
  // Without eviction the cache would hold all 50 blocks (~60 MiB); it holds one step's worth.
  EXPECT_LE(s.allocated_bytes + s.cached_bytes, s.peak_allocated_bytes);
  EXPECT_LE(s.cached_bytes, ((1 << 18) + 49 * 1024) * 4 + 4096);
}

TEST(HostAllocator, RawAllocationsAndComputationsThroughIt) {
  ASSERT_TRUE(useCachingHostAllocator());
  c10::Allocator* a = c10::GetAllocator(c10::DeviceType::CPU);
  void* raw = a->raw_allocate(1 << 20);
  ASSERT_NE(raw, nullptr);
  std::memset(raw, 1, 1 << 20);
  a->raw_deallocate(raw);
  at::manual_seed(3);
  at::Tensor x = at::randn({256, 300}, at::kDouble), w = at::randn({300, 200}, at::kDouble);
  for (int step = 0; step < 3; ++step) {  // blocks reused from the previous step
    at::Tensor y = at::mm(x, w);
    auto xa = x.accessor<double, 2>(), wa = w.accessor<double, 2>();
    for (int64_t i = 0; i < 256; i += 51)
      for (int64_t j = 0; j < 200; j += 37) {
        double s = 0;
        for (int64_t k = 0; k < 300; ++k) s += xa[i][k] * wa[k][j];
        EXPECT_NEAR(y[i][j].item<double>(), s, 1e-9);
      }
  }
}

}  // namespace
}  // namespace apc::runtime::host_allocator_test
