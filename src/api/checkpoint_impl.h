#pragma once
// What a Checkpoint handle shares: the model a format reader produced (immutable) and the
// loader's state (the storages currently loaded, the source copies read from). Internal layers
// above the API (TorchScriptArchive, conversion) reach the model through CheckpointAccess.

#include <memory>
#include <mutex>
#include <vector>

#include "ckpt/checkpoint.h"
#include "load/plan.h"
#include "model/checkpoint_model.h"

namespace ckpt {
namespace internal {

// A sharded checkpoint opened as one (api/checkpoint_set.cc): the shards, each an ordinary
// Checkpoint, and where each tensor and storage of the merged model lives. The merged model's
// tensors and storages are the shards' in shard order (tensor i of shard k is tensor
// tensor_base[k] + i); its source is the index (or a description of the file list), never read
// for tensor bytes: every load is handed to the shard that holds the bytes.
struct ShardSet {
  std::vector<Checkpoint> shards;
  std::vector<std::string> paths;          // as opened
  std::vector<size_t> tensor_base, storage_base;  // per shard: its first merged index
  std::vector<uint32_t> tensor_shard, storage_shard;  // per merged index: its shard

  size_t local_tensor(size_t t) const { return t - tensor_base[tensor_shard[t]]; }
  size_t local_storage(size_t s) const { return s - storage_base[storage_shard[s]]; }
};

// Opens an index (`source` holds its JSON; shard names are relative to `dir`) or a list of files
// as one checkpoint.
Checkpoint open_index(const SourcePtr& source, const std::string& dir, const OpenOptions& options);
Checkpoint open_files(const std::vector<std::string>& paths, const OpenOptions& options);
// Whether the source's first non-blank byte is '{': a JSON file, maybe a shard index.
bool looks_like_json(const ByteSource& source);

}  // namespace internal

struct Checkpoint::Impl {
  explicit Impl(std::shared_ptr<const internal::CheckpointModel> m,
                std::shared_ptr<const internal::ShardSet> shard_set = nullptr);

  std::shared_ptr<const internal::CheckpointModel> model;
  ConstValuePtr root;  // model->root, read-only
  // The source to copy bytes from: a pread source over the same open file when the source is a
  // mapping of a file (copying out of the mapping would make the file's pages resident beside
  // the copy, doubling the memory an eager or streaming load holds), else the source.
  SourcePtr copy;
  mutable std::mutex mu;
  // Loaded storages, so that views of one storage share it; sized on first use (under mu).
  mutable std::vector<std::weak_ptr<Storage>> cache;
  // A sharded set: every load goes to a shard. Null for one file.
  std::shared_ptr<const internal::ShardSet> set;
};

namespace internal {

struct CheckpointAccess {
  static const CheckpointModel& model(const Checkpoint& c) { return *c.impl_->model; }
  static Checkpoint make(std::shared_ptr<const CheckpointModel> m,
                         std::shared_ptr<const ShardSet> set = nullptr) {
    return Checkpoint(std::make_shared<const Checkpoint::Impl>(std::move(m), std::move(set)));
  }
  static const ShardSet* set(const Checkpoint& c) { return c.impl_->set.get(); }
};

}  // namespace internal
}  // namespace ckpt
