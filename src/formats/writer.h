#pragma once
// Writer: one per target format, behind one interface. A writer says what its format can hold
// (WriterCaps, holds()), owns its options (given when it is made), and writes content into an
// output. It never commits: whoever made the output commits it (or destroys it uncommitted,
// which leaves nothing). convert() (src/convert) checks a checkpoint against the capabilities
// before a byte is written; the public save_* functions are thin wrappers over these writers.
// docs/design/writers.md, "Writers".
//
// Thread-safety: a writer may be used by one thread at a time; writers are independent. The
// tensors' bytes are read while writing and must not change meanwhile.

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/options.h"
#include "ckpt/safetensors.h"
#include "ckpt/sink.h"
#include "ckpt/tensor.h"
#include "ckpt/tensorizer.h"
#include "ckpt/value.h"

namespace ckpt::internal {

// What a target format can hold. Everything a conversion refuses is decided from these (and
// Writer::holds) before the output exists.
struct WriterCaps {
  const char* format = "";     // the name errors use: "pt", "safetensors", "tensorizer"
  bool object_tree = false;    // non-tensor values and containers (WriteContent::root)
  bool shared_bytes = false;   // bytes shared by several tensors are stored once
  bool copies_shared = false;  // no sharing: shared bytes are written as separate copies
                               // (false with shared_bytes false: refused unless the writer's
                               // options ask for copies, see Writer::copies_shared())
  bool meta_tensors = false;   // a dtype and shape without bytes
  bool quantized = false;      // quantized tensors (scales, zero points)
  bool metadata = false;       // a string -> string map (WriteContent::metadata)
  bool digests = false;        // per-tensor SHA-256 in that map (include/ckpt/digest.h)
  bool encryption = false;     // encrypted tensor bytes (a key or a password)
  bool several_files = false;  // the output is a folder of files (WriteOutput::file(name))
  bool sharded = false;        // the Hugging Face shard layout (a shard set plus an index)
  bool patches = false;        // overwrites bytes already written (ByteSink::patch): an upload
                               // goes through a local temporary file
};

// Tensor bytes that are not in memory: a streamed conversion of a checkpoint that is not mapped
// (a torch.distributed.checkpoint folder, a URL, a compressed or encrypted file). The content's
// tensors then carry their description and a Storage object per stored storage (shared as in
// the checkpoint, StorageInfo filled in) without bytes, and the writer asks the feed for the
// bytes in the order it writes them.
class TensorFeed {
 public:
  virtual ~TensorFeed() = default;
  // fn(k, tensor) for k = 0, 1, ... in order, on this thread: *tensors[k] (a tensor of the
  // content) over its bytes, which are valid during the call only. Consecutive tensors of one
  // storage share one read; the bytes of later tensors are read ahead within the feed's memory
  // budget. Throws what reading throws and what fn throws.
  virtual void each(std::span<const Tensor* const> tensors,
                    const std::function<void(size_t k, const Tensor& tensor)>& fn) const = 0;
};

// fn(k, tensor) for each of `tensors` in order: through `feed` when it is set, else each tensor
// as it is (its bytes in memory).
void feed_each(const TensorFeed* feed, std::span<const Tensor* const> tensors,
               const std::function<void(size_t k, const Tensor& tensor)>& fn);

// What is written: tensors under their names (Tensor::name() is the stored name; tensors whose
// storage() is one object share bytes), and for a writer with object_tree the tree whose kTensor
// nodes index into `tensors` (null: a state dict of the tensors), for a writer with metadata the
// string map.
struct WriteContent {
  std::vector<Tensor> tensors;
  ConstValuePtr root;
  std::map<std::string, std::string> metadata;
  // Set: the tensors' bytes come from it (see TensorFeed); null: the tensors hold their bytes.
  std::shared_ptr<const TensorFeed> feed;
};

// Where a writer's bytes go: one file, or the files of a folder. Sinks it hands out live as long
// as the output; the output, not the writer, commits them.
class WriteOutput {
 public:
  virtual ~WriteOutput() = default;
  // The one file of a one-file output. A folder output throws Error{kInvalidArgument}.
  virtual ByteSink& file() = 0;
  // A file of a folder output, `name` one path component, created on the first call. A one-file
  // output throws Error{kInvalidArgument}.
  virtual ByteSink& file(const std::string& name) = 0;
};

// An output over one sink the caller owns (and commits).
class SinkOutput final : public WriteOutput {
 public:
  explicit SinkOutput(ByteSink& sink) : sink_(sink) {}
  ByteSink& file() override { return sink_; }
  ByteSink& file(const std::string& name) override;

 private:
  ByteSink& sink_;
};

// An output over a FolderSink (a folder that appears whole or not at all): file(name) creates
// the folder's file `name`; commit() commits every file, then the folder. Destroyed uncommitted,
// it leaves nothing.
class FolderOutput final : public WriteOutput {
 public:
  explicit FolderOutput(FolderSink& folder) : folder_(folder) {}
  ByteSink& file() override;
  ByteSink& file(const std::string& name) override;
  void commit();

 private:
  FolderSink& folder_;
  std::vector<std::unique_ptr<ByteSink>> files_;
};

// What writing produced besides bytes.
struct WriteResult {
  std::string key;  // the raw 32-byte key when encrypting (a random key must be kept)
  // Writing an object tree (WriteContent::root): the tensors of WriteContent::tensors that the
  // tree does not reach, so were not written (a device mesh's tensor inside a DTensor written as
  // its local shard), and the bytes of their storages that no written tensor holds.
  size_t tensors_left_out = 0;
  uint64_t bytes_left_out = 0;
};

class Writer {
 public:
  virtual ~Writer() = default;
  virtual const WriterCaps& caps() const = 0;
  // Whether the format stores this dtype.
  virtual bool holds(DType dtype) const = 0;
  // With shared_bytes and copies_shared both false: whether the options ask for copies.
  virtual bool copies_shared() const { return caps().copies_shared; }
  // Whether the options ask for encryption.
  virtual bool encrypts() const { return false; }
  // Writes `content` into `out` (the content's tensors may be moved from). Never commits.
  // Throws Error (as the format's save_* function documents).
  virtual WriteResult write(WriteOutput& out, WriteContent& content) = 0;
};

// The writers. Options as the public save_* functions take them (atomic and fsync belong to
// the output, not the writer, and are ignored here).
// pt: an empty archive_name is the output file's name up to its first dot (as torch.save).
std::unique_ptr<Writer> make_torch_writer(const SaveOptions& options);
std::unique_ptr<Writer> make_safetensors_writer(const SafetensorsSaveOptions& options);
// kRandomKey: the key is returned in WriteResult; options.key_file is not written.
std::unique_ptr<Writer> make_tensorizer_writer(const TensorizerSaveOptions& options);

}  // namespace ckpt::internal
