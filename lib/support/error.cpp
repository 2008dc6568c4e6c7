//===- lib/support/error.cpp - Error code names ----------------------------===//
#include "apc/support/error.h"

namespace apc {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kParse:
      return "parse error";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kInfeasible:
      return "infeasible";
    case ErrorCode::kIo:
      return "i/o error";
    case ErrorCode::kInternal:
      return "internal error";
    case ErrorCode::kDeadline:
      return "time limit";
  }
  return "error";
}

}  // namespace apc
