#pragma once
// What this build of ckpt can do: optional features are compiled in only when their library was
// found at configure time (docs/library.md "Dependencies"). A feature that is not built in throws
// Error{kUnsupported} naming the library and the packages that provide it.

namespace ckpt {

// The features built in, space-separated, e.g. "http s3 tensorizer-encryption sha256=openssl
// inflate=isa-l crc32=isa-l deflate=libdeflate yaml". A feature that is off is listed as "-http".
const char* build_features();

}  // namespace ckpt
