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

struct Checkpoint::Impl {
  explicit Impl(std::shared_ptr<const internal::CheckpointModel> m);

  std::shared_ptr<const internal::CheckpointModel> model;
  ConstValuePtr root;  // model->root, read-only
  // The source to copy bytes from: a pread source over the same open file when the source is a
  // mapping of a file (copying out of the mapping would make the file's pages resident beside
  // the copy, doubling the memory an eager or streaming load holds), else the source.
  SourcePtr copy;
  mutable std::mutex mu;
  // Loaded storages, so that views of one storage share it; sized on first use (under mu).
  mutable std::vector<std::weak_ptr<Storage>> cache;
};

namespace internal {

struct CheckpointAccess {
  static const CheckpointModel& model(const Checkpoint& c) { return *c.impl_->model; }
  static Checkpoint make(std::shared_ptr<const CheckpointModel> m) {
    return Checkpoint(std::make_shared<const Checkpoint::Impl>(std::move(m)));
  }
};

}  // namespace internal
}  // namespace ckpt
