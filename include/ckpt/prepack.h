#pragma once
// ckpt's pre-pack cache, for every format: given a checkpoint, a tensor and
// a packer (an id, a version and a function from the tensor to packed bytes), returns the packed
// bytes — mapped read-only and shared from a cache file where they were stored before, or packed
// now and stored. Every process on the machine then uses one page-cache copy.
//
// Key: the tensor's name, dtype, shape, a digest of its bytes (the CRC32 the format stores for
// its storage when it covers the tensor, else a CRC32 computed now), the packer's id and version
// and the CPU features — a changed checkpoint or packer never gets a stale blob. An entry is one
// file `<sha256(key)>.blob`: a header (magic, the key itself, checked on every hit, the payload
// size) padded to the alignment, then the payload. Entries are created under an flock on
// `<name>.lock` (one process packs, the others wait, then map its file) and written to a
// temporary renamed into place, so a kill leaves no half entry (its temporary is swept by gc).
// Thread-safe: independent calls may run at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt {

struct Packer {
  std::string id;        // "transpose-blocks", "int8-rows"
  uint32_t version = 1;  // bump when the packed layout changes
  std::function<std::vector<std::byte>(const Tensor&)> pack;
};

// Column-major blocks for a GEMM: a 2-D tensor [R, C] becomes ceil(C/64) blocks, each the 64
// columns' elements column after column (R per column), the last block zero-padded.
Packer transpose_blocks_packer();
// int8 per-row quantization of a 2-D float32 tensor [R, C]: R float32 scales (max|row| / 127, 1
// for an all-zero row), then R*C int8 values round(x / scale).
Packer int8_rows_packer();

struct PrepackCacheOptions {
  // The cache folder. Empty: $XDG_CACHE_HOME/ckpt (else ~/.cache/ckpt) when `xdg`, else
  // "<checkpoint>.ckpt-prepack" beside the checkpoint.
  std::string dir;
  bool xdg = false;
  uint64_t alignment = 4096;  // payload alignment in the file (2 MiB for huge pages)
  uint64_t max_bytes = 0;     // after storing an entry, gc down to this size (0: no bound)
};

struct PackedBlob {
  std::span<const std::byte> bytes;   // mapped read-only, shared
  std::shared_ptr<const void> owner;  // keeps the mapping
  bool hit = false;                   // served from the cache (else packed now and stored)
  std::string path;                   // the cache file
};

// The packed bytes of `tensor`. Throws Error (kNotFound for an unknown tensor, kInvalidArgument
// when the packer refuses the tensor, kIo for the cache folder).
PackedBlob prepack(const Checkpoint& c, const std::string& tensor, const Packer& packer,
                   const PrepackCacheOptions& options = {});

// The cache folder prepack() would use for this checkpoint.
std::string prepack_cache_dir(const Checkpoint& c, const PrepackCacheOptions& options = {});

struct PrepackGcReport {
  size_t entries_before = 0, entries_after = 0;
  uint64_t bytes_before = 0, bytes_after = 0;
  size_t temporaries_removed = 0;
};
// Removes least recently used entries until the folder holds at most max_bytes, and temporaries
// older than a minute (left by killed writers).
PrepackGcReport prepack_gc(const std::string& dir, uint64_t max_bytes);

}  // namespace ckpt
