// The opener (api/opener.h): the kinds of checkpoint, told apart by path. Adding a kind of folder
// is one branch in open_folder(); a file's format is formats/open.cc's business.

#include "api/opener.h"

#include <sys/stat.h>

#include <filesystem>

#include "api/checkpoint_impl.h"
#include "ckpt/remote.h"
#include "formats/open.h"

namespace ckpt::internal {
namespace {

std::string join(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool is_folder(const std::string& path) {
  if (is_url(path)) return path.back() == '/';  // a URL prefix: a folder of objects
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool has_file(const std::string& dir, const char* name) {
  struct stat st {};
  return ::stat(join(dir, name).c_str(), &st) == 0;
}

// A folder of a kind ckpt reads, or nothing (the path is then opened as a file, which says why
// it cannot be).
std::optional<Checkpoint> open_folder(const std::string& dir, const OpenOptions& options) {
  // torch.distributed.checkpoint: `.metadata` and its data files (a URL prefix is one too).
  if (is_url(dir) || has_file(dir, ".metadata"))
    return CheckpointAccess::make(open_dcp(dir, options));
  return std::nullopt;
}

}  // namespace

Checkpoint open_file(const SourcePtr& source, const OpenOptions& options,
                     const OpenHooks& hooks) {
  try {
    return CheckpointAccess::make(open_model(source, options, hooks));
  } catch (const Error& e) {
    // Not a checkpoint: a sharded checkpoint's index (JSON) opens as its set of shards.
    // A read that failed (a remote source after its retries) is no format's refusal.
    if (e.code() == ErrorCode::kIo || e.code() == ErrorCode::kAuth) throw;
    if (!looks_like_json(*source)) throw;
  }
  return open_index(source, std::filesystem::path(source->name()).parent_path().string(),
                    options);
}

Checkpoint open_path(const std::string& path, const OpenOptions& options,
                     const OpenHooks& hooks) {
  if (is_folder(path))
    if (auto c = open_folder(path, options)) return std::move(*c);
  SourcePtr source = options.mmap && options.writable_views && !is_url(path)
                         ? open_mmap_source(path, true)
                         : open_source(path, options.mmap, options.remote);
  if (hooks.file_opened) hooks.file_opened(source);
  return open_file(source, options, hooks);
}

Checkpoint open_paths(const std::vector<std::string>& paths, const OpenOptions& options) {
  if (paths.size() == 1) return open_path(paths[0], options);
  return open_files(paths, options);
}

}  // namespace ckpt::internal
