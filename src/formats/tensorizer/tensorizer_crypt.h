#pragma once
// tensorizer encryption (docs/formats.md "tensorizer", **Encryption**): libsodium XSalsa20-Poly1305
// (crypto_secretbox, detached MACs) over chunks, nonces incremented per chunk, keys raw or
// derived from a password with crypto_pwhash (Argon2id).

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "formats/tensorizer/tensorizer_format.h"

namespace ckpt::internal::tzr {

// Initialises libsodium once. Throws Error{kIo} if it cannot start.
void ensure_sodium();

// A key given as 32 raw bytes or 64 hex digits (surrounding whitespace ignored); nullopt else.
// The key file a writer produces holds util/text.h to_hex(key) and a newline.
std::optional<Key> parse_key(std::string_view text);

// Derives a key from a password with the parameters stored in a file. Refuses (before doing any
// work) limits far beyond libsodium's SENSITIVE profile so a file cannot ask for unbounded time
// or memory: Error{kLimitExceeded}; unknown algorithm or salt size: Error{kUnsupported}.
Key derive_key(std::string_view password, const KdfParams& params);

// The nonce of chunk `index`: `initial` incremented `index` times (little-endian, as
// sodium_increment).
Nonce nonce_at(const Nonce& initial, uint64_t index);

// Number of chunks a tensor of `nbytes` has under `cipher` (what the MAC count must be).
uint64_t chunk_count(const CipherParams& cipher, uint64_t nbytes);

// Decrypts `data` in place, chunks in parallel for big tensors. Returns false when any chunk
// fails authentication (wrong key or tampered data); `data` is then unspecified.
bool decrypt_in_place(const Key& key, const CipherParams& cipher, std::span<std::byte> data);

// Encrypts one chunk from src to dst (may be the same memory) and returns its MAC.
Mac encrypt_chunk(const Key& key, const Nonce& nonce, const std::byte* src, std::byte* dst,
                  size_t n);

// Incremental SHA-256 (OpenSSL EVP).
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;
  void update(std::span<const std::byte> bytes);
  void update(std::string_view bytes);
  Sha256 finish();

 private:
  void* ctx_;
};

// Random bytes from libsodium.
void random_bytes(std::span<unsigned char> out);

}  // namespace ckpt::internal::tzr
