//===- lib/support/json_reader.cpp - apc's one JSON reader -----------------===//
//
// The functions of apc/support/json_reader.h.
//
//===----------------------------------------------------------------------===//
#include "apc/support/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <sstream>

#include "apc/support/file_io.h"
#include "apc/support/strings.h"

namespace apc {

using json_reader::indexPath;
using json_reader::keyPath;
using nlohmann::json;

// --- JSON text -----------------------------------------------------------------------------------

namespace {

/// A SAX pass that finds the first key given twice in one object and names its path. (nlohmann's
/// parser callback would do it in one pass, but its object_end handling scans the whole parent
/// container each time: quadratic in the length of a list of objects.)
class DuplicateKeyFinder : public nlohmann::json_sax<json> {
 public:
  std::optional<std::string> duplicate;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    stack_.push_back(Frame{true, {}, {}, 0});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    f.key = k;
    if (!f.keys.insert(k).second) {
      duplicate = keyPath(containerPath(), k);
      return false;  // stop at the first
    }
    return true;
  }
  bool end_object() override { return end(); }
  bool start_array(std::size_t) override {
    stack_.push_back(Frame{false, {}, {}, 0});
    return true;
  }
  bool end_array() override { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  struct Frame {
    bool is_object = false;
    std::set<std::string> keys;
    std::string key;   // objects: the current key
    size_t index = 0;  // arrays: the current element
  };
  bool value() {
    if (!stack_.empty() && !stack_.back().is_object) ++stack_.back().index;
    return true;
  }
  bool end() {
    stack_.pop_back();
    return value();
  }
  /// The path of the innermost container.
  std::string containerPath() const {
    std::string p = "$";
    for (size_t i = 0; i + 1 < stack_.size(); ++i)
      p = stack_[i].is_object ? keyPath(p, stack_[i].key) : indexPath(p, stack_[i].index);
    return p;
  }
  std::vector<Frame> stack_;
};

/// parseJsonText's body for either tree type (nlohmann::json, or ordered_json that keeps key
/// order); the duplicate-key pass reads the text, whatever the tree.
template <class Json>
Expected<Json> parseChecked(std::string_view text) {
  APC_RETURN_IF_ERROR(checkJsonText(text));
  Json j;
  try {
    j = Json::parse(text.begin(), text.end());
  } catch (const typename Json::exception& e) {
    std::string what = e.what();
    if (size_t pos = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && pos != std::string::npos)
      what = what.substr(pos + 2);
    return parseError("malformed JSON: " + what);
  }
  // A second, linear pass names a key given twice (the parser keeps the last silently).
  DuplicateKeyFinder finder;
  json::sax_parse(text.begin(), text.end(), &finder);
  if (finder.duplicate) return parseError(*finder.duplicate + ": key given twice in one object");
  return j;
}

}  // namespace

Expected<json> parseJsonText(std::string_view text) {
  return parseChecked<json>(text);
}

Expected<nlohmann::ordered_json> parseOrderedJsonText(std::string_view text) {
  return parseChecked<nlohmann::ordered_json>(text);
}

Expected<json> readJsonFile(const std::string& path) {
  auto read = readInputFile(path);
  if (!read.ok()) {
    // A missing file stays an I/O error of this reader (kIo, as before the shared reader).
    if (read.error().code() == ErrorCode::kNotFound) return ioError(read.error().message());
    return read.error();
  }
  const std::string& text = *read;
  auto j = parseJsonText(text);
  if (!j.ok()) return j.error().withContext(path);
  return j;
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// --- JSON values ---------------------------------------------------------------------------------

namespace json_reader {

std::string keyPath(const std::string& base, const std::string& key) {
  bool ident = !key.empty() && !std::isdigit(static_cast<unsigned char>(key[0]));
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') ident = false;
  if (ident) return base + "." + key;
  return base + "[" + json(key).dump(-1, ' ', false, json::error_handler_t::replace) + "]";
}

std::string indexPath(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

Error at(const std::string& path, const std::string& message) {
  return invalidArgument(path + ": " + message);
}

std::string describe(const json& j) {
  std::string type = j.type_name();
  if (j.is_structured() || j.is_null()) return type;
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return type + " " + text;
}

std::string quoteList(const std::vector<std::string>& names) {
  return join(names, ", ");
}

/// " (did you mean 'shape'?)" when a candidate is close to `name` (a third of its length, at least
/// one edit, and fewer edits than its length), else "".
std::string suggestion(std::string_view name, const std::vector<std::string>& candidates) {
  if (name.size() > 256) return "";  // no name is that long; spare the quadratic distance
  const std::string* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    if (c.size() > 256) continue;
    size_t d = editDistance(name, c);
    if (d < best_d) {
      best_d = d;
      best = &c;
    }
  }
  if (best && best_d <= std::max<size_t>(1, name.size() / 3) && best_d < name.size())
    return " (did you mean '" + *best + "'?)";
  return "";
}

Status expectObject(const json& j, const std::string& path, const std::string& what) {
  if (!j.is_object()) return at(path, "expected " + what + ", got " + describe(j));
  return Status::success();
}

/// Rejects keys outside `allowed` (they are usually typos).
Status checkKeys(const json& j, const std::string& path, const std::vector<std::string>& allowed) {
  for (const auto& [key, value] : j.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    return at(keyPath(path, key),
              "unknown key" + suggestion(key, allowed) + "; allowed keys: " + quoteList(allowed));
  }
  return Status::success();
}

Status checkObject(const json& j, const std::string& path,
                   std::initializer_list<const char*> required,
                   std::initializer_list<const char*> optional) {
  APC_RETURN_IF_ERROR(expectObject(j, path, "an object"));
  // Unknown keys first: a misspelt required key is named with its suggestion, not as missing.
  std::vector<std::string> allowed(required.begin(), required.end());
  allowed.insert(allowed.end(), optional.begin(), optional.end());
  std::sort(allowed.begin(), allowed.end());
  APC_RETURN_IF_ERROR(checkKeys(j, path, allowed));
  for (const char* k : required)
    if (!j.contains(k)) return at(path, std::string("missing key '") + k + "'");
  return Status::success();
}

const json* find(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

Expected<int64_t> readInt(const json& j, const std::string& path, bool strict) {
  if (j.is_number_unsigned()) {
    if (j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return at(path, "integer " + j.dump() + " is too large");
    return static_cast<int64_t>(j.get<uint64_t>());
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number_float() && !strict) {
    // JSON Schema (draft 6 and later) counts 2.0 as an integer; so do we.
    double d = j.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15)
      return static_cast<int64_t>(d);
  }
  return at(path, "expected an integer, got " + describe(j));
}

Expected<int64_t> readIntAtLeast(const json& j, const std::string& path, int64_t min, bool strict) {
  APC_ASSIGN_OR_RETURN(int64_t v, readInt(j, path, strict));
  if (v < min) return at(path, "must be >= " + std::to_string(min) + ", got " + std::to_string(v));
  return v;
}

Expected<double> readNumber(const json& j, const std::string& path) {
  if (!j.is_number()) return at(path, "expected a number, got " + describe(j));
  double d = j.get<double>();
  if (!std::isfinite(d)) return at(path, "expected a finite number, got " + describe(j));
  return d;
}

Expected<double> readInRange(const json& j, const std::string& path, const std::string& what,
                             double lo, double hi) {
  APC_ASSIGN_OR_RETURN(double d, readNumber(j, path));
  if (d < lo || d > hi) {
    std::ostringstream os;
    os << what << " must be in [" << lo << ", " << hi << "], got " << j.dump();
    return at(path, os.str());
  }
  return d;
}

Expected<std::string> readString(const json& j, const std::string& path) {
  if (!j.is_string()) return at(path, "expected a string, got " + describe(j));
  return j.get<std::string>();
}

Expected<bool> readBool(const json& j, const std::string& path) {
  if (!j.is_boolean()) return at(path, "expected true or false, got " + describe(j));
  return j.get<bool>();
}

Status expectArray(const json& j, const std::string& path, const std::string& what) {
  if (!j.is_array()) return at(path, "expected " + what + ", got " + describe(j));
  return Status::success();
}

std::string entries(size_t n) {
  return std::to_string(n) + (n == 1 ? " entry" : " entries");
}
std::string dims(size_t n) {
  return std::to_string(n) + (n == 1 ? " dim" : " dims");
}

}  // namespace json_reader
}  // namespace apc
