//===- lib/support/hash.cpp - SHA-256 through OpenSSL's libcrypto -------===//
//
// Streams through OpenSSL's EVP digest interface so that large model files (GiBs) are hashed in
// fixed-size chunks.
//
//===----------------------------------------------------------------------===//
#include "apc/support/hash.h"

#include <openssl/evp.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "apc/support/file_io.h"

namespace apc {

namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using MdCtx = std::unique_ptr<EVP_MD_CTX, MdCtxDeleter>;

std::string hex(const unsigned char* data, unsigned int n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    out += kDigits[data[i] >> 4];
    out += kDigits[data[i] & 15];
  }
  return out;
}

MdCtx newSha256() {
  MdCtx ctx(EVP_MD_CTX_new());
  if (ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) ctx.reset();
  return ctx;
}

std::string finish(EVP_MD_CTX* ctx) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx, md.data(), &n) != 1) return {};
  return hex(md.data(), n);
}

}  // namespace

std::string sha256Hex(std::string_view bytes) {
  MdCtx ctx = newSha256();
  if (!ctx || EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) != 1) return {};
  return finish(ctx.get());
}

Expected<std::string> sha256File(const std::string& path) {
  APC_RETURN_IF_ERROR(checkRegularFile(path));  // a FIFO would block, /dev/zero never end
  std::ifstream in(path, std::ios::binary);
  if (!in) return ioError(path + ": cannot open for reading");
  MdCtx ctx = newSha256();
  if (!ctx) return internalError("cannot initialise SHA-256");
  std::array<char, 1 << 16> buf;
  while (in) {
    in.read(buf.data(), buf.size());
    std::streamsize got = in.gcount();
    if (got > 0 && EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(got)) != 1)
      return internalError("SHA-256 update failed");
  }
  if (in.bad()) return ioError(path + ": read error");
  std::string digest = finish(ctx.get());
  if (digest.empty()) return internalError("SHA-256 finalisation failed");
  return digest;
}

struct Sha256Stream::Impl {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx{nullptr, EVP_MD_CTX_free};
  bool failed = false;
};

Sha256Stream::Sha256Stream() : impl_(std::make_unique<Impl>()) {
  impl_->ctx.reset(newSha256().release());
  if (!impl_->ctx) impl_->failed = true;
}
Sha256Stream::~Sha256Stream() = default;
Sha256Stream::Sha256Stream(Sha256Stream&&) noexcept = default;
Sha256Stream& Sha256Stream::operator=(Sha256Stream&&) noexcept = default;

void Sha256Stream::update(std::string_view bytes) {
  if (impl_->failed || bytes.empty()) return;
  if (EVP_DigestUpdate(impl_->ctx.get(), bytes.data(), bytes.size()) != 1) impl_->failed = true;
}

std::string Sha256Stream::hexDigest() {
  if (impl_->failed) return {};
  return finish(impl_->ctx.get());
}

}  // namespace apc
