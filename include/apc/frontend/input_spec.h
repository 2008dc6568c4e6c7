//===- apc/frontend/input_spec.h - Input shape specs -----------------------===//
//
// The shapes and dtypes of a model's forward inputs, as given on the command line
// (`--input tokens:i64[8,128]`, a symbolic dim as `B=8`) or recorded in the archive.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/types.h"
#include "apc/support/error.h"

namespace apc::frontend {

struct InputSpec {
  std::string name;
  ir::DType dtype = ir::DType::kF32;
  ir::Shape shape;
  bool operator==(const InputSpec&) const;  // defaulted in the .cpp (C++17 users)
};

/// Parses `name:dtype[d0,d1,...]`; a dim is a positive size or `symbol=hint` (e.g. `B=8`).
Expected<InputSpec> parseInputSpec(std::string_view text);
/// "tokens:i64[8,128]".
std::string toString(const InputSpec& s);

}  // namespace apc::frontend
