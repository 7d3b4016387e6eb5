#pragma once
// What a format reader produces when it opens a file, and what Checkpoint serves from.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "util/name_index.h"

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
  // When set, fills `records` on first use (Checkpoint::records()): a zip's record table is one
  // name string per record that opening and listing never need. Must not do I/O.
  std::function<void(std::vector<RecordInfo>&)> make_records;
  mutable std::once_flag records_once;
  ValuePtr root;
  // Null: every storage is raw at StorageInfo::offset (or meta). Else used for every storage
  // whose offset is kNoOffset, or for all of them when `decode_all`.
  std::shared_ptr<const StorageDecoder> decoder;
  bool decode_all = false;
  // Format-specific verification (tensorizer hashes); null = CRC32 of records / storages.
  std::function<size_t()> verify;
  // TorchScript archives: code, constants, debug info (null for other formats).
  std::shared_ptr<const TorchScriptModel> torchscript;

  // Filled by finalize(): tensor name -> index of the first tensor with that name.
  NameIndex by_name;
  std::optional<size_t> find(std::string_view name) const {
    return by_name.find(name, [this](size_t i) -> const std::string& { return tensors[i].name; });
  }
  mutable std::mutex mu;
  // Loaded storages, so that views of one storage share it; sized on first use (under mu).
  mutable std::vector<std::weak_ptr<Storage>> cache;

  // The source to copy bytes from: a pread source over the same file when `source` is a mapping
  // of a file (copying out of the mapping would make the file's pages resident beside the copy,
  // doubling the memory an eager or streaming load holds), else `source`.
  SourcePtr copy_source() const;
  mutable std::once_flag copy_once;
  mutable SourcePtr copy_source_;

  // Builds by_name; checks every tensor's view fits its storage (Error{kCorrupt} naming the tensor
  // otherwise) and every raw storage fits in the source.
  void finalize();
};

// Reads storage `s` into dst (exactly nbytes): meta as zeros, raw bytes from the copy source in
// 1 MiB pieces (CRC32 of each while it is hot, with `verify`), else through the decoder; then
// swaps the byte order if the storage needs it. Throws Error.
void load_storage_into(const CheckpointData& d, size_t s, std::byte* dst, bool verify);

// Error{kCorrupt} for storage `s` whose bytes have CRC32 `computed`, naming its record and tensors.
Error crc_mismatch(const CheckpointData& d, size_t s, uint32_t computed);

class ZipReader;
// Called by the torch zip opener once the central directory is parsed, before data.pkl is read:
// Checkpoint::open_and_load starts reading the data records there.
using ZipDirectoryHook = std::function<void(const ZipReader&)>;

// Detects the format, opens and validates (finalize): Checkpoint::open's work. `zip_hook`, if
// given, is passed to the torch zip opener.
std::shared_ptr<CheckpointData> open_checkpoint(SourcePtr source, const OpenOptions& options,
                                                const ZipDirectoryHook* zip_hook = nullptr);

// Format openers (src/formats/*). Each reads metadata only.
std::shared_ptr<CheckpointData> open_torch_zip(SourcePtr source, const OpenOptions& options,
                                               const ZipDirectoryHook* hook = nullptr);
std::shared_ptr<CheckpointData> open_torch_legacy(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointData> open_safetensors(SourcePtr source, const OpenOptions& options);
std::shared_ptr<CheckpointData> open_tensorizer(SourcePtr source, const OpenOptions& options);

}  // namespace ckpt::internal
