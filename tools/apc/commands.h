//===- tools/apc/commands.h - Subcommands of the apc driver ----------------===//
//
// Each subcommand registers its flags on a CLI11 app and returns a callback that runs it. Callbacks
// return an exit code: 0 on success, 2 for bad input (one line on stderr naming the problem),
// 1 for internal errors.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <functional>
#include <iostream>

#include <CLI/CLI.hpp>

#include "apc/ir/graph.h"
#include "apc/plan/plan.h"
#include "apc/support/error.h"
#include "apc/support/file_io.h"
#include "cli_checks.h"

namespace apc::tool {

using Runner = std::function<int()>;

/// Prints `apc: error: <message>` and returns the exit code for the error.
inline int report(const Error& e) {
  std::cerr << "apc: error: " << e.message() << "\n";
  return e.code() == ErrorCode::kInternal ? 1 : 2;
}

Runner addInspectCommand(CLI::App& app);
/// `apc plan`: plan a model and write the plan JSON (tools/apc/plan.cpp).
Runner addPlanCommand(CLI::App& app);
/// `apc explain`: costliest nodes and one node's alternatives (tools/apc/explain.cpp).
Runner addExplainCommand(CLI::App& app);
/// `apc diff`: placement and cost differences of two plans (tools/apc/diff.cpp).
Runner addDiffCommand(CLI::App& app);
/// `apc calibrate`: measure the device and links and write a cluster profile
/// (tools/apc/calibrate.cpp).
Runner addCalibrateCommand(CLI::App& app);
/// `apc run`: start and supervise N local ranks of a command (tools/apc/run.cpp).
Runner addRunCommand(CLI::App& app);
/// `apc lower`: per-rank programs and the artifact directory of a plan (tools/apc/lower.cpp).
Runner addLowerCommand(CLI::App& app);
/// Lowers `p` over `g` into a staging directory beside `dir` (its commit() swaps it in for `dir`);
/// `summary` gets the line to print once committed.
Expected<StagedDirectory> stageArtifactFor(const ir::Graph& g, const plan::Plan& p,
                                           const std::string& dir, std::string* summary);
/// Imports the model at `path` with the plan's input shapes; errors when its SHA-256 is not the
/// plan's (apc validate, and graphForPlan for plans without a graph).
Expected<ir::Graph> importForPlan(const plan::Plan& p, const std::string& path);
/// The graph a plan was made on, for apc explain and apc lower: the plan's own
/// (plan::plannedGraph; `model`, when given, must still have the plan's SHA-256, but is not
/// imported), else importForPlan of `model` (empty: the plan's model path).
Expected<ir::Graph> graphForPlan(const plan::Plan& p, const std::string& model);
/// `apc validate`: check a plan against a model and spec without writing (tools/apc/validate.cpp).
Runner addValidateCommand(CLI::App& app);
/// `apc export`: the full weights of a sharded checkpoint as one safetensors file
/// (tools/apc/export.cpp).
Runner addExportCommand(CLI::App& app);
/// stageArtifactFor, commit, print the summary (apc lower).
Status writeArtifactFor(const ir::Graph& g, const plan::Plan& p, const std::string& dir);

}  // namespace apc::tool
