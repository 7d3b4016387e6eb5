#pragma once
// Digests of tensors already in memory, several at once (convert's
// SafetensorsSaveOptions::store_digests).

#include <vector>

#include "ckpt/digest.h"

namespace ckpt::internal {

// tensor_sha256 of each tensor that `want` selects (want[i]; all when empty), on up to `threads`
// threads (0 = default_threads()); unselected ones are left unset. Rethrows the first error.
std::vector<std::optional<Sha256>> tensor_sha256_all(const std::vector<Tensor>& tensors,
                                                     const std::vector<bool>& want, int threads);

}  // namespace ckpt::internal
