#pragma once
// CheckpointKind: what one kind of checkpoint does behind the public Checkpoint handle. A kind
// is how the tensors' bytes are laid out over files: one model over its own files
// (api/kind_file.cc: a single file, or a folder whose storages the format's decoder assembles
// from several data files) or a set of files that are each a checkpoint of their own
// (api/kind_set.cc, Hugging Face shards). Only the opener (api/opener.h) chooses a kind;
// Checkpoint::Impl holds one body and every public method hands its work to it, so no method
// asks which kind it has.
//
// Every kind describes its tensors with one CheckpointModel (for a set: the files' models
// merged), which serves the metadata (tensors(), storages(), root(), records(), find()). The
// model's StorageInfo::offset is in one of the kind's files (files_of says which); a storage
// assembled from pieces of several files (a torch.distributed.checkpoint folder) has no offset,
// and files_of names every file it reads.
//
// Thread-safety: a body is immutable after the opener made it; every method is const and may
// be called from any number of threads at once.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "load/plan.h"
#include "model/checkpoint_model.h"

namespace ckpt::internal {

class CheckpointKind {
 public:
  explicit CheckpointKind(std::shared_ptr<const CheckpointModel> model)
      : model_(std::move(model)) {}
  virtual ~CheckpointKind() = default;
  CheckpointKind(const CheckpointKind&) = delete;
  CheckpointKind& operator=(const CheckpointKind&) = delete;

  // The description every public accessor serves.
  const CheckpointModel& model() const { return *model_; }

  // The files whose bytes the checkpoint reads, in order (Checkpoint::files()).
  virtual const std::vector<std::string>& files() const = 0;
  // Indices into files() of the files that hold tensor `t`'s bytes (t < tensors().size()), in
  // the order its bytes are in them. Never empty.
  virtual std::span<const uint32_t> files_of(size_t t) const = 0;
  // The files as checkpoints of their own, in files() order, when each file is one (a set);
  // empty otherwise.
  virtual const std::vector<Checkpoint>& parts() const;
  // A single file's source for positional reads (what its loads read), else null: device loads
  // into caller memory (load_into) plan over it.
  virtual SourcePtr file_copy() const { return nullptr; }

  // Storage `s` (valid) loaded as Checkpoint::storage() describes; the handle keeps the cache
  // that shares storages, so this loads every time.
  virtual StoragePtr load_storage(size_t s, const LoadOptions& options) const = 0;
  // Checkpoint::view for a valid storage, and what keeps those bytes alive (null with no view).
  virtual const std::byte* view(size_t s) const = 0;
  virtual std::shared_ptr<const void> view_owner(size_t s) const = 0;
  // Checkpoint::read_into for a valid tensor (the body checks dst's size).
  virtual void read_into(size_t t, std::span<std::byte> dst, const LoadOptions& options) const = 0;
  // Checkpoint::read_slice for a valid tensor and box (the handle checked both and dst's size).
  // Default: the tensor loaded, the box copied out of it.
  virtual void read_slice(size_t t, std::span<const int64_t> begin, std::span<const int64_t> end,
                          std::span<std::byte> dst, const LoadOptions& options) const;
  // Checkpoint::prefetch.
  virtual void prefetch(std::span<const size_t> tensors, bool populate) const = 0;
  // Checkpoint::load_all: the selected tensors in table order, loaded eagerly; `placed` (may be
  // empty) is called once, on this thread, with exactly the tensors returned, once every one of
  // them has its final address (LoadOptions::on_placed). options.on_placed is not looked at.
  virtual std::vector<Tensor> load(const LoadOptions& options, const TensorFilter& filter,
                                   const PlacedFn& placed) const = 0;
  // Checkpoint::stream: each selected tensor under the model's description.
  virtual void stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
                      const LoadOptions& options, const TensorFilter& filter) const = 0;
  // A streamed conversion: storages `order` (indices into the model's storages; one may come
  // more than once) handed to fn(k, storage) in that order on this thread, each storage's bytes
  // valid during the call only, with at most max(budget, the largest of them) bytes read ahead.
  // Default: each loaded in turn (load_storage). A single file reads ahead through the load
  // plan's ring (views when it is mapped and options.copy is not set); a set hands each run of
  // one part's storages to that part.
  virtual void stream_storages(uint64_t budget, std::span<const uint32_t> order,
                               const StorageFn& fn, const LoadOptions& options) const;
  // Checkpoint::verify.
  virtual size_t verify(const ProgressFn& progress) const = 0;

 private:
  std::shared_ptr<const CheckpointModel> model_;
};

using KindPtr = std::shared_ptr<const CheckpointKind>;

// One model over its own files (CheckpointModel::files, or its source alone), loaded through the
// load plan.
KindPtr file_kind(std::shared_ptr<const CheckpointModel> model);

// A set of files that are checkpoints of their own (Hugging Face shards), and where each tensor
// and storage of the merged model lives. The merged model's tensors and storages are the parts'
// in part order (tensor i of part k is tensor tensor_base[k] + i); its source is the index (or
// a description of the file list), never read for tensor bytes: every load goes to the part
// that holds the bytes.
struct FileSet {
  std::vector<Checkpoint> parts;
  std::vector<std::string> paths;                   // as opened
  std::vector<size_t> tensor_base, storage_base;    // per part: its first merged index
  std::vector<uint32_t> tensor_part, storage_part;  // per merged index: its part

  size_t local_tensor(size_t t) const { return t - tensor_base[tensor_part[t]]; }
  size_t local_storage(size_t s) const { return s - storage_base[storage_part[s]]; }
};
KindPtr set_kind(std::shared_ptr<const CheckpointModel> merged, FileSet set);

// Progress of one operation over several files, file after file: each file's own calls
// (done, of) count on from the files before it, against the whole operation's total. The
// one place where a kind of several files adds up progress. `expected[k]` is what file k is
// expected to count (0 for a file the operation skips); the total a file reports replaces it
// (verify learns a file's total only from the file), and a file that reports nothing counted
// nothing, so the last total is the sum of the files' own totals. The files
// run one after another: part(k)'s function is called only between begin and end of file k.
// The caller's ProgressFn keeps its contract: `done` never goes back, and the last call
// (finish) has done == total.
class FileProgress {
 public:
  FileProgress(const ProgressFn& fn, std::vector<uint64_t> expected);
  FileProgress(const FileProgress&) = delete;
  FileProgress& operator=(const FileProgress&) = delete;
  // The ProgressFn for file k's own operation (empty when there is no callback); valid while
  // this object lives.
  ProgressFn part(size_t k);
  // File k is over: the files after it count on from its total.
  void end(size_t k);
  // The last call, done == total (after the last end()); not repeated when made already.
  void finish();

 private:
  void report(uint64_t done, uint64_t total);

  const ProgressFn& fn_;
  std::vector<uint64_t> later_;  // per file: expected bytes of the files after it
  std::vector<uint64_t> expected_;
  uint64_t base_ = 0;     // counted by the files that are over
  uint64_t current_ = 0;  // the current file's total, as it reports it
  bool reported_ = false;
  uint64_t last_done_ = 0, last_total_ = 0;
};

// The tensors `filter` accepts (all when empty), by index.
std::vector<uint8_t> select_tensors(const CheckpointModel& m, const TensorFilter& filter);

}  // namespace ckpt::internal
