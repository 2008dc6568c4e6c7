//===- lib/frontend/input_spec.cpp - Input shape specs ---------------------===//
#include "apc/frontend/input_spec.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "apc/support/file_io.h"
#include "apc/support/json_reader.h"
#include "apc/support/strings.h"

namespace apc::frontend {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool InputSpec::operator==(const InputSpec&) const = default;

Expected<InputSpec> parseInputSpec(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return parseError(
        "bad input spec '" + std::string(text) + "': " + why +
        " (expected name:dtype[d0,d1,...], like tokens:i64[8,128] or x:f32[B=8,1024])");
  };
  std::string_view t = trim(text);
  size_t colon = t.find(':');
  if (colon == std::string_view::npos || colon == 0) return bad("missing 'name:'");
  InputSpec spec;
  spec.name = std::string(trim(t.substr(0, colon)));
  for (char c : spec.name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.')
      return bad("bad name");
  std::string_view rest = t.substr(colon + 1);
  size_t lb = rest.find('[');
  if (lb == std::string_view::npos || rest.back() != ']') return bad("missing [shape]");
  std::string dtype_text(trim(rest.substr(0, lb)));
  auto dtype = ir::parseDType(dtype_text);
  if (!dtype) return bad("unknown dtype '" + dtype_text + "'");
  spec.dtype = *dtype;
  std::string_view dims = trim(rest.substr(lb + 1, rest.size() - lb - 2));
  if (!dims.empty()) {
    for (const std::string& piece : split(dims, ',')) {
      std::string_view p = trim(piece);
      size_t eq = p.find('=');
      std::string symbol;
      std::string_view num = p;
      if (eq != std::string_view::npos) {
        symbol = std::string(trim(p.substr(0, eq)));
        num = p.substr(eq + 1);
        if (symbol.empty()) return bad("empty symbol in '" + std::string(p) + "'");
      }
      auto n = parseInt(num);
      if (!n || *n <= 0) return bad("dim '" + std::string(p) + "' is not a positive size");
      spec.shape.push_back(ir::Dim{*n, symbol, 1});
    }
  }
  return spec;
}

std::string toString(const InputSpec& s) {
  return s.name + ":" + ir::dtypeName(s.dtype) + ir::toString(s.shape);
}

Expected<std::vector<std::optional<InputSpec>>> parseRecordedInputs(
    std::string_view json_text, const std::vector<std::string>& names, const std::string& source) {
  std::vector<std::optional<InputSpec>> out(names.size());
  if (json_text.empty()) return out;
  auto malformed = [&](const std::string& why) {
    return parseError("'" + source + "' has a malformed extra/apc_inputs.json (" + why + ")");
  };
  auto parsed = parseJsonText(json_text);
  if (!parsed.ok()) return malformed(parsed.error().message());
  const nlohmann::json& doc = *parsed;
  if (!doc.is_object()) return malformed("not a JSON object");
  auto inputs = doc.find("inputs");
  if (inputs == doc.end()) return out;
  if (!inputs->is_array()) return malformed("'inputs' is not a list");
  auto text = [](const nlohmann::json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  for (const auto& r : *inputs) {
    if (!r.is_object()) return malformed("an entry of 'inputs' is not an object");
    const std::string name = text(r, "name");
    auto dt = ir::parseDType(text(r, "dtype"));
    auto shape = r.find("shape");
    if (!dt || shape == r.end() || !shape->is_array()) continue;
    InputSpec spec;
    spec.name = name;
    spec.dtype = *dt;
    for (const auto& d : *shape) {
      // Checked as a --input dim is (a positive size, or NAME=size).
      std::string dim = d.is_number_integer() ? std::to_string(d.get<int64_t>())
                        : d.is_string()       ? d.get<std::string>()
                                              : std::string();
      auto parsed = parseInputSpec("x:f32[" + dim + "]");
      if (!parsed.ok() || parsed->shape.size() != 1)
        return malformed("input '" + printable(name) + "' has a bad dim " + printable(d.dump()));
      spec.shape.push_back(parsed->shape[0]);
    }
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) out[i] = spec;
  }
  return out;
}

}  // namespace apc::frontend
