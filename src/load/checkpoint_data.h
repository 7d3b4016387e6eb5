#pragma once
// What a format reader produces when it opens a file, and what Checkpoint serves from.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt::internal {

struct TorchScriptModel;  // src/formats/torch/torchscript_reader.h

// Turns stored bytes into storage bytes when they are not raw at StorageInfo::offset (encrypted,
// deflated, legacy layouts). Thread-safe.
class StorageDecoder {
 public:
  virtual ~StorageDecoder() = default;
  // Fills dst (exactly storages[index].nbytes bytes). With `verify`, checks the format's hashes
  // (Error{kCorrupt} naming the tensor on mismatch; Error{kAuth} for failed decryption).
  virtual void read(size_t index, std::span<std::byte> dst, bool verify) const = 0;
};

struct CheckpointData {
  Format format = Format::kTorchZip;
  SourcePtr source;
  OpenOptions options;
  std::map<std::string, std::string> properties;
  std::vector<TensorInfo> tensors;
  std::vector<StorageInfo> storages;
  std::vector<RecordInfo> records;
  ValuePtr root;
  // Null: every storage is raw at StorageInfo::offset (or meta). Else used for every storage
  // whose offset is kNoOffset, or for all of them when `decode_all`.
  std::shared_ptr<const StorageDecoder> decoder;
  bool decode_all = false;
  // Format-specific verification (tensorizer hashes); null = CRC32 of records / storages.
  std::function<size_t()> verify;
  // TorchScript archives: code, constants, debug info (null for other formats).
  std::shared_ptr<const TorchScriptModel> torchscript;

  // Filled by finalize().
  std::unordered_map<std::string, size_t> by_name;
  mutable std::mutex mu;
  mutable std::vector<std::weak_ptr<Storage>> cache;

  // The source to copy bytes from: a pread source over the same file when `source` is a mapping
  // of a file (copying out of the mapping would make the file's pages resident beside the copy,
  // doubling the memory an eager or streaming load holds), else `source`.
  SourcePtr copy_source() const;
  mutable std::once_flag copy_once;
  mutable SourcePtr copy_source_;

  // Builds by_name and the cache; checks every tensor's view fits its storage (Error{kCorrupt}
  // naming the tensor otherwise) and every raw storage fits in the source.
  void finalize();
};

// Format openers (src/formats/*). Each reads metadata only.
std::shared_ptr<CheckpointData> open_torch_zip(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointData> open_torch_legacy(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointData> open_safetensors(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointData> open_tensorizer(SourcePtr source, const OpenOptions& options);

}  // namespace ckpt::internal
