//===- lib/support/activity.cpp - What the process is doing, for OOM reports ===//
//
// The activity lives in a fixed buffer, so that neither setting it nor reporting it allocates.
//
//===----------------------------------------------------------------------===//
#include "apc/support/activity.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

namespace apc {

namespace {

std::mutex activity_mu;
char activity_text[256] = "starting";
const char* oom_tool = "apc";
std::terminate_handler previous_terminate = nullptr;

[[noreturn]] void onTerminate() {
  if (std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      if (isOutOfMemory(e)) std::_Exit(reportOutOfMemory(oom_tool));
    } catch (...) {
    }
  }
  if (previous_terminate) previous_terminate();
  std::abort();
}

}  // namespace

void setActivity(std::string_view what) {
  std::lock_guard<std::mutex> lock(activity_mu);
  size_t n = std::min(what.size(), sizeof activity_text - 1);
  std::memcpy(activity_text, what.data(), n);
  activity_text[n] = '\0';
}

bool isOutOfMemory(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return true;
  // c10::alloc_cpu's failures are c10::Errors whose message starts with LibTorch's own text:
  // "[enforce fail at alloc_cpu.cpp:N] <condition>. DefaultCPUAllocator: can't allocate memory:
  // ..." (CAFFE_ENFORCE, LibTorch 2.13 on Linux; "not enough memory" where it mallocs), or the
  // allocator's phrase itself (a TORCH_CHECK). Only the first line is read, and only from its
  // start: an error that quotes the user's input (a TorchScript ErrorReport naming an unknown
  // type, an unpickler's bad key) may hold the phrase further on, and is not out of memory.
  const char* what = e.what();
  const char* end = std::strchr(what, '\n');
  if (!end) end = what + std::strlen(what);
  const auto startsWith = [&](const char* from, const char* prefix) {
    size_t n = std::strlen(prefix);
    return static_cast<size_t>(end - from) >= n && std::strncmp(from, prefix, n) == 0;
  };
  const char* phrase = what;
  constexpr const char* kEnforce = "[enforce fail at alloc_cpu.cpp:";
  if (startsWith(what, kEnforce)) {
    // Past "<line>] <condition>. ", at the first "DefaultCPUAllocator: " of the line.
    phrase = std::strstr(what, "DefaultCPUAllocator: ");
    if (!phrase || phrase >= end) return false;
  }
  return startsWith(phrase, "DefaultCPUAllocator: not enough memory") ||
         startsWith(phrase, "DefaultCPUAllocator: can't allocate memory");
}

void installOutOfMemoryHandler(const char* tool) {
  oom_tool = tool;
  std::terminate_handler old = std::set_terminate(onTerminate);
  if (old != onTerminate) previous_terminate = old;
}

int reportOutOfMemory(const char* tool) {
  char line[512];
  {
    std::lock_guard<std::mutex> lock(activity_mu);
    std::snprintf(line, sizeof line, "%s: error: out of memory while %s\n", tool, activity_text);
  }
  std::fflush(stdout);
  std::fputs(line, stderr);
  std::fflush(stderr);
  return 2;
}

}  // namespace apc
