#pragma once
// Files named by a file (an ONNX model's external data, a shard index's shards, a distributed
// checkpoint's folder) must stay inside the naming file's folder. Lexical checks (no absolute
// path, no "..") are the caller's; this checks what remains: symbolic links, of the file itself
// or of any folder on its way, that lead out.

#include <string>

namespace ckpt::internal {

// Throws Error{kCorrupt} when `path`, with every symbolic link resolved, is not inside `dir`
// (resolved the same way): "<what> <path> resolves outside <where> (<resolved path>)", naming
// `file` and `record`. A path that cannot be resolved passes: opening it reports why.
// Thread-safe (reads the file system only).
void check_inside(const std::string& path, const std::string& dir, const std::string& what,
                  const std::string& where, const std::string& file, const std::string& record);

}  // namespace ckpt::internal
