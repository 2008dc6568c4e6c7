//===- apc/support/error.h - Errors as values ------------------------------===//
//
// Libraries report failures as values: an Error carries a code and a one-line message that names
// the problem (the file, the input, the JSON path, the node). Only tools turn errors into messages
// and exit codes. Expected<T> holds either a T or an Error; Status is Expected<void>.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace apc {

enum class ErrorCode {
  kInvalidArgument,  // bad user input: flags, specs, shapes
  kNotFound,         // a named thing (file, input, node) does not exist
  kParse,            // malformed text: JSON, placements, shape specs
  kUnsupported,      // valid input we cannot handle (control flow, unknown op family)
  kInfeasible,       // constraints that no plan satisfies
  kIo,               // reading or writing files
  kInternal,         // a bug in apc
  kDeadline,         // a stage stopped at its deadline (the caller falls back; never shown)
};

/// Name of an error code, as printed ("invalid argument", ...).
const char* errorCodeName(ErrorCode code);

class Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// Returns a copy whose message is prefixed by `context: `.
  Error withContext(const std::string& context) const { return {code_, context + ": " + message_}; }

 private:
  ErrorCode code_;
  std::string message_;
};

inline Error invalidArgument(std::string m) {
  return {ErrorCode::kInvalidArgument, std::move(m)};
}
inline Error notFound(std::string m) {
  return {ErrorCode::kNotFound, std::move(m)};
}
inline Error parseError(std::string m) {
  return {ErrorCode::kParse, std::move(m)};
}
inline Error unsupported(std::string m) {
  return {ErrorCode::kUnsupported, std::move(m)};
}
inline Error infeasible(std::string m) {
  return {ErrorCode::kInfeasible, std::move(m)};
}
inline Error ioError(std::string m) {
  return {ErrorCode::kIo, std::move(m)};
}
inline Error internalError(std::string m) {
  return {ErrorCode::kInternal, std::move(m)};
}
inline Error deadlineError(std::string m) {
  return {ErrorCode::kDeadline, std::move(m)};
}

/// Either a value or an Error. Accessing the wrong alternative is a bug and aborts.
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Expected(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & {
    check(true);
    return std::get<0>(v_);
  }
  const T& value() const& {
    check(true);
    return std::get<0>(v_);
  }
  T&& value() && {
    check(true);
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const {
    check(false);
    return std::get<1>(v_);
  }

 private:
  void check(bool want_value) const {
    if (ok() != want_value) std::abort();
  }
  std::variant<T, Error> v_;
};

/// Success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), has_error_(true) {}  // NOLINT
  static Status success() { return {}; }
  bool ok() const { return !has_error_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    if (!has_error_) std::abort();
    return error_;
  }

 private:
  Error error_{ErrorCode::kInternal, ""};
  bool has_error_ = false;
};

}  // namespace apc

/// Propagates an error from an expression returning Status or Expected<T>.
#define APC_RETURN_IF_ERROR(expr)                      \
  do {                                                 \
    auto apc_status_ = (expr);                         \
    if (!apc_status_.ok()) return apc_status_.error(); \
  } while (0)

#define APC_CONCAT_INNER(a, b) a##b
#define APC_CONCAT(a, b) APC_CONCAT_INNER(a, b)
/// `APC_ASSIGN_OR_RETURN(auto x, f());` assigns the value or returns the error.
#define APC_ASSIGN_OR_RETURN(lhs, expr) \
  APC_ASSIGN_OR_RETURN_IMPL(APC_CONCAT(apc_exp_, __LINE__), lhs, expr)
#define APC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.error();              \
  lhs = std::move(tmp).value()
