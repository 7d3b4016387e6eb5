// SHA-256 and SHA-1 through OpenSSL EVP (util/sha256.h).

#include <openssl/evp.h>

#include "ckpt/error.h"
#include "util/sha256.h"

namespace ckpt::internal {
namespace {

struct Ctx {
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx;
  explicit Ctx(const EVP_MD* md) : ctx(EVP_MD_CTX_new()) {
    if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1)
      throw Error(ErrorCode::kIo, "OpenSSL could not start a digest");
  }
  void update(const void* p, size_t n) {
    if (n && EVP_DigestUpdate(ctx.get(), p, n) != 1)
      throw Error(ErrorCode::kIo, "OpenSSL digest update failed");
  }
  template <size_t N>
  std::array<unsigned char, N> finish() {
    std::array<unsigned char, N> out{};
    unsigned len = 0;
    if (EVP_DigestFinal_ex(ctx.get(), out.data(), &len) != 1 || len != N)
      throw Error(ErrorCode::kIo, "OpenSSL digest final failed");
    return out;
  }
};

}  // namespace

struct Sha256Stream::Impl : Ctx {
  Impl() : Ctx(EVP_sha256()) {}
};
Sha256Stream::Sha256Stream() : impl_(std::make_unique<Impl>()) {}
Sha256Stream::~Sha256Stream() = default;
void Sha256Stream::update(const void* data, size_t n) { impl_->update(data, n); }
Sha256Digest Sha256Stream::finish() { return impl_->finish<32>(); }

struct Sha1Stream::Impl : Ctx {
  Impl() : Ctx(EVP_sha1()) {}
};
Sha1Stream::Sha1Stream() : impl_(std::make_unique<Impl>()) {}
Sha1Stream::~Sha1Stream() = default;
void Sha1Stream::update(const void* data, size_t n) { impl_->update(data, n); }
std::array<unsigned char, 20> Sha1Stream::finish() { return impl_->finish<20>(); }

bool sha256_available() { return true; }

}  // namespace ckpt::internal
