#pragma once
// Writing tensorizer `.tensors` files (data versions 1-4; reading goes through Checkpoint::open
// with OpenOptions::decrypt_key / decrypt_password for encrypted files). Thread-safety: saves of
// different outputs may run at once; the tensors' bytes are read while writing.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ckpt/sink.h"
#include "ckpt/tensor.h"

namespace ckpt {

// tensorizer's TensorType: how load_into_module treats the tensor.
enum class TensorizerTensorType : uint8_t { kParam = 0, kBuffer = 1, kStateDict = 2 };

struct TensorizerEntry {
  Tensor tensor;  // its name is the stored name unless `path` is set
  TensorizerTensorType type = TensorizerTensorType::kStateDict;
  uint16_t module_index = 0;  // write_module: index of the owning module in named_modules()
  // Store shape and dtype only (a meta-device tensor; needs data version 4); loads as zeros.
  // A tensor whose storage is marked meta is written this way too.
  bool meta = false;
  // A nested state-dict path (dict keys and list indices). Empty: the tensor's name. More than
  // one component (or an index) is stored as a structured name, 0x1E + JSON array.
  std::vector<std::variant<std::string, int64_t>> path;
};

enum class TensorizerEncryption {
  kNone,       // none, unless a key source below is set: then the mode it gives (kKey for key,
               // kKeyFile for key_file, kPassword for password or password_file)
  kRandomKey,  // a fresh random 32-byte key; written as hex to `key_file` (and returned)
  kKey,        // `key`: 32 raw bytes or 64 hex digits
  kPassword,   // a key derived from `password` (or the first line of `password_file`) with
               // Argon2id; salt and limits go in the file
  kKeyFile,    // the key in `key_file` (64 hex digits or 32 raw bytes, trailing whitespace
               // ignored); when the file does not exist, kRandomKey into it
};

// The options of writing tensorizer: save_tensorizer takes them, and convert() as its target
// (ConvertTarget, include/ckpt/convert.h). At most one of key, key_file, password and
// password_file is set (Error{kInvalidArgument}), and it agrees with `encryption`. A key file
// is written before the output, so that an output never exists without its key (convert():
// owner-only, never over an existing file, committed as ConvertOptions says).
struct TensorizerSaveOptions {
  TensorizerEncryption encryption = TensorizerEncryption::kNone;
  std::string key_file;       // kRandomKey (required for the path overload), kKeyFile
  std::string key;            // kKey
  std::string password;       // kPassword
  std::string password_file;  // kPassword: the password is the file's first line (without \r\n)
  // Argon2id cost (libsodium crypto_pwhash). Defaults: libsodium's MODERATE profile, as
  // tensorizer's EncryptionParams.from_string (about 0.5 s, 256 MiB).
  uint64_t pwhash_opslimit = 3;
  uint64_t pwhash_memlimit = 256ull << 20;
  uint64_t crypt_chunk_size = 2ull << 20;  // multiple of 64, at least 1024
  bool atomic = true;                      // path overload: temporary file + rename
  bool fsync = true;
};

// Writes the tensors in the given order with the lowest data version the content needs:
// 1 for numpy-native dtypes, 2 when a dtype numpy lacks is stored opaque (bfloat16, complex32,
// float8...), 3 when encrypting, 4 when a meta tensor is present (with the encrypted feature flag
// when encrypting). Every tensor gets CRC32 and SHA-256 as tensorizer computes them (encrypted
// tensors: SHA-256 of the plaintext only). The index block is tensorizer's 256 KiB, larger only
// when the entries need it. Tensor bytes are written from the tensors' memory (encryption goes
// through a chunk-sized buffer; the caller's memory is never modified).
// Returns the raw 32-byte key when encrypting, else an empty string.
// Throws Error: kInvalidArgument (empty or duplicate names, name over 65535 bytes, more than 255
// dimensions, a dimension over 2^32-1, bad options or key), kUnsupported (quantized or sub-byte
// dtypes), kIo.
std::string save_tensorizer(const std::string& path, const std::vector<TensorizerEntry>& tensors,
                            const TensorizerSaveOptions& options = {});
std::string save_tensorizer(const std::string& path, const std::vector<Tensor>& tensors,
                            const TensorizerSaveOptions& options = {});
// Same into a sink (not committed; `key_file` is not written).
std::string save_tensorizer(ByteSink& sink, const std::vector<TensorizerEntry>& tensors,
                            const TensorizerSaveOptions& options = {});

}  // namespace ckpt
