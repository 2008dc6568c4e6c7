//===- tools/apc/main.cpp - The apc command-line driver --------------------===//
//
// `apc <command> [flags]`. Commands: inspect (import a model and print its graph), plan, explain,
// diff, lower, run, calibrate, validate and export (tools/apc/plan.cpp, explain.cpp, diff.cpp,
// lower.cpp, run.cpp, calibrate.cpp, validate.cpp, export.cpp). Every failure on user input is one
// line on stderr and exit 2; so is running out of memory ("out of memory while <activity>",
// apc/support/activity.h).
//
//===----------------------------------------------------------------------===//
#include <exception>
#include <iostream>
#include <map>

#include <string>

#include <torch/version.h>

#include "apc/plan/plan.h"
#include "apc/support/activity.h"
#include "apc/support/file_io.h"
#include "commands.h"
#include "common.h"

int main(int argc, char** argv) {
  apc::installOutOfMemoryHandler("apc");
  // Ctrl-C or a kill while -o or --artifact is written leaves no temporaries behind.
  apc::removeTemporariesOnSignal();
  apc::setActivity("reading the command line");
  CLI::App app{"apc: ahead-of-time auto-sharding compiler for PyTorch models", "apc"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version", std::string("apc ") + apc::plan::apcVersion() + " (LibTorch " TORCH_VERSION ")");
  std::map<CLI::App*, apc::tool::Runner> runners;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "Import a model (.pt2 exported program or TorchScript) and print its graph");
  runners[inspect] = apc::tool::addInspectCommand(*inspect);
  CLI::App* plan =
      app.add_subcommand("plan", "Plan the sharding of a model and write the plan JSON");
  runners[plan] = apc::tool::addPlanCommand(*plan);
  CLI::App* explain =
      app.add_subcommand("explain", "Show a plan's costliest nodes and why a node is placed so");
  runners[explain] = apc::tool::addExplainCommand(*explain);
  CLI::App* diff = app.add_subcommand("diff", "Compare the placements and costs of two plans");
  runners[diff] = apc::tool::addDiffCommand(*diff);
  CLI::App* run = app.add_subcommand(
      "run", "Start N local ranks of a command with the torchrun variables and supervise them");
  runners[run] = apc::tool::addRunCommand(*run);
  CLI::App* calibrate = app.add_subcommand(
      "calibrate", "Measure the ranks' device and links and write a cluster profile for apc plan");
  runners[calibrate] = apc::tool::addCalibrateCommand(*calibrate);
  CLI::App* lower =
      app.add_subcommand("lower", "Lower a plan to per-rank programs in an artifact directory");
  runners[lower] = apc::tool::addLowerCommand(*lower);
  CLI::App* validate = app.add_subcommand(
      "validate",
      "Check a plan against its model and spec (what apc lower checks), writing nothing");
  runners[validate] = apc::tool::addValidateCommand(*validate);
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write the full weights of a sharded training checkpoint as one safetensors file");
  runners[export_cmd] = apc::tool::addExportCommand(*export_cmd);
  // Every flag that takes a number checks its range (tools/common/cli_checks.h).
  if (auto unchecked = apc::tool::uncheckedNumericFlags(app, "apc"); !unchecked.empty()) {
    std::cerr << "apc: internal error: " << unchecked.front()
              << " takes a number but has no range check\n";
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "apc: error: " << e.what() << " (see apc --help)\n";
    return 2;
  } catch (const std::bad_alloc&) {
    return apc::reportOutOfMemory("apc");
  }
  try {
    for (auto& [cmd, run] : runners)
      if (cmd->parsed()) {
        apc::setActivity("running apc " + cmd->get_name());
        return apc::tool::exitProcess(run());
      }
  } catch (const std::exception& e) {
    if (apc::isOutOfMemory(e)) return apc::tool::exitProcess(apc::reportOutOfMemory("apc"));
    std::cerr << "apc: internal error: " << e.what() << "\n";
    return 1;
  }
  return 2;
}
