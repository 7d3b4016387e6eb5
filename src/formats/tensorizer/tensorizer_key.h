#pragma once
// Where a tensorizer key comes from (TensorizerSaveOptions): the key sources checked against the
// encryption mode and the key and password files read, before anything is written.

#include <string>

#include "ckpt/tensorizer.h"

namespace ckpt::internal {

struct ResolvedKey {
  // encryption is kNone, kRandomKey, kKey (key filled) or kPassword (password filled);
  // key_file and password_file are cleared.
  TensorizerSaveOptions options;
  // kRandomKey: the file the new key goes to ("" when none was named).
  std::string new_key_file;
};

// Throws Error{kInvalidArgument} for several key sources or one that does not go with the mode,
// Error{kNotFound} for a key or password file that cannot be read.
ResolvedKey resolve_key(const TensorizerSaveOptions& options);

}  // namespace ckpt::internal
