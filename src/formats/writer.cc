// The outputs of src/formats/writer.h (one caller's sink, or the files of a folder) and the
// walk over tensor bytes with or without a feed.

#include "formats/writer.h"

#include "ckpt/error.h"

namespace ckpt::internal {

void feed_each(const TensorFeed* feed, std::span<const Tensor* const> tensors,
               const std::function<void(size_t, const Tensor&)>& fn) {
  if (feed) return feed->each(tensors, fn);
  for (size_t k = 0; k < tensors.size(); ++k) fn(k, *tensors[k]);
}

ByteSink& SinkOutput::file(const std::string& name) {
  throw Error(ErrorCode::kInvalidArgument,
              "the output is one file; a writer of several files asked for '" + name + "'",
              sink_.name());
}

ByteSink& FolderOutput::file() {
  throw Error(ErrorCode::kInvalidArgument,
              "the output is a folder of files; a one-file writer cannot write it", folder_.path());
}

ByteSink& FolderOutput::file(const std::string& name) {
  files_.push_back(folder_.create(name));
  return *files_.back();
}

void FolderOutput::commit() {
  for (auto& f : files_) f->commit();
  folder_.commit();
}

}  // namespace ckpt::internal
