#pragma once
// The opener: the one place that decides what kind of checkpoint a path is (api/opener.cc) and
// opens it. Checkpoint::open, open_set, open_and_load and the Python module all come here.
//
//   a folder   -> the folder's format (a torch.distributed.checkpoint folder: formats/dcp),
//                 one model over the folder's data files, served by the file kind
//   a file     -> its format (formats/open.cc detects it from the first bytes): the file kind
//   an index   -> a file no format reads that is a JSON shard index: the set kind over its shards
//   file list  -> the set kind over the files (open_set)

#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "model/checkpoint_model.h"

namespace ckpt::internal {

// Opens a path or URL, whatever kind it is. `hooks` reach a single file's format reader (the
// overlapped open_and_load); other kinds ignore them.
Checkpoint open_path(const std::string& path, const OpenOptions& options,
                     const OpenHooks& hooks = {});
// Opens an opened file: its format, else (a JSON file) a shard index whose shards are named
// relative to the source's folder.
Checkpoint open_file(const SourcePtr& source, const OpenOptions& options,
                     const OpenHooks& hooks = {});
// Opens files as one checkpoint: one path is open_path; several, a set of shards.
Checkpoint open_paths(const std::vector<std::string>& paths, const OpenOptions& options);

}  // namespace ckpt::internal
