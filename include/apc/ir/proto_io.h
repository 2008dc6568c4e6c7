//===- apc/ir/proto_io.h - Protobuf (de)serialization of graphs ------------===//
//
// proto/apc.proto defines apc.proto.Graph with a format_version. Reading checks the version and the
// graph's consistency (Graph::verify), so a truncated or edited file is an error, not a crash.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>

#include "apc/ir/graph.h"
#include "apc/support/error.h"

namespace apc::ir {

/// The format version written into every serialized graph and checked on read.
inline constexpr uint32_t kGraphFormatVersion = 1;

/// Serializes to protobuf wire bytes (deterministic for the same graph).
std::string serializeGraph(const Graph& g);
Expected<Graph> deserializeGraph(const std::string& bytes);
/// A rank's program graph (proto::Program.graph serialized, apc/lower/lower.h): its
/// "redistribute" nodes read as op nodes (the runtime runs them itself), and one written without a
/// format version reads as the current one.
Expected<Graph> deserializeProgramGraph(const std::string& bytes);

Status writeGraphFile(const Graph& g, const std::string& path);
Expected<Graph> readGraphFile(const std::string& path);

}  // namespace apc::ir
