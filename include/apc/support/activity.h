//===- apc/support/activity.h - What the process is doing, for OOM reports --===//
//
// A tool that runs out of memory (std::bad_alloc, or LibTorch's allocator failing) ends with one
// line, "<tool>: error: out of memory while <activity>", and exit 2, like any other input that is
// too large for the machine. The activity is set by the tool at its phases (the subcommand, then
// "importing m.pt", "enumerating strategies", "training step 3"); the report is written without
// allocating, since it runs when memory is short.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <exception>
#include <string_view>

namespace apc {

/// Records what the process does now (at most 255 bytes kept). Thread-safe.
void setActivity(std::string_view what);

/// Whether `e` reports that memory ran out: std::bad_alloc (operator new, containers) or
/// LibTorch's CPU allocator (a c10::Error whose message starts "[enforce fail at
/// alloc_cpu.cpp:N] ... DefaultCPUAllocator: not enough memory" or "... can't allocate memory" on
/// its first line, or with the allocator's phrase itself). An error that merely quotes the phrase
/// (from the user's input) is not.
bool isOutOfMemory(const std::exception& e);

/// In a catch handler that turns an exception into an error value or another exception (an
/// importer's "malformed model.json (...)", a node's "unsupported: ..."): rethrows the exception
/// being handled when it reports that memory ran out, so that it reaches the tool's one-line
/// out-of-memory report (exit 2) instead of being worded as that handler's own error. Call it
/// first in every such handler, and only inside a catch block.
inline void rethrowIfOutOfMemory(const std::exception& e) {
  if (isOutOfMemory(e)) throw;
}

/// Prints "<tool>: error: out of memory while <activity>" on stderr without allocating and
/// returns 2, the exit code of input too large for the machine.
int reportOutOfMemory(const char* tool);

/// Installs a std::terminate handler that reports an out-of-memory exception as
/// reportOutOfMemory(tool) and exits 2 (without running destructors, as terminate would not).
/// A std::bad_alloc can end in terminate instead of the tool's handler: thrown inside a noexcept
/// destructor (nlohmann::json's destroy allocates its work stack while unwinding from the first
/// bad_alloc) or in a thread. Other terminations go to the previous handler.
void installOutOfMemoryHandler(const char* tool);

}  // namespace apc
