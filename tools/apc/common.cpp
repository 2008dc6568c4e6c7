//===- tools/apc/common.cpp - Flags shared by the apc subcommands ----------===//
#include "common.h"

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include "apc/support/activity.h"
#include "apc/support/file_io.h"
#include "apc/support/strings.h"
#include "cli_checks.h"

namespace apc::tool {

int exitProcess(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if constexpr (kFastExit) std::_Exit(code);
  return code;
}

void ModelFlags::add(CLI::App& app) {
  app.add_option("model", model,
                 "Model file: a TorchScript archive (.pt, torch.jit.save) or an exported program "
                 "(.pt2, torch.export.save)")
      ->required()
      ->check(nonEmptyPath());
  app.add_option(
      "--input", inputs,
      "Input shape override, name:dtype[d0,d1,...] (e.g. tokens:i64[8,128]; a symbolic dim "
      "as B=8) or, without a name, dtype[...] for the argument at that position (f32[8,16]); "
      "repeatable. Defaults to the shapes recorded in the archive. For a .pt2 only "
      "the values of its dynamic dims may change (B=8 also renames the dim's symbol)");
}

Expected<ir::Graph> ModelFlags::load(frontend::ImportTimings* timings) const {
  setActivity("importing " + printable(model));
  frontend::ImportOptions options;
  if (kFastExit) options.keep = [](std::shared_ptr<void> structures) { leaveToExit(structures); };
  std::optional<std::vector<frontend::InputSpec>> recorded;  // read for nameless --input only
  for (const std::string& text : inputs) {
    // A nameless shape (`f32[8,16]`) is the forward's argument at that position.
    const bool named = text.find(':') != std::string::npos;
    auto parsed = frontend::parseInputSpec(named ? text : "_:" + text);
    if (!parsed.ok()) return parsed.error().withContext("--input '" + printable(text) + "'");
    frontend::InputSpec spec = std::move(parsed).value();
    if (!named) {
      // Named after the model's forward argument at this position (as lib/api does).
      if (!recorded) {
        auto r = frontend::recordedModelInputs(model);
        if (!r.ok()) return r.error();
        recorded = std::move(r).value();
      }
      const size_t pos = options.inputs.size();
      if (pos >= recorded->size())
        return invalidArgument("--input '" + printable(text) + "' has no name and is argument " +
                               std::to_string(pos) + ", but the model's forward has " +
                               std::to_string(recorded->size()) + " inputs");
      spec.name = (*recorded)[pos].name;
    }
    for (const frontend::InputSpec& prev : options.inputs)
      if (!spec.name.empty() && prev.name == spec.name)
        return invalidArgument("--input: input '" + printable(spec.name) + "' is given twice (" +
                               printable(frontend::toString(prev)) + " and " +
                               printable(frontend::toString(spec)) + ")");
    options.inputs.push_back(spec);
  }
  frontend::ImportNotes notes;
  auto g = frontend::importModel(model, options, timings, &notes);
  if (g.ok() && !notes.buffer_mutations.empty()) {
    std::cerr << "apc: warning: the forward updates buffer"
              << (notes.buffer_mutations.size() > 1 ? "s " : " ")
              << joinMap(notes.buffer_mutations, ", ", [](const auto& m) { return m.first; })
              << " (training-mode statistics); apc plans the forward and does not write them "
                 "back\n";
  }
  return g;
}

void MeshFlags::add(CLI::App& app) {
  app.add_option("--mesh", mesh,
                 "Device mesh shape, like 8, 2x4 or 2x2x2 (overrides the spec's mesh)");
  app.add_option("--mesh-names", mesh_names,
                 "Names of the mesh dims, comma separated (e.g. dp,tp)");
  app.add_option("--spec", spec,
                 "Mesh/constraint spec file (JSON; schema in schemas/spec.schema.json)")
      ->check(nonEmptyPath());
  app.add_option("--world-size", world_size,
                 "Expected number of ranks; must equal the mesh's product")
      ->check(integerIn(1, mesh::kMaxWorldSize));
}

Expected<spec::Spec> MeshFlags::resolve(const ir::Graph* graph, const spec::Spec* base) const {
  spec::Spec s;
  const bool have_spec = !spec.empty() || base;
  if (!spec.empty()) {
    setActivity("reading the spec " + printable(spec));
    APC_ASSIGN_OR_RETURN(s, spec::parseSpecFile(spec));
  } else if (base) {
    s = *base;
  }
  if (!mesh.empty()) {
    APC_ASSIGN_OR_RETURN(mesh::DeviceMesh m, mesh::DeviceMesh::parse(mesh, mesh_names));
    // Keep link parameters from the spec when the shape is unchanged.
    if (have_spec && s.mesh.shape() == m.shape())
      for (size_t d = 0; d < m.ndim(); ++d) m.setLink(d, s.mesh.link(d));
    s.mesh = m;
  } else if (!have_spec) {
    return invalidArgument("no mesh given: use --mesh (like --mesh 2x4) or --spec");
  } else if (!mesh_names.empty()) {
    APC_ASSIGN_OR_RETURN(mesh::DeviceMesh m,
                         mesh::DeviceMesh::create(s.mesh.shape(), split(mesh_names, ',')));
    for (size_t d = 0; d < m.ndim(); ++d) m.setLink(d, s.mesh.link(d));
    s.mesh = m;
  }
  int64_t world = world_size > 0 ? world_size : s.world_size.value_or(0);
  if (world > 0 && world != s.mesh.worldSize())
    return invalidArgument("mesh " + s.mesh.toString() + " has " +
                           std::to_string(s.mesh.worldSize()) + " ranks but the world size is " +
                           std::to_string(world));
  if (graph) APC_RETURN_IF_ERROR(spec::validateSpecAgainstGraph(s, *graph));
  return s;
}

}  // namespace apc::tool

namespace apc::tool {

struct Progress::State {
  bool enabled = false;
  bool tty = false;
  double after_s = 1.0;
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread;
  bool stop = false;
  std::string name;  // the running phase; empty: none
  std::chrono::steady_clock::time_point start;
  bool shown = false;  // the phase's line has been printed

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  /// Prints the end of the running phase when its start was shown. Holds `mu`.
  void finish() {
    if (!name.empty() && shown) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.1f s", elapsed());
      std::cerr << (tty ? "\r\033[K" : "") << "apc: progress: " << name << " done (" << buf << ")\n"
                << std::flush;
    }
    name.clear();
    shown = false;
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stop) {
      cv.wait_for(lock, std::chrono::milliseconds(200));
      if (stop || name.empty()) continue;
      double t = elapsed();
      if (t < after_s) continue;
      if (tty) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.0f s", t);
        std::cerr << "\r\033[Kapc: progress: " << name << " ... " << buf << std::flush;
      } else if (!shown) {
        std::cerr << "apc: progress: " << name << " ...\n" << std::flush;
      }
      shown = true;
    }
  }
};

Progress::Progress(bool enabled, double after_s) : state_(std::make_unique<State>()) {
  state_->enabled = enabled;
  state_->after_s = after_s;
  // APC_PROGRESS_AFTER_S overrides the threshold (0: report every phase).
  if (const char* env = std::getenv("APC_PROGRESS_AFTER_S")) {
    char* end = nullptr;
    double v = std::strtod(env, &end);
    if (end != env && v >= 0) state_->after_s = v;
  }
  state_->tty = ::isatty(STDERR_FILENO) != 0;
}

Progress::~Progress() {
  if (!state_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->finish();
    state_->stop = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
}

void Progress::phase(const std::string& name) {
  setActivity(name);  // for "out of memory while <phase>", with or without --quiet
  if (!state_->enabled) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->finish();
    state_->name = name;
    state_->start = std::chrono::steady_clock::now();
    if (state_->after_s <= 0) {  // every phase: its line now (the poller may miss short ones)
      std::cerr << (state_->tty ? "\r\033[K" : "") << "apc: progress: " << name
                << (state_->tty ? " ..." : " ...\n") << std::flush;
      state_->shown = true;
    }
  }
  if (!state_->thread.joinable()) state_->thread = std::thread([s = state_.get()] { s->loop(); });
}

void Progress::done() {
  if (!state_->enabled) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->finish();
}

}  // namespace apc::tool
