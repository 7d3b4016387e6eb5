#pragma once
// The key file a new random tensorizer key goes to (resolve_key in
// src/formats/tensorizer/tensorizer_key.h reads keys and passwords).

#include <string>

namespace ckpt::internal {

// Writes `raw_key` as 64 hex digits and a newline to `path` and commits it (atomic/fsync per
// the options).
void write_key_file(const std::string& path, const std::string& raw_key, bool atomic, bool fsync);

}  // namespace ckpt::internal
