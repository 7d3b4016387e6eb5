#pragma once
// Checkpoint: an opened checkpoint of any supported format: a single file, a set of files
// opened as one (a sharded checkpoint's index, or open_set), or a torch.distributed.checkpoint
// (DCP) folder, whose tensors are assembled from every rank's chunks. Opening reads metadata
// only; tensor bytes are read when asked for. Every method below holds for every kind: a set or
// a folder is listed, loaded, streamed, viewed and verified as a file is, each tensor's bytes
// read from the file or files that hold them.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/format.h"
#include "ckpt/options.h"
#include "ckpt/sink.h"
#include "ckpt/source.h"
#include "ckpt/tensor.h"
#include "ckpt/torch.h"
#include "ckpt/value.h"

namespace ckpt {

namespace internal {
struct CheckpointAccess;
}
struct LoadedCheckpoint;

// A tensor selection: true keeps the tensor.
using TensorFilter = std::function<bool(const TensorInfo&)>;

// An opened checkpoint. A Checkpoint is a handle: copies share the opened files and the loaded
// storages. The files stay open while any copy lives, and a mapping while any view into it (a
// Tensor or Storage from storage()/tensor()) lives; loaded bytes own their memory. Every method
// is const and thread-safe: any number of threads may load from one Checkpoint at once. The
// metadata (tensors(), storages(), root(), ...) never changes after open; references to it stay
// valid while the Checkpoint (or a copy) lives.
class Checkpoint {
 public:
  // Opens `path`, a local path or an http://, https:// or s3:// URL (OpenOptions::remote):
  //  - a file, its format detected from its bytes (torch zip, legacy torch.save, TorchScript,
  //    safetensors, tensorizer, ONNX);
  //  - a shard index (JSON), opened as its set of shards (open_set below);
  //  - a DCP folder (a folder holding `.metadata`, or a URL prefix ending in '/'): format()
  //    kTorchDcp, one tensor per saved name with its chunks checked to tile it, the tree that
  //    torch's dcp_to_torch_save would write; files() are its data files.
  // open(source) opens one file or object (a format or a shard index), never a folder. Throws
  // Error (kNotFound, kIo, kAuth, kCorrupt, kTruncated, kUnsupported, kLimitExceeded) naming
  // the file, and for a folder the data file and tensor.
  static Checkpoint open(const std::string& path, const OpenOptions& options = {});
  static Checkpoint open(SourcePtr source, const OpenOptions& options = {});
  // A sharded checkpoint is opened as one: open(path) of an index file (a JSON file whose
  // "weight_map" maps each tensor name to its shard file, as `model.safetensors.index.json` and
  // `pytorch_model.bin.index.json`; shard names are relative to the index's folder), or
  // open_set() of the shard files themselves. The result is one Checkpoint: tensors() and
  // storages() are the shards' in shard order (an index's files in name order; open_set's in
  // the order given), root() an OrderedDict of every name to its tensor, format() the first
  // shard's, and every load reads each tensor from its shard (a StorageInfo's offset is in its
  // shard: shard_of() says which). A name in two shards is refused (Error{kCorrupt} naming both
  // files), and so is an index entry whose shard lacks the name (naming the shard); a shard that
  // cannot be opened throws its own error, which names the file. Each shard must be a dict of
  // tensors (a state dict, a safetensors or tensorizer file). open_set of one path is open(path).
  static Checkpoint open_set(const std::vector<std::string>& paths,
                             const OpenOptions& options = {});

  // Opens a file and loads every tensor eagerly: the result of
  // open(path, open_options).load_all(load_options), with the two overlapped. For a torch zip,
  // reader threads start on the tensor bytes as soon as the central directory is read, while
  // this thread parses data.pkl, then joins them; on a file of many small tensors that hides
  // most of the open time. Other formats open, then load. Throws Error like open and load_all.
  static LoadedCheckpoint open_and_load(const std::string& path,
                                        const OpenOptions& open_options = {},
                                        const LoadOptions& load_options = {});

  Format format() const;
  // Format facts: "version", "alignment", "byteorder", "serialization_id"...
  const std::map<std::string, std::string>& properties() const;
  const std::vector<TensorInfo>& tensors() const;
  const std::vector<StorageInfo>& storages() const;
  const std::vector<RecordInfo>& records() const;
  // The object tree (read-only); tensors appear as Value::Kind::kTensor with an index into
  // tensors(). Copy it (Value::clone) to change it.
  const ConstValuePtr& root() const;
  const ByteSource& source() const;
  SourcePtr source_ptr() const;
  // Index of the tensor with this name.
  std::optional<size_t> find(std::string_view name) const;
  // The files the checkpoint reads tensor bytes from, by name, in order: one for a single file
  // (source().name()), a set's shard files in shard order, a DCP folder's data files. A
  // StorageInfo's offset is in the file files_of() names (for a DCP folder, whose storages are
  // assembled from chunks, in no one file). source() of a set is its index (or, for open_set, a
  // description of the files), which is not among them.
  const std::vector<std::string>& files() const;
  // Indices into files() of the files that hold tensor `tensor`'s bytes, in the order the bytes
  // are in them: never empty; exactly one for a single file (0) and for a set (its shard); for a
  // DCP folder, the data files of the tensor's chunks. The span stays valid while the
  // Checkpoint (or a copy) lives. Throws Error{kNotFound} for a bad index.
  std::span<const uint32_t> files_of(size_t tensor) const;
  // The files as checkpoints of their own, in files() order, where each file is one (a set's
  // shards: a shard's source() is its file); empty where the checkpoint is not made of others
  // (a single file, a DCP folder). shard_of(tensor) is files_of(tensor)[0]: the index of the
  // file (for a set, the shard) that holds the tensor (for a DCP folder, its first chunk's), 0
  // for a single file. Throws Error{kNotFound} for a bad index.
  const std::vector<Checkpoint>& shards() const;
  size_t shard_of(size_t tensor) const;

  // The storage's bytes: a view into the mapping when the source is mapped and the bytes are
  // stored raw in native order (Storage::writable only where the source's memory_writable():
  // OpenOptions::writable_views, or open_mmap_source(path, true)), else read into owned,
  // writable memory (also with options.copy). Storages stay shared: asking twice while the first
  // result lives returns the same object. Throws Error.
  StoragePtr storage(size_t index, const LoadOptions& options = {}) const;
  // Where storage() would return a view, the view's bytes (info.nbytes of them), found without
  // making a Storage: for callers that wrap the bytes themselves (the Python module's
  // mmap=True). nullptr where storage() would read or decode (not mapped, compressed,
  // encrypted, byte-swapped, meta). For a set, the view into the mapping of the shard that
  // holds the storage. The bytes stay valid while the Checkpoint (or a copy) lives, and while
  // view_owner(index) does: the mapping of the file that holds them (for a single file,
  // source().memory_owner(); null where view() is null). Neither throws for a valid index
  // (Error{kInvalidArgument} otherwise); view() checks no CRC.
  const std::byte* view(size_t index) const;
  std::shared_ptr<const void> view_owner(size_t index) const;
  // A tensor with its storage loaded (see storage()). Throws Error{kNotFound} for a bad name.
  Tensor tensor(size_t index, const LoadOptions& options = {}) const;
  Tensor tensor(std::string_view name, const LoadOptions& options = {}) const;
  // Loads every tensor (or those `filter` accepts) eagerly into owned memory with a coalesced
  // read plan and several threads (a set: file after file). Order follows tensors().
  // LoadOptions::on_placed and progress hold for every kind (see options.h).
  std::vector<Tensor> load_all(const LoadOptions& options = {},
                               const TensorFilter& filter = {}) const;
  // Copies tensor `index`'s elements (row-major, contiguous) into `dst`, which must hold exactly
  // nbytes() bytes: for raw storages one positional read straight into dst. Throws Error
  // (kInvalidArgument for a wrong size, kCorrupt with options.verify on a CRC mismatch).
  void read_into(size_t index, std::span<std::byte> dst, const LoadOptions& options = {}) const;
  // Copies the box [begin[d], end[d]) of tensor `index` (one pair per dimension; row-major,
  // contiguous) into `dst`, which must hold exactly its bytes. Reads only what the box needs
  // where the checkpoint's layout allows: for a torch.distributed.checkpoint folder the chunks
  // that meet the box (a tensor-parallel rank's slice); elsewhere the tensor's storage. Throws
  // Error{kInvalidArgument} for a box that is not inside the tensor or a wrong dst size, and
  // what loading throws. Thread-safe.
  void read_slice(size_t index, std::span<const int64_t> begin, std::span<const int64_t> end,
                  std::span<std::byte> dst, const LoadOptions& options = {}) const;

  // Streams the tensors (or those `filter` accepts) to `fn` in file order (a set: file after
  // file), storage by storage, with at most `budget_bytes` of storage bytes in memory at once: a
  // reader thread fills a ring buffer of that size while `fn` runs. The tensor passed to `fn`
  // (and its storage) is valid only during the call: copy what you keep. Tensors sharing a
  // storage are handed one after another while it is loaded. Throws Error{kInvalidArgument}
  // when one storage is larger than the budget, and whatever `fn` or a read throws. Peak
  // memory: budget + a small constant. `progress` counts against the whole selection's bytes.
  void stream(uint64_t budget_bytes, const std::function<void(const Tensor&)>& fn,
              const LoadOptions& options = {}, const TensorFilter& filter = {}) const;

  // Asks the kernel to read ahead the bytes of these tensors (all when empty), for zero-copy use
  // of a mapped file: madvise(MADV_WILLNEED) over their storages. With `populate`, also faults
  // the pages in now (MADV_POPULATE_READ where the kernel has it). No-op for unmapped sources.
  void prefetch(std::span<const size_t> tensors = {}, bool populate = false) const;

  // Checks every record that has a CRC32 (a set: each shard's, in order; a DCP folder stores
  // none). Throws Error{kCorrupt} naming the first bad record and its file. Returns the number
  // of records checked: 0 where the checkpoint stores no checksums.
  // `progress` (may be empty) counts the bytes checked (a set: every shard's, against their sum).
  size_t verify(const ProgressFn& progress = {}) const;

 private:
  friend struct internal::CheckpointAccess;
  struct Impl;
  explicit Checkpoint(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

// The result of open_and_load: the handle and its tensors (each keeps the bytes it views alive).
struct LoadedCheckpoint {
  Checkpoint checkpoint;
  std::vector<Tensor> tensors;  // in checkpoint.tensors() order
};

}  // namespace ckpt
