#pragma once
// CheckpointModel: the neutral, format-agnostic description of an opened checkpoint that every
// format reader (src/formats/*) fills and every load path (src/load) reads — tensors, storages,
// records, the object tree, and how a storage's bytes are obtained when they are not stored raw.
//
// Layer: model sits above util/io and below formats. It knows no format and no loader: a reader
// produces a CheckpointModel, the loader consumes it (docs/design.md, "Layers").
//
// Thread-safety: once finalize() has run the model is immutable (records() builds its table once,
// under std::call_once), so any number of threads may read it.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/format.h"
#include "ckpt/options.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"
#include "ckpt/value.h"
#include "util/crc32.h"
#include "util/name_index.h"

namespace ckpt::internal {

// A run of bytes in a source.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t size = 0;
};

// Turns stored bytes into storage bytes when they are not raw at StorageInfo::offset (encrypted,
// deflated, legacy layouts). Thread-safe.
class StorageDecoder {
 public:
  virtual ~StorageDecoder() = default;
  // Fills dst (exactly storages[index].nbytes bytes). With `verify`, checks the format's hashes
  // (Error{kCorrupt} naming the tensor on mismatch; Error{kAuth} for failed decryption).
  virtual void read(size_t index, std::span<std::byte> dst, bool verify) const = 0;
  // Checks, before a load allocates storage `index` (`nbytes`), what can be checked without
  // reading it (ONNX: its external file opens and holds the range), so that a missing or short
  // source fails with an error naming the tensor rather than after a huge allocation. Throws
  // what read() would.
  virtual void check(size_t index, uint64_t nbytes) const {
    (void)index;
    (void)nbytes;
  }
  // Reads the box [begin, end) of tensor `t` (a row-major tensor that is the whole of storage
  // `index`) into dst, row-major, reading only the stored pieces that meet the box (a folder of
  // chunks: a tensor-parallel rank's slice). False when the decoder has no such way: the caller
  // decodes the whole storage and copies the box out of it.
  virtual bool read_box(size_t index, const TensorInfo& t, std::span<const int64_t> begin,
                        std::span<const int64_t> end, std::span<std::byte> dst) const {
    (void)index, (void)t, (void)begin, (void)end, (void)dst;
    return false;
  }
};

// State a format keeps beyond the neutral description (a TorchScript archive's code, constants
// and zip reader). The API layer downcasts it for format-specific public classes.
class FormatExtension {
 public:
  virtual ~FormatExtension() = default;
};

// Where a storage's bytes come from: the one answer to "is this storage raw" for every path.
enum class StorageKind : uint8_t {
  kMeta,     // no bytes in the file; loads as zeros
  kRaw,      // stored as they are at StorageInfo::offset (possibly in the other byte order)
  kDecoded,  // through the model's StorageDecoder
};

struct CheckpointModel {
  Format format = Format::kTorchZip;
  SourcePtr source;
  // The files the bytes are read from, when they are not `source` alone (a folder's data files,
  // whose storages the decoder assembles): Checkpoint::files(). Empty: source->name().
  std::vector<std::string> files;
  // With `files`: per tensor, the indices into `files` of the files that hold its bytes, in the
  // order its bytes are in them (never empty). Empty: file 0 for every tensor.
  std::vector<std::vector<uint32_t>> tensor_files;
  OpenOptions options;
  std::map<std::string, std::string> properties;
  std::vector<TensorInfo> tensors;
  std::vector<StorageInfo> storages;
  ValuePtr root;
  // When set, builds the record table on first records() call: a zip's table is one name string
  // per record that opening and listing never need. Must not do I/O. Else `records` is used.
  std::function<void(std::vector<RecordInfo>&)> make_records;
  // Null: every non-meta storage is raw at StorageInfo::offset. Else used for every storage
  // whose offset is kNoOffset, or for all of them when `decode_all`.
  std::shared_ptr<const StorageDecoder> decoder;
  bool decode_all = false;
  // With verify, read every non-meta storage through the decoder, which checks the format's
  // hashes: set when the format knows them only after open (tensorizer headers read lazily from
  // a remote source), so StorageInfo::crc32 is absent although the bytes are hashed.
  bool hashes_in_decoder = false;
  // Format-specific verification (tensorizer hashes, every zip record); null = CRC32 of the
  // storages that have one. Returns the number of items checked; throws Error{kCorrupt}.
  // Reports the bytes it checks to the ProgressFn (which may be empty).
  std::function<size_t(const ProgressFn&)> verify;
  std::shared_ptr<const FormatExtension> extension;

  StorageKind kind(size_t s) const noexcept {
    const StorageInfo& si = storages[s];
    if (si.meta) return StorageKind::kMeta;
    if (si.offset != kNoOffset && !(decoder && decode_all)) return StorageKind::kRaw;
    return StorageKind::kDecoded;
  }
  // Index of the first tensor with this name (after finalize()).
  std::optional<size_t> find(std::string_view name) const {
    return by_name_.find(name, [this](size_t i) -> const std::string& { return tensors[i].name; });
  }
  const std::vector<RecordInfo>& records() const;
  void set_records(std::vector<RecordInfo> r) { records_ = std::move(r); }

  // Builds the name index; checks the tensor count against the limits, every tensor's view fits
  // its storage (Error{kCorrupt} naming the tensor otherwise) and every raw storage fits in the
  // source (Error{kTruncated}). Run by the format detector after a reader returns.
  void finalize();
  // Builds the name index only: for a model merged from finalized models (a sharded set).
  void index_names();

 private:
  NameIndex by_name_;
  mutable std::once_flag records_once_;
  mutable std::vector<RecordInfo> records_;
};

// crc_mismatch (util/crc32.h) for storage `s` of a model, naming its record (or key) and the
// tensors that view it.
Error crc_mismatch(const CheckpointModel& m, size_t s, uint32_t computed);

// Moves the tensor indices of a (cloned) subtree by `base`, for a tree placed into a model whose
// tensor table has others before its own (a set's shards, a folder's items).
void shift_tensors(const ValuePtr& top, size_t base);

// Callbacks a format opener calls while opening, so that a loader can start early.
struct OpenHooks {
  // Called by the opener (api/opener.h) with a single file's source, before its format is read:
  // the source storage_ranges' byte ranges are in.
  std::function<void(const SourcePtr&)> file_opened;
  // Called once the container's directory is parsed and before the metadata (data.pkl) is read,
  // with the byte ranges of every non-empty storage record whose bytes are stored raw and whose
  // offset is known without a read. Not called when some storage record needs decoding (a
  // deflated record) or an extra read to locate.
  std::function<void(std::span<const ByteRange>)> storage_ranges;
};

}  // namespace ckpt::internal
