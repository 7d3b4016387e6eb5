// The opener (api/opener.h): the kinds of checkpoint, told apart by path. Adding a kind of folder
// is one branch in open_folder(); a file's format is formats/open.cc's business.

#include "api/opener.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <vector>

#include "api/checkpoint_impl.h"
#include "ckpt/remote.h"
#include "formats/dcp/dcp_folder.h"
#include "formats/dcp/dtensor_files.h"
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

// A model folder's weights, in the order they are preferred: what save_pretrained writes (and a
// transformers Trainer's checkpoint-N/ holds beside its training state).
constexpr const char* kModelFiles[] = {"model.safetensors.index.json", "model.safetensors",
                                       "pytorch_model.bin.index.json", "pytorch_model.bin"};
// What else a training folder holds, named in the note so that the user knows what was not read.
constexpr const char* kTrainingFiles[] = {"optimizer.pt", "scheduler.pt", "rng_state.pth",
                                          "trainer_state.json", "training_args.bin"};

// Says which checkpoint of a folder that holds several was taken, how to read another, and what
// training state is beside it.
void note_choice(const std::string& dir, const std::vector<std::string>& found,
                 const OpenOptions& options) {
  if (!options.remote.on_note) return;
  std::vector<std::string> state;
  for (const char* f : kTrainingFiles)
    if (has_file(dir, f)) state.push_back(f);
  if (found.size() < 2 && state.empty()) return;
  std::string note = dir + ": read " + found[0];
  if (found.size() > 1) {
    note += "; also here:";
    for (size_t i = 1; i < found.size(); ++i) note += " " + found[i];
    note += " (name one to read it instead)";
  }
  if (!state.empty()) {
    note += "; training state not read:";
    for (const std::string& f : state) note += " " + f;
    note += " (open each by its path)";
  }
  options.remote.on_note(note);
}

// A folder of a kind ckpt reads, or nothing (the path is then opened as a file, which says why
// it cannot be).
std::optional<Checkpoint> open_folder(const std::string& dir, const OpenOptions& options) {
  std::vector<std::string> found;
  // torch.distributed.checkpoint: `.metadata` and its data files (a URL prefix is one too;
  // Megatron's torch_dist folders are DCP folders with metadata.json and common.pt beside, which
  // dcp_folder.cc reads in), or
  // one `__<rank>.metadata` per rank, or HuggingFaceStorageWriter's per-rank shards
  // (formats/dcp/dcp_folder.h).
  switch (dcp_folder_kind(dir)) {
    case DcpFolderKind::kMetadata:
      found.push_back(".metadata");
      break;
    case DcpFolderKind::kRankLocal:
      found.push_back("__<rank>.metadata");
      break;
    case DcpFolderKind::kHfShards:
      found.push_back("shard-*-model-*.safetensors");
      break;
    case DcpFolderKind::kNone:
      break;
  }
  const bool dcp = !found.empty();
  // verl's FSDP checkpoints: one torch.save of DTensors per rank (formats/dcp/dtensor_files.h).
  const bool dtensors = !is_url(dir) && has_dtensor_files(dir);
  if (dtensors) found.push_back("model_world_size_<N>_rank_<R>.pt");
  // A model folder: the weights save_pretrained wrote (an index is the set of its shards).
  if (!is_url(dir))
    for (const char* f : kModelFiles)
      if (has_file(dir, f)) found.push_back(f);
  if (found.empty()) return std::nullopt;
  note_choice(dir, found, options);
  if (dcp) return CheckpointAccess::make(open_dcp(dir, options));
  if (dtensors) return CheckpointAccess::make(open_dtensor_files(dir, options));
  return open_path(join(dir, found[0]), options);
}

}  // namespace

Checkpoint open_file(const SourcePtr& source, const OpenOptions& options, const OpenHooks& hooks) {
  try {
    return CheckpointAccess::make(open_model(source, options, hooks));
  } catch (const Error& e) {
    // Not a checkpoint: a sharded checkpoint's index (JSON) opens as its set of shards.
    // A read that failed (a remote source after its retries) is no format's refusal.
    if (e.code() == ErrorCode::kIo || e.code() == ErrorCode::kAuth) throw;
    if (!looks_like_json(*source)) throw;
  }
  return open_index(source, std::filesystem::path(source->name()).parent_path().string(), options);
}

Checkpoint open_path(const std::string& path, const OpenOptions& options, const OpenHooks& hooks) {
  if (is_folder(path)) {
    if (auto c = open_folder(path, options))
      return is_url(path) ? std::move(*c) : CheckpointAccess::in_folder(*c, path);
    if (!is_url(path))
      throw Error(ErrorCode::kInvalidArgument,
                  "is a directory that holds no checkpoint ckpt reads (a DCP .metadata or "
                  "__0.metadata, shard-*-model-*.safetensors, model_world_size_<N>_rank_0.pt, "
                  "model.safetensors[.index.json] or "
                  "pytorch_model.bin[.index.json]): name a file in it",
                  path);
  }
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
