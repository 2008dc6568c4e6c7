//===- tools/common/cli_checks.h - Checks every tool flag shares -----------===//
//
// The validators of apc's and apc-train's flags, so that every flag taking a number or a path is
// checked the same way, before the command runs:
//  - numberIn / integerIn: the value is a finite number (no nan, no inf, nothing after it) in a
//    stated range, an integer when the flag's type is. Errors name the flag and the value:
//    "--lr: must be a finite number in [0, 1e+06], got nan".
//  - nonEmptyPath: a path flag given as "" (a shell variable that was never set) is an error, not
//    a silent default.
//  - uncheckedNumericFlags: the flags of an app tree that take a number but carry no numberIn /
//    integerIn. The tools refuse to start when there is one (an internal error): a new numeric
//    flag without a range cannot slip in.
//
// CLI11 runs validators on the text before converting it, so a range check also catches values
// the conversion would wrap or round (1e30 for an int).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace apc::tool {

/// The validator name that marks a flag's number as range-checked.
inline constexpr const char* kNumberCheckName = "apc-number-range";

namespace detail {

inline std::string boundText(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

/// `range`: the bounds as messages show them, like "[0, 1]" or "(0, 10000000]".
inline CLI::Validator rangeValidator(double lo, double hi, bool lo_open, bool integer,
                                     const std::string& range) {
  const std::string what = integer ? "an integer" : "a finite number";
  auto check = [=](const std::string& text) -> std::string {
    // The value as it may appear in the one-line message.
    std::string shown;
    for (unsigned char c : text.substr(0, 40)) shown += (c < 0x20 || c == 0x7f) ? '?' : char(c);
    if (text.size() > 40) shown += "...";
    const std::string fail = "must be " + what + " in " + range + ", got '" + shown + "'";
    if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return fail;
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !std::isfinite(v)) return fail;
    if (integer && (v != std::floor(v) ||
                    text.find_first_of(".eEpPxX") != std::string::npos))  // "8", not "8.0"
      return fail;
    if (v < lo || v > hi || (lo_open && v == lo)) return fail;
    return {};
  };
  return CLI::Validator(check, "range " + range, kNumberCheckName);
}

}  // namespace detail

/// A finite number in [lo, hi] (hi may be infinity: no upper bound, still finite).
inline CLI::Validator numberIn(double lo, double hi) {
  return detail::rangeValidator(lo, hi, false, false,
                                "[" + detail::boundText(lo) + ", " + detail::boundText(hi) + "]");
}
/// A finite number greater than lo and at most hi.
inline CLI::Validator numberAbove(double lo, double hi) {
  return detail::rangeValidator(lo, hi, true, false,
                                "(" + detail::boundText(lo) + ", " + detail::boundText(hi) + "]");
}
/// An integer (decimal digits, optional sign) in [lo, hi].
inline CLI::Validator integerIn(int64_t lo, int64_t hi) {
  return detail::rangeValidator(static_cast<double>(lo), static_cast<double>(hi), false, true,
                                "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

/// A path that is not the empty string.
inline CLI::Validator nonEmptyPath() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        return text.empty() ? "must name a path, got ''" : std::string{};
      },
      "", "apc-non-empty-path");
}

/// The flags of `app` and its subcommands (as "apc plan --lr") whose value is a number (CLI11's
/// INT, UINT, FLOAT or NUMBER) but that carry no numberIn / integerIn check.
inline std::vector<std::string> uncheckedNumericFlags(CLI::App& app, const std::string& prefix) {
  std::vector<std::string> out;
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;  // a flag without a value
    const std::string type = opt->get_type_name();
    const bool numeric = type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0 ||
                         type.rfind("FLOAT", 0) == 0 || type.rfind("NUMBER", 0) == 0;
    if (!numeric) continue;
    try {
      opt->get_validator(kNumberCheckName);
    } catch (const CLI::OptionNotFound&) {
      out.push_back(prefix + " " + opt->get_name(true));
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    std::vector<std::string> more = uncheckedNumericFlags(*sub, prefix + " " + sub->get_name());
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

}  // namespace apc::tool
