//===- tools/apc/common.h - Flags shared by the apc subcommands ------------===//
//
// Model flags (MODEL, --input) and mesh flags (--mesh, --mesh-names, --spec, --world-size), with
// the code that turns them into a Graph and a Spec. Shared so that every subcommand accepts and
// checks them the same way.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "apc/frontend/model.h"
#include "apc/spec/spec.h"

namespace apc::tool {

/// Whether the process ends without freeing: false in sanitizer builds, where LeakSanitizer's exit
/// check must see every allocation freed.
constexpr bool kFastExit =
#if defined(__SANITIZE_ADDRESS__)
    false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    false;
#else
    true;
#endif
#else
    true;
#endif

/// Hands a command's big objects (the imported graph, the built problem, the plan) to the process
/// exit instead of freeing them node by node, as clang's -disable-free does with its ASTs: freeing
/// a 126-layer model's structures costs tens of milliseconds at the end of a run whose output is
/// already written. Sanitizer builds free them (kFastExit).
template <typename T>
void leaveToExit(T&& object) {
  if constexpr (kFastExit) {
    // Deliberately never deleted: exitProcess ends the process right after the command.
    new std::decay_t<T>(std::forward<T>(object));
  } else {
    std::decay_t<T> dropped(std::forward<T>(object));
    (void)dropped;
  }
}

/// Ends the process with `code` once the standard streams are flushed, without static destructors
/// (LibTorch's deregister some 2,000 operators: 70-100 ms); a normal return in sanitizer builds.
/// Only main calls it, after the command returned, so every file it wrote is closed and renamed.
int exitProcess(int code);

struct ModelFlags {
  std::string model;
  std::vector<std::string> inputs;

  void add(CLI::App& app);
  Expected<ir::Graph> load(frontend::ImportTimings* timings = nullptr) const;
};

struct MeshFlags {
  std::string mesh;        // "2x4"
  std::string mesh_names;  // "dp,tp"
  std::string spec;        // spec.json
  int64_t world_size = 0;  // 0: not given

  /// Registers the flags (none is required here; resolve() reports a missing mesh).
  void add(CLI::App& app);
  bool given() const { return !mesh.empty() || !spec.empty(); }
  /// The spec from --spec (or `base` when --spec is not given and base is), with --mesh /
  /// --mesh-names overriding its mesh; checked against --world-size and, when given, the graph.
  Expected<spec::Spec> resolve(const ir::Graph* graph, const spec::Spec* base = nullptr) const;
};

}  // namespace apc::tool

namespace apc::tool {

/// Progress of a command's long phases on stderr. A phase that runs past `after_s` (or
/// $APC_PROGRESS_AFTER_S) gets a line `apc: progress: <phase> ...` (on a terminal, a line that
/// counts the seconds in place), and its end `apc: progress: <phase> done (12.3 s)`; short phases
/// print nothing. Disabled (all no-ops) when
/// `enabled` is false (--quiet). One background thread, started by the first phase.
class Progress {
 public:
  explicit Progress(bool enabled, double after_s = 1.0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Ends the current phase (if any) and starts `name`.
  void phase(const std::string& name);
  /// Ends the current phase.
  void done();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace apc::tool
