//===- apc/support/base64.h - Base64 text of bytes --------------------------===//
//
// Standard base64 (RFC 4648, with padding, no line breaks) through OpenSSL's libcrypto, which
// support links for SHA-256 already. Plans carry their serialized graph in this form.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <string_view>

#include "apc/support/error.h"

namespace apc {

/// The base64 text of `bytes`.
std::string base64Encode(std::string_view bytes);
/// The bytes of base64 `text`. Anything but a whole number of 4-character groups of the base64
/// alphabet, with '=' padding only at the end, is a kParse error.
Expected<std::string> base64Decode(std::string_view text);

}  // namespace apc
