//===- apc/support/hash.h - SHA-256 of bytes and files ---------------------===//
//
// Content hashes (plans: model file, spec, version; artifacts: per-rank program files): SHA-256
// through OpenSSL's libcrypto, printed as lowercase hex. In support so that the artifact library
// (and with it the runtime) needs no planner library for it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "apc/support/error.h"

namespace apc {

/// SHA-256 of `bytes`, 64 lowercase hex digits.
std::string sha256Hex(std::string_view bytes);
/// SHA-256 of a file's bytes; a missing or unreadable file is a kIo / kNotFound error naming it.
Expected<std::string> sha256File(const std::string& path);

/// SHA-256 of bytes given in pieces (a file written in chunks): update() as often as needed, then
/// hexDigest() once.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(Sha256Stream&&) noexcept;
  Sha256Stream& operator=(Sha256Stream&&) noexcept;
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void update(std::string_view bytes);
  /// 64 lowercase hex digits of everything given so far; empty when OpenSSL failed.
  std::string hexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace apc
