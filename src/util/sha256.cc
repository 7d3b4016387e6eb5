// What every SHA-256 backend (util/sha256_{openssl,sodium,missing}.cc) shares.

#include "util/sha256.h"

#include "util/text.h"

namespace ckpt::internal {

std::string sha256_hex(std::string_view bytes) {
  Sha256Stream s;  // refuses (Error{kUnsupported}) in a build without a backend
  s.update(bytes);
  return to_hex(s.finish());
}

}  // namespace ckpt::internal
