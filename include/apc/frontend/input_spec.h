//===- apc/frontend/input_spec.h - Input shape specs -----------------------===//
//
// The shapes and dtypes of a model's forward inputs, as given on the command line
// (`--input tokens:i64[8,128]`, a symbolic dim as `B=8`) or recorded in the archive.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
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

/// The input shapes a TorchScript archive records in extra/apc_inputs.json (our sample
/// generator writes it): `{"inputs": [{"name", "dtype", "shape"}, ...]}`, each dim an integer or a
/// --input dim text ("B=8"). Returns, for each of `names` (the forward's arguments), its recorded
/// spec, or nullopt when no entry names it with a known dtype and a shape list (the last such
/// entry wins). Empty text records nothing. Anything malformed (not JSON, not an object, an entry
/// that is not an object, a dim that is not a positive size) is a parse error
/// "'<source>' has a malformed extra/apc_inputs.json (<why>)". LibTorch-free, so that the
/// torch-free fuzz target reaches it directly.
Expected<std::vector<std::optional<InputSpec>>> parseRecordedInputs(
    std::string_view json_text, const std::vector<std::string>& names, const std::string& source);

}  // namespace apc::frontend
