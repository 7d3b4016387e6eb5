// The outputs of src/formats/writer.h: one caller's sink, or the files of a folder.

#include "formats/writer.h"

#include "ckpt/error.h"

namespace ckpt::internal {

ByteSink& SinkOutput::file(const std::string& name) {
  throw Error(ErrorCode::kInvalidArgument,
              "the output is one file; a writer of several files asked for '" + name + "'",
              sink_.name());
}

ByteSink& FolderOutput::file() {
  throw Error(ErrorCode::kInvalidArgument,
              "the output is a folder of files; a one-file writer cannot write it",
              folder_.path());
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
