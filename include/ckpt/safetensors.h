#pragma once
// Writing safetensors files (reading goes through Checkpoint::open). Format:
// docs/formats/safetensors.md "safetensors".
// Thread-safety: saves of different outputs may run at once; the tensors' bytes are read while
// writing, so they must not change meanwhile.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/options.h"
#include "ckpt/sink.h"
#include "ckpt/tensor.h"

namespace ckpt {

// The options of writing safetensors: save_safetensors takes them, and convert() as its target
// (ConvertTarget, include/ckpt/convert.h).
struct SafetensorsSaveOptions {
  // The JSON header is padded with spaces so that the data buffer starts at a multiple of this
  // (a power of two, 1 ... 1 GiB; 0 = 8). 8 matches the reference writer; 4096 gives
  // page-aligned data. Each tensor then stays aligned to its element size because tensors are
  // ordered by descending dtype alignment.
  uint64_t alignment = 8;
  // Tensors that share bytes (views, tied weights). save_safetensors refuses tensors that share
  // one Storage unless this is set. convert(), by default, does as safetensors' save_model: of
  // names that view all of one storage (StateDictEntry::shares_with), the first in sorted order
  // is written and the others are left out, recorded in __metadata__ as {left out: kept}
  // (ConvertReport::aliases_dropped); a view of part of a storage is refused with
  // Error{kInvalidArgument}. Set: each name gets its own copy (the format has no way to express
  // sharing).
  bool copy_shared = false;
  // convert(): meta tensors (see MetaTensors). save_safetensors writes the tensors it is given
  // (one without bytes is refused).
  MetaTensors meta = MetaTensors::kRefuse;
  // convert(): store each tensor's SHA-256 (tensor_sha256, include/ckpt/digest.h) in
  // __metadata__ under kSafetensorsDigestKey, which stored_digests() reads back (`ckpt verify`
  // checks them); the tensors are hashed (several threads) before the header is written.
  // save_safetensors writes the `metadata` it is given (safetensors_digest_metadata makes it).
  bool store_digests = false;
  bool atomic = true;  // file overload: temporary file + rename
  bool fsync = true;   // file overload: fsync file and folder on commit
};

// Writes `tensors` (names must be unique and non-empty of dtype with a safetensors code) and the
// string-to-string `metadata` as "__metadata__". Tensors are ordered like the reference writer
// (descending dtype alignment, then name); non-contiguous tensors are written contiguous. Tensor
// bytes are written from the tensors' memory; only small tensors pass through a write buffer.
// The file overload is atomic: nothing appears under `path` unless the call succeeds.
// Throws Error: kInvalidArgument (duplicate/empty name, shared storage without copy_shared, bad
// alignment, missing bytes), kUnsupported (dtype without a safetensors code), kLimitExceeded
// (header over 100,000,000 bytes), kIo.
void save_safetensors(const std::string& path, const std::vector<Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const SafetensorsSaveOptions& options = {});
// Same into a sink (not committed: the caller commits).
void save_safetensors(ByteSink& sink, const std::vector<Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const SafetensorsSaveOptions& options = {});

}  // namespace ckpt
