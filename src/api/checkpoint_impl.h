#pragma once
// What a Checkpoint handle shares: the body of its kind of checkpoint (api/checkpoint_kind.h:
// the model that describes it, and how its bytes are loaded; immutable) and the storages
// currently loaded. Internal layers above the API (TorchScriptArchive, conversion) reach the
// model through CheckpointAccess.

#include <memory>
#include <mutex>
#include <vector>

#include "api/checkpoint_kind.h"
#include "ckpt/checkpoint.h"
#include "model/checkpoint_model.h"

namespace ckpt {
namespace internal {

// Opens an index (`source` holds its JSON; shard names are relative to `dir`) or a list of files
// as one checkpoint (api/checkpoint_set.cc).
Checkpoint open_index(const SourcePtr& source, const std::string& dir, const OpenOptions& options);
Checkpoint open_files(const std::vector<std::string>& paths, const OpenOptions& options);
// Whether the source's first non-blank byte is '{': a JSON file, maybe a shard index.
bool looks_like_json(const ByteSource& source);

}  // namespace internal

struct Checkpoint::Impl {
  explicit Impl(internal::KindPtr k) : kind(std::move(k)), root(kind->model().root) {}

  internal::KindPtr kind;
  ConstValuePtr root;  // the model's root, read-only
  std::string folder;  // the local folder it was opened from (api/opener.cc), else empty
  mutable std::mutex mu;
  // Loaded storages, so that views of one storage share it; sized on first use (under mu).
  mutable std::vector<std::weak_ptr<Storage>> cache;
};

namespace internal {

struct CheckpointAccess {
  static const CheckpointModel& model(const Checkpoint& c) { return c.impl_->kind->model(); }
  static const CheckpointKind& kind(const Checkpoint& c) { return *c.impl_->kind; }
  static Checkpoint make(KindPtr kind) {
    return Checkpoint(std::make_shared<const Checkpoint::Impl>(std::move(kind)));
  }
  // A single file.
  static Checkpoint make(std::shared_ptr<const CheckpointModel> m) {
    return make(file_kind(std::move(m)));
  }
  // The same checkpoint, remembered as opened from the local folder `dir`.
  static Checkpoint in_folder(const Checkpoint& c, std::string dir) {
    auto impl = std::make_shared<Checkpoint::Impl>(c.impl_->kind);
    impl->folder = std::move(dir);
    return Checkpoint(std::move(impl));
  }
  static const std::string& folder(const Checkpoint& c) { return c.impl_->folder; }
};

}  // namespace internal
}  // namespace ckpt
