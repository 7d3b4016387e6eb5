#pragma once
// SHA-256 (and the SHA-1 that ONNX external-data checksums use) behind one interface, so that a
// user is one call whatever provides it: OpenSSL's libcrypto (SHA-NI/AVX2 kernels), else
// libsodium's crypto_hash_sha256 (the same digest), else none. Which one is chosen at configure
// time (cmake/ckpt_features.cmake) by compiling one of sha256_openssl.cc, sha256_sodium.cc,
// sha256_missing.cc. SHA-1 needs OpenSSL.

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace ckpt::internal {

using Sha256Digest = std::array<unsigned char, 32>;

// Incremental SHA-256. The constructor throws Error{kUnsupported} (naming the packages) in a
// build without a provider; sha256_available() says so beforehand.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void update(const void* data, size_t n);
  void update(std::span<const std::byte> bytes) { update(bytes.data(), bytes.size()); }
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  Sha256Digest finish();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Incremental SHA-1: Error{kUnsupported} from the constructor without OpenSSL.
class Sha1Stream {
 public:
  Sha1Stream();
  ~Sha1Stream();
  Sha1Stream(const Sha1Stream&) = delete;
  Sha1Stream& operator=(const Sha1Stream&) = delete;
  void update(const void* data, size_t n);
  std::array<unsigned char, 20> finish();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

bool sha256_available();

// SHA-256 of `bytes` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view bytes);

}  // namespace ckpt::internal
