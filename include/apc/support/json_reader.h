//===- apc/support/json_reader.h - apc's one JSON reader -------------------===//
//
// Every apc library that reads JSON (specs and sharding files in lib/spec, plans in lib/plan,
// artifact manifests in lib/artifact; in key order, parseOrderedJsonText: the runtime's checkpoint
// manifests and safetensors headers, the .pt2 importer's records) reads it through these
// functions:
//  - parseJsonText / readJsonFile: text to a JSON tree, with checkJsonText's limits (no NUL byte,
//    at most kMaxJsonDepth levels of nesting) and a key given twice in one object an error that
//    names its path (nlohmann's parser keeps the last one silently);
//  - the value readers (namespace json_reader): they walk the tree by hand (no nlohmann get<T> that
//    throws) and carry the JSON path of the value they read ("$.mesh.shape[1]"), so that every
//    error is one line that starts with that path; an unknown key names the allowed keys and the
//    closest one ("unknown key (did you mean 'mesh'?); allowed keys: ...").
// Errors of the value readers are kInvalidArgument; those of the text, kParse.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "apc/support/error.h"

namespace apc {

/// Parses JSON text. Malformed text gives a kParse error with nlohmann's line and column; so do a
/// NUL byte and nesting deeper than kMaxJsonDepth (checkJsonText); a key that appears twice in one
/// object is a kParse error naming its path (JSON parsers silently keep the last one).
Expected<nlohmann::json> parseJsonText(std::string_view text);
/// parseJsonText's checks and errors, into a tree that keeps the objects' keys in their order in
/// the text (for readers whose files give meaning to it: safetensors headers, checkpoints).
Expected<nlohmann::ordered_json> parseOrderedJsonText(std::string_view text);
/// Reads and parses a JSON file (readInputFile: a regular file of at most 1 GiB; a missing or
/// unreadable file is kIo); errors are prefixed by the path.
Expected<nlohmann::json> readJsonFile(const std::string& path);

/// Edit distance with adjacent transpositions (optimal string alignment): "mseh" is 1 from "mesh".
size_t editDistance(std::string_view a, std::string_view b);

namespace json_reader {

using json = nlohmann::json;

/// `base.key`, or `base["a.b"]` when the key is not an identifier.
std::string keyPath(const std::string& base, const std::string& key);
/// `base[i]`.
std::string indexPath(const std::string& base, size_t i);
/// An invalid-argument error "PATH: MESSAGE".
Error at(const std::string& path, const std::string& message);
/// "string \"abc\"", "array", "number 1.5": the type and, for scalars, the value (shortened).
std::string describe(const json& j);
/// The names joined by ", ".
std::string quoteList(const std::vector<std::string>& names);
/// " (did you mean 'shape'?)" when a candidate is close to `name`, else "".
std::string suggestion(std::string_view name, const std::vector<std::string>& candidates);

/// `j` is an object; else "PATH: expected WHAT, got TYPE".
Status expectObject(const json& j, const std::string& path, const std::string& what);
/// Every key of object `j` is in `allowed` (an unknown key is an error with a suggestion).
Status checkKeys(const json& j, const std::string& path, const std::vector<std::string>& allowed);
/// `j` is an object with no key outside `required` and `optional` (checkKeys' error, checked
/// first, so that a misspelt key gets its suggestion) and every key of `required` ("PATH: missing
/// key 'K'").
Status checkObject(const json& j, const std::string& path,
                   std::initializer_list<const char*> required,
                   std::initializer_list<const char*> optional = {});
/// The member `key` of object `j`, or null.
const json* find(const json& j, const char* key);

/// An integer. A float with an integral value counts (JSON Schema, draft 6 and later, counts 2.0
/// as an integer) unless `strict`.
Expected<int64_t> readInt(const json& j, const std::string& path, bool strict = false);
/// An integer of at least `min` ("must be >= MIN, got V").
Expected<int64_t> readIntAtLeast(const json& j, const std::string& path, int64_t min,
                                 bool strict = false);
/// A finite number.
Expected<double> readNumber(const json& j, const std::string& path);
/// A finite number in [lo, hi]; `what` names it in the message ("bandwidth").
Expected<double> readInRange(const json& j, const std::string& path, const std::string& what,
                             double lo, double hi);
Expected<std::string> readString(const json& j, const std::string& path);
Expected<bool> readBool(const json& j, const std::string& path);
/// An array; else "PATH: expected WHAT, got TYPE" (WHAT defaults to "a list").
Status expectArray(const json& j, const std::string& path, const std::string& what = "a list");

/// "1 entry", "2 entries"; "1 dim", "2 dims".
std::string entries(size_t n);
std::string dims(size_t n);

}  // namespace json_reader
}  // namespace apc
