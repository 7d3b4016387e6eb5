#pragma once
// SHA-256 digests of tensors and files, for checkpoints whose format stores no checksum
// (safetensors, legacy torch) or whose checksums a copy or conversion does not carry (what
// `ckpt digest` and `ckpt verify --digests` do; docs/cli.md).
//
//   ckpt::Checkpoint c = ckpt::Checkpoint::open("model.pt");
//   ckpt::DigestManifest m;
//   m.file = ckpt::file_digest(c.source());
//   m.tensors = ckpt::tensor_digests(c);
//   std::string json = ckpt::manifest_to_json(m);
//   ...
//   auto bad = ckpt::compare_digests(ckpt::manifest_from_json(json).tensors,
//                                    ckpt::tensor_digests(ckpt::Checkpoint::open("model.safetensors")));
//
// A tensor's digest is the SHA-256 of its LOGICAL bytes: its elements in row-major order,
// contiguous, in its own dtype, little-endian (what numpy's `tensor.contiguous().numpy().tobytes()`
// gives). It does not depend on the file format, strides, storage offsets, storages shared with
// other tensors, compression or encryption, so a manifest made from a .pt verifies the
// .safetensors converted from it. Tensors are named as flatten_state_dict() names them (the
// names a flat format stores); a tied tensor is listed under each of its names.
// Meta tensors have no bytes: they are recorded as such, with no digest. Quantized tensors: the
// digest covers the stored integer values (int_repr); the entry adds the quantization parameters
// (per-channel scales and zero points by their own digests). Sub-byte dtypes (float4 pairs,
// quint4x2): the packed bytes.
//
// Thread-safety: every function may be called from several threads at once.

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dtype.h"
#include "ckpt/options.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"

namespace ckpt {

using Sha256 = std::array<uint8_t, 32>;

// 64 lower-case hex digits.
std::string to_hex(const Sha256& digest);
// From 64 hex digits (either case); nullopt for anything else.
std::optional<Sha256> sha256_from_hex(std::string_view hex) noexcept;

// SHA-256 of bytes in memory.
Sha256 sha256(std::span<const std::byte> bytes);
// SHA-256 of a tensor's logical bytes (see above), walking its strides (a non-contiguous tensor
// is hashed without a full copy). Throws Error{kInvalidArgument} when the tensor has elements
// but no bytes loaded, Error{kUnsupported} for a non-contiguous sub-byte tensor.
Sha256 tensor_sha256(const Tensor& tensor);

// A file's size and SHA-256 (what `sha256sum` prints and model hubs publish).
struct FileDigest {
  std::string name;  // the file name without its folder
  uint64_t size = 0;
  Sha256 sha256{};
};
// Hashes the whole source (its name's last path component becomes `name`), reading 4 MiB at a
// time (a mapped source through its pread twin, so the file's pages do not stay resident).
FileDigest file_digest(const ByteSource& source);
// Same for a path. Throws Error{kNotFound, kIo}.
FileDigest file_digest(const std::string& path);

struct QuantizationDigest {
  std::string scheme;  // Quantization::scheme
  double scale = 0;
  int64_t zero_point = 0;
  int64_t axis = 0;
  // Per-channel schemes: digests of the scales and zero points tensors.
  std::optional<Sha256> scales_sha256, zero_points_sha256;
  bool operator==(const QuantizationDigest&) const = default;
};

struct TensorDigest {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  bool meta = false;  // no bytes in the file: `sha256` is unset
  std::optional<Sha256> sha256;
  std::optional<QuantizationDigest> quantization;
};

struct DigestOptions {
  // How storages are read (LoadOptions::verify also checks CRC32s as the bytes are read).
  LoadOptions load;
  // Storages hashed at once; 0 = the machine's cores (at most 8). Memory: a storage that is not
  // a view of a mapped file (decoded, byte-swapped, or an unmapped source) is held in memory
  // while its tensors are hashed, so peak memory is about `threads` of the largest such storage.
  int threads = 0;
};

// The digest of every tensor of flatten_state_dict(checkpoint), in its order. Each storage is
// read once (views of a mapped file cost no copy). Throws what loading throws.
std::vector<TensorDigest> tensor_digests(const Checkpoint& checkpoint,
                                         const DigestOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Manifests: what `ckpt digest` writes, as JSON
//
//   {"ckpt_digest": 1, "algorithm": "sha256",
//    "file": {"name": "model.pt", "size": 123, "sha256": "<hex>"},
//    "tensors": {"<name>": {"dtype": "float32", "shape": [2, 3], "sha256": "<hex>"},
//                "<meta tensor>": {"dtype": ..., "shape": ..., "meta": true},
//                "<quantized>": {..., "quantization": {"scheme", "scale", "zero_point", "axis",
//                                                      "scales_sha256", "zero_points_sha256"}}}}
//
// dtypes are torch's names (dtype_name). "file" is optional; unknown keys are ignored.

struct DigestManifest {
  std::optional<FileDigest> file;
  std::vector<TensorDigest> tensors;
};

// Indented JSON (tensors in the order given), ending in a newline.
std::string manifest_to_json(const DigestManifest& manifest);
// Parses a manifest. Throws Error{kInvalidArgument} naming `source_name` (and the tensor) for
// anything that is not a version-1 manifest.
DigestManifest manifest_from_json(std::string_view json,
                                  const std::string& source_name = "<manifest>");
// Reads and parses a manifest file (at most limits.max_metadata_bytes). Throws Error{kNotFound,
// kIo, kLimitExceeded, kInvalidArgument}.
DigestManifest read_manifest(const std::string& path, const Limits& limits = {});

// One tensor that does not match: its name and what is wrong, e.g. "not in the file",
// "not in the manifest", "dtype float16, expected float32", "shape [2, 3], expected [3, 2]",
// "SHA-256 <hex>, expected <hex>".
struct DigestMismatch {
  std::string tensor;
  std::string problem;
};
// Compares `actual` (computed from a file) with `expected` (a manifest) by name: every name on
// one side only, and every difference in dtype, shape, meta, quantization or digest. Empty when
// they match. Mismatches come in `expected` order, then the names only `actual` has.
std::vector<DigestMismatch> compare_digests(const std::vector<TensorDigest>& expected,
                                            const std::vector<TensorDigest>& actual);

// ---------------------------------------------------------------------------------------------
// Digests stored in a safetensors file (SafetensorsSaveOptions::store_digests)
//
// The __metadata__ key kSafetensorsDigestKey holds a JSON object as its string value:
// {"<tensor name>": "<64 hex digits>", ...}, one entry per tensor, sorted by name.

inline constexpr const char* kSafetensorsDigestKey = "ckpt.sha256";

// The value to store under kSafetensorsDigestKey for these digests (meta tensors, which
// safetensors cannot hold, are left out).
std::string safetensors_digest_metadata(const std::vector<TensorDigest>& digests);
// The digests a safetensors checkpoint stores under kSafetensorsDigestKey, as TensorDigests with
// the dtype and shape of the file's own tensors (names the file lacks get the dtype and shape of
// nothing: compare_digests reports them). nullopt when the file stores none (or is not
// safetensors). Throws Error{kCorrupt} when the key's value is not such an object. For a sharded
// set: the union of its shards' digests when every shard stores them, else nullopt.
std::optional<std::vector<TensorDigest>> stored_digests(const Checkpoint& checkpoint);

}  // namespace ckpt
