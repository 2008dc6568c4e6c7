//===- lib/runtime/host_allocator.cpp - A caching allocator for CPU tensors --===//
//
// See apc/runtime/host_allocator.h.
//
//===----------------------------------------------------------------------===//
#include "apc/runtime/host_allocator.h"

#include <algorithm>
#include <iterator>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

namespace apc::runtime {

namespace {

constexpr size_t kPage = 4096;

class CachingHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = obtain(n);
    return {p, p, &deleteBlock, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &deleteBlock; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  HostAllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void resetPeak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }

  int64_t release() {
    std::vector<void*> blocks;
    int64_t released = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [size, list] : free_)
        for (void* p : list) {
          blocks.push_back(p);
          released += static_cast<int64_t>(size);
        }
      free_.clear();
      stats_.cached_bytes = 0;
    }
    for (void* p : blocks) c10::free_cpu(p);
    return released;
  }

  static CachingHostAllocator& instance() {
    // Never destroyed: tensors may die after static destructors have run.
    static auto* a = new CachingHostAllocator();
    return *a;
  }

 private:
  static size_t blockSize(size_t n) {
    if (n < static_cast<size_t>(kCachedMinBytes)) return n;
    return (n + kPage - 1) / kPage * kPage;
  }

  void* obtain(size_t n) {
    const size_t size = blockSize(n);
    if (size == 0) return nullptr;
    const bool cached = size >= static_cast<size_t>(kCachedMinBytes);
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached) {
        auto it = free_.find(size);
        if (it != free_.end() && !it->second.empty()) {
          void* p = it->second.back();
          it->second.pop_back();
          stats_.cached_bytes -= static_cast<int64_t>(size);
          ++stats_.hits;
          noteLive(p, size);
          return p;
        }
        ++stats_.misses;
      }
      // Live and cached bytes together stay within the peak of live bytes: a miss evicts
      // cached blocks (sizes a step no longer asks for: a new sequence length, another batch)
      // until the new block fits under that peak, so the cache never grows past the working set.
      const int64_t need = static_cast<int64_t>(size);
      auto over = [&] {
        return stats_.cached_bytes > 0 &&
               stats_.allocated_bytes + stats_.cached_bytes + need >
                   std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes + need);
      };
      for (auto it = free_.begin(); cached && it != free_.end() && over();) {
        while (!it->second.empty() && over()) {
          evicted.push_back(it->second.back());
          it->second.pop_back();
          stats_.cached_bytes -= static_cast<int64_t>(it->first);
        }
        it = it->second.empty() ? free_.erase(it) : std::next(it);
      }
    }
    for (void* e : evicted) c10::free_cpu(e);
    void* p = nullptr;
    try {
      p = c10::alloc_cpu(size);
    } catch (const c10::Error&) {
      if (release() == 0) throw;
      p = c10::alloc_cpu(size);  // out of memory again: the caller sees LibTorch's error
    }
    std::lock_guard<std::mutex> lock(mu_);
    noteLive(p, size);
    return p;
  }

  void noteLive(void* p, size_t size) {  // mu_ held
    live_.emplace(p, size);
    stats_.allocated_bytes += static_cast<int64_t>(size);
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  }

  void free(void* p) {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(p);
      if (it != live_.end()) {
        const size_t size = it->second;
        live_.erase(it);
        stats_.allocated_bytes -= static_cast<int64_t>(size);
        if (size >= static_cast<size_t>(kCachedMinBytes)) {
          free_[size].push_back(p);
          stats_.cached_bytes += static_cast<int64_t>(size);
          return;
        }
      }
    }
    c10::free_cpu(p);
  }

  static void deleteBlock(void* p) { instance().free(p); }

  std::mutex mu_;
  std::unordered_map<void*, size_t> live_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  HostAllocatorStats stats_;
};

std::once_flag g_install;
bool g_installed = false;

}  // namespace

bool useCachingHostAllocator() {
  std::call_once(g_install, [] {
    // Priority 1: above LibTorch's default CPU allocator (0), which registers at load time.
    c10::SetAllocator(c10::DeviceType::CPU, &CachingHostAllocator::instance(), 1);
    g_installed = c10::GetAllocator(c10::DeviceType::CPU) == &CachingHostAllocator::instance();
  });
  return g_installed;
}

bool cachingHostAllocatorInstalled() {
  return g_installed;
}

HostAllocatorStats hostAllocatorStats() {
  return CachingHostAllocator::instance().stats();
}

void resetHostAllocatorPeak() {
  CachingHostAllocator::instance().resetPeak();
}

int64_t releaseCachedHostMemory() {
  return CachingHostAllocator::instance().release();
}

}  // namespace apc::runtime
