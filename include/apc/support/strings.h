//===- apc/support/strings.h - Small string helpers ------------------------===//
//
// Joining, splitting and number parsing that report failures as values instead of throwing.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apc/support/error.h"

namespace apc {

/// Splits on `sep`; keeps empty pieces.
std::vector<std::string> split(std::string_view s, char sep);
/// Removes leading and trailing ASCII whitespace.
std::string_view trim(std::string_view s);
/// Parses a whole decimal integer (optional sign), or nullopt.
std::optional<int64_t> parseInt(std::string_view s);
/// Parses a whole floating point number, or nullopt.
std::optional<double> parseDouble(std::string_view s);

/// Joins the elements' text forms with `sep`.
template <typename Range, typename Fn>
std::string joinMap(const Range& r, std::string_view sep, Fn fn) {
  std::string out;
  bool first = true;
  for (const auto& x : r) {
    if (!first) out += sep;
    first = false;
    out += fn(x);
  }
  return out;
}
std::string join(const std::vector<std::string>& parts, std::string_view sep);

/// Formats a byte count for people: 1.50 GiB, 12.0 MiB, 512 B.
std::string humanBytes(double bytes);
/// Parses a memory size: a number with an optional unit B, KB, MB, GB, TB (powers of 1000), KiB,
/// MiB, GiB, TiB (powers of 1024), case-insensitive ("80GiB", "40 GB", "1.5e9"). Errors name the
/// text; the size must be positive and below 2^62 bytes.
Expected<int64_t> parseByteSize(std::string_view text);

/// Formats a number in %g style with `digits` significant digits: 12.5, 1e+06, 0.333333.
std::string formatNumber(double v, int digits = 6);
/// Formats an integer with thousands separators: 8,030,261,248.
std::string withCommas(int64_t n);

}  // namespace apc
