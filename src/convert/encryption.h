#pragma once
// ConvertEncryption -> TensorizerSaveOptions: keys and passwords from files, and the key file a
// new random key goes to.

#include <string>

#include "ckpt/convert.h"
#include "ckpt/tensorizer.h"

namespace ckpt::internal {

struct ConvertCrypt {
  TensorizerSaveOptions save;  // encryption, key, password, pwhash limits
  // save.encryption == kRandomKey: the file the new key goes to (see write_key_file).
  std::string new_key_file;
};

// Checks that at most one way to give the key is set and reads the files. Throws
// Error{kInvalidArgument} for several, Error{kNotFound} for a file that cannot be read.
ConvertCrypt resolve_encryption(const ConvertEncryption& e);

// Writes `raw_key` as 64 hex digits and a newline to `path` and commits it (atomic/fsync per
// the options).
void write_key_file(const std::string& path, const std::string& raw_key, bool atomic, bool fsync);

}  // namespace ckpt::internal
