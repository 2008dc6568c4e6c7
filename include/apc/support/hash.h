//===- apc/support/hash.h - SHA-256 of bytes and files ---------------------===//
//
// Content hashes (plans: model file, spec, version; artifacts: per-rank program files): SHA-256
// through OpenSSL's libcrypto, printed as lowercase hex. In support so that the artifact library
// (and with it the runtime) needs no planner library for it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "apc/support/error.h"

namespace apc {

/// splitmix64's finalizer: a 64-bit mix in which inputs that differ in one bit give unrelated
/// outputs (hash tables' keys, seeds).
constexpr uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// The seed of an independent random stream from (seed, step, stream): the trainer's synthetic
/// batches, the data loader's row selection, the runtime's random nodes.
constexpr uint64_t mixSeeds(uint64_t seed, uint64_t step, uint64_t stream = 0) {
  return splitmix64(seed * 0x9E3779B97F4A7C15ull + step * 0xBF58476D1CE4E5B9ull + stream);
}

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
