#pragma once
// tensorizer encryption (docs/formats/tensorizer.md "tensorizer", **Encryption**): libsodium
// XSalsa20-Poly1305 (crypto_secretbox, detached MACs) over chunks, nonces incremented per chunk,
// keys raw or derived from a password with crypto_pwhash (Argon2id).
// The libsodium parts (tensorizer_sodium.cc) are compiled only when libsodium is found; in a
// build without it (tensorizer_sodium_missing.cc) ensure_sodium(), derive_key(),
// decrypt_in_place(), encrypt_chunk() and random_bytes() throw Error{kUnsupported} naming it.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "formats/tensorizer/tensorizer_format.h"
#include "util/sha256.h"

namespace ckpt::internal::tzr {

// libsodium's crypto_pwhash algorithm numbers and salt size (checked against sodium.h where
// libsodium is built in).
inline constexpr int kPwhashArgon2i13 = 1;
inline constexpr int kPwhashArgon2id13 = 2;
inline constexpr size_t kPwhashSaltBytes = 16;

// Initialises libsodium once. Throws Error{kIo} if it cannot start, Error{kUnsupported} in a
// build without libsodium.
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

// Incremental SHA-256 (util/sha256.h): refused with Error{kUnsupported} in a build without a
// SHA-256 provider.
using Sha256Hasher = internal::Sha256Stream;

// Random bytes from libsodium.
void random_bytes(std::span<unsigned char> out);

// Zeroes `n` bytes at `p` in a way the compiler cannot drop (sodium_memzero).
void wipe(void* p, size_t n);

}  // namespace ckpt::internal::tzr
