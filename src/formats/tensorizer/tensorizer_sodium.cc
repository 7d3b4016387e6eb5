// tensorizer's cipher through libsodium (see tensorizer_crypt.h): XSalsa20-Poly1305 chunks,
// Argon2 key derivation, random keys and nonces. Compiled when libsodium is found; else
// tensorizer_sodium_missing.cc.

#include <sodium.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "ckpt/error.h"
#include "formats/tensorizer/tensorizer_crypt.h"

namespace ckpt::internal::tzr {

static_assert(kPwhashArgon2id13 == crypto_pwhash_ALG_ARGON2ID13);
static_assert(kPwhashArgon2i13 == crypto_pwhash_ALG_ARGON2I13);
static_assert(kPwhashSaltBytes == crypto_pwhash_SALTBYTES);

namespace {

// Far above libsodium's SENSITIVE profile (opslimit 4, 1 GiB), far below what would hurt.
constexpr uint64_t kMaxOpslimit = 64;
constexpr uint64_t kMaxMemlimit = 8ull << 30;
// Below this a tensor is decrypted on the calling thread.
constexpr uint64_t kParallelBytes = 8ull << 20;

}  // namespace

void ensure_sodium() {
  static const int rc = sodium_init();
  if (rc < 0) throw Error(ErrorCode::kIo, "libsodium failed to initialise");
}

Key derive_key(std::string_view password, const KdfParams& p) {
  ensure_sodium();
  if (p.alg != kPwhashArgon2id13 && p.alg != kPwhashArgon2i13)
    throw Error(ErrorCode::kUnsupported,
                "unknown password hashing algorithm " + std::to_string(p.alg));
  if (p.salt.size() != crypto_pwhash_SALTBYTES)
    throw Error(ErrorCode::kUnsupported, "password salt of " + std::to_string(p.salt.size()) +
                                             " bytes (libsodium uses " +
                                             std::to_string(crypto_pwhash_SALTBYTES) + ")");
  if (p.opslimit > kMaxOpslimit || p.memlimit > kMaxMemlimit)
    throw Error(ErrorCode::kLimitExceeded,
                "password hashing asks for opslimit " + std::to_string(p.opslimit) +
                    " and memlimit " + std::to_string(p.memlimit) + " (at most " +
                    std::to_string(kMaxOpslimit) + " and " + std::to_string(kMaxMemlimit) + ")");
  Key key;
  if (crypto_pwhash(key.data(), key.size(), password.data(), password.size(),
                    reinterpret_cast<const unsigned char*>(p.salt.data()), p.opslimit,
                    static_cast<size_t>(p.memlimit), p.alg) != 0)
    throw Error(ErrorCode::kLimitExceeded,
                "password hashing failed (limits out of range or out of memory)");
  return key;
}

bool decrypt_in_place(const Key& key, const CipherParams& cipher, std::span<std::byte> data) {
  ensure_sodium();
  const uint64_t n = chunk_count(cipher, data.size());
  if (n != cipher.macs.size()) return false;
  const uint64_t step = cipher.chunk_size ? cipher.chunk_size : data.size();
  auto one = [&](uint64_t i) {
    Nonce nonce = nonce_at(cipher.nonce, i);
    auto* p = reinterpret_cast<unsigned char*>(data.data()) + i * step;
    uint64_t len = std::min<uint64_t>(step, data.size() - i * step);
    return crypto_secretbox_open_detached(p, p, cipher.macs[i].data(), len, nonce.data(),
                                          key.data()) == 0;
  };
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  unsigned threads = static_cast<unsigned>(std::min<uint64_t>({hw, n, 16}));
  if (data.size() < kParallelBytes || threads <= 1) {
    for (uint64_t i = 0; i < n; ++i)
      if (!one(i)) return false;
    return true;
  }
  std::atomic<uint64_t> next{0};
  std::atomic<bool> ok{true};
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (uint64_t i; ok.load(std::memory_order_relaxed) && (i = next++) < n;)
        if (!one(i)) ok = false;
    });
  for (auto& th : pool) th.join();
  return ok;
}

Mac encrypt_chunk(const Key& key, const Nonce& nonce, const std::byte* src, std::byte* dst,
                  size_t n) {
  ensure_sodium();
  Mac mac;
  crypto_secretbox_detached(reinterpret_cast<unsigned char*>(dst), mac.data(),
                            reinterpret_cast<const unsigned char*>(src), n, nonce.data(),
                            key.data());
  return mac;
}

void random_bytes(std::span<unsigned char> out) {
  ensure_sodium();
  randombytes_buf(out.data(), out.size());
}

void wipe(void* p, size_t n) { sodium_memzero(p, n); }

}  // namespace ckpt::internal::tzr
