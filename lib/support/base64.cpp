//===- lib/support/base64.cpp - Base64 through OpenSSL's EVP_EncodeBlock ---===//
#include "apc/support/base64.h"

#include <openssl/evp.h>

#include <algorithm>
#include <string>

namespace apc {

std::string base64Encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  // EVP_EncodeBlock takes an int length: encode in chunks of a multiple of 3 bytes.
  constexpr size_t kChunk = size_t{3} << 20;
  size_t written = 0;
  for (size_t at = 0; at < bytes.size(); at += kChunk) {
    size_t n = std::min(kChunk, bytes.size() - at);
    int w = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data() + written),
                            reinterpret_cast<const unsigned char*>(bytes.data() + at),
                            static_cast<int>(n));
    written += static_cast<size_t>(w);
  }
  out.resize(written);
  return out;
}

Expected<std::string> base64Decode(std::string_view text) {
  auto bad = [](const std::string& why) { return parseError("bad base64 text: " + why); };
  if (text.size() % 4 != 0) return bad("its length is not a multiple of 4");
  size_t padding = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '+' || c == '/';
    if (c == '=') {
      if (i + 2 < text.size()) return bad("'=' before the last two characters");
      ++padding;
    } else if (!alpha || padding > 0) {
      return bad("character " + std::to_string(i) + " is not in the base64 alphabet");
    }
  }
  std::string out(3 * (text.size() / 4), '\0');
  // EVP_DecodeBlock takes an int length: decode in chunks of a multiple of 4 characters.
  constexpr size_t kChunk = size_t{4} << 20;
  size_t written = 0;
  for (size_t at = 0; at < text.size(); at += kChunk) {
    size_t n = std::min(kChunk, text.size() - at);
    int w = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data() + written),
                            reinterpret_cast<const unsigned char*>(text.data() + at),
                            static_cast<int>(n));
    if (w < 0) return bad("it does not decode");
    written += static_cast<size_t>(w);
  }
  // EVP_DecodeBlock counts the padding as zero bytes.
  out.resize(written - padding);
  return out;
}

}  // namespace apc
